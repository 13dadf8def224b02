package tenantpool

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"time"

	"github.com/keyshard/keyshard/placement"
)

// ErrInvalid is wrapped by every error that reports bad input to this
// package: a bad policy value, a bad report, bad members. Branch on it with
// errors.Is; errors.As with *FieldError gives the field.
var ErrInvalid = errors.New("tenantpool: invalid input")

// FieldError is a refused input, naming the field at fault, such as
// "CapacityPerMember", `Overrides["t1"].Size` or "Counts[3].Count". It
// wraps ErrInvalid.
type FieldError struct {
	Field  string
	Reason string // for example "is -1; want a finite number > 0"
}

func (e *FieldError) Error() string { return ErrInvalid.Error() + ": " + e.Field + " " + e.Reason }

// Unwrap returns ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }

func invalidf(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Policy says how a pool sizes and places its tenants. The zero value is
// not valid: CapacityPerMember is required.
type Policy struct {
	// CapacityPerMember is the rate (requests/s) one member serves for one
	// tenant. Required, finite and > 0.
	CapacityPerMember float64
	// Headroom multiplies the rate before sizing: 1.25 keeps 20% spare.
	// 0 means 1.
	Headroom float64
	// MinSize and MaxSize clamp every tenant's size. MinSize 0 means 1;
	// MaxSize 0 means no bound but the pool. With ZoneAware they are
	// rounded to multiples of the number of zones as placement.NextSize
	// does.
	MinSize, MaxSize int
	// ShrinkCooldown is how long a smaller size must be wanted before a
	// shrink, and the wait between two shrink steps. Keep it at least as
	// long as the aggregation window, so that a new leader, whose window
	// starts empty, cannot shrink anyone before it has measured.
	ShrinkCooldown time.Duration
	// MaxShrinkStep bounds one shrink step, in members; 0 means one member
	// per zone.
	MaxShrinkStep int
	// Lookback is how long a member removed from a tenant's subset stays a
	// read target of that tenant (it still holds the tenant's data).
	Lookback time.Duration
	// WarmUp is how long a member added to a tenant's subset waits before
	// it becomes a read target if it has not reported ready for the tenant
	// first. 0 makes new members read targets at once.
	WarmUp time.Duration
	// ZoneAware spreads each tenant over the members' zones and makes every
	// size a multiple of the number of zones. Off, zones are ignored.
	ZoneAware bool
	// Overrides are per-tenant exceptions, by tenant ID.
	Overrides map[string]Override
	// Tolerance is the balance tolerance passed to placement.Shards
	// (0 means placement.DefaultTolerance).
	Tolerance float64
	// RebalanceMoves bounds the member swaps one round makes only to
	// rebalance (placement.ShardOptions.MaxRebalanceMoves); 0 never moves
	// a tenant only for balance.
	RebalanceMoves int
	// ForgetAfter drops a tenant from the state once no rate was reported
	// for it for this long; it then gets the stateless fallback subset
	// again. 0 keeps tenants forever.
	ForgetAfter time.Duration
}

// Override is a per-tenant exception to a Policy.
type Override struct {
	// Size, if > 0, fixes the tenant's size, whatever its load; it applies
	// at once, with no cooldown, and is not rounded to the zones.
	Size int
	// MinSize and MaxSize, if > 0, replace the policy's bounds for this
	// tenant. They cannot be combined with Size.
	MinSize, MaxSize int
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// Validate returns nil or a *FieldError (wrapping ErrInvalid) naming the
// first bad field.
func (p Policy) Validate() error {
	switch {
	case !finite(p.CapacityPerMember) || p.CapacityPerMember <= 0:
		return invalidf("CapacityPerMember", "is %v; want a finite number > 0", p.CapacityPerMember)
	case !finite(p.Headroom) || p.Headroom < 0:
		return invalidf("Headroom", "is %v; want a finite number > 0 (or 0 for 1)", p.Headroom)
	case p.MinSize < 0:
		return invalidf("MinSize", "is %d; want >= 0", p.MinSize)
	case p.MaxSize < 0:
		return invalidf("MaxSize", "is %d; want >= 0 (0 = no bound)", p.MaxSize)
	case p.MaxSize > 0 && p.MaxSize < p.MinSize:
		return invalidf("MaxSize", "%d is below MinSize %d", p.MaxSize, p.MinSize)
	case p.ShrinkCooldown < 0:
		return invalidf("ShrinkCooldown", "is %v; want >= 0", p.ShrinkCooldown)
	case p.MaxShrinkStep < 0:
		return invalidf("MaxShrinkStep", "is %d; want >= 0", p.MaxShrinkStep)
	case p.Lookback < 0:
		return invalidf("Lookback", "is %v; want >= 0", p.Lookback)
	case p.WarmUp < 0:
		return invalidf("WarmUp", "is %v; want >= 0", p.WarmUp)
	case !finite(p.Tolerance) || p.Tolerance < 0:
		return invalidf("Tolerance", "is %v; want a finite number > 0 (or 0 for the default)", p.Tolerance)
	case p.RebalanceMoves < 0:
		return invalidf("RebalanceMoves", "is %d; want >= 0", p.RebalanceMoves)
	case p.ForgetAfter < 0:
		return invalidf("ForgetAfter", "is %v; want >= 0 (0 = never)", p.ForgetAfter)
	}
	for _, id := range sortedKeys(p.Overrides) {
		o := p.Overrides[id]
		f := func(name string) string { return fmt.Sprintf("Overrides[%q].%s", id, name) }
		lo, hi := p.bounds(id)
		switch {
		case id == "":
			return invalidf(`Overrides[""]`, "has an empty tenant ID")
		case o.Size < 0:
			return invalidf(f("Size"), "is %d; want >= 0 (0 = not fixed)", o.Size)
		case o.MinSize < 0:
			return invalidf(f("MinSize"), "is %d; want >= 0", o.MinSize)
		case o.MaxSize < 0:
			return invalidf(f("MaxSize"), "is %d; want >= 0", o.MaxSize)
		case o.Size > 0 && (o.MinSize > 0 || o.MaxSize > 0):
			return invalidf(f("Size"), "is %d; a fixed size cannot be combined with MinSize or MaxSize", o.Size)
		case hi > 0 && hi < lo:
			return invalidf(f("MaxSize"), "makes the tenant's maximum %d below its minimum %d", hi, lo)
		}
	}
	return nil
}

// bounds returns the tenant's min and max size, overrides applied.
func (p Policy) bounds(tenant string) (lo, hi int) {
	lo, hi = p.MinSize, p.MaxSize
	if o, ok := p.Overrides[tenant]; ok {
		if o.MinSize > 0 {
			lo = o.MinSize
		}
		if o.MaxSize > 0 {
			hi = o.MaxSize
		}
	}
	return lo, hi
}

// fixed returns the tenant's fixed size, 0 if it has none.
func (p Policy) fixed(tenant string) int { return p.Overrides[tenant].Size }

// SizePolicy returns the placement.SizePolicy for one tenant in a pool with
// the given number of zones (ignored unless ZoneAware), its override
// applied. For a fixed size it returns Min = Max = Size over one zone with
// no cooldown; Plan applies a fixed size directly rather than through
// NextSize, so that it wins at once.
func (p Policy) SizePolicy(tenant string, zones int) placement.SizePolicy {
	if !p.ZoneAware || zones < 1 {
		zones = 1
	}
	if n := p.fixed(tenant); n > 0 {
		return placement.SizePolicy{CapacityPerMember: p.CapacityPerMember, Headroom: p.Headroom, Min: n, Max: n, Zones: 1, MaxShrinkStep: n}
	}
	lo, hi := p.bounds(tenant)
	return placement.SizePolicy{
		CapacityPerMember: p.CapacityPerMember,
		Headroom:          p.Headroom,
		Min:               lo,
		Max:               hi,
		Zones:             zones,
		ShrinkCooldown:    p.ShrinkCooldown,
		MaxShrinkStep:     p.MaxShrinkStep,
	}
}

// initialSize is the size of a tenant nothing was measured for: its fixed
// size, or its minimum as NextSize rounds it. Both Plan (to seed a new
// tenant) and Snapshot (for an unknown tenant) use it, so they agree.
func (p Policy) initialSize(tenant string, zones int) int {
	if n := p.fixed(tenant); n > 0 {
		return n
	}
	sp := p.SizePolicy(tenant, zones)
	z := max(sp.Zones, 1)
	lo := (max(sp.Min, 1) + z - 1) / z * z
	if sp.Max > 0 {
		lo = min(lo, max(sp.Max/z*z, z))
	}
	return lo
}

// equal reports whether two policies are the same.
func (p Policy) equal(q Policy) bool {
	po, qo := p.Overrides, q.Overrides
	p.Overrides, q.Overrides = nil, nil
	return reflect.DeepEqual(p, q) && maps.Equal(po, qo)
}

// sortedKeys returns m's keys in order, so that every loop over a map here
// is deterministic.
func sortedKeys[M ~map[K]V, K cmp.Ordered, V any](m M) []K {
	return slices.Sorted(maps.Keys(m))
}
