package server_test

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/internal/server"
	"github.com/keyshard/keyshard/internal/store"
)

// TestDashboardReads runs two replicas on one etcd. Members join, one is
// drained, one leaves, one crashes (stops keeping its session alive); the
// replica that does not lead answers, with a member token, the map history
// with each of those reasons, the buckets (runs covering each bucket
// once), the hot-key reports, and a Status with both replicas, the leader
// marked, and the store's health.
func TestDashboardReads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cluster, err := store.StartEmbeddedCluster(ctx, t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close) // after the replicas stop: cleanups run last-in first-out
	eps := cluster.Endpoints()
	r1 := startServer(t, func(c *server.Config) { c.Etcd.Endpoints = eps; c.Replica = "r1" })
	r2 := startServer(t, func(c *server.Config) { c.Etcd.Endpoints = eps; c.Replica = "r2" })
	if err := r1.WaitLeading(ctx); err != nil {
		// r2 may lead instead: either way one of them does.
		t.Logf("r1 does not lead: %v", err)
	}
	if _, err := r1.admin.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "rooms", Buckets: 64, LeaseTtl: durationpb.New(4 * time.Second)}})); err != nil {
		t.Fatal(err)
	}
	var st *connect.Response[v1.StatusResponse]
	for st == nil || st.Msg.Leader == "" {
		if st, err = r1.admin.Status(ctx, connect.NewRequest(&v1.StatusRequest{})); err != nil || ctx.Err() != nil {
			t.Fatalf("status: %v %v", err, ctx.Err())
		}
	}
	other := r2
	if st.Msg.Leader == "r2" {
		other = r1
	}
	otherID := map[*testServer]string{r1: "r1", r2: "r2"}[other]
	// Reads go to the replica that does not lead, with a member token.
	reader := keyshardv1connect.NewAdminServiceClient(http.DefaultClient, other.url, connect.WithInterceptors(bearer(memberToken)))

	a := joinMember(t, r1, "rooms", "a", r2)
	waitConverged(t, ctx, other, "rooms", 1)
	b := joinMember(t, r1, "rooms", "b", r2)
	waitConverged(t, ctx, other, "rooms", 2)
	joinMember(t, r2, "rooms", "c", r1)
	waitConverged(t, ctx, other, "rooms", 3)
	d := joinMember(t, r2, "rooms", "d", r1)
	waitConverged(t, ctx, other, "rooms", 4)
	_ = a

	// Drain c (admin only: the member token is refused).
	_, err = reader.DrainMember(ctx, connect.NewRequest(&v1.DrainMemberRequest{Keyspace: "rooms", Member: "c"}))
	wantCode(t, err, connect.CodePermissionDenied, "needs an admin token")
	if _, err := r1.admin.DrainMember(ctx, connect.NewRequest(&v1.DrainMemberRequest{Keyspace: "rooms", Member: "c"})); err != nil {
		t.Fatal(err)
	}
	waitHistory(t, ctx, other, reader, v1.MoveReason_MOVE_REASON_DRAIN, "c")
	waitConverged(t, ctx, other, "rooms", 4)
	// b leaves: its buckets move while it is still joined.
	if _, err := b.ts.member.Leave(ctx, connect.NewRequest(&v1.LeaveRequest{Session: b.sess})); err != nil {
		t.Fatal(err)
	}
	waitHistory(t, ctx, other, reader, v1.MoveReason_MOVE_REASON_LEAVE, "b")
	waitConverged(t, ctx, other, "rooms", 3) // b's session ends once it released everything
	// d crashes: its keep-alives stop and its lease expires.
	d.stop()
	<-d.done
	h := waitHistory(t, ctx, other, reader, v1.MoveReason_MOVE_REASON_CRASH, "d")
	waitConverged(t, ctx, other, "rooms", 2)

	for _, id := range []string{"a", "b", "c", "d"} {
		if !slices.ContainsFunc(h, func(c *v1.EpochChange) bool {
			// A member already joined when the first map was written is
			// named by the create.
			return (c.Reason == v1.MoveReason_MOVE_REASON_JOIN || c.Reason == v1.MoveReason_MOVE_REASON_CREATE) && slices.Contains(c.Members, id)
		}) {
			t.Errorf("no join or create naming %s in the history", id)
		}
	}
	if last := h[len(h)-1]; last.Epoch != 1 || last.Reason != v1.MoveReason_MOVE_REASON_CREATE {
		t.Errorf("oldest change = %v, want the create of epoch 1", last)
	}
	for i, c := range h {
		if i > 0 && c.Epoch >= h[i-1].Epoch {
			t.Errorf("history not newest first: epoch %d after %d", c.Epoch, h[i-1].Epoch)
		}
		var sum uint32
		for _, m := range c.Moves {
			sum += m.Buckets
		}
		if sum != c.MovedBuckets || c.Time == nil || c.Detail == "" {
			t.Errorf("epoch %d: moves sum to %d of %d moved, time %v, detail %q", c.Epoch, sum, c.MovedBuckets, c.Time, c.Detail)
		}
		t.Logf("epoch %d %v %v moved %d %v: %s", c.Epoch, c.Reason, c.Members, c.MovedBuckets, c.Moves, c.Detail)
	}
	lim, err := reader.GetKeyspaceHistory(ctx, connect.NewRequest(&v1.GetKeyspaceHistoryRequest{Keyspace: "rooms", Limit: 2}))
	if err != nil || len(lim.Msg.Changes) != 2 || lim.Msg.Changes[0].Epoch != h[0].Epoch {
		t.Fatalf("history limit 2: %v %v", lim, err)
	}
	_, err = reader.GetKeyspaceHistory(ctx, connect.NewRequest(&v1.GetKeyspaceHistoryRequest{Keyspace: "rooms", Limit: 501}))
	wantCode(t, err, connect.CodeInvalidArgument, "limit: 501")

	// Buckets: every bucket in exactly one run; converged, so all granted
	// to a (c is drained).
	bk, err := reader.GetBuckets(ctx, connect.NewRequest(&v1.GetBucketsRequest{Keyspace: "rooms"}))
	if err != nil {
		t.Fatal(err)
	}
	checkRuns(t, bk.Msg)
	if !slices.Equal(bk.Msg.Members, []string{"a"}) || bk.Msg.Stream || bk.Msg.Epoch != h[0].Epoch {
		t.Errorf("buckets: %v", bk.Msg)
	}
	for _, run := range bk.Msg.Runs {
		if run.Owner != 1 || run.Holder != 1 || run.Token == 0 || run.State != v1.BucketState_BUCKET_STATE_GRANTED {
			t.Errorf("run %v, want granted to a", run)
		}
	}

	// Status from the replica that does not lead.
	st, err = reader.Status(ctx, connect.NewRequest(&v1.StatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if st.Msg.Replica != otherID || st.Msg.Leader == otherID {
		t.Fatalf("status answered by %s, leader %s; want the other replica", st.Msg.Replica, st.Msg.Leader)
	}
	var ids []string
	for _, r := range st.Msg.Replicas {
		ids = append(ids, r.Id)
		if r.Leader != (r.Id == st.Msg.Leader) || r.Url == "" {
			t.Errorf("replica %v (leader %s)", r, st.Msg.Leader)
		}
	}
	if !slices.Equal(ids, []string{"r1", "r2"}) {
		t.Errorf("replicas %v, want r1 r2", ids)
	}
	if s := st.Msg.Store; s == nil || !s.Healthy || s.Error != "" || len(s.Endpoints) == 0 || s.Revision <= 0 || s.DbSizeBytes <= 0 || s.Latency == nil {
		t.Errorf("store health: %v", s)
	}
	if ks := st.Msg.Keyspaces[0]; ks.DrainingMembers != 1 || ks.ReleasingBuckets != 0 {
		t.Errorf("keyspace status: %v", ks)
	}
	ms, err := reader.ListMembers(ctx, connect.NewRequest(&v1.ListMembersRequest{Keyspace: "rooms", LeaseLeft: true}))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms.Msg.Members {
		if left := m.LeaseLeft.AsDuration(); m.LeaseLeft == nil || left <= 0 || left > 4*time.Second {
			t.Errorf("member %s lease_left %v", m.Member.Id, m.LeaseLeft)
		}
	}

	// Hot-key reports, stored through the leader's replica or not, read
	// from the other one.
	if _, err := r1.admin.PutHotKeyPool(ctx, connect.NewRequest(&v1.PutHotKeyPoolRequest{Pool: &v1.HotKeyPool{Name: "stops", Threshold: 100}})); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"p2", "p1"} {
		if _, err := r1.hot.ReportHotKeys(ctx, connect.NewRequest(&v1.ReportHotKeysRequest{Pool: "stops", Producer: p, Keys: []*v1.KeyRate{{Key: "x", Rate: 10}, {Key: "y", Rate: 50}}})); err != nil {
			t.Fatal(err)
		}
	}
	for {
		rep, err := reader.GetHotKeyReports(ctx, connect.NewRequest(&v1.GetHotKeyReportsRequest{Pool: "stops"}))
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Msg.Reports) == 2 {
			r := rep.Msg.Reports
			if r[0].Producer != "p1" || r[1].Producer != "p2" || r[0].Keys[0].Key != "y" || r[0].Keys[1].Rate != 10 || r[0].Time == nil {
				t.Fatalf("reports: %v", r)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("reports: %v", rep.Msg)
		}
		other.maps.GetMap(ctx, connect.NewRequest(&v1.GetMapRequest{Keyspace: "rooms", SinceEpoch: 1 << 62, Wait: durationpb.New(100 * time.Millisecond)}))
	}
}

