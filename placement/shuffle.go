package placement

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Tenant is one tenant of a shuffle-sharded pool, as input to [Shards].
type Tenant struct {
	// ID names the tenant; it must be non-empty and unique in one call.
	ID string
	// Size is the number of members the tenant wants, typically computed
	// from its load and never from the size of the pool. Zero gives it no
	// members. A size above the number of members with positive weight is
	// clamped to that number.
	Size int
	// Load is the tenant's load (requests per second, bytes, any unit shared
	// by all tenants), spread evenly over its members. It must be finite and
	// >= 0.
	Load float64
}

// DefaultTolerance is the load tolerance [Shards] uses when
// [ShardOptions.Tolerance] is zero.
const DefaultTolerance = 0.1

// ShardOptions tunes [Shards]. The zero value is ready to use.
type ShardOptions struct {
	// Tolerance is the allowed relative deviation of a member's load from
	// its weighted share of the total: 0.1 aims to keep every member
	// within ±10% of its share. Zero means DefaultTolerance; it must
	// otherwise be a finite number > 0.
	Tolerance float64
	// MaxRebalanceMoves bounds the member swaps that Shards may make only to
	// improve the plan, for instance to give load to members that were just
	// added to the pool or to restore the zone spread after a zone was
	// added. Each swap replaces one member in one tenant's subset. Zero never
	// moves a tenant just to rebalance; it must not be negative.
	MaxRebalanceMoves int
}

// ShardChange says how one tenant's subset differs from the previous one.
type ShardChange struct {
	Tenant string
	// Added and Removed are member IDs, sorted.
	Added, Removed []string
	// Reason is a human-readable explanation, such as
	// "size 3->5", "member m7 left", "member m2 draining",
	// "size 20 clamped to 12 eligible members", "new tenant",
	// "tenant removed", "zone spread" or "rebalance", joined by "; ".
	Reason string
}

// ShardPlan is the result of [Shards].
type ShardPlan struct {
	// Subsets maps every tenant passed to Shards (and no other) to its
	// members, sorted by ID. A tenant of size 0 maps to an empty slice.
	Subsets map[string][]string
	// Changes lists the tenants whose subset differs from the previous one,
	// including dropped tenants, sorted by tenant ID.
	Changes []ShardChange
	// MemberLoad is, for every member, the sum over the tenants it serves of
	// Load/len(subset). Draining members carry 0.
	MemberLoad map[string]float64
	// MaxOverMean is the largest ratio of a member's load to its weighted
	// share of the total load (total × weight / total weight); 1 is perfect
	// balance, and 0 means there is no load.
	MaxOverMean float64
	// RebalanceMoves is the number of swaps made only to rebalance, at most
	// ShardOptions.MaxRebalanceMoves.
	RebalanceMoves int
}

