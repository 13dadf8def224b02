package placement

import (
	"fmt"
	"math"
	"slices"
)

// LoadOptions tunes BalanceLoad.
type LoadOptions struct {
	// Tolerance is how far above or below its target load a member may be,
	// as a fraction of the target: 0.1 accepts 90%..110%. Default 0.1.
	Tolerance float64
	// MaxMoves bounds the buckets moved for load in one call (one round);
	// orphaned buckets are always placed and do not count against it.
	// Default 64; a negative value means no bound (the loop ends anyway:
	// every move lowers the sum of squared deviations).
	MaxMoves int
}

// LoadMove is one bucket that BalanceLoad moved, with the evidence.
type LoadMove struct {
	Move
	// Load is the bucket's measured load.
	Load float64
	// Why reads like "load: m1 at 1.32× target → m4 at 0.81× target".
	Why string
}

// StopReason says why BalanceLoad stopped moving buckets.
type StopReason string

// Stop reasons.
const (
	StopBalanced   StopReason = "balanced"     // every member within tolerance
	StopBudget     StopReason = "budget-spent" // MaxMoves reached
	StopNoProgress StopReason = "no-progress"  // no single move narrows the worst gap
	StopNoMembers  StopReason = "no-members"   // no member has a positive weight
)

// LoadPlan is the result of BalanceLoad.
type LoadPlan struct {
	Assignment Assignment
	Moves      []LoadMove // in the order they were chosen
	// Before and After are the imbalance, max over members of
	// load / target load (1.0 is perfect), before and after the moves.
	// Orphaned buckets count towards neither side's member loads in Before.
	Before, After float64
	// MemberLoad is each member's load after the moves.
	MemberLoad map[string]float64
	Stopped    StopReason
}

// BalanceLoad moves buckets from the most to the least loaded members,
// measured by load (one value per bucket, ≥ 0), until every member with a
// positive weight is within opts.Tolerance of its target load
// (total·weight/Σweights), or opts.MaxMoves buckets have moved, or no
// single bucket move can narrow the gap. Each step pairs the member
// furthest above its target with the one furthest below and moves the
// donor's bucket that leaves the pair closest to their targets, so every
// moved bucket buys as much balance as one bucket can.
//
// Orphaned buckets (unassigned, owner gone, or owner draining with weight
// 0) are placed first, heaviest first, each on the member then furthest
// below its target; they are not limited by MaxMoves. Unlike Balance,
// BalanceLoad does not keep bucket counts equal: it trades count balance
// for load balance. It is deterministic, like Balance.
//
// It returns an error wrapping ErrInvalid if cur, members or load are
// malformed (len(load) must equal the bucket count; loads finite, ≥ 0).
func BalanceLoad(cur Assignment, members []Member, load []float64, opts LoadOptions) (plan LoadPlan, err error) {
	if err := cur.Validate(); err != nil {
		return LoadPlan{}, err
	}
	ms, err := sortedMembers(members)
	if err != nil {
		return LoadPlan{}, err
	}
	if len(load) != len(cur.Owners) {
		return LoadPlan{}, invalidf("load has %d values for %d buckets", len(load), len(cur.Owners))
	}
	var total float64
	for b, l := range load {
		if math.IsNaN(l) || math.IsInf(l, 0) || l < 0 {
			return LoadPlan{}, invalidf("load of bucket %d is %v; want a finite number >= 0", b, l)
		}
		total += l
	}
	if math.IsInf(total, 0) {
		return LoadPlan{}, invalidf("total load overflows float64")
	}
	if opts.Tolerance == 0 {
		opts.Tolerance = 0.1
	}
	if math.IsNaN(opts.Tolerance) || opts.Tolerance < 0 {
		return LoadPlan{}, invalidf("tolerance %v; want a number >= 0", opts.Tolerance)
	}
	switch {
	case opts.MaxMoves == 0:
		opts.MaxMoves = 64
	case opts.MaxMoves < 0:
		// Each move lowers the sum of squared deviations, so this is only
		// a backstop against floating-point ties.
		opts.MaxMoves = 4*len(load) + 64
	}

	n := len(ms)
	ids := make([]string, n)
	live := make(map[string]int32, n)
	var weights float64
	for i, m := range ms {
		ids[i] = m.ID
		live[m.ID] = int32(i)
		weights += m.Weight
	}
	owners := make([]int32, len(cur.Owners))
	loads := make([]float64, n)
	var orphans []int
	for b, o := range cur.Owners {
		owners[b] = Unassigned
		if o != Unassigned {
			if i, ok := live[cur.Members[o]]; ok {
				owners[b] = i
				loads[i] += load[b]
			}
		}
	}
	target := make([]float64, n)
	for i, m := range ms {
		if weights > 0 {
			target[i] = total * m.Weight / weights
		}
	}
	plan = LoadPlan{Assignment: Assignment{Members: ids, Owners: owners}}
	ratio := func(i int) float64 {
		switch {
		case target[i] > 0:
			return loads[i] / target[i]
		case loads[i] > 0:
			return math.Inf(1)
		}
		return 1
	}
	imbalance := func() float64 {
		worst := 0.0
		for i := range ms {
			if ms[i].Weight > 0 || loads[i] > 0 {
				worst = math.Max(worst, ratio(i))
			}
		}
		return worst
	}
	plan.Before = imbalance()
	from := func(b int) string {
		if o := cur.Owners[b]; o != Unassigned {
			return cur.Members[o]
		}
		return ""
	}
	record := func(b int, to int32, reason MoveReason, why string) {
		if o := owners[b]; o != Unassigned {
			loads[o] -= load[b]
		}
		owners[b] = to
		loads[to] += load[b]
		plan.Moves = append(plan.Moves, LoadMove{
			Move: Move{Bucket: b, From: from(b), To: ids[to], Reason: reason},
			Load: load[b],
			Why:  why,
		})
	}
	defer func() { // fills in the figures on every return below
		plan.MemberLoad = make(map[string]float64, n)
		for i, id := range ids {
			plan.MemberLoad[id] = loads[i]
		}
		plan.After = imbalance()
	}()
	if weights == 0 {
		plan.Stopped = StopNoMembers
		return plan, nil
	}

	// Orphans first: heaviest on the member furthest below target.
	for b, o := range owners {
		if o == Unassigned || ms[o].Weight == 0 {
			orphans = append(orphans, b)
		}
	}
	slices.SortStableFunc(orphans, func(x, y int) int {
		if load[x] != load[y] {
			if load[x] > load[y] {
				return -1
			}
			return 1
		}
		return x - y
	})
	for _, b := range orphans {
		to := lowest(ms, loads, target)
		reason, what := ReasonOrphaned, "no live owner"
		if o := owners[b]; o != Unassigned {
			reason, what = ReasonDraining, ids[o]+" is draining"
		}
		record(b, int32(to), reason, fmt.Sprintf("%s: %s → %s at %.2f× target", reason, what, ids[to], ratio(to)))
	}

	// Then move for load, within the budget.
	for moved := 0; ; moved++ {
		d, r := highest(ms, loads, target), lowest(ms, loads, target)
		if ratio(d) <= 1+opts.Tolerance && ratio(r) >= 1-opts.Tolerance {
			plan.Stopped = StopBalanced
			return plan, nil
		}
		if moved >= opts.MaxMoves {
			plan.Stopped = StopBudget
			return plan, nil
		}
		b := bestBucket(owners, load, int32(d), loads[d]-target[d], target[r]-loads[r], target[d], target[r])
		if b < 0 {
			plan.Stopped = StopNoProgress
			return plan, nil
		}
		why := fmt.Sprintf("load: %s at %.2f× target → %s at %.2f× target", ids[d], ratio(d), ids[r], ratio(r))
		record(b, int32(r), ReasonLoad, why)
	}
}

