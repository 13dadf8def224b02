package server_test

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/internal/server"
	"github.com/keyshard/keyshard/internal/store"
)

// rawJoin joins without keeping the session alive: it stays pending until
// the caller's first KeepAlive.
func rawJoin(t *testing.T, ctx context.Context, ts *testServer, ks, id string, replace bool) string {
	t.Helper()
	r, err := ts.member.Join(ctx, connect.NewRequest(&v1.JoinRequest{Keyspace: ks, Member: &v1.Member{Id: id}, Replace: replace}))
	if err != nil {
		t.Fatal(err)
	}
	return r.Msg.Session
}

func keepAlive(t *testing.T, ctx context.Context, ts *testServer, sess string) {
	t.Helper()
	if _, err := ts.member.KeepAlive(ctx, connect.NewRequest(&v1.KeepAliveRequest{Session: sess})); err != nil {
		t.Fatal(err)
	}
}

// keepAliveUntilCleanup keeps sessions alive, every second as a worker
// would at a TTL of 3 s, until the test ends: a test whose steps may take
// longer than the lease TTL on a busy machine (several -race tests at
// once on two cores) must not lose its members to the clock.
func keepAliveUntilCleanup(t *testing.T, ctx context.Context, ts *testServer, sessions ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { // exits at the test's cleanup
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for _, sess := range sessions {
				if _, err := ts.member.KeepAlive(ctx, connect.NewRequest(&v1.KeepAliveRequest{Session: sess})); err != nil && ctx.Err() == nil {
					t.Errorf("keep-alive of %s: %v", sess, err)
					return
				}
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// pollGrants long-polls sess's grants through ts until cond holds; every
// answer on the way is passed to check first.
func pollGrants(t *testing.T, ctx context.Context, ts *testServer, sess string, minRev uint64, check, cond func(*v1.GetGrantsResponse) bool) *v1.GetGrantsResponse {
	t.Helper()
	var since uint64
	for {
		r, err := ts.member.GetGrants(ctx, connect.NewRequest(&v1.GetGrantsRequest{Session: sess, SinceRevision: since, MinRevision: minRev, Wait: durationpb.New(time.Second)}))
		if err != nil {
			t.Fatal(err)
		}
		if check != nil && !check(r.Msg) {
			t.Fatalf("answer %v", r.Msg)
		}
		if cond(r.Msg) {
			return r.Msg
		}
		since = r.Msg.Revision
	}
}

// mapOwners long-polls the map until cond holds on its bucket counts per
// member.
func mapOwners(t *testing.T, ctx context.Context, ts *testServer, ks string, cond func(map[string]int) bool) map[string]int {
	t.Helper()
	var since uint64
	for {
		r, err := ts.maps.GetMap(ctx, connect.NewRequest(&v1.GetMapRequest{Keyspace: ks, SinceEpoch: since, Wait: durationpb.New(time.Second)}))
		if err != nil {
			t.Fatal(err)
		}
		counts := map[string]int{}
		for _, o := range r.Msg.Map.Owners {
			if o > 0 {
				counts[r.Msg.Map.Members[o-1].Id]++
			}
		}
		if cond(counts) {
			return counts
		}
		since = r.Msg.Map.Epoch
	}
}

// lists reports whether r lists any of the released buckets at the token
// it was released at (release only names buckets of grants).
func lists(r *v1.GetGrantsResponse, released map[uint32]uint64) bool {
	for _, g := range r.Grants {
		if t, ok := released[g.Bucket]; ok && t == g.Token {
			return true
		}
	}
	return false
}

// TestPendingMemberGetsNoBuckets: a session that never kept alive (a Join
// that arrived late, from a process that is gone) takes no bucket from
// anyone; once it keeps alive, it gets its share.
func TestPendingMemberGetsNoBuckets(t *testing.T) {
	ts := startServer(t, nil)
	ctx := ctxT(t)
	if _, err := ts.admin.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "rooms", Buckets: 8}})); err != nil {
		t.Fatal(err)
	}
	joinMember(t, ts, "rooms", "a")
	mapOwners(t, ctx, ts, "rooms", func(c map[string]int) bool { return c["a"] == 8 })
	zombie := rawJoin(t, ctx, ts, "rooms", "zombie", false)
	// d joins after the zombie: once the map gives d its share, the leader
	// has planned with the zombie's record in view.
	joinMember(t, ts, "rooms", "d")
	counts := mapOwners(t, ctx, ts, "rooms", func(c map[string]int) bool { return c["d"] > 0 })
	if counts["zombie"] != 0 || counts["a"]+counts["d"] != 8 {
		t.Fatalf("map %v: buckets assigned to a session that never kept alive", counts)
	}
	r, err := ts.member.GetGrants(ctx, connect.NewRequest(&v1.GetGrantsRequest{Session: zombie}))
	if err != nil || len(r.Msg.Grants) != 0 {
		t.Fatalf("zombie grants %v, %v; want none", r, err)
	}
	// Its first keep-alive activates it.
	keepAlive(t, ctx, ts, zombie)
	mapOwners(t, ctx, ts, "rooms", func(c map[string]int) bool { return c["zombie"] > 0 })
	pollGrants(t, ctx, ts, zombie, 0, nil, func(r *v1.GetGrantsResponse) bool {
		keepAlive(t, ctx, ts, zombie)
		return len(r.Grants) > 0
	})
}

