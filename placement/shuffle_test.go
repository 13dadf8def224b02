package placement_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/keyshard/keyshard/placement"
	"pgregory.net/rapid"
)

// shardTB is what the shuffle-shard checks need from *testing.T and
// *rapid.T.
type shardTB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
}

// shardCall is one call to Shards.
type shardCall struct {
	prev    map[string][]string
	members []placement.Member
	tenants []placement.Tenant
	opts    placement.ShardOptions
}

func (c shardCall) run(t shardTB) placement.ShardPlan {
	t.Helper()
	p, err := placement.Shards(c.prev, c.members, c.tenants, c.opts)
	if err != nil {
		t.Fatalf("Shards: %v", err)
	}
	checkShardPlan(t, c, p)
	return p
}

func genShardMembers(t *rapid.T, maxN int) []placement.Member {
	n := rapid.IntRange(1, maxN).Draw(t, "members")
	zones := rapid.IntRange(1, 3).Draw(t, "zones")
	ms := make([]placement.Member, n)
	for i := range ms {
		ms[i] = placement.Member{
			ID:     fmt.Sprintf("m%02d", i),
			Weight: rapid.SampledFrom([]float64{1, 1, 1, 2, 0.5, 0}).Draw(t, "weight"),
			Zone:   fmt.Sprintf("z%d", rapid.IntRange(0, zones-1).Draw(t, "zone")),
		}
	}
	return ms
}

func genShardTenants(t *rapid.T, maxN, maxSize int) []placement.Tenant {
	n := rapid.IntRange(0, maxN).Draw(t, "tenants")
	ts := make([]placement.Tenant, n)
	for i := range ts {
		ts[i] = placement.Tenant{
			ID:   fmt.Sprintf("t%03d", i),
			Size: rapid.IntRange(0, maxSize).Draw(t, "size"),
			Load: rapid.SampledFrom([]float64{0, 1, 5, 10, 100}).Draw(t, "load"),
		}
	}
	return ts
}

func eligibleCount(ms []placement.Member) int {
	n := 0
	for _, m := range ms {
		if m.Weight > 0 {
			n++
		}
	}
	return n
}

func distinct(ids []string) []string {
	out := slices.Clone(ids)
	slices.Sort(out)
	return slices.Compact(out)
}

