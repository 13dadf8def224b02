package tenantpool

import (
	"math"
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
