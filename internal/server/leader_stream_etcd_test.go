package server

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/keyshard/keyshard/clock"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/placement"
)

// TestLeadStreamHandoffEtcd: on embedded etcd, the leader's loop hands
// the buckets that move from a to b over with a's final position, which
// a's release carries above its committed one: b's grants start there,
// the keyspace's bucket positions keep it, and a's commit record, written
// by CommitPositions, stays a's.
func TestLeadStreamHandoffEtcd(t *testing.T) {
	s, st, ctx := streamOnEtcd(t)
	join := func(id string) shard.LeaseID { return streamJoin(ctx, t, st, id, 10*time.Second) }
	waitFor := func(what string, cond func(*store.KeyspaceState) bool) *store.KeyspaceState {
		return waitKeyspace(ctx, t, st, "ev", what, cond)
	}
	holds := func(id string, n int) func(*store.KeyspaceState) bool {
		return func(k *store.KeyspaceState) bool { return len(k.Grants[id].Value.Buckets) == n }
	}

	la := join("a")
	defer leadOnEtcd(ctx, t, s, st, st, "leader")()

	k := waitFor("a to hold every bucket", holds("a", 4))
	g := k.Grants["a"].Value
	if _, err := st.CommitPositions(ctx, "ev", "a", la, shard.Commit{Session: la, MaxToken: g.Buckets[0].Token, Default: 70}); err != nil {
		t.Fatal(err)
	}
	join("b")
	k = waitFor("the map to move two buckets to b", func(k *store.KeyspaceState) bool { return k.Map.Value.Assignment.Counts()["b"] == 2 })
	var release []shard.BucketToken
	for _, bt := range g.Buckets {
		if k.Map.Value.Assignment.Owner(bt.Bucket) == "b" {
			release = append(release, shard.BucketToken{Bucket: bt.Bucket, Token: bt.Token, Position: 120})
		}
	}
	if _, err := st.Release(ctx, "ev", "a", la, release, nil); err != nil {
		t.Fatal(err)
	}
	k = waitFor("b to hold its two buckets", holds("b", 2))
	for _, bt := range k.Grants["b"].Value.Buckets {
		if bt.Position != 120 {
			t.Errorf("b's grant of bucket %d starts at %d; want a's final position 120", bt.Bucket, bt.Position)
		}
		if got := k.Positions().Position(bt.Bucket); got != 120 {
			t.Errorf("bucket %d's stored position is %d; want 120", bt.Bucket, got)
		}
	}
	for _, bt := range k.Grants["a"].Value.Buckets {
		if got := k.Positions().Position(bt.Bucket); got != 0 {
			t.Errorf("bucket %d, still a's, has stored position %d; want it left with its holder", bt.Bucket, got)
		}
	}
	if c, ok := k.Commits["a"]; !ok || c.Value.Default != 70 {
		t.Errorf("a's commit record %+v, present %v; want a's, at 70", c.Value, ok)
	}
}

