package placement

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/big"
	"math/rand/v2"
	"strconv"
	"testing"
)

// TestSynapseImportMillionKeys: for N = 1..8 instances and several bucket
// counts that are multiples of N (one bucket per instance, 64 per
// instance, the multiple nearest 4096, and 65536/N rounded down to one),
// the imported map (SynapseAssignment) sends every one of a million keys
// (half Matrix user ids, half random bytes) to the instance Synapse's
// static mapping picks, int.from_bytes(sha256(key), "little") % N,
// computed independently with math/big. Each key is hashed once: the
// reference is reduced mod 840 (the least common multiple of 1..8) and
// the bucket is computed from the same digest (split into limbs once, as
// synapseBucket does) for every configuration, which keeps the test fast
// under the race detector.
func TestSynapseImportMillionKeys(t *testing.T) {
	keys := 1_000_000
	if testing.Short() {
		keys = 100_000
	}
	// The configurations, each checked exhaustively first: the imported
	// map gives bucket b to instance b mod N (Owners index a.Members,
	// which is the instances in order), so in the loop over keys a key's
	// owner is its bucket mod N.
	type config struct{ n, buckets uint64 }
	var configs [32]config
	nc := 0
	for n := 1; n <= 8; n++ {
		instances := make([]string, n)
		for i := range instances {
			instances[i] = fmt.Sprintf("sender%d", i+1)
		}
		nearest := max((DefaultBuckets+n/2)/n, 1) * n
		for _, b := range []int{n, 64 * n, nearest, MaxBuckets / n * n} {
			a, err := SynapseAssignment(b, instances)
			if err != nil {
				t.Fatalf("N=%d buckets=%d: %v", n, b, err)
			}
			for b, o := range a.Owners {
				if a.Members[o] != instances[b%n] {
					t.Fatalf("N=%d buckets=%d: bucket %d owned by %q, want %q", n, len(a.Owners), b, a.Members[o], instances[b%n])
				}
			}
			configs[nc] = config{uint64(n), uint64(b)}
			nc++
		}
	}
	lcm := big.NewInt(840)
	var x, r big.Int
	var le [32]byte
	rng := rand.New(rand.NewPCG(10, 5))
	key := make([]byte, 0, 64)
	for i := range keys {
		key = key[:0]
		if i%2 == 0 {
			key = strconv.AppendInt(append(key, "@user"...), int64(i), 10)
			key = append(key, ":example.org"...)
		} else {
			key = key[:16+rng.IntN(32)]
			for j := 0; j < len(key); j += 8 {
				binary.LittleEndian.PutUint64(le[:8], rng.Uint64())
				copy(key[j:], le[:8])
			}
		}
		sum := sha256.Sum256(key)
		for j := range 32 {
			le[31-j] = sum[j] // big.Int wants big-endian
		}
		ref := r.Mod(x.SetBytes(le[:]), lcm).Uint64()
		limbs := synapseLimbs(sum) // synapseBucket(sum, b) is synapseReduce(limbs, b)
		for _, c := range configs {
			if got, want := uint64(synapseReduce(limbs, c.buckets))%c.n, ref%c.n; got != want {
				t.Fatalf("key %q, N=%d, buckets=%d: owned by instance %d, Synapse picks %d", key, c.n, c.buckets, got, want)
			}
		}
	}
	// The public path hashes the same way.
	h, _ := NewHasher(HashSynapse, 4095)
	for i := range 1000 {
		k := fmt.Sprintf("@user%d:example.org", i)
		if got, want := h.BucketString(k), synapseBucket(sha256.Sum256([]byte(k)), uint64(h.Buckets())); got != want {
			t.Fatalf("Hasher.BucketString(%q) = %d, want %d", k, got, want)
		}
	}
}