// Shards computes sticky, balanced shuffle shards for a pool of tenants: which
// members serve each tenant. prev holds the previous subsets (nil or empty
// the first time); members are the live members; tenants give each tenant's
// target size and load. Shards is a pure function: it does not modify its
// arguments, and the same arguments give the same plan whatever the order of
// members and tenants.
//
// The plan keeps these promises:
//
//   - Every tenant gets exactly min(Size, E) distinct members, E being the
//     number of members with positive weight.
//   - Sticky: a tenant keeps every previous member that is still live with
//     positive weight, unless its size shrinks. A size change of Δ adds or
//     removes exactly |Δ| members. A member that left (or was set to weight
//     0) is replaced in exactly the tenants that had it, by one member each
//     (none if the pool became smaller than the tenant's size). Adding
//     members to the pool changes no subset, except that tenants clamped to
//     a pool smaller than their size grow toward it. Tenants in prev but not
//     in tenants are dropped. Beyond that, only rebalance swaps change
//     subsets, at most MaxRebalanceMoves of them, each in a tenant that
//     changed for no other reason in the same call.
//   - Zone spread: no member is ever added to a zone that already holds the
//     tenant's share of ⌈size/zones⌉ members (more only when other zones are
//     too small to hold the rest), and shrinking removes members from
//     over-full zones first. A subset that became over-full because the
//     number of zones grew (or a member changed zone) is left as it is,
//     since adding members moves nothing, and is the first thing rebalance
//     swaps repair.
//   - Balance: a member joining a tenant is chosen among the members whose
//     load relative to weight, counting the new tenant, is within
//     Tolerance/2 of the least loaded. Tenants with the fewest members to
//     choose from are filled first, then those with the biggest load per
//     member. When no tenant's load per member is large compared to the
//     tolerance times a member's share, every member ends within Tolerance
//     of its weighted share; MaxOverMean reports how close the plan came.
//     Rebalance swaps move tenants from the most to the least loaded members
//     while either is outside the tolerance, each swap lowering the sum over
//     members of load²/weight.
//   - Low overlap: the choice within the tolerance band goes by a per-tenant
//     hash of the member IDs, so the subsets of different tenants overlap
//     about as much as random subsets of the same sizes would; see
//     [Overlap].
//
// The work is proportional to the number of tenants times their sizes, plus
// the number of members for each member added to a subset; a call in which
// one member of a large pool left is dominated by reading prev and building
// the result maps.
//
// Shards returns an error wrapping [ErrInvalid], naming the tenant and the
// field, for an empty or duplicate tenant ID, a negative size, a load that is
// negative or not finite, invalid options, or invalid members (see
// [Member]). It never panics. Members in prev that are unknown count as
// departed; duplicates in a previous subset count once.
func Shards(prev map[string][]string, members []Member, tenants []Tenant, opts ShardOptions) (ShardPlan, error) {
	tol, err := opts.tolerance()
	if err != nil {
		return ShardPlan{}, err
	}
	ms, err := sortedMembers(members)
	if err != nil {
		return ShardPlan{}, err
	}
	ts, err := sortedTenants(tenants)
	if err != nil {
		return ShardPlan{}, err
	}
	st := newShardState(ms, ts, tol)
	st.readPrev(prev)
	st.place(opts)
	return st.plan(prev), nil
}

// tolerance validates the options and returns the tolerance in force.
func (opts ShardOptions) tolerance() (float64, error) {
	tol := opts.Tolerance
	if tol == 0 {
		tol = DefaultTolerance
	}
	if math.IsNaN(tol) || math.IsInf(tol, 0) || tol < 0 {
		return 0, invalidf("tolerance %v; want a finite number > 0", opts.Tolerance)
	}
	if opts.MaxRebalanceMoves < 0 {
		return 0, invalidf("max rebalance moves %d is negative", opts.MaxRebalanceMoves)
	}
	return tol, nil
}

// place runs the steps after the previous subsets are read: shrink the
// subsets that are too large, fill those that are too small, and
// rebalance within the options' budget.
func (st *shardState) place(opts ShardOptions) {
	clear(st.mark)
	st.shrink()
	st.fill()
	if opts.MaxRebalanceMoves > 0 {
		st.rebalance(opts.MaxRebalanceMoves)
	}
}

// sortedTenants validates tenants and returns them sorted by ID: tenants
// itself if it is sorted already (it is only read), or a sorted copy.
func sortedTenants(tenants []Tenant) ([]Tenant, error) {
	byID := func(a, b Tenant) int { return cmp.Compare(a.ID, b.ID) }
	ts := tenants
	if !slices.IsSortedFunc(ts, byID) {
		ts = slices.Clone(tenants)
		slices.SortFunc(ts, byID)
	}
	var total float64
	for i, t := range ts {
		if t.ID == "" {
			return nil, invalidf("tenant %d has an empty ID", i)
		}
		if i > 0 && ts[i-1].ID == t.ID {
			return nil, invalidf("tenant ID %q appears twice", t.ID)
		}
		if t.Size < 0 {
			return nil, invalidf("tenant %q has size %d; want >= 0", t.ID, t.Size)
		}
		if math.IsNaN(t.Load) || math.IsInf(t.Load, 0) || t.Load < 0 {
			return nil, invalidf("tenant %q has load %v; want a finite number >= 0", t.ID, t.Load)
		}
		total += t.Load
	}
	if math.IsInf(total, 0) {
		return nil, invalidf("tenant loads add up to %v; want a finite total", total)
	}
	return ts, nil
}

// Reasons a tenant changed, as bits of shardState.why.
const (
	whyNew = 1 << iota
	whySize
	whyLeft
	whyDrain
	whyZone
	whyRebalance
)

