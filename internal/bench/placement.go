package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/keyshard/keyshard/placement"
)

// PlacementOptions selects what Placement measures.
type PlacementOptions struct {
	// Buckets and Members are the grid of cases; nil means the documented
	// default grid {1024, 16384, 65536} × {3, 10, 50, 200}.
	Buckets, Members []int
	// Runs is how many times each timing is taken; the median is reported.
	// Default 3.
	Runs int
	// Keys is the number of random keys for the spread measure. Default
	// 1,000,000.
	Keys int
	// SkipShards leaves out the shuffle-shard case.
	SkipShards bool
}

// PlacementReport is the output of `keyshard bench placement --json`.
type PlacementReport struct {
	Cases []PlacementCase `json:"cases"`
	// Shards is the shuffle-shard case, unless skipped.
	Shards *ShardsCase `json:"shards,omitempty"`
	Runs   int         `json:"runs"`
}

// MoveCount compares the buckets a plan moved with the optimum.
type MoveCount struct {
	Moved   int `json:"moved"`
	Optimal int `json:"optimal"`
}

// PlacementCase is one (buckets, members) case.
type PlacementCase struct {
	Buckets int `json:"buckets"`
	Members int `json:"members"`
	// LookupNs is the median cost of key → member for 16-byte keys, and
	// HashNs that of hashing the same keys alone (xxh64).
	LookupNs       float64 `json:"lookup_ns"`
	LookupAllocs   int64   `json:"lookup_allocs"`
	HashNs         float64 `json:"hash_ns"`
	LookupOverHash float64 `json:"lookup_over_hash"`
	// MaxOverMean is the most keys any member received over the mean,
	// from Keys random keys with equal weights.
	MaxOverMean float64 `json:"max_over_mean"`
	// BucketSpread is max − min buckets per member.
	BucketSpread int       `json:"bucket_spread"`
	Add          MoveCount `json:"add"`
	Remove       MoveCount `json:"remove"`
	// RebalanceUs is the median time of one join's plan, RemoveUs of one
	// leave's, FullAssignUs of an assignment from nothing.
	RebalanceUs  float64 `json:"rebalance_us"`
	RemoveUs     float64 `json:"remove_us"`
	FullAssignUs float64 `json:"full_assign_us"`
}

func membersN(n int) []placement.Member {
	ms := make([]placement.Member, n)
	for i := range ms {
		ms[i] = placement.Member{ID: fmt.Sprintf("member-%03d", i), Weight: 1}
	}
	return ms
}

func randomKeys(r *rand.Rand, n, size int) [][]byte {
	buf := make([]byte, n*size)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = buf[i*size : (i+1)*size : (i+1)*size]
	}
	return keys
}

// median runs f runs times and returns the median.
func median(runs int, f func() float64) float64 {
	xs := make([]float64, runs)
	for i := range xs {
		xs[i] = f()
	}
	return medianOf(xs)
}

// medianOf returns the median of xs (NaN if empty).
func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

func nsPerOp(f func(b *testing.B)) (float64, int64) {
	r := testing.Benchmark(f)
	if r.N == 0 {
		return math.NaN(), 0
	}
	return float64(r.T.Nanoseconds()) / float64(r.N), r.AllocsPerOp()
}

var sink uint64

// Placement measures the placement engine over the grid of cases.
func Placement(ctx context.Context, opts PlacementOptions, progress io.Writer) (PlacementReport, error) {
	if opts.Buckets == nil {
		opts.Buckets = []int{1024, 16384, 65536}
	}
	if opts.Members == nil {
		opts.Members = []int{3, 10, 50, 200}
	}
	if opts.Runs <= 0 {
		opts.Runs = 3
	}
	if opts.Keys <= 0 {
		opts.Keys = 1_000_000
	}
	rep := PlacementReport{Runs: opts.Runs}
	r := rand.New(rand.NewPCG(42, 7))
	lookupKeys := randomKeys(r, 4096, 16)
	spreadKeys := randomKeys(r, opts.Keys, 16)
	total := len(opts.Buckets) * len(opts.Members)
	for _, b := range opts.Buckets {
		for _, n := range opts.Members {
			if err := ctx.Err(); err != nil {
				return rep, err
			}
			c, err := placementCase(b, n, opts.Runs, lookupKeys, spreadKeys)
			if err != nil {
				return rep, fmt.Errorf("case buckets=%d members=%d: %w", b, n, err)
			}
			rep.Cases = append(rep.Cases, c)
			fmt.Fprintf(progress, "placement %2d/%d  B=%-5d N=%-3d  lookup %.1f ns (hash %.1f)  max/mean %.3f  join %d/%d moved in %.0f µs  leave %d/%d\n",
				len(rep.Cases), total, b, n, c.LookupNs, c.HashNs, c.MaxOverMean, c.Add.Moved, c.Add.Optimal, c.RebalanceUs, c.Remove.Moved, c.Remove.Optimal)
		}
	}
	if !opts.SkipShards {
		sc, err := Shards(ctx, opts.Runs, progress)
		if err != nil {
			return rep, fmt.Errorf("shards: %w", err)
		}
		rep.Shards = &sc
	}
	return rep, nil
}

