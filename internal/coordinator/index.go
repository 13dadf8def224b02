package coordinator

import (
	"math/bits"
	"time"

	"github.com/keyshard/keyshard/internal/shard"
)

// bucketIndex is a keyspace's per-bucket view of its grants, releases and
// map: who holds each bucket (by the grants records), at which token,
// whether that holder released it at that token, and which buckets are
// unsettled: held by someone other than their owner in the map, or
// released. apply notes what grants, releases and map events changed,
// and index brings it in step at a cost of what they changed; the drain scan and the
// grant round then visit the unsettled buckets only, reading slices. In a
// join storm of 1,000 members over 65,536 buckets, the full scans with a
// map lookup per bucket that this replaced took half of serve's CPU.
//
// Holders are interned (keyspace.intern), as are the map's members, so
// that comparing a holder with an owner compares pointers.
type bucketIndex struct {
	valid    bool // false: rebuilt from the records on next use
	holder   []string
	token    []uint64
	released []bool
	claims   []uint8 // how many grants records list the bucket
	// unsettled has bit b set when bucket b's holder is not its owner in
	// the map, or it released the bucket: what the grant round acts on
	// and the drain scan watches.
	unsettled []uint64
	// waitSince is, per bucket, since when its holder has been asked to
	// release it (zero: it is not); cleared when the bucket settles.
	waitSince []time.Time
}

// index returns the keyspace's bucket index, rebuilt first if an event
// left it stale.
func (k *keyspace) index() *bucketIndex {
	x := &k.idx
	n := k.cfg.Buckets
	if x.valid && len(x.holder) == n {
		k.flush()
		if k.mapChanged {
			k.mapChanged = false
			k.settleAll()
		}
		if x.valid {
			return x
		}
	}
	clear(k.pendGrants)
	clear(k.pendRel)
	k.mapChanged = false
	if len(x.holder) != n {
		*x = bucketIndex{
			holder: make([]string, n), token: make([]uint64, n), released: make([]bool, n),
			claims: make([]uint8, n), unsettled: make([]uint64, (n+63)/64), waitSince: make([]time.Time, n),
		}
	} else {
		clear(x.holder)
		clear(x.token)
		clear(x.released)
		clear(x.claims)
	}
	for id, g := range k.grants {
		id = k.intern(id)
		rel := k.releases[id]
		for _, bt := range g.Buckets {
			if b := bt.Bucket; b >= 0 && b < n {
				x.holder[b], x.token[b] = id, bt.Token
				x.released[b] = rel[b] == bt.Token
				x.claims[b] = min(x.claims[b]+1, 2)
			}
		}
	}
	x.valid = true
	k.settleAll()
	return x
}

// settleAll computes every bucket's unsettled bit again: after a rebuild,
// or once the map changed.
func (k *keyspace) settleAll() {
	x := &k.idx
	if !x.valid {
		return
	}
	for b := range x.holder {
		k.settle(b)
	}
}

// settle computes bucket b's unsettled bit from its holder, owner and
// release.
func (k *keyspace) settle(b int) {
	x := &k.idx
	h := x.holder[b]
	if h != k.m.Assignment.Owner(b) || (h != "" && x.released[b]) {
		x.unsettled[b/64] |= 1 << (b % 64)
		return
	}
	x.unsettled[b/64] &^= 1 << (b % 64)
	x.waitSince[b] = time.Time{}
}

// eachUnsettled calls fn with every unsettled bucket, in ascending order.
func (x *bucketIndex) eachUnsettled(fn func(b int)) {
	for w, word := range x.unsettled {
		for word != 0 {
			fn(w*64 + bits.TrailingZeros64(word))
			word &= word - 1
		}
	}
}

// grantsChanged notes that member id's grants change from old (the
// record before this event; empty: none). The index takes the changes of
// a whole batch of events at once (flush), so that a transaction that
// moves a bucket from one record to another is never seen half applied.
func (k *keyspace) grantsChanged(id string, old shard.Grants) {
	if !k.idx.valid {
		return
	}
	if _, ok := k.pendGrants[id]; !ok {
		if k.pendGrants == nil {
			k.pendGrants = map[string]shard.Grants{}
		}
		k.pendGrants[id] = old
	}
}

// releasesChanged notes that member id's releases change from old.
func (k *keyspace) releasesChanged(id string, old map[int]uint64) {
	if !k.idx.valid {
		return
	}
	if _, ok := k.pendRel[id]; !ok {
		if k.pendRel == nil {
			k.pendRel = map[string]map[int]uint64{}
		}
		k.pendRel[id] = old
	}
}

// flush applies the grants and releases changes noted since the last
// flush, and settles the buckets they touched. A bucket that two records
// list leaves the index to be rebuilt.
func (k *keyspace) flush() {
	x := &k.idx
	defer func() {
		clear(k.pendGrants)
		clear(k.pendRel)
	}()
	if !x.valid {
		return
	}
	n := len(x.holder)
	var touched []int
	for id, old := range k.pendGrants {
		for _, bt := range old.Buckets {
			if b := bt.Bucket; b >= 0 && b < n {
				if x.claims[b] > 0 {
					x.claims[b]--
				}
				if x.holder[b] == id {
					x.holder[b], x.token[b], x.released[b] = "", 0, false
				}
				touched = append(touched, b)
			}
		}
	}
	for id := range k.pendGrants {
		g, ok := k.grants[id]
		if !ok {
			continue
		}
		id = k.intern(id)
		rel := k.releases[id]
		for _, bt := range g.Buckets {
			if b := bt.Bucket; b >= 0 && b < n {
				x.claims[b] = min(x.claims[b], 254) + 1
				x.holder[b], x.token[b] = id, bt.Token
				x.released[b] = rel[b] == bt.Token
				touched = append(touched, b)
			}
		}
	}
	for id, old := range k.pendRel {
		now := k.releases[id]
		update := func(b int) {
			if b >= 0 && b < n && x.holder[b] == id {
				x.released[b] = now[b] == x.token[b]
				touched = append(touched, b)
			}
		}
		for b := range old {
			update(b)
		}
		for b := range now {
			if _, seen := old[b]; !seen {
				update(b)
			}
		}
	}
	for _, b := range touched {
		if x.claims[b] > 1 || (x.claims[b] == 1 && x.holder[b] == "") {
			// Two records list the bucket, or another record than the one
			// that dropped it: which holds it is the rebuild's answer.
			x.valid = false
			return
		}
	}
	for _, b := range touched {
		k.settle(b)
	}
}

// intern returns the keyspace's copy of a member id, so that equal ids in
// the index and the map share their bytes.
func (k *keyspace) intern(id string) string {
	if s, ok := k.ids[id]; ok {
		return s
	}
	if k.ids == nil {
		k.ids = map[string]string{}
	}
	k.ids[id] = id
	return id
}

// internMap returns a with its members interned, on a copy of the members
// slice (the event's map may be shared).
func (k *keyspace) internMap(m shard.Map) shard.Map {
	members := make([]string, len(m.Assignment.Members))
	for i, id := range m.Assignment.Members {
		members[i] = k.intern(id)
	}
	m.Assignment.Members = members
	return m
}