// TestLeadStreamFoldAcrossLeadersEtcd: on embedded etcd, a commits its
// positions and its leader stops; a's lease expires while no leader runs,
// so etcd deletes its grants before any leader sees that. The next
// leader folds a's commit record from the copy of a's grants (held/),
// exactly: b's grants start at a's Default, and at its exception for the
// bucket that has one, not at the older bucket positions. The commit
// record and the copy go in that round.
func TestLeadStreamFoldAcrossLeadersEtcd(t *testing.T) {
	s, st, ctx := streamOnEtcd(t)
	join := func(id string, ttl time.Duration) shard.LeaseID { return streamJoin(ctx, t, st, id, ttl) }
	waitFor := func(what string, cond func(*store.KeyspaceState) bool) *store.KeyspaceState {
		return waitKeyspace(ctx, t, st, "ev", what, cond)
	}
	// lead runs a leader's loop on a new election session until the
	// returned stop is called; stop resigns, so that the next one is
	// elected at once.
	lead := func(name string) (stop func()) { return leadOnEtcd(ctx, t, s, st, st, name) }

	// a's lease is short, and nobody keeps it alive: it expires a few
	// seconds after the Join.
	la := join("a", 3*time.Second)
	stop := lead("first")
	k := waitFor("a to hold every bucket, with a copy", func(k *store.KeyspaceState) bool {
		return len(k.Grants["a"].Value.Buckets) == 4 && k.Held["a"].Exists()
	})
	g := k.Grants["a"].Value
	if h := k.Held["a"]; h.Value.Session != la || h.Lease != 0 || len(h.Value.Buckets) != 4 {
		t.Fatalf("copy of a's grants: %+v (lease %v); want a's 4 buckets without a lease", h.Value, h.Lease)
	}
	c := shard.Commit{Session: la, MaxToken: g.Buckets[3].Token, Default: 70, Exceptions: []shard.BucketPosition{{Bucket: 2, Token: g.Buckets[2].Token, Position: 95}}}
	if _, err := st.CommitPositions(ctx, "ev", "a", la, c); err != nil {
		t.Fatal(err)
	}
	stop()

	join("b", 10*time.Second)
	k = waitFor("a's lease to expire", func(k *store.KeyspaceState) bool {
		_, member := k.Members["a"]
		_, grants := k.Grants["a"]
		return !member && !grants
	})
	if _, ok := k.Commits["a"]; !ok {
		t.Fatal("a's commit record went with its lease")
	}
	if _, ok := k.Held["a"]; !ok {
		t.Fatal("the copy of a's grants went with its lease")
	}

	stop = lead("second")
	defer stop()
	k = waitFor("b to hold every bucket", func(k *store.KeyspaceState) bool { return len(k.Grants["b"].Value.Buckets) == 4 })
	want := map[int]uint64{0: 70, 1: 70, 2: 95, 3: 70}
	got := map[int]uint64{}
	for _, bt := range k.Grants["b"].Value.Buckets {
		got[bt.Bucket] = bt.Position
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("b's grants' From (-want +got):\n%s", diff)
	}
	if _, ok := k.Commits["a"]; ok {
		t.Error("a's commit record outlived the fold")
	}
	if _, ok := k.Held["a"]; ok {
		t.Error("the copy of a's grants outlived the fold")
	}
	if h := k.Held["b"].Value; h.Session != k.Grants["b"].Value.Session || len(h.Buckets) != 4 {
		t.Errorf("copy of b's grants %+v; want its 4 buckets", h)
	}
}