// checkShardPlan checks what every plan must satisfy, whatever the input.
func checkShardPlan(t shardTB, c shardCall, p placement.ShardPlan) {
	t.Helper()
	zoneSizes, zoneOf := eligibleZones(c.members)
	weight := map[string]float64{}
	for _, m := range c.members {
		weight[m.ID] = m.Weight
	}
	e := eligibleCount(c.members)
	if len(p.Subsets) != len(c.tenants) {
		t.Fatalf("%d subsets for %d tenants", len(p.Subsets), len(c.tenants))
	}
	wantLoad := map[string]float64{}
	var total float64
	for _, tn := range c.tenants {
		sub, ok := p.Subsets[tn.ID]
		if !ok {
			t.Fatalf("tenant %s has no subset", tn.ID)
		}
		if want := min(tn.Size, e); len(sub) != want {
			t.Fatalf("tenant %s has %d members, want %d", tn.ID, len(sub), want)
		}
		if sub == nil || !slices.IsSorted(sub) || len(distinct(sub)) != len(sub) {
			t.Fatalf("tenant %s subset %v is not a sorted set", tn.ID, sub)
		}
		for _, id := range sub {
			if _, ok := zoneOf[id]; !ok {
				t.Fatalf("tenant %s has %s, which is not an eligible member", tn.ID, id)
			}
			wantLoad[id] += tn.Load / float64(len(sub))
		}
		if len(sub) > 0 {
			total += tn.Load
		}
		// Members were only ever added below the zone cap.
		prevSet := distinct(c.prev[tn.ID])
		perZone := map[string]int{}
		for _, id := range sub {
			perZone[zoneOf[id]]++
		}
		for _, id := range setDiff(sub, prevSet) {
			if z := zoneOf[id]; perZone[z] > zoneCap(zoneSizes, len(sub)) {
				t.Fatalf("tenant %s gained %s in zone %s, which now holds %d > cap %d", tn.ID, id, z, perZone[z], zoneCap(zoneSizes, len(sub)))
			}
		}
		if len(c.prev) == 0 {
			for z, n := range perZone {
				if n > zoneCap(zoneSizes, len(sub)) {
					t.Fatalf("tenant %s has %d members in zone %s, cap %d", tn.ID, n, z, zoneCap(zoneSizes, len(sub)))
				}
			}
		}
	}
	// Loads and balance.
	if len(p.MemberLoad) != len(c.members) {
		t.Fatalf("MemberLoad has %d members, want %d", len(p.MemberLoad), len(c.members))
	}
	var totalW float64
	for _, m := range c.members {
		totalW += m.Weight
	}
	var maxOver float64
	for _, m := range c.members {
		got, want := p.MemberLoad[m.ID], wantLoad[m.ID]
		if math.Abs(got-want) > 1e-9*(1+total) {
			t.Fatalf("MemberLoad[%s] = %v, want %v", m.ID, got, want)
		}
		if m.Weight > 0 && total > 0 {
			maxOver = max(maxOver, want/(total/totalW*m.Weight))
		}
	}
	if math.Abs(p.MaxOverMean-maxOver) > 1e-9*(1+maxOver) {
		t.Fatalf("MaxOverMean = %v, want %v", p.MaxOverMean, maxOver)
	}
	// Changes are exactly the differences from prev.
	if !slices.IsSortedFunc(p.Changes, func(a, b placement.ShardChange) int { return strings.Compare(a.Tenant, b.Tenant) }) {
		t.Fatalf("changes not sorted by tenant")
	}
	changed := map[string]placement.ShardChange{}
	for _, ch := range p.Changes {
		if _, dup := changed[ch.Tenant]; dup {
			t.Fatalf("tenant %s changes twice", ch.Tenant)
		}
		changed[ch.Tenant] = ch
		if ch.Reason == "" || len(ch.Added)+len(ch.Removed) == 0 {
			t.Fatalf("empty change %+v", ch)
		}
	}
	all := map[string]bool{}
	for id := range c.prev {
		all[id] = true
	}
	for id := range p.Subsets {
		all[id] = true
	}
	rebalanced := 0
	for id := range all {
		prev, now := distinct(c.prev[id]), p.Subsets[id]
		added, removed := setDiff(now, prev), setDiff(prev, now)
		ch, ok := changed[id]
		if len(added)+len(removed) == 0 {
			if ok {
				t.Fatalf("change %+v for unchanged tenant", ch)
			}
			continue
		}
		if !ok {
			t.Fatalf("tenant %s changed (+%v -%v) without a Change", id, added, removed)
		}
		if !cmp.Equal(ch.Added, added, cmpEmpty) || !cmp.Equal(ch.Removed, removed, cmpEmpty) {
			t.Fatalf("change %+v, want +%v -%v", ch, added, removed)
		}
		if strings.Contains(ch.Reason, "rebalance") || strings.Contains(ch.Reason, "zone spread") {
			if len(added) != len(removed) {
				t.Fatalf("rebalance change %+v is not swaps", ch)
			}
			rebalanced += len(added)
		}
	}
	if rebalanced != p.RebalanceMoves || p.RebalanceMoves > c.opts.MaxRebalanceMoves {
		t.Fatalf("RebalanceMoves = %d, swaps seen %d, budget %d", p.RebalanceMoves, rebalanced, c.opts.MaxRebalanceMoves)
	}
	// Sticky: without a rebalance, members that are still eligible stay
	// unless the tenant shrinks.
	if c.opts.MaxRebalanceMoves == 0 {
		for _, tn := range c.tenants {
			var kept []string
			for _, id := range distinct(c.prev[tn.ID]) {
				if _, ok := zoneOf[id]; ok {
					kept = append(kept, id)
				}
			}
			now := p.Subsets[tn.ID]
			if len(kept) <= len(now) {
				if d := setDiff(kept, now); len(d) > 0 {
					t.Fatalf("tenant %s lost %v without shrinking", tn.ID, d)
				}
			} else if d := setDiff(now, kept); len(d) > 0 {
				t.Fatalf("tenant %s shrank and gained %v", tn.ID, d)
			}
		}
	}
}

var cmpEmpty = cmp.Comparer(func(a, b []string) bool { return slices.Equal(a, b) })