// highest returns the positive-weight member furthest above its target
// (relative), ties to the lower index.
func highest(ms []Member, loads, target []float64) int {
	best, bestGap := -1, math.Inf(-1)
	for i := range ms {
		if ms[i].Weight == 0 {
			continue
		}
		if g := (loads[i] - target[i]) / target[i]; g > bestGap || best < 0 {
			best, bestGap = i, g
		}
	}
	return best
}

// lowest returns the positive-weight member furthest below its target.
func lowest(ms []Member, loads, target []float64) int {
	best, bestGap := -1, math.Inf(1)
	for i := range ms {
		if ms[i].Weight == 0 {
			continue
		}
		if g := (loads[i] - target[i]) / target[i]; g < bestGap || best < 0 {
			best, bestGap = i, g
		}
	}
	return best
}

// bestBucket returns the bucket of donor d whose move to the recipient
// minimises the larger relative deviation of the pair, or -1 if no move
// makes it smaller than now. excess is the donor's load above target,
// deficit the recipient's below. A move may not lift the recipient above
// the donor's current ratio nor drop the donor below the recipient's, so
// the worst member never gets worse and the sum of squared deviations
// falls with every move: the loop ends even without a budget.
func bestBucket(owners []int32, load []float64, d int32, excess, deficit, td, tr float64) int {
	worst := func(x float64) float64 {
		return math.Max(math.Abs(excess-x)/td, math.Abs(x-deficit)/tr)
	}
	now := worst(0)
	best, bestScore := -1, now
	for b, o := range owners {
		x := load[b]
		if o != d || x == 0 || (x-deficit)/tr > excess/td || (x-excess)/td > deficit/tr {
			continue
		}
		if s := worst(x); s < bestScore-1e-12 {
			best, bestScore = b, s
		}
	}
	return best
}
