package hotkey

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

// testPolicyConfig: hot at 100 msg/s (reported from 90), half-life 1 s,
// leave below 50 msg/s after 5 s.
func testPolicyConfig() PolicyConfig {
	return PolicyConfig{
		Detector:     DetectorConfig{Threshold: 100, HalfLife: time.Second, MaxTotalRate: 100_000},
		LowThreshold: 50,
		Cooldown:     5 * time.Second,
	}
}

func newTestPolicy(t fataler, cfg PolicyConfig) *Policy {
	t.Helper()
	p, err := NewPolicy(cfg)
	if err != nil {
		t.Fatalf("NewPolicy: %v", err)
	}
	return p
}

// send decides n messages of key, evenly spaced by every from start, and
// returns the decisions and the time of the last one.
func send(p *Policy, key string, n int, start time.Time, every time.Duration) ([]Decision, time.Time) {
	out := make([]Decision, n)
	now := start
	for i := range out {
		now = start.Add(time.Duration(i) * every)
		out[i] = p.Decide([]byte(key), now)
	}
	return out, now
}

func TestNewPolicyConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*PolicyConfig)
		want string
	}{
		{"bad detector", func(c *PolicyConfig) { c.Detector.Threshold = -1 }, "Threshold"},
		{"low above high", func(c *PolicyConfig) { c.LowThreshold = 100 }, "LowThreshold must be in (0, Threshold=100)"},
		{"negative low", func(c *PolicyConfig) { c.LowThreshold = -1 }, "LowThreshold"},
		{"negative cooldown", func(c *PolicyConfig) { c.Cooldown = -time.Second }, "Cooldown"},
		{"negative cap", func(c *PolicyConfig) { c.MaxOverflowKeys = -1 }, "MaxOverflowKeys"},
		{"huge cap", func(c *PolicyConfig) { c.MaxOverflowKeys = MaxOverflowKeysLimit + 1 }, "MaxOverflowKeys"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testPolicyConfig()
			tt.mod(&cfg)
			_, err := NewPolicy(cfg)
			if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NewPolicy error = %v, want ErrBadConfig mentioning %q", err, tt.want)
			}
		})
	}
	p := newTestPolicy(t, PolicyConfig{Detector: DetectorConfig{Threshold: 10, Capacity: 10}})
	if p.low != 5 || p.cooldown != int64(DefaultCooldown) || p.maxKeys != DefaultMaxOverflowKeys || !p.Enabled() {
		t.Errorf("defaults: low %v cooldown %v maxKeys %d enabled %v", p.low, p.cooldown, p.maxKeys, p.Enabled())
	}
}

func TestPolicyPriorities(t *testing.T) {
	rules, err := ParseRules(`
drop          token:abc,both:*
dead-letter   token:*,both:x
skip-stateful team:*,token:skip
overflow      user:42,team:7
overflow      batch:* spread
junk          anonymous,null,undefined,user:42
junk          guest:* spread
`)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testPolicyConfig()
	cfg.Rules = rules
	p := newTestPolicy(t, cfg)
	tests := []struct {
		key  string
		want Decision
	}{
		{"token:abc", Decision{Drop, DropRule, false}},
		{"both:x", Decision{Drop, DropRule, false}}, // drop beats dead-letter
		{"token:x", Decision{DeadLetter, DeadLetterRule, false}},
		{"token:skip", Decision{DeadLetter, DeadLetterRule, false}}, // dead-letter beats skip
		{"team:7", Decision{SkipStateful, SkipStatefulRule, false}}, // skip beats overflow
		{"user:42", Decision{Overflow, ForcedOverflow, false}},      // overflow beats junk
		{"batch:1", Decision{Overflow, ForcedOverflow, true}},
		{"anonymous", Decision{Overflow, JunkKey, false}},
		{"Undefined", Decision{Overflow, JunkKey, false}},
		{"guest:9", Decision{Overflow, JunkKey, true}},
		{"user:7", Decision{Main, NotHot, false}},
		{"", Decision{Rejected, MissingKey, false}},
	}
	for i, tt := range tests {
		got := p.Decide([]byte(tt.key), at(time.Duration(i)*time.Millisecond))
		if got != tt.want {
			t.Errorf("Decide(%q) = %v, want %v", tt.key, got, tt.want)
		}
	}
	c := p.Counters()
	if c.Total() != uint64(len(tests)) || c.Count(Drop, DropRule) != 2 || c.Outcome(Overflow) != 5 || c.Reason(JunkKey) != 3 {
		t.Errorf("counters %+v", c)
	}
}

