package placement

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// Member is one live process that can own buckets or serve tenants.
type Member struct {
	// ID names the member; it must be non-empty and unique in one call.
	ID string
	// Weight scales the member's share. Zero means draining: the member
	// keeps nothing it can hand over and receives nothing new.
	Weight float64
	// Zone is an availability zone (or rack). The bucket balancer carries it
	// along; shuffle sharding spreads each tenant's members over zones.
	Zone string
}

// ErrInvalid is wrapped by every error that reports bad input to this
// package: an empty or duplicate member ID, a negative or non-finite weight,
// a bucket count out of range, and so on. Branch on it with errors.Is.
var ErrInvalid = errors.New("placement: invalid input")

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// sortedMembers validates members and returns a copy sorted by ID, so that
// every algorithm here is independent of the caller's order.
func sortedMembers(members []Member) ([]Member, error) {
	out := slices.Clone(members)
	slices.SortFunc(out, func(a, b Member) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	for i, m := range out {
		if m.ID == "" {
			return nil, invalidf("member %d has an empty ID", i)
		}
		if i > 0 && out[i-1].ID == m.ID {
			return nil, invalidf("member ID %q appears twice", m.ID)
		}
		if math.IsNaN(m.Weight) || math.IsInf(m.Weight, 0) || m.Weight < 0 {
			return nil, invalidf("member %q has weight %v; want a finite number >= 0", m.ID, m.Weight)
		}
	}
	return out, nil
}