// waitHistory polls ts's map history until an epoch of reason caused by
// member is in it, waiting for the next map epoch (at most a second)
// between polls, and returns the history.
func waitHistory(t *testing.T, ctx context.Context, ts *testServer, reader keyshardv1connect.AdminServiceClient, reason v1.MoveReason, member string) []*v1.EpochChange {
	t.Helper()
	for {
		h, err := reader.GetKeyspaceHistory(ctx, connect.NewRequest(&v1.GetKeyspaceHistoryRequest{Keyspace: "rooms"}))
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(h.Msg.Changes, func(c *v1.EpochChange) bool { return c.Reason == reason && slices.Equal(c.Members, []string{member}) }) {
			return h.Msg.Changes
		}
		if ctx.Err() != nil {
			t.Fatalf("no %v of %s in the history: %v", reason, member, h.Msg.Changes)
		}
		ts.maps.GetMap(ctx, connect.NewRequest(&v1.GetMapRequest{Keyspace: "rooms", SinceEpoch: 1 << 62, Wait: durationpb.New(time.Second)}))
	}
}

// checkRuns checks that the runs cover every bucket exactly once, in
// order, and name members that exist.
func checkRuns(t *testing.T, r *v1.GetBucketsResponse) {
	t.Helper()
	next := uint32(0)
	for _, run := range r.Runs {
		if run.First != next || run.Count == 0 {
			t.Fatalf("run %v after bucket %d", run, next)
		}
		if int(run.Owner) > len(r.Members) || int(run.Holder) > len(r.Members) {
			t.Fatalf("run %v names a member beyond %v", run, r.Members)
		}
		next += run.Count
	}
	if next != r.Buckets {
		t.Fatalf("runs cover %d of %d buckets", next, r.Buckets)
	}
}