// shardState is the working state of one Shards call. Members are indexed
// by their position in ID order, tenants likewise.
type shardState struct {
	ms       []Member
	ts       []Tenant
	tol      float64
	eligible int       // members with positive weight
	zone     []int32   // zone index of each member; -1 if draining
	zoneSize []int     // eligible members per zone
	invW     []float64 // 1/weight, 0 if draining
	mhash    []uint64
	load     []float64 // current load of each member
	meanNorm float64   // total load / total weight
	band     float64   // tolerance band for picks, in load per weight
	levels   []int     // levels[s]: per-zone cap for a subset of size s

	subs    [][]int32 // current subset of each tenant (member indices)
	size    []int     // effective size of each tenant
	piece   []float64 // Load / size
	why     []uint8
	gone    map[int][]string // previous members that left or are draining
	prevOf  map[int][]string // previous subsets of tenants known to change
	inPrev  []bool
	prevLen []int32 // distinct members in the previous subset
	byID    map[string]int32
	mark    []int32   // mark[m] == t+1 while tenant t is being worked on and has m
	zcount  []int32   // per-zone member count of the tenant being worked on
	scratch []float64 // see candidates
	inBand  []bandMember
	arena   []int32 // see alloc
	moves   int
}

func newShardState(ms []Member, ts []Tenant, tol float64) *shardState {
	st := &shardState{
		ms:      ms,
		ts:      ts,
		tol:     tol,
		zone:    make([]int32, len(ms)),
		invW:    make([]float64, len(ms)),
		mhash:   make([]uint64, len(ms)),
		load:    make([]float64, len(ms)),
		mark:    make([]int32, len(ms)),
		scratch: make([]float64, len(ms)),
		byID:    make(map[string]int32, len(ms)),
		subs:    make([][]int32, len(ts)),
		size:    make([]int, len(ts)),
		piece:   make([]float64, len(ts)),
		why:     make([]uint8, len(ts)),
		gone:    map[int][]string{},
		prevOf:  map[int][]string{},
		inPrev:  make([]bool, len(ts)),
		prevLen: make([]int32, len(ts)),
	}
	zoneIdx := map[string]int32{}
	var totalW float64
	for i, m := range ms {
		st.byID[m.ID] = int32(i)
		st.mhash[i] = xxhash.Sum64String(m.ID)
		if m.Weight <= 0 {
			st.zone[i] = -1
			continue
		}
		z, ok := zoneIdx[m.Zone]
		if !ok {
			z = int32(len(st.zoneSize))
			zoneIdx[m.Zone] = z
			st.zoneSize = append(st.zoneSize, 0)
		}
		st.zone[i] = z
		st.zoneSize[z]++
		st.invW[i] = 1 / m.Weight
		totalW += m.Weight
		st.eligible++
	}
	st.zcount = make([]int32, len(st.zoneSize))
	st.levels = zoneLevels(st.zoneSize)

	var total float64
	for i, t := range ts {
		s := min(t.Size, st.eligible)
		st.size[i] = s
		if s > 0 {
			st.piece[i] = t.Load / float64(s)
			total += t.Load
		}
	}
	if totalW > 0 && !math.IsInf(totalW, 0) {
		st.meanNorm = total / totalW
	}
	st.band = st.tol / 2 * st.meanNorm
	if math.IsNaN(st.band) || math.IsInf(st.band, 0) {
		st.meanNorm, st.band = 0, 0
	}
	return st
}

// zoneLevels returns, for each subset size s from 0 to the number of members,
// the smallest per-zone cap L such that sum over zones of min(zoneSize, L)
// >= s. When every zone has at least ⌈s/zones⌉ members, L = ⌈s/zones⌉.
func zoneLevels(zoneSize []int) []int {
	total := 0
	maxZone := 0
	for _, n := range zoneSize {
		total += n
		maxZone = max(maxZone, n)
	}
	levels := make([]int, total+1)
	// capacity(L) grows with L; walk both up together.
	capacity, l := 0, 0
	for s := 1; s <= total; s++ {
		for capacity < s && l < maxZone {
			l++
			capacity = 0
			for _, n := range zoneSize {
				capacity += min(n, l)
			}
		}
		levels[s] = l
	}
	return levels
}

