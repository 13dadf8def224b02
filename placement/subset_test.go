package placement_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/keyshard/keyshard/placement"
	"pgregory.net/rapid"
)

// refSubsetHash is h(kind, tenant, name) from the Subset documentation,
// written out byte by byte.
func refSubsetHash(kind byte, tenant, name string) uint64 {
	b := []byte{kind}
	b = binary.LittleEndian.AppendUint64(b, uint64(len(tenant)))
	b = append(b, tenant...)
	b = append(b, name...)
	return xxhash.Sum64(b)
}

// refSubset is the documented algorithm, written as plainly as possible:
// rank every zone fully, order the zones, build the whole round-robin
// sequence and take its prefix.
func refSubset(tenant string, members []placement.Member, size int) []string {
	type ranked struct {
		id   string
		h    uint64
		key  float64
		zone string
	}
	byZone := map[string][]ranked{}
	var zones []string
	for _, m := range members {
		if m.Weight <= 0 {
			continue
		}
		h := refSubsetHash('m', tenant, m.ID)
		u := (float64(h>>11) + 0.5) / math.Pow(2, 53)
		if _, ok := byZone[m.Zone]; !ok {
			zones = append(zones, m.Zone)
		}
		byZone[m.Zone] = append(byZone[m.Zone], ranked{m.ID, h, -math.Log(u) / m.Weight, m.Zone})
	}
	for _, rs := range byZone {
		sort.Slice(rs, func(i, j int) bool {
			if rs[i].key != rs[j].key {
				return rs[i].key < rs[j].key
			}
			if rs[i].h != rs[j].h {
				return rs[i].h > rs[j].h
			}
			return rs[i].id < rs[j].id
		})
	}
	sort.Slice(zones, func(i, j int) bool {
		hi, hj := refSubsetHash('z', tenant, zones[i]), refSubsetHash('z', tenant, zones[j])
		if hi != hj {
			return hi > hj
		}
		return zones[i] < zones[j]
	})
	var seq []string
	for round := 0; ; round++ {
		took := false
		for _, z := range zones {
			if round < len(byZone[z]) {
				seq = append(seq, byZone[z][round].id)
				took = true
			}
		}
		if !took {
			break
		}
	}
	out := slices.Clone(seq[:min(size, len(seq))])
	slices.Sort(out)
	return out
}

// zoneCap is the largest number of members a subset of size may hold in one
// zone: ⌈size/zones⌉ when every zone is big enough, more when some zones are
// too small (the water level over the zone sizes).
func zoneCap(zoneSizes map[string]int, size int) int {
	for l := 0; ; l++ {
		c := 0
		for _, n := range zoneSizes {
			c += min(n, l)
		}
		if c >= size {
			return l
		}
	}
}

func eligibleZones(members []placement.Member) (map[string]int, map[string]string) {
	sizes := map[string]int{}
	zoneOf := map[string]string{}
	for _, m := range members {
		if m.Weight > 0 {
			sizes[m.Zone]++
			zoneOf[m.ID] = m.Zone
		}
	}
	return sizes, zoneOf
}

func genSubsetMembers(t *rapid.T, label string) []placement.Member {
	n := rapid.IntRange(0, 30).Draw(t, label+"Count")
	zones := rapid.IntRange(1, 4).Draw(t, label+"Zones")
	ids := rapid.Permutation(make100IDs()).Draw(t, label+"IDs")[:n]
	ms := make([]placement.Member, n)
	for i := range ms {
		ms[i] = placement.Member{
			ID:     ids[i],
			Weight: rapid.SampledFrom([]float64{0, 1, 1, 1, 1, 2, 0.5, 3}).Draw(t, label+"Weight"),
			Zone:   fmt.Sprintf("z%d", rapid.IntRange(0, zones-1).Draw(t, label+"Zone")),
		}
	}
	return ms
}

func make100IDs() []string {
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = fmt.Sprintf("m%02d", i)
	}
	return ids
}

