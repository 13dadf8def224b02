package tenantpool

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newAgg(t *testing.T) *Aggregator {
	t.Helper()
	a, err := NewAggregator(AggregatorConfig{Window: 10 * time.Second, Buckets: 10, MaxCounts: 4, MaxTenants: 5, MaxReporters: 3})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func mustAdd(t *testing.T, a *Aggregator, r Report, now time.Time, want Outcome) {
	t.Helper()
	got, err := a.Add(r, now)
	if err != nil || got != want {
		t.Fatalf("Add(%+v) = %v, %v; want %v", r, got, err, want)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9*math.Max(1, math.Abs(b)) }

func TestAggregatorSteadyRate(t *testing.T) {
	a := newAgg(t)
	// Two reporters, 25 requests/s each for tenant t, every second.
	for s := 1; s <= 30; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		for _, rep := range []string{"c1", "c2"} {
			mustAdd(t, a, Report{Reporter: rep, Seq: uint64(s), Time: now, Counts: []Count{{"t", 25}}}, now, Counted)
		}
		if s >= 2 {
			if r, _ := a.Rate("t", now); !near(r, 50) {
				t.Fatalf("second %d: rate %v, want 50", s, r)
			}
		}
	}
}

// TestAggregatorReplay: a retried report (same Seq) and an old one are
// not counted again.
func TestAggregatorReplay(t *testing.T) {
	a := newAgg(t)
	now := t0.Add(time.Second)
	r := Report{Reporter: "c1", Seq: 7, Time: now, Counts: []Count{{"t", 100}}}
	mustAdd(t, a, r, now, Counted)
	mustAdd(t, a, r, now, Replayed)
	r.Seq = 6
	mustAdd(t, a, r, now.Add(time.Second), Replayed)
	got, _ := a.Rate("t", now.Add(time.Second))
	want, _ := newAggWith(t, r, now).Rate("t", now.Add(time.Second))
	if !near(got, want) {
		t.Fatalf("rate after replays %v, want %v (one report)", got, want)
	}
	// A replay arriving after the reporter was forgotten is stale.
	late := now.Add(time.Minute)
	r.Seq = 7
	mustAdd(t, a, r, late, Stale)
	if _, ok := a.Rate("t", late); ok {
		t.Fatalf("tenant still counted after the window")
	}
}

func newAggWith(t *testing.T, r Report, now time.Time) *Aggregator {
	a := newAgg(t)
	mustAdd(t, a, r, now, Counted)
	return a
}

// TestAggregatorCrashedReporter: a reporter that stops reporting stops
// counting once the window has passed.
func TestAggregatorCrashedReporter(t *testing.T) {
	a := newAgg(t)
	for s := 1; s <= 45; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		mustAdd(t, a, Report{Reporter: "alive", Seq: uint64(s), Time: now, Counts: []Count{{"t", 10}}}, now, Counted)
		if s <= 20 {
			mustAdd(t, a, Report{Reporter: "crashes", Seq: uint64(s), Time: now, Counts: []Count{{"t", 30}}}, now, Counted)
		}
		r, _ := a.Rate("t", now)
		switch {
		case s >= 2 && s <= 20 && !near(r, 40):
			t.Fatalf("second %d: rate %v, want 40", s, r)
		case s > 30 && !near(r, 10):
			t.Fatalf("second %d: rate %v, want 10 once the crashed reporter left the window", s, r)
		}
	}
	if _, reps := a.Len(); reps != 1 {
		t.Fatalf("%d reporters tracked, want the crashed one forgotten", reps)
	}
}

// TestAggregatorLoadStep: doubling the load reaches the doubled rate
// within one window.
func TestAggregatorLoadStep(t *testing.T) {
	a := newAgg(t)
	var at time.Time
	for s := 1; s <= 40; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		n := int64(50)
		if s > 20 {
			n = 100
		}
		mustAdd(t, a, Report{Reporter: "c", Seq: uint64(s), Time: now, Counts: []Count{{"t", n}}}, now, Counted)
		if r, _ := a.Rate("t", now); at.IsZero() && near(r, 100) {
			at = now
		}
	}
	if at.IsZero() || at.Sub(t0.Add(20*time.Second)) > 11*time.Second { // a window and a bucket
		t.Fatalf("doubled rate reached at %v, want within one window of the step", at.Sub(t0))
	}
}

