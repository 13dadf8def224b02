package shard_test

import (
	"slices"
	"testing"

	"github.com/keyshard/keyshard/internal/shard"
)

func TestKeyspacePositions(t *testing.T) {
	base := shard.NewBucketPositions([]uint64{5, 5, 7, 0, 9, 9})
	in := shard.HeldPositions{
		Buckets: 6,
		Grants: map[string]shard.Grants{
			// a holds 0 (committed by default), 1 (exception), 2 (granted
			// after its commit's max token: at its from).
			"a": {Session: 10, Buckets: []shard.BucketToken{{Bucket: 0, Token: 3, Position: 5}, {Bucket: 1, Token: 3, Position: 5}, {Bucket: 2, Token: 8, Position: 7}}},
			// b holds 3 and released it at its token with a final position,
			// and 4, with a release of an earlier token (ignored).
			"b": {Session: 11, Buckets: []shard.BucketToken{{Bucket: 3, Token: 4, Position: 0}, {Bucket: 4, Token: 6, Position: 9}}},
		},
		Commits: map[string]shard.Commit{
			"a": {Session: 10, MaxToken: 5, Default: 20, Exceptions: []shard.BucketPosition{{Bucket: 1, Token: 3, Position: 6}}},
			// b's commit is of an earlier session: it does not count.
			"b": {Session: 9, MaxToken: 9, Default: 100},
		},
		Releases: map[string]shard.Releases{
			"b": {Buckets: []shard.BucketToken{{Bucket: 3, Token: 4, Position: 12}, {Bucket: 4, Token: 5, Position: 50}}},
		},
		Base: base,
	}
	pos, holders := shard.KeyspacePositions(in)
	if want := []uint64{20, 6, 7, 12, 9, 9}; !slices.Equal(pos, want) {
		t.Errorf("positions = %v, want %v", pos, want)
	}
	want := []shard.Holder{{"a", 3}, {"a", 3}, {"a", 8}, {"b", 4}, {"b", 6}, {}}
	if !slices.Equal(holders, want) {
		t.Errorf("holders = %v, want %v", holders, want)
	}
}

func TestKeyspacePositionsNeverBelowBase(t *testing.T) {
	// A holder's commit below the base (a grant issued before a fold that
	// raised the base) does not pull the bucket below it.
	in := shard.HeldPositions{
		Buckets: 2,
		Grants:  map[string]shard.Grants{"a": {Session: 1, Buckets: []shard.BucketToken{{Bucket: 0, Token: 1, Position: 2}}}},
		Commits: map[string]shard.Commit{"a": {Session: 1, MaxToken: 1, Default: 3}},
		Base:    shard.NewBucketPositions([]uint64{10, 4}),
	}
	pos, holders := shard.KeyspacePositions(in)
	if want := []uint64{10, 4}; !slices.Equal(pos, want) {
		t.Errorf("positions = %v, want %v", pos, want)
	}
	if holders[1] != (shard.Holder{}) {
		t.Errorf("bucket 1 holder = %v, want nobody", holders[1])
	}
}

func TestKeyspacePositionsDoubleGrant(t *testing.T) {
	in := shard.HeldPositions{
		Buckets: 1,
		Grants: map[string]shard.Grants{
			"a": {Session: 1, Buckets: []shard.BucketToken{{Bucket: 0, Token: 9, Position: 3}}},
			"b": {Session: 2, Buckets: []shard.BucketToken{{Bucket: 0, Token: 2, Position: 8}, {Bucket: 5, Token: 2}}},
		},
	}
	pos, holders := shard.KeyspacePositions(in)
	if pos[0] != 3 || holders[0] != (shard.Holder{Member: "a", Token: 9}) {
		t.Errorf("bucket 0 = %d held by %v, want 3 held by a at 9", pos[0], holders[0])
	}
}

func TestKeyspacePositionsEndedSession(t *testing.T) {
	// c's session 7 ended (its grants vanished) before the leader folded
	// its commit: buckets 0 and 1, named by the leader's copy, count at
	// the commit's positions; bucket 2, granted above the commit's max
	// token, stays at base; bucket 3, now held by d, is d's.
	in := shard.HeldPositions{
		Buckets: 4,
		Grants:  map[string]shard.Grants{"d": {Session: 8, Buckets: []shard.BucketToken{{Bucket: 3, Token: 9, Position: 4}}}},
		Commits: map[string]shard.Commit{"c": {Session: 7, MaxToken: 5, Default: 30, Exceptions: []shard.BucketPosition{{Bucket: 1, Token: 5, Position: 12}}}},
		Copies: map[string]shard.Held{
			"c": {Session: 7, Buckets: []shard.BucketToken{{Bucket: 0, Token: 2}, {Bucket: 1, Token: 5}, {Bucket: 2, Token: 6}, {Bucket: 3, Token: 2}}},
			"d": {Session: 8, Buckets: []shard.BucketToken{{Bucket: 3, Token: 9}}},
		},
		Base: shard.NewBucketPositions([]uint64{1, 1, 3, 4}),
	}
	pos, holders := shard.KeyspacePositions(in)
	if want := []uint64{30, 12, 3, 4}; !slices.Equal(pos, want) {
		t.Errorf("positions = %v, want %v", pos, want)
	}
	if want := []shard.Holder{{}, {}, {}, {"d", 9}}; !slices.Equal(holders, want) {
		t.Errorf("holders = %v, want %v", holders, want)
	}
	// Without the copy, nothing but base is known.
	in.Copies = nil
	if pos, _ := shard.KeyspacePositions(in); !slices.Equal(pos, []uint64{1, 1, 3, 4}) {
		t.Errorf("positions without the copy = %v, want base", pos)
	}
}
