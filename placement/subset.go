package placement

import (
	"cmp"
	"encoding/binary"
	"math"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// Subset returns the shuffle shard of tenant: size members chosen from
// members without any state, sorted by ID. It is the stateless counterpart of
// [Shards], for a client that knows only the member list, and gives the
// guarantees of dskit's ring.ShuffleShard:
//
//   - the same tenant, member set and size give the same subset, whatever the
//     order of members;
//   - adding or removing one member (or setting its weight to 0) changes each
//     subset by at most one member: at most one member joins it and at most
//     one leaves it;
//   - the subset of size n+1 contains the subset of size n;
//   - members are spread over zones round-robin, so a zone holds at most
//     ⌈size/zones⌉ of them unless other zones run out of members.
//
// Members with weight 0 are draining and never chosen. Within its zone a
// member ranks first with probability proportional to its weight, so a member
// of weight 2 serves about twice as many tenants as one of weight 1 (exactly
// so for the first member taken from a zone, nearly so while subsets take a
// small part of each zone).
//
// The ranking is portable so that other languages can reproduce it. With
// XXH64 the 64-bit xxHash with seed 0 and le64(n) the 8-byte little-endian
// encoding of n,
//
//	h(kind, tenant, name) = XXH64(kind || le64(len(tenant)) || tenant || name)
//
// where kind is the byte 'm' for a member ID and 'z' for a zone name, and
// lengths count bytes. A member ranks by its key
//
//	key = -ln(u) / weight,   u = ((h('m', tenant, id) >> 11) + 0.5) / 2^53
//
// in IEEE 754 double precision, smallest key first; ties go to the larger
// hash, then to the smaller ID. (For members of equal weight this is just the
// order of the hashes, largest first.) Zones are ordered by h('z', tenant,
// zone), largest first, ties to the smaller name. The subset sequence visits
// the zones in that order again and again, taking the next-ranked unused
// member of each zone that has one left; the subset is the first size members
// of the sequence. A size larger than the number of members with positive
// weight is clamped to that number; size 0 gives an empty subset.
//
// Subset returns an error wrapping [ErrInvalid] for an empty tenant, a
// negative size or invalid members (see [Member]).
func Subset(tenant string, members []Member, size int) ([]string, error) {
	if tenant == "" {
		return nil, invalidf("tenant ID is empty")
	}
	if size < 0 {
		return nil, invalidf("tenant %q: size %d is negative", tenant, size)
	}
	for _, m := range members {
		if m.ID == "" || math.IsNaN(m.Weight) || math.IsInf(m.Weight, 0) || m.Weight < 0 {
			_, err := sortedMembers(members)
			return nil, err
		}
	}
	// Candidates are the members with positive weight, numbered by zone.
	var zoneNames []string
	var zoneIdx map[string]int32 // used once there are many zones
	zoneOf := func(name string) int32 {
		if zoneIdx == nil {
			for i, z := range zoneNames {
				if z == name {
					return int32(i)
				}
			}
			if len(zoneNames) < 8 {
				zoneNames = append(zoneNames, name)
				return int32(len(zoneNames) - 1)
			}
			zoneIdx = make(map[string]int32, 2*len(zoneNames))
			for i, z := range zoneNames {
				zoneIdx[z] = int32(i)
			}
		}
		z, ok := zoneIdx[name]
		if !ok {
			z = int32(len(zoneNames))
			zoneNames = append(zoneNames, name)
			zoneIdx[name] = z
		}
		return z
	}
	buf := subsetPrefix(nil, 'm', tenant)
	pre := len(buf)
	hashes := make([]uint64, len(members))
	cands := make([]subsetCand, 0, len(members))
	weighted := false // whether positive weights differ
	for i, m := range members {
		buf = append(buf[:pre], m.ID...)
		hashes[i] = xxhash.Sum64(buf)
		if m.Weight <= 0 {
			continue
		}
		if len(cands) > 0 && m.Weight != members[cands[0].idx].Weight {
			weighted = true
		}
		cands = append(cands, subsetCand{hash: hashes[i], idx: int32(i), zone: zoneOf(m.Zone)})
	}
	if hasEqual(hashes) {
		// Equal IDs have equal hashes; look closer only then.
		if _, err := sortedMembers(members); err != nil {
			return nil, err
		}
	}
	if size >= len(cands) {
		out := make([]string, len(cands))
		for i, c := range cands {
			out[i] = members[c.idx].ID
		}
		slices.Sort(out)
		return out, nil
	}
	if size == 0 {
		return []string{}, nil
	}
	if weighted {
		for i := range cands {
			cands[i].key = subsetKey(cands[i].hash, members[cands[i].idx].Weight)
		}
	}

	// Order the zones, then count how many members the round-robin sequence
	// takes from each: that depends only on the zone sizes.
	buf = subsetPrefix(buf[:0], 'z', tenant)
	pre = len(buf)
	zones := make([]subsetZone, len(zoneNames))
	for i, name := range zoneNames {
		buf = append(buf[:pre], name...)
		zones[i] = subsetZone{name: name, hash: xxhash.Sum64(buf)}
	}
	for _, c := range cands {
		zones[c.zone].size++
	}
	order := make([]int32, len(zones))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(a, b int32) int {
		if c := cmp.Compare(zones[b].hash, zones[a].hash); c != 0 {
			return c
		}
		return cmp.Compare(zones[a].name, zones[b].name)
	})
	for taken, round := 0, 0; taken < size; round++ {
		for _, z := range order {
			if round < zones[z].size && taken < size {
				zones[z].take++
				taken++
			}
		}
	}

	// Keep the best take members of each zone.
	better := func(a, b subsetCand) bool {
		if a.key != b.key {
			return a.key < b.key
		}
		if a.hash != b.hash {
			return a.hash > b.hash
		}
		return members[a.idx].ID < members[b.idx].ID
	}
	top := make([]subsetCand, size)
	if size > 64 {
		// Large subsets: sort instead of inserting into long buffers.
		slices.SortFunc(cands, func(a, b subsetCand) int {
			switch {
			case a.zone != b.zone:
				return cmp.Compare(a.zone, b.zone)
			case better(a, b):
				return -1
			case better(b, a):
				return 1
			}
			return 0
		})
		top = top[:0]
		for i := 0; i < len(cands); {
			z := zones[cands[i].zone]
			top = append(top, cands[i:i+z.take]...)
			i += z.size
		}
		cands = nil
	}
	off := 0
	for i := range zones {
		zones[i].top = off
		off += zones[i].take
	}
	for _, c := range cands {
		z := &zones[c.zone]
		if z.take == 0 {
			continue
		}
		buf := top[z.top : z.top+z.take]
		n := z.have
		if n == len(buf) {
			if !better(c, buf[n-1]) {
				continue
			}
			n-- // drop the worst
		} else {
			z.have++
		}
		i := n
		for i > 0 && better(c, buf[i-1]) {
			buf[i] = buf[i-1]
			i--
		}
		buf[i] = c
	}
	out := make([]string, size)
	for i, c := range top {
		out[i] = members[c.idx].ID
	}
	slices.Sort(out)
	return out, nil
}