func setDiff(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

func TestSubsetProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ms := genSubsetMembers(t, "m")
		tenant := rapid.StringMatching(`[a-z0-9-]{1,12}`).Draw(t, "tenant")
		size := rapid.IntRange(0, len(ms)+2).Draw(t, "size")
		got, err := placement.Subset(tenant, ms, size)
		if err != nil {
			t.Fatal(err)
		}
		// Matches the reference implementation of the documented hash.
		if want := refSubset(tenant, ms, size); !slices.Equal(got, want) {
			t.Fatalf("Subset = %v, reference %v", got, want)
		}
		// Member order does not matter.
		perm := rapid.Permutation(ms).Draw(t, "perm")
		if again, _ := placement.Subset(tenant, perm, size); !slices.Equal(got, again) {
			t.Fatalf("permuted members: %v, want %v", again, got)
		}
		// Size, order, eligibility, zone spread.
		zoneSizes, zoneOf := eligibleZones(ms)
		if want := min(size, len(zoneOf)); len(got) != want {
			t.Fatalf("len = %d, want %d", len(got), want)
		}
		if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
			t.Fatalf("not sorted and distinct: %v", got)
		}
		perZone := map[string]int{}
		for _, id := range got {
			z, ok := zoneOf[id]
			if !ok {
				t.Fatalf("%s is not an eligible member", id)
			}
			perZone[z]++
		}
		for z, n := range perZone {
			if c := zoneCap(zoneSizes, len(got)); n > c {
				t.Fatalf("zone %s holds %d of %d members, cap %d", z, n, len(got), c)
			}
		}
		// size+1 is a superset of size.
		bigger, _ := placement.Subset(tenant, ms, size+1)
		if d := setDiff(got, bigger); len(d) > 0 {
			t.Fatalf("size %d has %v that size %d lacks", size, d, size+1)
		}
		// Adding one member changes the subset by at most one.
		added := append(slices.Clone(ms), placement.Member{
			ID:     "new",
			Weight: rapid.SampledFrom([]float64{1, 2, 0.5}).Draw(t, "newWeight"),
			Zone:   fmt.Sprintf("z%d", rapid.IntRange(0, 4).Draw(t, "newZone")),
		})
		after, _ := placement.Subset(tenant, added, size)
		if in, out := setDiff(after, got), setDiff(got, after); len(in) > 1 || len(out) > 1 {
			t.Fatalf("adding a member: +%v -%v", in, out)
		}
		// Removing one member, or draining it, changes it by at most one, and
		// both give the same subset.
		if len(ms) > 0 {
			i := rapid.IntRange(0, len(ms)-1).Draw(t, "remove")
			removed := slices.Delete(slices.Clone(ms), i, i+1)
			after, _ := placement.Subset(tenant, removed, size)
			if in, out := setDiff(after, got), setDiff(got, after); len(in) > 1 || len(out) > 1 {
				t.Fatalf("removing %s: +%v -%v", ms[i].ID, in, out)
			}
			drained := slices.Clone(ms)
			drained[i].Weight = 0
			if d, _ := placement.Subset(tenant, drained, size); !slices.Equal(d, after) {
				t.Fatalf("draining %s gives %v, removing it %v", ms[i].ID, d, after)
			}
		}
	})
}

