package server

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

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

// TestBucketRunsSize logs the time and size of GetBuckets' answer for the
// dashboard's largest case, 65,536 buckets over 200 members, each bucket
// with its own token (the worst case for runs). Logged, not asserted.
func TestBucketRunsSize(t *testing.T) {
	const n, members = 65536, 200
	owners, holders := make([]string, n), make([]string, n)
	tokens := make([]uint64, n)
	ids := make([]string, members)
	for i := range ids {
		ids[i] = fmt.Sprintf("member-%03d", i)
	}
	for b := range owners {
		owners[b] = ids[b*members/n]
		holders[b] = owners[b]
		tokens[b] = uint64(b + 1)
	}
	start := time.Now()
	r := bucketRuns(owners, holders, tokens, nil)
	took := time.Since(start)
	js, err := protojson.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("65536 buckets x 200 members, a token each: %d runs in %v, %d bytes of JSON", len(r.Runs), took, len(js))
	for b := range tokens {
		tokens[b] = uint64(b*members/n + 1) // one token per member's range
	}
	start = time.Now()
	r = bucketRuns(owners, holders, tokens, nil)
	took = time.Since(start)
	js, _ = protojson.Marshal(r)
	t.Logf("65536 buckets x 200 members, a token per member: %d runs in %v, %d bytes of JSON", len(r.Runs), took, len(js))
}
