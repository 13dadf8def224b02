package server

import (
	"context"
	"testing"
	"time"

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
	s := detached(t, clock.Real{})
	st := withStore(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ks := shard.Keyspace{Name: "ev", Buckets: 4, Hash: placement.HashXXH64, Mode: shard.ModeStream, LeaseTTL: 10 * time.Second}
	if _, err := st.CreateKeyspace(ctx, ks); err != nil {
		t.Fatal(err)
	}
	join := func(id string) shard.LeaseID {
		t.Helper()
		lease, _, err := st.Grant(ctx, 10*time.Second)
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
	// waitFor returns the first snapshot at which cond holds, woken by
	// the store's watch.
	waitFor := func(what string, cond func(*store.KeyspaceState) bool) *store.KeyspaceState {
		t.Helper()
		snap, err := st.LoadAll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		updates := st.Watch(wctx, snap.Rev+1)
		for {
			if k := snap.Keyspaces["ev"]; k != nil && cond(k) {
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
	holds := func(id string, n int) func(*store.KeyspaceState) bool {
		return func(k *store.KeyspaceState) bool { return len(k.Grants[id].Value.Buckets) == n }
	}

	la := join("a")
	sess, err := st.NewSession(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	fence, err := st.NewElection(sess).Campaign(ctx, "leader")
	if err != nil {
		t.Fatal(err)
	}
	lctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.lead(lctx, st, fence) }() // exits when stop is called
	defer func() { stop(); <-done }()

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