// TestSubsetVectors pins the portable hash and the resulting subsets, for
// implementations in other languages to check against. The hashes were also
// checked with the reference xxhsum tool, for example
//
//	printf 'm\x08\x00\x00\x00\x00\x00\x00\x00tenant-1m00' | xxhsum -H64
func TestSubsetVectors(t *testing.T) {
	for _, h := range []struct {
		kind         byte
		tenant, name string
		want         uint64
	}{
		{'m', "tenant-1", "m00", 0x49d400e97e4f51c5},
		{'m', "tenant-1", "m01", 0xcdc411a0908eac7e},
		{'z', "tenant-1", "a", 0x072b2104bbc68c99},
		{'m', "", "", 0x5ca5e6250884215a},
	} {
		if got := refSubsetHash(h.kind, h.tenant, h.name); got != h.want {
			t.Errorf("h(%q, %q, %q) = %#016x, want %#016x", h.kind, h.tenant, h.name, got, h.want)
		}
	}
	ms := []placement.Member{
		{ID: "a1", Weight: 1, Zone: "a"}, {ID: "a2", Weight: 1, Zone: "a"}, {ID: "a3", Weight: 1, Zone: "a"},
		{ID: "b1", Weight: 1, Zone: "b"}, {ID: "b2", Weight: 1, Zone: "b"}, {ID: "b3", Weight: 1, Zone: "b"},
		{ID: "c1", Weight: 1, Zone: "c"}, {ID: "c2", Weight: 2, Zone: "c"}, {ID: "c3", Weight: 0, Zone: "c"},
	}
	for _, tc := range []struct {
		tenant string
		size   int
		want   []string
	}{
		{"tenant-1", 1, []string{"b1"}},
		{"tenant-1", 2, []string{"b1", "c2"}},
		{"tenant-1", 3, []string{"a1", "b1", "c2"}},
		{"tenant-1", 4, []string{"a1", "b1", "b2", "c2"}},
		{"tenant-1", 6, []string{"a1", "a3", "b1", "b2", "c1", "c2"}},
		{"tenant-1", 8, []string{"a1", "a2", "a3", "b1", "b2", "b3", "c1", "c2"}},
		{"tenant-2", 1, []string{"c1"}},
		{"tenant-2", 2, []string{"b3", "c1"}},
		{"tenant-2", 3, []string{"a3", "b3", "c1"}},
		{"tenant-2", 4, []string{"a3", "b3", "c1", "c2"}},
		{"tenant-2", 6, []string{"a1", "a3", "b2", "b3", "c1", "c2"}},
		{"tenant-2", 8, []string{"a1", "a2", "a3", "b1", "b2", "b3", "c1", "c2"}},
		{"acme", 1, []string{"b3"}},
		{"acme", 2, []string{"a3", "b3"}},
		{"acme", 3, []string{"a3", "b3", "c2"}},
		{"acme", 4, []string{"a3", "b2", "b3", "c2"}},
		{"acme", 6, []string{"a2", "a3", "b2", "b3", "c1", "c2"}},
		{"acme", 8, []string{"a1", "a2", "a3", "b1", "b2", "b3", "c1", "c2"}},
	} {
		got, err := placement.Subset(tc.tenant, ms, tc.size)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("Subset(%q, %d) = %q, want %q", tc.tenant, tc.size, got, tc.want)
		}
	}
}

