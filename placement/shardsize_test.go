package placement_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/keyshard/keyshard/placement"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestNextSizeScript(t *testing.T) {
	p := placement.SizePolicy{CapacityPerMember: 10, Headroom: 1, Min: 2, Max: 30, Zones: 3, ShrinkCooldown: 10 * time.Minute, MaxShrinkStep: 3}
	steps := []struct {
		at   time.Duration
		rate float64
		pool int
		want int
	}{
		{0, 0, 0, 3},                   // min 2 rounds up to 3 zones
		{time.Minute, 95, 0, 12},       // ⌈9.5⌉ = 10 → 12; grows at once
		{2 * time.Minute, 250, 0, 27},  // 25 → 27
		{3 * time.Minute, 500, 0, 30},  // clamp to max
		{4 * time.Minute, 500, 20, 20}, // the pool is the upper clamp
		{5 * time.Minute, 500, 60, 30}, // pool grows back: regained at once
		{6 * time.Minute, 40, 60, 30},  // wants 6: shrink waits for the cooldown
		{15 * time.Minute, 40, 60, 30}, // 9 minutes later, still waiting
		{16 * time.Minute, 40, 60, 27}, // cooldown passed: one step of 3
		{20 * time.Minute, 40, 60, 27}, // next step waits a full cooldown
		{26 * time.Minute, 40, 60, 24},
		{27 * time.Minute, 200, 60, 24}, // wants 21, above... no: 20 → 21 < 24, keeps waiting
		{36 * time.Minute, 200, 60, 21},
		{37 * time.Minute, 300, 60, 30}, // grows at once again
	}
	var st placement.SizeState
	for i, s := range steps {
		var err error
		st, err = placement.NextSize(st, s.rate, s.pool, t0.Add(s.at), p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size != s.want {
			t.Fatalf("step %d (t=%v rate=%v pool=%d): size %d, want %d (state %+v)", i, s.at, s.rate, s.pool, st.Size, s.want, st)
		}
		if st.Size%3 != 0 && st.Size != s.pool {
			t.Fatalf("step %d: size %d is not a multiple of the zones", i, st.Size)
		}
	}
}

// TestNextSizeIgnoresPool checks that the pool only clamps: with a pool at
// least as large as the size, the result is the same for any pool size.
func TestNextSizeIgnoresPool(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := placement.SizePolicy{
			CapacityPerMember: rapid.Float64Range(0.5, 100).Draw(t, "capacity"),
			Headroom:          rapid.Float64Range(1, 2).Draw(t, "headroom"),
			Min:               rapid.IntRange(0, 5).Draw(t, "min"),
			Zones:             rapid.IntRange(1, 3).Draw(t, "zones"),
			ShrinkCooldown:    time.Duration(rapid.IntRange(0, 600).Draw(t, "cooldown")) * time.Second,
			MaxShrinkStep:     rapid.IntRange(0, 4).Draw(t, "step"),
		}
		p.Max = p.Min + rapid.IntRange(0, 60).Draw(t, "span")
		var a, b placement.SizeState
		now := t0
		for i := range 30 {
			now = now.Add(time.Duration(rapid.IntRange(0, 300).Draw(t, "dt")) * time.Second)
			rate := rapid.Float64Range(0, 3000).Draw(t, "rate")
			var err error
			a, err = placement.NextSize(a, rate, 0, now, p)
			if err != nil {
				t.Fatal(err)
			}
			b, err = placement.NextSize(b, rate, 100000+i, now, p)
			if err != nil {
				t.Fatal(err)
			}
			if a != b {
				t.Fatalf("pool changed the state: %+v vs %+v", a, b)
			}
			z := max(p.Zones, 1)
			if a.Size%z != 0 {
				t.Fatalf("size %d not a multiple of %d zones", a.Size, z)
			}
			need := int(math.Ceil(rate * p.Headroom / p.CapacityPerMember))
			if (p.Max == 0 || need <= p.Max/z*z) && a.Size < need {
				t.Fatalf("size %d below the need %d: never shrink below demand", a.Size, need)
			}
		}
	})
}