func placementCase(buckets, n, runs int, lookupKeys, spreadKeys [][]byte) (PlacementCase, error) {
	c := PlacementCase{Buckets: buckets, Members: n}
	ms := membersN(n + 1)
	base, err := placement.Balance(placement.NewAssignment(buckets), ms[:n])
	if err != nil {
		return c, err
	}
	table, err := placement.NewTable(placement.HashXXH64, base.Assignment)
	if err != nil {
		return c, err
	}

	// Lookup against hashing alone, interleaved so both see the same noise.
	mask := len(lookupKeys) - 1
	var hashNs []float64
	c.LookupNs = median(runs, func() float64 {
		h, _ := nsPerOp(func(b *testing.B) {
			for i := range b.N {
				sink += xxhash.Sum64(lookupKeys[i&mask])
			}
		})
		hashNs = append(hashNs, h)
		ns, allocs := nsPerOp(func(b *testing.B) {
			b.ReportAllocs()
			for i := range b.N {
				o, _ := table.Owner(lookupKeys[i&mask])
				sink += uint64(len(o))
			}
		})
		c.LookupAllocs = max(c.LookupAllocs, allocs)
		return ns
	})
	c.HashNs = medianOf(hashNs)
	c.LookupOverHash = c.LookupNs / c.HashNs

	// Keys per member.
	keys := make(map[string]int, n)
	for _, k := range spreadKeys {
		o, _ := table.Owner(k)
		keys[o]++
	}
	worst := 0
	for _, k := range keys {
		worst = max(worst, k)
	}
	c.MaxOverMean = float64(worst) / (float64(len(spreadKeys)) / float64(n))
	lo, hi := buckets, 0
	for _, m := range ms[:n] {
		k := base.Targets[m.ID]
		lo, hi = min(lo, k), max(hi, k)
	}
	c.BucketSpread = hi - lo

	// One join and one leave, against the optimum computed independently.
	join, err := placement.Balance(base.Assignment, ms)
	if err != nil {
		return c, err
	}
	optJoin, err := placement.MinMoves(base.Assignment, ms)
	if err != nil {
		return c, err
	}
	c.Add = MoveCount{Moved: changed(base.Assignment, join.Assignment), Optimal: optJoin}
	leaving := ms[1:n]
	leave, err := placement.Balance(base.Assignment, leaving)
	if err != nil {
		return c, err
	}
	optLeave, err := placement.MinMoves(base.Assignment, leaving)
	if err != nil {
		return c, err
	}
	c.Remove = MoveCount{Moved: changed(base.Assignment, leave.Assignment), Optimal: optLeave}

	timeUs := func(f func()) float64 {
		return median(runs, func() float64 {
			ns, _ := nsPerOp(func(b *testing.B) {
				for range b.N {
					f()
				}
			})
			return ns / 1e3
		})
	}
	c.RebalanceUs = timeUs(func() { _, _ = placement.Balance(base.Assignment, ms) })
	c.RemoveUs = timeUs(func() { _, _ = placement.Balance(base.Assignment, leaving) })
	empty := placement.NewAssignment(buckets)
	c.FullAssignUs = timeUs(func() { _, _ = placement.Balance(empty, ms[:n]) })
	return c, nil
}

// changed counts the buckets whose owner differs between a and b.
func changed(a, b placement.Assignment) int {
	n := 0
	for i := range a.Owners {
		if a.Owner(i) != b.Owner(i) {
			n++
		}
	}
	return n
}
