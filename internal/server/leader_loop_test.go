package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/clock/clocktest"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/placement"
)

// The leader's loop (lead) on a store in memory (memStore), in a synctest
// bubble: after synctest.Wait the loop has done everything it can and is
// waiting for the watch or the clock, which only the test moves. No etcd,
// no sleeps.

const loopTTL = 3 * time.Second

// errInjected is a commit that etcd did not answer.
var errInjected = fmt.Errorf("store: commit: %w: injected", store.ErrUnavailable)

// allAtA is every bucket held by a, at token 1, and targeted at it.
var allAtA = []string{"0: a@1 -> a", "1: a@1 -> a", "2: a@1 -> a", "3: a@1 -> a"}

var loopKeyspace = shard.Keyspace{Name: "rooms", Buckets: 4, Hash: placement.HashXXH64, Mode: shard.ModeExclusive, LeaseTTL: loopTTL, DrainTimeout: 30 * time.Second}

// storeWithA returns a store holding keyspace rooms (loopKeyspace) and
// member a, joined and active on the session it returns.
func storeWithA() (*memStore, shard.LeaseID) {
	st := newMemStore()
	st.put(store.KindKeyspace, "rooms", "", loopKeyspace, 0)
	return st, st.join("rooms", "a", loopTTL)
}

// loop is one term's coordinator loop, running on st.
type loop struct {
	t    *testing.T
	st   *memStore
	clk  *clocktest.Fake
	s    *Server
	end  context.CancelFunc // ends the term
	done chan error         // lead's result
}

// startLoop starts lead on st, as the leader st's fence names, and waits
// until it has loaded the store and made the writes it planned from it.
// Call it inside a bubble, and stop the loop before the bubble ends. opts
// set up the server first.
func startLoop(t *testing.T, st *memStore, opts ...func(*Server)) *loop {
	clk := clocktest.NewFake(time.Unix(1_700_000_000, 0))
	l := &loop{t: t, st: st, clk: clk, s: detached(t, clk), done: make(chan error, 1)}
	l.s.cfg.RebalanceGap = 0 // every map at once, unless an option sets a gap
	for _, o := range opts {
		o(l.s)
	}
	ctx, end := context.WithCancel(context.Background())
	l.end = end
	fence := st.leader()
	go func() { l.done <- l.s.lead(ctx, st, fence) }() // exits when the term ends or a write is fenced
	synctest.Wait()
	return l
}

// stop ends the term, if lead has not returned yet, and returns lead's
// result.
func (l *loop) stop() error {
	l.end()
	return <-l.done
}

// settle lets the watch deliver everything until the loop writes nothing
// more.
func (l *loop) settle() {
	l.t.Helper()
	for range 20 {
		n := len(l.st.calls())
		l.st.flush()
		synctest.Wait()
		if len(l.st.calls()) == n {
			return
		}
	}
	l.t.Fatal("the loop kept writing")
}

// written is, for each commit from call number from on, the keys it wrote
// ("[grants/a tokens]"), or the error it failed with.
func written(calls []memCommit, from int) []string {
	var out []string
	for _, c := range calls[from:] {
		if c.err != nil {
			out = append(out, "error: "+c.err.Error())
			continue
		}
		var kinds []string
		for _, key := range c.keys {
			if strings.HasPrefix(key, store.HistoryPrefix) {
				continue // the map's history entry, checked elsewhere
			}
			kind, _, id, _ := store.ParseKey(key)
			if id != "" {
				id = "/" + id
			}
			kinds = append(kinds, kind.String()+id)
		}
		slices.Sort(kinds)
		out = append(out, fmt.Sprint(kinds))
	}
	return out
}

