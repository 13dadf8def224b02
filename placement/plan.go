package placement

import (
	"math"
	"slices"
)

// MoveReason says why a bucket changed owner.
type MoveReason string

// Move reasons.
const (
	// ReasonOrphaned: the bucket was unassigned, or its owner is no longer a
	// member.
	ReasonOrphaned MoveReason = "orphaned"
	// ReasonDraining: the owner has weight 0.
	ReasonDraining MoveReason = "draining"
	// ReasonOverTarget: the owner held more than its target count.
	ReasonOverTarget MoveReason = "over-target"
	// ReasonLoad: the load-aware balancer moved the bucket from a member
	// above the tolerance band towards one below it.
	ReasonLoad MoveReason = "load"
	// ReasonNoMember: no member can take the bucket (no member has a
	// positive weight), so it became unassigned.
	ReasonNoMember MoveReason = "no-member"
)

// Move is one bucket changing owner. From is "" for a bucket that was
// unassigned; To is "" for a bucket that becomes unassigned.
type Move struct {
	Bucket int
	From   string
	To     string
	Reason MoveReason
}

// Plan is the result of Balance: the new assignment, every move that leads
// to it (sorted by bucket) and each member's target count.
type Plan struct {
	Assignment Assignment
	Moves      []Move
	// Targets is each member's bucket count in Assignment, which is
	// ⌊share⌋ or ⌈share⌉ of its weighted share B·weight/Σweights.
	Targets map[string]int
}

// Balance computes a new assignment for the live members from the current
// one, moving as few buckets as possible.
//
// Every member with a positive weight ends with ⌊share⌋ or ⌈share⌉ buckets,
// where share = B·weight/Σweights (with equal weights, max − min ≤ 1). The
// buckets that move are exactly the orphaned ones (owner gone or unassigned)
// plus each over-target member's excess, which is the minimum that reaches
// such a balance; a bucket never moves between two members that are both
// within target. Where ⌈share⌉ can go to several members, it goes first to
// those that already hold more than ⌊share⌋, since that saves a move.
//
// The result depends only on the set of (bucket, owner) pairs and members,
// never on their order. Several joins and leaves at once give the minimal
// plan for the combined change. Members with weight 0 (draining) give up
// all their buckets; if no member has a positive weight, members keep what
// they hold and orphaned buckets become unassigned (ReasonNoMember).
//
// Balance returns an error wrapping ErrInvalid if cur or members are
// malformed. cur is not modified.
func Balance(cur Assignment, members []Member) (Plan, error) {
	if err := cur.Validate(); err != nil {
		return Plan{}, err
	}
	ms, err := sortedMembers(members)
	if err != nil {
		return Plan{}, err
	}
	n := len(ms)
	buckets := len(cur.Owners)

	// Map the input's member indexes onto the sorted live members.
	live := make(map[string]int32, n)
	for i, m := range ms {
		live[m.ID] = int32(i)
	}
	remap := make([]int32, len(cur.Members))
	for j, id := range cur.Members {
		if i, ok := live[id]; ok {
			remap[j] = i
		} else {
			remap[j] = Unassigned
		}
	}
	owners := make([]int32, buckets)
	counts := make([]int, n)
	for b, o := range cur.Owners {
		if o != Unassigned {
			o = remap[o]
		}
		owners[b] = o
		if o != Unassigned {
			counts[o]++
		}
	}

	targets, ok := bucketTargets(buckets, ms, counts)
	ids := make([]string, n)
	for i, m := range ms {
		ids[i] = m.ID
	}
	plan := Plan{
		Assignment: Assignment{Members: ids, Owners: owners},
		Targets:    make(map[string]int, n),
	}
	from := func(b int) string {
		if o := cur.Owners[b]; o != Unassigned {
			return cur.Members[o]
		}
		return ""
	}
	if !ok {
		// No member can take buckets: keep what members hold.
		for b, o := range owners {
			if o == Unassigned && cur.Owners[b] != Unassigned {
				plan.Moves = append(plan.Moves, Move{Bucket: b, From: from(b), Reason: ReasonNoMember})
			}
		}
		for i, id := range ids {
			plan.Targets[id] = counts[i]
		}
		return plan, nil
	}

	// Collect the buckets that must move: orphans in bucket order, and each
	// over-target member's excess, taken from its highest buckets.
	excess := make([]int, n)
	pool := 0
	for i := range ms {
		if counts[i] > targets[i] {
			excess[i] = counts[i] - targets[i]
			pool += excess[i]
		}
	}
	moving := make([]int, 0, pool+64)
	for b := buckets - 1; b >= 0; b-- {
		o := owners[b]
		if o == Unassigned {
			moving = append(moving, b)
		} else if excess[o] > 0 {
			excess[o]--
			moving = append(moving, b)
		}
	}
	slices.Sort(moving)

	// Hand them to the members below target, in member order.
	next := 0
	plan.Moves = make([]Move, 0, len(moving))
	for i := range ms {
		for need := targets[i] - counts[i]; need > 0; need-- {
			b := moving[next]
			next++
			reason := ReasonOverTarget
			switch o := owners[b]; {
			case o == Unassigned:
				reason = ReasonOrphaned
			case ms[o].Weight == 0:
				reason = ReasonDraining
			}
			plan.Moves = append(plan.Moves, Move{Bucket: b, From: from(b), To: ids[i], Reason: reason})
			owners[b] = int32(i)
		}
	}
	slices.SortFunc(plan.Moves, func(x, y Move) int { return x.Bucket - y.Bucket })
	for i, id := range ids {
		plan.Targets[id] = targets[i]
	}
	return plan, nil
}

