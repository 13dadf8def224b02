package tenantpool

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keyshard/keyshard/placement"
)

// State is a pool's published state: what clients and servers read, and
// what the leader needs to continue after a failover (sizes with their
// cooldowns, subsets, when members joined and left). It is a plain value
// of exported fields that the store can encode as it is. Plan and
// MarkReady never modify the State they are given; the maps and slices of
// a State they return may share storage with it, so treat a State as
// read-only.
type State struct {
	// Version increases with every change a client or server can read:
	// a size, a subset, a join or leave time, a readiness, the members or
	// the policy. A change of cooldown bookkeeping only (SizeState's
	// Wanted and BelowSince, IdleSince) keeps the version; Changes.Tenants
	// still lists it, so the store persists it.
	Version uint64
	// Members are the pool's members as of the last round, sorted by ID.
	Members []placement.Member
	// Policy is the policy of the last round.
	Policy Policy
	// Tenants holds every tenant that was sized.
	Tenants map[string]TenantState
}

// TenantState is one tenant's size and subset.
type TenantState struct {
	Size placement.SizeState
	// Members is the current subset, sorted by ID.
	Members []Placement
	// Removed are members that left the subset while they were read
	// targets and are still alive, kept for the lookback (and while a
	// member that replaced them is not read yet), sorted by ID.
	Removed []Removal
	// Why explains the last size change, with When its time.
	Why  string
	When time.Time
	// IdleSince is when the tenant's rate stopped being reported; zero
	// while it is.
	IdleSince time.Time
}

// Placement is one member of a tenant's subset.
type Placement struct {
	ID string
	// Added is when the member joined the subset; zero for a member that
	// served the tenant from the start (the stateless subset every client
	// and server used before the tenant was first sized).
	Added time.Time
	// Ready is set once the member reported ready for the tenant.
	Ready bool
}

// Removal is a member that left a tenant's subset.
type Removal struct {
	ID string
	At time.Time
	// ServeOnly marks a member that is no read target of this State but
	// that clients still holding the previous State read within the
	// lookback: one removed before its warm-up ended (they start reading
	// it when the warm-up ends), or one read only while a member that
	// replaced it warmed up and that has left the subset too. It keeps
	// serving the tenant until At + Lookback.
	ServeOnly bool
	// ReadUntil is set while a read removal stays a read target past its
	// lookback because a member that replaced it warms up: the latest end
	// of that warm-up a round saw. A later MarkReady ends the reading
	// earlier in the State it makes, but clients still holding an earlier
	// State read the member until then, so it keeps serving until then.
	ReadUntil time.Time
}

// SizeChange is one tenant's size change in a round.
type SizeChange struct {
	Tenant   string
	From, To int
	Why      string
}

// Changes says what a round changed.
type Changes struct {
	// Visible reports whether the version increased.
	Visible bool
	// Tenants lists, sorted, the tenants whose TenantState changed in any
	// way, including tenants added and dropped: what the store rewrites.
	Tenants []string
	// Bookkeeping lists, sorted, the tenants of Tenants whose change is
	// cooldown bookkeeping only (SizeState's Wanted and BelowSince,
	// IdleSince): nothing a client or server reads. A store may write
	// them later, at the price of a new leader continuing from an older
	// cooldown.
	Bookkeeping []string
	// Dropped lists the tenants forgotten (see Policy.ForgetAfter).
	Dropped []string
	// Sizes lists the size changes, by tenant.
	Sizes []SizeChange
	// Subsets lists the subset changes as placement.Shards explains them.
	Subsets []placement.ShardChange
}

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
//
// Plan does not modify prev: it copies prev's map of tenants and indexes
// every subset, a cost proportional to the number of tenants. A leader
// that runs a round every second uses a Planner, which keeps both between
// rounds and gives the same results.
func Plan(prev State, members []placement.Member, rates map[string]float64, p Policy, now time.Time) (State, Changes, error) {
	return NewPlanner(Clone(prev)).Plan(members, rates, p, now)
}