// TestShardsProperties runs random sequences of pool changes and checks the
// guarantee of each step.
func TestShardsProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := shardCall{
			members: genShardMembers(t, 16),
			tenants: genShardTenants(t, 25, 8),
		}
		p := c.run(t)
		checkDeterministic(t, c, p)
		nextID := 100
		for step := range rapid.IntRange(1, 6).Draw(t, "steps") {
			c.prev = p.Subsets
			e := eligibleCount(c.members)
			effSize := func(tn placement.Tenant, e int) int { return min(tn.Size, e) }
			c.opts.MaxRebalanceMoves = 0
			op := rapid.SampledFrom([]string{"resize", "leave", "drain", "join", "load", "newTenant", "dropTenant", "rebalance"}).Draw(t, fmt.Sprint("op", step))
			var check func(placement.ShardPlan)
			switch op {
			case "resize":
				if len(c.tenants) == 0 {
					continue
				}
				i := rapid.IntRange(0, len(c.tenants)-1).Draw(t, "tenant")
				c.tenants = slices.Clone(c.tenants)
				old := c.tenants[i]
				c.tenants[i].Size = rapid.IntRange(0, 10).Draw(t, "newSize")
				delta := effSize(c.tenants[i], e) - effSize(old, e)
				check = func(p placement.ShardPlan) {
					wantChanges := 0
					if delta != 0 {
						wantChanges = 1
						ch := p.Changes[0]
						if ch.Tenant != old.ID || len(ch.Added) != max(delta, 0) || len(ch.Removed) != max(-delta, 0) {
							t.Fatalf("resize %s by %d: change %+v", old.ID, delta, ch)
						}
					}
					if len(p.Changes) != wantChanges {
						t.Fatalf("resize %s by %d: changes %+v", old.ID, delta, p.Changes)
					}
				}
			case "leave", "drain":
				if len(c.members) == 0 {
					continue
				}
				i := rapid.IntRange(0, len(c.members)-1).Draw(t, "member")
				gone := c.members[i]
				c.members = slices.Clone(c.members)
				if op == "leave" {
					c.members = slices.Delete(c.members, i, i+1)
				} else {
					c.members[i].Weight = 0
				}
				e2 := eligibleCount(c.members)
				check = func(p placement.ShardPlan) {
					n := 0
					for _, tn := range c.tenants {
						had := slices.Contains(c.prev[tn.ID], gone.ID)
						if !had {
							continue
						}
						n++
						ch := p.Changes[slices.IndexFunc(p.Changes, func(ch placement.ShardChange) bool { return ch.Tenant == tn.ID })]
						wantAdded := effSize(tn, e2) - (effSize(tn, e) - 1)
						if !slices.Equal(ch.Removed, []string{gone.ID}) || len(ch.Added) != wantAdded {
							t.Fatalf("%s %s: change %+v, want -[%s] and %d added", op, gone.ID, ch, gone.ID, wantAdded)
						}
					}
					if len(p.Changes) != n {
						t.Fatalf("%s %s: %d changes, %d tenants had it: %+v", op, gone.ID, len(p.Changes), n, p.Changes)
					}
				}
			case "join":
				c.members = append(slices.Clone(c.members), placement.Member{
					ID:     fmt.Sprintf("m%d", nextID),
					Weight: rapid.SampledFrom([]float64{1, 2}).Draw(t, "joinWeight"),
					Zone:   fmt.Sprintf("z%d", rapid.IntRange(0, 3).Draw(t, "joinZone")),
				})
				nextID++
				e2 := e + 1
				check = func(p placement.ShardPlan) {
					// Only tenants clamped by the pool size grow; nothing moves.
					for _, ch := range p.Changes {
						tn := c.tenants[slices.IndexFunc(c.tenants, func(tn placement.Tenant) bool { return tn.ID == ch.Tenant })]
						if len(ch.Removed) != 0 || len(ch.Added) != effSize(tn, e2)-effSize(tn, e) || len(ch.Added) == 0 {
							t.Fatalf("join: change %+v", ch)
						}
					}
				}
			case "load":
				c.tenants = slices.Clone(c.tenants)
				for i := range c.tenants {
					c.tenants[i].Load = rapid.Float64Range(0, 50).Draw(t, "newLoad")
				}
				check = func(p placement.ShardPlan) {
					if len(p.Changes) != 0 {
						t.Fatalf("load change moved tenants: %+v", p.Changes)
					}
				}
			case "newTenant":
				tn := placement.Tenant{ID: fmt.Sprintf("t%d", nextID), Size: rapid.IntRange(0, 6).Draw(t, "size"), Load: 7}
				nextID++
				c.tenants = append(slices.Clone(c.tenants), tn)
				check = func(p placement.ShardPlan) {
					want := 0
					if effSize(tn, e) > 0 {
						want = 1
						if ch := p.Changes[0]; ch.Tenant != tn.ID || ch.Reason != "new tenant" && !strings.HasPrefix(ch.Reason, "new tenant;") {
							t.Fatalf("new tenant: change %+v", ch)
						}
					}
					if len(p.Changes) != want {
						t.Fatalf("new tenant: changes %+v", p.Changes)
					}
				}
			case "rebalance":
				// Members join (maybe in a new zone) with a budget: at most
				// that many swaps, each lowering sum(load²/weight).
				for range rapid.IntRange(1, 3).Draw(t, "joins") {
					c.members = append(slices.Clone(c.members), placement.Member{
						ID:     fmt.Sprintf("m%d", nextID),
						Weight: rapid.SampledFrom([]float64{1, 2}).Draw(t, "joinWeight"),
						Zone:   fmt.Sprintf("z%d", rapid.IntRange(0, 3).Draw(t, "joinZone")),
					})
					nextID++
				}
				c.opts.MaxRebalanceMoves = rapid.IntRange(1, 30).Draw(t, "budget")
				c.opts.Tolerance = rapid.SampledFrom([]float64{0, 0.01, 0.2}).Draw(t, "tolerance")
				noBudget := c
				noBudget.opts.MaxRebalanceMoves = 0
				base := noBudget.run(t)
				check = func(p placement.ShardPlan) {
					sumSq := func(p placement.ShardPlan) float64 {
						var s float64
						for _, m := range c.members {
							if m.Weight > 0 {
								s += p.MemberLoad[m.ID] * p.MemberLoad[m.ID] / m.Weight
							}
						}
						return s
					}
					// Zone repairs may raise it; load moves only lower it.
					repaired := slices.ContainsFunc(p.Changes, func(ch placement.ShardChange) bool { return ch.Reason == "zone spread" })
					if a, b := sumSq(p), sumSq(base); a > b*(1+1e-9)+1e-12 && !repaired {
						t.Fatalf("sum load²/weight rose from %v to %v: %+v", b, a, p.Changes)
					}
				}
			case "dropTenant":
				if len(c.tenants) == 0 {
					continue
				}
				i := rapid.IntRange(0, len(c.tenants)-1).Draw(t, "tenant")
				tn := c.tenants[i]
				c.tenants = slices.Delete(slices.Clone(c.tenants), i, i+1)
				check = func(p placement.ShardPlan) {
					want := 0
					if len(c.prev[tn.ID]) > 0 {
						want = 1
						if ch := p.Changes[0]; ch.Tenant != tn.ID || ch.Reason != "tenant removed" || len(ch.Added) != 0 {
							t.Fatalf("drop tenant: change %+v", ch)
						}
					}
					if len(p.Changes) != want {
						t.Fatalf("drop tenant: changes %+v", p.Changes)
					}
				}
			}
			p = c.run(t)
			check(p)
			checkDeterministic(t, c, p)
		}
	})
}

