package tenantpool

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestSnapshotUpdateMembers: a snapshot updated with the changed tenants
// while members join answers as one built from scratch, for every tenant,
// member and the fallback of unknown tenants.
func TestSnapshotUpdateMembers(t *testing.T) {
	p := goodPolicy()
	p.Lookback = time.Minute
	p.WarmUp = 30 * time.Second
	rates := map[string]float64{}
	for i := range 300 {
		rates[fmt.Sprintf("t%03d", i)] = float64(i % 40)
	}
	now := t0
	st, _ := mustPlan(t, State{}, pool(20, 1), rates, p, now)
	snap := NewSnapshot(st)
	for round := range 5 {
		now = now.Add(time.Minute)
		for i := range 30 {
			rates[fmt.Sprintf("t%03d", (round*37+i)%300)] = float64(10 * (round + i%5))
		}
		delete(rates, fmt.Sprintf("t%03d", round))
		rates[fmt.Sprintf("new%d", round)] = 12
		members := pool(20+round, 1)
		next, ch := mustPlan(t, st, members, rates, p, now)
		got, want := snap.Update(next, ch.Tenants), NewSnapshot(next)
		if got.Version() != want.Version() || got.Len() != want.Len() {
			t.Fatalf("round %d: version %d len %d, want %d %d", round, got.Version(), got.Len(), want.Version(), want.Len())
		}
		for id := range next.Tenants {
			if !slices.EqualFunc(got.Spans(id), want.Spans(id), func(a, b Span) bool { return a.From.Equal(b.From) && slices.Equal(a.Members, b.Members) }) {
				t.Fatalf("round %d: spans of %s = %v, want %v", round, id, got.Spans(id), want.Spans(id))
			}
		}
		for _, m := range members {
			if !slices.Equal(got.Tenants(m.ID), want.Tenants(m.ID)) {
				t.Fatalf("round %d: tenants of %s = %v, want %v", round, m.ID, got.Tenants(m.ID), want.Tenants(m.ID))
			}
		}
		if !slices.Equal(got.Targets("unknown", now), want.Targets("unknown", now)) {
			t.Fatalf("round %d: fallback differs", round)
		}
		st, snap = next, got
	}
}

// TestSpans: the first span is since ever, the others start when a
// member warms up, and Targets answers the last span at or before now.
func TestSpans(t *testing.T) {
	p := goodPolicy()
	p.WarmUp = 30 * time.Second
	st, _ := mustPlan(t, State{}, pool(10, 1), map[string]float64{"a": 10}, p, t0)
	st, _ = mustPlan(t, st, pool(10, 1), map[string]float64{"a": 40}, p, t0.Add(time.Second))
	snap := NewSnapshot(st)
	spans := snap.Spans("a")
	if len(spans) < 2 || !spans[0].From.IsZero() {
		t.Fatalf("spans = %v; want the first since ever, then a warm-up", spans)
	}
	for _, sp := range spans[1:] {
		if !slices.Equal(snap.Targets("a", sp.From), sp.Members) {
			t.Fatalf("Targets at %v = %v, want %v", sp.From, snap.Targets("a", sp.From), sp.Members)
		}
	}
	if u := snap.Spans("unknown"); len(u) != 1 || !u[0].From.IsZero() || !slices.Equal(u[0].Members, snap.Targets("unknown", t0)) {
		t.Fatalf("spans of an unknown tenant = %v", u)
	}
}