// readPrev reads the previous subsets: it keeps the members that are still
// eligible, records the others, and charges every kept member its share of
// the tenant's load at the new size.
func (st *shardState) readPrev(prev map[string][]string) {
	// Look the tenants up a batch at a time before using the results, so
	// that the cache misses of the lookups overlap.
	const batch = 256
	var ps [batch][]string
	var oks [batch]bool
	for base := 0; base < len(st.ts); base += batch {
		n := min(batch, len(st.ts)-base)
		for i := range n {
			ps[i], oks[i] = prev[st.ts[base+i].ID]
		}
		for i := range n {
			st.readPrevTenant(base+i, ps[i], oks[i])
		}
	}
}

// readPrevTenant reads tenant ti's previous subset p (ok: whether prev had
// the tenant).
func (st *shardState) readPrevTenant(ti int, p []string, ok bool) {
	if !st.beginPrev(ti, ok) {
		return
	}
	sub := st.alloc(max(len(p), st.size[ti]))
	stamp := int32(ti + 1)
	var gone []string
	for _, id := range p {
		m, ok := st.byID[id]
		if !ok || st.zone[m] < 0 {
			gone = st.addGone(ti, gone, id, !ok)
			continue
		}
		if st.mark[m] == stamp {
			continue
		}
		st.mark[m] = stamp
		sub = append(sub, m)
	}
	st.endPrev(ti, sub, gone)
	if st.why[ti] != 0 {
		st.prevOf[ti] = p // to list the changes without looking it up again
	}
}

// beginPrev starts reading tenant ti's previous subset (ok: whether there
// is one). It reports whether there is one to read; a new tenant gets an
// empty subset of its size's capacity.
func (st *shardState) beginPrev(ti int, ok bool) bool {
	st.inPrev[ti] = ok
	if !ok && st.size[ti] > 0 {
		st.why[ti] |= whyNew
		st.subs[ti] = st.alloc(st.size[ti])
	}
	return ok
}

// addGone records id, a member of tenant ti's previous subset that left
// (or, if not left, is draining), once.
func (st *shardState) addGone(ti int, gone []string, id string, left bool) []string {
	if slices.Contains(gone, id) {
		return gone
	}
	if left {
		st.why[ti] |= whyLeft
	} else {
		st.why[ti] |= whyDrain
	}
	return append(gone, id)
}

// endPrev ends reading tenant ti's previous subset: sub is the members
// kept, gone those that left or are draining. It charges every kept member
// its share of the tenant's load at the new size.
func (st *shardState) endPrev(ti int, sub []int32, gone []string) {
	sortSmall(sub) // whatever order prev had
	for _, m := range sub {
		st.load[m] += st.piece[ti]
	}
	st.subs[ti] = sub
	if len(gone) > 0 {
		st.gone[ti] = gone
	}
	st.prevLen[ti] = int32(len(sub) + len(gone))
	if int(st.prevLen[ti]) != st.size[ti] {
		st.why[ti] |= whySize
	}
}

// sortSmall sorts a subset: an insertion sort, since subsets are short and
// usually sorted already.
func sortSmall(sub []int32) {
	if len(sub) > 64 {
		slices.Sort(sub)
		return
	}
	for i := 1; i < len(sub); i++ {
		for j := i; j > 0 && sub[j] < sub[j-1]; j-- {
			sub[j], sub[j-1] = sub[j-1], sub[j]
		}
	}
}

// alloc returns an empty slice with capacity n, carved from a shared block
// to spare the allocator one small slice per tenant.
func (st *shardState) alloc(n int) []int32 {
	if len(st.arena) < n {
		st.arena = make([]int32, max(n, 1<<14))
	}
	s := st.arena[:0:n]
	st.arena = st.arena[n:]
	return s
}