// checkDeterministic runs the call again with members and tenants in
// another order and prev copied (so its map order differs).
func checkDeterministic(t shardTB, c shardCall, want placement.ShardPlan) {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(len(c.members)), uint64(len(c.tenants))))
	c2 := c
	c2.members = slices.Clone(c.members)
	rng.Shuffle(len(c2.members), func(i, j int) { c2.members[i], c2.members[j] = c2.members[j], c2.members[i] })
	c2.tenants = slices.Clone(c.tenants)
	rng.Shuffle(len(c2.tenants), func(i, j int) { c2.tenants[i], c2.tenants[j] = c2.tenants[j], c2.tenants[i] })
	c2.prev = map[string][]string{}
	for k, v := range c.prev {
		v = slices.Clone(v)
		rng.Shuffle(len(v), func(i, j int) { v[i], v[j] = v[j], v[i] })
		c2.prev[k] = v
	}
	got, err := placement.Shards(c2.prev, c2.members, c2.tenants, c2.opts)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("plan depends on input order (-first +second):\n%s", diff)
	}
}

// refShards is a deliberately simple sticky placement: keep the eligible
// previous members, shrink by dropping the most loaded, grow by adding the
// least loaded member (ties to the smaller ID) below the zone cap. It has no
// tolerance band and no per-tenant hash.
func refShards(prev map[string][]string, members []placement.Member, tenants []placement.Tenant) map[string][]string {
	zoneSizes, zoneOf := eligibleZones(members)
	weight := map[string]float64{}
	var ids []string
	for _, m := range members {
		if m.Weight > 0 {
			weight[m.ID] = m.Weight
			ids = append(ids, m.ID)
		}
	}
	sort.Strings(ids)
	ts := slices.Clone(tenants)
	sort.Slice(ts, func(i, j int) bool { return ts[i].ID < ts[j].ID })
	load := map[string]float64{}
	out := map[string][]string{}
	size := func(tn placement.Tenant) int { return min(tn.Size, len(ids)) }
	for _, tn := range ts {
		for _, id := range distinct(prev[tn.ID]) {
			if weight[id] > 0 {
				out[tn.ID] = append(out[tn.ID], id)
				load[id] += tn.Load / float64(size(tn))
			}
		}
	}
	for _, tn := range ts {
		s := size(tn)
		for len(out[tn.ID]) > s {
			sub := out[tn.ID]
			perZone := map[string]int{}
			for _, id := range sub {
				perZone[zoneOf[id]]++
			}
			worst := 0
			for i, id := range sub {
				over, worstOver := perZone[zoneOf[id]] > zoneCap(zoneSizes, s), perZone[zoneOf[sub[worst]]] > zoneCap(zoneSizes, s)
				if over && !worstOver || over == worstOver && load[id]/weight[id] > load[sub[worst]]/weight[sub[worst]] {
					worst = i
				}
			}
			load[sub[worst]] -= tn.Load / float64(s)
			out[tn.ID] = slices.Delete(sub, worst, worst+1)
		}
		for len(out[tn.ID]) < s {
			perZone := map[string]int{}
			for _, id := range out[tn.ID] {
				perZone[zoneOf[id]]++
			}
			best := ""
			for _, id := range ids {
				if slices.Contains(out[tn.ID], id) || perZone[zoneOf[id]] >= zoneCap(zoneSizes, s) {
					continue
				}
				if best == "" || load[id]/weight[id] < load[best]/weight[best] {
					best = id
				}
			}
			out[tn.ID] = append(out[tn.ID], best)
			load[best] += tn.Load / float64(s)
		}
		slices.Sort(out[tn.ID])
	}
	return out
}