func TestPolicyMissingKey(t *testing.T) {
	p := newTestPolicy(t, testPolicyConfig())
	for _, key := range [][]byte{nil, {}} {
		d := p.Decide(key, t0)
		if d.Outcome == Main || d != (Decision{Rejected, MissingKey, false}) || !errors.Is(d.Err(), ErrMissingKey) {
			t.Errorf("Decide(%q) = %v (err %v)", key, d, d.Err())
		}
	}
	if (Decision{}).Outcome != Rejected || (Decision{Outcome: Main}).Err() != nil {
		t.Error("the zero Decision must be Rejected")
	}
	if c := p.Counters(); c.Count(Rejected, MissingKey) != 2 || p.Detector().Stats(t0).Observations != 0 {
		t.Errorf("counters %+v", c)
	}
}

// TestPolicyHysteresis walks one key through enter, sticky, cooldown,
// drain and release.
func TestPolicyHysteresis(t *testing.T) {
	p := newTestPolicy(t, testPolicyConfig())
	key := "user:1"

	// 1000 msg/s for 1 s: the key becomes hot and goes to overflow for good.
	ds, now := send(p, key, 1000, t0, time.Millisecond)
	first := -1
	for i, d := range ds {
		if first < 0 && d.Outcome == Overflow {
			first = i
			if d.Reason != Detected || d.Spread {
				t.Fatalf("first overflow decision %v", d)
			}
		}
		if first >= 0 && d.Outcome != Overflow {
			t.Fatalf("decision %d after entering overflow: %v", i, d)
		}
		if first < 0 && d != (Decision{Main, NotHot, false}) {
			t.Fatalf("decision %d before hot: %v", i, d)
		}
	}
	if first < 0 || first > 200 {
		t.Fatalf("key entered overflow at message %d", first)
	}

	// 70 msg/s (between low and high) for 10 s: stays in overflow; Sticky
	// once the detector no longer reports it hot.
	ds, now = send(p, key, 700, now.Add(time.Second/70), time.Second/70)
	for i, d := range ds {
		if d.Outcome != Overflow || (i > 600 && d.Reason != Sticky) {
			t.Fatalf("decision %d at 70/s: %v", i, d)
		}
	}
	// Drained, but still above the low threshold: stays.
	p.MarkDrained([]byte(key), now)
	ds, now = send(p, key, 70, now.Add(time.Second/70), time.Second/70)
	for _, d := range ds {
		if d != (Decision{Overflow, Sticky, false}) {
			t.Fatalf("at 70/s after drain: %v", d)
		}
	}

	// Silence. The rate was ~70 and crosses 50 after τ·ln(70/50) ≈ 0.49 s;
	// the cooldown ends 5 s later.
	rate := p.Detector().Estimate([]byte(key), now).Rate
	cross := now.Add(time.Duration(float64(time.Second) / 0.6931471805599453 * math.Log(rate/50)))
	if d := p.Decide([]byte(key), cross.Add(4900*time.Millisecond)); d != (Decision{Overflow, Sticky, false}) {
		t.Fatalf("before the cooldown ends: %v", d)
	}
	last := cross.Add(4900 * time.Millisecond)
	// The cooldown is over but the last message is not drained.
	if d := p.Decide([]byte(key), cross.Add(5100*time.Millisecond)); d != (Decision{Overflow, Sticky, false}) {
		t.Fatalf("cooled down, not drained: %v", d)
	}
	last = cross.Add(5100 * time.Millisecond)
	if !p.MarkDrained([]byte(key), last.Add(-time.Nanosecond)) { // not quite the last one
		t.Fatal("MarkDrained: key not in overflow")
	}
	if d := p.Decide([]byte(key), last.Add(time.Millisecond)); d != (Decision{Overflow, Sticky, false}) {
		t.Fatalf("drained up to before the last overflow message: %v", d)
	}
	last = last.Add(time.Millisecond)
	p.MarkDrained([]byte(key), last)
	if d := p.Decide([]byte(key), last.Add(time.Millisecond)); d != (Decision{Main, Released, false}) {
		t.Fatalf("cooled down and drained: %v", d)
	}
	if d := p.Decide([]byte(key), last.Add(2*time.Millisecond)); d != (Decision{Main, NotHot, false}) {
		t.Fatalf("after release: %v", d)
	}
	if p.MarkDrained([]byte(key), last) {
		t.Error("MarkDrained reports a released key in overflow")
	}
	c := p.Counters()
	if c.Entered != 1 || c.Released != 1 || c.OverflowKeys != 0 || c.Count(Main, Released) != 1 {
		t.Errorf("counters %+v", c)
	}
}