// Planner runs the rounds of one pool, with the results of Plan, at a
// cost proportional to what changed. It owns its State: each round
// updates the previous State's map of tenants in place, rewriting only
// the tenants listed in Changes.Tenants, and keeps every tenant's subset
// as member indices so that the rounds need not read them by ID.
//
// The State a round returns is therefore valid until the next call of
// Plan or MarkReady on the same Planner: persist and publish what the
// round changed before the next round (Snapshot.Update copies what it
// keeps), or copy the State with Clone. A round still visits every tenant
// (to size it from its rate and to sum the members' loads, which balance
// the subsets of the tenants that change), but without allocating for
// those that keep their TenantState.
//
// A Planner is not safe for concurrent use; the leader's loop owns one per
// pool, for one term. A new term starts one with NewPlanner from the
// persisted State.
type Planner struct {
	st    State
	names []string      // the tenants of st, sorted
	cur   []TenantState // per name, its state (as in st.Tenants)
	subs  [][]int32     // per name, its subset as indices into basis
	basis []string      // member IDs: st's members in order, then departed ones

	// Scratch, kept between rounds.
	tenants []placement.Tenant
	next    []TenantState
	known   []bool
	rates   []float64
	olds    []TenantState
}

// NewPlanner returns a Planner that continues from st and takes
// ownership of it: st's map of tenants is modified in place by the
// rounds, so the caller must not use st afterwards (pass Clone(st) to
// keep it). It costs one pass over st's subsets.
func NewPlanner(st State) *Planner {
	pl := &Planner{st: st}
	if pl.st.Tenants == nil {
		pl.st.Tenants = map[string]TenantState{}
	}
	pl.names = sortedKeys(pl.st.Tenants)
	pl.basis = make([]string, 0, len(st.Members))
	byID := make(map[string]int32, len(st.Members))
	for i, m := range st.Members {
		pl.basis = append(pl.basis, m.ID)
		byID[m.ID] = int32(i)
	}
	pl.subs = make([][]int32, len(pl.names))
	pl.cur = make([]TenantState, len(pl.names))
	n := len(pl.names)
	pl.tenants, pl.next, pl.olds = make([]placement.Tenant, 0, n), make([]TenantState, 0, n), make([]TenantState, 0, n)
	pl.known, pl.rates = make([]bool, 0, n), make([]float64, 0, n)
	for i, id := range pl.names {
		pl.cur[i] = pl.st.Tenants[id]
		ms := pl.cur[i].Members
		sub := make([]int32, len(ms))
		for j, m := range ms {
			x, ok := byID[m.ID]
			if !ok { // a member unknown to st: departed
				x = int32(len(pl.basis))
				pl.basis = append(pl.basis, m.ID)
				byID[m.ID] = x
			}
			sub[j] = x
		}
		pl.subs[i] = sub
	}
	return pl
}

// Clone returns a copy of st that shares no map with it (the TenantStates'
// slices are shared: they are never modified in place).
func Clone(st State) State {
	st.Members = slices.Clone(st.Members)
	st.Policy.Overrides = maps.Clone(st.Policy.Overrides)
	st.Tenants = maps.Clone(st.Tenants)
	return st
}

// State returns the Planner's current State (see Planner on how long it
// stays valid).
func (pl *Planner) State() State { return pl.st }

// Plan runs one round, like the function Plan from the Planner's State.
// On error nothing changes.
func (pl *Planner) Plan(members []placement.Member, rates map[string]float64, p Policy, now time.Time) (State, Changes, error) {
	return pl.plan(members, rates, p, now, false)
}

// Hold runs a round that sizes nobody: every tenant keeps its size and
// its cooldown bookkeeping (clamped to the members available, and growing
// back to what it wanted when they return, as NextSize does), a fixed
// override still applies, no tenant is added, none goes idle or is
// forgotten. Members' joins and leaves are placed as by Plan, readiness
// and lookback included.
//
// The leader holds while its measurement is younger than one window (a
// new leader after a failover, or a new pool): a rate measured over part
// of a window is noisy, and read as a rate it could grow a tenant that
// did not grow, or start a shrink's cooldown for one that did not shrink.
func (pl *Planner) Hold(members []placement.Member, p Policy, now time.Time) (State, Changes, error) {
	return pl.plan(members, nil, p, now, true)
}