// TestReleaseEdgeCases: what Release does with bad input, with a bucket it
// was not asked to release, and when retried after the hand-over.
func TestReleaseEdgeCases(t *testing.T) {
	ts := startServer(t, nil)
	ctx := ctxT(t)
	if _, err := ts.admin.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "rooms", Buckets: 4}})); err != nil {
		t.Fatal(err)
	}
	a := rawJoin(t, ctx, ts, "rooms", "a", false)
	keepAlive(t, ctx, ts, a)
	held := pollGrants(t, ctx, ts, a, 0, nil, func(r *v1.GetGrantsResponse) bool { return len(r.Grants) == 4 })
	g0 := held.Grants[0]
	release := func(bs ...*v1.BucketGrant) (*v1.ReleaseResponse, error) {
		r, err := ts.member.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{Session: a, Buckets: bs}))
		if err != nil {
			return nil, err
		}
		return r.Msg, nil
	}
	_, err := release(&v1.BucketGrant{Bucket: 4, Token: g0.Token})
	wantCode(t, err, connect.CodeInvalidArgument, `buckets[0].bucket: 4 is out of range: keyspace "rooms" has buckets 0-3`)
	_, err = release(g0, held.Grants[1], g0)
	wantCode(t, err, connect.CodeInvalidArgument, "buckets[0] and buckets[2] both name bucket")
	_, err = release()
	wantCode(t, err, connect.CodeInvalidArgument, "buckets: empty")
	_, err = release(held.Grants[1], &v1.BucketGrant{Bucket: g0.Bucket, Token: g0.Token + 100})
	wantCode(t, err, connect.CodeInvalidArgument, "buckets[1]: bucket")
	wantCode(t, err, connect.CodeInvalidArgument, "is held at token")

	// Nothing was released by the refused calls.
	r, err := ts.member.GetGrants(ctx, connect.NewRequest(&v1.GetGrantsRequest{Session: a}))
	if err != nil || len(r.Msg.Grants) != 4 {
		t.Fatalf("after refused releases: %v %v; want all 4 still held", r, err)
	}

	// Released without being asked: given up at once, granted back at a
	// higher token.
	rr, err := release(g0)
	if err != nil || rr.Revision == 0 {
		t.Fatalf("release of a bucket not asked for: %v, %v", rr, err)
	}
	back := pollGrants(t, ctx, ts, a, rr.Revision,
		func(r *v1.GetGrantsResponse) bool { return !lists(r, map[uint32]uint64{g0.Bucket: g0.Token}) },
		func(r *v1.GetGrantsResponse) bool { return len(r.Grants) == 4 })
	for _, g := range back.Grants {
		if g.Bucket == g0.Bucket && g.Token <= g0.Token {
			t.Fatalf("bucket %d granted back at token %d, not above %d", g.Bucket, g.Token, g0.Token)
		}
	}
	// A retry after the hand-over is refused as not held, with the hint.
	_, err = release(g0)
	wantCode(t, err, connect.CodeInvalidArgument, "treat it as released")
}

