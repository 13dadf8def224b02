package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/keyshard/keyshard/placement"
)

// ShardsCase is the shuffle-shard part of `keyshard bench placement`:
// 100,000 tenants over 200 members in 3 zones.
type ShardsCase struct {
	Tenants int `json:"tenants"`
	Members int `json:"members"`
	Zones   int `json:"zones"`
	// RecomputeMs is a full computation from nothing, MemberLeaveMs one
	// member leaving a stable plan (medians).
	RecomputeMs   float64 `json:"recompute_ms"`
	MemberLeaveMs float64 `json:"member_leave_ms"`
	// LeaveChanged is how many tenants the leave changed, each by one
	// member; LeaveHolders how many had the member.
	LeaveChanged int `json:"leave_changed"`
	LeaveHolders int `json:"leave_holders"`
	// MaxOverMean is the most loaded member over its share, from nothing.
	MaxOverMean float64 `json:"max_over_mean"`
	// Overlap of tenant subsets against random subsets of the same sizes.
	OverlapMean        float64 `json:"overlap_mean"`
	OverlapRandomMean  float64 `json:"overlap_random_mean"`
	OverlapTailPct     float64 `json:"overlap_above_random_p99_pct"`
	OverlapRandomTailP float64 `json:"overlap_random_above_p99_pct"`
}

// shardPool returns n members of weight 1 spread round-robin over zones,
// and tenants with Zipf(0.8) loads and sizes 1..16 skewed to small, the
// heaviest tenants largest, as a load-derived size policy gives.
func shardPool(members, zones, tenants int) ([]placement.Member, []placement.Tenant) {
	ms := make([]placement.Member, members)
	for i := range ms {
		ms[i] = placement.Member{ID: fmt.Sprintf("m%03d", i), Weight: 1, Zone: fmt.Sprintf("z%d", i%zones)}
	}
	r := rand.New(rand.NewPCG(1, 0x5eed))
	rank := r.Perm(tenants)
	ts := make([]placement.Tenant, tenants)
	for i := range ts {
		size := 1 + int(15*math.Pow(r.Float64(), 3))
		if rank[i] < tenants/1000+3 {
			size = 16
		}
		ts[i] = placement.Tenant{ID: fmt.Sprintf("tenant-%06d", i), Size: size, Load: 1000 / math.Pow(float64(rank[i]+1), 0.8)}
	}
	return ms, ts
}

// Shards measures shuffle sharding of 100,000 tenants over 200 members.
func Shards(ctx context.Context, runs int, progress io.Writer) (ShardsCase, error) {
	c := ShardsCase{Tenants: 100_000, Members: 200, Zones: 3}
	ms, ts := shardPool(c.Members, c.Zones, c.Tenants)
	var plan placement.ShardPlan
	var err error
	c.RecomputeMs = median(runs, func() float64 {
		start := time.Now()
		plan, err = placement.Shards(nil, ms, ts, placement.ShardOptions{})
		return float64(time.Since(start).Microseconds()) / 1e3
	})
	if err != nil {
		return c, err
	}
	c.MaxOverMean = plan.MaxOverMean
	fmt.Fprintf(progress, "shards: %d tenants over %d members from nothing in %.0f ms, max/mean %.3f\n", c.Tenants, c.Members, c.RecomputeMs, c.MaxOverMean)
	if err := ctx.Err(); err != nil {
		return c, err
	}
	left := slices.Delete(slices.Clone(ms), 77, 78)
	var after placement.ShardPlan
	c.MemberLeaveMs = median(runs, func() float64 {
		start := time.Now()
		after, err = placement.Shards(plan.Subsets, left, ts, placement.ShardOptions{})
		return float64(time.Since(start).Microseconds()) / 1e3
	})
	if err != nil {
		return c, err
	}
	c.LeaveChanged = len(after.Changes)
	for _, sub := range plan.Subsets {
		if slices.Contains(sub, ms[77].ID) {
			c.LeaveHolders++
		}
	}
	fmt.Fprintf(progress, "shards: one member leaving in %.1f ms, %d tenants changed (%d had it)\n", c.MemberLeaveMs, c.LeaveChanged, c.LeaveHolders)
	r := placement.Overlap(plan.Subsets, len(ms), 0)
	c.OverlapMean, c.OverlapRandomMean = r.ObservedMean, r.ExpectedMean
	c.OverlapTailPct, c.OverlapRandomTailP = 100*r.ObservedTail, 100*r.ExpectedTail
	fmt.Fprintf(progress, "shards: pairwise overlap mean %.4f (random %.4f), above random p99 %.3f%% (random %.3f%%)\n", c.OverlapMean, c.OverlapRandomMean, c.OverlapTailPct, c.OverlapRandomTailP)
	return c, nil
}
