package placement

import (
	"math"
	"time"
)

// SizePolicy turns a tenant's measured request rate into its shard size.
type SizePolicy struct {
	// CapacityPerMember is the rate one member serves for a tenant, in the
	// same unit as the rate (for example queries per second). Required.
	CapacityPerMember float64
	// Headroom multiplies the rate before sizing: 1.25 keeps 20% spare.
	// Default 1.
	Headroom float64
	// Min and Max clamp the size. Min defaults to 1; Max 0 means no bound
	// but the pool. Both are rounded to multiples of Zones (Min up, Max
	// down, but never below Zones).
	Min, Max int
	// Zones is the number of zones a tenant's members are spread over; the
	// size is a multiple of it. Default 1.
	Zones int
	// ShrinkCooldown is how long the wanted size must stay below the current
	// one before a shrink, and the wait between two shrink steps.
	ShrinkCooldown time.Duration
	// MaxShrinkStep bounds one shrink, in members (rounded up to a multiple
	// of Zones). Default Zones: shrink one member per zone at a time.
	MaxShrinkStep int
}

// SizeState is the explicit state of one tenant's size. The zero value is
// a tenant not sized yet. Callers keep it between calls to NextSize (the
// coordinator persists it, so a new leader continues the same hysteresis).
type SizeState struct {
	// Size is the current shard size; 0 before the first call.
	Size int
	// Wanted is the size the last rate asked for, before hysteresis.
	Wanted int
	// BelowSince is when the wanted size first fell below Size, zero if it
	// is not below; also the time of the last shrink step while a shrink
	// is in progress.
	BelowSince time.Time
}

// Validate returns an error wrapping ErrInvalid naming the bad field.
func (p SizePolicy) Validate() error {
	switch {
	case math.IsNaN(p.CapacityPerMember) || math.IsInf(p.CapacityPerMember, 0) || p.CapacityPerMember <= 0:
		return invalidf("size policy: CapacityPerMember is %v; want a finite number > 0", p.CapacityPerMember)
	case math.IsNaN(p.Headroom) || math.IsInf(p.Headroom, 0) || p.Headroom < 0:
		return invalidf("size policy: Headroom is %v; want a finite number > 0 (or 0 for the default 1)", p.Headroom)
	case p.Min < 0:
		return invalidf("size policy: Min is %d; want >= 0", p.Min)
	case p.Max < 0:
		return invalidf("size policy: Max is %d; want >= 0 (0 = no bound)", p.Max)
	case p.Max > 0 && p.Max < p.Min:
		return invalidf("size policy: Max %d is below Min %d", p.Max, p.Min)
	case p.Zones < 0:
		return invalidf("size policy: Zones is %d; want >= 1 (or 0 for the default 1)", p.Zones)
	case p.ShrinkCooldown < 0:
		return invalidf("size policy: ShrinkCooldown is %v; want >= 0", p.ShrinkCooldown)
	case p.MaxShrinkStep < 0:
		return invalidf("size policy: MaxShrinkStep is %d; want >= 0", p.MaxShrinkStep)
	}
	return nil
}

// NextSize returns the tenant's next size state for a measured rate at
// time now:
//
//	wanted = clamp(⌈rate · headroom / capacity⌉, min, max), rounded up to a multiple of zones
//
// A wanted size above the current one applies at once. A smaller one
// applies only after it has been wanted for ShrinkCooldown, and then by at
// most MaxShrinkStep members per cooldown. A size above max (max was
// lowered) drops to max at once: an operator's bound wins over the
// cooldown. The size never depends on the
// pool except that it is clamped to poolSize (the members available; 0 or
// less means unknown, no clamp), so growing the pool for one tenant leaves
// every other tenant's size alone.
//
// NextSize is pure: it reads no clock, and equal inputs give equal outputs.
// It returns an error wrapping ErrInvalid for an invalid policy or a rate
// that is negative or not finite.
func NextSize(st SizeState, rate float64, poolSize int, now time.Time, p SizePolicy) (SizeState, error) {
	if err := p.Validate(); err != nil {
		return st, err
	}
	if math.IsNaN(rate) || math.IsInf(rate, 0) || rate < 0 {
		return st, invalidf("rate %v; want a finite number >= 0", rate)
	}
	if p.Headroom == 0 {
		p.Headroom = 1
	}
	zones := max(p.Zones, 1)
	roundUp := func(n int) int { return (n + zones - 1) / zones * zones }
	lo := roundUp(max(p.Min, 1))
	hi := math.MaxInt / 2
	if p.Max > 0 {
		hi = max(p.Max/zones*zones, zones)
		lo = min(lo, hi)
	}
	want := float64(lo)
	// A hair below the integer counts as it: 52 × 1.2 / 10.4 must give 6,
	// not 7 from float noise.
	if need := math.Ceil(rate*p.Headroom/p.CapacityPerMember - 1e-9); need > want {
		want = need
	}
	wanted := hi
	if want < float64(hi) {
		wanted = min(roundUp(int(want)), hi)
	}
	step := roundUp(max(p.MaxShrinkStep, zones))

	next := SizeState{Size: st.Size, Wanted: wanted, BelowSince: st.BelowSince}
	switch {
	case st.Size <= 0 || wanted >= st.Size:
		next.Size, next.BelowSince = wanted, time.Time{}
	case st.BelowSince.IsZero():
		next.BelowSince = now
	case now.Sub(st.BelowSince) >= p.ShrinkCooldown:
		next.Size = max(wanted, st.Size-step)
		next.BelowSince = now
		if next.Size == wanted {
			next.BelowSince = time.Time{}
		}
	}
	if next.Size > hi {
		next.Size = hi
		if next.Size == wanted {
			next.BelowSince = time.Time{}
		}
	}
	if poolSize > 0 && next.Size > poolSize {
		// The pool is the only upper clamp. Wanted stays above Size, so the
		// tenant grows back at once when the pool does.
		return SizeState{Size: poolSize, Wanted: wanted, BelowSince: next.BelowSince}, nil
	}
	return next, nil
}