// TestReleaseReadYourWritesAcrossReplicas: once Release answered through
// one replica, no answer through either replica lists the released
// buckets at their tokens, while other map changes race the hand-over.
func TestReleaseReadYourWritesAcrossReplicas(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cluster, err := store.StartEmbeddedCluster(ctx, t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	eps := cluster.Endpoints()
	r1 := startServer(t, func(c *server.Config) { c.Etcd.Endpoints = eps; c.Replica = "r1" })
	r2 := startServer(t, func(c *server.Config) { c.Etcd.Endpoints = eps; c.Replica = "r2" })
	if _, err := r1.admin.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "rooms", Buckets: 16}})); err != nil {
		t.Fatal(err)
	}
	a := rawJoin(t, ctx, r1, "rooms", "a", false)
	keepAlive(t, ctx, r1, a)
	pollGrants(t, ctx, r1, a, 0, nil, func(r *v1.GetGrantsResponse) bool { return len(r.Grants) == 16 })
	joinMember(t, r2, "rooms", "b", r1)
	asked := pollGrants(t, ctx, r1, a, 0, nil, func(r *v1.GetGrantsResponse) bool { return len(r.Release) > 0 })

	released := map[uint32]uint64{}
	var rel []*v1.BucketGrant
	for _, g := range asked.Grants {
		if slices.Contains(asked.Release, g.Bucket) {
			rel = append(rel, g)
			released[g.Bucket] = g.Token
		}
	}
	// Another map change races the hand-over.
	joinMember(t, r2, "rooms", "c", r1)
	rr, err := r1.member.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{Session: a, Buckets: rel}))
	if err != nil {
		t.Fatal(err)
	}
	notListed := func(r *v1.GetGrantsResponse) bool { return !lists(r, released) }
	// Through the other replica, with the release's revision...
	if r, err := r2.member.GetGrants(ctx, connect.NewRequest(&v1.GetGrantsRequest{Session: a, MinRevision: rr.Msg.Revision})); err != nil || !notListed(r.Msg) {
		t.Fatalf("GetGrants through r2 after the release at revision %d: %v %v", rr.Msg.Revision, r, err)
	}
	watcher := keyshardv1connect.NewMemberServiceClient(http.DefaultClient, r2.url, connect.WithInterceptors(bearerToken(memberToken)))
	stream, err := watcher.WatchGrants(ctx, connect.NewRequest(&v1.WatchGrantsRequest{Session: a, MinRevision: rr.Msg.Revision}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || !notListed(stream.Msg()) {
		t.Fatalf("WatchGrants through r2: %v %v", stream.Msg(), stream.Err())
	}
	stream.Close()
	// ...and through each replica, with the newest release's revision
	// (through the replica that took a release, its own answers already
	// include it): every answer until a holds only its share leaves the
	// released buckets out.
	minRev := rr.Msg.Revision
	for _, ts := range []*testServer{r1, r2} {
		pollGrants(t, ctx, ts, a, minRev, notListed, func(r *v1.GetGrantsResponse) bool {
			keepAlive(t, ctx, ts, a)
			for _, g := range r.Grants {
				if slices.Contains(r.Release, g.Bucket) {
					// Asked to release more (c's share): release it too.
					more, err := ts.member.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{Session: a, Buckets: []*v1.BucketGrant{g}}))
					if err != nil {
						t.Fatal(err)
					}
					released[g.Bucket] = g.Token
					minRev = max(minRev, more.Msg.Revision)
				}
			}
			return len(r.Grants) > 0 && len(r.Release) == 0 && len(r.Grants) <= 6
		})
	}
}

