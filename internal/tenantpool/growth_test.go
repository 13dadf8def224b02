package tenantpool

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/keyshard/keyshard/placement"
)

// growthRates is a heavy-tailed load over n tenants (Pareto, α = 1.1),
// capped so that no tenant wants more than 9 members at capacity 10: with
// 10 members in 3 zones every size then fits the smallest pool, so no size
// is clamped by the pool and none has a reason to change as it grows.
func growthRates(n int, seed uint64) map[string]float64 {
	r := rand.New(rand.NewPCG(seed, 11))
	rates := make(map[string]float64, n)
	for i := range n {
		v := 0.5 * math.Pow(1-r.Float64(), -1/1.1)
		rates[fmt.Sprintf("t%05d", i)] = math.Min(v, 88)
	}
	return rates
}

// placements is the set of (tenant, member) pairs of st.
func placements(st State) map[[2]string]bool {
	out := map[[2]string]bool{}
	for id, ts := range st.Tenants {
		for _, m := range ts.Members {
			out[[2]string{id, m.ID}] = true
		}
	}
	return out
}

// memberLoads returns every member's load in st: the sum over the tenants
// it serves of rate/size, as placement.Shards counts it.
func memberLoads(st State, rates map[string]float64) map[string]float64 {
	load := map[string]float64{}
	for _, m := range st.Members {
		load[m.ID] = 0
	}
	for id, ts := range st.Tenants {
		if len(ts.Members) == 0 {
			continue
		}
		piece := rates[id] / float64(len(ts.Members))
		for _, m := range ts.Members {
			load[m.ID] += piece
		}
	}
	return load
}

type growthResult struct {
	moved, net, minimum int
	maxOverShare        float64
	rounds              int
}

// growPool grows a pool of 10 members in 3 zones to 100 in steps, rates
// steady, then runs rounds at 100 members until a round moves nothing.
// It fails the test if any size changes or a round changes a tenant's
// subset other than by swapping members (sizes stay, so every added
// member is a moved placement).
func growPool(tb testing.TB, tenants, rebalance int) growthResult {
	p := goodPolicy()
	p.ZoneAware = true
	p.RebalanceMoves = rebalance
	rates := growthRates(tenants, 1)
	pl := NewPlanner(State{})
	now := t0
	round := func(n int) Changes {
		now = now.Add(time.Second)
		_, ch, err := pl.Plan(pool(n, 3), rates, p, now)
		if err != nil {
			tb.Fatal(err)
		}
		return ch
	}
	round(10)
	start := Clone(pl.State())
	sizes := map[string]int{}
	for id, ts := range start.Tenants {
		sizes[id] = ts.Size.Size
		if ts.Size.Size > 9 || ts.Size.Size != len(ts.Members) {
			tb.Fatalf("%s: size %d with %d members in a pool of 10", id, ts.Size.Size, len(ts.Members))
		}
	}
	tol := placement.DefaultTolerance
	res := growthResult{minimum: MinMoves(start, pool(100, 3), rates, tol)}
	count := func(ch Changes) int {
		if len(ch.Sizes) != 0 {
			tb.Fatalf("the pool's growth changed sizes: %+v", ch.Sizes[0])
		}
		n := 0
		for _, c := range ch.Subsets {
			if len(c.Added) != len(c.Removed) {
				tb.Fatalf("%s: %+v is not a swap", c.Tenant, c)
			}
			n += len(c.Added)
		}
		return n
	}
	for _, n := range []int{25, 50, 75, 100} {
		res.moved += count(round(n))
		res.rounds++
	}
	for range 100 {
		k := count(round(100))
		res.moved += k
		res.rounds++
		if k == 0 {
			break
		}
	}
	st := pl.State()
	for id, ts := range st.Tenants {
		if ts.Size.Size != sizes[id] || len(ts.Members) != sizes[id] {
			tb.Fatalf("%s: size %d → %d (%d members)", id, sizes[id], ts.Size.Size, len(ts.Members))
		}
	}
	before := placements(start)
	for pm := range placements(st) {
		if !before[pm] {
			res.net++
		}
	}
	total := 0.0
	for _, r := range rates {
		total += r
	}
	for _, l := range memberLoads(st, rates) {
		res.maxOverShare = math.Max(res.maxOverShare, l/(total/100))
	}
	return res
}

