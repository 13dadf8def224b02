package placement

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// DefaultOverlapPairs is the number of pairs [Overlap] samples when its
// maxPairs argument is 0 or less.
const DefaultOverlapPairs = 1_000_000

// overlapTailQuantile is the quantile of the hypergeometric distribution
// above which a pair counts in the tail statistic.
const overlapTailQuantile = 0.99

// OverlapReport compares how much the subsets of different tenants overlap
// with what random subsets of the same sizes, drawn from the same pool, would
// give (the hypergeometric distribution). Shuffle sharding isolates tenants
// only as long as overlaps stay that small. Fractions are of Pairs.
type OverlapReport struct {
	Tenants int  // non-empty subsets considered
	Pool    int  // pool size used for the expectation
	Pairs   int  // pairs of subsets measured
	Sampled bool // whether Pairs is a sample of all pairs
	// Observed[k] is the number of pairs sharing exactly k members;
	// Expected[k] is the expected number for random subsets. Both run from
	// 0 to the largest overlap any measured pair allows (the size of its
	// smaller subset).
	Observed []int
	Expected []float64
	// ObservedMean and ExpectedMean are mean shared members per pair.
	ObservedMean, ExpectedMean float64
	// ObservedTail is the fraction of pairs sharing more members than the
	// 99th percentile of the hypergeometric distribution for their two
	// sizes; ExpectedTail is that fraction for random subsets (at most 1%).
	ObservedTail, ExpectedTail float64
	// ObservedFull is the fraction of pairs in which the smaller subset lies
	// entirely inside the other (one tenant can take down all of the
	// other's members); ExpectedFull is that fraction for random subsets.
	ObservedFull, ExpectedFull float64
	// MaxOverlap is the largest number of members any measured pair shares.
	MaxOverlap int
}

