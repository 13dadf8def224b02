package store

import (
	"errors"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"pgregory.net/rapid"

	"github.com/keyshard/keyshard/internal/shard"
)

var (
	sampleCommit = shard.Commit{Session: 0x694d7b3c5a1e2f01, MaxToken: 41, Default: 1 << 40, Exceptions: []shard.BucketPosition{
		{Bucket: 3, Token: 9, Position: 17}, {Bucket: 4095, Token: 41, Position: 1<<40 - 5},
	}}
	samplePositions = shard.BucketPositions{Runs: []shard.PositionRun{{First: 4096, Count: 3, Position: 7}, {First: 4099, Count: 1, Position: 9}, {First: 5000, Count: 3192, Position: 7}}}
)

// TestPositionsWireForm pins the stored forms of the stream records, and
// that grants and releases without positions keep the bytes they had
// before positions existed.
func TestPositionsWireForm(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  func() ([]byte, error)
		want string
	}{
		{"commit", func() ([]byte, error) {
			return EncodeCommit(shard.Commit{Session: 5, MaxToken: 9, Default: 100, Exceptions: []shard.BucketPosition{{Bucket: 2, Token: 8, Position: 40}}})
		}, `{"session":5,"max_token":9,"default":100,"exceptions":[[2,8,40]]}`},
		{"commit uniform", func() ([]byte, error) { return EncodeCommit(shard.Commit{Session: 5, MaxToken: 9, Default: 100}) },
			`{"session":5,"max_token":9,"default":100}`},
		{"bucket positions", func() ([]byte, error) {
			return EncodeBucketPositions(1, shard.BucketPositions{Runs: []shard.PositionRun{{First: 4096, Count: 10, Position: 7}}})
		}, `{"runs":[[4096,10,7]]}`},
		{"bucket positions empty", func() ([]byte, error) { return EncodeBucketPositions(0, shard.BucketPositions{}) }, `{"runs":[]}`},
		{"grants from", func() ([]byte, error) {
			return EncodeGrants(shard.Grants{Session: 5, Buckets: []shard.BucketToken{{Bucket: 2, Token: 3, Position: 70}, {Bucket: 4, Token: 3}}})
		}, `{"session":5,"buckets":[[2,3],[4,3]],"from":[[2,70]]}`},
		{"grants exclusive", func() ([]byte, error) {
			return EncodeGrants(shard.Grants{Session: 5, Buckets: []shard.BucketToken{{Bucket: 2, Token: 3}}})
		}, `{"session":5,"buckets":[[2,3]]}`},
		{"releases positions", func() ([]byte, error) {
			return EncodeReleases(shard.Releases{Buckets: []shard.BucketToken{{Bucket: 1, Token: 2}, {Bucket: 9, Token: 3, Position: 12}}})
		}, `{"buckets":[[1,2],[9,3]],"positions":[[9,12]]}`},
		{"releases exclusive", func() ([]byte, error) {
			return EncodeReleases(shard.Releases{Buckets: []shard.BucketToken{{Bucket: 1, Token: 2}}})
		}, `{"buckets":[[1,2]]}`},
	} {
		b, err := tc.got()
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if string(b) != tc.want {
			t.Errorf("%s: encoded %s, want %s", tc.name, b, tc.want)
		}
	}
}

// TestCommitBytes is the commit_bytes_uniform_4096 target: a commit of any
// number of buckets at one position is one value of a few dozen bytes,
// and exceptions cost a few dozen bytes each. The values are the largest
// of their kind, so real commits are smaller.
func TestCommitBytes(t *testing.T) {
	uniform := shard.Commit{Session: math.MaxInt64, MaxToken: math.MaxUint64, Default: math.MaxUint64}
	b, err := EncodeCommit(uniform)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("commit_bytes_uniform_4096: %d bytes", len(b))
	if len(b) > 128 {
		t.Errorf("uniform commit is %d bytes: %s; want <= 128", len(b), b)
	}
	with16 := uniform
	for i := range 16 {
		with16.Exceptions = append(with16.Exceptions, shard.BucketPosition{Bucket: 65520 + i, Token: math.MaxUint64, Position: math.MaxUint64})
	}
	b, err = EncodeCommit(with16)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("commit with 16 exceptions: %d bytes", len(b))
	if len(b) > 1024 {
		t.Errorf("commit with 16 exceptions is %d bytes; want <= 1024", len(b))
	}
}

