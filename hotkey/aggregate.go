package hotkey

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// KeyRate is one key's estimated rate (per second) as a producer saw it.
type KeyRate struct {
	Key  string
	Rate float64
}

// Report is one producer's heavy hitters at a moment: the building block
// of cluster-wide detection, where every producer reports its local heavy
// hitters and the control plane's leader sums them, so that a key spread
// evenly over many producers is caught at the global threshold.
type Report struct {
	Producer string
	At       time.Time
	Keys     []KeyRate
}

// AggregateConfig tunes Aggregate.
type AggregateConfig struct {
	// Threshold is the summed rate at which a key enters the overflow set.
	Threshold float64
	// LowThreshold is the rate below which a key in the set starts its
	// cooldown (hysteresis). Default Threshold/2.
	LowThreshold float64
	// Cooldown is how long a key's summed rate must stay below
	// LowThreshold before it leaves the set. Default 30s.
	Cooldown time.Duration
	// MaxAge drops reports older than this: a producer that stopped
	// reporting stops counting. Default 30s.
	MaxAge time.Duration
	// MaxKeys caps the set; the keys with the highest rates win. Default
	// 1024.
	MaxKeys int
}

// OverflowEntry is one key of an OverflowSet.
type OverflowEntry struct {
	Key  string
	Rate float64 // summed over producers, at the last aggregation
	// Since is when the key entered the set; BelowSince when its rate
	// last fell below LowThreshold (zero while it is above).
	Since, BelowSince time.Time
}

// OverflowSet is the cluster-wide set of keys to overflow, with a version
// that increases whenever its membership changes, so producers that watch
// it can tell a newer set from an older one.
type OverflowSet struct {
	Version uint64
	Entries []OverflowEntry // sorted by key
}

// Keys returns the set's keys, sorted.
func (s OverflowSet) Keys() []string {
	out := make([]string, len(s.Entries))
	for i, e := range s.Entries {
		out[i] = e.Key
	}
	return out
}

func (c AggregateConfig) withDefaults() (AggregateConfig, error) {
	if math.IsNaN(c.Threshold) || math.IsInf(c.Threshold, 0) || c.Threshold <= 0 {
		return c, fmt.Errorf("%w: aggregate: Threshold is %v; want a finite number > 0", ErrBadConfig, c.Threshold)
	}
	if c.LowThreshold == 0 {
		c.LowThreshold = c.Threshold / 2
	}
	if math.IsNaN(c.LowThreshold) || c.LowThreshold < 0 || c.LowThreshold > c.Threshold {
		return c, fmt.Errorf("%w: aggregate: LowThreshold is %v; want a number in [0, Threshold]", ErrBadConfig, c.LowThreshold)
	}
	if c.Cooldown == 0 {
		c.Cooldown = 30 * time.Second
	}
	if c.MaxAge == 0 {
		c.MaxAge = 30 * time.Second
	}
	if c.Cooldown < 0 || c.MaxAge < 0 {
		return c, fmt.Errorf("%w: aggregate: Cooldown %v and MaxAge %v must not be negative", ErrBadConfig, c.Cooldown, c.MaxAge)
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = 1024
	}
	if c.MaxKeys < 0 {
		return c, fmt.Errorf("%w: aggregate: MaxKeys is %d; want > 0", ErrBadConfig, c.MaxKeys)
	}
	return c, nil
}

// newer reports whether a replaces b as its producer's latest report: the
// later one, and between two of the same moment a fixed choice (the one
// whose keys print first), so the order of reports never matters.
func newer(a, b Report) bool {
	if !a.At.Equal(b.At) {
		return a.At.After(b.At)
	}
	return fmt.Sprint(a.Keys) < fmt.Sprint(b.Keys)
}

// Aggregate sums the latest report of every producer (reports older than
// MaxAge at now are ignored; a producer's newer report replaces its older
// one) and returns the next overflow set from prev: a key enters when its
// summed rate reaches Threshold, and leaves once it has stayed below
// LowThreshold for Cooldown. The version rises by one when the set of keys
// changes. Aggregate is pure and deterministic: the order of reports does
// not matter. Bad reports (empty producer or key, a rate that is negative
// or not finite) are errors wrapping ErrBadConfig that name them.
func Aggregate(prev OverflowSet, reports []Report, now time.Time, cfg AggregateConfig) (OverflowSet, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return prev, err
	}
	latest := map[string]Report{}
	for i, r := range reports {
		if r.Producer == "" {
			return prev, fmt.Errorf("%w: aggregate: report %d has no producer", ErrBadConfig, i)
		}
		if now.Sub(r.At) > cfg.MaxAge {
			continue
		}
		if have, ok := latest[r.Producer]; !ok || newer(r, have) {
			latest[r.Producer] = r
		}
	}
	sum := map[string]float64{}
	for _, r := range latest {
		for _, kr := range r.Keys {
			if kr.Key == "" || math.IsNaN(kr.Rate) || math.IsInf(kr.Rate, 0) || kr.Rate < 0 {
				return prev, fmt.Errorf("%w: aggregate: producer %q reports key %q at rate %v", ErrBadConfig, r.Producer, kr.Key, kr.Rate)
			}
			sum[kr.Key] += kr.Rate
		}
	}
	next := OverflowSet{Version: prev.Version}
	in := map[string]bool{}
	for _, e := range prev.Entries {
		in[e.Key] = true
		rate := sum[e.Key]
		e.Rate = rate
		switch {
		case rate >= cfg.LowThreshold:
			e.BelowSince = time.Time{}
		case e.BelowSince.IsZero():
			e.BelowSince = now
		}
		if !e.BelowSince.IsZero() && now.Sub(e.BelowSince) >= cfg.Cooldown {
			continue // cooled down: leaves
		}
		next.Entries = append(next.Entries, e)
	}
	for key, rate := range sum {
		if !in[key] && rate >= cfg.Threshold {
			next.Entries = append(next.Entries, OverflowEntry{Key: key, Rate: rate, Since: now})
		}
	}
	if len(next.Entries) > cfg.MaxKeys {
		slices.SortFunc(next.Entries, func(a, b OverflowEntry) int {
			if a.Rate != b.Rate {
				if a.Rate > b.Rate {
					return -1
				}
				return 1
			}
			return strings.Compare(a.Key, b.Key)
		})
		next.Entries = next.Entries[:cfg.MaxKeys]
	}
	slices.SortFunc(next.Entries, func(a, b OverflowEntry) int { return strings.Compare(a.Key, b.Key) })
	if !slices.Equal(prev.Keys(), next.Keys()) {
		next.Version++
	}
	return next, nil
}