// Overlap measures the pairwise overlap of subsets (tenant → member IDs, as
// in [ShardPlan.Subsets]) against random subsets of the same sizes drawn from
// a pool of poolSize members. Empty subsets are ignored and duplicate members
// in a subset count once. If poolSize is smaller than the number of distinct
// members named in subsets (for instance 0), that number is used instead.
//
// If there are at most maxPairs pairs, all are measured; otherwise maxPairs
// pairs are drawn (with replacement) by a fixed-seed generator over the
// tenants in ID order, so the report is deterministic. maxPairs <= 0 means [DefaultOverlapPairs].
// The work is proportional to the number of pairs measured times the subset
// sizes.
func Overlap(subsets map[string][]string, poolSize int, maxPairs int) OverlapReport {
	if maxPairs <= 0 {
		maxPairs = DefaultOverlapPairs
	}
	ids := make([]string, 0, len(subsets))
	for id, s := range subsets {
		if len(s) > 0 {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	// Members as small integers, subsets as sorted distinct integers.
	memberIdx := map[string]int32{}
	subs := make([][]int32, len(ids))
	for i, id := range ids {
		var sub []int32
		for _, m := range subsets[id] {
			x, ok := memberIdx[m]
			if !ok {
				x = int32(len(memberIdx))
				memberIdx[m] = x
			}
			sub = append(sub, x)
		}
		slices.Sort(sub)
		subs[i] = slices.Compact(sub)
	}
	r := OverlapReport{Tenants: len(ids), Pool: max(poolSize, len(memberIdx))}
	n := len(ids)
	if n < 2 {
		return r
	}
	hg := newOverlapHypergeo(r.Pool)
	var sumObs, sumExp, tail, expTail, full, expFull float64
	measure := func(i, j int) {
		a, b := subs[i], subs[j]
		k := sharedCount(a, b)
		d := hg.dist(len(a), len(b))
		if len(r.Observed) <= d.maxK {
			r.Observed = append(r.Observed, make([]int, d.maxK+1-len(r.Observed))...)
			r.Expected = append(r.Expected, make([]float64, d.maxK+1-len(r.Expected))...)
		}
		r.Observed[k]++
		for x, p := range d.pmf {
			r.Expected[d.minK+x] += p
		}
		r.Pairs++
		r.MaxOverlap = max(r.MaxOverlap, k)
		sumObs += float64(k)
		sumExp += d.mean
		if k > d.q99 {
			tail++
		}
		expTail += d.tail
		if k == d.maxK {
			full++
		}
		expFull += d.pmf[len(d.pmf)-1]
	}
	total := uint64(n) * uint64(n-1) / 2
	if total <= uint64(maxPairs) {
		for i := range n {
			for j := i + 1; j < n; j++ {
				measure(i, j)
			}
		}
	} else {
		r.Sampled = true
		rng := overlapRNG{state: 0x6b657973_68617264} // "keyshard"
		for range maxPairs {
			i := int(rng.next() % uint64(n))
			j := int(rng.next() % uint64(n-1))
			if j >= i {
				j++
			}
			measure(i, j)
		}
	}
	pairs := float64(r.Pairs)
	r.ObservedMean, r.ExpectedMean = sumObs/pairs, sumExp/pairs
	r.ObservedTail, r.ExpectedTail = tail/pairs, expTail/pairs
	r.ObservedFull, r.ExpectedFull = full/pairs, expFull/pairs
	return r
}

// String formats the report as a few lines for humans, the histogram as one
// row per overlap up to the last one observed or expected at least 0.05
// times.
func (r OverlapReport) String() string {
	var b strings.Builder
	sampled := ""
	if r.Sampled {
		sampled = " (sampled)"
	}
	fmt.Fprintf(&b, "overlap of %d tenants over %d members, %d pairs%s\n", r.Tenants, r.Pool, r.Pairs, sampled)
	fmt.Fprintf(&b, "mean shared: observed %.4f, random %.4f\n", r.ObservedMean, r.ExpectedMean)
	fmt.Fprintf(&b, "above random p99: observed %.4f%%, random %.4f%%\n", 100*r.ObservedTail, 100*r.ExpectedTail)
	fmt.Fprintf(&b, "smaller inside larger: observed %.4f%%, random %.4f%%\n", 100*r.ObservedFull, 100*r.ExpectedFull)
	fmt.Fprintf(&b, "max shared: %d\n", r.MaxOverlap)
	fmt.Fprintf(&b, "shared  observed  random\n")
	last := len(r.Observed) - 1 // skip the empty tail
	for last > 0 && r.Observed[last] == 0 && r.Expected[last] < 0.05 {
		last--
	}
	for k := range last + 1 {
		fmt.Fprintf(&b, "%6d  %8d  %.1f\n", k, r.Observed[k], r.Expected[k])
	}
	return b.String()
}

// sharedCount counts the common elements of two sorted, distinct slices.
func sharedCount(a, b []int32) int {
	n := 0
	for len(a) > 0 && len(b) > 0 {
		switch {
		case a[0] < b[0]:
			a = a[1:]
		case a[0] > b[0]:
			b = b[1:]
		default:
			n++
			a, b = a[1:], b[1:]
		}
	}
	return n
}

// overlapHypergeo caches the overlap distributions of random subsets of a
// pool.
type overlapHypergeo struct {
	pool  int
	cache map[[2]int]*overlapDist
}

// overlapDist is the distribution of the overlap of two random subsets of sizes
// a <= b from the pool: pmf[x] is P(overlap = minK+x).
type overlapDist struct {
	minK, maxK int
	pmf        []float64
	mean       float64
	q99        int     // smallest k with P(overlap <= k) >= 0.99
	tail       float64 // P(overlap > q99)
}

func newOverlapHypergeo(pool int) *overlapHypergeo {
	return &overlapHypergeo{pool: pool, cache: map[[2]int]*overlapDist{}}
}

func (h *overlapHypergeo) dist(a, b int) *overlapDist {
	if a > b {
		a, b = b, a
	}
	if d, ok := h.cache[[2]int{a, b}]; ok {
		return d
	}
	n := h.pool
	d := &overlapDist{minK: max(0, a+b-n), maxK: a, mean: float64(a) * float64(b) / float64(n)}
	// P(k) = C(b,k) C(n-b,a-k) / C(n,a), computed in logs.
	logC := func(n, k int) float64 {
		x, _ := math.Lgamma(float64(n + 1))
		y, _ := math.Lgamma(float64(k + 1))
		z, _ := math.Lgamma(float64(n - k + 1))
		return x - y - z
	}
	den := logC(n, a)
	var sum float64
	for k := d.minK; k <= d.maxK; k++ {
		p := math.Exp(logC(b, k) + logC(n-b, a-k) - den)
		d.pmf = append(d.pmf, p)
		sum += p
	}
	if sum > 0 {
		for i := range d.pmf {
			d.pmf[i] /= sum
		}
	}
	var cdf float64
	d.q99 = d.maxK
	for x, p := range d.pmf {
		cdf += p
		if cdf >= overlapTailQuantile {
			d.q99 = d.minK + x
			d.tail = max(0, 1-cdf)
			break
		}
	}
	h.cache[[2]int{a, b}] = d
	return d
}

// overlapRNG is the SplitMix64 generator, for deterministic sampling.
type overlapRNG struct{ state uint64 }

func (s *overlapRNG) next() uint64 {
	s.state += 0x9e3779b97f4a7c15
	z := s.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