func TestPolicyKillSwitch(t *testing.T) {
	rules, err := ParseRules("drop d\ndead-letter dl\nskip-stateful s\noverflow o\njunk null")
	if err != nil {
		t.Fatal(err)
	}
	cfg := testPolicyConfig()
	cfg.Rules = rules
	p := newTestPolicy(t, cfg)
	_, now := send(p, "hot", 1000, t0, time.Millisecond)
	if d := p.Decide([]byte("hot"), now); d.Outcome != Overflow {
		t.Fatalf("hot key: %v", d)
	}
	p.Decide([]byte("o"), now)
	p.SetEnabled(false)
	if p.Enabled() || p.Counters().Enabled {
		t.Fatal("still enabled")
	}
	want := map[string]Decision{
		"hot":  {Main, KillSwitch, false},
		"o":    {Main, KillSwitch, false},
		"null": {Main, KillSwitch, false},
		"d":    {Drop, DropRule, false},
		"dl":   {DeadLetter, DeadLetterRule, false},
		"s":    {SkipStateful, SkipStatefulRule, false},
		"cold": {Main, NotHot, false},
		"":     {Rejected, MissingKey, false},
	}
	for key, w := range want {
		if got := p.Decide([]byte(key), now); got != w {
			t.Errorf("disabled: Decide(%q) = %v, want %v", key, got, w)
		}
	}
	// The key that was sticky before the kill switch is Main while disabled,
	// even after it cools down, and back in overflow once re-enabled.
	later := now.Add(20 * time.Second)
	if got := p.Decide([]byte("hot"), later); got != (Decision{Main, KillSwitch, false}) {
		t.Errorf("disabled, cooled: %v", got)
	}
	p.SetEnabled(true)
	if got := p.Decide([]byte("hot"), later); got != (Decision{Overflow, Sticky, false}) {
		t.Errorf("re-enabled: %v", got)
	}
	// Starting disabled.
	cfg.Disabled = true
	q := newTestPolicy(t, cfg)
	if got := q.Decide([]byte("o"), t0); got != (Decision{Main, KillSwitch, false}) {
		t.Errorf("Disabled config: %v", got)
	}
}

func TestPolicyOverflowFullAndSweep(t *testing.T) {
	rules, _ := ParseRules("overflow forced:*")
	cfg := testPolicyConfig()
	cfg.MaxOverflowKeys = 2
	cfg.Rules = rules
	p := newTestPolicy(t, cfg)
	now := t0
	for _, k := range []string{"a", "b", "c"} {
		_, now = send(p, k, 1000, now.Add(time.Millisecond), time.Millisecond)
	}
	_, now = send(p, "a", 1, now, 0)
	if got := p.Decide([]byte("c"), now); got != (Decision{Main, OverflowFull, false}) {
		t.Errorf("third hot key: %v", got)
	}
	if got := p.Decide([]byte("forced:1"), now); got != (Decision{Overflow, ForcedOverflow, false}) {
		t.Errorf("forced key at the cap: %v", got)
	}
	c := p.Counters()
	if c.OverflowKeys != 2 || c.Untracked != 1 || c.Count(Main, OverflowFull) == 0 {
		t.Errorf("counters %+v", c)
	}
	keys := p.AppendOverflowKeys(nil)
	if len(keys) != 2 {
		t.Fatalf("AppendOverflowKeys = %+v", keys)
	}
	for _, k := range keys {
		if k.Key != "a" && k.Key != "b" || !k.DrainedThrough.IsZero() || k.Since.After(k.LastOverflow) {
			t.Errorf("overflow key %+v", k)
		}
	}
	// Sweep frees nothing before the keys are drained, then frees both.
	quiet := now.Add(30 * time.Second)
	if n := p.Sweep(quiet); n != 0 {
		t.Errorf("Sweep released %d undrained keys", n)
	}
	p.MarkDrained([]byte("a"), now)
	p.MarkDrained([]byte("b"), now)
	if n := p.Sweep(quiet); n != 2 || p.Counters().OverflowKeys != 0 {
		t.Errorf("Sweep released %d keys, %d left", n, p.Counters().OverflowKeys)
	}
	_, now = send(p, "c", 1000, quiet, time.Millisecond)
	if got := p.Decide([]byte("c"), now); got.Outcome != Overflow {
		t.Errorf("hot key after Sweep made room: %v", got)
	}
}

