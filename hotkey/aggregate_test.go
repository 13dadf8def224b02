package hotkey_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/keyshard/keyshard/hotkey"
)

var agT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// spread reports key at total rate over n producers, evenly.
func spread(key string, total float64, n int, at time.Time) []hotkey.Report {
	var rs []hotkey.Report
	for i := range n {
		rs = append(rs, hotkey.Report{Producer: fmt.Sprintf("p%02d", i), At: at, Keys: []hotkey.KeyRate{{Key: key, Rate: total / float64(n)}}})
	}
	return rs
}

func TestAggregateCatchesSpreadKey(t *testing.T) {
	cfg := hotkey.AggregateConfig{Threshold: 1000}
	// 16 producers each see the key at 1/16 of its rate: no producer sees
	// it hot, the sum does.
	for _, tc := range []struct {
		total float64
		in    bool
	}{{1050, true}, {1000, true}, {950, false}, {100, false}} {
		set, err := hotkey.Aggregate(hotkey.OverflowSet{}, spread("user:42", tc.total, 16, agT0), agT0, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(set.Keys(), "user:42"); got != tc.in {
			t.Errorf("total %v over 16 producers: in set = %v, want %v", tc.total, got, tc.in)
		}
	}
}

func TestAggregateHysteresis(t *testing.T) {
	cfg := hotkey.AggregateConfig{Threshold: 1000, LowThreshold: 500, Cooldown: 10 * time.Second}
	steps := []struct {
		after time.Duration
		rate  float64
		in    bool
		ver   uint64
	}{
		{0, 1200, true, 1},                // enters
		{time.Second, 700, true, 1},       // between the thresholds: stays
		{2 * time.Second, 300, true, 1},   // below low: cooldown starts
		{8 * time.Second, 300, true, 1},   // 6 s into it
		{9 * time.Second, 600, true, 1},   // back above low: cooldown resets
		{10 * time.Second, 100, true, 1},  // below again
		{19 * time.Second, 100, true, 1},  // 9 s
		{20 * time.Second, 100, false, 2}, // 10 s: leaves
		{21 * time.Second, 900, false, 2}, // below the entry threshold: stays out
	}
	var set hotkey.OverflowSet
	for i, s := range steps {
		now := agT0.Add(s.after)
		var err error
		set, err = hotkey.Aggregate(set, spread("k", s.rate, 4, now), now, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(set.Keys(), "k"); got != s.in || set.Version != s.ver {
			t.Fatalf("step %d (t+%v, rate %v): in=%v version=%d, want in=%v version=%d", i, s.after, s.rate, got, set.Version, s.in, s.ver)
		}
	}
}

func TestAggregateStaleAndReplacedReports(t *testing.T) {
	cfg := hotkey.AggregateConfig{Threshold: 100, MaxAge: 5 * time.Second}
	old := hotkey.Report{Producer: "a", At: agT0, Keys: []hotkey.KeyRate{{"k", 80}}}
	newer := hotkey.Report{Producer: "a", At: agT0.Add(time.Second), Keys: []hotkey.KeyRate{{"k", 10}}}
	other := hotkey.Report{Producer: "b", At: agT0.Add(time.Second), Keys: []hotkey.KeyRate{{"k", 80}}}
	// a's newer report replaces its older one: 10 + 80 < 100.
	set, _ := hotkey.Aggregate(hotkey.OverflowSet{}, []hotkey.Report{old, newer, other}, agT0.Add(time.Second), cfg)
	if len(set.Entries) != 0 {
		t.Fatalf("a's old report counted: %v", set.Keys())
	}
	// Without the newer one: 80 + 80 >= 100.
	set, _ = hotkey.Aggregate(hotkey.OverflowSet{}, []hotkey.Report{old, other}, agT0.Add(time.Second), cfg)
	if len(set.Entries) != 1 {
		t.Fatalf("set %v, want k", set.Keys())
	}
	// Ten seconds later a's report is stale: 80 < 100 and k is not entered
	// again (a fresh aggregation from nothing).
	set, _ = hotkey.Aggregate(hotkey.OverflowSet{}, []hotkey.Report{old, {Producer: "b", At: agT0.Add(10 * time.Second), Keys: []hotkey.KeyRate{{"k", 80}}}}, agT0.Add(10*time.Second), cfg)
	if len(set.Entries) != 0 {
		t.Fatalf("a stale report counted: %v", set.Keys())
	}
}

func TestAggregateCapAndErrors(t *testing.T) {
	var rs []hotkey.Report
	for i := range 10 {
		rs = append(rs, hotkey.Report{Producer: "p", At: agT0, Keys: []hotkey.KeyRate{{fmt.Sprintf("k%d", i), float64(100 + i)}}})
	}
	// One producer, one report: the last wins; give each key its own producer.
	for i := range rs {
		rs[i].Producer = fmt.Sprintf("p%d", i)
	}
	set, err := hotkey.Aggregate(hotkey.OverflowSet{}, rs, agT0, hotkey.AggregateConfig{Threshold: 100, MaxKeys: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(set.Keys(), ","); got != "k7,k8,k9" {
		t.Fatalf("capped set %s, want the three loudest", got)
	}
	for _, tc := range []struct {
		cfg  hotkey.AggregateConfig
		rs   []hotkey.Report
		want string
	}{
		{hotkey.AggregateConfig{}, nil, "Threshold is 0"},
		{hotkey.AggregateConfig{Threshold: 10, LowThreshold: 20}, nil, "LowThreshold is 20"},
		{hotkey.AggregateConfig{Threshold: 10}, []hotkey.Report{{At: agT0}}, "report 0 has no producer"},
		{hotkey.AggregateConfig{Threshold: 10}, []hotkey.Report{{Producer: "p", At: agT0, Keys: []hotkey.KeyRate{{"k", -1}}}}, `producer "p" reports key "k" at rate -1`},
	} {
		_, err := hotkey.Aggregate(hotkey.OverflowSet{}, tc.rs, agT0, tc.cfg)
		if !errors.Is(err, hotkey.ErrBadConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err = %v, want ErrBadConfig mentioning %q", err, tc.want)
		}
	}
}

// TestAggregateDeterministic: the order of reports never matters.
func TestAggregateDeterministic(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var rs []hotkey.Report
		for i := range rapid.IntRange(0, 12).Draw(t, "reports") {
			at := agT0.Add(time.Duration(rapid.IntRange(0, i).Draw(t, "at")) * time.Second) // ties included
			r := hotkey.Report{Producer: fmt.Sprintf("p%d", rapid.IntRange(0, 4).Draw(t, "producer")), At: at}
			for range rapid.IntRange(0, 4).Draw(t, "keys") {
				r.Keys = append(r.Keys, hotkey.KeyRate{Key: fmt.Sprintf("k%d", rapid.IntRange(0, 5).Draw(t, "key")), Rate: float64(rapid.IntRange(0, 600).Draw(t, "rate"))})
			}
			rs = append(rs, r)
		}
		now := agT0.Add(12 * time.Second)
		cfg := hotkey.AggregateConfig{Threshold: 500, MaxKeys: 3}
		a, errA := hotkey.Aggregate(hotkey.OverflowSet{}, rs, now, cfg)
		b, errB := hotkey.Aggregate(hotkey.OverflowSet{}, rapid.Permutation(rs).Draw(t, "order"), now, cfg)
		if (errA == nil) != (errB == nil) || !slices.Equal(a.Keys(), b.Keys()) || a.Version != b.Version {
			t.Fatalf("order changed the result: %v %v / %v %v", a.Keys(), errA, b.Keys(), errB)
		}
	})
}