// TestShardsMatchesReference compares Shards with refShards: the same
// members must be kept and the same number added and removed for every
// tenant, and the load must be as well balanced as the reference's, up to
// the tolerance band.
func TestShardsMatchesReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := shardCall{members: genShardMembers(t, 16), tenants: genShardTenants(t, 25, 8)}
		first := c.run(t)
		// Perturb: some members leave or drain, sizes change.
		c.prev = first.Subsets
		c.members = slices.Clone(c.members)
		for i := range c.members {
			if rapid.IntRange(0, 5).Draw(t, "perturb") == 0 {
				c.members[i].Weight = 0
			}
		}
		c.tenants = slices.Clone(c.tenants)
		for i := range c.tenants {
			if rapid.Bool().Draw(t, "resize") {
				c.tenants[i].Size = rapid.IntRange(0, 8).Draw(t, "size")
			}
		}
		got := c.run(t)
		checkDeterministic(t, c, got)
		want := refShards(c.prev, c.members, c.tenants)
		for _, tn := range c.tenants {
			g, w := got.Subsets[tn.ID], want[tn.ID]
			prev := distinct(c.prev[tn.ID])
			removedG, removedW := setDiff(prev, g), setDiff(prev, w)
			if len(g) != len(w) || len(removedG) != len(removedW) || len(setDiff(g, prev)) != len(setDiff(w, prev)) {
				t.Fatalf("tenant %s: prev %v, Shards %v, reference %v", tn.ID, prev, g, w)
			}
			// Without shrinking, both remove exactly the drained members.
			if len(prev)-len(removedG) < len(g) && !slices.Equal(removedG, removedW) {
				t.Fatalf("tenant %s: prev %v, Shards removed %v, reference %v", tn.ID, prev, removedG, removedW)
			}
			// Departed members are removed by both.
			for _, id := range prev {
				if c.members[slices.IndexFunc(c.members, func(m placement.Member) bool { return m.ID == id })].Weight == 0 &&
					(slices.Contains(g, id) || slices.Contains(w, id)) {
					t.Fatalf("tenant %s kept drained %s", tn.ID, id)
				}
			}
		}
	})
}

// TestShardsBalanceBound checks the balance that the tolerance band
// promises when there is one zone: a member gaining a tenant is within
// Tolerance/2 of the least loaded candidate, so no member ends above
//
//	W/(W - w(s-1)) + (max piece/min weight)/mean + Tolerance/2
//
// times its share, where w(s-1) is the weight of the s-1 heaviest members
// (the candidates exclude the tenant's other members), and the naive
// reference stays under the same bound without the band.
func TestShardsBalanceBound(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ms := genShardMembers(t, 20)
		for i := range ms {
			ms[i].Zone = ""
		}
		c := shardCall{
			members: ms,
			tenants: genShardTenants(t, 60, 5),
			opts:    placement.ShardOptions{Tolerance: rapid.SampledFrom([]float64{0.01, 0.1, 0.3}).Draw(t, "tolerance")},
		}
		p := c.run(t)
		var w []float64
		var totalW, total, maxPiece float64
		minW := math.Inf(1)
		for _, m := range ms {
			if m.Weight > 0 {
				w = append(w, m.Weight)
				totalW += m.Weight
				minW = min(minW, m.Weight)
			}
		}
		slices.Sort(w)
		slices.Reverse(w)
		maxSize := 0
		for _, tn := range c.tenants {
			if s := min(tn.Size, len(w)); s > 0 {
				total += tn.Load
				maxPiece = max(maxPiece, tn.Load/float64(s))
				maxSize = max(maxSize, s)
			}
		}
		if total == 0 {
			return
		}
		var top float64
		for _, x := range w[:max(maxSize-1, 0)] {
			top += x
		}
		meanNorm := total / totalW
		bound := totalW/(totalW-top) + maxPiece/minW/meanNorm + c.opts.Tolerance/2 + 1e-9
		if p.MaxOverMean > bound {
			t.Fatalf("MaxOverMean %.4f above bound %.4f", p.MaxOverMean, bound)
		}
	})
}

