package store

import (
	"slices"
	"testing"
	"time"

	"github.com/keyshard/keyshard/internal/shard"
)

func TestCommitStateStored(t *testing.T) {
	const lease = shard.LeaseID(7)
	g := shard.Grants{Session: lease, Buckets: []shard.BucketToken{
		{Bucket: 1, Token: 3, Position: 10}, {Bucket: 2, Token: 4, Position: 10}, {Bucket: 3, Token: 5, Position: 10},
		{Bucket: 4, Token: 6, Position: 10}, {Bucket: 5, Token: 9, Position: 70}, {Bucket: 6, Token: 6, Position: 10},
	}}
	prev := shard.Commit{Session: lease, MaxToken: 6, Default: 50, Exceptions: []shard.BucketPosition{{Bucket: 4, Token: 6, Position: 60}}}
	bp := func(b int, tok, p uint64) shard.BucketPosition {
		return shard.BucketPosition{Bucket: b, Token: tok, Position: p}
	}
	rel := shard.Releases{Buckets: []shard.BucketToken{
		{Bucket: 1, Token: 3},               // released without a final position: pinned at 50
		{Bucket: 2, Token: 2},               // an earlier grant's release: not pinned
		{Bucket: 3, Token: 5, Position: 55}, // with a final position: not pinned
		{Bucket: 4, Token: 6},               // its exception moves: pinned at 60
		{Bucket: 5, Token: 9},               // not covered by the default (token 9 > 6): not moved
		{Bucket: 7, Token: 8},               // handed over already: not pinned
	}}
	for _, tc := range []struct {
		name string
		st   CommitState
		c    shard.Commit
		want []shard.BucketPosition
	}{
		{"pins", CommitState{Grants: g, Releases: rel, Commit: prev, CommitRev: 1},
			shard.Commit{Session: lease, MaxToken: 6, Default: 80, Exceptions: []shard.BucketPosition{bp(4, 6, 90), bp(6, 6, 85)}},
			[]shard.BucketPosition{bp(1, 3, 50), bp(4, 6, 60), bp(6, 6, 85)}},
		{"an exception that does not move its bucket stays", CommitState{Grants: g, Releases: rel, Commit: prev, CommitRev: 1},
			shard.Commit{Session: lease, MaxToken: 6, Default: 50, Exceptions: []shard.BucketPosition{bp(4, 6, 60)}},
			[]shard.BucketPosition{bp(4, 6, 60)}},
		{"no commit yet: the grant's position", CommitState{Grants: g, Releases: rel},
			shard.Commit{Session: lease, MaxToken: 9, Default: 80},
			[]shard.BucketPosition{bp(1, 3, 10), bp(4, 6, 10), bp(5, 9, 70)}},
		{"no releases", CommitState{Grants: g, Commit: prev, CommitRev: 1},
			shard.Commit{Session: lease, MaxToken: 6, Default: 80}, nil},
		{"grants of another session", CommitState{Grants: shard.Grants{Session: 8, Buckets: g.Buckets}, Releases: rel},
			shard.Commit{Session: lease, MaxToken: 6, Default: 80}, nil},
	} {
		got := tc.st.Stored(tc.c)
		if !slices.Equal(got.Exceptions, tc.want) || got.Default != tc.c.Default || got.MaxToken != tc.c.MaxToken || got.Session != tc.c.Session {
			t.Errorf("%s: stored %+v, want exceptions %v", tc.name, got, tc.want)
		}
		if e := validateCommit(got); e != nil {
			t.Errorf("%s: stored %+v does not validate: %v", tc.name, got, e.invalid("commit"))
		}
	}
}

