package tenantpool

import (
	"maps"
	"math"
	"slices"
	"time"
)

// Span is one interval of a tenant's read targets: from From on (until
// the next span's From) the targets are Members, sorted. The first span's
// From is zero: since ever.
type Span struct {
	From    time.Time
	Members []string
}

// Spans returns a known tenant's read targets over time, sorted by From:
// what Targets answers at each time. A tenant the snapshot does not know
// gets one span, since ever, of its stateless subset. The Members slices
// are the snapshot's: read-only.
func (s *Snapshot) Spans(tenant string) []Span {
	v, ok := s.tenants[tenant]
	if !ok {
		return []Span{{Members: s.fallback(tenant)}}
	}
	out := make([]Span, len(v.views))
	for i, tv := range v.views {
		if tv.from != math.MinInt64 {
			out[i].From = time.Unix(0, tv.from).UTC()
		}
		out[i].Members = tv.targets
	}
	return out
}

// Policy returns the policy of the snapshot's State.
func (s *Snapshot) Policy() Policy { return s.policy }

// Len returns the number of tenants the snapshot holds.
func (s *Snapshot) Len() int { return len(s.tenants) }

// Update returns the snapshot of st, which differs from the State s was
// built from only in the tenants listed in changed (added, changed or
// removed), its version and its members. Only those tenants are rebuilt;
// a change of policy rebuilds every tenant (NewSnapshot). s is not
// modified.
func (s *Snapshot) Update(st State, changed []string) *Snapshot {
	if !st.Policy.equal(s.policy) {
		return NewSnapshot(st)
	}
	pool := newPoolView(st.Members, st.Policy)
	n := &Snapshot{
		version: st.Version,
		policy:  st.Policy,
		members: pool.members,
		zones:   pool.zones,
		tenants: maps.Clone(s.tenants),
		byMem:   maps.Clone(s.byMem),
	}
	type edit struct{ add, del []string }
	edits := map[string]*edit{}
	at := func(m string) *edit {
		e := edits[m]
		if e == nil {
			e = &edit{}
			edits[m] = e
		}
		return e
	}
	for _, id := range changed {
		if old, ok := n.tenants[id]; ok {
			for _, m := range old.serves {
				at(m).del = append(at(m).del, id)
			}
			delete(n.tenants, id)
		}
		ts, ok := st.Tenants[id]
		if !ok {
			continue
		}
		v := buildView(ts, st.Policy)
		n.tenants[id] = v
		for _, m := range v.serves {
			at(m).add = append(at(m).add, id)
		}
	}
	for m, e := range edits {
		gone := make(map[string]bool, len(e.del))
		for _, id := range e.del {
			gone[id] = true
		}
		list := make([]string, 0, len(n.byMem[m])+len(e.add))
		for _, id := range n.byMem[m] {
			if !gone[id] {
				list = append(list, id)
			}
		}
		list = append(list, e.add...)
		slices.Sort(list)
		list = slices.Compact(list)
		if len(list) == 0 {
			delete(n.byMem, m)
			continue
		}
		n.byMem[m] = list
	}
	return n
}
