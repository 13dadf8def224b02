package tenantpool

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/keyshard/keyshard/placement"
)

// snapshotsEqual reports how two snapshots differ, "" if they do not.
func snapshotsEqual(a, b *Snapshot) string {
	if reflect.DeepEqual(a, b) {
		return ""
	}
	switch {
	case a.version != b.version:
		return fmt.Sprintf("version %d, %d", a.version, b.version)
	case !reflect.DeepEqual(a.members, b.members) || !reflect.DeepEqual(a.source, b.source):
		return "members differ"
	case !reflect.DeepEqual(a.policy, b.policy) || a.zones != b.zones:
		return "policy or zones differ"
	}
	for id, v := range a.tenants {
		if !reflect.DeepEqual(v, b.tenants[id]) {
			return fmt.Sprintf("tenant %s: %+v, %+v", id, v, b.tenants[id])
		}
	}
	for id := range b.tenants {
		if a.tenants[id] == nil {
			return fmt.Sprintf("tenant %s only in the second", id)
		}
	}
	for m, l := range a.byMem {
		if !slices.Equal(l, b.byMem[m]) {
			return fmt.Sprintf("member %s serves %v, %v", m, l, b.byMem[m])
		}
	}
	return fmt.Sprintf("byMem keys: %d, %d", len(a.byMem), len(b.byMem))
}

// TestSnapshotUpdate: over random rounds of a Planner (rates that change,
// tenants that come and go, members that join, leave and drain, policy
// changes, readiness), updating the previous snapshot with the tenants a
// round changed gives NewSnapshot of the round's State, and leaves the
// previous snapshot as it was.
func TestSnapshotUpdate(t *testing.T) {
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 3))
			p := goodPolicy()
			p.ZoneAware = seed%2 == 0
			p.ForgetAfter = 30 * time.Second
			p.ShrinkCooldown = 10 * time.Second
			p.Lookback, p.WarmUp = 10*time.Second, 5*time.Second
			p.RebalanceMoves = int(seed % 3 * 5)
			ms := pool(15, 3)
			next := len(ms)
			rates := map[string]float64{}
			for i := range 400 {
				rates[fmt.Sprintf("t%03d", i)] = float64(r.IntN(80))
			}
			pl := NewPlanner(State{})
			snap := NewSnapshot(pl.State())
			now := t0
			incremental := 0
			for round := range 40 {
				now = now.Add(time.Duration(1+r.IntN(10)) * time.Second)
				switch k := r.IntN(12); {
				case k == 0 && len(ms) > 5:
					i := r.IntN(len(ms))
					ms = slices.Delete(slices.Clone(ms), i, i+1)
				case k == 1:
					ms = append(slices.Clone(ms), placement.Member{ID: fmt.Sprintf("m%03d", next), Weight: 1, Zone: fmt.Sprintf("z%d", r.IntN(3))})
					next++
				case k == 2:
					ms = slices.Clone(ms)
					ms[r.IntN(len(ms))].Weight = 0
				case k == 3:
					p.Overrides = map[string]Override{fmt.Sprintf("t%03d", r.IntN(400)): {Size: 1 + r.IntN(4)}}
				}
				rates2 := map[string]float64{}
				for id, v := range rates {
					switch k := r.IntN(100); {
					case k < 2: // stops
					case k < 10:
						rates2[id] = float64(r.IntN(200))
					default:
						rates2[id] = v
					}
				}
				for range r.IntN(5) {
					rates2[fmt.Sprintf("n%d-%d", round, r.IntN(1000))] = float64(r.IntN(50))
				}
				rates = rates2
				prevSnap := NewSnapshot(pl.State())
				if d := snapshotsEqual(prevSnap, snap); d != "" {
					t.Fatalf("round %d: the snapshot before the round differs: %s", round, d)
				}
				sameShape := slices.Equal(pl.State().Members, sortedMembers(ms)) && pl.State().Policy.equal(p)
				st, ch, err := pl.Plan(ms, rates, p, now)
				if err != nil {
					t.Fatal(err)
				}
				changed := ch.Tenants
				if r.IntN(2) == 0 { // readiness
					var marks []Ready
					for _, id := range sortedKeys(st.Tenants) {
						if r.IntN(10) == 0 {
							for _, m := range st.Tenants[id].Members {
								marks = append(marks, Ready{m.ID, id})
							}
							changed = append(slices.Clone(changed), id)
						}
					}
					if st, _, err = pl.MarkReady(marks); err != nil {
						t.Fatal(err)
					}
				}
				old := snap
				snap = snap.Update(st, changed)
				if d := snapshotsEqual(NewSnapshot(st), snap); d != "" {
					t.Fatalf("round %d: Update differs from NewSnapshot: %s", round, d)
				}
				if d := snapshotsEqual(prevSnap, old); d != "" {
					t.Fatalf("round %d: Update modified the previous snapshot: %s", round, d)
				}
				if sameShape {
					incremental++
				}
			}
			if incremental < 10 {
				t.Fatalf("only %d rounds took the incremental path", incremental)
			}
		})
	}
}

