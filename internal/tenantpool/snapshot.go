package tenantpool

import (
	"maps"
	"math"
	"slices"
	"time"

	"github.com/keyshard/keyshard/placement"
)

// Snapshot answers clients' and servers' questions from one State. Build
// it once per State version with NewSnapshot; it is immutable and safe for
// concurrent use. Slices it returns are owned by the snapshot: read-only.
type Snapshot struct {
	version uint64
	policy  Policy
	source  []placement.Member // the State's members, as given
	members []placement.Member // as the round placed them (zones blanked unless ZoneAware)
	zones   int
	tenants map[string]*tenantView
	byMem   map[string][]string // member -> tenants it serves, sorted
}

// tenantView is one tenant's answers. Targets change only at known times
// (a member warms up, a removal leaves the lookback), so they are computed
// ahead for each interval between those times.
type tenantView struct {
	views  []targetView // sorted by from; the first from is math.MinInt64
	serves []string     // members and removed members, sorted
	// serveOnly are the ServeOnly removals: served, read by no view, until
	// when clients a version behind may read them.
	serveOnly []servedUntil
}

type servedUntil struct {
	member string
	until  int64 // unix ns
}

type targetView struct {
	from    int64 // unix ns
	targets []string
}

// NewSnapshot returns the snapshot of st. It does not modify st.
func NewSnapshot(st State) *Snapshot {
	src := slices.Clone(st.Members)
	pool := newPoolView(src, st.Policy)
	s := &Snapshot{
		version: st.Version,
		policy:  Clone(State{Policy: st.Policy}).Policy,
		source:  src,
		members: pool.members,
		zones:   pool.zones,
		tenants: make(map[string]*tenantView, len(st.Tenants)),
		byMem:   make(map[string][]string),
	}
	for _, id := range sortedKeys(st.Tenants) {
		ts := st.Tenants[id]
		v := buildView(ts, st.Policy)
		s.tenants[id] = v
		for _, m := range v.serves {
			s.byMem[m] = append(s.byMem[m], id)
		}
	}
	return s
}

// Update returns the snapshot of st, a later State of the same pool in
// which only the tenants listed in changed may differ from the State s
// was built from (added, changed or dropped): Changes.Tenants of the
// rounds since, and the tenants of MarkReady's reports. It rebuilds the
// answers of those tenants and shares the others with s, so its cost is
// proportional to the changed tenants and to the lists of the members
// that serve them, plus one copy of the map of tenants. A change of
// members changes only the answers for unknown tenants (the fallback
// subset) besides the changed tenants; a change of policy changes every
// tenant's answers, and Update then returns NewSnapshot(st). Listing a tenant that did not change costs only its
// rebuild; omitting one that did leaves its old answers.
//
// Update does not modify s or st, and copies what it keeps of st, so s
// stays valid for its readers and st may be modified afterwards (as a
// Planner's next round does).
func (s *Snapshot) Update(st State, changed []string) *Snapshot {
	if !s.policy.equal(st.Policy) {
		return NewSnapshot(st)
	}
	n := &Snapshot{
		version: st.Version,
		policy:  s.policy,
		source:  s.source,
		members: s.members,
		zones:   s.zones,
		tenants: maps.Clone(s.tenants),
		byMem:   maps.Clone(s.byMem),
	}
	if !slices.Equal(s.source, st.Members) {
		n.source = slices.Clone(st.Members)
		pool := newPoolView(n.source, st.Policy)
		n.members, n.zones = pool.members, pool.zones
	}
	if n.tenants == nil {
		n.tenants = make(map[string]*tenantView)
	}
	if n.byMem == nil {
		n.byMem = make(map[string][]string)
	}
	// Per member, the tenants it stops and starts serving.
	type edit struct{ drop, add []string }
	edits := map[string]*edit{}
	at := func(m string) *edit {
		e := edits[m]
		if e == nil {
			e = &edit{}
			edits[m] = e
		}
		return e
	}
	changed = slices.Compact(slices.Sorted(slices.Values(changed)))
	for _, id := range changed {
		var old, cur []string
		if v, ok := s.tenants[id]; ok {
			old = v.serves
		}
		if ts, ok := st.Tenants[id]; ok {
			v := buildView(ts, st.Policy)
			n.tenants[id] = v
			cur = v.serves
		} else {
			delete(n.tenants, id)
		}
		// Both sorted: a merge.
		i, j := 0, 0
		for i < len(old) || j < len(cur) {
			switch {
			case j == len(cur) || i < len(old) && old[i] < cur[j]:
				at(old[i]).drop = append(at(old[i]).drop, id)
				i++
			case i == len(old) || cur[j] < old[i]:
				at(cur[j]).add = append(at(cur[j]).add, id)
				j++
			default:
				i++
				j++
			}
		}
	}
	// Each edited member's list, rebuilt in one merge: changed is sorted,
	// so drop and add are too.
	for m, e := range edits {
		old := s.byMem[m]
		out := make([]string, 0, len(old)-len(e.drop)+len(e.add))
		i, d, a := 0, 0, 0
		for i < len(old) || a < len(e.add) {
			if a == len(e.add) || i < len(old) && old[i] < e.add[a] {
				if d < len(e.drop) && e.drop[d] == old[i] {
					d++
				} else {
					out = append(out, old[i])
				}
				i++
			} else {
				out = append(out, e.add[a])
				a++
			}
		}
		if len(out) == 0 {
			delete(n.byMem, m)
		} else {
			n.byMem[m] = out
		}
	}
	return n
}