func TestPositionsRoundTrip(t *testing.T) {
	opts := cmpopts.EquateEmpty()
	for _, c := range []shard.Commit{sampleCommit, {Session: 1}, {Session: math.MaxInt64, MaxToken: math.MaxUint64, Default: math.MaxUint64}} {
		b, err := EncodeCommit(c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeCommit(PositionsKey("ks", "w-1"), b)
		if err != nil {
			t.Fatalf("decode %s: %v", b, err)
		}
		if diff := cmp.Diff(c, got, opts); diff != "" {
			t.Errorf("commit round trip (-want +got):\n%s", diff)
		}
	}
	b, err := EncodeBucketPositions(1, samplePositions)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeBucketPositions(BucketPosKey("ks", 1), b)
	if err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	if diff := cmp.Diff(samplePositions, got, opts); diff != "" {
		t.Errorf("bucket positions round trip (-want +got):\n%s", diff)
	}
	g := shard.Grants{Session: 3, Buckets: []shard.BucketToken{{Bucket: 0, Token: 1, Position: math.MaxUint64}, {Bucket: 7, Token: 2}, {Bucket: 65535, Token: 3, Position: 1}}}
	gb, err := EncodeGrants(g)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeGrants(GrantsKey("ks", "w-1"), gb); err != nil || !cmp.Equal(g, got) {
		t.Errorf("grants round trip of %s: %+v, %v", gb, got, err)
	}
	r := shard.Releases{Buckets: []shard.BucketToken{{Bucket: 1, Token: 1, Position: 5}, {Bucket: 2, Token: 2}}}
	rb, err := EncodeReleases(r)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeReleases(ReleasesKey("ks", "w-1"), rb); err != nil || !cmp.Equal(r, got) {
		t.Errorf("releases round trip of %s: %+v, %v", rb, got, err)
	}
}

func TestPositionsCorrupt(t *testing.T) {
	pk, bk, gk, rk := PositionsKey("ks", "w-1"), BucketPosKey("ks", 0), GrantsKey("ks", "w-1"), ReleasesKey("ks", "w-1")
	decCommit := func(k string, b []byte) error { _, err := DecodeCommit(k, b); return err }
	decPos := func(k string, b []byte) error { _, err := DecodeBucketPositions(k, b); return err }
	decGrants := func(k string, b []byte) error { _, err := DecodeGrants(k, b); return err }
	decReleases := func(k string, b []byte) error { _, err := DecodeReleases(k, b); return err }
	for _, tc := range []struct {
		name, key, val, field string
		dec                   func(string, []byte) error
	}{
		{"commit no session", pk, `{"max_token":1,"default":1}`, "session", decCommit},
		{"commit unknown", pk, `{"session":1,"max_token":1,"default":1,"defaults":1}`, "defaults", decCommit},
		{"commit negative", pk, `{"session":1,"max_token":1,"default":-1}`, "default", decCommit},
		{"commit unsorted", pk, `{"session":1,"max_token":1,"default":1,"exceptions":[[2,1,1],[1,1,1]]}`, "exceptions", decCommit},
		{"commit duplicate", pk, `{"session":1,"max_token":1,"default":1,"exceptions":[[2,1,1],[2,1,3]]}`, "exceptions", decCommit},
		{"commit token 0", pk, `{"session":1,"max_token":1,"default":1,"exceptions":[[2,0,1]]}`, "exceptions", decCommit},
		{"commit bucket range", pk, `{"session":1,"max_token":1,"default":1,"exceptions":[[65536,1,1]]}`, "exceptions", decCommit},
		{"commit pair", pk, `{"session":1,"max_token":1,"default":1,"exceptions":[[2,1]]}`, "exceptions", decCommit},
		{"commit quoted", pk, `{"session":1,"max_token":1,"default":1,"exceptions":[[2,1,"1"]]}`, "exceptions", decCommit},
		{"commit trailing", pk, `{"session":1,"max_token":1,"default":1} {}`, "", decCommit},
		{"runs overlap", bk, `{"runs":[[0,3,1],[2,1,2]]}`, "runs", decPos},
		{"runs adjacent equal", bk, `{"runs":[[0,3,1],[3,1,1]]}`, "runs", decPos},
		{"runs position 0", bk, `{"runs":[[0,3,0]]}`, "runs", decPos},
		{"runs count 0", bk, `{"runs":[[0,0,1]]}`, "runs", decPos},
		{"runs outside chunk", bk, `{"runs":[[4095,2,1]]}`, "runs", decPos},
		{"runs before chunk", BucketPosKey("ks", 1), `{"runs":[[4095,1,1]]}`, "runs", decPos},
		{"runs huge count", bk, `{"runs":[[0,18446744073709551615,1]]}`, "runs", decPos},
		{"runs unknown", bk, `{"runs":[],"chunk":0}`, "chunk", decPos},
		{"grants from unknown bucket", gk, `{"session":1,"buckets":[[1,1]],"from":[[2,5]]}`, "from", decGrants},
		{"grants from zero", gk, `{"session":1,"buckets":[[1,1]],"from":[[1,0]]}`, "from", decGrants},
		{"grants from repeated", gk, `{"session":1,"buckets":[[1,1]],"from":[[1,5],[1,5]]}`, "from", decGrants},
		{"grants from unsorted", gk, `{"session":1,"buckets":[[1,1],[2,1]],"from":[[2,5],[1,5]]}`, "from", decGrants},
		{"grants from triple", gk, `{"session":1,"buckets":[[1,1]],"from":[[1,5,5]]}`, "from", decGrants},
		{"releases positions unknown bucket", rk, `{"buckets":[[1,1]],"positions":[[3,5]]}`, "positions", decReleases},
		{"releases positions negative", rk, `{"buckets":[[1,1]],"positions":[[1,-5]]}`, "positions", decReleases},
	} {
		err := tc.dec(tc.key, []byte(tc.val))
		var ce *CorruptError
		if !errors.As(err, &ce) {
			t.Errorf("%s: got %v, want a *CorruptError", tc.name, err)
			continue
		}
		if ce.Field != tc.field || ce.Key != tc.key {
			t.Errorf("%s: error names key %q field %q, want %q %q (%v)", tc.name, ce.Key, ce.Field, tc.key, tc.field, err)
		}
	}
}

func TestPositionsInvalid(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  func() error
	}{
		{"commit no session", func() error { _, err := EncodeCommit(shard.Commit{}); return err }},
		{"commit unsorted", func() error {
			_, err := EncodeCommit(shard.Commit{Session: 1, Exceptions: []shard.BucketPosition{{Bucket: 2, Token: 1}, {Bucket: 1, Token: 1}}})
			return err
		}},
		{"chunk range", func() error { _, err := EncodeBucketPositions(MaxPositionChunks, shard.BucketPositions{}); return err }},
		{"run outside chunk", func() error {
			_, err := EncodeBucketPositions(0, shard.BucketPositions{Runs: []shard.PositionRun{{First: 4096, Count: 1, Position: 1}}})
			return err
		}},
		{"put not canonical", func() error {
			ws := PutBucketPositions("ks", shard.BucketPositions{}, shard.BucketPositions{Runs: []shard.PositionRun{{First: 0, Count: 1, Position: 0}}})
			_, err := ws[0].Change(1)
			return err
		}},
		{"put bad keyspace", func() error {
			ws := PutBucketPositions("k s", shard.BucketPositions{}, samplePositions)
			_, err := ws[0].Change(1)
			return err
		}},
	} {
		if err := tc.err(); !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrInvalidName) {
			t.Errorf("%s: %v, want ErrInvalid", tc.name, err)
		}
	}
}