// streamJoin joins member id to keyspace "ev" on a new lease of ttl and
// activates it, as Join and the first KeepAlive do.
func streamJoin(ctx context.Context, t *testing.T, st *store.Store, id string, ttl time.Duration) shard.LeaseID {
	t.Helper()
	lease, _, err := st.Grant(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Join(ctx, "ev", shard.Member{ID: id, Weight: 1, JoinedAt: time.Now()}, lease, false); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Activate(ctx, "ev", id, lease); err != nil {
		t.Fatal(err)
	}
	return lease
}

// waitKeyspace returns keyspace ks's state at the first revision at which
// cond holds, woken by the store's watch.
func waitKeyspace(ctx context.Context, t *testing.T, st *store.Store, ks, what string, cond func(*store.KeyspaceState) bool) *store.KeyspaceState {
	t.Helper()
	snap, err := st.LoadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	updates := st.Watch(wctx, snap.Rev+1)
	for {
		if k := snap.Keyspaces[ks]; k != nil && cond(k) {
			return k
		}
		select {
		case u, ok := <-updates:
			if !ok {
				t.Fatalf("watch ended waiting for %s", what)
			}
			if u.Resync != nil {
				snap = u.Resync.Snapshot
			}
			for _, c := range u.Changes {
				snap.Apply(c)
			}
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		}
	}
}

// TestLeadStreamCommitAfterReleaseEtcd: on embedded etcd, a releases the
// buckets that move to b without final positions, and, before the leader
// hands them over, commits a higher default over every bucket, twice
// (the second from the state the first left, as the session's commit
// writer does). The commits do not move the released buckets: b starts
// them at a's commit made before the release, and a's other buckets are
// at the new default.
func TestLeadStreamCommitAfterReleaseEtcd(t *testing.T) {
	s, st, ctx := streamOnEtcd(t)
	waitFor := func(what string, cond func(*store.KeyspaceState) bool) *store.KeyspaceState {
		return waitKeyspace(ctx, t, st, "ev", what, cond)
	}
	lead := func(name string) (stop func()) { return leadOnEtcd(ctx, t, s, st, st, name) }
	// commit writes c through the session's commit writer, from guess.
	sa := session{keyspace: "ev", member: "a"}
	commit := func(c shard.Commit, guess *store.CommitState) *store.CommitState {
		t.Helper()
		call := &commitCall{c: c, done: make(chan commitResult, 1)}
		after := s.writeBatch(sa, []*commitCall{call}, guess)
		if r := <-call.done; r.err != nil {
			t.Fatalf("commit %+v: %v", c, r.err)
		}
		return after
	}

	sa.lease = streamJoin(ctx, t, st, "a", 10*time.Second)
	stop := lead("first")
	k := waitFor("a to hold every bucket", func(k *store.KeyspaceState) bool { return len(k.Grants["a"].Value.Buckets) == 4 })
	g := k.Grants["a"].Value
	top := g.Buckets[3].Token
	commit(shard.Commit{Session: sa.lease, MaxToken: top, Default: 70}, nil)
	streamJoin(ctx, t, st, "b", 10*time.Second)
	k = waitFor("the map to move two buckets to b", func(k *store.KeyspaceState) bool { return k.Map.Value.Assignment.Counts()["b"] == 2 })
	stop() // the hand-over waits for the next leader
	var release []shard.BucketToken
	moved := map[int]bool{}
	for _, bt := range g.Buckets {
		if k.Map.Value.Assignment.Owner(bt.Bucket) == "b" {
			release = append(release, shard.BucketToken{Bucket: bt.Bucket, Token: bt.Token})
			moved[bt.Bucket] = true
		}
	}
	if _, err := st.Release(ctx, "ev", "a", sa.lease, release, nil); err != nil {
		t.Fatal(err)
	}
	after := commit(shard.Commit{Session: sa.lease, MaxToken: top, Default: 300}, nil)
	commit(shard.Commit{Session: sa.lease, MaxToken: top, Default: 500}, after)

	stop = lead("second")
	defer stop()
	k = waitFor("b to hold its two buckets", func(k *store.KeyspaceState) bool { return len(k.Grants["b"].Value.Buckets) == 2 })
	for _, bt := range k.Grants["b"].Value.Buckets {
		if !moved[bt.Bucket] || bt.Position != 70 {
			t.Errorf("b's grant of bucket %d starts at %d; want the released buckets %v at 70, a's commit before the release", bt.Bucket, bt.Position, moved)
		}
	}
	ga := k.Grants["a"].Value
	for i, p := range shard.Positions(ga, k.Commits["a"].Value, k.Positions()) {
		if b := ga.Buckets[i].Bucket; moved[b] || p != 500 {
			t.Errorf("a holds bucket %d at %d; want only the unmoved buckets, at 500", b, p)
		}
	}
}

// streamOnEtcd returns a detached server on an embedded etcd holding
// stream keyspace "ev" of 4 buckets, and a context bounding the test.
func streamOnEtcd(t *testing.T) (*Server, *store.Store, context.Context) {
	t.Helper()
	s := detached(t, clock.Real{})
	st := withStore(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	ks := shard.Keyspace{Name: "ev", Buckets: 4, Hash: placement.HashXXH64, Mode: shard.ModeStream, LeaseTTL: 10 * time.Second}
	if _, err := st.CreateKeyspace(ctx, ks); err != nil {
		t.Fatal(err)
	}
	return s, st, ctx
}

// leadOnEtcd runs s's leader loop on ls, elected as name on a new session
// of st, until the returned stop is called; stop resigns, so that the
// next one is elected at once.
func leadOnEtcd(ctx context.Context, t *testing.T, s *Server, st *store.Store, ls leaderStore, name string) (stop func()) {
	t.Helper()
	sess, err := st.NewSession(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	fence, err := st.NewElection(sess).Campaign(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.lead(lctx, ls, fence) }() // exits when stop is called
	return func() { cancel(); <-done; sess.Close() }
}

// commitsFirst is a leaderStore that lands one of the holder's commits
// right before each grant write that gives member to buckets: the commit
// a consumer that commits after every event makes while the leader plans.
type commitsFirst struct {
	leaderStore
	to     string
	commit func() // lands the holder's next commit
	armed  atomic.Bool
	landed atomic.Int32 // commits landed before a grant write
}

func (c *commitsFirst) Commit(ctx context.Context, f store.Fence, writes []store.Write, expects []store.Expect) (int64, error) {
	if c.armed.Load() && c.landed.Load() < 3 && slices.ContainsFunc(writes, func(w store.Write) bool {
		ch, err := w.Change(0)
		g, ok := ch.Value.(shard.Grants)
		return err == nil && ok && ch.ID == c.to && len(g.Buckets) > 0
	}) {
		c.commit()
		c.landed.Add(1)
	}
	return c.leaderStore.Commit(ctx, f, writes, expects)
}

// TestLeadStreamHandoffThroughCommitsEtcd: on embedded etcd, a releases
// the buckets that move to b without final positions and goes on
// committing: one of its commits lands between the leader's planning of
// every grant round and its write. The first round that hands the
// buckets over still lands (it does not expect a's commit record, which
// the commits change), and b starts them at a's commit before the
// release, which the later commits do not move.
func TestLeadStreamHandoffThroughCommitsEtcd(t *testing.T) {
	s, st, ctx := streamOnEtcd(t)
	waitFor := func(what string, cond func(*store.KeyspaceState) bool) *store.KeyspaceState {
		return waitKeyspace(ctx, t, st, "ev", what, cond)
	}
	la := streamJoin(ctx, t, st, "a", 10*time.Second)
	var top uint64
	def := uint64(70)
	commit := func() {
		if _, err := st.CommitPositions(ctx, "ev", "a", la, shard.Commit{Session: la, MaxToken: top, Default: def}); err != nil {
			t.Errorf("a's commit at %d: %v", def, err)
		}
		def += 50
	}
	ls := &commitsFirst{leaderStore: st, to: "b", commit: commit}
	defer leadOnEtcd(ctx, t, s, st, ls, "leader")()

	k := waitFor("a to hold every bucket", func(k *store.KeyspaceState) bool { return len(k.Grants["a"].Value.Buckets) == 4 })
	g := k.Grants["a"].Value
	top = g.Buckets[3].Token
	commit() // at 70
	streamJoin(ctx, t, st, "b", 10*time.Second)
	k = waitFor("the map to move two buckets to b", func(k *store.KeyspaceState) bool { return k.Map.Value.Assignment.Counts()["b"] == 2 })
	var release []shard.BucketToken
	for _, bt := range g.Buckets {
		if k.Map.Value.Assignment.Owner(bt.Bucket) == "b" {
			release = append(release, shard.BucketToken{Bucket: bt.Bucket, Token: bt.Token})
		}
	}
	ls.armed.Store(true)
	if _, err := st.Release(ctx, "ev", "a", la, release, nil); err != nil {
		t.Fatal(err)
	}
	k = waitFor("b to hold its two buckets", func(k *store.KeyspaceState) bool { return len(k.Grants["b"].Value.Buckets) == 2 })
	if n := ls.landed.Load(); n != 1 {
		t.Errorf("b was granted its buckets after %d of a's commits, each landing before a grant write; want after the first: the round conflicted with a's commits", n)
	}
	for _, bt := range k.Grants["b"].Value.Buckets {
		if bt.Position != 70 {
			t.Errorf("b's grant of bucket %d starts at %d; want 70, a's commit before the release", bt.Bucket, bt.Position)
		}
	}
}