// shrink removes members from tenants that have more than their size:
// first from zones above the tenant's cap, then the most loaded (relative to
// weight), ties broken by the tenant's hash.
func (st *shardState) shrink() {
	for ti := range st.ts {
		sub := st.subs[ti]
		s := st.size[ti]
		if len(sub) <= s {
			continue
		}
		lvl := st.levels[s]
		th := st.tenantHash(ti)
		for _, m := range sub {
			st.zcount[st.zone[m]]++
		}
		for len(sub) > s {
			best := -1
			var bestOver bool
			var bestLoad float64
			var bestScore uint64
			for i, m := range sub {
				over := int(st.zcount[st.zone[m]]) > lvl
				l := st.load[m] * st.invW[m]
				sc := shardScore(th, st.mhash[m])
				better := best < 0 ||
					(over && !bestOver) ||
					(over == bestOver && (l > bestLoad || (l == bestLoad && sc < bestScore)))
				if better {
					best, bestOver, bestLoad, bestScore = i, over, l, sc
				}
			}
			m := sub[best]
			st.load[m] -= st.piece[ti]
			st.zcount[st.zone[m]]--
			sub = slices.Delete(sub, best, best+1)
		}
		for _, m := range sub {
			st.zcount[st.zone[m]]--
		}
		st.subs[ti] = sub
	}
}

// fill adds members to tenants that have fewer than their size. Tenants
// with the fewest members to choose from go first (after a member left, those
// that must replace it within its zone), and among those the biggest load per
// member, so that flexible tenants then avoid the members the constrained
// ones had to take.
func (st *shardState) fill() {
	type job struct {
		ti      int32
		choices int32
	}
	var jobs []job
	for ti := range st.ts {
		if len(st.subs[ti]) < st.size[ti] {
			jobs = append(jobs, job{int32(ti), int32(st.choices(ti))})
		}
	}
	slices.SortFunc(jobs, func(a, b job) int {
		if c := cmp.Compare(a.choices, b.choices); c != 0 {
			return c
		}
		if c := cmp.Compare(st.piece[b.ti], st.piece[a.ti]); c != 0 {
			return c
		}
		return cmp.Compare(a.ti, b.ti)
	})
	for _, j := range jobs {
		st.fillTenant(int(j.ti))
	}
}

// fillTenant adds members to tenant ti until it has its size. It does what
// repeated calls of pick would do, except that the tolerance band is taken
// once for several picks: the band's lower end only rises as its members are
// taken, so every member chosen is still within the band of the least
// loaded when it is chosen.
func (st *shardState) fillTenant(ti int) {
	st.begin(ti)
	defer st.end(ti)
	lvl := st.levels[st.size[ti]]
	if st.size[ti]-len(st.subs[ti]) == 1 { // the common case after a member left
		if m := st.pick(ti, lvl); m >= 0 {
			st.add(ti, m)
		}
		return
	}
	th := st.tenantHash(ti)
	for len(st.subs[ti]) < st.size[ti] {
		limit, ok := st.candidates(ti, lvl)
		if !ok {
			return // unreachable: the zone levels leave room for size members
		}
		band := st.inBand[:0]
		for m, a := range st.scratch {
			if a <= limit {
				band = append(band, bandMember{m: int32(m), score: shardScore(th, st.mhash[m])})
			}
		}
		st.inBand = band
		for len(st.subs[ti]) < st.size[ti] {
			best := -1
			for i, b := range band {
				if b.m < 0 || int(st.zcount[st.zone[b.m]]) >= lvl {
					continue
				}
				if best < 0 || b.score > band[best].score {
					best = i
				}
			}
			if best < 0 {
				break // band used up: take a new one
			}
			st.add(ti, band[best].m)
			band[best].m = -1
		}
	}
}

// bandMember is a member within the tolerance band of a pick, with its
// per-tenant score.
type bandMember struct {
	m     int32
	score uint64
}

// choices returns how many members tenant ti could add now without
// exceeding its zone cap.
func (st *shardState) choices(ti int) int {
	lvl := st.levels[st.size[ti]]
	sub := st.subs[ti]
	n := st.eligible
	for _, m := range sub {
		st.zcount[st.zone[m]]++
	}
	for _, m := range sub {
		z := st.zone[m]
		c := int(st.zcount[z])
		if c == 0 {
			continue // zone done
		}
		if c >= lvl {
			n -= st.zoneSize[z] // the zone is full
		} else {
			n -= c
		}
		st.zcount[z] = 0
	}
	return n
}

// begin marks tenant ti's members and counts them per zone, for pick.
func (st *shardState) begin(ti int) {
	for _, m := range st.subs[ti] {
		st.mark[m] = int32(ti + 1)
		st.zcount[st.zone[m]]++
	}
}

