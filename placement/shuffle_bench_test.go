package placement_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/keyshard/keyshard/placement"
)

// shufflePool returns n members of weight 1 spread round-robin over zones.
func shufflePool(n, zones int) []placement.Member {
	ms := make([]placement.Member, n)
	for i := range ms {
		ms[i] = placement.Member{ID: fmt.Sprintf("m%03d", i), Weight: 1, Zone: fmt.Sprintf("z%d", i%zones)}
	}
	return ms
}

// shuffleTenants returns n tenants with Zipf-like loads (exponent 0.8, in
// random order) and sizes 1..16 skewed to small, the heaviest tenants
// largest, as a load-derived size policy would give.
func shuffleTenants(n int, seed uint64) []placement.Tenant {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	rank := rng.Perm(n)
	ts := make([]placement.Tenant, n)
	for i := range ts {
		load := 1000 / math.Pow(float64(rank[i]+1), 0.8)
		size := 1 + int(15*math.Pow(rng.Float64(), 3))
		if rank[i] < n/1000+3 {
			size = 16
		}
		ts[i] = placement.Tenant{ID: fmt.Sprintf("tenant-%06d", i), Size: size, Load: load}
	}
	return ts
}

func BenchmarkShardsFromNothing(b *testing.B) {
	ms := shufflePool(200, 3)
	ts := shuffleTenants(100_000, 1)
	b.ReportAllocs()
	var p placement.ShardPlan
	for b.Loop() {
		var err error
		p, err = placement.Shards(nil, ms, ts, placement.ShardOptions{})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(p.MaxOverMean, "max/mean")
	b.StopTimer()
	r := placement.Overlap(p.Subsets, len(ms), 0)
	b.ReportMetric(r.ObservedMean, "overlap-mean")
	b.ReportMetric(r.ExpectedMean, "random-mean")
	b.ReportMetric(100*r.ObservedTail, "overlap-tail%")
	b.ReportMetric(100*r.ExpectedTail, "random-tail%")
}

// BenchmarkOverlap measures Overlap on the plan of BenchmarkShardsFromNothing
// with the default sample of pairs.
func BenchmarkOverlap(b *testing.B) {
	ms := shufflePool(200, 3)
	p, err := placement.Shards(nil, ms, shuffleTenants(100_000, 1), placement.ShardOptions{})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		placement.Overlap(p.Subsets, len(ms), 0)
	}
}

func BenchmarkShardsMemberLeave(b *testing.B) {
	ms := shufflePool(200, 3)
	ts := shuffleTenants(100_000, 1)
	stable, err := placement.Shards(nil, ms, ts, placement.ShardOptions{})
	if err != nil {
		b.Fatal(err)
	}
	left := append(ms[:77:77], ms[78:]...)
	b.ReportAllocs()
	var p placement.ShardPlan
	for b.Loop() {
		p, err = placement.Shards(stable.Subsets, left, ts, placement.ShardOptions{})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(p.Changes)), "changes")
	b.ReportMetric(p.MaxOverMean, "max/mean")
}

func BenchmarkSubset(b *testing.B) {
	ms := shufflePool(200, 3)
	names := make([]string, 1000)
	for i := range names {
		names[i] = fmt.Sprintf("tenant-%06d", i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := placement.Subset(names[i%len(names)], ms, 1+i%16); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