// holdings is who holds each bucket of ks and at what token, and what the
// map targets it at, one line per bucket: "0: a@1 -> a".
func holdings(snap *store.Snapshot, ks string) []string {
	st := snap.Keyspaces[ks]
	out := make([]string, st.Config.Value.Buckets)
	for b := range out {
		out[b] = fmt.Sprintf("%d:", b)
	}
	ids := make([]string, 0, len(st.Grants))
	for id := range st.Grants {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		for _, bt := range st.Grants[id].Value.Buckets {
			out[bt.Bucket] += fmt.Sprintf(" %s@%d", id, bt.Token)
		}
	}
	for b := range out {
		out[b] += " -> " + st.Map.Value.Assignment.Owner(b)
	}
	return out
}

// heldByTargets checks that every bucket of ks is granted once, to its
// target owner.
func heldByTargets(t *testing.T, snap *store.Snapshot, ks string) {
	t.Helper()
	st := snap.Keyspaces[ks]
	holders := make([][]string, st.Config.Value.Buckets)
	for id, g := range st.Grants {
		for _, bt := range g.Value.Buckets {
			holders[bt.Bucket] = append(holders[bt.Bucket], id)
		}
	}
	for b, h := range holders {
		if target := st.Map.Value.Assignment.Owner(b); len(h) != 1 || h[0] != target {
			t.Errorf("bucket %d is held by %v; want its target %q alone", b, h, target)
		}
	}
}

// tokensRise checks that every grant round st applied took a new token:
// the counter rises with each write of it.
func tokensRise(t *testing.T, st *memStore) {
	t.Helper()
	st.mu.Lock()
	defer st.mu.Unlock()
	var last uint64
	for _, u := range st.history {
		for _, c := range u.Changes {
			if c.Kind == store.KindTokens && !c.Deleted {
				if tok := c.Value.(uint64); tok <= last {
					t.Errorf("token counter written %d after %d", tok, last)
				}
				last = c.Value.(uint64)
			}
		}
	}
}

// TestLeadJoin: a member joins a keyspace the leader has mapped to
// nobody; the leader maps every bucket to it and grants them, one write
// each, and writes nothing more once the watch has caught up.
func TestLeadJoin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		st.put(store.KindKeyspace, "rooms", "", loopKeyspace, 0)
		l := startLoop(t, st)
		defer l.stop()
		if diff := cmp.Diff([]string{"[map]"}, written(st.calls(), 0)); diff != "" {
			t.Fatalf("writes of a new term (-want +got):\n%s", diff)
		}

		lease := st.join("rooms", "a", loopTTL)
		l.settle()
		want := []string{"[map]", "[map]", "[grants/a tokens]"}
		if diff := cmp.Diff(want, written(st.calls(), 0)); diff != "" {
			t.Errorf("writes (-want +got):\n%s", diff)
		}
		// Each map is written with its history entry, in one commit.
		for i, e := range []uint64{1, 2} {
			if keys := st.calls()[i].keys; !slices.Contains(keys, store.HistoryKey("rooms", e)) {
				t.Errorf("map write %d: keys %v, no history entry of epoch %d", i, keys, e)
			}
		}
		snap := st.snapshot()
		ks := snap.Keyspaces["rooms"]
		if m := ks.Map.Value; m.Epoch != 2 || m.Hash != loopKeyspace.Hash {
			t.Errorf("map epoch %d, hash %q; want 2, %q", m.Epoch, m.Hash, loopKeyspace.Hash)
		}
		if diff := cmp.Diff(allAtA, holdings(snap, "rooms")); diff != "" {
			t.Errorf("holdings (-want +got):\n%s", diff)
		}
		if g := ks.Grants["a"]; g.Lease != lease || g.Value.Session != lease {
			t.Errorf("grants on lease %v, session %v; want a's session %v", g.Lease, g.Value.Session, lease)
		}
		if n := writeFailures(t, l.s); n != 0 {
			t.Errorf("%v failed writes", n)
		}
	})
}