// TestShardsBalancedPool checks the tolerance in a pool of many small
// tenants over three equal zones, from nothing and after churn.
func TestShardsBalancedPool(t *testing.T) {
	for _, tol := range []float64{0.02, 0.05, 0.1} {
		t.Run(fmt.Sprint(tol), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, 7))
			ms := shufflePool(30, 3)
			var ts []placement.Tenant
			for i := range 10000 {
				ts = append(ts, placement.Tenant{ID: fmt.Sprintf("t%05d", i), Size: 1 + rng.IntN(6), Load: rng.Float64() * 10})
			}
			c := shardCall{members: ms, tenants: ts, opts: placement.ShardOptions{Tolerance: tol}}
			p := c.run(t)
			t.Logf("from nothing: MaxOverMean %.4f", p.MaxOverMean)
			if p.MaxOverMean > 1+tol {
				t.Errorf("from nothing: MaxOverMean %.4f > %v", p.MaxOverMean, 1+tol)
			}
			// One member leaves: its tenants spread over the others.
			c.prev, c.members = p.Subsets, ms[1:]
			p = c.run(t)
			t.Logf("after a leave: MaxOverMean %.4f", p.MaxOverMean)
			if p.MaxOverMean > 1+tol {
				t.Errorf("after a leave: MaxOverMean %.4f > %v", p.MaxOverMean, 1+tol)
			}
		})
	}
}

// TestShardsOverlap checks that the tie-breaking hash keeps subsets about as
// disjoint as random ones, also for tenants without load, where the naive
// reference puts every tenant on the same members.
func TestShardsOverlap(t *testing.T) {
	for _, loads := range []string{"random", "zero"} {
		t.Run(loads, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			ms := shufflePool(60, 3)
			var ts []placement.Tenant
			for i := range 2000 {
				tn := placement.Tenant{ID: fmt.Sprintf("t%04d", i), Size: 1 + rng.IntN(8)}
				if loads == "random" {
					tn.Load = 1000 / math.Pow(float64(1+rng.IntN(2000)), 0.8)
				}
				ts = append(ts, tn)
			}
			p := shardCall{members: ms, tenants: ts}.run(t)
			r := placement.Overlap(p.Subsets, len(ms), 0)
			t.Logf("\n%v", r)
			checkOverlapNearRandom(t, r)
			if loads == "zero" {
				naive := placement.Overlap(refShards(nil, ms, ts), len(ms), 0)
				if naive.ObservedMean < 2*naive.ExpectedMean {
					t.Errorf("the naive reference was expected to overlap far more than random:\n%v", naive)
				}
			}
		})
	}
}

// TestShardsRebalance adds members to a stable pool: without a budget
// nothing moves, with one the new members take load, within the budget.
func TestShardsRebalance(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	ms := shufflePool(24, 3)
	var ts []placement.Tenant
	for i := range 1500 {
		ts = append(ts, placement.Tenant{ID: fmt.Sprintf("t%04d", i), Size: 1 + rng.IntN(5), Load: 1 + rng.Float64()*9})
	}
	stable := shardCall{members: ms, tenants: ts}.run(t)
	grown := append(slices.Clone(ms), placement.Member{ID: "n1", Weight: 1, Zone: "z0"}, placement.Member{ID: "n2", Weight: 2, Zone: "z1"}, placement.Member{ID: "n3", Weight: 1, Zone: "z2"})

	p := shardCall{prev: stable.Subsets, members: grown, tenants: ts}.run(t)
	if len(p.Changes) != 0 || p.MemberLoad["n1"] != 0 {
		t.Fatalf("adding members without a budget moved %d tenants", len(p.Changes))
	}
	sumSq := func(p placement.ShardPlan) float64 {
		var s float64
		for _, m := range grown {
			s += p.MemberLoad[m.ID] * p.MemberLoad[m.ID] / m.Weight
		}
		return s
	}
	prevSq := sumSq(p)
	for _, budget := range []int{1, 10, 100, 10000} {
		q := shardCall{prev: stable.Subsets, members: grown, tenants: ts, opts: placement.ShardOptions{MaxRebalanceMoves: budget}}.run(t)
		if q.RebalanceMoves > budget || q.RebalanceMoves == 0 {
			t.Errorf("budget %d: %d moves", budget, q.RebalanceMoves)
		}
		if s := sumSq(q); s >= prevSq {
			t.Errorf("budget %d: sum of load²/weight %v, not below %v", budget, s, prevSq)
		} else {
			prevSq = s
		}
		for _, ch := range q.Changes {
			if ch.Reason != "rebalance" || len(ch.Added) != 1 || len(ch.Removed) != 1 {
				t.Errorf("budget %d: change %+v", budget, ch)
			}
		}
		if budget == 10000 {
			for _, id := range []string{"n1", "n2", "n3"} {
				share := q.MemberLoad[id] / (q.MemberLoad["m000"])
				if id == "n2" {
					share /= 2
				}
				if share < 0.85 {
					t.Errorf("new member %s has %.2f of an old member's load", id, share)
				}
			}
			if q.MaxOverMean > 1.1 {
				t.Errorf("MaxOverMean %.3f after a full rebalance", q.MaxOverMean)
			}
		}
	}
}

