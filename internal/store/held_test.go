package store

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"pgregory.net/rapid"

	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/placement"
)

// TestHeldWireForm pins the stored form of a copy of grants: one group
// per token, the first bucket then the gaps, positions left out.
func TestHeldWireForm(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    shard.Held
		want string
	}{
		{"two tokens", shard.Held{Session: 5, Buckets: []shard.BucketToken{{Bucket: 2, Token: 9, Position: 70}, {Bucket: 3, Token: 4}, {Bucket: 7, Token: 9}, {Bucket: 10, Token: 4}}},
			`{"session":5,"held":[[4,3,7],[9,2,5]]}`},
		{"nothing held", shard.Held{Session: 5}, `{"session":5,"held":[]}`},
	} {
		b, err := EncodeHeld(tc.h)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if string(b) != tc.want {
			t.Errorf("%s: encoded %s, want %s", tc.name, b, tc.want)
		}
	}
}

// TestHeldRoundTrip: any valid copy decodes to itself, without positions,
// from its key.
func TestHeldRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, placement.MaxBuckets).Draw(t, "buckets")
		bs := rapid.SliceOfNDistinct(rapid.IntRange(0, n-1), 0, 200, rapid.ID).Draw(t, "held")
		h := shard.Held{Session: shard.LeaseID(rapid.Int64Range(1, 1<<62).Draw(t, "session"))}
		for _, b := range bs {
			h.Buckets = append(h.Buckets, shard.BucketToken{Bucket: b, Token: rapid.Uint64Range(1, 6).Draw(t, "token"), Position: rapid.Uint64().Draw(t, "from")})
		}
		shard.SortPairs(h.Buckets)
		data, err := EncodeHeld(h)
		if err != nil {
			t.Fatal(err)
		}
		kind, v, err := Decode(HeldKey("ev", "a"), data)
		if err != nil || kind != KindHeld {
			t.Fatalf("decode %s: kind %v, %v", data, kind, err)
		}
		want := shard.Held{Session: h.Session}
		for _, bt := range h.Buckets {
			want.Buckets = append(want.Buckets, shard.BucketToken{Bucket: bt.Bucket, Token: bt.Token})
		}
		if diff := cmp.Diff(want, v, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("%s decodes to (-want +got):\n%s", data, diff)
		}
	})
}

// TestHeldCorrupt: stored copies that are not canonical are refused,
// naming the field.
func TestHeldCorrupt(t *testing.T) {
	for _, data := range []string{
		`{"session":0,"held":[]}`,
		`{"session":5,"held":[[4]]}`,
		`{"session":5,"held":[[0,1]]}`,
		`{"session":5,"held":[[4,1],[4,2]]}`,
		`{"session":5,"held":[[9,1],[4,2]]}`,
		`{"session":5,"held":[[4,1,0]]}`,
		`{"session":5,"held":[[4,1],[5,1]]}`,
		`{"session":5,"held":[[4,65536]]}`,
		`{"session":5,"held":[[4,65535,1]]}`,
		`{"session":5,"held":[[4,-1]]}`,
		`{"session":5,"held":[],"buckets":[]}`,
	} {
		_, err := DecodeHeld(HeldKey("ev", "a"), []byte(data))
		var ce *CorruptError
		if !errors.As(err, &ce) || (ce.Field != "held" && ce.Field != "session" && ce.Field != "buckets") {
			t.Errorf("%s: %v; want a CorruptError naming a field", data, err)
		}
	}
	if _, err := EncodeHeld(shard.Held{Session: 5, Buckets: []shard.BucketToken{{Bucket: 3, Token: 1}, {Bucket: 2, Token: 1}}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("unsorted copy encoded: %v", err)
	}
}

// TestHeldBytes measures what a copy adds to a grant round, per member
// touched, against the grants it copies: a member holding its share of
// 4,096 buckets among 10 (and among 100), scattered, at a few tokens.
func TestHeldBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, members := range []int{10, 100} {
		g := shard.Grants{Session: 0x694d7b3c5a1e2f01}
		for b := range 4096 {
			if r.IntN(members) == 0 {
				g.Buckets = append(g.Buckets, shard.BucketToken{Bucket: b, Token: 1000 + uint64(r.IntN(4)), Position: 1 << 40})
			}
		}
		gb, err := EncodeGrants(g)
		if err != nil {
			t.Fatal(err)
		}
		hb, err := EncodeHeld(shard.Held(g))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("held_bytes 4096 buckets / %d members: %d buckets held: grants %d bytes, copy %d bytes (+%d key)", members, len(g.Buckets), len(gb), len(hb), len(HeldKey("ks", "member-01")))
		if len(hb)*2 > len(gb) {
			t.Errorf("the copy is %d bytes, more than half the grants' %d", len(hb), len(gb))
		}
	}
}