// TestLeadReplansFailedWrite: a grant round fails; the loop counts it and,
// once the backoff has passed, replans from what it knows, without
// reloading the store. Nothing is lost: every bucket is granted once, and
// no token is issued twice.
func TestLeadReplansFailedWrite(t *testing.T) {
	// The round was not applied: its replan lands.
	t.Run("refused", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st, l := startFailingRound(t, false)
			defer l.stop()
			if n := writeFailures(t, l.s); n != 1 {
				t.Fatalf("%v failed writes, want 1", n)
			}
			if g := st.snapshot().Keyspaces["rooms"].Grants; len(g) != 0 {
				t.Fatalf("grants %v written by a refused round", g)
			}

			l.clk.Advance(writeBackoff(1) - time.Nanosecond)
			synctest.Wait()
			if n := len(st.calls()); n != 2 {
				t.Fatalf("replanned before the backoff: %d writes", n)
			}
			l.clk.Advance(time.Nanosecond)
			synctest.Wait()
			l.settle()
			want := []string{"[map]", "error: " + errInjected.Error(), "[grants/a tokens]"}
			if diff := cmp.Diff(want, written(st.calls(), 0)); diff != "" {
				t.Errorf("writes (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(allAtA, holdings(st.snapshot(), "rooms")); diff != "" {
				t.Errorf("holdings (-want +got):\n%s", diff)
			}
			tokensRise(t, st)
		})
	})
	// The round was applied but its answer lost: the replan, planned
	// before the watch brought the round, conflicts and writes nothing;
	// once the watch has brought it, the loop plans nothing more.
	t.Run("applied", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st, l := startFailingRound(t, true)
			defer l.stop()

			l.clk.Advance(writeBackoff(1))
			synctest.Wait()
			calls := st.calls()
			if n := len(calls); n != 3 || !errors.Is(calls[2].err, store.ErrConflict) {
				t.Fatalf("the replan of an applied round: %v; want a conflict", written(calls, 2))
			}
			// The first failure is the injected one (etcd unreachable), the
			// second the replan's conflict.
			if by := writeFailuresBy(t, l.s); len(by) != 2 || by["grants/unavailable"] != 1 || by["grants/conflict"] != 1 {
				t.Fatalf("failed writes by action/cause %v, want grants/unavailable: 1, grants/conflict: 1", by)
			}
			l.settle()
			l.clk.Advance(writeBackoff(2))
			synctest.Wait()
			l.settle()
			if n := len(st.calls()); n != 3 {
				t.Errorf("writes after the watch brought the applied round: %v", written(st.calls(), 3))
			}
			if diff := cmp.Diff(allAtA, holdings(st.snapshot(), "rooms")); diff != "" {
				t.Errorf("holdings (-want +got):\n%s", diff)
			}
			tokensRise(t, st)
		})
	})
}

// TestLeadBatchesKeyspaces: the maps and grant rounds of several
// keyspaces planned in one step go in one transaction; when it fails,
// they are written one by one, and only the one that fails is replanned.
func TestLeadBatchesKeyspaces(t *testing.T) {
	three := func() *memStore {
		st := newMemStore()
		for _, ks := range []string{"chats", "games", "rooms"} {
			k := loopKeyspace
			k.Name = ks
			st.put(store.KindKeyspace, ks, "", k, 0)
			st.join(ks, "a", loopTTL)
		}
		return st
	}
	t.Run("together", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := three()
			l := startLoop(t, st)
			defer l.stop()
			l.settle()
			want := []string{
				"[map map map]",
				"[grants/a grants/a grants/a tokens tokens tokens]",
			}
			if diff := cmp.Diff(want, written(st.calls(), 0)); diff != "" {
				t.Errorf("writes (-want +got):\n%s", diff)
			}
			for _, ks := range []string{"chats", "games", "rooms"} {
				if diff := cmp.Diff(allAtA, holdings(st.snapshot(), ks)); diff != "" {
					t.Errorf("holdings of %s (-want +got):\n%s", ks, diff)
				}
			}
			if n := writeFailures(t, l.s); n != 0 {
				t.Errorf("%v failed writes, want none", n)
			}
		})
	})
	t.Run("one fails", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := three()
			// games' round fails twice: in the transaction of the three,
			// then alone.
			st.failCommit(store.TokensKey("games"), errInjected, false)
			st.failCommit(store.TokensKey("games"), errInjected, false)
			l := startLoop(t, st)
			defer l.stop()
			l.settle()
			want := []string{
				"[map map map]",
				"error: " + errInjected.Error(), // the three rounds together
				"[grants/a tokens]",             // chats
				"error: " + errInjected.Error(), // games
				"[grants/a tokens]",             // rooms
			}
			if diff := cmp.Diff(want, written(st.calls(), 0)); diff != "" {
				t.Fatalf("writes (-want +got):\n%s", diff)
			}
			if by := writeFailuresBy(t, l.s); len(by) != 2 || by["batch/unavailable"] != 1 || by["grants/unavailable"] != 1 {
				t.Fatalf("failed writes by action/cause %v, want batch/unavailable: 1, grants/unavailable: 1", by)
			}
			l.clk.Advance(writeBackoff(1))
			synctest.Wait()
			l.settle()
			if diff := cmp.Diff([]string{"[grants/a tokens]"}, written(st.calls(), len(want))); diff != "" {
				t.Errorf("writes after the backoff: only games' round again (-want +got):\n%s", diff)
			}
			for _, ks := range []string{"chats", "games", "rooms"} {
				if diff := cmp.Diff(allAtA, holdings(st.snapshot(), ks)); diff != "" {
					t.Errorf("holdings of %s (-want +got):\n%s", ks, diff)
				}
			}
		})
	})
}