func TestPolicyForcedKeyStaysStickyAfterRuleRemoval(t *testing.T) {
	rules, _ := ParseRules("overflow user:42\njunk null")
	cfg := testPolicyConfig()
	cfg.Rules = rules
	p := newTestPolicy(t, cfg)
	if got := p.Decide([]byte("user:42"), t0); got != (Decision{Overflow, ForcedOverflow, false}) {
		t.Fatal(got)
	}
	p.SetRules(nil)
	if p.Rules() != nil {
		t.Fatal("SetRules(nil)")
	}
	if got := p.Decide([]byte("user:42"), at(time.Second)); got != (Decision{Overflow, Sticky, false}) {
		t.Errorf("after rule removal: %v", got)
	}
	p.MarkDrained([]byte("user:42"), at(time.Second))
	if got := p.Decide([]byte("user:42"), at(6*time.Second)); got != (Decision{Main, Released, false}) {
		t.Errorf("after cooldown and drain: %v", got)
	}
}

func TestPolicySpread(t *testing.T) {
	for _, spread := range []bool{false, true} {
		cfg := testPolicyConfig()
		cfg.SpreadDetected = spread
		p := newTestPolicy(t, cfg)
		ds, _ := send(p, "hot", 1000, t0, time.Millisecond)
		d := ds[len(ds)-1]
		if d.Outcome != Overflow || d.Spread != spread {
			t.Errorf("SpreadDetected=%v: %v", spread, d)
		}
	}
	if s := (Decision{Overflow, Detected, true}).String(); s != "overflow/detected/spread" {
		t.Errorf("String() = %q", s)
	}
	if s := Outcome(99).String() + Reason(99).String() + Action(99).String(); s != "Outcome(99)Reason(99)Action(99)" {
		t.Errorf("String() = %q", s)
	}
}

// TestPolicyDecideAllocs: Decide does not allocate in the steady state,
// whatever the outcome.
func TestPolicyDecideAllocs(t *testing.T) {
	rules, _ := ParseRules("drop d:*\noverflow o:*\njunk null")
	cfg := testPolicyConfig()
	cfg.Rules = rules
	p := newTestPolicy(t, cfg)
	_, now := send(p, "hot", 1000, t0, time.Millisecond)
	p.Decide([]byte("o:1"), now)
	for _, key := range []string{"hot", "cold", "d:1", "o:1", "NULL", ""} {
		k := []byte(key)
		if a := testing.AllocsPerRun(1000, func() {
			now = now.Add(time.Millisecond)
			p.Decide(k, now)
		}); a != 0 {
			t.Errorf("Decide(%q) allocates %v times", key, a)
		}
	}
}

