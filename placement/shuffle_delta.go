package placement

import (
	"cmp"
	"math"
	"slices"
)

// ShardsIndexed is [Shards] for a caller that keeps every tenant's subset
// between calls as member indices, such as the leader of a pool of many
// tenants: it spares Shards' reading of prev by ID and its building of a
// subset per tenant, so a call costs a pass over the tenants' indices plus
// the work on the tenants that change.
//
// members must be sorted by ID, and tenants too; prev is parallel to
// tenants. prev[i] is tenant i's previous subset, each element the index
// of a member: below len(members) an index into members, and
// len(members)+k for gone[k], a member of the previous subset that is no
// longer a member. A nil prev[i] is a tenant with no previous subset (use
// a non-nil empty slice for a tenant that had an empty one).
//
// The plan is the one Shards returns for the same previous subsets given
// by ID, except that Subsets holds only the tenants whose subset may have
// changed: every tenant listed in Changes, and possibly others whose
// subset is the same. Every other tenant keeps prev[i]. Since every
// previous tenant is in tenants, no change is "tenant removed".
//
// It returns an error wrapping [ErrInvalid] for what Shards refuses, for
// unsorted members or tenants, for len(prev) != len(tenants), and for an
// index out of range.
func ShardsIndexed(members []Member, gone []string, tenants []Tenant, prev [][]int32, opts ShardOptions) (ShardPlan, error) {
	tol := opts.Tolerance
	if tol == 0 {
		tol = DefaultTolerance
	}
	if math.IsNaN(tol) || math.IsInf(tol, 0) || tol < 0 {
		return ShardPlan{}, invalidf("tolerance %v; want a finite number > 0", opts.Tolerance)
	}
	if opts.MaxRebalanceMoves < 0 {
		return ShardPlan{}, invalidf("max rebalance moves %d is negative", opts.MaxRebalanceMoves)
	}
	if !slices.IsSortedFunc(members, func(a, b Member) int { return cmp.Compare(a.ID, b.ID) }) {
		return ShardPlan{}, invalidf("members are not sorted by ID")
	}
	ms, err := sortedMembers(members)
	if err != nil {
		return ShardPlan{}, err
	}
	if !slices.IsSortedFunc(tenants, func(a, b Tenant) int { return cmp.Compare(a.ID, b.ID) }) {
		return ShardPlan{}, invalidf("tenants are not sorted by ID")
	}
	ts, err := sortedTenants(tenants)
	if err != nil {
		return ShardPlan{}, err
	}
	if len(prev) != len(ts) {
		return ShardPlan{}, invalidf("%d previous subsets for %d tenants", len(prev), len(ts))
	}
	limit := int32(len(ms) + len(gone))
	for i, p := range prev {
		for _, x := range p {
			if x < 0 || x >= limit {
				return ShardPlan{}, invalidf("tenant %q: previous member index %d out of range [0, %d)", ts[i].ID, x, limit)
			}
		}
	}
	st := newShardState(ms, ts, tol)
	for ti := range ts {
		st.readPrevIndexed(ti, prev[ti], gone)
	}
	clear(st.mark)
	st.shrink()
	st.fill()
	if opts.MaxRebalanceMoves > 0 {
		st.rebalance(opts.MaxRebalanceMoves)
	}
	return st.planIndexed(prev, gone), nil
}

// readPrevIndexed is readPrevTenant for a subset given by indices: the
// same steps in the same order, so that the loads are the same to the bit.
func (st *shardState) readPrevIndexed(ti int, p []int32, goneIDs []string) {
	ok := p != nil
	st.inPrev[ti] = ok
	if !ok {
		if st.size[ti] > 0 {
			st.why[ti] |= whyNew
			st.subs[ti] = st.alloc(st.size[ti])
		}
		return
	}
	sub := st.alloc(max(len(p), st.size[ti]))
	stamp := int32(ti + 1)
	var gone []string
	for _, x := range p {
		var id string
		left := int(x) >= len(st.ms)
		if left {
			id = goneIDs[int(x)-len(st.ms)]
		} else if st.zone[x] < 0 {
			id = st.ms[x].ID
		}
		if left || st.zone[x] < 0 {
			if !slices.Contains(gone, id) {
				gone = append(gone, id)
				if left {
					st.why[ti] |= whyLeft
				} else {
					st.why[ti] |= whyDrain
				}
			}
			continue
		}
		if st.mark[x] == stamp {
			continue
		}
		st.mark[x] = stamp
		sub = append(sub, x)
	}
	sortSmall(sub)
	for _, m := range sub {
		st.load[m] += st.piece[ti]
	}
	st.subs[ti] = sub
	if len(gone) > 0 {
		st.gone[ti] = gone
	}
	st.prevLen[ti] = int32(len(sub) + len(gone))
	if int(st.prevLen[ti]) != st.size[ti] {
		st.why[ti] |= whySize
	}
}

// planIndexed is plan for ShardsIndexed: subsets of the tenants that may
// have changed only.
func (st *shardState) planIndexed(prev [][]int32, goneIDs []string) ShardPlan {
	subsets := map[string][]string{}
	clear(st.load)
	var changes []ShardChange
	for ti, t := range st.ts {
		sub := st.subs[ti]
		sortSmall(sub)
		for _, m := range sub {
			st.load[m] += st.piece[ti]
		}
		if st.why[ti] == 0 {
			continue
		}
		out := make([]string, len(sub))
		for i, m := range sub {
			out[i] = st.ms[m].ID
		}
		subsets[t.ID] = out
		p := make([]string, 0, len(prev[ti]))
		for _, x := range prev[ti] {
			if int(x) >= len(st.ms) {
				p = append(p, goneIDs[int(x)-len(st.ms)])
			} else {
				p = append(p, st.ms[x].ID)
			}
		}
		p = sortedSet(p)
		c := ShardChange{Tenant: t.ID, Added: []string{}, Removed: []string{}}
		for _, id := range out {
			if _, ok := slices.BinarySearch(p, id); !ok {
				c.Added = append(c.Added, id)
			}
		}
		for _, id := range p {
			if _, ok := slices.BinarySearch(out, id); !ok {
				c.Removed = append(c.Removed, id)
			}
		}
		if len(c.Added) == 0 && len(c.Removed) == 0 {
			continue
		}
		c.Reason = st.reason(ti)
		changes = append(changes, c)
	}
	pl := ShardPlan{
		Subsets:        subsets,
		Changes:        changes,
		MemberLoad:     make(map[string]float64, len(st.ms)),
		RebalanceMoves: st.moves,
	}
	for m, mem := range st.ms {
		l := st.load[m]
		pl.MemberLoad[mem.ID] = l
		if st.meanNorm > 0 && st.zone[m] >= 0 {
			pl.MaxOverMean = max(pl.MaxOverMean, l/(st.meanNorm*mem.Weight))
		}
	}
	return pl
}