// TestGrowthMovesOnlyWhatBalanceNeeds: growing a pool from 10 to 100
// members, rates steady over 2,000 heavy-tailed tenants in 3 zones,
// changes no tenant's size. Without rebalance moves it moves nothing;
// with them it moves placements until every member is within the
// tolerance of its share, and not many more than the fewest that can get
// there.
func TestGrowthMovesOnlyWhatBalanceNeeds(t *testing.T) {
	if r := growPool(t, 2000, 0); r.moved != 0 || r.net != 0 {
		t.Fatalf("RebalanceMoves 0: moved %d placements (%d net), want 0", r.moved, r.net)
	}
	r := growPool(t, 2000, 500)
	t.Logf("moved %d placements (%d net) in %d rounds; the minimum for tolerance %v is %d (×%.2f); max load/share %.3f",
		r.moved, r.net, r.rounds, placement.DefaultTolerance, r.minimum, float64(r.moved)/float64(r.minimum), r.maxOverShare)
	if r.maxOverShare > 1+placement.DefaultTolerance+1e-9 {
		t.Errorf("a member ends at %.3f × its share, above the tolerance", r.maxOverShare)
	}
	if r.minimum == 0 || r.moved < r.minimum || r.net > r.moved {
		t.Fatalf("moved %d (%d net), minimum %d: the bound or the count is wrong", r.moved, r.net, r.minimum)
	}
	if float64(r.moved) > growthBound*float64(r.minimum) {
		t.Errorf("moved %d placements, more than %.2f × the minimum %d", r.moved, growthBound, r.minimum)
	}
}

// growthBound is how many times the minimum the growth may move.
const growthBound = 1.25

func BenchmarkGrowth10To100(b *testing.B) {
	var r growthResult
	for b.Loop() {
		r = growPool(b, 2000, 500)
	}
	b.ReportMetric(float64(r.moved), "moved")
	b.ReportMetric(float64(r.net), "moved_net")
	b.ReportMetric(float64(r.minimum), "minimum")
	b.ReportMetric(r.maxOverShare, "max_load/share")
}

// TestLeaveChangesOnlyHolders: one member leaving changes only the
// subsets that held it, each by exactly one member (the leaver replaced
// by one other, of its zone), and no size; the round lists exactly those
// tenants. With rebalance moves allowed, from a balanced pool, the same.
func TestLeaveChangesOnlyHolders(t *testing.T) {
	for _, rebalance := range []int{0, 500} {
		t.Run(fmt.Sprint("rebalance=", rebalance), func(t *testing.T) {
			p := goodPolicy()
			p.ZoneAware, p.RebalanceMoves = true, rebalance
			rates := growthRates(2000, 2)
			ms := pool(30, 3)
			pl := NewPlanner(State{})
			now := t0
			for i := 0; ; i++ { // until balanced and quiet
				now = now.Add(time.Second)
				_, ch, err := pl.Plan(ms, rates, p, now)
				if err != nil {
					t.Fatal(err)
				}
				if i > 0 && len(ch.Tenants) == 0 {
					break
				}
				if i == 50 {
					t.Fatal("rounds never settle")
				}
			}
			before := Clone(pl.State())
			const leaver = 7
			gone := ms[leaver]
			left := slices.Delete(slices.Clone(ms), leaver, leaver+1)
			st, ch, err := pl.Plan(left, rates, p, now.Add(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			zone := map[string]string{}
			for _, m := range ms {
				zone[m.ID] = m.Zone
			}
			var holders []string
			for _, id := range sortedKeys(before.Tenants) {
				old, ts := before.Tenants[id], st.Tenants[id]
				if ts.Size != old.Size {
					t.Fatalf("%s: size %+v → %+v", id, old.Size, ts.Size)
				}
				oldIDs, newIDs := placementIDs(old.Members), placementIDs(ts.Members)
				if !slices.Contains(oldIDs, gone.ID) {
					if !ts.visiblyEqual(old) {
						t.Fatalf("%s did not hold %s but changed: %v → %v", id, gone.ID, oldIDs, newIDs)
					}
					continue
				}
				holders = append(holders, id)
				var added, removed []string
				for _, m := range newIDs {
					if !slices.Contains(oldIDs, m) {
						added = append(added, m)
					}
				}
				for _, m := range oldIDs {
					if !slices.Contains(newIDs, m) {
						removed = append(removed, m)
					}
				}
				if len(added) != 1 || !slices.Equal(removed, []string{gone.ID}) || len(newIDs) != len(oldIDs) {
					t.Fatalf("%s: %v → %v, want %s replaced by one member", id, oldIDs, newIDs, gone.ID)
				}
				if zone[added[0]] != gone.Zone {
					t.Errorf("%s: %s of zone %s replaced by %s of zone %s", id, gone.ID, gone.Zone, added[0], zone[added[0]])
				}
				for _, r := range ts.Removed {
					if r.ID == gone.ID {
						t.Fatalf("%s: the departed %s is kept as a read target", id, gone.ID)
					}
				}
			}
			if len(holders) == 0 {
				t.Fatal("no tenant held the leaver")
			}
			if !slices.Equal(ch.Tenants, holders) || len(ch.Subsets) != len(holders) || len(ch.Sizes) != 0 {
				t.Fatalf("round lists %d tenants, %d subset and %d size changes; %d held %s", len(ch.Tenants), len(ch.Subsets), len(ch.Sizes), len(holders), gone.ID)
			}
			t.Logf("%s left: %d of %d subsets changed, each by one member", gone.ID, len(holders), len(st.Tenants))
		})
	}
}