func TestAggregatorRefuses(t *testing.T) {
	now := t0.Add(time.Second)
	ok := []Count{{"a", 1}, {"b", 2}}
	tests := []struct {
		r     Report
		field string
		err   error
	}{
		{Report{Seq: 1, Time: now, Counts: ok}, "Reporter", nil},
		{Report{Reporter: "r", Time: now, Counts: ok}, "Seq", nil},
		{Report{Reporter: "r", Seq: 1, Counts: ok}, "Time", nil},
		{Report{Reporter: "r", Seq: 1, Time: now, Counts: []Count{{"a", 1}, {"b", 1}, {"c", 1}, {"d", 1}, {"e", 1}}}, "Counts", nil},
		{Report{Reporter: "r", Seq: 1, Time: now, Counts: []Count{{"a", 1}, {"", 1}}}, "Counts[1].Tenant", nil},
		{Report{Reporter: "r", Seq: 1, Time: now, Counts: []Count{{"a", 1}, {"b", -1}}}, "Counts[1].N", nil},
		{Report{Reporter: "r", Seq: 1, Time: now, Counts: []Count{{"x1", 1}, {"x2", 1}, {"x3", 1}, {"x4", 1}}}, "", ErrFull},
	}
	for _, tt := range tests {
		a := newAgg(t)
		mustAdd(t, a, Report{Reporter: "r0", Seq: 1, Time: now, Counts: []Count{{"a", 5}, {"b", 5}}}, now, Counted)
		_, err := a.Add(tt.r, now)
		if tt.err != nil {
			if !errors.Is(err, tt.err) {
				t.Errorf("%+v: got %v, want %v", tt.r, err, tt.err)
			}
		} else {
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tt.field || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.field) {
				t.Errorf("%+v: got %v, want a field error naming %s", tt.r, err, tt.field)
			}
		}
		// Refused whole: nothing of it counted, and its Seq not taken.
		rates := a.Rates(now)
		if len(rates) != 2 || !near(rates["a"], rates["b"]) {
			t.Errorf("%+v: rates after a refused report %v", tt.r, rates)
		}
		if tt.r.Reporter == "r" && tt.err == nil {
			fixed := tt.r
			fixed.Counts, fixed.Time, fixed.Seq = ok, now, 1
			mustAdd(t, a, fixed, now, Counted)
		}
	}
	// Too many reporters.
	a := newAgg(t)
	for i, rep := range []string{"r1", "r2", "r3"} {
		mustAdd(t, a, Report{Reporter: rep, Seq: uint64(i + 1), Time: now, Counts: ok}, now, Counted)
	}
	if _, err := a.Add(Report{Reporter: "r4", Seq: 1, Time: now, Counts: ok}, now); !errors.Is(err, ErrFull) {
		t.Fatalf("fourth reporter: %v, want ErrFull", err)
	}
	for _, cfg := range []AggregatorConfig{{Window: -1}, {Buckets: -1}, {MaxCounts: -1}, {MaxTenants: -1}, {MaxReporters: -1}, {Window: time.Millisecond, Buckets: 10}} {
		if _, err := NewAggregator(cfg); !errors.Is(err, ErrInvalid) {
			t.Errorf("NewAggregator(%+v) = %v, want ErrInvalid", cfg, err)
		}
	}
}

// TestAggregatorBounded: tenants are forgotten after the window and their
// slots reused.
func TestAggregatorBounded(t *testing.T) {
	a, err := NewAggregator(AggregatorConfig{Window: 10 * time.Second, Buckets: 10, MaxTenants: 20})
	if err != nil {
		t.Fatal(err)
	}
	for s := 1; s <= 100; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		ids := []Count{{"t" + string(rune('a'+s%26)), 1}}
		mustAdd(t, a, Report{Reporter: "c", Seq: uint64(s), Time: now, Counts: ids}, now, Counted)
	}
	if n, _ := a.Len(); n > 11 || len(a.names) > 11 {
		t.Fatalf("%d tenants, %d slots; want at most the 11 reported within the window and the current bucket", n, len(a.names))
	}
}

// A window that Buckets does not divide into whole nanoseconds still reads
// a steady rate exactly, so ceil(rate/capacity) does not round up a hair.
func TestAggregatorOddWindowExact(t *testing.T) {
	a, err := NewAggregator(AggregatorConfig{Window: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	for i := range 40 {
		now = now.Add(time.Second)
		if _, err := a.Add(Report{Reporter: "r", Seq: uint64(i + 1), Time: now, Counts: []Count{{Tenant: "t", N: 50}}}, now); err != nil {
			t.Fatal(err)
		}
	}
	if r, _ := a.Rate("t", now); r != 50 {
		t.Fatalf("rate %v; want exactly 50", r)
	}
}