// end undoes begin.
func (st *shardState) end(ti int) {
	for _, m := range st.subs[ti] {
		st.mark[m] = 0
		st.zcount[st.zone[m]]--
	}
}

func (st *shardState) add(ti int, m int32) {
	st.subs[ti] = append(st.subs[ti], m)
	st.mark[m] = int32(ti + 1)
	st.zcount[st.zone[m]]++
	st.load[m] += st.piece[ti]
}

// candidates computes, in st.scratch, the load relative to weight that
// every member would have after joining tenant ti (between begin and end),
// or NaN for members that may not join: draining, already in the subset, or
// in a zone that has lvl members of the subset. It returns the upper end of
// the tolerance band (the least such load plus st.band), and false if no
// member may join.
func (st *shardState) candidates(ti, lvl int) (limit float64, ok bool) {
	stamp := int32(ti + 1)
	p := st.piece[ti]
	least := math.Inf(1)
	after := st.scratch
	for m := range st.ms {
		z := st.zone[m]
		if z < 0 || st.mark[m] == stamp || int(st.zcount[z]) >= lvl {
			after[m] = math.NaN()
			continue
		}
		a := (st.load[m] + p) * st.invW[m]
		if math.IsNaN(a) {
			a = math.Inf(1) // absurd weights; still a candidate
		}
		after[m] = a
		least = min(least, a)
		ok = true
	}
	return least + st.band, ok
}

// pick chooses one new member for tenant ti (between begin and end): among
// the candidates within the tolerance band, the one with the highest
// per-tenant hash score. It returns -1 if no member may join.
func (st *shardState) pick(ti, lvl int) int32 {
	limit, ok := st.candidates(ti, lvl)
	if !ok {
		return -1
	}
	best := int32(-1)
	var bestScore uint64
	th := st.tenantHash(ti)
	for m, a := range st.scratch {
		if !(a <= limit) {
			continue
		}
		sc := shardScore(th, st.mhash[m])
		if best < 0 || sc > bestScore {
			best, bestScore = int32(m), sc
		}
	}
	return best
}

// tenantHash returns the hash of tenant ti's ID, for shardScore.
func (st *shardState) tenantHash(ti int) uint64 {
	return xxhash.Sum64String(st.ts[ti].ID)
}