// startFailingRound starts the loop on storeWithA, whose first grant round
// fails with errInjected, after applying if applied.
func startFailingRound(t *testing.T, applied bool) (*memStore, *loop) {
	st, _ := storeWithA()
	st.failCommit(store.TokensKey("rooms"), errInjected, applied)
	return st, startLoop(t, st)
}

// TestLeadStopsWhenDeposed: once another replica is elected (the fence
// moved) or the term ends, the loop writes nothing more. Its first
// write after the election is fenced and ends the loop.
func TestLeadStopsWhenDeposed(t *testing.T) {
	t.Run("fenced", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st, _ := storeWithA()
			l := startLoop(t, st)
			defer l.stop()
			l.settle()
			before := len(st.calls())

			st.depose()
			st.join("rooms", "b", loopTTL)
			st.flush()
			synctest.Wait()
			select {
			case err := <-l.done:
				if !errors.Is(err, errNotLeader) {
					t.Errorf("lead returned %v, want errNotLeader", err)
				}
				l.done <- err // for stop
			default:
				t.Fatal("lead goes on after a fenced write")
			}
			calls := st.calls()[before:]
			if len(calls) != 1 || !errors.Is(calls[0].err, store.ErrFenced) {
				t.Errorf("writes once deposed: %v; want one, fenced", written(calls, 0))
			}
			st.join("rooms", "c", loopTTL)
			st.flush()
			synctest.Wait()
			if n := len(st.calls()); n != before+1 {
				t.Errorf("writes after the loop ended: %v", written(st.calls(), before+1))
			}
		})
	})
	t.Run("term ended", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st, _ := storeWithA()
			l := startLoop(t, st)
			l.settle()
			before := len(st.calls())
			if err := l.stop(); !errors.Is(err, errNotLeader) {
				t.Errorf("lead returned %v, want errNotLeader", err)
			}
			st.join("rooms", "b", loopTTL)
			st.flush()
			synctest.Wait()
			if n := len(st.calls()); n != before {
				t.Errorf("writes after the term ended: %v", written(st.calls(), before))
			}
		})
	})
}

