package server_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/internal/server"
	"github.com/keyshard/keyshard/internal/store"
)

// member is a raw API member for these tests: it joins, keeps its session
// alive from a goroutine, and releases whatever it is asked to release.
type member struct {
	t    *testing.T
	ts   *testServer   // the replica in use
	all  []*testServer // replicas to fail over to
	sess string
	stop context.CancelFunc
	done chan struct{}
}

func joinMember(t *testing.T, ts *testServer, ks, id string, failover ...*testServer) *member {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r, err := ts.member.Join(ctx, connect.NewRequest(&v1.JoinRequest{Keyspace: ks, Member: &v1.Member{Id: id}}))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	// The first keep-alive activates the session (a pending member is
	// given no bucket, and Status does not count it as waiting for a map):
	// the member is active in ts's view once joinMember returns.
	if _, err := ts.member.KeepAlive(ctx, connect.NewRequest(&v1.KeepAliveRequest{Session: r.Msg.Session})); err != nil {
		cancel()
		t.Fatal(err)
	}
	m := &member{t: t, ts: ts, all: append([]*testServer{ts}, failover...), sess: r.Msg.Session, stop: cancel, done: make(chan struct{})}
	go m.run(ctx) // exits when m.stop is called
	t.Cleanup(func() { m.stop(); <-m.done })
	return m
}

// run keeps the session alive and releases what the server asks, using
// long polls (each bounded by 1 s so keep-alives go out in time).
func (m *member) run(ctx context.Context) {
	defer close(m.done)
	var since uint64
	for next := 0; ctx.Err() == nil; {
		if _, err := m.ts.member.KeepAlive(ctx, connect.NewRequest(&v1.KeepAliveRequest{Session: m.sess})); err != nil {
			if ctx.Err() == nil && connect.CodeOf(err) == connect.CodeNotFound {
				return
			}
			// The replica may be gone: the session is valid on any other.
			next = (next + 1) % len(m.all)
			m.ts = m.all[next]
			continue
		}
		r, err := m.ts.member.GetGrants(ctx, connect.NewRequest(&v1.GetGrantsRequest{Session: m.sess, SinceRevision: since, Wait: durationpb.New(time.Second)}))
		if err != nil {
			continue
		}
		since = r.Msg.Revision
		var rel []*v1.BucketGrant
		for _, g := range r.Msg.Grants {
			for _, b := range r.Msg.Release {
				if g.Bucket == b {
					rel = append(rel, g)
				}
			}
		}
		if len(rel) > 0 {
			m.ts.member.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{Session: m.sess, Buckets: rel}))
		}
	}
}

// waitConverged long-polls the map and Status through ts until every
// bucket is granted to its target and n members are joined, each given
// buckets by the map (when there are buckets enough): a join the leader
// holds back for the rebalance gap is not converged yet.
func waitConverged(t *testing.T, ctx context.Context, ts *testServer, ks string, n int) {
	t.Helper()
	for {
		st, err := ts.admin.Status(ctx, connect.NewRequest(&v1.StatusRequest{}))
		if err == nil {
			for _, k := range st.Msg.Keyspaces {
				if k.Keyspace.Name == ks && k.Members == uint32(n) && k.HandoffsInFlight == 0 && k.UnassignedBuckets == 0 && k.Epoch > 0 &&
					(k.MembersWithoutBuckets == 0 || k.Members > k.Keyspace.Buckets) {
					return
				}
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("not converged: %v %v", st, err)
		}
		if err != nil {
			t.Logf("status: %v", err)
		} else {
			t.Logf("status: %v", st.Msg)
		}
		// Wait for the next map epoch, at most a second: members and handoffs
		// change without a new epoch.
		ts.maps.GetMap(ctx, connect.NewRequest(&v1.GetMapRequest{Keyspace: ks, SinceEpoch: 1 << 62, Wait: durationpb.New(time.Second)}))
	}
}

// TestReplicasAndEtcdCluster runs two serve replicas against a 3-member
// etcd cluster: members join through either replica; the leader replica
// stops (another takes over); then one etcd member stops. Buckets keep
// being granted throughout.
func TestReplicasAndEtcdCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cluster, err := store.StartEmbeddedCluster(ctx, t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close) // after the replicas stop: cleanups run last-in first-out
	eps := cluster.Endpoints()
	r1 := startServer(t, func(c *server.Config) { c.Etcd.Endpoints = eps; c.Replica = "r1" })
	r2 := startServer(t, func(c *server.Config) { c.Etcd.Endpoints = eps; c.Replica = "r2" })

	if _, err := r1.admin.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "rooms", Buckets: 64, LeaseTtl: durationpb.New(6 * time.Second)}})); err != nil {
		t.Fatal(err)
	}
	joinMember(t, r1, "rooms", "a", r2)
	joinMember(t, r2, "rooms", "b", r1)
	waitConverged(t, ctx, r2, "rooms", 2)

	st, err := r2.admin.Status(ctx, connect.NewRequest(&v1.StatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	leader, other := r1, r2
	if st.Msg.Leader == "r2" {
		leader, other = r2, r1
	}
	leader.Stop()
	joinMember(t, other, "rooms", "c")
	waitConverged(t, ctx, other, "rooms", 3)
	if st, _ := other.admin.Status(ctx, connect.NewRequest(&v1.StatusRequest{})); st.Msg.Leader != st.Msg.Replica {
		t.Fatalf("replica %s answered but %q leads", st.Msg.Replica, st.Msg.Leader)
	}

	// One etcd member goes away: the remaining two keep a quorum.
	for i := range cluster.Len() {
		if cluster.Member(i).IsLeader() {
			cluster.Stop(i)
			break
		}
	}
	joinMember(t, other, "rooms", "d")
	waitConverged(t, ctx, other, "rooms", 4)
}

// TestRestartFromDataDir stops a replica with an embedded etcd and starts
// it again on the same data directory: the keyspace and its map survive.
func TestRestartFromDataDir(t *testing.T) {
	ctx := ctxT(t)
	ts := startServer(t, nil)
	if _, err := ts.admin.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "rooms", Buckets: 16}})); err != nil {
		t.Fatal(err)
	}
	m := joinMember(t, ts, "rooms", "a")
	waitConverged(t, ctx, ts, "rooms", 1)
	epoch, err := ts.maps.GetMap(ctx, connect.NewRequest(&v1.GetMapRequest{Keyspace: "rooms"}))
	if err != nil {
		t.Fatal(err)
	}
	m.stop()
	<-m.done

	ts.Restart()
	k, err := ts.admin.GetKeyspace(ctx, connect.NewRequest(&v1.GetKeyspaceRequest{Name: "rooms"}))
	if err != nil || k.Msg.Keyspace.Buckets != 16 {
		t.Fatalf("keyspace after restart: %v %v", k, err)
	}
	again, err := ts.maps.GetMap(ctx, connect.NewRequest(&v1.GetMapRequest{Keyspace: "rooms"}))
	if err != nil || again.Msg.Map.Epoch < epoch.Msg.Map.Epoch {
		t.Fatalf("map after restart: epoch %v, before %d (%v)", again.Msg.GetMap().GetEpoch(), epoch.Msg.Map.Epoch, err)
	}
}