func (pl *Planner) plan(members []placement.Member, rates map[string]float64, p Policy, now time.Time, hold bool) (State, Changes, error) {
	prev := pl.st
	if err := p.Validate(); err != nil {
		return prev, Changes{}, err
	}
	bad := ""
	found := false
	for id, r := range rates {
		if id == "" || !finite(r) || r < 0 {
			if !found || id < bad {
				bad, found = id, true
			}
		}
	}
	if found {
		return prev, Changes{}, invalidf(fmt.Sprintf("rates[%q]", bad), "is %v; want a finite number >= 0 for a non-empty tenant", rates[bad])
	}
	ms := slices.Clone(members)
	slices.SortFunc(ms, func(a, b placement.Member) int { return strings.Compare(a.ID, b.ID) })
	for i, m := range ms {
		if m.ID == "" || !finite(m.Weight) || m.Weight < 0 || i > 0 && ms[i-1].ID == m.ID {
			return prev, Changes{}, invalidf("members["+strconv.Itoa(i)+"]", "%+v is invalid: want a unique non-empty ID and a finite weight >= 0", m)
		}
	}
	pool := newPoolView(ms, p)

	// The index: remap the subsets if the members changed.
	names, subs := pl.names, pl.subs
	var gone []string
	if !slices.EqualFunc(pl.basis, ms, func(id string, m placement.Member) bool { return id == m.ID }) {
		byID := make(map[string]int32, len(ms))
		for i, m := range ms {
			byID[m.ID] = int32(i)
		}
		remap := make([]int32, len(pl.basis))
		for i, id := range pl.basis {
			x, ok := byID[id]
			if !ok {
				x = int32(len(ms) + len(gone))
				gone = append(gone, id)
			}
			remap[i] = x
		}
		subs = make([][]int32, len(pl.subs))
		for i, s := range pl.subs {
			out := make([]int32, len(s))
			for j, x := range s {
				out[j] = remap[x]
			}
			subs[i] = out
		}
	}

	// Each known tenant's rate (NaN: not reported), and the new tenants,
	// merged into the sorted names.
	cur := pl.cur
	rs := pl.rates[:0]
	reported := 0
	for _, id := range names {
		r, ok := rates[id]
		if !ok {
			r = math.NaN()
		} else {
			reported++
		}
		rs = append(rs, r)
	}
	pl.rates = rs
	var fresh []string
	if reported < len(rates) {
		for id := range rates {
			if _, ok := prev.Tenants[id]; !ok {
				fresh = append(fresh, id)
			}
		}
	}
	if len(fresh) > 0 {
		slices.Sort(fresh)
		n := len(names) + len(fresh)
		mn, ms2 := make([]string, 0, n), make([][]int32, 0, n)
		mc, mr := make([]TenantState, 0, n), make([]float64, 0, n)
		i, j := 0, 0
		for i < len(names) || j < len(fresh) {
			if j == len(fresh) || i < len(names) && names[i] < fresh[j] {
				mn, ms2, mc, mr = append(mn, names[i]), append(ms2, subs[i]), append(mc, cur[i]), append(mr, rs[i])
				i++
			} else {
				mn, ms2, mc, mr = append(mn, fresh[j]), append(ms2, nil), append(mc, TenantState{}), append(mr, rates[fresh[j]])
				j++
			}
		}
		names, subs, cur, rs = mn, ms2, mc, mr
	}

	// Sizes.
	var ch Changes
	tenants := pl.tenants[:0]
	next := pl.next[:0]
	known := pl.known[:0]
	var keptNames []string // nil unless a tenant is dropped
	var keptSubs [][]int32
	olds := pl.olds[:0]
	var byPos map[string]int32
	for i, id := range names {
		old, isKnown := cur[i], subs[i] != nil
		rate, reported := rs[i], !math.IsNaN(rs[i])
		if !reported {
			rate = 0
		}
		ts := old
		switch {
		case hold:
		case reported:
			ts.IdleSince = time.Time{}
		case ts.IdleSince.IsZero():
			ts.IdleSince = now
		}
		if !hold && !reported && p.ForgetAfter > 0 && now.Sub(ts.IdleSince) >= p.ForgetAfter {
			ch.Dropped = append(ch.Dropped, id)
			ch.Tenants = append(ch.Tenants, id)
			if keptNames == nil {
				keptNames = append(make([]string, 0, len(names)), names[:i]...)
				keptSubs = append(make([][]int32, 0, len(names)), subs[:i]...)
			}
			continue
		}
		sub := subs[i]
		if !isKnown {
			seed, _ := placement.Subset(id, pool.members, p.initialSize(id, pool.zones))
			ts.Members = make([]Placement, len(seed))
			sub = make([]int32, len(seed))
			if byPos == nil {
				byPos = make(map[string]int32, len(ms))
				for k, m := range ms {
					byPos[m.ID] = int32(k)
				}
			}
			for k, m := range seed {
				ts.Members[k] = Placement{ID: m}
				sub[k] = byPos[m]
			}
		}
		if keptNames != nil {
			keptNames, keptSubs = append(keptNames, id), append(keptSubs, sub)
		} else {
			subs[i] = sub // a fresh slice of subs, or a new tenant's nil
		}
		var err error
		if n := p.fixed(id); n > 0 {
			ts.Size = placement.SizeState{Size: n, Wanted: n}
			if pool.eligible < n {
				ts.Size.Size = pool.eligible
			}
		} else if hold {
			// As NextSize's clamp to the pool: Wanted is kept, so the size
			// grows back to it when members return.
			if pool.eligible > 0 {
				ts.Size.Size = min(max(ts.Size.Size, ts.Size.Wanted), pool.eligible)
			}
		} else if ts.Size, err = placement.NextSize(ts.Size, rate, pool.eligible, now, p.SizePolicy(id, pool.zones)); err != nil {
			return prev, Changes{}, err
		}
		if hold && ts.Size.Size != old.Size.Size {
			ts.Why = fmt.Sprintf("%d members available (load not measured for a window yet) → %d", pool.eligible, ts.Size.Size)
			ts.When = now
			ch.Sizes = append(ch.Sizes, SizeChange{Tenant: id, From: old.Size.Size, To: ts.Size.Size, Why: ts.Why})
		} else if ts.Size.Size != old.Size.Size || !isKnown {
			ts.Why = explain(p, id, rate, isKnown, old.Size.Size, ts.Size, pool)
			ts.When = now
			ch.Sizes = append(ch.Sizes, SizeChange{Tenant: id, From: old.Size.Size, To: ts.Size.Size, Why: ts.Why})
		}
		next = append(next, ts)
		olds = append(olds, old)
		known = append(known, isKnown)
		tenants = append(tenants, placement.Tenant{ID: id, Size: ts.Size.Size, Load: rate})
	}
	if keptNames != nil {
		names, subs = keptNames, keptSubs
	}
	pl.tenants, pl.next, pl.known, pl.olds = tenants, next, known, olds

	// Subsets.
	plan, err := placement.ShardsIndexed(pool.members, gone, tenants, subs, placement.ShardOptions{Tolerance: p.Tolerance, MaxRebalanceMoves: p.RebalanceMoves})
	if err != nil {
		return prev, Changes{}, err
	}
	// Nothing is modified above this line but scratch and new slices.
	ch.Subsets = plan.Changes
	visible := !slices.Equal(prev.Members, ms) || !prev.Policy.equal(p) || len(ch.Dropped) > 0
	tm := prev.Tenants
	for _, id := range ch.Dropped {
		delete(tm, id)
	}
	var pos map[string]int32
	for i, id := range names {
		ts := next[i]
		newSub, moved := plan.Subsets[id]
		if moved || len(ts.Removed) > 0 || !known[i] {
			if !moved {
				newSub = placementIDs(ts.Members)
			}
			ts.Members, ts.Removed = nextPlacements(ts, newSub, pool, p, now)
			if moved {
				if pos == nil {
					pos = make(map[string]int32, len(ms))
					for k, m := range ms {
						pos[m.ID] = int32(k)
					}
				}
				sub := make([]int32, len(newSub))
				for k, m := range newSub {
					sub[k] = pos[m]
				}
				subs[i] = sub
			}
		}
		old := olds[i]
		next[i] = ts
		switch {
		case !known[i] || !ts.visiblyEqual(old):
			visible = true
			ch.Tenants = append(ch.Tenants, id)
		case ts.Size != old.Size || !ts.IdleSince.Equal(old.IdleSince):
			ch.Tenants = append(ch.Tenants, id)
			ch.Bookkeeping = append(ch.Bookkeeping, id)
		default:
			continue
		}
		tm[id] = ts
	}
	slices.Sort(ch.Tenants)
	slices.Sort(ch.Bookkeeping)
	version := prev.Version
	if visible {
		version++
	}
	ch.Visible = visible
	pl.st = State{Version: version, Members: ms, Policy: p, Tenants: tm}
	pl.names, pl.subs = names, subs
	pl.cur, pl.next = next, pl.cur[:0]
	pl.basis = pl.basis[:0]
	for _, m := range ms {
		pl.basis = append(pl.basis, m.ID)
	}
	clear(pl.next[:cap(pl.next)]) // do not pin old slices
	clear(pl.olds[:cap(pl.olds)])
	return pl.st, ch, nil
}

