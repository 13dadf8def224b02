package stream

import (
	"fmt"
	"testing"

	"github.com/keyshard/keyshard/placement"
)

// BenchmarkCatchupFilter measures the filter-and-merge stage alone, the
// stream in memory: a worker holding a quarter of 4,096 buckets catches
// up on another quarter from the start of 64 Ki records (keys of 10,000
// destinations) while its main lane is at the end, then merges. Reading
// is excluded; records/s counts every record passed through the lane.
// The hash decides most of the cost: synapse-sha256 hashes each key with
// SHA-256.
func BenchmarkCatchupFilter(b *testing.B) {
	for _, mode := range []placement.HashMode{placement.HashXXH64, placement.HashSynapse} {
		b.Run(string(mode), func(b *testing.B) { benchCatchupFilter(b, mode) })
	}
}

func benchCatchupFilter(b *testing.B, mode placement.HashMode) {
	const n, buckets = 1 << 16, 4096
	h, err := placement.NewHasher(mode, buckets)
	if err != nil {
		b.Fatal(err)
	}
	recs := make([]Record, n)
	for i := range recs {
		recs[i] = Record{Key: fmt.Appendf(nil, "matrix-%d.example.org", i*7919%10000), Position: uint64(i)}
	}
	main := make([]BucketPosition, 0, buckets/4)
	gained := make([]BucketPosition, 0, buckets/4)
	for bk := 0; bk < buckets/2; bk += 2 {
		main = append(main, BucketPosition{bk, n})
		gained = append(gained, BucketPosition{bk + 1, 0})
	}
	var delivered int
	deliver := func(Record) error { delivered++; return nil }
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		f, err := NewFlow(h, n)
		if err != nil {
			b.Fatal(err)
		}
		if err := f.Gain(main...); err != nil {
			b.Fatal(err)
		}
		if err := f.Gain(gained...); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		merged, err := f.Catchup(0, recs, n, deliver)
		if err != nil || !merged {
			b.Fatalf("Catchup = %v, %v; want a merge", merged, err)
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
	if delivered == 0 {
		b.Fatal("nothing delivered")
	}
}