func TestPositionsKeys(t *testing.T) {
	for _, tc := range []struct {
		key    string
		kind   Kind
		ks, id string
	}{
		{PositionsKey("rooms", "w1"), KindPositions, "rooms", "w1"},
		{BucketPosKey("rooms", 15), KindBucketPos, "rooms", "15"},
		{Prefix + "bucketpos/rooms/0", KindBucketPos, "rooms", "0"},
	} {
		kind, ks, id, err := ParseKey(tc.key)
		if err != nil || kind != tc.kind || ks != tc.ks || id != tc.id {
			t.Errorf("ParseKey(%q) = %v %q %q %v, want %v %q %q", tc.key, kind, ks, id, err, tc.kind, tc.ks, tc.id)
		}
		if k := Key(tc.kind, tc.ks, tc.id); k != tc.key {
			t.Errorf("Key(%v, %q, %q) = %q, want %q", tc.kind, tc.ks, tc.id, k, tc.key)
		}
	}
	for _, bad := range []string{Prefix + "bucketpos/rooms/16", Prefix + "bucketpos/rooms/01", Prefix + "bucketpos/rooms/a", Prefix + "bucketpos/rooms/-1", Prefix + "bucketpos/rooms", Prefix + "positions/rooms"} {
		if _, _, _, err := ParseKey(bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("ParseKey(%q) = %v, want ErrCorrupt", bad, err)
		}
	}
}

