package server

import (
	"slices"
	"testing"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
)

// TestBucketRuns checks the run-length encoding of GetBuckets: each bucket
// in exactly one run, runs split wherever any field changes, states from
// owner and holder.
func TestBucketRuns(t *testing.T) {
	owners := []string{"", "", "a", "a", "a", "b", "b", "b", "c"}
	holders := []string{"", "x", "a", "a", "a", "a", "b", "", ""}
	tokens := []uint64{0, 4, 1, 1, 2, 3, 5, 0, 0}
	pos := []uint64{0, 0, 7, 7, 7, 7, 7, 7, 9}
	r := bucketRuns(owners, holders, tokens, pos)
	if !slices.Equal(r.Members, []string{"a", "b", "c", "x"}) || r.Buckets != 9 {
		t.Fatalf("members %v buckets %d", r.Members, r.Buckets)
	}
	type run struct {
		first, count, owner, holder uint32
		token                       uint64
		state                       v1.BucketState
		pos                         uint64
	}
	var got []run
	for _, x := range r.Runs {
		got = append(got, run{x.First, x.Count, x.Owner, x.Holder, x.Token, x.State, x.Position})
	}
	want := []run{
		{0, 1, 0, 0, 0, v1.BucketState_BUCKET_STATE_UNASSIGNED, 0},
		{1, 1, 0, 4, 4, v1.BucketState_BUCKET_STATE_RELEASING, 0},
		{2, 2, 1, 1, 1, v1.BucketState_BUCKET_STATE_GRANTED, 7},
		{4, 1, 1, 1, 2, v1.BucketState_BUCKET_STATE_GRANTED, 7},
		{5, 1, 2, 1, 3, v1.BucketState_BUCKET_STATE_RELEASING, 7},
		{6, 1, 2, 2, 5, v1.BucketState_BUCKET_STATE_GRANTED, 7},
		{7, 1, 2, 0, 0, v1.BucketState_BUCKET_STATE_AWAITING_GRANT, 7},
		{8, 1, 3, 0, 0, v1.BucketState_BUCKET_STATE_AWAITING_GRANT, 9},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("runs:\n got %v\nwant %v", got, want)
	}
	// Without positions (exclusive mode) the same buckets merge more.
	r = bucketRuns([]string{"a", "a", "a"}, []string{"a", "a", "a"}, []uint64{1, 1, 1}, nil)
	if len(r.Runs) != 1 || r.Runs[0].Count != 3 || r.Runs[0].Position != 0 {
		t.Fatalf("one run expected: %v", r.Runs)
	}
	if r = bucketRuns(nil, nil, nil, nil); len(r.Runs) != 0 || r.Buckets != 0 {
		t.Fatalf("empty: %v", r)
	}
}
