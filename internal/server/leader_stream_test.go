package server

import (
	"slices"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"

	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/placement"
)

// The leader's half of stream positions, on the store in memory: a
// bucket that leaves its holder has its position folded into the
// keyspace's bucket positions, in the commit that regrants it, and the
// grant starts there.

var streamKeyspace = shard.Keyspace{Name: "ev", Buckets: 4, Hash: placement.HashXXH64, Mode: shard.ModeStream, LeaseTTL: loopTTL}

// streamWithA returns a store holding stream keyspace ev and member a,
// joined and active, and a loop that has granted a every bucket (token 1,
// from 0).
func streamWithA(t *testing.T) (*memStore, *loop, shard.LeaseID) {
	st := newMemStore()
	st.put(store.KindKeyspace, "ev", "", streamKeyspace, 0)
	la := st.join("ev", "a", loopTTL)
	l := startLoop(t, st)
	l.settle()
	if g := st.snapshot().Keyspaces["ev"].Grants["a"].Value; len(g.Buckets) != 4 {
		t.Fatalf("a holds %v; want the 4 buckets", g.Buckets)
	}
	return st, l, la
}

// commitA puts a's commit record: every bucket it holds at token <= 1 at
// def.
func commitA(st *memStore, la shard.LeaseID, def uint64) {
	st.put(store.KindPositions, "ev", "a", shard.Commit{Session: la, MaxToken: 1, Default: def}, 0)
}

// from returns, per bucket member id holds in ks, the grant's From.
func from(snap *store.Snapshot, ks, id string) map[int]uint64 {
	out := map[int]uint64{}
	for _, bt := range snap.Keyspaces[ks].Grants[id].Value.Buckets {
		out[bt.Bucket] = bt.Position
	}
	return out
}

// joinB joins b and lets the leader move half the buckets to it; it
// returns the buckets now targeted at b, still held by a.
func joinB(t *testing.T, st *memStore, l *loop) []int {
	t.Helper()
	st.join("ev", "b", loopTTL)
	l.settle()
	snap := st.snapshot().Keyspaces["ev"]
	var moved []int
	for b := range streamKeyspace.Buckets {
		if snap.Map.Value.Assignment.Owner(b) == "b" {
			moved = append(moved, b)
		}
	}
	if len(moved) != 2 {
		t.Fatalf("buckets targeted at b: %v; want 2", moved)
	}
	return moved
}

// releaseA puts a's release of buckets (held at token 1), each at final
// position pos (0: none given).
func releaseA(st *memStore, la shard.LeaseID, buckets []int, pos uint64) {
	var r shard.Releases
	for _, b := range buckets {
		r.Buckets = append(r.Buckets, shard.BucketToken{Bucket: b, Token: 1, Position: pos})
	}
	st.put(store.KindReleases, "ev", "a", r, la)
}

// TestLeadStreamGracefulMove: a releases the buckets that move to b with
// its final position for them; b's grants start there, and the keyspace's
// bucket positions keep it. A final position is where a stopped: it
// wins over a commit whose default still covered the released buckets
// (the store refuses a final position below the commit made before the
// release, so such a commit came after it).
func TestLeadStreamGracefulMove(t *testing.T) {
	for _, tc := range []struct {
		name          string
		commit, final uint64
		want          uint64
	}{
		{"final above commit", 50, 80, 80},
		{"final below a later commit", 50, 30, 30},
		{"no final position", 50, 0, 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st, l, la := streamWithA(t)
				defer l.stop()
				commitA(st, la, tc.commit)
				moved := joinB(t, st, l)
				releaseA(st, la, moved, tc.final)
				l.settle()

				snap := st.snapshot()
				want := map[int]uint64{moved[0]: tc.want, moved[1]: tc.want}
				if diff := cmp.Diff(want, from(snap, "ev", "b")); diff != "" {
					t.Errorf("b's grants' From (-want +got):\n%s", diff)
				}
				base := snap.Keyspaces["ev"].Positions()
				for _, b := range moved {
					if got := base.Position(b); got != tc.want {
						t.Errorf("bucket %d's position in bucketpos: %d, want %d", b, got, tc.want)
					}
				}
				if _, ok := snap.Keyspaces["ev"].Commits["a"]; !ok {
					t.Error("a's commit record was deleted; a is still live")
				}
				if n := writeFailures(t, l.s); n != 0 {
					t.Errorf("%v failed writes", n)
				}
			})
		})
	}
}