// TestCommitPinsReleased: a commit after a release without a final
// position does not move the released bucket while the member's grants
// still hold it; the leader's fold (KeyspacePositions is what it folds)
// gives the bucket its position at the release and the others the new
// commit's.
func TestCommitPinsReleased(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 30*time.Second)
	createStreamKeyspace(t, s, "pin")
	a, b := newSession(t, s, 10*time.Second), newSession(t, s, 10*time.Second)
	la, lb := a.LeaseID(), b.LeaseID()
	for id, l := range map[string]shard.LeaseID{"w1": la, "w2": lb} {
		if _, _, err := s.Join(ctx, "pin", member(id), l, false); err != nil {
			t.Fatal(err)
		}
	}
	_, fence := campaign(t, s, "leader-pin")
	g := shard.Grants{Session: la}
	for bk := range 8 {
		g.Buckets = append(g.Buckets, shard.BucketToken{Bucket: bk, Token: 5, Position: 10})
	}
	g2 := shard.Grants{Session: lb, Buckets: []shard.BucketToken{{Bucket: 10, Token: 6, Position: 42}, {Bucket: 11, Token: 6, Position: 42}}}
	if _, err := s.Commit(ctx, fence, []Write{PutGrants("pin", "w1", g), PutGrants("pin", "w2", g2), PutTokens("pin", 6)}, nil); err != nil {
		t.Fatal(err)
	}
	stored := func(id string) shard.Commit {
		t.Helper()
		resp, err := s.client.Get(ctx, PositionsKey("pin", id))
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("read commit record: %v", err)
		}
		c, err := DecodeCommit(PositionsKey("pin", id), resp.Kvs[0].Value)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// folded is where the leader would put each bucket if it handed every
	// bucket over now.
	folded := func() []uint64 {
		t.Helper()
		snap, _, err := s.LoadKeyspace(ctx, "pin")
		if err != nil {
			t.Fatal(err)
		}
		st := snap.Keyspaces["pin"]
		in := shard.HeldPositions{Buckets: 16, Grants: map[string]shard.Grants{}, Commits: map[string]shard.Commit{}, Releases: map[string]shard.Releases{}}
		for id, e := range st.Grants {
			in.Grants[id] = e.Value
		}
		for id, e := range st.Commits {
			in.Commits[id] = e.Value
		}
		for id, e := range st.Releases {
			in.Releases[id] = e.Value
		}
		pos, _ := shard.KeyspacePositions(in)
		return pos
	}
	commit := func(id string, l shard.LeaseID, c shard.Commit) {
		t.Helper()
		if _, err := s.CommitPositions(ctx, "pin", id, l, c); err != nil {
			t.Fatalf("commit %+v: %v", c, err)
		}
	}

	commit("w1", la, shard.Commit{Session: la, MaxToken: 5, Default: 100})
	if _, err := s.Release(ctx, "pin", "w1", la, []shard.BucketToken{{Bucket: 1, Token: 5}}, nil); err != nil {
		t.Fatal(err)
	}
	commit("w1", la, shard.Commit{Session: la, MaxToken: 6, Default: 200})
	if got, want := stored("w1").Exceptions, []shard.BucketPosition{{Bucket: 1, Token: 5, Position: 100}}; !slices.Equal(got, want) {
		t.Errorf("after releasing bucket 1 without a position: exceptions %v, want %v", got, want)
	}
	if got := folded(); got[1] != 100 || got[0] != 200 || got[2] != 200 {
		t.Errorf("folded %v, want bucket 1 at 100 and the others at 200", got[:8])
	}

	// With a final position the fold takes it: no pin. An exception that
	// would move bucket 1 is pinned too.
	if _, err := s.Release(ctx, "pin", "w1", la, []shard.BucketToken{{Bucket: 2, Token: 5, Position: 250}}, nil); err != nil {
		t.Fatal(err)
	}
	commit("w1", la, shard.Commit{Session: la, MaxToken: 6, Default: 300, Exceptions: []shard.BucketPosition{{Bucket: 1, Token: 5, Position: 400}}})
	if got, want := stored("w1").Exceptions, []shard.BucketPosition{{Bucket: 1, Token: 5, Position: 100}}; !slices.Equal(got, want) {
		t.Errorf("after releasing bucket 2 at 250: exceptions %v, want %v", got, want)
	}
	if got := folded(); got[1] != 100 || got[2] != 250 || got[3] != 300 {
		t.Errorf("folded %v, want buckets 1, 2, 3 at 100, 250, 300", got[:8])
	}

	// No commit before the release: the grant's position.
	if _, err := s.Release(ctx, "pin", "w2", lb, []shard.BucketToken{{Bucket: 10, Token: 6}}, nil); err != nil {
		t.Fatal(err)
	}
	commit("w2", lb, shard.Commit{Session: lb, MaxToken: 6, Default: 500})
	if got, want := stored("w2").Exceptions, []shard.BucketPosition{{Bucket: 10, Token: 6, Position: 42}}; !slices.Equal(got, want) {
		t.Errorf("w2: exceptions %v, want %v", got, want)
	}
	if got := folded(); got[10] != 42 || got[11] != 500 {
		t.Errorf("folded %v, want buckets 10, 11 at 42, 500", got[8:])
	}

	// Once handed over, the commit is stored as given.
	g.Buckets = slices.DeleteFunc(slices.Clone(g.Buckets), func(bt shard.BucketToken) bool { return bt.Bucket == 1 || bt.Bucket == 2 })
	if _, err := s.Commit(ctx, fence, []Write{PutGrants("pin", "w1", g)}, nil); err != nil {
		t.Fatal(err)
	}
	commit("w1", la, shard.Commit{Session: la, MaxToken: 6, Default: 600})
	if got := stored("w1").Exceptions; len(got) != 0 {
		t.Errorf("after the hand-over: exceptions %v, want none", got)
	}
}

