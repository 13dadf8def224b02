package tenantpool

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/keyshard/keyshard/placement"
)

// TestPlannerMatchesReference: over random rounds (rates that drift, jump
// and stop, members that join, leave, drain and change zone, policy
// changes, readiness), a Planner, the function Plan and the reference
// implementation (every round from scratch through placement.Shards) give
// the same States and Changes.
func TestPlannerMatchesReference(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 7))
			p := goodPolicy()
			p.ZoneAware = seed%2 == 0
			p.ForgetAfter = time.Duration(r.IntN(3)) * 20 * time.Second
			p.RebalanceMoves = []int{0, 0, 5}[seed%3]
			p.ShrinkCooldown = time.Duration(r.IntN(3)) * 10 * time.Second
			ms := pool(12+r.IntN(10), 3)
			next := len(ms)
			rates := map[string]float64{}
			for i := range 300 {
				rates[fmt.Sprintf("t%03d", i)] = float64(r.IntN(80))
			}
			var ref State
			pl := NewPlanner(State{})
			now := t0
			for round := range 30 {
				now = now.Add(time.Duration(1+r.IntN(15)) * time.Second)
				switch k := r.IntN(10); {
				case k == 0 && len(ms) > 4: // a member leaves
					i := r.IntN(len(ms))
					ms = slices.Delete(slices.Clone(ms), i, i+1)
				case k == 1: // one joins
					ms = append(slices.Clone(ms), placement.Member{ID: fmt.Sprintf("m%03d", next), Weight: 1, Zone: fmt.Sprintf("z%d", r.IntN(3))})
					next++
				case k == 2: // one drains or changes zone
					ms = slices.Clone(ms)
					i := r.IntN(len(ms))
					if r.IntN(2) == 0 {
						ms[i].Weight = 0
					} else {
						ms[i].Zone = fmt.Sprintf("z%d", r.IntN(4))
					}
				case k == 3: // policy change
					p.Overrides = map[string]Override{fmt.Sprintf("t%03d", r.IntN(300)): {Size: 1 + r.IntN(4)}}
				}
				// Rates: most drift a little, a few jump, a few stop, a few are new.
				rates2 := map[string]float64{}
				for id, v := range rates {
					switch k := r.IntN(100); {
					case k < 3:
					case k < 8:
						rates2[id] = float64(r.IntN(200))
					default:
						rates2[id] = v + float64(r.IntN(3)-1)*0.25
						if rates2[id] < 0 {
							rates2[id] = 0
						}
					}
				}
				for range r.IntN(4) {
					rates2[fmt.Sprintf("n%d-%d", round, r.IntN(1000))] = float64(r.IntN(50))
				}
				rates = rates2
				want, wantCh, err := planReference(ref, ms, rates, p, now)
				if err != nil {
					t.Fatal(err)
				}
				fn, fnCh, err := Plan(ref, ms, rates, p, now)
				if err != nil {
					t.Fatal(err)
				}
				got, gotCh, err := pl.Plan(ms, rates, p, now)
				if err != nil {
					t.Fatal(err)
				}
				if d := diff(want, got); d != "" {
					t.Fatalf("round %d: Planner's State differs (-reference +planner):\n%s", round, d)
				}
				if d := diff(wantCh, gotCh); d != "" {
					t.Fatalf("round %d: Planner's Changes differ (-reference +planner):\n%s", round, d)
				}
				if d := diff(want, fn); d != "" {
					t.Fatalf("round %d: Plan's State differs (-reference +Plan):\n%s", round, d)
				}
				if d := diff(wantCh, fnCh); d != "" {
					t.Fatalf("round %d: Plan's Changes differ (-reference +Plan):\n%s", round, d)
				}
				ref = Clone(want)
				if r.IntN(3) == 0 { // some readiness
					var marks []Ready
					for _, id := range sortedKeys(ref.Tenants)[:20] {
						for _, m := range ref.Tenants[id].Members {
							marks = append(marks, Ready{m.ID, id})
						}
					}
					ref, _, _ = MarkReady(ref, marks)
					if _, _, err := pl.MarkReady(marks); err != nil {
						t.Fatal(err)
					}
					if d := diff(ref, pl.State()); d != "" {
						t.Fatalf("round %d: MarkReady differs:\n%s", round, d)
					}
				}
				if round == 20 { // a new term continues from the state
					pl = NewPlanner(Clone(ref))
				}
			}
		})
	}
}

// TestPlanDoesNotModifyPrev: the function Plan leaves prev as it was.
func TestPlanDoesNotModifyPrev(t *testing.T) {
	p := goodPolicy()
	st, _ := mustPlan(t, State{}, pool(10, 1), map[string]float64{"a": 30, "b": 10}, p, t0)
	keep := Clone(st)
	if _, _, err := Plan(st, pool(9, 1), map[string]float64{"a": 80}, p, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(keep, st); d != "" {
		t.Fatalf("prev modified:\n%s", d)
	}
}

// diff is cmp.Diff, after a cheaper check.
func diff(a, b any) string {
	if reflect.DeepEqual(a, b) {
		return ""
	}
	return cmp.Diff(a, b)
}
