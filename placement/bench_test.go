package placement_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/keyshard/keyshard/placement"
)

func equalMembers(n int) []placement.Member {
	ms := make([]placement.Member, n)
	for i := range ms {
		ms[i] = placement.Member{ID: fmt.Sprintf("member-%03d", i), Weight: 1, Zone: fmt.Sprintf("zone-%d", i%3)}
	}
	return ms
}

func benchKeys(n int) [][]byte {
	r := rand.New(rand.NewPCG(1, 2))
	keys := make([][]byte, n)
	for i := range keys {
		k := make([]byte, 16)
		for j := range k {
			k[j] = byte('a' + r.IntN(26))
		}
		keys[i] = k
	}
	return keys
}

var sink uint64

// BenchmarkHashOnly is the floor that BenchmarkOwner is compared with.
func BenchmarkHashOnly(b *testing.B) {
	keys := benchKeys(1024)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		sink += xxhash.Sum64(keys[i&1023])
	}
}

func BenchmarkOwner(b *testing.B) {
	for _, n := range []int{3, 200} {
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			p, _ := placement.Balance(placement.NewAssignment(16384), equalMembers(n))
			table, _ := placement.NewTable(placement.HashXXH64, p.Assignment)
			keys := benchKeys(1024)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				o, _ := table.Owner(keys[i&1023])
				sink += uint64(len(o))
			}
		})
	}
}

func BenchmarkBucketSynapse(b *testing.B) {
	h, _ := placement.NewHasher(placement.HashSynapse, 4096)
	keys := benchKeys(1024)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		sink += uint64(h.Bucket(keys[i&1023]))
	}
}

func BenchmarkBalance(b *testing.B) {
	for _, buckets := range []int{1024, 16384, 65536} {
		for _, n := range []int{3, 10, 50, 200} {
			ms := equalMembers(n + 1)
			base, _ := placement.Balance(placement.NewAssignment(buckets), ms[:n])
			b.Run(fmt.Sprintf("join/buckets=%d/members=%d", buckets, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					_, _ = placement.Balance(base.Assignment, ms)
				}
			})
			b.Run(fmt.Sprintf("leave/buckets=%d/members=%d", buckets, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					_, _ = placement.Balance(base.Assignment, ms[1:n])
				}
			})
		}
		b.Run(fmt.Sprintf("from-nothing/buckets=%d/members=200", buckets), func(b *testing.B) {
			empty := placement.NewAssignment(buckets)
			ms := equalMembers(200)
			b.ReportAllocs()
			for b.Loop() {
				_, _ = placement.Balance(empty, ms)
			}
		})
	}
}

func BenchmarkBalanceLoad(b *testing.B) {
	ms := equalMembers(50)
	base, _ := placement.Balance(placement.NewAssignment(16384), ms)
	r := rand.New(rand.NewPCG(3, 4))
	load := make([]float64, 16384)
	for i := range load {
		load[i] = r.ExpFloat64()
	}
	b.ReportAllocs()
	for b.Loop() {
		_, _ = placement.BalanceLoad(base.Assignment, ms, load, placement.LoadOptions{Tolerance: 0.05, MaxMoves: 64})
	}
}