// TestLeadSlowWatch: the watch lags the leader's own writes and then
// resyncs to a snapshot older than them, followed by their echoes and a
// join. The loop neither takes its view back (which would rewrite map
// epoch 1, or the grant round, against revisions that moved: conflicts)
// nor writes anything twice: it maps the new member against its latest
// map, and hands over what the old owner releases.
func TestLeadSlowWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, a := storeWithA()
		old := st.snapshot()
		l := startLoop(t, st)
		defer l.stop()
		// No watch yet: the loop planned the grants from its own map write.
		if diff := cmp.Diff([]string{"[map]", "[grants/a tokens]"}, written(st.calls(), 0)); diff != "" {
			t.Fatalf("writes of a new term (-want +got):\n%s", diff)
		}

		st.join("rooms", "b", loopTTL)
		st.resync(old)
		st.flush()
		synctest.Wait()
		want := []string{"[map]", "[grants/a tokens]", "[map]"}
		if diff := cmp.Diff(want, written(st.calls(), 0)); diff != "" {
			t.Fatalf("writes after the late watch (-want +got):\n%s", diff)
		}
		snap := st.snapshot()
		if m := snap.Keyspaces["rooms"].Map.Value; m.Epoch != 2 || m.Assignment.Counts()["b"] != 2 {
			t.Fatalf("map epoch %d %v; want epoch 2 with 2 buckets for b", m.Epoch, m.Assignment.Counts())
		}

		// a releases what moves to b; b is granted it at a new token.
		var rel []shard.BucketToken
		for _, bt := range snap.Keyspaces["rooms"].Grants["a"].Value.Buckets {
			if snap.Keyspaces["rooms"].Map.Value.Assignment.Owner(bt.Bucket) == "b" {
				rel = append(rel, bt)
			}
		}
		st.put(store.KindReleases, "rooms", "a", shard.Releases{Buckets: rel}, a)
		l.settle()
		heldByTargets(t, st.snapshot(), "rooms")
		for _, c := range st.calls() {
			if c.err != nil {
				t.Errorf("a write failed: %v", c.err)
			}
		}
		if n := writeFailures(t, l.s); n != 0 {
			t.Errorf("%v failed writes", n)
		}
		tokensRise(t, st)
	})
}

// TestLeadDrainTimeoutWaitsForWatch: a member released its buckets, but
// the leader's watch has not delivered the release when the drain
// timeout (counted from the leader's own map write) passes. The leader
// must not revoke the member for it: it waits until the watch has
// delivered the store's revision, sees the release, and hands the
// buckets over.
func TestLeadDrainTimeoutWaitsForWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, a := storeWithA()
		l := startLoop(t, st)
		defer l.stop()
		l.settle()
		st.join("rooms", "b", loopTTL)
		l.settle()
		snap := st.snapshot()
		var rel []shard.BucketToken
		for _, bt := range snap.Keyspaces["rooms"].Grants["a"].Value.Buckets {
			if snap.Keyspaces["rooms"].Map.Value.Assignment.Owner(bt.Bucket) == "b" {
				rel = append(rel, bt)
			}
		}
		if len(rel) == 0 {
			t.Fatal("nothing moved to b")
		}
		// a releases; the watch does not deliver it yet.
		st.put(store.KindReleases, "rooms", "a", shard.Releases{Buckets: rel}, a)
		for range 35 {
			l.clk.Advance(time.Second)
			synctest.Wait()
		}
		if _, ok := st.snapshot().Keyspaces["rooms"].Members["a"]; !ok {
			t.Fatal("a's session was revoked for a release the watch had not delivered")
		}
		// A deferred revocation is not reported: only one that is made.
		// (Each retry of the deferred decision reported it again: at 10,000
		// members, millions of log lines that starved the leader.)
		if n := reports(t, l.s, "drain-timeout"); n != 0 {
			t.Errorf("%v drain-timeout reports for a revocation the leader deferred", n)
		}
		// The watch catches up; the deferred decision is taken again after
		// its backoff, and the release wins.
		l.settle()
		l.clk.Advance(time.Second)
		synctest.Wait()
		l.settle()
		if _, ok := st.snapshot().Keyspaces["rooms"].Members["a"]; !ok {
			t.Fatal("a's session was revoked although it released in time")
		}
		heldByTargets(t, st.snapshot(), "rooms")
	})
}