// subsetCand is a member with positive weight, ranked for one tenant. It
// holds no pointers, so that sorting it is cheap.
type subsetCand struct {
	key  float64
	hash uint64
	idx  int32 // index in the caller's members
	zone int32 // index in zoneNames
}

type subsetZone struct {
	name      string
	hash      uint64
	size      int // candidates in the zone
	take      int // how many of them the subset takes
	top, have int // where the best of them are kept in a shared buffer, and how many so far
}

// subsetPrefix appends kind and the length-prefixed tenant to buf; appending
// a name and hashing the result with XXH64 gives h(kind, tenant, name) as
// documented on Subset.
func subsetPrefix(buf []byte, kind byte, tenant string) []byte {
	buf = append(buf, kind)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(len(tenant)))
	return append(buf, tenant...)
}

// subsetKey is the weighted rendezvous key of a member: the arrival time of
// an exponential clock of rate weight, driven by the top 53 bits of hash.
func subsetKey(hash uint64, weight float64) float64 {
	u := (float64(hash>>11) + 0.5) / (1 << 53)
	return -math.Log(u) / weight
}

// hasEqual reports whether two of hashes are equal, using an
// open-addressing set.
func hasEqual(hashes []uint64) bool {
	n := 1
	for n < 2*len(hashes) {
		n *= 2
	}
	slots := make([]uint64, n)
	used := make([]bool, n)
	for _, h := range hashes {
		i := int(h & uint64(n-1))
		for used[i] {
			if slots[i] == h {
				return true
			}
			i = (i + 1) & (n - 1)
		}
		slots[i], used[i] = h, true
	}
	return false
}
