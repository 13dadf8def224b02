package coordinator_test

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/keyshard/keyshard/internal/coordinator"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/placement"
)

// foldKeyspace: 8 buckets. Member a's session 0xa held them all and
// crashed: its grants are gone. b is the member left.
var foldKeyspace = shard.Keyspace{Name: "ev", Buckets: 8, Hash: placement.HashXXH64, Mode: shard.ModeStream, LeaseTTL: 10 * time.Second}

// aHeld is what a's session held: buckets 0-3 at token 1 and 4-5 at token
// 2 (both <= its commit's MaxToken), 6-7 at token 5 (above it).
var aHeld = shard.Held{Session: 0xa, Buckets: []shard.BucketToken{
	{Bucket: 0, Token: 1}, {Bucket: 1, Token: 1}, {Bucket: 2, Token: 1}, {Bucket: 3, Token: 1},
	{Bucket: 4, Token: 2}, {Bucket: 5, Token: 2}, {Bucket: 6, Token: 5}, {Bucket: 7, Token: 5},
}}

// aCommit: Default 50 for what a held at token <= 2; bucket 1 ahead, 4
// behind (just gained, catching up), 6 (above MaxToken) at its own.
var aCommit = shard.Commit{Session: 0xa, MaxToken: 2, Default: 50, Exceptions: []shard.BucketPosition{
	{Bucket: 1, Token: 1, Position: 70}, {Bucket: 4, Token: 2, Position: 20}, {Bucket: 6, Token: 5, Position: 40},
}}

// aBase: the bucket positions: where a's grants started (10 for the
// buckets it got at tokens 1 and 2, 30 for those of token 5).
var aBase = shard.BucketPositions{Runs: []shard.PositionRun{{First: 0, Count: 6, Position: 10}, {First: 6, Count: 2, Position: 30}}}

// foldTerm starts a new leader's machine on the store as it is after a's
// crash (no member record or grants of a's left), with the given
// commit records and copies of a's grants, lets it move every bucket to
// b and returns the grant round it plans.
func foldTerm(t *testing.T, evs ...coordinator.Event) coordinator.WriteGrants {
	t.Helper()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := coordinator.New()
	load := []coordinator.Event{
		coordinator.Reset{},
		coordinator.KeyspacePut{Keyspace: foldKeyspace},
		coordinator.MemberPut{Keyspace: "ev", Member: shard.Member{ID: "b", Weight: 1, Session: 0xb}},
		coordinator.MapPut{Keyspace: "ev", Map: shard.Map{Epoch: 1, Hash: placement.HashXXH64, Assignment: owners("a", 8)}, Rev: 3},
		coordinator.TokensPut{Keyspace: "ev", Token: 5, Rev: 20},
		coordinator.BucketPosPut{Keyspace: "ev", Chunk: 0, Positions: aBase, Rev: 20},
	}
	acts := m.StepAll(append(load, evs...), now)
	if len(acts) != 1 {
		t.Fatalf("the new leader's first actions: %s; want the map that moves a's buckets to b", formatActions(acts))
	}
	wm, ok := acts[0].(coordinator.WriteMap)
	if !ok {
		t.Fatalf("first action %T; want WriteMap", acts[0])
	}
	acts = m.Step(coordinator.MapPut{Keyspace: "ev", Map: wm.Map, Rev: 30}, now)
	for _, a := range acts {
		if g, ok := a.(coordinator.WriteGrants); ok {
			return g
		}
	}
	t.Fatalf("no grant round after the map: %s", formatActions(acts))
	return coordinator.WriteGrants{}
}

// owners is an assignment of every one of n buckets to id.
func owners(id string, n int) placement.Assignment {
	a := placement.Assignment{Members: []string{id}, Owners: make([]int32, n)}
	return a
}

// fromOf returns the From of each bucket member id is granted in a.
func fromOf(a coordinator.WriteGrants, id string) []uint64 {
	var out []uint64
	for _, bt := range a.Grants[id].Buckets {
		out = append(out, bt.Position)
	}
	return out
}