// TestShardsZoneRepair adds a zone: the caps shrink, existing subsets are
// left alone without a budget and repaired with one.
func TestShardsZoneRepair(t *testing.T) {
	ms := shufflePool(12, 2)
	var ts []placement.Tenant
	for i := range 200 {
		ts = append(ts, placement.Tenant{ID: fmt.Sprintf("t%03d", i), Size: 2 + i%5, Load: 1})
	}
	stable := shardCall{members: ms, tenants: ts}.run(t)
	var grown []placement.Member
	grown = append(grown, ms...)
	for i := range 6 {
		grown = append(grown, placement.Member{ID: fmt.Sprintf("n%d", i), Weight: 1, Zone: "z2"})
	}
	if p := (shardCall{prev: stable.Subsets, members: grown, tenants: ts}.run(t)); len(p.Changes) != 0 {
		t.Fatalf("a new zone moved %d tenants without a budget", len(p.Changes))
	}
	p := shardCall{prev: stable.Subsets, members: grown, tenants: ts, opts: placement.ShardOptions{MaxRebalanceMoves: 100000}}.run(t)
	zoneSizes, zoneOf := eligibleZones(grown)
	for id, sub := range p.Subsets {
		perZone := map[string]int{}
		for _, m := range sub {
			perZone[zoneOf[m]]++
		}
		for z, n := range perZone {
			if n > zoneCap(zoneSizes, len(sub)) {
				t.Errorf("tenant %s: %d members in zone %s after repair", id, n, z)
			}
		}
	}
	if !slices.ContainsFunc(p.Changes, func(ch placement.ShardChange) bool { return ch.Reason == "zone spread" }) {
		t.Errorf("no zone-spread repair among %d changes", len(p.Changes))
	}
}