// TestCommitPinsRacingRelease: a release landing between a commit's read
// (here, its guess) and its write makes the write retry, and pin.
func TestCommitPinsRacingRelease(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	createStreamKeyspace(t, s, "pin-race")
	a := newSession(t, s, 10*time.Second)
	la := a.LeaseID()
	if _, _, err := s.Join(ctx, "pin-race", member("w1"), la, false); err != nil {
		t.Fatal(err)
	}
	_, fence := campaign(t, s, "leader-pin-race")
	g := shard.Grants{Session: la, Buckets: []shard.BucketToken{{Bucket: 1, Token: 4}, {Bucket: 2, Token: 4}}}
	if _, err := s.Commit(ctx, fence, []Write{PutGrants("pin-race", "w1", g), PutTokens("pin-race", 4)}, nil); err != nil {
		t.Fatal(err)
	}
	rev, st, err := s.CommitPositionsWith(ctx, "pin-race", "w1", la, shard.Commit{Session: la, MaxToken: 4, Default: 100}, nil)
	if err != nil {
		t.Fatal(err)
	}
	st.Commit, st.CommitRev = st.Stored(shard.Commit{Session: la, MaxToken: 4, Default: 100}), rev
	// The state read, current but for the release that lands now.
	relRev, err := s.Release(ctx, "pin-race", "w1", la, []shard.BucketToken{{Bucket: 2, Token: 4}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := shard.Commit{Session: la, MaxToken: 4, Default: 200}
	if len(st.Stored(c).Exceptions) != 0 {
		t.Fatal("the stale state already pins")
	}
	rev2, st2, err := s.CommitPositionsWith(ctx, "pin-race", "w1", la, c, &st)
	if err != nil {
		t.Fatal(err)
	}
	if rev2 <= relRev || st2.ReleasesRev != relRev {
		t.Errorf("commit at %d checked against releases at %d; the release landed at %d", rev2, st2.ReleasesRev, relRev)
	}
	resp, err := s.client.Get(ctx, PositionsKey("pin-race", "w1"))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("read commit record: %v", err)
	}
	got, err := DecodeCommit(PositionsKey("pin-race", "w1"), resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	if want := []shard.BucketPosition{{Bucket: 2, Token: 4, Position: 100}}; !slices.Equal(got.Exceptions, want) || got.Default != 200 {
		t.Errorf("stored %+v, want default 200 with exceptions %v", got, want)
	}
	if !slices.Equal(st2.Stored(c).Exceptions, got.Exceptions) {
		t.Errorf("the returned state's Stored %+v differs from the record written %+v", st2.Stored(c), got)
	}
}