// MarkReady is the function MarkReady on the Planner's State, in place.
func (pl *Planner) MarkReady(marks []Ready) (State, int, error) {
	for i, r := range marks {
		if r.Member == "" {
			return pl.st, 0, invalidf("marks["+strconv.Itoa(i)+"].Member", "is empty")
		}
		if r.Tenant == "" {
			return pl.st, 0, invalidf("marks["+strconv.Itoa(i)+"].Tenant", "is empty")
		}
	}
	n := 0
	for _, r := range marks {
		ts, ok := pl.st.Tenants[r.Tenant]
		if !ok {
			continue
		}
		j := slices.IndexFunc(ts.Members, func(m Placement) bool { return m.ID == r.Member })
		if j < 0 || ts.Members[j].Ready {
			continue
		}
		ts.Members = slices.Clone(ts.Members)
		ts.Members[j].Ready = true
		pl.st.Tenants[r.Tenant] = ts
		if i, ok := slices.BinarySearch(pl.names, r.Tenant); ok {
			pl.cur[i] = ts
		}
		n++
	}
	if n > 0 {
		pl.st.Version++
	}
	return pl.st, n, nil
}

// poolView is what a round derives from the members.
type poolView struct {
	members  []placement.Member // sorted; zones blanked unless ZoneAware
	alive    map[string]bool    // by ID, draining included
	eligible int                // members with weight > 0
	zones    int                // distinct zones among them (1 unless ZoneAware)
}