func buildView(ts TenantState, p Policy) *tenantView {
	v := &tenantView{}
	v.serves = make([]string, 0, len(ts.Members)+len(ts.Removed))
	times := []int64{math.MinInt64}
	var pending int64 = math.MinInt64
	for _, m := range ts.Members {
		v.serves = append(v.serves, m.ID)
		if at := m.readAt(p.WarmUp); !at.IsZero() {
			times = append(times, at.UnixNano())
			pending = max(pending, at.UnixNano())
		}
	}
	for _, r := range ts.Removed {
		v.serves = append(v.serves, r.ID)
		if r.ServeOnly {
			v.serveOnly = append(v.serveOnly, servedUntil{r.ID, r.At.Add(p.Lookback).UnixNano()})
		} else {
			times = append(times, r.At.Add(p.Lookback).UnixNano())
		}
	}
	slices.Sort(v.serves)
	v.serves = slices.Compact(v.serves)
	slices.Sort(times)
	times = slices.Compact(times)
	for _, t := range times {
		var targets []string
		for _, m := range ts.Members {
			if at := m.readAt(p.WarmUp); at.IsZero() || at.UnixNano() <= t {
				targets = append(targets, m.ID)
			}
		}
		for _, r := range ts.Removed {
			if !r.ServeOnly && (t < r.At.Add(p.Lookback).UnixNano() || t < pending) {
				targets = append(targets, r.ID)
			}
		}
		if len(targets) == 0 {
			// No member is read yet and no member it replaced is left to
			// read: read the subset rather than nothing. While a replaced
			// member is still read, a new one is not, even if no member is
			// ready: a member that has not seen its placement yet does not
			// serve the tenant.
			targets = placementIDs(ts.Members)
		}
		slices.Sort(targets)
		targets = slices.Compact(targets)
		if n := len(v.views); n > 0 && slices.Equal(v.views[n-1].targets, targets) {
			continue
		}
		v.views = append(v.views, targetView{from: t, targets: targets})
	}
	return v
}

// Version returns the version of the State the snapshot was built from.
func (s *Snapshot) Version() uint64 { return s.version }

// Targets returns the members a client reads tenant from at time now,
// sorted: the current subset minus members neither ready nor warmed up
// (while such members exist, the members they replaced stay), plus
// members removed within the lookback. The slice is the snapshot's:
// do not modify it. For a known tenant it does not allocate.
//
// A tenant the snapshot does not know gets placement.Subset at the
// policy's initial size for it (its minimum, or its fixed size): the same
// members every client and server of the same snapshot computes, and the
// members a first round will keep. That path allocates; callers that look
// up many unknown tenants may cache it per snapshot.
func (s *Snapshot) Targets(tenant string, now time.Time) []string {
	v, ok := s.tenants[tenant]
	if !ok {
		return s.fallback(tenant)
	}
	n := now.UnixNano()
	vs := v.views
	i := len(vs) - 1
	for i > 0 && vs[i].from > n {
		i--
	}
	return vs[i].targets
}

func (s *Snapshot) fallback(tenant string) []string {
	if tenant == "" {
		return nil
	}
	sub, _ := placement.Subset(tenant, s.members, s.policy.initialSize(tenant, s.zones))
	return sub
}

// Serves reports whether member serves tenant: it is in the tenant's
// subset (ready or not: it should load the tenant's data), or it left it
// recently and clients may still read from it. Every member Targets
// returns, at any time, serves the tenant.
func (s *Snapshot) Serves(member, tenant string) bool {
	v, ok := s.tenants[tenant]
	if !ok {
		return slices.Contains(s.fallback(tenant), member)
	}
	_, found := slices.BinarySearch(v.serves, member)
	return found
}

// ServedBy returns the members that serve tenant (see Serves), sorted;
// read-only for a known tenant.
func (s *Snapshot) ServedBy(tenant string) []string {
	if v, ok := s.tenants[tenant]; ok {
		return v.serves
	}
	return s.fallback(tenant)
}

// Tenants returns the tenants of the snapshot that member serves, sorted;
// read-only. Tenants unknown to the snapshot are not listed (they cannot
// be enumerated); ask Serves for them.
func (s *Snapshot) Tenants(member string) []string { return s.byMem[member] }

// Known reports whether the snapshot holds tenant.
func (s *Snapshot) Known(tenant string) bool { _, ok := s.tenants[tenant]; return ok }

// ReadUntil returns, for a member that is in no tenant's current subset,
// the time from which no tenant of the snapshot has it among its read
// targets (zero if none has it now; ok true), by the removals' lookback
// and the warm-up of the members that replaced it, or (a ServeOnly
// removal) clients a version behind may still read it. ok is false while a
// tenant still has member in its subset: it is read with no end. A later
// State may move the time (a replacement's readiness, a change of the
// subset). Tenants the snapshot does not know are not looked at: a member
// of weight 0 is in no stateless subset.
func (s *Snapshot) ReadUntil(member string) (until time.Time, ok bool) {
	var end int64 = math.MinInt64
	for _, id := range s.byMem[member] {
		tv := s.tenants[id]
		vs := tv.views
		last := -1
		for i, v := range vs {
			if _, found := slices.BinarySearch(v.targets, member); found {
				last = i
			}
		}
		switch {
		case last < 0:
			for _, so := range tv.serveOnly {
				if so.member == member {
					end = max(end, so.until)
				}
			}
		case last == len(vs)-1:
			return time.Time{}, false
		default:
			end = max(end, vs[last+1].from)
		}
	}
	if end == math.MinInt64 {
		return time.Time{}, true
	}
	return time.Unix(0, end).UTC(), true
}