// genPositions draws canonical bucket positions over buckets buckets, with
// long runs so that runs cross chunk ends.
func genPositions(t *rapid.T, label string, buckets int) shard.BucketPositions {
	dense := make([]uint64, buckets)
	for b := 0; b < buckets; {
		n := rapid.IntRange(1, 6000).Draw(t, label+" run")
		v := rapid.Uint64Range(0, 3).Draw(t, label+" position")
		for i := b; i < min(b+n, buckets); i++ {
			dense[i] = v
		}
		b += n
	}
	return shard.NewBucketPositions(dense)
}

// TestPutBucketPositions: the writes of a change rewrite exactly the
// chunks whose positions differ, and applying them to the old chunks gives
// the new positions.
func TestPutBucketPositions(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		buckets := rapid.IntRange(1, 65536).Draw(t, "buckets")
		old, next := genPositions(t, "old", buckets), genPositions(t, "next", buckets)
		snap := NewSnapshot(1)
		for c, p := range SplitPositions(old) {
			if len(p.Runs) > 0 {
				snap.Apply(mustChange(t, Write{key: BucketPosKey("ks", c), val: []byte(must(EncodeBucketPositions(c, p)))}, 1))
			}
		}
		ws := PutBucketPositions("ks", old, next)
		oldDense, nextDense := old.Dense(buckets), next.Dense(buckets)
		for _, w := range ws {
			c, err := w.Change(2)
			if err != nil {
				t.Fatal(err)
			}
			chunk, _ := parseChunk(c.ID)
			lo, hi := chunk*PositionChunk, min((chunk+1)*PositionChunk, buckets)
			if lo < buckets && slicesEqual(oldDense[lo:hi], nextDense[lo:hi]) {
				t.Fatalf("chunk %d rewritten, but its positions did not change", chunk)
			}
			snap.Apply(c)
		}
		var got shard.BucketPositions
		if st := snap.Keyspaces["ks"]; st != nil {
			got = st.Positions()
		}
		if diff := cmp.Diff(next, got, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("old chunks + writes (-want +got):\n%s", diff)
		}
		if len(next.Runs) > 0 {
			if e := validateRuns(next.Runs, 0, buckets); e != nil {
				t.Fatalf("NewBucketPositions made non-canonical runs: %s", e.reason)
			}
		}
	})
}

func mustChange(t *rapid.T, w Write, rev int64) Change {
	c, err := w.Change(rev)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func slicesEqual(a, b []uint64) bool { return cmp.Equal(a, b) }