// TestLeadRebalanceGap: with a rebalance gap, joins right after a map wait
// for the gap's end, on the loop's own timer, and come as one map; a
// crash within the gap is mapped at once.
func TestLeadRebalanceGap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, _ := storeWithA()
		l := startLoop(t, st, func(s *Server) { s.cfg.RebalanceGap = 300 * time.Millisecond }) // not the 1 s tick's
		defer l.stop()
		l.settle()
		n := len(st.calls())
		leaseB := st.join("rooms", "b", loopTTL)
		st.join("rooms", "c", loopTTL)
		l.settle()
		if got := written(st.calls(), n); len(got) != 0 {
			t.Fatalf("joins within the gap wrote %v", got)
		}
		l.clk.Advance(300*time.Millisecond - time.Nanosecond)
		l.settle()
		if got := written(st.calls(), n); len(got) != 0 {
			t.Fatalf("a nanosecond before the gap's end: %v", got)
		}
		l.clk.Advance(time.Nanosecond)
		l.settle()
		if got := written(st.calls(), n); len(got) == 0 || got[0] != "[map]" {
			t.Fatalf("at the gap's end: %v, want one map first", got)
		}
		snap := st.snapshot()
		m := snap.Keyspaces["rooms"].Map.Value
		if c := m.Assignment.Counts(); c["b"] == 0 || c["c"] == 0 {
			t.Errorf("map epoch %d: %v; want b and c in one map", m.Epoch, c)
		}
		epoch := m.Epoch
		// d joins, then b crashes, within the gap: one map, at once.
		n = len(st.calls())
		st.join("rooms", "d", loopTTL)
		l.settle()
		if err := st.Revoke(context.Background(), leaseB); err != nil { // b's lease expires
			t.Fatal(err)
		}
		l.settle()
		if got := written(st.calls(), n); len(got) == 0 || got[0] != "[map]" {
			t.Fatalf("b's crash within the gap: %v, want a map at once", got)
		}
		m = st.snapshot().Keyspaces["rooms"].Map.Value
		if c := m.Assignment.Counts(); m.Epoch != epoch+1 || c["b"] != 0 || c["d"] == 0 {
			t.Errorf("map epoch %d (after %d): %v; want b gone and d in", m.Epoch, epoch, c)
		}
	})
}

// TestLeadHeldJoinStatus: while the leader holds a join back for the
// rebalance gap, Status's KeyspaceStatus counts the joined member in
// members_without_buckets, so a caller waiting for the keyspace to settle
// waits for its map; a pending member (no keep-alive yet) and a draining
// one, which no map would give buckets, are not counted. Once the gap has
// passed and the map is written, none is.
func TestLeadHeldJoinStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, _ := storeWithA()
		l := startLoop(t, st, func(s *Server) { s.cfg.RebalanceGap = 300 * time.Millisecond })
		defer l.stop()
		l.settle()
		status := func() *v1.KeyspaceStatus { return keyspaceStatus(st.snapshot().Keyspaces["rooms"]) }
		if k := status(); k.MembersWithoutBuckets != 0 || k.HandoffsInFlight != 0 || k.UnassignedBuckets != 0 {
			t.Fatalf("a alone: %v; want settled", k)
		}
		n := len(st.calls())
		leaseP, _, _ := st.Grant(context.Background(), loopTTL)
		st.put(store.KindMember, "rooms", "p", shard.Member{ID: "p", Weight: 1, Session: leaseP, Pending: true}, leaseP)
		l.settle()
		if k := status(); k.MembersWithoutBuckets != 0 || k.Members != 2 {
			t.Fatalf("p pending: %v; want 2 members, none without buckets counted", k)
		}
		st.join("rooms", "b", loopTTL)
		leaseC := st.join("rooms", "c", loopTTL)
		l.settle()
		if k := status(); k.MembersWithoutBuckets != 2 || k.HandoffsInFlight != 0 || k.UnassignedBuckets != 0 || k.ReleasingBuckets != 0 {
			t.Fatalf("b and c joined within the gap: %v; want 2 members without buckets", k)
		}
		st.put(store.KindDrain, "rooms", "c", shard.Drain{By: "admin"}, leaseC)
		l.settle()
		if k := status(); k.MembersWithoutBuckets != 1 || k.DrainingMembers != 1 {
			t.Fatalf("c drained: %v; want 1 member without buckets (b), 1 draining", k)
		}
		if got := written(st.calls(), n); len(got) != 0 {
			t.Fatalf("within the gap: %v; want the map held", got)
		}
		l.clk.Advance(300 * time.Millisecond)
		l.settle()
		if got := written(st.calls(), n); len(got) == 0 || got[0] != "[map]" {
			t.Fatalf("at the gap's end: %v, want a map first", got)
		}
		if c := st.snapshot().Keyspaces["rooms"].Map.Value.Assignment.Counts(); c["b"] == 0 || c["c"] != 0 || c["p"] != 0 {
			t.Fatalf("map after the gap: %v; want b in, c and p out", c)
		}
		if k := status(); k.MembersWithoutBuckets != 0 {
			t.Fatalf("after the gap: %v; want no member without buckets", k)
		}
	})
}