// TestPolicyNeverMainWhileOverflowPending is the central property: with the
// kill switch on, a key never goes to main while any message of it that
// went to overflow is unprocessed, whatever the sequence of messages,
// drains, sweeps, rule changes, cluster-set changes and kill-switch flips.
// Also, with the kill switch on, a key of the cluster set always goes to
// overflow, and Sweep never releases one.
func TestPolicyNeverMainWhileOverflowPending(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		keys := []string{"a", "b", "c", "d", "junk"}
		cfg := testPolicyConfig()
		cfg.Cooldown = time.Duration(rapid.IntRange(0, 3000).Draw(rt, "cooldownMs")) * time.Millisecond
		cfg.Detector.Capacity = rapid.IntRange(1, 8).Draw(rt, "capacity")
		cfg.MaxOverflowKeys = len(keys) // sticky for every key: see OverflowFull for the cap
		p := newTestPolicy(rt, cfg)
		pending := map[string][]time.Time{} // overflow messages not yet processed
		cluster := map[string]bool{}        // the cluster set
		now := t0
		decisions := uint64(0)
		decide := func(key string) {
			now = now.Add(time.Duration(rapid.IntRange(1, 20).Draw(rt, "dtMs")) * time.Millisecond)
			enabled := p.Enabled()
			d := p.Decide([]byte(key), now)
			decisions++
			switch d.Outcome {
			case Overflow:
				pending[key] = append(pending[key], now)
			case Main:
				if enabled && len(pending[key]) > 0 {
					rt.Fatalf("%s sent to main (%v) with %d overflow messages pending since %v", key, d, len(pending[key]), pending[key][0])
				}
			}
			if d.Outcome == Main && d.Reason == KillSwitch && enabled {
				rt.Fatalf("KillSwitch reason while enabled")
			}
			if enabled && cluster[key] && d.Outcome != Overflow {
				rt.Fatalf("%s is in the cluster set but went to %v", key, d)
			}
			if d.Reason == ClusterHot && !cluster[key] {
				rt.Fatalf("%s: %v, but it is not in the cluster set", key, d)
			}
		}
		rt.Repeat(map[string]func(*rapid.T){
			"burst": func(rt *rapid.T) {
				key := rapid.SampledFrom(keys).Draw(rt, "key")
				n := rapid.IntRange(1, 300).Draw(rt, "n")
				for i := 0; i < n; i++ {
					decide(key)
				}
			},
			"one": func(rt *rapid.T) { decide(rapid.SampledFrom(keys).Draw(rt, "key")) },
			"wait": func(rt *rapid.T) {
				now = now.Add(time.Duration(rapid.IntRange(1, 10_000).Draw(rt, "waitMs")) * time.Millisecond)
			},
			"drain": func(rt *rapid.T) {
				key := rapid.SampledFrom(keys).Draw(rt, "key")
				q := pending[key]
				if len(q) == 0 {
					return
				}
				j := rapid.IntRange(1, len(q)).Draw(rt, "processed")
				p.MarkDrained([]byte(key), q[j-1])
				pending[key] = q[j:]
			},
			"sweep": func(rt *rapid.T) {
				before := map[string]bool{}
				for _, k := range p.AppendOverflowKeys(nil) {
					before[k.Key] = true
				}
				p.Sweep(now)
				after := map[string]bool{}
				for _, k := range p.AppendOverflowKeys(nil) {
					after[k.Key] = true
				}
				for k := range before {
					if cluster[k] && !after[k] {
						rt.Fatalf("Sweep released %s, which is in the cluster set", k)
					}
				}
			},
			"cluster": func(rt *rapid.T) {
				clear(cluster)
				var set []string
				for _, k := range keys {
					if rapid.Bool().Draw(rt, "cluster "+k) {
						set = append(set, k)
						cluster[k] = true
					}
				}
				p.SetClusterKeys(set)
			},
			"kill": func(rt *rapid.T) { p.SetEnabled(rapid.Bool().Draw(rt, "enabled")) },
			"rules": func(rt *rapid.T) {
				var text []string
				for _, k := range keys {
					if rapid.Bool().Draw(rt, "force "+k) {
						text = append(text, "overflow "+k)
					}
				}
				if rapid.Bool().Draw(rt, "junk") {
					text = append(text, "junk JUNK")
				}
				rs, err := ParseRules(strings.Join(text, "\n"))
				if err != nil {
					rt.Fatal(err)
				}
				p.SetRules(rs)
			},
			"": func(rt *rapid.T) {
				c := p.Counters()
				if c.Total() != decisions || c.Entered-c.Released != uint64(c.OverflowKeys) || c.Untracked != 0 {
					rt.Fatalf("counters %+v after %d decisions", c, decisions)
				}
				if got := len(p.AppendOverflowKeys(nil)); got != c.OverflowKeys || got != p.live || got+len(p.free) != p.maxKeys {
					rt.Fatalf("%d overflow keys listed, %d counted, %d free", got, c.OverflowKeys, len(p.free))
				}
				checkDetector(rt, p.det)
			},
		})
	})
}

