package store

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"pgregory.net/rapid"

	"github.com/keyshard/keyshard/internal/shard"
)

func TestCheckCommit(t *testing.T) {
	const lease = shard.LeaseID(7)
	g := shard.Grants{Session: lease, Buckets: []shard.BucketToken{{Bucket: 1, Token: 3}, {Bucket: 2, Token: 5, Position: 50}, {Bucket: 9, Token: 8, Position: 10}}}
	prev := shard.Commit{Session: lease, MaxToken: 5, Default: 40, Exceptions: []shard.BucketPosition{{Bucket: 1, Token: 3, Position: 60}}}
	exc := func(es ...shard.BucketPosition) []shard.BucketPosition { return es }
	for _, tc := range []struct {
		name  string
		next  shard.Commit
		prev  shard.Commit
		want  error  // sentinel
		field string // for a *BackwardsError
	}{
		{"first commit", shard.Commit{Session: lease, MaxToken: 8, Default: 5}, shard.Commit{}, nil, ""},
		{"forward", shard.Commit{Session: lease, MaxToken: 8, Default: 70}, prev, nil, ""},
		{"default covers a bucket granted ahead", shard.Commit{Session: lease, MaxToken: 5, Default: 60, Exceptions: exc(shard.BucketPosition{Bucket: 1, Token: 3, Position: 60})}, prev, nil, ""},
		{"earlier session's record", shard.Commit{Session: lease, MaxToken: 8, Default: 1}, shard.Commit{Session: 99, Default: 1000}, nil, ""},
		{"other session", shard.Commit{Session: 8, MaxToken: 1}, shard.Commit{}, ErrInvalid, ""},
		{"max_token above last issued", shard.Commit{Session: lease, MaxToken: 21}, shard.Commit{}, ErrInvalid, ""},
		{"bucket outside keyspace", shard.Commit{Session: lease, MaxToken: 8, Exceptions: exc(shard.BucketPosition{Bucket: 16, Token: 1})}, shard.Commit{}, ErrInvalid, ""},
		{"unsorted", shard.Commit{Session: lease, MaxToken: 8, Exceptions: exc(shard.BucketPosition{Bucket: 2, Token: 5}, shard.BucketPosition{Bucket: 1, Token: 3})}, shard.Commit{}, ErrInvalid, ""},
		{"exception not held", shard.Commit{Session: lease, MaxToken: 8, Exceptions: exc(shard.BucketPosition{Bucket: 3, Token: 5})}, shard.Commit{}, ErrNotHeld, ""},
		{"exception at the wrong token", shard.Commit{Session: lease, MaxToken: 8, Exceptions: exc(shard.BucketPosition{Bucket: 2, Token: 4, Position: 90})}, shard.Commit{}, ErrNotHeld, ""},
		{"default back", shard.Commit{Session: lease, MaxToken: 8, Default: 39, Exceptions: exc(shard.BucketPosition{Bucket: 1, Token: 3, Position: 60})}, prev, ErrBackwards, "default"},
		{"max_token back", shard.Commit{Session: lease, MaxToken: 4, Default: 70}, prev, ErrBackwards, "max_token"},
		{"exception back", shard.Commit{Session: lease, MaxToken: 5, Default: 40, Exceptions: exc(shard.BucketPosition{Bucket: 1, Token: 3, Position: 59})}, prev, ErrBackwards, "exceptions"},
		{"exception dropped behind it", shard.Commit{Session: lease, MaxToken: 5, Default: 55}, prev, ErrBackwards, "default"},
	} {
		err := checkCommit(tc.next, lease, g, tc.prev, 16, 20)
		if tc.want == nil {
			if err != nil {
				t.Errorf("%s: %v, want accepted", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
			continue
		}
		var be *BackwardsError
		if tc.field != "" && (!errors.As(err, &be) || be.Field != tc.field) {
			t.Errorf("%s: %v, want a *BackwardsError naming %q", tc.name, err, tc.field)
		}
	}
}

// TestCommitMonotonic: whatever sequence of commits, grants and releases a
// member goes through, a commit that checkCommit accepts never moves a
// held bucket's effective position backwards, and no effective position
// is ever below its grant's position or the keyspace's.
func TestCommitMonotonic(t *testing.T) {
	const lease, buckets = shard.LeaseID(3), 16
	rapid.Check(t, func(t *rapid.T) {
		base := genPositions(t, "base", buckets)
		pos := rapid.Uint64Range(0, 40)
		last := uint64(0)
		var g shard.Grants
		g.Session = lease
		var cur shard.Commit
		for step := range rapid.IntRange(1, 40).Draw(t, "steps") {
			switch rapid.IntRange(0, 3).Draw(t, "op") {
			case 0: // the leader grants a bucket not held, at a new token
				b := rapid.IntRange(0, buckets-1).Draw(t, "grant")
				if slices.ContainsFunc(g.Buckets, func(bt shard.BucketToken) bool { return bt.Bucket == b }) {
					continue
				}
				last++
				from := max(base.Position(b), pos.Draw(t, "from"))
				g.Buckets = append(g.Buckets, shard.BucketToken{Bucket: b, Token: last, Position: from})
				shard.SortPairs(g.Buckets)
			case 1: // a release, which the leader takes away
				if len(g.Buckets) == 0 {
					continue
				}
				i := rapid.IntRange(0, len(g.Buckets)-1).Draw(t, "release")
				g.Buckets = slices.Delete(slices.Clone(g.Buckets), i, i+1)
			default: // a commit
				next := shard.Commit{Session: lease, MaxToken: rapid.Uint64Range(0, last).Draw(t, "max_token"), Default: pos.Draw(t, "default")}
				for _, bt := range g.Buckets {
					if rapid.IntRange(0, 3).Draw(t, "exception?") == 0 {
						tok := bt.Token
						if rapid.IntRange(0, 9).Draw(t, "stale token?") == 0 {
							tok++
						}
						next.Exceptions = append(next.Exceptions, shard.BucketPosition{Bucket: bt.Bucket, Token: tok, Position: pos.Draw(t, "exception")})
					}
				}
				before := shard.Positions(g, cur, base)
				if err := checkCommit(next, lease, g, cur, buckets, last); err != nil {
					if !errors.Is(err, ErrBackwards) && !errors.Is(err, ErrNotHeld) {
						t.Fatalf("step %d: refused %+v with %v", step, next, err)
					}
					continue
				}
				after := shard.Positions(g, next, base)
				for i, bt := range g.Buckets {
					if after[i] < before[i] {
						t.Fatalf("step %d: accepted %+v over %+v, which moves bucket %d back from %d to %d", step, next, cur, bt.Bucket, before[i], after[i])
					}
					if after[i] < bt.Position || after[i] < base.Position(bt.Bucket) {
						t.Fatalf("step %d: bucket %d at %d, below its grant %d or base %d", step, bt.Bucket, after[i], bt.Position, base.Position(bt.Bucket))
					}
				}
				cur = next
			}
		}
	})
}

func createStreamKeyspace(t *testing.T, s *Store, name string) shard.Keyspace {
	t.Helper()
	k := testKeyspace(name)
	k.Mode = shard.ModeStream
	if _, err := s.CreateKeyspace(ctxFor(t, 10*time.Second), k); err != nil {
		t.Fatal(err)
	}
	return k
}

func TestCommitPositions(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 30*time.Second)
	createStreamKeyspace(t, s, "cp")
	a, b := newSession(t, s, 10*time.Second), newSession(t, s, 10*time.Second)
	la := a.LeaseID()
	if _, _, err := s.Join(ctx, "cp", member("w1"), la, false); err != nil {
		t.Fatal(err)
	}
	_, fence := campaign(t, s, "leader-cp")
	g := shard.Grants{Session: la}
	for bk := range 64 {
		g.Buckets = append(g.Buckets, shard.BucketToken{Bucket: bk, Token: 5, Position: 10})
	}
	g.Buckets[63].Token = 6
	if _, err := s.Commit(ctx, fence, []Write{PutGrants("cp", "w1", g), PutTokens("cp", 6)}, nil); err != nil {
		t.Fatal(err)
	}
	stored := func() (shard.Commit, int64) {
		t.Helper()
		resp, err := s.client.Get(ctx, PositionsKey("cp", "w1"))
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("read commit record: %v, %d keys", err, len(resp.Kvs))
		}
		if resp.Kvs[0].Lease != 0 {
			t.Errorf("commit record is on lease %x; it must outlive the session", resp.Kvs[0].Lease)
		}
		c, err := DecodeCommit(PositionsKey("cp", "w1"), resp.Kvs[0].Value)
		if err != nil {
			t.Fatal(err)
		}
		return c, resp.Kvs[0].ModRevision
	}

	// One commit covering every bucket is one write of one small value.
	before, err := s.Rev(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c1 := shard.Commit{Session: la, MaxToken: 5, Default: 100, Exceptions: []shard.BucketPosition{{Bucket: 63, Token: 6, Position: 20}}}
	rev, err := s.CommitPositions(ctx, "cp", "w1", la, c1)
	if err != nil {
		t.Fatal(err)
	}
	if rev != before+1 {
		t.Errorf("commit at revision %d after %d: want exactly one write", rev, before)
	}
	if got, at := stored(); at != rev || !slices.Equal(got.Exceptions, c1.Exceptions) || got.Default != 100 {
		t.Errorf("stored %+v at %d, want %+v at %d", got, at, c1, rev)
	}
	want := make([]uint64, 64)
	for i := range want {
		want[i] = 100
	}
	want[63] = 20
	if got := shard.Positions(g, c1, shard.BucketPositions{}); !slices.Equal(got, want) {
		t.Errorf("effective positions %v, want %v", got, want)
	}

	// Refusals apply nothing.
	refuse := func(name string, c shard.Commit, lease shard.LeaseID, want error) {
		t.Helper()
		_, err := s.CommitPositions(ctx, "cp", "w1", lease, c)
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", name, err, want)
		}
		if _, at := stored(); at != rev {
			t.Errorf("%s: the record moved to revision %d", name, at)
		}
	}
	refuse("stale token", shard.Commit{Session: la, MaxToken: 6, Default: 200, Exceptions: []shard.BucketPosition{{Bucket: 63, Token: 5, Position: 30}}}, la, ErrNotHeld)
	refuse("not held", shard.Commit{Session: la, MaxToken: 6, Default: 200, Exceptions: []shard.BucketPosition{{Bucket: 64 - 1, Token: 6, Position: 30}, {Bucket: 64, Token: 6}}}, la, ErrInvalid)
	refuse("default back", shard.Commit{Session: la, MaxToken: 6, Default: 99}, la, ErrBackwards)
	refuse("exception back", shard.Commit{Session: la, MaxToken: 5, Default: 100, Exceptions: []shard.BucketPosition{{Bucket: 63, Token: 6, Position: 19}}}, la, ErrBackwards)
	refuse("max_token unissued", shard.Commit{Session: la, MaxToken: 7, Default: 200}, la, ErrInvalid)
	refuse("duplicate", shard.Commit{Session: la, MaxToken: 6, Default: 200, Exceptions: []shard.BucketPosition{{Bucket: 63, Token: 6, Position: 30}, {Bucket: 63, Token: 6, Position: 30}}}, la, ErrInvalid)
	refuse("other session's record", shard.Commit{Session: b.LeaseID(), MaxToken: 6, Default: 200}, la, ErrInvalid)
	refuse("stale session", shard.Commit{Session: b.LeaseID(), MaxToken: 6, Default: 200}, b.LeaseID(), ErrFenced)
	var nh *NotHeldError
	if _, err := s.CommitPositions(ctx, "cp", "w1", la, shard.Commit{Session: la, MaxToken: 6, Exceptions: []shard.BucketPosition{{Bucket: 63, Token: 5, Position: 30}}}); !errors.As(err, &nh) || nh.Bucket != 63 || nh.Held != 6 {
		t.Errorf("stale token: %v, want a *NotHeldError for bucket 63 held at 6", err)
	}
	if _, err := s.CommitPositions(ctx, "cp", "w9", la, c1); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown member: %v, want ErrNotFound", err)
	}
	if _, err := s.CommitPositions(ctx, "nope", "w1", la, c1); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown keyspace: %v, want ErrNotFound", err)
	}
	createKeyspace(t, s, "cp-excl")
	if _, _, err := s.Join(ctx, "cp-excl", member("w1"), la, false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CommitPositions(ctx, "cp-excl", "w1", la, shard.Commit{Session: la}); !errors.Is(err, ErrInvalid) {
		t.Errorf("exclusive keyspace: %v, want ErrInvalid", err)
	}

	// Catching up: the exception goes, and Default covers bucket 63.
	rev, err = s.CommitPositions(ctx, "cp", "w1", la, shard.Commit{Session: la, MaxToken: 6, Default: 150})
	if err != nil {
		t.Fatal(err)
	}

	// Concurrent commits of one member: each lands or is refused as
	// backwards, and the last one standing is the highest that landed.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var landed []uint64
	for i := range 8 {
		wg.Go(func() { // exits after one commit
			p := uint64(200 + 10*i)
			_, err := s.CommitPositions(ctx, "cp", "w1", la, shard.Commit{Session: la, MaxToken: 6, Default: p})
			switch {
			case err == nil:
				mu.Lock()
				landed = append(landed, p)
				mu.Unlock()
			case !errors.Is(err, ErrBackwards):
				t.Errorf("concurrent commit at %d: %v", p, err)
			}
		})
	}
	wg.Wait()
	if got, _ := stored(); len(landed) == 0 || got.Default != slices.Max(landed) {
		t.Errorf("after concurrent commits the record is at %d; landed %v", got.Default, landed)
	}

	// A new session of the same id cannot overwrite the old session's
	// positions before the leader folds them.
	if _, _, err := s.Join(ctx, "cp", member("w1"), b.LeaseID(), true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CommitPositions(ctx, "cp", "w1", b.LeaseID(), shard.Commit{Session: b.LeaseID()}); !errors.Is(err, ErrConflict) {
		t.Errorf("commit over an unfolded record: %v, want ErrConflict", err)
	}
	if _, err := s.CommitPositions(ctx, "cp", "w1", la, shard.Commit{Session: la, MaxToken: 6, Default: 900}); !errors.Is(err, ErrFenced) {
		t.Errorf("commit of the replaced session: %v, want ErrFenced", err)
	}
	if _, err := s.Commit(ctx, fence, []Write{Delete(PositionsKey("cp", "w1"))}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CommitPositions(ctx, "cp", "w1", b.LeaseID(), shard.Commit{Session: b.LeaseID()}); err != nil {
		t.Errorf("commit once folded: %v", err)
	}

	// The snapshot has the record and the keyspace's bucket positions.
	bp := shard.BucketPositions{Runs: []shard.PositionRun{{First: 0, Count: 64, Position: 5}}}
	if _, err := s.Commit(ctx, fence, PutBucketPositions("cp", shard.BucketPositions{}, bp), []Expect{{Key: BucketPosKey("cp", 0)}}); err != nil {
		t.Fatal(err)
	}
	snap, _, err := s.LoadKeyspace(ctx, "cp")
	if err != nil {
		t.Fatal(err)
	}
	st := snap.Keyspaces["cp"]
	if len(snap.Corrupt) != 0 || st.Commits["w1"].Value.Session != b.LeaseID() || !slices.Equal(st.Positions().Runs, bp.Runs) {
		t.Errorf("snapshot: commits %+v, positions %+v, corrupt %v", st.Commits, st.Positions(), snap.Corrupt)
	}
}

// TestReleaseKeepsPositions: a release's final positions are stored, and
// survive the member's later releases.
func TestReleaseKeepsPositions(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	createStreamKeyspace(t, s, "rp")
	a := newSession(t, s, 10*time.Second)
	if _, _, err := s.Join(ctx, "rp", member("w1"), a.LeaseID(), false); err != nil {
		t.Fatal(err)
	}
	_, fence := campaign(t, s, "leader-rp")
	g := shard.Grants{Session: a.LeaseID(), Buckets: []shard.BucketToken{{Bucket: 1, Token: 2}, {Bucket: 2, Token: 2}}}
	if _, err := s.Commit(ctx, fence, []Write{PutGrants("rp", "w1", g)}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, "rp", "w1", a.LeaseID(), []shard.BucketToken{{Bucket: 1, Token: 2, Position: 77}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, "rp", "w1", a.LeaseID(), []shard.BucketToken{{Bucket: 2, Token: 2}}, nil); err != nil {
		t.Fatal(err)
	}
	resp, err := s.client.Get(ctx, ReleasesKey("rp", "w1"), clientv3.WithLimit(1))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("read releases: %v", err)
	}
	if want := `{"buckets":[[1,2],[2,2]],"positions":[[1,77]]}`; string(resp.Kvs[0].Value) != want {
		t.Errorf("releases %s, want %s", resp.Kvs[0].Value, want)
	}
}

// TestReleaseRefusesBackwards: a release position below the bucket's
// committed one is refused and releases nothing; a release at it or
// above is kept, and a retry without a position keeps it.
func TestReleaseRefusesBackwards(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	createStreamKeyspace(t, s, "rb")
	a := newSession(t, s, 10*time.Second)
	la := a.LeaseID()
	if _, _, err := s.Join(ctx, "rb", member("w1"), la, false); err != nil {
		t.Fatal(err)
	}
	_, fence := campaign(t, s, "leader-rb")
	g := shard.Grants{Session: la, Buckets: []shard.BucketToken{{Bucket: 1, Token: 2}, {Bucket: 2, Token: 2, Position: 300}}}
	if _, err := s.Commit(ctx, fence, []Write{PutGrants("rb", "w1", g), PutTokens("rb", 2)}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CommitPositions(ctx, "rb", "w1", la, shard.Commit{Session: la, MaxToken: 2, Default: 100}); err != nil {
		t.Fatal(err)
	}
	releases := func() string {
		t.Helper()
		resp, err := s.client.Get(ctx, ReleasesKey("rb", "w1"))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return ""
		}
		return string(resp.Kvs[0].Value)
	}
	var be *BackwardsError
	// Bucket 2's grant starts at 300, above the commit's default.
	for _, rel := range [][]shard.BucketToken{{{Bucket: 1, Token: 2, Position: 99}}, {{Bucket: 1, Token: 2, Position: 100}, {Bucket: 2, Token: 2, Position: 299}}} {
		_, err := s.Release(ctx, "rb", "w1", la, rel, &ReleaseState{Grants: g, GrantsRev: 1}) // a stale guess
		if !errors.As(err, &be) || be.Field != "positions" || be.Bucket != rel[len(rel)-1].Bucket {
			t.Fatalf("release %v: %v, want a *BackwardsError for bucket %d", rel, err, rel[len(rel)-1].Bucket)
		}
	}
	if got := releases(); got != "" {
		t.Fatalf("refused releases wrote %s", got)
	}
	if _, err := s.Release(ctx, "rb", "w1", la, []shard.BucketToken{{Bucket: 1, Token: 2, Position: 100}, {Bucket: 2, Token: 2, Position: 300}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, "rb", "w1", la, []shard.BucketToken{{Bucket: 1, Token: 2}}, nil); err != nil {
		t.Fatal(err)
	}
	if want := `{"buckets":[[1,2],[2,2]],"positions":[[1,100],[2,300]]}`; releases() != want {
		t.Errorf("releases %s, want %s", releases(), want)
	}
}

// TestCommitPositionsWithGuess: a current guess commits in one round
// trip; a stale one is corrected by the write's compares, and a refusal
// it would cause is checked on a fresh read first.
func TestCommitPositionsWithGuess(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	createStreamKeyspace(t, s, "cg")
	a := newSession(t, s, 10*time.Second)
	la := a.LeaseID()
	if _, _, err := s.Join(ctx, "cg", member("w1"), la, false); err != nil {
		t.Fatal(err)
	}
	_, fence := campaign(t, s, "leader-cg")
	g := shard.Grants{Session: la, Buckets: []shard.BucketToken{{Bucket: 1, Token: 4}, {Bucket: 2, Token: 5}}}
	if _, err := s.Commit(ctx, fence, []Write{PutGrants("cg", "w1", g), PutTokens("cg", 5)}, nil); err != nil {
		t.Fatal(err)
	}
	// A stale guess: no grants, no record, no token. The exception would
	// be refused as not held by it.
	c := shard.Commit{Session: la, MaxToken: 5, Default: 10, Exceptions: []shard.BucketPosition{{Bucket: 2, Token: 5, Position: 4}}}
	rev, st, err := s.CommitPositionsWith(ctx, "cg", "w1", la, c, &CommitState{Buckets: 64})
	if err != nil {
		t.Fatal(err)
	}
	if st.GrantsRev == 0 || len(st.Grants.Buckets) != 2 || st.LastToken != 5 || st.CommitRev != 0 {
		t.Fatalf("state checked against: %+v", st)
	}
	// The state after it is a current guess.
	st.Commit, st.CommitRev = c, rev
	before, err := s.Rev(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Default = 20
	rev2, _, err := s.CommitPositionsWith(ctx, "cg", "w1", la, c, &st)
	if err != nil || rev2 != before+1 {
		t.Fatalf("commit from a current guess: revision %d (etcd was at %d), %v; want one write", rev2, before, err)
	}
	// Checked against the state: a lower one is refused, fresh.
	c.Default = 15
	if _, st2, err := s.CommitPositionsWith(ctx, "cg", "w1", la, c, &st); !errors.Is(err, ErrBackwards) || st2.CommitRev != rev2 {
		t.Fatalf("commit below the record: %v, state %+v", err, st2)
	}
	if err := st.Check(c, la); err != nil {
		t.Errorf("the stale state accepts %+v: %v", c, err)
	}
}
