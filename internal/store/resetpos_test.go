package store

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/keyshard/keyshard/internal/shard"
)

// TestPositionsAndReset: the operator's read of a stream keyspace's
// positions, and a reset's refusals, race and effect, on embedded etcd.
func TestPositionsAndReset(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 30*time.Second)
	createStreamKeyspace(t, s, "rs")
	a, b := newSession(t, s, 10*time.Second), newSession(t, s, 10*time.Second)
	for id, se := range map[string]*Session{"w1": a, "w2": b} {
		if _, _, err := s.Join(ctx, "rs", member(id), se.LeaseID(), false); err != nil {
			t.Fatal(err)
		}
	}
	_, fence := campaign(t, s, "leader-rs")
	// w1 holds 0-9 from 10; w2 holds 10-19 from 0; 20-29 are at 7.
	g1, g2 := shard.Grants{Session: a.LeaseID()}, shard.Grants{Session: b.LeaseID()}
	for bk := range 10 {
		g1.Buckets = append(g1.Buckets, shard.BucketToken{Bucket: bk, Token: 5, Position: 10})
		g2.Buckets = append(g2.Buckets, shard.BucketToken{Bucket: 10 + bk, Token: 6})
	}
	base := shard.BucketPositions{Runs: []shard.PositionRun{{First: 20, Count: 10, Position: 7}}}
	writes := append([]Write{PutGrants("rs", "w1", g1), PutGrants("rs", "w2", g2), PutTokens("rs", 6)}, PutBucketPositions("rs", shard.BucketPositions{}, base)...)
	if _, err := s.Commit(ctx, fence, writes, nil); err != nil {
		t.Fatal(err)
	}
	c1 := shard.Commit{Session: a.LeaseID(), MaxToken: 5, Default: 30, Exceptions: []shard.BucketPosition{{Bucket: 3, Token: 5, Position: 15}}}
	if _, err := s.CommitPositions(ctx, "rs", "w1", a.LeaseID(), c1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, "rs", "w2", b.LeaseID(), []shard.BucketToken{{Bucket: 12, Token: 6, Position: 44}}, nil); err != nil {
		t.Fatal(err)
	}

	read := func() StreamPositions {
		t.Helper()
		p, err := s.Positions(ctx, "rs")
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := read()
	want := make([]uint64, 64)
	for bk := range 10 {
		want[bk] = 30
		want[20+bk] = 7
	}
	want[3], want[12] = 15, 44
	if !slices.Equal(p.Positions, want) {
		t.Errorf("positions %v, want %v", p.Positions, want)
	}
	if p.Holders[0] != (shard.Holder{Member: "w1", Token: 5}) || p.Holders[19] != (shard.Holder{Member: "w2", Token: 6}) || p.Holders[20] != (shard.Holder{}) {
		t.Errorf("holders of 0, 19, 20: %v %v %v", p.Holders[0], p.Holders[19], p.Holders[20])
	}
	if now, _ := s.Rev(ctx); p.Rev == 0 || p.Rev > now || p.Keyspace.Name != "rs" {
		t.Errorf("read at revision %d (now %d), keyspace %q", p.Rev, now, p.Keyspace.Name)
	}

	// Refusals apply nothing.
	refuse := func(name string, buckets []int, want error) error {
		t.Helper()
		before, _ := s.Rev(ctx)
		_, err := s.ResetPositions(ctx, "rs", buckets, 1)
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", name, err, want)
		}
		if after, _ := s.Rev(ctx); after != before {
			t.Errorf("%s: the store moved from revision %d to %d", name, before, after)
		}
		return err
	}
	var he *HeldError
	if err := refuse("held", []int{30, 5}, ErrHeld); !errors.As(err, &he) || *he != (HeldError{Bucket: 5, Member: "w1", Token: 5, Session: a.LeaseID(), Reason: HeldGranted}) {
		t.Errorf("held: %#v", he)
	}
	if err := refuse("releasing", []int{12}, ErrHeld); !errors.As(err, &he) || he.Bucket != 12 || he.Member != "w2" || he.Reason != HeldReleasing {
		t.Errorf("releasing: %#v", he)
	}
	refuse("no buckets", nil, ErrInvalid)
	refuse("outside", []int{64}, ErrInvalid)
	refuse("negative", []int{-1}, ErrInvalid)
	refuse("twice", []int{30, 31, 30}, ErrInvalid)
	if _, err := s.ResetPositions(ctx, "nope", []int{1}, 1); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown keyspace: %v, want ErrNotFound", err)
	}
	createKeyspace(t, s, "rs-excl")
	if _, err := s.ResetPositions(ctx, "rs-excl", []int{1}, 1); !errors.Is(err, ErrInvalid) {
		t.Errorf("exclusive keyspace: %v, want ErrInvalid", err)
	}
	if _, err := s.Positions(ctx, "rs-excl"); !errors.Is(err, ErrInvalid) {
		t.Errorf("positions of an exclusive keyspace: %v, want ErrInvalid", err)
	}

	// A reset moves unheld buckets backwards and forwards, in one write.
	before, _ := s.Rev(ctx)
	rev, err := s.ResetPositions(ctx, "rs", []int{20, 21, 40}, 3)
	if err != nil {
		t.Fatal(err)
	}
	if rev != before+1 {
		t.Errorf("reset at revision %d after %d: want one transaction", rev, before)
	}
	want[20], want[21], want[40] = 3, 3, 3
	if p := read(); !slices.Equal(p.Positions, want) {
		t.Errorf("after reset: %v, want %v", p.Positions, want)
	}
	if again, err := s.ResetPositions(ctx, "rs", []int{20, 21, 40}, 3); err != nil || again != rev {
		t.Errorf("same reset again: revision %d, %v; want no write", again, err)
	}

	// Race: a write by the leader between a reset's read and its write
	// makes the reset's transaction fail, whatever it wrote.
	for _, tc := range []struct {
		name   string
		writes []Write
	}{
		{"grant", []Write{PutGrants("rs", "w2", shard.Grants{Session: b.LeaseID(), Buckets: append(slices.Clone(g2.Buckets), shard.BucketToken{Bucket: 50, Token: 7})}), PutTokens("rs", 7)}},
		{"chunk deleted", PutBucketPositions("rs", shard.BucketPositions{Runs: []shard.PositionRun{{First: 20, Count: 2, Position: 3}, {First: 22, Count: 8, Position: 7}, {First: 40, Count: 1, Position: 3}}}, shard.BucketPositions{})},
	} {
		st, at, err := s.loadStream(ctx, "test", "rs")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Commit(ctx, fence, tc.writes, nil); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if _, done, err := s.tryReset(ctx, "test", st, at, []int{51}, 9); err != nil || done {
			t.Errorf("%s: reset from a stale read: done %v, %v; want not applied", tc.name, done, err)
		}
	}
	if _, err := s.ResetPositions(ctx, "rs", []int{50}, 9); !errors.As(err, &he) || he.Bucket != 50 || he.Token != 7 {
		t.Errorf("reset of the bucket granted meanwhile: %v, want held by w2 at 7", err)
	}

	// An ended session's commit record refuses every bucket until the
	// leader folds it.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := refuse("unfolded", []int{40}, ErrHeld); !errors.As(err, &he) || he.Bucket != -1 || he.Member != "w1" || he.Reason != HeldUnfolded {
		t.Errorf("unfolded: %#v", he)
	}
	if err := refuse("unfolded exception", []int{40, 3}, ErrHeld); !errors.As(err, &he) || he.Bucket != 3 || he.Reason != HeldUnfolded {
		t.Errorf("unfolded exception: %#v", he)
	}
	if _, err := s.Commit(ctx, fence, []Write{Delete(PositionsKey("rs", "w1"))}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ResetPositions(ctx, "rs", []int{0, 3, 40}, 100); err != nil {
		t.Errorf("reset once folded: %v", err)
	}
	if p := read(); p.Positions[0] != 100 || p.Positions[3] != 100 || p.Positions[40] != 100 || p.Holders[0] != (shard.Holder{}) {
		t.Errorf("after the last reset: %v, holders %v", p.Positions, p.Holders)
	}
}
