package server_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/internal/server"
)

// TestSDKInspect reads the control plane through the Go SDK's Admin, with
// a member token: the map's history (two joins and a drain, newest first),
// every bucket in runs, Status's store health, replicas and draining
// count, and the members' lease time left.
func TestSDKInspect(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ts := startServer(t, func(c *server.Config) {
		c.Replica = "r1"
		c.Keyspaces = []server.KeyspaceConfig{{Name: "rooms", Buckets: 64, LeaseTTL: 4 * time.Second}}
	})
	dial := func(token string) *client.Client {
		c, err := client.Dial(ts.url, client.Token(token))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	member, admin := dial(memberToken), dial(adminToken)
	log := newGrantLog(t)
	startWorker(t, member, log, "w1")
	log.waitHeld(ctx, 64, "w1")
	startWorker(t, member, log, "w2")
	log.waitHeld(ctx, 64, "w1", "w2")
	if err := admin.Admin().DrainMember(ctx, "rooms", "w1"); err != nil {
		t.Fatal(err)
	}
	log.waitHeld(ctx, 64, "w2")
	adm := member.Admin() // reads take a member token

	hist, err := adm.History(ctx, "rooms", 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range hist {
		if i > 0 && c.Epoch >= hist[i-1].Epoch {
			t.Errorf("history not newest first: epoch %d after %d", c.Epoch, hist[i-1].Epoch)
		}
		moved := 0
		for _, m := range c.Moves {
			moved += m.Buckets
		}
		if moved != c.MovedBuckets {
			t.Errorf("epoch %d: moves sum to %d, moved %d", c.Epoch, moved, c.MovedBuckets)
		}
	}
	find := func(r client.MoveReason, m string) int {
		return slices.IndexFunc(hist, func(c client.EpochChange) bool {
			return c.Reason == r && (m == "" || slices.Equal(c.Members, []string{m}))
		})
	}
	drain, join2, join1, create := find(client.ReasonDrain, "w1"), find(client.ReasonJoin, "w2"), find(client.ReasonJoin, "w1"), len(hist)-1
	if join1 < 0 && len(hist[create].Members) > 0 {
		// w1 joined before the first map: the create names it.
		join1 = find(client.ReasonCreate, "w1")
	}
	if drain != 0 || join2 <= drain || join1 <= join2 || hist[create].Reason != client.ReasonCreate || hist[create].Epoch != 1 {
		t.Errorf("history %+v: want the drain of w1 first, then the joins of w2 and w1, and create at epoch 1", hist)
	}
	if d := hist[0]; d.MovedBuckets == 0 || d.Moves[0].From != "w1" || d.Moves[0].To != "w2" {
		t.Errorf("the drain moved %d buckets: %+v", d.MovedBuckets, d.Moves)
	}
	if _, err := adm.History(ctx, "rooms", client.MaxHistory+1); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("History with limit %d: %v; want ErrInvalid", client.MaxHistory+1, err)
	}
	if _, err := adm.History(ctx, "nope", 0); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("History of an unknown keyspace: %v; want ErrNotFound", err)
	}

	// Every bucket held by w2 (the grant log saw them acquired: the
	// grants are stored), in runs that cover 0..63 once.
	bs, err := adm.Buckets(ctx, "rooms")
	if err != nil {
		t.Fatal(err)
	}
	next := 0
	for _, r := range bs.Runs {
		if r.First != next || r.Count <= 0 {
			t.Fatalf("run %+v after bucket %d", r, next)
		}
		next += r.Count
	}
	if next != 64 || bs.Buckets != 64 || bs.Stream || !allGranted(bs, "w2") {
		t.Errorf("buckets %+v: want 64, all granted to w2 with a token", bs)
	}

	st, err := adm.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Store.Healthy || st.Store.Revision <= 0 || st.Store.DBSizeBytes <= 0 || len(st.Store.Endpoints) == 0 {
		t.Errorf("store health %+v", st.Store)
	}
	if len(st.Replicas) != 1 || st.Replicas[0].ID != "r1" || !st.Replicas[0].Leader {
		t.Errorf("replicas %+v; want r1, leading", st.Replicas)
	}
	if k := st.Keyspaces[0]; k.DrainingMembers != 1 || k.ReleasingBuckets != 0 {
		t.Errorf("keyspace status %+v; want 1 draining member (w1), nothing releasing", k)
	}
	ms, err := adm.ListMembers(ctx, "rooms", client.WithLeaseLeft())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms.Members {
		if m.LeaseLeft <= 0 || m.LeaseLeft > 4*time.Second {
			t.Errorf("%s: lease left %v; want in (0, 4s]", m.ID, m.LeaseLeft)
		}
	}
	// Without WithLeaseLeft, no lease is read.
	if ms, err = adm.ListMembers(ctx, "rooms"); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms.Members {
		if m.LeaseLeft != 0 {
			t.Errorf("%s: lease left %v without WithLeaseLeft; want none read", m.ID, m.LeaseLeft)
		}
	}
	if _, err := adm.HotKeyReports(ctx, "nope"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("HotKeyReports of an unknown pool: %v; want ErrNotFound", err)
	}
}

func allGranted(bs client.Buckets, holder string) bool {
	for _, r := range bs.Runs {
		if r.State != client.BucketGranted || r.Owner != holder || r.Holder != holder || r.Token == 0 {
			return false
		}
	}
	return len(bs.Runs) > 0
}
