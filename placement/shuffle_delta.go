package placement

import (
	"cmp"
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
	tol, err := opts.tolerance()
	if err != nil {
		return ShardPlan{}, err
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
	st.place(opts)
	return st.planIndexed(prev, gone), nil
}

// readPrevIndexed is readPrevTenant for a subset given by indices: the
// same steps in the same order, so that the loads are the same to the bit.
func (st *shardState) readPrevIndexed(ti int, p []int32, goneIDs []string) {
	if !st.beginPrev(ti, p != nil) {
		return
	}
	sub := st.alloc(max(len(p), st.size[ti]))
	stamp := int32(ti + 1)
	var gone []string
	for _, x := range p {
		if left := int(x) >= len(st.ms); left || st.zone[x] < 0 {
			if left {
				gone = st.addGone(ti, gone, goneIDs[int(x)-len(st.ms)], true)
			} else {
				gone = st.addGone(ti, gone, st.ms[x].ID, false)
			}
			continue
		}
		if st.mark[x] == stamp {
			continue
		}
		st.mark[x] = stamp
		sub = append(sub, x)
	}
	st.endPrev(ti, sub, gone)
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
		if c, ok := st.change(ti, out, p); ok {
			changes = append(changes, c)
		}
	}
	return st.result(subsets, changes)
}