// shardScore is the per-tenant rendezvous score of a member in Shards: a
// 64-bit mix of the tenant's and the member's hashes (murmur3's finalizer).
func shardScore(th, mh uint64) uint64 {
	x := th ^ (mh * 0x9e3779b97f4a7c15)
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// rebalance makes up to budget swaps in tenants that have not changed in
// this call: first to bring subsets back under their zone caps, then to move
// load from the most to the least loaded members while either is outside the
// tolerance.
func (st *shardState) rebalance(budget int) {
	for ti := range st.ts {
		if st.moves >= budget {
			return
		}
		if st.why[ti] != 0 {
			continue
		}
		st.repairZones(ti, budget)
	}
	if st.meanNorm > 0 && st.moves < budget {
		st.rebalanceLoad(budget)
	}
}

// repairZones swaps members of tenant ti out of zones that hold more than
// the tenant's cap: the most loaded first, ties broken by the tenant's hash.
func (st *shardState) repairZones(ti, budget int) {
	lvl := st.levels[st.size[ti]]
	st.begin(ti)
	defer st.end(ti)
	th := uint64(0)
	for st.moves < budget {
		victim := -1
		var victimLoad float64
		var victimScore uint64
		for i, m := range st.subs[ti] {
			if int(st.zcount[st.zone[m]]) <= lvl {
				continue
			}
			if th == 0 {
				th = st.tenantHash(ti)
			}
			l := st.load[m] * st.invW[m]
			sc := shardScore(th, st.mhash[m])
			if victim < 0 || l > victimLoad || (l == victimLoad && sc < victimScore) {
				victim, victimLoad, victimScore = i, l, sc
			}
		}
		if victim < 0 {
			return
		}
		repl := st.pick(ti, lvl)
		if repl < 0 {
			return
		}
		st.swap(ti, victim, repl)
		st.why[ti] |= whyZone
		st.moves++
	}
}

// swap replaces the i-th member of tenant ti's subset with m, between begin
// and end.
func (st *shardState) swap(ti, i int, m int32) {
	old := st.subs[ti][i]
	st.mark[old] = 0
	st.zcount[st.zone[old]]--
	st.load[old] -= st.piece[ti]
	st.subs[ti][i] = m
	st.mark[m] = int32(ti + 1)
	st.zcount[st.zone[m]]++
	st.load[m] += st.piece[ti]
}

// rebalanceLoad moves one member of one tenant at a time from an overloaded
// member to an underloaded one. Every move strictly lowers
// sum(load²/weight), and no tenant moves twice, so it ends.
func (st *shardState) rebalanceLoad(budget int) {
	// Tenants each member serves, among those that may still move.
	serves := make([][]int32, len(st.ms))
	for ti, sub := range st.subs {
		if st.why[ti] != 0 || st.piece[ti] == 0 {
			continue
		}
		for _, m := range sub {
			serves[m] = append(serves[m], int32(ti))
		}
	}
	var elig []int32
	for m := range st.ms {
		if st.zone[m] >= 0 {
			elig = append(elig, int32(m))
		}
	}
	ratio := func(m int32) float64 { return st.load[m] / (st.meanNorm * st.ms[m].Weight) }
	hi, lo := 1+st.tol, 1-st.tol
	const maxSources = 8
	for st.moves < budget {
		// Most loaded first; least loaded first.
		slices.SortFunc(elig, func(a, b int32) int {
			if c := cmp.Compare(ratio(b), ratio(a)); c != 0 {
				return c
			}
			return cmp.Compare(a, b)
		})
		if ratio(elig[0]) <= hi && ratio(elig[len(elig)-1]) >= lo {
			return
		}
		moved := false
	search:
		for si := 0; si < min(maxSources, len(elig)); si++ {
			src := elig[si]
			for di := len(elig) - 1; di > si; di-- {
				dst := elig[di]
				if ratio(src) <= hi && ratio(dst) >= lo {
					break
				}
				if ti, ok := st.bestMove(serves[src], src, dst); ok {
					st.moveTenant(ti, src, dst)
					serves[src] = slices.DeleteFunc(serves[src], func(t int32) bool { return int(t) == ti })
					moved = true
					break search
				}
			}
		}
		if !moved {
			return
		}
	}
}

// bestMove returns the tenant among cands, served by src, whose move to dst
// lowers sum(load²/weight) the most while keeping the zone cap.
func (st *shardState) bestMove(cands []int32, src, dst int32) (int, bool) {
	ls, ld := st.load[src], st.load[dst]
	ws, wd := st.invW[src], st.invW[dst]
	best := -1
	var bestDelta float64
	for _, t := range cands {
		ti := int(t)
		if st.why[ti] != 0 {
			continue
		}
		p := st.piece[ti]
		// Change of sum(load²/weight) when p moves from src to dst.
		delta := (p*p-2*p*ls)*ws + (p*p+2*p*ld)*wd
		if !(delta < 0) || (best >= 0 && delta >= bestDelta) {
			continue
		}
		if !st.canSwap(ti, src, dst) {
			continue
		}
		best, bestDelta = ti, delta
	}
	return best, best >= 0
}

// canSwap reports whether tenant ti may replace src with dst: dst is not in
// the subset and the zone cap holds afterwards.
func (st *shardState) canSwap(ti int, src, dst int32) bool {
	zd := st.zone[dst]
	n := 0
	for _, m := range st.subs[ti] {
		if m == dst {
			return false
		}
		if st.zone[m] == zd {
			n++
		}
	}
	return st.zone[src] == zd || n < st.levels[st.size[ti]]
}

func (st *shardState) moveTenant(ti int, src, dst int32) {
	i := slices.Index(st.subs[ti], src)
	st.subs[ti][i] = dst
	st.load[src] -= st.piece[ti]
	st.load[dst] += st.piece[ti]
	st.why[ti] |= whyRebalance
	st.moves++
}

// plan builds the result.
func (st *shardState) plan(prev map[string][]string) ShardPlan {
	n := 0
	for _, sub := range st.subs {
		n += len(sub)
	}
	names := make([]string, n)
	subsets := make(map[string][]string, len(st.ts))
	// Sum the loads afresh: the running totals have rounding errors from
	// members removed along the way.
	clear(st.load)
	var changes []ShardChange
	found := 0
	for ti, t := range st.ts {
		sub := st.subs[ti]
		sortSmall(sub)
		out := names[:len(sub):len(sub)]
		names = names[len(sub):]
		for i, m := range sub {
			out[i] = st.ms[m].ID
			st.load[m] += st.piece[ti]
		}
		subsets[t.ID] = out
		if st.inPrev[ti] {
			found++
		}
		if st.why[ti] == 0 {
			continue
		}
		p, ok := st.prevOf[ti]
		if !ok {
			p = prev[t.ID]
		}
		if c, ok := st.change(ti, out, p); ok {
			changes = append(changes, c)
		}
	}
	if found < len(prev) {
		for id, p := range prev {
			if _, ok := slices.BinarySearchFunc(st.ts, id, func(t Tenant, id string) int { return cmp.Compare(t.ID, id) }); ok {
				continue
			}
			if len(p) > 0 {
				changes = append(changes, ShardChange{Tenant: id, Added: []string{}, Removed: sortedSet(p), Reason: "tenant removed"})
			}
		}
	}
	slices.SortFunc(changes, func(a, b ShardChange) int { return cmp.Compare(a.Tenant, b.Tenant) })
	return st.result(subsets, changes)
}

// change compares tenant ti's new subset out (sorted) with its previous
// one p, in any order, and returns the change, if there is one.
func (st *shardState) change(ti int, out, p []string) (ShardChange, bool) {
	p = sortedSet(p)
	c := ShardChange{Tenant: st.ts[ti].ID, Added: []string{}, Removed: []string{}}
	for _, id := range out {
		if _, ok := slices.BinarySearch(p, id); !ok {
			c.Added = append(c.Added, id)
		}
	}
	for _, id := range p {
		if _, ok := slices.BinarySearch(out, id); !ok {
			c.Removed = append(c.Removed, id)
		}
	}
	if len(c.Added) == 0 && len(c.Removed) == 0 {
		return ShardChange{}, false
	}
	c.Reason = st.reason(ti)
	return c, true
}

// result is the plan of subsets and changes, with every member's load
// (summed by the caller into st.load) and the balance.
func (st *shardState) result(subsets map[string][]string, changes []ShardChange) ShardPlan {
	pl := ShardPlan{
		Subsets:        subsets,
		Changes:        changes,
		MemberLoad:     make(map[string]float64, len(st.ms)),
		RebalanceMoves: st.moves,
	}
	for m, mem := range st.ms {
		l := st.load[m]
		pl.MemberLoad[mem.ID] = l
		if st.meanNorm > 0 && st.zone[m] >= 0 {
			pl.MaxOverMean = max(pl.MaxOverMean, l/(st.meanNorm*mem.Weight))
		}
	}
	return pl
}

// sortedSet returns the distinct elements of ids, sorted, in a new slice.
func sortedSet(ids []string) []string {
	out := slices.Clone(ids)
	slices.Sort(out)
	return slices.Compact(out)
}

// reason explains why tenant ti changed, for ShardChange.Reason.
func (st *shardState) reason(ti int) string {
	var r []string
	why := st.why[ti]
	t := st.ts[ti]
	s := st.size[ti]
	if why&whyNew != 0 {
		r = append(r, "new tenant")
	}
	if why&whySize != 0 {
		r = append(r, fmt.Sprintf("size %d->%d", st.prevLen[ti], s))
	}
	if s < t.Size {
		r = append(r, fmt.Sprintf("size %d clamped to %d eligible members", t.Size, s))
	}
	gone := slices.Clone(st.gone[ti])
	slices.Sort(gone)
	for _, id := range gone {
		if m, ok := st.byID[id]; ok && st.zone[m] < 0 {
			r = append(r, fmt.Sprintf("member %s draining", id))
		} else {
			r = append(r, fmt.Sprintf("member %s left", id))
		}
	}
	if why&whyZone != 0 {
		r = append(r, "zone spread")
	}
	if why&whyRebalance != 0 {
		r = append(r, "rebalance")
	}
	return strings.Join(r, "; ")
}