func newPoolView(sorted []placement.Member, p Policy) poolView {
	v := poolView{members: sorted, alive: make(map[string]bool, len(sorted)), zones: 1}
	if !p.ZoneAware {
		v.members = slices.Clone(sorted)
		for i := range v.members {
			v.members[i].Zone = ""
		}
	}
	zones := map[string]bool{}
	for _, m := range v.members {
		v.alive[m.ID] = true
		if m.Weight > 0 {
			v.eligible++
			zones[m.Zone] = true
		}
	}
	if p.ZoneAware {
		v.zones = max(len(zones), 1)
	}
	return v
}

func placementIDs(ps []Placement) []string {
	out := make([]string, len(ps))
	for i, m := range ps {
		out[i] = m.ID
	}
	return out
}

// readAt returns when a member becomes a read target: its Added time if it
// is ready or served from the start, else Added + WarmUp.
func (m Placement) readAt(warmUp time.Duration) time.Time {
	if m.Ready || m.Added.IsZero() {
		return m.Added
	}
	return m.Added.Add(warmUp)
}

// nextPlacements carries join times and readiness over to the new subset
// and records the members that left it.
func nextPlacements(ts TenantState, subset []string, pool poolView, p Policy, now time.Time) ([]Placement, []Removal) {
	old := ts.Members
	members := make([]Placement, len(subset))
	for i, id := range subset {
		j, ok := slices.BinarySearchFunc(old, id, func(m Placement, id string) int { return strings.Compare(m.ID, id) })
		if ok {
			members[i] = old[j]
		} else {
			members[i] = Placement{ID: id, Added: now}
		}
	}
	var removed []Removal
	for _, r := range ts.Removed {
		if !slices.Contains(subset, r.ID) && pool.alive[r.ID] {
			removed = append(removed, r)
		}
	}
	for _, m := range old {
		if !slices.Contains(subset, m.ID) && pool.alive[m.ID] && !now.Before(m.readAt(p.WarmUp)) {
			removed = append(removed, Removal{ID: m.ID, At: now})
		}
	}
	// A removed member stays while within the lookback, or (if this State
	// reads it) while a member of the subset is not read yet.
	var pending time.Time
	for _, m := range members {
		if at := m.readAt(p.WarmUp); at.After(pending) {
			pending = at
		}
	}
	for i, r := range removed {
		if !r.ServeOnly && pending.After(r.At.Add(p.Lookback)) && pending.After(r.ReadUntil) {
			removed[i].ReadUntil = pending
		}
	}
	removed = slices.DeleteFunc(removed, func(r Removal) bool {
		return !now.Before(r.At.Add(p.Lookback)) && (r.ServeOnly || !now.Before(pending) && !now.Before(r.ReadUntil))
	})
	removed = keepStaleTargets(ts, subset, removed, pool, p, now)
	// One removal per member; of two (a State stored with both), the one
	// read keeps it a target.
	slices.SortFunc(removed, func(a, b Removal) int {
		if c := strings.Compare(a.ID, b.ID); c != 0 {
			return c
		}
		switch {
		case a.ServeOnly == b.ServeOnly:
			return 0
		case b.ServeOnly:
			return -1
		}
		return 1
	})
	removed = slices.CompactFunc(removed, func(a, b Removal) bool { return a.ID == b.ID })
	if len(removed) == 0 {
		removed = nil
	}
	return members, removed
}