func TestNextSizeErrors(t *testing.T) {
	ok := placement.SizePolicy{CapacityPerMember: 1}
	for _, tc := range []struct {
		p    placement.SizePolicy
		rate float64
		want string
	}{
		{placement.SizePolicy{}, 1, "CapacityPerMember is 0"},
		{placement.SizePolicy{CapacityPerMember: 1, Max: 2, Min: 3}, 1, "Max 2 is below Min 3"},
		{placement.SizePolicy{CapacityPerMember: 1, Zones: -1}, 1, "Zones is -1"},
		{placement.SizePolicy{CapacityPerMember: 1, Headroom: math.NaN()}, 1, "Headroom is NaN"},
		{placement.SizePolicy{CapacityPerMember: 1, ShrinkCooldown: -time.Second}, 1, "ShrinkCooldown is -1s"},
		{ok, -1, "rate -1"},
		{ok, math.Inf(1), "rate +Inf"},
	} {
		_, err := placement.NextSize(placement.SizeState{}, tc.rate, 0, t0, tc.p)
		if !errors.Is(err, placement.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err = %v, want ErrInvalid mentioning %q", err, tc.want)
		}
	}
}

func FuzzNextSize(f *testing.F) {
	f.Add(12.5, 10.0, 1.2, 1, 40, 3, int64(60), 2, 5, int64(30))
	f.Add(0.0, 1.0, 0.0, 0, 0, 0, int64(0), 0, 0, int64(0))
	f.Fuzz(func(t *testing.T, rate, capacity, headroom float64, lo, hi, zones int, cooldown int64, step, pool int, dt int64) {
		p := placement.SizePolicy{CapacityPerMember: capacity, Headroom: headroom, Min: lo, Max: hi, Zones: zones % 1000, ShrinkCooldown: time.Duration(cooldown), MaxShrinkStep: step}
		st, err := placement.NextSize(placement.SizeState{}, rate, pool, t0, p)
		if err != nil {
			if !errors.Is(err, placement.ErrInvalid) {
				t.Fatal(err)
			}
			return
		}
		if st.Size < 0 || (pool > 0 && st.Size > pool) {
			t.Fatalf("size %d with pool %d", st.Size, pool)
		}
		if _, err := placement.NextSize(st, rate/2, pool, t0.Add(time.Duration(dt)), p); err != nil {
			t.Fatal(err)
		}
	})
}

// A lowered max applies at once; the rest of a shrink still waits for the
// cooldown.
func TestNextSizeLoweredMaxAppliesAtOnce(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	p := placement.SizePolicy{CapacityPerMember: 10, ShrinkCooldown: time.Hour}
	st, err := placement.NextSize(placement.SizeState{}, 120, 0, t0, p)
	if err != nil || st.Size != 12 {
		t.Fatalf("first size: %+v, %v; want 12", st, err)
	}
	p.Max = 8
	st, err = placement.NextSize(st, 120, 0, t0.Add(time.Second), p)
	if err != nil || st.Size != 8 || !st.BelowSince.IsZero() {
		t.Fatalf("after max 12 -> 8: %+v, %v; want size 8 at once, no cooldown pending", st, err)
	}
	// Load falls to 30/s: wanted 3, below max 8: that shrink waits.
	st, err = placement.NextSize(st, 30, 0, t0.Add(2*time.Second), p)
	if err != nil || st.Size != 8 || st.BelowSince.IsZero() {
		t.Fatalf("after the drop: %+v, %v; want size 8 with the cooldown started", st, err)
	}
	// Max lowered again to 6 while that cooldown runs: 6 at once, the
	// cooldown towards 3 keeps running.
	p.Max = 6
	below := st.BelowSince
	st, err = placement.NextSize(st, 30, 0, t0.Add(3*time.Second), p)
	if err != nil || st.Size != 6 || !st.BelowSince.Equal(below) {
		t.Fatalf("after max 8 -> 6: %+v, %v; want size 6, cooldown since %v kept", st, err, below)
	}
}