// TestLeadStreamCrash: a's session ends without a release; its buckets
// go to b at a's committed position, and a's commit record is folded and
// deleted in that same commit.
func TestLeadStreamCrash(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, l, la := streamWithA(t)
		defer l.stop()
		commitA(st, la, 50)
		st.join("ev", "b", loopTTL)
		st.Revoke(t.Context(), la) // a crashed: its member record and grants vanish
		l.settle()

		snap := st.snapshot()
		want := map[int]uint64{0: 50, 1: 50, 2: 50, 3: 50}
		if diff := cmp.Diff(want, from(snap, "ev", "b")); diff != "" {
			t.Errorf("b's grants' From (-want +got):\n%s", diff)
		}
		if c, ok := snap.Keyspaces["ev"].Commits["a"]; ok {
			t.Errorf("a's commit record %+v outlived its session", c.Value)
		}
		if diff := cmp.Diff([]uint64{50, 50, 50, 50}, snap.Keyspaces["ev"].Positions().Dense(4)); diff != "" {
			t.Errorf("bucket positions (-want +got):\n%s", diff)
		}
		sameCommit(t, st, store.PositionsKey("ev", "a"), store.GrantsKey("ev", "b"))
	})
}

// sameCommit checks that the last commit that wrote (or deleted) key
// first also wrote key second.
func sameCommit(t *testing.T, st *memStore, first, second string) {
	t.Helper()
	calls := st.calls()
	for i := len(calls) - 1; i >= 0; i-- {
		if c := calls[i]; c.err == nil && slices.Contains(c.keys, first) {
			if !slices.Contains(c.keys, second) {
				t.Errorf("the commit that writes %s writes %v, not %s", first, c.keys, second)
			}
			return
		}
	}
	t.Errorf("no commit wrote %s", first)
}

// TestLeadStreamCommitRacesHandoff: a releases the buckets that move to b
// without final positions, and one of its commits lands between the
// leader's fold and its write, as the store writes it: the released
// buckets pinned at the commit before the release. The write does not
// conflict (it does not expect a's commit record), and b starts at 50, the
// position a committed before the release.
func TestLeadStreamCommitRacesHandoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, l, la := streamWithA(t)
		defer l.stop()
		commitA(st, la, 50)
		moved := joinB(t, st, l)
		st.raceCommit(store.GrantsKey("ev", "b"), store.Change{Kind: store.KindPositions, Keyspace: "ev", ID: "a",
			Value: shard.Commit{Session: la, MaxToken: 1, Default: 90, Exceptions: []shard.BucketPosition{
				{Bucket: moved[0], Token: 1, Position: 50}, {Bucket: moved[1], Token: 1, Position: 50},
			}}})
		releaseA(st, la, moved, 0)
		st.flush()
		synctest.Wait()
		calls := st.calls()
		if last := calls[len(calls)-1]; last.err != nil {
			t.Fatalf("the round planned before a's commit: %v; want it written", written(calls, len(calls)-1))
		}
		l.settle()

		snap := st.snapshot()
		want := map[int]uint64{moved[0]: 50, moved[1]: 50}
		if diff := cmp.Diff(want, from(snap, "ev", "b")); diff != "" {
			t.Errorf("b's grants' From (-want +got):\n%s", diff)
		}
		for _, b := range moved {
			if got := snap.Keyspaces["ev"].Positions().Position(b); got != 50 {
				t.Errorf("bucket %d's position in bucketpos: %d, want 50", b, got)
			}
		}
	})
}

// TestLeadStreamRejoin: a crashes and re-joins under the same id; its
// earlier session's commit record is folded and deleted no later than the
// commit that grants the new session anything, and the new grants start
// at the folded positions.
func TestLeadStreamRejoin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, l, la := streamWithA(t)
		defer l.stop()
		commitA(st, la, 50)
		st.Revoke(t.Context(), la)
		la2 := st.join("ev", "a", loopTTL)
		l.settle()

		snap := st.snapshot()
		if g := snap.Keyspaces["ev"].Grants["a"].Value; g.Session != la2 {
			t.Fatalf("a's grants are of session %v; want the new one, %v", g.Session, la2)
		}
		want := map[int]uint64{0: 50, 1: 50, 2: 50, 3: 50}
		if diff := cmp.Diff(want, from(snap, "ev", "a")); diff != "" {
			t.Errorf("a's new grants' From (-want +got):\n%s", diff)
		}
		if _, ok := snap.Keyspaces["ev"].Commits["a"]; ok {
			t.Error("the earlier session's commit record is still there")
		}
		// Replay the history: no grant to la2 while the old record exists.
		st.mu.Lock()
		defer st.mu.Unlock()
		oldRecord := true
		for _, u := range st.history {
			for _, c := range u.Changes {
				if c.Kind == store.KindPositions && c.ID == "a" && c.Deleted {
					oldRecord = false
				}
			}
			for _, c := range u.Changes {
				if c.Kind == store.KindGrants && c.ID == "a" && !c.Deleted {
					if g := c.Value.(shard.Grants); g.Session == la2 && len(g.Buckets) > 0 && oldRecord {
						t.Errorf("rev %d grants %v to the new session before the old commit record is folded", u.Rev, g.Buckets)
					}
				}
			}
		}
	})
}