func TestSubsetEdgeCases(t *testing.T) {
	three := []placement.Member{{ID: "a", Weight: 1}, {ID: "b", Weight: 1}, {ID: "c", Weight: 1}}
	for _, tc := range []struct {
		name    string
		tenant  string
		members []placement.Member
		size    int
		want    []string
		wantErr bool
	}{
		{name: "no members", tenant: "t", size: 3, want: []string{}},
		{name: "size zero", tenant: "t", members: three, size: 0, want: []string{}},
		{name: "size above pool is clamped", tenant: "t", members: three, size: 10, want: []string{"a", "b", "c"}},
		{name: "draining members are never chosen", tenant: "t", members: []placement.Member{{ID: "a", Weight: 0}, {ID: "b", Weight: 1}}, size: 2, want: []string{"b"}},
		{name: "all draining", tenant: "t", members: []placement.Member{{ID: "a"}, {ID: "b"}}, size: 1, want: []string{}},
		{name: "empty tenant", tenant: "", members: three, size: 1, wantErr: true},
		{name: "negative size", tenant: "t", members: three, size: -1, wantErr: true},
		{name: "duplicate member", tenant: "t", members: []placement.Member{{ID: "a", Weight: 1}, {ID: "a", Weight: 2, Zone: "z"}}, size: 1, wantErr: true},
		{name: "empty member ID", tenant: "t", members: []placement.Member{{ID: "", Weight: 1}}, size: 1, wantErr: true},
		{name: "NaN weight", tenant: "t", members: []placement.Member{{ID: "a", Weight: math.NaN()}}, size: 1, wantErr: true},
		{name: "negative weight", tenant: "t", members: []placement.Member{{ID: "a", Weight: -1}}, size: 1, wantErr: true},
		{name: "infinite weight", tenant: "t", members: []placement.Member{{ID: "a", Weight: math.Inf(1)}}, size: 1, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := placement.Subset(tc.tenant, tc.members, tc.size)
			if tc.wantErr {
				if !errors.Is(err, placement.ErrInvalid) {
					t.Fatalf("err = %v, want ErrInvalid", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Subset (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSubsetLargeSizes covers the sorting path for subsets above 64 members.
func TestSubsetLargeSizes(t *testing.T) {
	var ms []placement.Member
	for i := range 300 {
		ms = append(ms, placement.Member{ID: fmt.Sprintf("m%03d", i), Weight: float64(1 + i%3), Zone: fmt.Sprintf("z%d", i%7)})
	}
	for _, size := range []int{63, 64, 65, 100, 200, 299, 300} {
		got, err := placement.Subset("big", ms, size)
		if err != nil {
			t.Fatal(err)
		}
		if want := refSubset("big", ms, size); !slices.Equal(got, want) {
			t.Errorf("size %d: got %v, reference %v", size, got, want)
		}
	}
}

// TestSubsetSpread checks that over many tenants every member is chosen
// about equally often, and a member of weight 2 about twice as often.
func TestSubsetSpread(t *testing.T) {
	var ms []placement.Member
	for i := range 20 {
		ms = append(ms, placement.Member{ID: fmt.Sprintf("m%02d", i), Weight: 1})
	}
	ms[7].Weight = 2
	const tenants = 20000
	count := map[string]int{}
	for i := range tenants {
		got, err := placement.Subset(fmt.Sprint("t", i), ms, 1)
		if err != nil {
			t.Fatal(err)
		}
		count[got[0]]++
	}
	// Expected share: weight / total weight (21).
	for _, m := range ms {
		want := tenants * m.Weight / 21
		if got := float64(count[m.ID]); math.Abs(got-want) > 5*math.Sqrt(want) {
			t.Errorf("%s (weight %v) chosen %v times, want about %.0f", m.ID, m.Weight, got, want)
		}
	}
}

// TestSubsetOverlap checks that stateless subsets overlap like random ones.
func TestSubsetOverlap(t *testing.T) {
	ms := shufflePool(60, 3)
	rng := rand.New(rand.NewPCG(3, 4))
	subsets := map[string][]string{}
	for i := range 1500 {
		id := fmt.Sprintf("t%04d", i)
		s, err := placement.Subset(id, ms, 1+rng.IntN(8))
		if err != nil {
			t.Fatal(err)
		}
		subsets[id] = s
	}
	r := placement.Overlap(subsets, len(ms), 0)
	checkOverlapNearRandom(t, r)
}

func checkOverlapNearRandom(t shardTB, r placement.OverlapReport) {
	t.Helper()
	if r.ObservedMean > 1.05*r.ExpectedMean {
		t.Errorf("mean overlap %.4f, random %.4f\n%v", r.ObservedMean, r.ExpectedMean, r)
	}
	if r.ObservedTail > 1.5*r.ExpectedTail+0.002 {
		t.Errorf("tail %.5f, random %.5f\n%v", r.ObservedTail, r.ExpectedTail, r)
	}
	if r.ObservedFull > 1.5*r.ExpectedFull+0.002 {
		t.Errorf("full containment %.5f, random %.5f\n%v", r.ObservedFull, r.ExpectedFull, r)
	}
}

func FuzzSubset(f *testing.F) {
	f.Add("tenant", uint64(1), uint8(10), uint8(3), 3)
	f.Add("", uint64(2), uint8(0), uint8(1), 0)
	f.Add("t", uint64(3), uint8(200), uint8(9), 100)
	f.Add("x", uint64(4), uint8(5), uint8(2), -1)
	f.Fuzz(func(t *testing.T, tenant string, seed uint64, n, zones uint8, size int) {
		rng := rand.New(rand.NewPCG(seed, 1))
		ms := make([]placement.Member, n)
		for i := range ms {
			ms[i] = placement.Member{
				ID:     fmt.Sprintf("m%d", rng.IntN(int(n)*2+1)), // duplicates sometimes
				Weight: []float64{0, 1, 2, 0.25, math.NaN(), 1e-300, 1e300}[rng.IntN(7)],
				Zone:   fmt.Sprintf("z%d", rng.IntN(int(zones)+1)),
			}
		}
		size %= 1000
		got, err := placement.Subset(tenant, ms, size)
		if err != nil {
			if !errors.Is(err, placement.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		_, zoneOf := eligibleZones(ms)
		if len(got) != min(size, len(zoneOf)) {
			t.Fatalf("len %d, want %d", len(got), min(size, len(zoneOf)))
		}
		if want := refSubset(tenant, ms, size); !slices.Equal(got, want) {
			t.Fatalf("Subset = %v, reference %v", got, want)
		}
	})
}
