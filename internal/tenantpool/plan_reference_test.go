package tenantpool

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keyshard/keyshard/placement"
)

// planReference is Plan as it was before the Planner: every round from
// scratch through placement.Shards. Tests compare the two.
//
// Plan runs one round at time now: it sizes every tenant of prev and of
// rates with placement.NextSize (a tenant of prev absent from rates has
// rate 0) and places them with placement.Shards, sticky from prev's
// subsets. A tenant new to the state starts from the stateless subset
// that clients and servers used for it until now (placement.Subset at its
// initial size), so its first placement moves nothing it need not.
//
// members are the live members (weight 0: draining). Plan is pure and
// deterministic: the same arguments give the same State. It returns an
// error wrapping ErrInvalid for an invalid policy, members or rate; prev
// is then unchanged.
func planReference(prev State, members []placement.Member, rates map[string]float64, p Policy, now time.Time) (State, Changes, error) {
	if err := p.Validate(); err != nil {
		return prev, Changes{}, err
	}
	for _, id := range sortedKeys(rates) {
		if r := rates[id]; id == "" || !finite(r) || r < 0 {
			return prev, Changes{}, invalidf(fmt.Sprintf("rates[%q]", id), "is %v; want a finite number >= 0 for a non-empty tenant", r)
		}
	}
	ms := slices.Clone(members)
	slices.SortFunc(ms, func(a, b placement.Member) int { return strings.Compare(a.ID, b.ID) })
	for i, m := range ms {
		if m.ID == "" || !finite(m.Weight) || m.Weight < 0 || i > 0 && ms[i-1].ID == m.ID {
			return prev, Changes{}, invalidf("members["+strconv.Itoa(i)+"]", "%+v is invalid: want a unique non-empty ID and a finite weight >= 0", m)
		}
	}
	pool := newPoolView(ms, p)

	// Sizes.
	names := make([]string, 0, len(prev.Tenants)+len(rates))
	for id := range prev.Tenants {
		names = append(names, id)
	}
	for id := range rates {
		if _, ok := prev.Tenants[id]; !ok {
			names = append(names, id)
		}
	}
	slices.Sort(names)
	next := State{Version: prev.Version, Members: ms, Policy: p, Tenants: make(map[string]TenantState, len(names))}
	var ch Changes
	tenants := make([]placement.Tenant, 0, len(names))
	prevSubsets := make(map[string][]string, len(names))
	for _, id := range names {
		old, known := prev.Tenants[id]
		rate, reported := rates[id]
		ts := old
		switch {
		case reported:
			ts.IdleSince = time.Time{}
		case ts.IdleSince.IsZero():
			ts.IdleSince = now
		}
		if !reported && p.ForgetAfter > 0 && now.Sub(ts.IdleSince) >= p.ForgetAfter {
			ch.Dropped = append(ch.Dropped, id)
			ch.Tenants = append(ch.Tenants, id)
			continue
		}
		if known {
			prevSubsets[id] = placementIDs(old.Members)
		} else {
			seed, _ := placement.Subset(id, pool.members, p.initialSize(id, pool.zones))
			prevSubsets[id] = seed
			ts.Members = make([]Placement, len(seed))
			for i, m := range seed {
				ts.Members[i] = Placement{ID: m}
			}
		}
		var err error
		if n := p.fixed(id); n > 0 {
			ts.Size = placement.SizeState{Size: n, Wanted: n}
			if pool.eligible < n {
				ts.Size.Size = pool.eligible
			}
		} else if ts.Size, err = placement.NextSize(ts.Size, rate, pool.eligible, now, p.SizePolicy(id, pool.zones)); err != nil {
			return prev, Changes{}, err
		}
		if ts.Size.Size != old.Size.Size || !known {
			ts.Why = explain(p, id, rate, known, old.Size.Size, ts.Size, pool)
			ts.When = now
			ch.Sizes = append(ch.Sizes, SizeChange{Tenant: id, From: old.Size.Size, To: ts.Size.Size, Why: ts.Why})
		}
		next.Tenants[id] = ts
		tenants = append(tenants, placement.Tenant{ID: id, Size: ts.Size.Size, Load: rate})
	}

	// Subsets.
	plan, err := placement.Shards(prevSubsets, pool.members, tenants, placement.ShardOptions{Tolerance: p.Tolerance, MaxRebalanceMoves: p.RebalanceMoves})
	if err != nil {
		return prev, Changes{}, err
	}
	ch.Subsets = plan.Changes
	visible := !slices.Equal(prev.Members, ms) || !prev.Policy.equal(p) || len(ch.Dropped) > 0
	for _, id := range names {
		ts, ok := next.Tenants[id]
		if !ok {
			continue
		}
		ts.Members, ts.Removed = nextPlacements(ts, plan.Subsets[id], pool, p, now)
		next.Tenants[id] = ts
		old, known := prev.Tenants[id]
		switch {
		case !known || !ts.visiblyEqual(old):
			visible = true
			ch.Tenants = append(ch.Tenants, id)
		case ts.Size != old.Size || !ts.IdleSince.Equal(old.IdleSince):
			ch.Tenants = append(ch.Tenants, id)
			ch.Bookkeeping = append(ch.Bookkeeping, id)
		}
	}
	slices.Sort(ch.Tenants)
	slices.Sort(ch.Bookkeeping)
	if visible {
		next.Version++
	}
	ch.Visible = visible
	return next, ch, nil
}
