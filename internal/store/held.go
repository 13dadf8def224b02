package store

import (
	"maps"
	"slices"

	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/placement"
)

// The copy of a stream member's grants (shard.Held), stored at
// held/<ks>/<id> without a lease. Only the leader writes it, in the
// Commit that writes the member's grants, with an expectation on both, so
// the two agree while the session lives; it outlives the session so that
// the leader can fold the session's commit record exactly after its
// grants vanished. The leader deletes it in the round that folds that
// record (or, when the session never committed, once the session has
// ended or holds nothing).
//
// JSON: {"session":L,"held":[[token,first,gap,gap,...],...]}: one group
// per grant token, tokens ascending, each listing the buckets held at
// that token as the first bucket and the gaps to the next ones (each >=
// 1), so a bucket costs a few bytes whatever its number: about 3 bytes
// for a member holding a tenth of 4,096 buckets, against 10 in the
// grants' [[bucket,token],...]. A session that holds nothing has
// "held":[].

type heldOut struct {
	Session int64      `json:"session"`
	Held    [][]uint64 `json:"held"`
}

type heldIn struct {
	Session int64    `json:"session"`
	Held    uintRows `json:"held"`
}

var heldFields = []string{"session", "held"}

// validateHeld checks h as grants are checked: a session and sorted,
// distinct buckets with tokens >= 1.
func validateHeld(h shard.Held) *fieldError {
	if h.Session <= 0 {
		return ferr("session", "%d is not a lease id", int64(h.Session))
	}
	return validatePairs("held", h.Buckets)
}

// EncodeHeld returns the stored form of h, stored at held/<ks>/<id>
// without a lease. Positions are not stored. It returns an error wrapping
// ErrInvalid if h has no session or its buckets are not sorted and
// distinct with tokens >= 1.
func EncodeHeld(h shard.Held) ([]byte, error) {
	if e := validateHeld(h); e != nil {
		return nil, e.invalid("held")
	}
	last := map[uint64]int{}
	groups := map[uint64][]uint64{}
	for _, bt := range h.Buckets {
		g, ok := groups[bt.Token]
		if !ok {
			g = []uint64{bt.Token, uint64(bt.Bucket)}
		} else {
			g = append(g, uint64(bt.Bucket-last[bt.Token]))
		}
		groups[bt.Token], last[bt.Token] = g, bt.Bucket
	}
	w := heldOut{Session: int64(h.Session), Held: [][]uint64{}}
	for _, t := range slices.Sorted(maps.Keys(groups)) {
		w.Held = append(w.Held, groups[t])
	}
	return marshal(w)
}

// DecodeHeld decodes the value stored at key. Errors wrap ErrCorrupt and
// name key and field.
func DecodeHeld(key string, data []byte) (shard.Held, error) {
	var w heldIn
	if err := decodeStrict(key, data, heldFields, &w); err != nil {
		return shard.Held{}, err
	}
	h := shard.Held{Session: shard.LeaseID(w.Session)}
	var prevToken uint64
	for i := range w.Held.Len() {
		g := w.Held.Row(i)
		if len(g) < 2 {
			return shard.Held{}, corruptf(key, "held", "entry %d has %d elements; want [token, first bucket, gaps...]", i, len(g))
		}
		if err := w.Held.Err(i, 0); err != nil {
			return shard.Held{}, corruptf(key, "held", "entry %d: token: %v", i, err)
		}
		t := g[0]
		if t == 0 || t <= prevToken {
			return shard.Held{}, corruptf(key, "held", "entry %d: token %d; want tokens >= 1, ascending, each once", i, t)
		}
		prevToken = t
		var b uint64
		for j, v := range g[1:] {
			if err := w.Held.Err(i, j+1); err != nil {
				return shard.Held{}, corruptf(key, "held", "entry %d (token %d): element %d: %v", i, t, j+1, err)
			}
			if j > 0 && v == 0 {
				return shard.Held{}, corruptf(key, "held", "entry %d (token %d): element %d: gap 0; buckets ascend", i, t, j+1)
			}
			if v >= placement.MaxBuckets || b+v >= placement.MaxBuckets {
				return shard.Held{}, corruptf(key, "held", "entry %d (token %d): element %d: bucket is outside [0, %d)", i, t, j+1, placement.MaxBuckets)
			}
			b += v
			h.Buckets = append(h.Buckets, shard.BucketToken{Bucket: int(b), Token: t})
		}
	}
	shard.SortPairs(h.Buckets)
	if e := validateHeld(h); e != nil {
		return shard.Held{}, e.corrupt(key)
	}
	return h, nil
}

// PutHeld writes the copy of member id's grants, without a lease. The
// leader writes it in the Commit that writes the grants (PutGrants), with
// an expectation on both.
func PutHeld(ks, id string, h shard.Held) Write {
	b, err := EncodeHeld(h)
	return Write{key: HeldKey(ks, id), val: b, err: nameErr(err, ks, id)}
}
