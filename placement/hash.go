package placement

import (
	"crypto/sha256"
	"encoding/binary"
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// HashMode names the function that maps a key to a bucket. It is part of a
// keyspace's identity: every client of a keyspace must use the same mode
// and bucket count, so neither may change while clients run.
type HashMode string

const (
	// HashXXH64 is the default: XXH64 (seed 0) of the key's bytes, reduced
	// to [0, B) by multiply-shift:
	//
	//	bucket = (xxh64(key, seed=0) * B) >> 64   // 128-bit product, high word
	//
	// In Python: (xxhash.xxh64_intdigest(key) * B) >> 64. The reduction has
	// no modulo bias worth measuring: each bucket receives either
	// ⌊2^64/B⌋ or ⌈2^64/B⌉ of the 2^64 hash values, a relative
	// difference below 2^-48 for B ≤ 65536.
	HashXXH64 HashMode = "xxh64"

	// HashSynapse reproduces the static sharding of Synapse (and any service
	// that picks an instance with int.from_bytes(sha256(key), "little") %
	// len(instances)):
	//
	//	bucket = int.from_bytes(sha256(key).digest(), "little") % B
	//
	// When B is a multiple of the number of instances, bucket % N equals
	// Synapse's instance index, so SynapseAssignment builds a first map
	// that moves no key on day one.
	HashSynapse HashMode = "synapse-sha256"
)

// Bucket-count limits and the default. Use at least 32 buckets per member:
// with 5 buckets per member, rounding alone makes one member 20% busier
// than the mean, while with 32 the difference is at most about 3%.
const (
	MinBuckets     = 1
	MaxBuckets     = 65536
	DefaultBuckets = 4096
)

// Hasher maps keys to buckets for one (mode, bucket count) pair. The zero
// value is not usable; build one with NewHasher. A Hasher is a small value,
// safe for concurrent use.
type Hasher struct {
	mode    HashMode
	buckets uint64
}

// NewHasher returns the Hasher for mode and buckets. It returns an error
// wrapping ErrInvalid for an unknown mode or a bucket count outside
// [MinBuckets, MaxBuckets]. An empty mode means HashXXH64.
func NewHasher(mode HashMode, buckets int) (Hasher, error) {
	if mode == "" {
		mode = HashXXH64
	}
	if err := mode.Validate(); err != nil {
		return Hasher{}, err
	}
	if err := validateBuckets(buckets); err != nil {
		return Hasher{}, err
	}
	return Hasher{mode: mode, buckets: uint64(buckets)}, nil
}

// Validate returns an error wrapping ErrInvalid unless m is a known mode.
func (m HashMode) Validate() error {
	switch m {
	case HashXXH64, HashSynapse:
		return nil
	}
	return invalidf("hash mode %q is unknown; use %q or %q", string(m), HashXXH64, HashSynapse)
}

func validateBuckets(b int) error {
	if b < MinBuckets || b > MaxBuckets {
		return invalidf("bucket count %d is out of range [%d, %d]", b, MinBuckets, MaxBuckets)
	}
	return nil
}

// Mode returns the hash mode.
func (h Hasher) Mode() HashMode { return h.mode }

// Buckets returns the bucket count.
func (h Hasher) Buckets() int { return int(h.buckets) }

// Bucket returns the bucket of key, in [0, Buckets()). It does not allocate.
func (h Hasher) Bucket(key []byte) int {
	if h.mode == HashSynapse {
		return synapseBucket(sha256.Sum256(key), h.buckets)
	}
	hi, _ := bits.Mul64(xxhash.Sum64(key), h.buckets)
	return int(hi)
}

// BucketString is Bucket for a string key, without converting it.
func (h Hasher) BucketString(key string) int {
	if h.mode == HashSynapse {
		return synapseBucket(sha256.Sum256([]byte(key)), h.buckets)
	}
	hi, _ := bits.Mul64(xxhash.Sum64String(key), h.buckets)
	return int(hi)
}

// synapseBucket reduces the 256-bit little-endian integer in sum modulo n.
func synapseBucket(sum [32]byte, n uint64) int {
	return synapseReduce(synapseLimbs(sum), n)
}

// synapseLimbs splits the 256-bit little-endian integer in sum into its
// 64-bit limbs, least significant first.
func synapseLimbs(sum [32]byte) [4]uint64 {
	return [4]uint64{
		binary.LittleEndian.Uint64(sum[0:]), binary.LittleEndian.Uint64(sum[8:]),
		binary.LittleEndian.Uint64(sum[16:]), binary.LittleEndian.Uint64(sum[24:]),
	}
}

// synapseReduce returns the integer of limbs modulo n.
func synapseReduce(limbs [4]uint64, n uint64) int {
	var r uint64
	for i := 3; i >= 0; i-- { // most significant limb first
		r = bits.Rem64(r, limbs[i], n)
	}
	return int(r)
}

// SynapseAssignment returns the assignment that reproduces a static
// Synapse-style mapping over the ordered instance list: with HashSynapse,
// every key maps to instances[int.from_bytes(sha256(key), "little") %
// len(instances)], exactly as before. buckets must be a multiple of
// len(instances) (the error names the nearest counts that are); import
// this as a keyspace's first map so that no key moves on day one.
func SynapseAssignment(buckets int, instances []string) (Assignment, error) {
	if err := validateBuckets(buckets); err != nil {
		return Assignment{}, err
	}
	n := len(instances)
	if n == 0 {
		return Assignment{}, invalidf("synapse mapping needs at least one instance")
	}
	seen := make(map[string]bool, n)
	for i, id := range instances {
		if id == "" {
			return Assignment{}, invalidf("instance %d has an empty name", i)
		}
		if seen[id] {
			return Assignment{}, invalidf("instance %q appears twice; the Synapse list must name each instance once", id)
		}
		seen[id] = true
	}
	if buckets%n != 0 {
		lo := buckets / n * n
		hi := lo + n
		if lo < MinBuckets {
			lo = n
		}
		if hi > MaxBuckets {
			hi = lo
		}
		return Assignment{}, invalidf("bucket count %d is not a multiple of the %d instances, so the Synapse mapping cannot be kept; use %d or %d buckets", buckets, n, lo, hi)
	}
	a := Assignment{Members: append([]string(nil), instances...), Owners: make([]int32, buckets)}
	for b := range a.Owners {
		a.Owners[b] = int32(b % n)
	}
	return a, nil
}