// bucketTargets returns each member's target count: ⌊share⌋ plus one for
// the members that receive the remainder. It returns false if no member has
// a positive weight.
func bucketTargets(buckets int, ms []Member, counts []int) ([]int, bool) {
	var total float64
	for _, m := range ms {
		total += m.Weight
	}
	if total == 0 || len(ms) == 0 {
		return nil, false
	}
	targets := make([]int, len(ms))
	frac := make([]float64, len(ms))
	sum := 0
	for i, m := range ms {
		// A share a rounding error below a whole number is that number
		// (276 buckets × 3 / 7.2 is 114.99999999999999, not 115), as
		// MinMoves counts it.
		share := float64(buckets) * (m.Weight / total)
		f := math.Floor(share + 1e-9)
		targets[i] = int(f)
		frac[i] = max(share-f, 0)
		sum += targets[i]
	}
	// order ranks the candidates for the remainder: holding more than
	// ⌊share⌋ already (one move saved), then the larger fraction, then ID.
	order := make([]int, 0, len(ms))
	for i, m := range ms {
		if m.Weight > 0 {
			order = append(order, i)
		}
	}
	const tiny = 1e-9 // a fraction below this is rounding noise
	slices.SortStableFunc(order, func(x, y int) int {
		ex, ey := frac[x] > tiny, frac[y] > tiny
		if ex != ey {
			if ex {
				return -1
			}
			return 1
		}
		kx, ky := counts[x] > targets[x], counts[y] > targets[y]
		if kx != ky {
			if kx {
				return -1
			}
			return 1
		}
		if frac[x] != frac[y] {
			if frac[x] > frac[y] {
				return -1
			}
			return 1
		}
		return x - y
	})
	// Floating-point rounding can leave the floors off by a bucket or two
	// either way; the loops below absorb it.
	for rest := buckets - sum; rest != 0; {
		for _, i := range order {
			if rest > 0 {
				targets[i]++
				rest--
			} else if rest < 0 && targets[i] > 0 {
				targets[i]--
				rest++
			}
			if rest == 0 {
				break
			}
		}
	}
	return targets, true
}

// MinMoves returns the fewest buckets any plan can move to take cur to a
// balanced assignment over members (each member with a positive weight
// holding ⌊share⌋ or ⌈share⌉). It is computed from that definition, not by
// planning: a member keeps at most min(held, target) buckets, and the
// ⌈share⌉ slots go best to members already holding more than ⌊share⌋.
// Balance always moves exactly this many; tools use it to check a recorded
// history against the optimum. If no member has a positive weight it
// returns the number of assigned buckets whose owner is not a member.
func MinMoves(cur Assignment, members []Member) (int, error) {
	if err := cur.Validate(); err != nil {
		return 0, err
	}
	ms, err := sortedMembers(members)
	if err != nil {
		return 0, err
	}
	held := cur.Counts()
	var total float64
	for _, m := range ms {
		total += m.Weight
	}
	buckets := cur.Buckets()
	if total == 0 {
		gone := 0
		live := map[string]bool{}
		for _, m := range ms {
			live[m.ID] = true
		}
		for id, n := range held {
			if !live[id] {
				gone += n
			}
		}
		return gone, nil
	}
	kept, floors, canUseCeil := 0, 0, 0
	for _, m := range ms {
		share := float64(buckets) * (m.Weight / total)
		f := int(math.Floor(share + 1e-9))
		floors += f
		kept += min(held[m.ID], f)
		if share-float64(f) > 1e-9 && held[m.ID] > f {
			canUseCeil++
		}
	}
	kept += min(buckets-floors, canUseCeil)
	return buckets - kept, nil
}