// FuzzDecide drives a small policy with arbitrary keys, times and inputs;
// it must not panic and its bookkeeping must stay consistent.
func FuzzDecide(f *testing.F) {
	f.Add([]byte("\x00a\x00a\x00a\x01a\x02a\x03\x04a"), "overflow a\njunk null")
	f.Add([]byte("\x00\x00\x00\x00"), "drop *")
	f.Add([]byte("\x05hot\x05hot\x05hot\x06"), "")
	f.Fuzz(func(t *testing.T, data []byte, rulesText string) {
		rules, err := ParseRules(rulesText)
		if err != nil {
			rules = nil
		}
		p, err := NewPolicy(PolicyConfig{
			Detector:        DetectorConfig{Threshold: 5, HalfLife: time.Second, Capacity: 4, MaxKeyLen: 3},
			Cooldown:        time.Second,
			MaxOverflowKeys: 3,
			Rules:           rules,
		})
		if err != nil {
			t.Fatal(err)
		}
		now := t0
		n := uint64(0)
		// Each record: an op byte, then a key up to the next op byte < 8.
		for len(data) > 0 {
			op := data[0]
			data = data[1:]
			end := 0
			for end < len(data) && data[end] >= 8 {
				end++
			}
			key := data[:end]
			data = data[end:]
			switch op % 8 {
			case 0, 1, 2, 3:
				now = now.Add(time.Duration(op) * time.Millisecond)
				d := p.Decide(key, now)
				n++
				if (d.Outcome == Rejected) != (len(key) == 0) || d.Reason == NoReason || d.Spread && d.Outcome != Overflow {
					t.Fatalf("Decide(%q) = %v", key, d)
				}
			case 4:
				p.MarkDrained(key, now)
			case 5:
				now = now.Add(time.Duration(op) * time.Second)
				p.Sweep(now)
			case 6:
				if len(key) > 0 {
					p.SetClusterKeys([]string{string(key)})
				} else {
					p.SetEnabled(!p.Enabled())
				}
			case 7:
				now = now.Add(-time.Second) // time going backwards is tolerated
			}
		}
		c := p.Counters()
		if c.Total() != n || c.Entered-c.Released != uint64(c.OverflowKeys) || c.OverflowKeys > 3 {
			t.Fatalf("counters %+v after %d decisions", c, n)
		}
		checkDetector(t, p.det)
		_ = fmt.Sprint(p.AppendOverflowKeys(nil))
	})
}

func TestCountersDiff(t *testing.T) {
	p := newTestPolicy(t, testPolicyConfig())
	p.Decide([]byte("a"), t0)
	p.Decide(nil, t0)
	var want Counters
	want.Decisions[Main][NotHot] = 1
	want.Decisions[Rejected][MissingKey] = 1
	want.Enabled = true
	if diff := cmp.Diff(want, p.Counters()); diff != "" {
		t.Errorf("Counters mismatch (-want +got):\n%s", diff)
	}
	if c := p.Counters(); c.Count(numOutcomes, 0) != 0 || c.Count(0, numReasons) != 0 {
		t.Error("out-of-range Count")
	}
}

func TestUnixNanoSat(t *testing.T) {
	tests := []struct {
		t    time.Time
		want int64
	}{
		{time.Time{}, math.MinInt64},
		{time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC), math.MaxInt64},
		{t0, t0.UnixNano()},
	}
	for _, tt := range tests {
		if got := unixNanoSat(tt.t); got != tt.want {
			t.Errorf("unixNanoSat(%v) = %d, want %d", tt.t, got, tt.want)
		}
	}
	// A zero time never marks a key drained.
	p := newTestPolicy(t, testPolicyConfig())
	p.SetRules(mustRules(t, "overflow k"))
	p.Decide([]byte("k"), t0)
	p.SetRules(nil)
	p.MarkDrained([]byte("k"), time.Time{})
	if got := p.Decide([]byte("k"), t0.Add(time.Hour)); got != (Decision{Overflow, Sticky, false}) {
		t.Errorf("after MarkDrained(zero time): %v", got)
	}
}

func mustRules(t *testing.T, text string) *Rules {
	t.Helper()
	rs, err := ParseRules(text)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}