// TestReplaceQuarantinesOnlyTheRemainingLease: a process restarted with
// replace gets its buckets back once its old session's lease would have
// run out, not a fresh full TTL later.
func TestReplaceQuarantinesOnlyTheRemainingLease(t *testing.T) {
	ts := startServer(t, nil)
	ctx := ctxT(t)
	ks := &v1.Keyspace{Name: "rooms", Buckets: 4, LeaseTtl: durationpb.New(4 * time.Second)}
	if _, err := ts.admin.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: ks})); err != nil {
		t.Fatal(err)
	}
	old := rawJoin(t, ctx, ts, "rooms", "a", false)
	keepAlive(t, ctx, ts, old)
	pollGrants(t, ctx, ts, old, 0, nil, func(r *v1.GetGrantsResponse) bool {
		keepAlive(t, ctx, ts, old)
		return len(r.Grants) == 4
	})
	// New sessions get a lease of 60 s; the old one has at most 4 s left
	// after this keep-alive. The process "crashes" and restarts.
	k, err := ts.admin.GetKeyspace(ctx, connect.NewRequest(&v1.GetKeyspaceRequest{Name: "rooms"}))
	if err != nil {
		t.Fatal(err)
	}
	k.Msg.Keyspace.LeaseTtl = durationpb.New(time.Minute)
	if _, err := ts.admin.UpdateKeyspace(ctx, connect.NewRequest(&v1.UpdateKeyspaceRequest{Keyspace: k.Msg.Keyspace})); err != nil {
		t.Fatal(err)
	}
	keepAlive(t, ctx, ts, old)
	sess := rawJoin(t, ctx, ts, "rooms", "a", true)
	keepAlive(t, ctx, ts, sess)
	// The old session renews no more: replaced, or already revoked by
	// the leader.
	_, err = ts.member.KeepAlive(ctx, connect.NewRequest(&v1.KeepAliveRequest{Session: old}))
	wantCode(t, err, connect.CodeNotFound, `session of member "a"`)
	// ctxT allows 30 s: a fresh full TTL (60 s) of quarantine fails here.
	pollGrants(t, ctx, ts, sess, 0, nil, func(r *v1.GetGrantsResponse) bool { return len(r.Grants) == 4 })
}

// Keep-alives of active members are checked against the replica's view
// at etcd's revision, even when other applications' writes to the same
// etcd move that revision past anything the view has an event for (the
// view's watch is asked for its progress); a replaced session still ends.
func TestKeepAliveCheckedOnTheReplica(t *testing.T) {
	ctx := ctxT(t)
	cluster, err := store.StartEmbeddedCluster(ctx, t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	ts := startServer(t, func(c *server.Config) { c.Etcd.Endpoints = cluster.Endpoints() })
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := ts.admin.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "rooms", Buckets: 8}})); err != nil {
		t.Fatal(err)
	}
	a := rawJoin(t, ctx, ts, "rooms", "a", false)
	keepAlive(t, ctx, ts, a) // activates a: the long way, no batch check
	// Once a holds every bucket the leader writes nothing more: the view
	// then moves only by the progress its watch is asked for.
	pollGrants(t, ctx, ts, a, 0, nil, func(r *v1.GetGrantsResponse) bool { return len(r.Grants) == 8 })
	onReplica := func() float64 {
		return metricLine(t, ts, `keyshard_member_keepalive_checks_total{by="replica"}`)
	}
	// A check that waits longer than renewCheckWait for the view goes to
	// etcd instead (and the next second's with it); on a busy machine
	// some may, so keep alive until one is answered by the view.
	for i := 0; onReplica() < 1; i++ {
		if ctx.Err() != nil {
			t.Fatalf("%d keep-alive checks, none answered by the replica's view", i)
		}
		if _, err := cli.Put(ctx, "another-application/key", strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
		keepAlive(t, ctx, ts, a)
	}
	b := rawJoin(t, ctx, ts, "rooms", "a", true)
	keepAlive(t, ctx, ts, b)
	_, err = ts.member.KeepAlive(ctx, connect.NewRequest(&v1.KeepAliveRequest{Session: a}))
	wantCode(t, err, connect.CodeNotFound, "replaced")
}

// metricLine reads the value of one series of ts's /metrics, named with
// its labels as exposed (0 if absent).
func metricLine(t *testing.T, ts *testServer, series string) float64 {
	t.Helper()
	body := metricsOf(t, ts)
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			return f
		}
	}
	return 0
}