func TestShardsEdgeCases(t *testing.T) {
	three := shufflePool(3, 3)
	for _, tc := range []struct {
		name    string
		call    shardCall
		subsets map[string][]string
		changes []placement.ShardChange
	}{
		{
			name:    "nothing",
			subsets: map[string][]string{},
		},
		{
			name:    "no members",
			call:    shardCall{tenants: []placement.Tenant{{ID: "a", Size: 2, Load: 1}}},
			subsets: map[string][]string{"a": {}},
		},
		{
			name:    "size zero",
			call:    shardCall{members: three, tenants: []placement.Tenant{{ID: "a"}}},
			subsets: map[string][]string{"a": {}},
		},
		{
			name:    "clamped",
			call:    shardCall{members: three, tenants: []placement.Tenant{{ID: "a", Size: 5, Load: 1}}},
			subsets: map[string][]string{"a": {"m000", "m001", "m002"}},
			changes: []placement.ShardChange{{Tenant: "a", Added: []string{"m000", "m001", "m002"}, Removed: []string{}, Reason: "new tenant; size 5 clamped to 3 eligible members"}},
		},
		{
			name: "member left and member draining",
			call: shardCall{
				prev:    map[string][]string{"a": {"m000", "gone"}, "b": {"m001", "m002"}},
				members: []placement.Member{{ID: "m000", Weight: 1}, {ID: "m001", Weight: 1}, {ID: "m002", Weight: 0}, {ID: "m003", Weight: 1}},
				tenants: []placement.Tenant{{ID: "a", Size: 2}, {ID: "b", Size: 2}},
			},
			subsets: map[string][]string{"a": {"m000", "m003"}, "b": {"m000", "m001"}},
			changes: []placement.ShardChange{
				{Tenant: "a", Added: []string{"m003"}, Removed: []string{"gone"}, Reason: "member gone left"},
				{Tenant: "b", Added: []string{"m000"}, Removed: []string{"m002"}, Reason: "member m002 draining"},
			},
		},
		{
			name: "resize, duplicates in prev, dropped tenant",
			call: shardCall{
				prev:    map[string][]string{"a": {"m000", "m000", "m001"}, "old": {"m002", "m001"}, "empty": {}},
				members: three,
				tenants: []placement.Tenant{{ID: "a", Size: 1, Load: 1}},
			},
			subsets: map[string][]string{"a": {"m000"}},
			changes: []placement.ShardChange{
				{Tenant: "a", Added: []string{}, Removed: []string{"m001"}, Reason: "size 2->1"},
				{Tenant: "old", Added: []string{}, Removed: []string{"m001", "m002"}, Reason: "tenant removed"},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.call.run(t)
			if diff := cmp.Diff(tc.subsets, p.Subsets); diff != "" {
				t.Errorf("subsets (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.changes, p.Changes); diff != "" {
				t.Errorf("changes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestShardsErrors(t *testing.T) {
	ok := []placement.Member{{ID: "m", Weight: 1}}
	for _, tc := range []struct {
		name string
		call shardCall
		want string // in the error text
	}{
		{"empty tenant ID", shardCall{members: ok, tenants: []placement.Tenant{{ID: "", Size: 1}}}, "empty ID"},
		{"duplicate tenant", shardCall{members: ok, tenants: []placement.Tenant{{ID: "a"}, {ID: "a"}}}, `tenant ID "a" appears twice`},
		{"negative size", shardCall{members: ok, tenants: []placement.Tenant{{ID: "a", Size: -1}}}, `tenant "a" has size -1`},
		{"NaN load", shardCall{members: ok, tenants: []placement.Tenant{{ID: "a", Load: math.NaN()}}}, `tenant "a" has load NaN`},
		{"infinite load", shardCall{members: ok, tenants: []placement.Tenant{{ID: "a", Load: math.Inf(1)}}}, `tenant "a" has load +Inf`},
		{"negative load", shardCall{members: ok, tenants: []placement.Tenant{{ID: "a", Load: -1}}}, `tenant "a" has load -1`},
		{"overflowing total", shardCall{members: ok, tenants: []placement.Tenant{{ID: "a", Load: math.MaxFloat64}, {ID: "b", Load: math.MaxFloat64}}}, "add up to +Inf"},
		{"bad member", shardCall{members: []placement.Member{{ID: "m", Weight: -1}}}, `member "m" has weight -1`},
		{"duplicate member", shardCall{members: []placement.Member{{ID: "m", Weight: 1}, {ID: "m"}}}, `member ID "m" appears twice`},
		{"negative tolerance", shardCall{opts: placement.ShardOptions{Tolerance: -0.1}}, "tolerance -0.1"},
		{"NaN tolerance", shardCall{opts: placement.ShardOptions{Tolerance: math.NaN()}}, "tolerance NaN"},
		{"negative budget", shardCall{opts: placement.ShardOptions{MaxRebalanceMoves: -1}}, "rebalance moves -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := placement.Shards(tc.call.prev, tc.call.members, tc.call.tenants, tc.call.opts)
			if !errors.Is(err, placement.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
}

func FuzzShards(f *testing.F) {
	f.Add(uint64(1), uint8(6), uint8(3), uint8(10), uint8(4), uint8(0), []byte{})
	f.Add(uint64(2), uint8(0), uint8(1), uint8(5), uint8(3), uint8(2), []byte{1, 2, 3})
	f.Add(uint64(3), uint8(40), uint8(5), uint8(60), uint8(12), uint8(50), []byte{9, 9, 9, 9})
	f.Add(uint64(4), uint8(3), uint8(1), uint8(3), uint8(200), uint8(1), []byte{0xff})
	f.Fuzz(func(t *testing.T, seed uint64, nMembers, zones, nTenants, maxSize, budget uint8, bad []byte) {
		rng := rand.New(rand.NewPCG(seed, 2))
		weights := []float64{0, 1, 1, 2, 0.5, 1e-300, 1e300}
		ms := make([]placement.Member, nMembers)
		for i := range ms {
			ms[i] = placement.Member{ID: fmt.Sprintf("m%d", i), Weight: weights[rng.IntN(len(weights))], Zone: fmt.Sprint(rng.IntN(int(zones) + 1))}
		}
		ts := make([]placement.Tenant, nTenants)
		prev := map[string][]string{}
		for i := range ts {
			ts[i] = placement.Tenant{ID: fmt.Sprintf("t%d", i), Size: rng.IntN(int(maxSize) + 1), Load: []float64{0, 1, 1e6, 1e-6, 1e300}[rng.IntN(5)]}
			if rng.IntN(2) == 0 {
				for range rng.IntN(6) {
					prev[ts[i].ID] = append(prev[ts[i].ID], fmt.Sprintf("m%d", rng.IntN(int(nMembers)+3)))
				}
			}
		}
		// The bytes break the input in various ways.
		for _, b := range bad {
			switch i := int(b >> 3); b & 7 {
			case 0:
				if len(ts) > 0 {
					ts[i%len(ts)].ID = ""
				}
			case 1:
				if len(ts) > 1 {
					ts[i%len(ts)].ID = ts[(i+1)%len(ts)].ID
				}
			case 2:
				if len(ts) > 0 {
					ts[i%len(ts)].Size = -i
				}
			case 3:
				if len(ts) > 0 {
					ts[i%len(ts)].Load = math.NaN()
				}
			case 4:
				if len(ms) > 0 {
					ms[i%len(ms)].Weight = math.Inf(1)
				}
			case 5:
				prev[fmt.Sprint("dropped", i)] = []string{"m0", "x"}
			}
		}
		opts := placement.ShardOptions{MaxRebalanceMoves: int(budget), Tolerance: float64(seed%4) / 10}
		c := shardCall{prev: prev, members: ms, tenants: ts, opts: opts}
		p, err := placement.Shards(prev, ms, ts, opts)
		if err != nil {
			if !errors.Is(err, placement.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		checkShardPlan(t, c, p)
		// And once more after a member leaves.
		if len(ms) > 0 {
			c.prev, c.members = p.Subsets, ms[1:]
			q, err := placement.Shards(c.prev, c.members, c.tenants, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			checkShardPlan(t, c, q)
		}
	})
}