// TestFoldAfterFailover: a leader elected after a's grants vanished (it
// never saw them) folds a's commit record from the copy of its grants,
// exactly: Default for the buckets it covers, each exception for its
// bucket, and the grant's From (the bucket positions) for a bucket above
// MaxToken without one. b's grants start there; the round deletes the
// commit record and the copy, and expects both as read.
func TestFoldAfterFailover(t *testing.T) {
	a := foldTerm(t,
		coordinator.CommitPut{Keyspace: "ev", ID: "a", Commit: aCommit, Rev: 21},
		coordinator.HeldPut{Keyspace: "ev", ID: "a", Held: aHeld, Rev: 19})

	want := []uint64{50, 70, 50, 50, 20, 50, 40, 30}
	if diff := cmp.Diff(want, fromOf(a, "b")); diff != "" {
		t.Errorf("b's grants' From, buckets 0-7 (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, a.Positions.Dense(8)); diff != "" {
		t.Errorf("bucket positions written (-want +got):\n%s", diff)
	}
	if !slices.Equal(a.Folded, []string{"a"}) || !slices.Equal(a.Unheld, []string{"a"}) {
		t.Errorf("folded %v, copies deleted %v; want a's record and copy", a.Folded, a.Unheld)
	}
	for _, e := range []coordinator.Expect{{Kind: coordinator.KeyCommit, ID: "a", Rev: 21}, {Kind: coordinator.KeyHeld, ID: "a", Rev: 19}, {Kind: coordinator.KeyHeld, ID: "b", Rev: 0}} {
		if !slices.Contains(a.Expects, e) {
			t.Errorf("expects %+v; want %+v among them", a.Expects, e)
		}
	}
	h, ok := a.Held["b"]
	if !ok || h.Session != 0xb || len(h.Buckets) != 8 {
		t.Fatalf("copy of b's grants %+v (written %v); want its 8 buckets", h, ok)
	}
	for i, bt := range a.Grants["b"].Buckets {
		if h.Buckets[i] != (shard.BucketToken{Bucket: bt.Bucket, Token: bt.Token}) {
			t.Errorf("copy of b's grants has %+v; its grants %+v", h.Buckets[i], bt)
		}
	}
}

// TestFoldWithoutCommit: a session that never committed folds nothing:
// its buckets resume from the bucket positions, and the copy of its
// grants goes in the round, which expects a's commit record absent.
func TestFoldWithoutCommit(t *testing.T) {
	a := foldTerm(t, coordinator.HeldPut{Keyspace: "ev", ID: "a", Held: aHeld, Rev: 19})
	if diff := cmp.Diff(aBase.Dense(8), fromOf(a, "b")); diff != "" {
		t.Errorf("b's grants' From (-want +got):\n%s", diff)
	}
	if len(a.Folded) != 0 || !slices.Equal(a.Unheld, []string{"a"}) {
		t.Errorf("folded %v, copies deleted %v; want no record, a's copy", a.Folded, a.Unheld)
	}
	if !slices.Contains(a.Expects, coordinator.Expect{Kind: coordinator.KeyCommit, ID: "a", Rev: 0}) {
		t.Errorf("expects %+v; want a's commit record absent", a.Expects)
	}
}

// TestFoldCopyOfOtherSession: a commit record with no copy of its
// session's grants (the session held nothing the leader granted) folds
// nothing, however high its Default.
func TestFoldCopyOfOtherSession(t *testing.T) {
	a := foldTerm(t,
		coordinator.CommitPut{Keyspace: "ev", ID: "a", Commit: aCommit, Rev: 21},
		coordinator.HeldPut{Keyspace: "ev", ID: "a", Held: shard.Held{Session: 0xa0}, Rev: 19})
	if diff := cmp.Diff(aBase.Dense(8), fromOf(a, "b")); diff != "" {
		t.Errorf("b's grants' From (-want +got):\n%s", diff)
	}
	if !slices.Equal(a.Folded, []string{"a"}) || !slices.Equal(a.Unheld, []string{"a"}) {
		t.Errorf("folded %v, copies deleted %v; want a's record and copy", a.Folded, a.Unheld)
	}
}