// TestSnapshotUpdateDrops: a dropped tenant leaves its members' lists,
// and a member left with none is not listed, as in NewSnapshot.
func TestSnapshotUpdateDrops(t *testing.T) {
	st := State{Version: 1, Members: pool(3, 1), Policy: goodPolicy(), Tenants: map[string]TenantState{
		"a": {Size: placement.SizeState{Size: 1}, Members: []Placement{{ID: "m000"}}},
		"b": {Size: placement.SizeState{Size: 2}, Members: []Placement{{ID: "m000"}, {ID: "m001"}}},
	}}
	snap := NewSnapshot(st)
	next := Clone(st)
	next.Version++
	delete(next.Tenants, "b")
	next.Tenants["c"] = TenantState{Size: placement.SizeState{Size: 1}, Members: []Placement{{ID: "m002", Added: t0}}}
	got := snap.Update(next, []string{"c", "b", "b"})
	if d := snapshotsEqual(NewSnapshot(next), got); d != "" {
		t.Fatal(d)
	}
	if l := got.Tenants("m001"); l != nil {
		t.Fatalf("m001 serves %v after b was dropped", l)
	}
	if l := snap.Tenants("m001"); !slices.Equal(l, []string{"b"}) {
		t.Fatalf("the old snapshot changed: m001 serves %v", l)
	}
}

func sortedMembers(ms []placement.Member) []placement.Member {
	ms = slices.Clone(ms)
	slices.SortFunc(ms, func(a, b placement.Member) int {
		if a.ID < b.ID {
			return -1
		}
		if a.ID > b.ID {
			return 1
		}
		return 0
	})
	return ms
}

// BenchmarkSnapshotUpdate100k: a snapshot of 100,000 tenants updated with
// 100 changed tenants, against a rebuild.
func BenchmarkSnapshotUpdate100k(b *testing.B) {
	st := benchState(b, 100_000)
	ids := sortedKeys(st.Tenants)
	snap := NewSnapshot(st)
	// 100 tenants change subsets: a member of each is replaced.
	next := Clone(st)
	for i := range 100 {
		id := ids[i*997%len(ids)]
		ts := next.Tenants[id]
		ts.Members = slices.Clone(ts.Members)
		ts.Members[0] = Placement{ID: "m099", Added: t0.Add(time.Second)}
		slices.SortFunc(ts.Members, func(a, b Placement) int { return cmpString(a.ID, b.ID) })
		ts.Members = slices.CompactFunc(ts.Members, func(a, b Placement) bool { return a.ID == b.ID })
		next.Tenants[id] = ts
	}
	var changed []string
	for i := range 100 {
		changed = append(changed, ids[i*997%len(ids)])
	}
	next.Version++
	b.Run("update", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			snap.Update(next, changed)
		}
	})
	b.Run("rebuild", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			NewSnapshot(next)
		}
	})
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// TestSnapshotReadUntil: a member drained (weight 0) leaves its subsets,
// each place taken by another member; it is read until the lookback ends,
// or until its replacement warms up if that is later, and then no more.
func TestSnapshotReadUntil(t *testing.T) {
	for _, tc := range []struct {
		name             string
		lookback, warmUp time.Duration
		want             time.Duration // after the drain
	}{
		{"lookback", time.Minute, 30 * time.Second, time.Minute},
		{"warm-up", 10 * time.Second, 30 * time.Second, 30 * time.Second},
		{"neither", 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := goodPolicy()
			p.Lookback, p.WarmUp = tc.lookback, tc.warmUp
			ms := pool(8, 1)
			rates := map[string]float64{"a": 30, "b": 30, "c": 5}
			st, _ := mustPlan(t, State{}, ms, rates, p, t0)
			now := t0.Add(time.Hour) // everyone warm
			st, _ = mustPlan(t, st, ms, rates, p, now)
			gone := st.Tenants["a"].Members[0].ID
			if until, ok := NewSnapshot(st).ReadUntil(gone); ok {
				t.Fatalf("ReadUntil(%s) = %v, true while in a subset", gone, until)
			}
			held := NewSnapshot(st).Tenants(gone)
			drained := slices.Clone(ms)
			for i := range drained {
				if drained[i].ID == gone {
					drained[i].Weight = 0
				}
			}
			now = now.Add(time.Second)
			st, _ = mustPlan(t, st, drained, rates, p, now)
			snap := NewSnapshot(st)
			for _, id := range held {
				ts := st.Tenants[id]
				if slices.ContainsFunc(ts.Members, func(m Placement) bool { return m.ID == gone }) {
					t.Fatalf("tenant %s keeps %s in its subset", id, gone)
				}
				if want := map[string]int{"a": 3, "b": 3, "c": 1}[id]; len(ts.Members) != want {
					t.Fatalf("tenant %s has %d members; want %d (one for one)", id, len(ts.Members), want)
				}
			}
			until, ok := snap.ReadUntil(gone)
			want := now.Add(tc.want)
			if tc.want == 0 {
				want = time.Time{}
			}
			if !ok || !until.Equal(want) {
				t.Fatalf("ReadUntil(%s) = %v, %v; want %v", gone, until, ok, want)
			}
			if tc.want > 0 {
				if !slices.Contains(snap.Targets(held[0], until.Add(-time.Nanosecond)), gone) || slices.Contains(snap.Targets(held[0], until), gone) {
					t.Fatalf("targets of %s do not end at %v", held[0], until)
				}
			}
			st, _ = mustPlan(t, st, drained, rates, p, now.Add(tc.want))
			if ts := NewSnapshot(st).Tenants(gone); len(ts) != 0 {
				t.Fatalf("%s still serves %v after %v", gone, ts, tc.want)
			}
		})
	}
}