// TestKeyspaceStatusNoMap: before the keyspace's first map every active
// member is without buckets.
func TestKeyspaceStatusNoMap(t *testing.T) {
	st, _ := storeWithA()
	st.join("rooms", "b", loopTTL)
	k := keyspaceStatus(st.snapshot().Keyspaces["rooms"])
	if k.MembersWithoutBuckets != 2 || k.UnassignedBuckets != uint32(loopKeyspace.Buckets) || k.Epoch != 0 {
		t.Fatalf("no map: %v; want 2 members without buckets, every bucket unassigned", k)
	}
}

// TestKeyspaceStatusCounts: Status's counts over a map of 8 buckets.
// a owns 0-3, b owns 4-6, bucket 7 is unassigned. a holds 0-3 and 4 (4
// is b's: a handoff, and a's release); b holds 5; x, whom the map does
// not name, holds 6 (a handoff, and a release) and 7 (a release of an
// unassigned bucket), and 9, a bucket the map does not have.
func TestKeyspaceStatusCounts(t *testing.T) {
	u := placement.Unassigned
	ks := &store.KeyspaceState{
		Config: store.Entry[shard.Keyspace]{Value: shard.Keyspace{Name: "k", Buckets: 8}, ModRevision: 1},
		Map: store.Entry[shard.Map]{ModRevision: 2, Value: shard.Map{Epoch: 3, Assignment: placement.Assignment{
			Members: []string{"a", "b"}, Owners: []int32{0, 0, 0, 0, 1, 1, 1, u}}}},
		Members: map[string]store.Entry[shard.Member]{
			"a": {Value: shard.Member{ID: "a", Weight: 1}, Lease: 1},
			"b": {Value: shard.Member{ID: "b", Weight: 1}, Lease: 2},
			"c": {Value: shard.Member{ID: "c", Weight: 1}, Lease: 3}, // active, no buckets
		},
		Grants: map[string]store.Entry[shard.Grants]{
			"a": {Value: shard.Grants{Buckets: []shard.BucketToken{{Bucket: 0}, {Bucket: 1}, {Bucket: 2}, {Bucket: 3}, {Bucket: 4}}}},
			"b": {Value: shard.Grants{Buckets: []shard.BucketToken{{Bucket: 5}}}},
			"x": {Value: shard.Grants{Buckets: []shard.BucketToken{{Bucket: 6}, {Bucket: 7}, {Bucket: 9}}}},
		},
	}
	k := keyspaceStatus(ks)
	got := [5]uint32{k.UnassignedBuckets, k.HandoffsInFlight, k.ReleasingBuckets, k.MembersWithoutBuckets, k.Members}
	if want := [5]uint32{1, 2, 4, 1, 3}; got != want {
		t.Fatalf("unassigned, handoffs, releasing, without buckets, members = %v; want %v", got, want)
	}
}