// TestLeadExclusiveWritesNoPositions: an exclusive keyspace's moves, a
// graceful one and a crash, write no positions and no From.
func TestLeadExclusiveWritesNoPositions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, la := storeWithA()
		l := startLoop(t, st)
		defer l.stop()
		l.settle()
		st.join("rooms", "b", loopTTL)
		l.settle()
		var moved []int
		for b := range loopKeyspace.Buckets {
			if st.snapshot().Keyspaces["rooms"].Map.Value.Assignment.Owner(b) == "b" {
				moved = append(moved, b)
			}
		}
		var r shard.Releases
		for _, b := range moved {
			r.Buckets = append(r.Buckets, shard.BucketToken{Bucket: b, Token: 1})
		}
		st.put(store.KindReleases, "rooms", "a", r, la)
		l.settle()
		st.Revoke(t.Context(), la)
		l.settle()
		heldByTargets(t, st.snapshot(), "rooms")

		st.mu.Lock()
		defer st.mu.Unlock()
		for _, u := range st.history {
			for _, c := range u.Changes {
				switch c.Kind {
				case store.KindPositions, store.KindBucketPos:
					t.Errorf("rev %d writes %s", u.Rev, c.Key)
				case store.KindGrants:
					if c.Deleted {
						continue
					}
					for _, bt := range c.Value.(shard.Grants).Buckets {
						if bt.Position != 0 {
							t.Errorf("rev %d grants bucket %d from %d", u.Rev, bt.Bucket, bt.Position)
						}
					}
				}
			}
		}
	})
}

// TestLeadStreamLeaveLeavesNoCopy: a commits, then leaves gracefully: it
// releases everything to b and the leader ends its session. The copy of
// a's grants is written with them while a holds buckets, names nothing
// once a released them all (a's commit record still needs folding), and
// goes with the commit record once a's session has ended: nothing of a
// is left in the store.
func TestLeadStreamLeaveLeavesNoCopy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, l, la := streamWithA(t)
		defer l.stop()
		if h := st.snapshot().Keyspaces["ev"].Held["a"].Value; h.Session != la || len(h.Buckets) != 4 {
			t.Fatalf("copy of a's grants %+v; want its 4 buckets", h)
		}
		sameCommit(t, st, store.HeldKey("ev", "a"), store.GrantsKey("ev", "a"))
		commitA(st, la, 50)
		st.join("ev", "b", loopTTL)
		st.put(store.KindDrain, "ev", "a", shard.Drain{Leave: true}, la)
		l.settle()
		releaseA(st, la, []int{0, 1, 2, 3}, 60)
		l.settle()

		snap := st.snapshot().Keyspaces["ev"]
		if diff := cmp.Diff(map[int]uint64{0: 60, 1: 60, 2: 60, 3: 60}, from(st.snapshot(), "ev", "b")); diff != "" {
			t.Errorf("b's grants' From (-want +got):\n%s", diff)
		}
		if h := snap.Held["b"].Value; len(h.Buckets) != 4 {
			t.Errorf("copy of b's grants %+v; want its 4 buckets", h)
		}
		st.mu.Lock()
		defer st.mu.Unlock()
		for _, kind := range []store.Kind{store.KindMember, store.KindGrants, store.KindPositions, store.KindHeld} {
			if _, ok := st.kvs[store.Key(kind, "ev", "a")]; ok {
				t.Errorf("a left, but %s is still there", store.Key(kind, "ev", "a"))
			}
		}
		// While a held nothing but its commit record was not folded, its
		// copy named nothing.
		emptied := false
		for _, u := range st.history {
			for _, c := range u.Changes {
				if c.Kind == store.KindHeld && c.ID == "a" && !c.Deleted && len(c.Value.(shard.Held).Buckets) == 0 {
					emptied = true
				}
			}
		}
		if !emptied {
			t.Error("the copy of a's grants never named nothing")
		}
	})
}
