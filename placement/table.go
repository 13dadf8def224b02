package placement

import (
	"math"
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// Table answers "who owns this key" from a local copy of an assignment:
// one hash, one multiply and two array reads from a table of 2 bytes per
// bucket (128 KiB at 65536 buckets, so it stays in cache). It never
// allocates and is safe for concurrent reads; it is immutable once built,
// so a router swaps in a new *Table (for example with atomic.Pointer) when
// a new map arrives.
type Table struct {
	buckets uint64
	owner   []uint16 // per bucket, an index into names
	names   []string // names[owner[b]] is the owner; "" = unassigned
	synapse bool
	hasher  Hasher
}

// NewTable returns a Table for assignment a under hash mode mode. It
// returns an error wrapping ErrInvalid if a is malformed or mode is
// unknown. The Table keeps its own copy of a.
func NewTable(mode HashMode, a Assignment) (*Table, error) {
	if err := a.Validate(); err != nil {
		return nil, err
	}
	h, err := NewHasher(mode, len(a.Owners))
	if err != nil {
		return nil, err
	}
	t := &Table{buckets: uint64(len(a.Owners)), owner: make([]uint16, len(a.Owners)), synapse: h.mode == HashSynapse, hasher: h}
	// Index only the members that own something. names[0] is "" for
	// unassigned buckets, unless 65536 distinct owners leave no room for
	// it, in which case every bucket is assigned.
	used := make([]bool, len(a.Members))
	distinct := 0
	for _, o := range a.Owners {
		if o != Unassigned && !used[o] {
			used[o] = true
			distinct++
		}
	}
	first := 1
	if distinct > math.MaxUint16 {
		first = 0
	}
	index := make([]int, len(a.Members))
	t.names = make([]string, first, first+distinct)
	for j, id := range a.Members {
		if used[j] {
			index[j] = len(t.names)
			t.names = append(t.names, id)
		}
	}
	for b, o := range a.Owners {
		if o != Unassigned {
			t.owner[b] = uint16(index[o])
		}
	}
	return t, nil
}

// Hasher returns the key → bucket function of the table.
func (t *Table) Hasher() Hasher { return t.hasher }

// Owner returns the owner of key and true, or "" and false if the key's
// bucket is unassigned.
func (t *Table) Owner(key []byte) (string, bool) {
	o := t.names[t.owner[t.bucket(key)]] // small enough to inline at the caller
	return o, o != ""
}

// OwnerString is Owner for a string key.
func (t *Table) OwnerString(key string) (string, bool) {
	o := t.names[t.owner[t.bucketString(key)]]
	return o, o != ""
}

func (t *Table) bucket(key []byte) uint64 {
	if t.synapse {
		return uint64(t.hasher.Bucket(key))
	}
	b, _ := bits.Mul64(xxhash.Sum64(key), t.buckets)
	return b
}

func (t *Table) bucketString(key string) uint64 {
	if t.synapse {
		return uint64(t.hasher.BucketString(key))
	}
	b, _ := bits.Mul64(xxhash.Sum64String(key), t.buckets)
	return b
}

// BucketOwner returns the owner of bucket b and true, or "" and false if b
// is unassigned or out of range.
func (t *Table) BucketOwner(b int) (string, bool) {
	if b < 0 || b >= len(t.owner) {
		return "", false
	}
	o := t.names[t.owner[b]]
	return o, o != ""
}
