package streamcheck

import (
	"fmt"
	"sort"
	"strings"
)

// Report is what Check found. The counts are the figures `keyshard demo
// --mode stream --json` prints; Violations describe the first breaches
// found, at most maxViolations.
type Report struct {
	// Events is the number of events below the end position.
	Events int `json:"events"`
	// Handled counts every handling recorded, duplicates included.
	Handled int `json:"handled"`
	// Missed: events below the end handled by no holder of their bucket.
	Missed int `json:"missed"`
	// OrderViolations: handlings of a key at or below a position the same
	// tenure had already handled for that key, or below the tenure's from.
	OrderViolations int `json:"order_violations"`
	// Strays: handlings that match no event of the stream (wrong key or
	// bucket at that position), or were made without a grant.
	Strays int `json:"strays"`
	// DuplicatesGraceful: events handled again after a graceful release
	// of their bucket. Must be 0.
	DuplicatesGraceful int `json:"duplicates_graceful"`
	// DuplicatesCrash: events handled again after their holder crashed.
	DuplicatesCrash int `json:"duplicates_crash"`
	// DuplicatesCrashBound: how many events crashed holders handled at or
	// after their last acknowledged commit — the most a crash may cause to
	// be handled again.
	DuplicatesCrashBound int `json:"duplicates_crash_bound"`
	// DuplicatesOverBound: events handled again after a crash that lay
	// before the crashed holder's last acknowledged commit. Must be 0.
	DuplicatesOverBound int `json:"duplicates_over_bound"`
	// PositionRegressions: grants whose from is below the previous
	// holder's last acknowledged commit, or differs from the final
	// position a graceful release handed over. Must be 0.
	PositionRegressions int `json:"position_regressions"`
	// Tenures, Releases and Crashes count grants and how they ended.
	Tenures  int `json:"tenures"`
	Releases int `json:"releases"`
	Crashes  int `json:"crashes"`

	Violations []string `json:"violations,omitempty"`

	perKind map[string]int
}

// OK reports whether the record kept every guarantee.
func (r Report) OK() bool {
	return r.Missed == 0 && r.OrderViolations == 0 && r.Strays == 0 && r.DuplicatesGraceful == 0 &&
		r.DuplicatesOverBound == 0 && r.PositionRegressions == 0 && r.DuplicatesCrash <= r.DuplicatesCrashBound
}

// maxViolations bounds the violations described per kind (missed,
// order, duplicate, position, stray), so one kind's flood does not hide
// another's first breach.
const maxViolations = 8

func (r *Report) violate(kind, format string, args ...any) {
	if r.perKind == nil {
		r.perKind = map[string]int{}
	}
	if r.perKind[kind] < maxViolations {
		r.perKind[kind]++
		r.Violations = append(r.Violations, kind+": "+fmt.Sprintf(format, args...))
	}
}

// Check compares rec with the stream's events (in any order, positions
// unique) and returns what it found. end is the position every bucket was
// waited for: events at or above it may be unhandled.
func Check(events []Event, rec *Recorder, end uint64) Report {
	var rep Report
	rec.mu.Lock()
	for _, e := range rec.errs {
		rep.Strays++
		rep.violate("stray", "%s", e)
	}
	rec.mu.Unlock()
	byPos := make(map[uint64]Event, len(events))
	for _, e := range events {
		byPos[e.Pos] = e
		if e.Pos < end {
			rep.Events++
		}
	}
	tenures := rec.Tenures()
	rep.Tenures = len(tenures)

	// handledBy[pos] lists the tenures (indexes, in token order) that
	// handled the event at pos.
	handledBy := map[uint64][]int{}
	for i, t := range tenures {
		switch t.End {
		case Released:
			rep.Releases++
		case Crashed:
			rep.Crashes++
		}
		if t.unacquired {
			rep.Strays++
			rep.violate("stray", "%s handled records of bucket %d at token %d and never acquired it", t.Worker, t.Bucket, t.Token)
		}
		last := map[string]uint64{}
		seen := map[uint64]bool{}
		for _, h := range t.handled {
			rep.Handled++
			e, ok := byPos[h.pos]
			if !ok || e.Key != h.key || e.Bucket != t.Bucket {
				rep.Strays++
				rep.violate("stray", "%s handled position %d key %q as bucket %d's, which the stream does not have there", t.Worker, h.pos, h.key, t.Bucket)
				continue
			}
			if p, ok := last[h.key]; (ok && h.pos <= p) || h.pos < t.From {
				rep.OrderViolations++
				rep.violate("order", "%s (bucket %d, token %d, from %d) handled key %q at %d after %d", t.Worker, t.Bucket, t.Token, t.From, h.key, h.pos, p)
			}
			last[h.key] = max(last[h.key], h.pos)
			if !seen[h.pos] {
				seen[h.pos] = true
				handledBy[h.pos] = append(handledBy[h.pos], i)
			}
			if t.End == Crashed && h.pos >= t.Committed {
				rep.DuplicatesCrashBound++
			}
		}
	}

	for _, e := range events {
		if e.Pos >= end {
			continue
		}
		if len(handledBy[e.Pos]) == 0 {
			rep.Missed++
			rep.violate("missed", "event at %d (key %q, bucket %d) was never handled; the bucket's grants: %s", e.Pos, e.Key, e.Bucket, grantsOf(tenures, e.Bucket))
		}
	}
	for pos, ts := range handledBy {
		for j := 1; j < len(ts); j++ { // tenures are in token order
			prev := tenures[ts[j-1]]
			switch prev.End {
			case Crashed:
				rep.DuplicatesCrash++
				if pos < prev.Committed {
					rep.DuplicatesOverBound++
					rep.violate("duplicate", "event at %d of bucket %d handled again by %s (token %d) though crashed %s had committed %d", pos, prev.Bucket, tenures[ts[j]].Worker, tenures[ts[j]].Token, prev.Worker, prev.Committed)
				}
			default:
				rep.DuplicatesGraceful++
				rep.violate("duplicate", "event at %d of bucket %d handled again by %s (token %d) after %s's graceful release (final %d)", pos, prev.Bucket, tenures[ts[j]].Worker, tenures[ts[j]].Token, prev.Worker, prev.Final)
			}
		}
	}

	// Consecutive tenures of a bucket: positions move with the bucket.
	for i := 1; i < len(tenures); i++ {
		prev, next := tenures[i-1], tenures[i]
		if prev.Bucket != next.Bucket {
			continue
		}
		if next.From < prev.Committed {
			rep.PositionRegressions++
			rep.violate("position", "bucket %d: %s's grant (token %d) starts at %d, below %s's acknowledged commit %d", next.Bucket, next.Worker, next.Token, next.From, prev.Worker, prev.Committed)
		} else if prev.End == Released && next.From != max(prev.Final, prev.Committed) {
			rep.PositionRegressions++
			rep.violate("position", "bucket %d: %s's grant (token %d) starts at %d, not at the final position %d %s released it with", next.Bucket, next.Worker, next.Token, next.From, prev.Final, prev.Worker)
		}
	}
	sort.Strings(rep.Violations)
	return rep
}

// grantsOf describes bucket b's tenures, for a violation's message.
func grantsOf(tenures []Tenure, b int) string {
	var out []string
	for _, t := range tenures {
		if t.Bucket == b {
			out = append(out, fmt.Sprintf("%s token %d from %d committed %d %s (final %d, %d handled)", t.Worker, t.Token, t.From, t.Committed, t.End, t.Final, len(t.handled)))
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, "; ")
}