// keepStaleTargets adds to removed the members that the previous State
// ts reads at some time within the lookback from now but that the new
// State would neither place nor keep: a member removed before its
// warm-up ended (clients a version behind start reading it then), or a
// removed member kept only while a member it was replaced by warmed up,
// which the new subset no longer has. Each keeps serving the tenant
// until now + Lookback, as a ServeOnly removal: no read target of the
// new State.
func keepStaleTargets(ts TenantState, subset []string, removed []Removal, pool poolView, p Policy, now time.Time) []Removal {
	kept := func(id string) bool {
		return slices.Contains(subset, id) || slices.ContainsFunc(removed, func(r Removal) bool { return r.ID == id })
	}
	dropped := false
	for _, m := range ts.Members {
		dropped = dropped || (pool.alive[m.ID] && !kept(m.ID))
	}
	for _, r := range ts.Removed {
		dropped = dropped || (pool.alive[r.ID] && !kept(r.ID))
	}
	if !dropped || p.Lookback <= 0 {
		return removed // the common case: the previous State's view is not needed
	}
	from, to := now.UnixNano(), now.Add(p.Lookback).UnixNano()
	vs := buildView(ts, p).views
	for i, v := range vs {
		if v.from >= to || (i+1 < len(vs) && vs[i+1].from <= from) {
			continue // the span ends before now or begins after the lookback
		}
		for _, id := range v.targets {
			if pool.alive[id] && !kept(id) {
				removed = append(removed, Removal{ID: id, At: now, ServeOnly: true})
			}
		}
	}
	return removed
}

// visiblyEqual reports whether a client or server reads the same from
// ts and o.
func (ts TenantState) visiblyEqual(o TenantState) bool {
	if ts.Size.Size != o.Size.Size || ts.Why != o.Why {
		return false
	}
	if same(ts.Members, o.Members) && same(ts.Removed, o.Removed) {
		return true // a round that did not touch the tenant keeps its slices
	}
	return slices.EqualFunc(ts.Members, o.Members, func(a, b Placement) bool { return a.ID == b.ID && a.Added.Equal(b.Added) && a.Ready == b.Ready }) &&
		slices.EqualFunc(ts.Removed, o.Removed, func(a, b Removal) bool {
			return a.ID == b.ID && a.At.Equal(b.At) && a.ServeOnly == b.ServeOnly && a.ReadUntil.Equal(b.ReadUntil)
		})
}

