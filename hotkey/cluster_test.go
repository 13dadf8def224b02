package hotkey

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestDetectorAppendAbove: AppendAbove lists exactly the tracked keys
// whose upper bound reaches minRate, highest first, with the estimates
// Estimate gives, and flags keys longer than MaxKeyLen.
func TestDetectorAppendAbove(t *testing.T) {
	d, err := NewDetector(DetectorConfig{Threshold: 100, HalfLife: time.Second, Capacity: 16, MaxKeyLen: 8})
	if err != nil {
		t.Fatal(err)
	}
	now := t0
	long := "a-key-longer-than-eight-bytes"
	rates := map[string]int{"k1": 400, "k2": 200, "k3": 50, "k4": 5, long: 100}
	for ms := range 3000 {
		now = t0.Add(time.Duration(ms) * time.Millisecond)
		for k, r := range rates {
			if ms%(1000/r) == 0 {
				d.Observe([]byte(k), now)
			}
		}
	}
	if got := d.AppendAbove(nil, math.NaN(), now); len(got) != 0 {
		t.Errorf("AppendAbove(NaN) = %v, want nothing", got)
	}
	all := d.AppendAbove(nil, 0, now)
	if len(all) != len(rates) {
		t.Fatalf("AppendAbove(0) = %d keys, want every tracked key (%d)", len(all), len(rates))
	}
	for _, minRate := range []float64{0, 10, 60, 150, 300, 1000} {
		prefix := []HotKey{{Key: "kept"}}
		got := d.AppendAbove(prefix, minRate, now)
		if got[0].Key != "kept" {
			t.Fatalf("AppendAbove overwrote dst: %v", got)
		}
		got = got[1:]
		if !slices.IsSortedFunc(got, func(a, b HotKey) int { return -cmpFloat(a.Rate, b.Rate) }) {
			t.Errorf("minRate %v: not sorted by rate: %v", minRate, got)
		}
		var want []string
		for k := range rates {
			if d.Estimate([]byte(k), now).Rate >= minRate {
				want = append(want, k)
			}
		}
		if len(got) != len(want) {
			t.Errorf("minRate %v: %d keys %v, want %v", minRate, len(got), got, want)
		}
		for _, h := range got {
			full := h.Key
			if h.Truncated {
				if !strings.HasPrefix(long, h.Key) || len(h.Key) != 8 {
					t.Errorf("truncated key %q", h.Key)
				}
				full = long
			}
			if est := d.Estimate([]byte(full), now); est != h.Estimate || h.Rate < minRate {
				t.Errorf("minRate %v: %q has %+v, Estimate says %+v", minRate, h.Key, h.Estimate, est)
			}
		}
	}
	// A key at 400 msg/s: its upper bound is at least its true rate.
	if got := d.AppendAbove(nil, 350, now); len(got) != 1 || got[0].Key != "k1" {
		t.Errorf("AppendAbove(350) = %v, want k1", got)
	}
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// TestClusterDetectionSumsUpperBounds: a key spread evenly over 16
// producers, each seeing it at threshold/16 among Zipf noise that fills
// their sketches, is caught when the producers report their keys at or
// above threshold/16 and Aggregate sums them; a key that is hot nowhere,
// reported by none, is not.
func TestClusterDetectionSumsUpperBounds(t *testing.T) {
	const producers = 16
	const threshold = 1600.0 // 100 msg/s per producer
	minRate := threshold / producers
	var reports []Report
	for p := range producers {
		d, err := NewDetector(DetectorConfig{Threshold: 1000, HalfLife: time.Second, Capacity: 64})
		if err != nil {
			t.Fatal(err)
		}
		zs := newZipfStream(uint64(p+1), 1.1, 10_000, 2000)
		now := t0
		// 20 s (20 half-lives): "spread" at 100 msg/s, "cool" at 40,
		// Zipf noise at 2000 msg/s; the reports are made at a message of
		// "spread", when its decayed rate is at its steady value.
		for ms := range 20_001 {
			now = t0.Add(time.Duration(ms) * time.Millisecond)
			if ms%10 == 0 {
				d.Observe([]byte("spread"), now)
			}
			if ms%25 == 0 {
				d.Observe([]byte("cool"), now)
			}
			for range 2 {
				k, _ := zs.next()
				d.Observe(k, now)
			}
		}
		hk := d.AppendAbove(nil, minRate, now)
		r := Report{Producer: fmt.Sprintf("p%02d", p), At: now}
		found := false
		for _, h := range hk {
			if h.Rate < minRate || h.Truncated {
				t.Fatalf("producer %d: reported %+v below minRate %v", p, h, minRate)
			}
			found = found || h.Key == "spread"
			r.Keys = append(r.Keys, KeyRate{Key: h.Key, Rate: h.Rate})
		}
		if !found {
			t.Fatalf("producer %d: the spread key (true rate ≈ %v) is not reported: %v (stats %+v)", p, minRate, hk, d.Stats(now))
		}
		reports = append(reports, r)
	}
	set, err := Aggregate(OverflowSet{}, reports, reports[0].At, AggregateConfig{Threshold: 0.999 * threshold})
	if err != nil {
		t.Fatal(err)
	}
	keys := set.Keys()
	if !slices.Contains(keys, "spread") || slices.Contains(keys, "cool") {
		t.Errorf("cluster set %v: want spread, not cool", keys)
	}
}

// clusterPolicy is testPolicyConfig with the rules of the priority test.
func clusterPolicy(t *testing.T, mod func(*PolicyConfig)) *Policy {
	t.Helper()
	rules := mustRules(t, `
drop          c:drop
dead-letter   c:dead
skip-stateful c:skip
overflow      c:forced
overflow      c:spread spread
junk          c:junk
`)
	cfg := testPolicyConfig()
	cfg.Rules = rules
	if mod != nil {
		mod(&cfg)
	}
	return newTestPolicy(t, cfg)
}

// TestPolicyClusterPriorities: drop > dead-letter > skip-stateful >
// forced overflow > junk > cluster set > detector.
func TestPolicyClusterPriorities(t *testing.T) {
	for _, spread := range []bool{false, true} {
		t.Run(fmt.Sprintf("SpreadDetected=%v", spread), func(t *testing.T) {
			p := clusterPolicy(t, func(c *PolicyConfig) { c.SpreadDetected = spread })
			// "c:hot" and "hot" are hot locally.
			now := t0
			for i := range 1000 {
				now = t0.Add(time.Duration(i) * time.Millisecond)
				p.Decide([]byte("c:hot"), now)
				p.Decide([]byte("hot"), now)
			}
			p.SetClusterKeys([]string{"c:drop", "c:dead", "c:skip", "c:forced", "c:spread", "c:junk", "c:hot", "c:cold", "c:cold", ""})
			tests := []struct {
				key  string
				want Decision
			}{
				{"c:drop", Decision{Drop, DropRule, false}},
				{"c:dead", Decision{DeadLetter, DeadLetterRule, false}},
				{"c:skip", Decision{SkipStateful, SkipStatefulRule, false}},
				{"c:forced", Decision{Overflow, ForcedOverflow, false}},
				{"c:spread", Decision{Overflow, ForcedOverflow, true}},
				{"c:junk", Decision{Overflow, JunkKey, false}},
				{"C:JUNK", Decision{Overflow, JunkKey, false}}, // junk ignores case; the set does not
				{"c:hot", Decision{Overflow, ClusterHot, spread}},
				{"c:cold", Decision{Overflow, ClusterHot, spread}},
				{"C:COLD", Decision{Main, NotHot, false}},
				{"hot", Decision{Overflow, Detected, spread}},
				{"cold", Decision{Main, NotHot, false}},
				{"", Decision{Rejected, MissingKey, false}},
			}
			for _, tt := range tests {
				now = now.Add(time.Millisecond)
				if got := p.Decide([]byte(tt.key), now); got != tt.want {
					t.Errorf("Decide(%q) = %v, want %v", tt.key, got, tt.want)
				}
			}
			c := p.Counters()
			if c.ClusterKeys != 8 || c.Count(Overflow, ClusterHot) != 2 {
				t.Errorf("counters: %d cluster keys (want 8: deduplicated, empty ignored), %d cluster_hot decisions (want 2)",
					c.ClusterKeys, c.Count(Overflow, ClusterHot))
			}
		})
	}
	if ClusterHot.String() != "cluster_hot" || OverflowFull.String() != "overflow_full" || Reason(numReasons).String() != fmt.Sprintf("Reason(%d)", numReasons) {
		t.Errorf("reason names: %v %v", ClusterHot, OverflowFull)
	}
	if ClusterHot != OverflowFull+1 || OverflowFull != 12 {
		t.Errorf("existing reasons renumbered: OverflowFull=%d ClusterHot=%d", OverflowFull, ClusterHot)
	}
}

// TestPolicyClusterStickyExit: a key that leaves the cluster set stays in
// overflow until it has drained, and, if it was locally hot, until its
// local rate has been below LowThreshold for Cooldown; one that never was
// owes no cooldown.
func TestPolicyClusterStickyExit(t *testing.T) {
	t.Run("never locally hot", func(t *testing.T) {
		p := newTestPolicy(t, testPolicyConfig())
		key := []byte("k")
		p.SetClusterKeys([]string{"k"})
		if d := p.Decide(key, t0); d != (Decision{Overflow, ClusterHot, false}) {
			t.Fatalf("in the set: %v", d)
		}
		if d := p.Decide(key, at(time.Second)); d != (Decision{Overflow, ClusterHot, false}) {
			t.Fatalf("in the set: %v", d)
		}
		p.SetClusterKeys(nil)
		if d := p.Decide(key, at(2*time.Second)); d != (Decision{Overflow, Sticky, false}) {
			t.Fatalf("left the set, not drained: %v", d)
		}
		p.MarkDrained(key, at(time.Second)) // not the latest overflow record
		if d := p.Decide(key, at(3*time.Second)); d != (Decision{Overflow, Sticky, false}) {
			t.Fatalf("drained up to an earlier record: %v", d)
		}
		p.MarkDrained(key, at(3*time.Second))
		// Well within Cooldown (5 s) of entering: no second cooldown.
		if d := p.Decide(key, at(3*time.Second+time.Millisecond)); d != (Decision{Main, Released, false}) {
			t.Fatalf("drained: %v", d)
		}
		if d := p.Decide(key, at(4*time.Second)); d != (Decision{Main, NotHot, false}) {
			t.Fatalf("after release: %v", d)
		}
		if c := p.Counters(); c.Entered != 1 || c.Released != 1 || c.OverflowKeys != 0 || c.Count(Overflow, ClusterHot) != 2 {
			t.Errorf("counters %+v", c)
		}
	})
	t.Run("locally hot", func(t *testing.T) {
		p := newTestPolicy(t, testPolicyConfig())
		key := "k"
		p.SetClusterKeys([]string{key})
		ds, now := send(p, key, 1000, t0, time.Millisecond) // 1000 msg/s: hot locally too
		for i, d := range ds {
			if d != (Decision{Overflow, ClusterHot, false}) {
				t.Fatalf("decision %d in the set: %v", i, d)
			}
		}
		p.SetClusterKeys([]string{"other"})
		now = now.Add(time.Millisecond)
		if d := p.Decide([]byte(key), now); d != (Decision{Overflow, Detected, false}) {
			t.Fatalf("left the set while locally hot: %v", d)
		}
		p.MarkDrained([]byte(key), now)
		// Silence: the rate falls below 50 at cross, and the cooldown
		// (5 s) runs from there.
		rate := p.Detector().Estimate([]byte(key), now).Rate
		cross := now.Add(time.Duration(float64(time.Second) / math.Ln2 * math.Log(rate/50)))
		if n := p.Sweep(cross.Add(4900 * time.Millisecond)); n != 0 {
			t.Fatalf("Sweep released the key before its cooldown ended")
		}
		if n := p.Sweep(cross.Add(5100 * time.Millisecond)); n != 1 {
			t.Fatalf("Sweep released %d keys after the cooldown, want 1", n)
		}
	})
}

// TestPolicyClusterSweep: Sweep never releases a key of the set, however
// cold and drained; it does once the key has left.
func TestPolicyClusterSweep(t *testing.T) {
	p := newTestPolicy(t, testPolicyConfig())
	p.SetClusterKeys([]string{"a", "b"})
	p.Decide([]byte("a"), t0)
	p.Decide([]byte("b"), t0)
	p.MarkDrained([]byte("a"), t0)
	p.MarkDrained([]byte("b"), t0)
	if n := p.Sweep(at(time.Hour)); n != 0 || p.Counters().OverflowKeys != 2 {
		t.Fatalf("Sweep released %d keys of the cluster set", n)
	}
	p.SetClusterKeys([]string{"b"})
	if n := p.Sweep(at(time.Hour)); n != 1 {
		t.Fatalf("Sweep released %d keys, want a", n)
	}
	keys := p.AppendOverflowKeys(nil)
	if len(keys) != 1 || keys[0].Key != "b" {
		t.Errorf("overflow keys %+v, want b", keys)
	}
	p.SetClusterKeys(nil)
	if n := p.Sweep(at(time.Hour)); n != 1 || p.Counters().OverflowKeys != 0 {
		t.Errorf("Sweep released %d keys, want b", n)
	}
}

// TestPolicyClusterKillSwitch: with overflow disabled, keys of the set go
// to main (KillSwitch), whether or not they are already in overflow; once
// re-enabled they are back in overflow.
func TestPolicyClusterKillSwitch(t *testing.T) {
	p := clusterPolicy(t, nil)
	p.SetClusterKeys([]string{"in", "c:skip", "new"})
	if d := p.Decide([]byte("in"), t0); d.Outcome != Overflow {
		t.Fatal(d)
	}
	p.SetEnabled(false)
	for key, want := range map[string]Decision{
		"in":     {Main, KillSwitch, false},
		"new":    {Main, KillSwitch, false},
		"c:skip": {SkipStateful, SkipStatefulRule, false},
	} {
		if got := p.Decide([]byte(key), at(time.Second)); got != want {
			t.Errorf("disabled: Decide(%q) = %v, want %v", key, got, want)
		}
	}
	if c := p.Counters(); c.OverflowKeys != 1 {
		t.Errorf("the kill switch must neither add nor drop overflow keys: %d", c.OverflowKeys)
	}
	p.SetEnabled(true)
	for _, key := range []string{"in", "new"} {
		if got := p.Decide([]byte(key), at(2*time.Second)); got != (Decision{Overflow, ClusterHot, false}) {
			t.Errorf("re-enabled: Decide(%q) = %v", key, got)
		}
	}
}

// TestPolicyClusterOverflowFull: beyond MaxOverflowKeys a key of the set
// stays on main, so it never reaches overflow without being tracked.
func TestPolicyClusterOverflowFull(t *testing.T) {
	cfg := testPolicyConfig()
	cfg.MaxOverflowKeys = 1
	p := newTestPolicy(t, cfg)
	p.SetClusterKeys([]string{"a", "b"})
	if d := p.Decide([]byte("a"), t0); d != (Decision{Overflow, ClusterHot, false}) {
		t.Fatal(d)
	}
	if d := p.Decide([]byte("b"), t0); d != (Decision{Main, OverflowFull, false}) {
		t.Fatalf("beyond the cap: %v", d)
	}
	if c := p.Counters(); c.Untracked != 0 || c.OverflowKeys != 1 || c.Count(Main, OverflowFull) != 1 {
		t.Errorf("counters %+v", c)
	}
}

// TestPolicyClusterDecideAllocs: with a cluster set, Decide still does not
// allocate in the steady state.
func TestPolicyClusterDecideAllocs(t *testing.T) {
	p := clusterPolicy(t, nil)
	set := []string{"c:cold", "c:forced"}
	for i := range 1000 {
		set = append(set, fmt.Sprintf("set:%d", i))
	}
	p.SetClusterKeys(set)
	now := t0
	p.Decide([]byte("c:cold"), now)
	for _, key := range []string{"c:cold", "c:forced", "cold", "set:7"} {
		k := []byte(key)
		p.Decide(k, now)
		if a := testing.AllocsPerRun(1000, func() {
			now = now.Add(time.Millisecond)
			p.Decide(k, now)
		}); a != 0 {
			t.Errorf("Decide(%q) allocates %v times", key, a)
		}
	}
}

// BenchmarkDecideClusterSet is BenchmarkDecide with a cluster set of 1024
// keys, a tenth of them among the stream's frequent keys.
func BenchmarkDecideClusterSet(b *testing.B) {
	rules, err := ParseRules("drop token:abc\ndead-letter bad:*\noverflow user:42\njunk anonymous,null,undefined\nskip-stateful k9*")
	if err != nil {
		b.Fatal(err)
	}
	p, err := NewPolicy(PolicyConfig{
		Detector:        DetectorConfig{Threshold: 1000, Capacity: 10_000},
		Rules:           rules,
		MaxOverflowKeys: 2048,
	})
	if err != nil {
		b.Fatal(err)
	}
	var set []string
	for i := range 1024 {
		if i%10 == 0 {
			set = append(set, fmt.Sprintf("k%d", i/10+1))
		} else {
			set = append(set, fmt.Sprintf("elsewhere:%d", i))
		}
	}
	p.SetClusterKeys(set)
	keys := zipfKeys(1 << 16)
	for i := 0; i < 1<<20; i++ {
		p.Decide(keys[i&(1<<16-1)], t0.Add(time.Duration(i)*time.Microsecond))
	}
	start := 1 << 20
	b.ReportAllocs()
	b.ResetTimer()
	for i := start; b.Loop(); i++ {
		p.Decide(keys[i&(1<<16-1)], t0.Add(time.Duration(i)*time.Microsecond))
	}
	b.StopTimer()
	if c := p.Counters(); c.Count(Overflow, ClusterHot) == 0 {
		b.Fatalf("no cluster decisions: %+v", c)
	}
}

// BenchmarkAppendAbove: a producer's report from a full 10,000-key
// detector on a Zipf(1.1) stream, with minRate 0 (every tracked key: the
// first report, before the pool's threshold is known) and 10 msg/s (a
// typical report threshold). The router holds its lock for this long.
func BenchmarkAppendAbove(b *testing.B) {
	d, err := NewDetector(DetectorConfig{Threshold: 1000, Capacity: 10_000})
	if err != nil {
		b.Fatal(err)
	}
	keys := zipfKeys(1 << 16)
	now := t0
	for i := range 1 << 20 {
		now = t0.Add(time.Duration(i) * time.Microsecond)
		d.Observe(keys[i&(1<<16-1)], now)
	}
	for _, minRate := range []float64{0, 10} {
		b.Run(fmt.Sprintf("minRate=%v", minRate), func(b *testing.B) {
			var buf []HotKey
			b.ReportAllocs()
			for b.Loop() {
				buf = d.AppendAbove(buf[:0], minRate, now)
			}
			b.ReportMetric(float64(len(buf)), "keys")
		})
	}
}