// same reports whether a and b are the same slice: same length, same
// first element. Such slices are equal.
func same[E any](a, b []E) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// Ready is a member's report that it is ready to serve a tenant (it has
// loaded the tenant's data).
type Ready struct {
	Member, Tenant string
}

// MarkReady records readiness reports: each member of a tenant's current
// subset that is not ready yet becomes ready, a read target. Reports for
// unknown tenants or for members not in the subset are ignored (the count
// of applied ones is returned). The version increases if any was applied.
// It returns a *FieldError for an empty Member or Tenant, and then applies
// nothing.
func MarkReady(prev State, marks []Ready) (State, int, error) {
	for i, r := range marks {
		if r.Member == "" {
			return prev, 0, invalidf("marks["+strconv.Itoa(i)+"].Member", "is empty")
		}
		if r.Tenant == "" {
			return prev, 0, invalidf("marks["+strconv.Itoa(i)+"].Tenant", "is empty")
		}
	}
	next := prev
	n := 0
	for _, r := range marks {
		ts, ok := next.Tenants[r.Tenant]
		if !ok {
			continue
		}
		j := slices.IndexFunc(ts.Members, func(m Placement) bool { return m.ID == r.Member })
		if j < 0 || ts.Members[j].Ready {
			continue
		}
		if n == 0 {
			next.Tenants = make(map[string]TenantState, len(prev.Tenants))
			for id, t := range prev.Tenants {
				next.Tenants[id] = t
			}
		}
		ts.Members = slices.Clone(ts.Members)
		ts.Members[j].Ready = true
		next.Tenants[r.Tenant] = ts
		n++
	}
	if n > 0 {
		next.Version++
	}
	return next, n, nil
}

// explain says why a tenant has its size, in the style of
// "rate 52/s × headroom 1.2 / capacity 10 → 7, rounded up to 9 for 3 zones".
func explain(p Policy, tenant string, rate float64, known bool, from int, st placement.SizeState, pool poolView) string {
	var b strings.Builder
	if !known {
		b.WriteString("new tenant: ")
	}
	if n := p.fixed(tenant); n > 0 {
		fmt.Fprintf(&b, "fixed size %d by override", n)
		if st.Size < n {
			fmt.Fprintf(&b, ", clamped to %d members in the pool", st.Size)
		}
		return b.String()
	}
	sp := p.SizePolicy(tenant, pool.zones)
	h := sp.Headroom
	if h == 0 {
		h = 1
	}
	need := int(math.Min(math.Ceil(rate*h/sp.CapacityPerMember), math.MaxInt32))
	fmt.Fprintf(&b, "rate %s/s × headroom %s / capacity %s → %d", num(rate), num(h), num(sp.CapacityPerMember), need)
	v := need
	if lo := max(sp.Min, 1); v < lo {
		v = lo
		fmt.Fprintf(&b, ", raised to minimum %d", lo)
	}
	z := max(sp.Zones, 1)
	if r := (v + z - 1) / z * z; r != v {
		v = r
		fmt.Fprintf(&b, ", rounded up to %d for %d zones", v, z)
	}
	if st.Wanted < v {
		fmt.Fprintf(&b, ", capped at maximum %d", st.Wanted)
	}
	switch {
	case st.Size < st.Wanted:
		fmt.Fprintf(&b, "; clamped to %d members in the pool", st.Size)
	case st.Size > st.Wanted && from > st.Size:
		fmt.Fprintf(&b, "; shrinking %d → %d by at most %d per cooldown of %v", from, st.Size, from-st.Size, sp.ShrinkCooldown)
	case st.Size < from && st.Size == st.Wanted:
		fmt.Fprintf(&b, "; shrunk from %d after cooldown of %v", from, sp.ShrinkCooldown)
	}
	return b.String()
}

// num formats a number with at most two decimals, trimmed.
func num(f float64) string {
	s := strconv.FormatFloat(f, 'f', 2, 64)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}
