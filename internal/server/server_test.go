package server_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/clock"
	"github.com/keyshard/keyshard/internal/kitseam"
	"github.com/keyshard/keyshard/internal/server"
	"github.com/keyshard/keyshard/keyshardtest"
)

// testServer is one serve replica on loopback with an embedded etcd
// (keyshardtest.Server: Stop, Restart, WaitLeading, ...) and raw API
// clients with the test tokens.
type testServer struct {
	*keyshardtest.Server
	srv    *server.Server // the current run's, for the hooks of export_test.go
	url    string
	admin  keyshardv1connect.AdminServiceClient
	member keyshardv1connect.MemberServiceClient
	maps   keyshardv1connect.MapServiceClient
	hot    keyshardv1connect.HotKeyServiceClient // with the member token
}

const (
	adminToken  = "admin-token-0123456789"
	memberToken = "member-token-0123456789"
)

func startServer(t *testing.T, mutate func(*server.Config)) *testServer {
	t.Helper()
	return startServerWith(t, mutate, nil)
}

// startServerWith is startServer on clk (a fake clock, say); nil is the
// real clock.
func startServerWith(t *testing.T, mutate func(*server.Config), clk clock.Clock) *testServer {
	t.Helper()
	ts := &testServer{}
	ts.Server = keyshardtest.NewServer(t, keyshardtest.Options{
		AdminToken: adminToken, MemberToken: memberToken, Clock: clk,
		Internal: &kitseam.Options{Config: mutate, Started: func(s *server.Server) { ts.srv = s }},
	})
	ts.url = ts.URL()
	ts.admin = keyshardv1connect.NewAdminServiceClient(http.DefaultClient, ts.url, connect.WithInterceptors(bearer(adminToken)))
	ts.member = keyshardv1connect.NewMemberServiceClient(http.DefaultClient, ts.url, connect.WithInterceptors(bearer(memberToken)))
	ts.maps = keyshardv1connect.NewMapServiceClient(http.DefaultClient, ts.url, connect.WithInterceptors(bearer(memberToken)))
	ts.hot = keyshardv1connect.NewHotKeyServiceClient(http.DefaultClient, ts.url, connect.WithInterceptors(bearerToken(memberToken)))
	return ts
}

func bearer(token string) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", "Bearer "+token)
			return next(ctx, req)
		}
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t *testing.T, err error, code connect.Code, msg string) {
	t.Helper()
	if connect.CodeOf(err) != code || !strings.Contains(err.Error(), msg) {
		t.Fatalf("err = %v, want %v mentioning %q", err, code, msg)
	}
}

func TestKeyspaceAPI(t *testing.T) {
	ts := startServer(t, nil)
	ctx := ctxT(t)
	resp, err := ts.admin.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "rooms", Buckets: 64}}))
	if err != nil {
		t.Fatal(err)
	}
	if k := resp.Msg.Keyspace; k.Hash != "xxh64" || k.LeaseTtl.AsDuration() != 10*time.Second || k.Mode != v1.KeyspaceMode_KEYSPACE_MODE_EXCLUSIVE {
		t.Fatalf("defaults not filled: %v", k)
	}
	_, err = ts.admin.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "rooms"}}))
	wantCode(t, err, connect.CodeAlreadyExists, `keyspace "rooms" already exists`)
	for _, tc := range []struct {
		k    *v1.Keyspace
		want string
	}{
		{nil, "keyspace: missing"},
		{&v1.Keyspace{Name: "bad name"}, "name"},
		{&v1.Keyspace{Name: "x", Buckets: 70000}, "buckets: 70000 is out of range"},
		{&v1.Keyspace{Name: "x", Hash: "md5"}, `hash: "md5" is unknown`},
		{&v1.Keyspace{Name: "x", LeaseTtl: durationpb.New(500 * time.Millisecond)}, "lease_ttl: 500ms"},
	} {
		_, err := ts.admin.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: tc.k}))
		wantCode(t, err, connect.CodeInvalidArgument, tc.want)
	}
	_, err = ts.admin.UpdateKeyspace(ctx, connect.NewRequest(&v1.UpdateKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "rooms", Buckets: 128}}))
	wantCode(t, err, connect.CodeFailedPrecondition, "bucket count cannot change")
	up, err := ts.admin.UpdateKeyspace(ctx, connect.NewRequest(&v1.UpdateKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "rooms", DrainTimeout: durationpb.New(time.Minute)}}))
	if err != nil || up.Msg.Keyspace.DrainTimeout.AsDuration() != time.Minute || up.Msg.Keyspace.Buckets != 64 {
		t.Fatalf("update: %v %v", up, err)
	}
	_, err = ts.admin.GetKeyspace(ctx, connect.NewRequest(&v1.GetKeyspaceRequest{Name: "nope"}))
	wantCode(t, err, connect.CodeNotFound, `keyspace "nope" does not exist`)
}

func TestAuth(t *testing.T) {
	ts := startServer(t, nil)
	ctx := ctxT(t)
	none := keyshardv1connect.NewAdminServiceClient(http.DefaultClient, ts.url)
	_, err := none.ListKeyspaces(ctx, connect.NewRequest(&v1.ListKeyspacesRequest{}))
	wantCode(t, err, connect.CodeUnauthenticated, "missing bearer token")
	wrong := keyshardv1connect.NewAdminServiceClient(http.DefaultClient, ts.url, connect.WithInterceptors(bearer("not-a-real-token-at-all")))
	_, err = wrong.ListKeyspaces(ctx, connect.NewRequest(&v1.ListKeyspacesRequest{}))
	wantCode(t, err, connect.CodeUnauthenticated, "unknown bearer token")
	asMember := keyshardv1connect.NewAdminServiceClient(http.DefaultClient, ts.url, connect.WithInterceptors(bearer(memberToken)))
	// AdminService's read-only calls take a member token; the others need
	// an admin token.
	if _, err := asMember.ListKeyspaces(ctx, connect.NewRequest(&v1.ListKeyspacesRequest{})); err != nil {
		t.Fatalf("list keyspaces as member: %v", err)
	}
	if _, err := asMember.Status(ctx, connect.NewRequest(&v1.StatusRequest{})); err != nil {
		t.Fatalf("status as member: %v", err)
	}
	_, err = asMember.GetKeyspaceHistory(ctx, connect.NewRequest(&v1.GetKeyspaceHistoryRequest{Keyspace: "nope"}))
	wantCode(t, err, connect.CodeNotFound, "does not exist") // past the gate
	_, err = asMember.GetBuckets(ctx, connect.NewRequest(&v1.GetBucketsRequest{Keyspace: "nope"}))
	wantCode(t, err, connect.CodeNotFound, "does not exist")
	_, err = asMember.GetHotKeyReports(ctx, connect.NewRequest(&v1.GetHotKeyReportsRequest{Pool: "nope"}))
	wantCode(t, err, connect.CodeNotFound, "does not exist")
	_, err = asMember.DrainMember(ctx, connect.NewRequest(&v1.DrainMemberRequest{Keyspace: "x", Member: "m"}))
	wantCode(t, err, connect.CodePermissionDenied, "needs an admin token")
	_, err = asMember.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "x"}}))
	wantCode(t, err, connect.CodePermissionDenied, "needs an admin token")
	asAdmin := keyshardv1connect.NewMemberServiceClient(http.DefaultClient, ts.url, connect.WithInterceptors(bearer(adminToken)))
	_, err = asAdmin.Join(ctx, connect.NewRequest(&v1.JoinRequest{Keyspace: "x"}))
	wantCode(t, err, connect.CodePermissionDenied, "needs a member token")
	// Map reads take either role.
	if _, err := ts.maps.Lookup(ctx, connect.NewRequest(&v1.LookupRequest{Keyspace: "x"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("lookup as member: %v", err)
	}
	res, err := http.Get(ts.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(body), `keyshard_api_auth_refused_total{procedure="/keyshard.v1.AdminService/ListKeyspaces",reason="missing"} 1`) {
		t.Errorf("refusals not counted:\n%s", body)
	}
}

// TestHandoff joins two members and checks that the second gets its
// buckets only after the first released them, with higher tokens.
func TestHandoff(t *testing.T) {
	ts := startServer(t, nil)
	ctx := ctxT(t)
	if _, err := ts.admin.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "rooms", Buckets: 8}})); err != nil {
		t.Fatal(err)
	}
	join := func(id string) string {
		r, err := ts.member.Join(ctx, connect.NewRequest(&v1.JoinRequest{Keyspace: "rooms", Member: &v1.Member{Id: id, Address: id + ":1"}}))
		if err != nil {
			t.Fatal(err)
		}
		// The first keep-alive activates the session: until then it is
		// granted nothing.
		if _, err := ts.member.KeepAlive(ctx, connect.NewRequest(&v1.KeepAliveRequest{Session: r.Msg.Session})); err != nil {
			t.Fatal(err)
		}
		return r.Msg.Session
	}
	// grants long-polls until cond holds.
	grants := func(sess string, cond func(*v1.GetGrantsResponse) bool) *v1.GetGrantsResponse {
		var since uint64
		for {
			r, err := ts.member.GetGrants(ctx, connect.NewRequest(&v1.GetGrantsRequest{Session: sess, SinceRevision: since, Wait: durationpb.New(10 * time.Second)}))
			if err != nil {
				t.Fatal(err)
			}
			if cond(r.Msg) {
				return r.Msg
			}
			since = r.Msg.Revision
		}
	}
	a := join("a")
	ga := grants(a, func(r *v1.GetGrantsResponse) bool { return len(r.Grants) == 8 })
	b := join("b")
	ga = grants(a, func(r *v1.GetGrantsResponse) bool { return len(r.Release) == 4 })
	gb := grants(b, func(*v1.GetGrantsResponse) bool { return true })
	if len(gb.Grants) != 0 {
		t.Fatalf("b holds %v before a released", gb.Grants)
	}
	// b's map already names it: routers send it work at once.
	m, err := ts.maps.GetMap(ctx, connect.NewRequest(&v1.GetMapRequest{Keyspace: "rooms"}))
	if err != nil {
		t.Fatal(err)
	}
	owners := map[uint32]int{}
	for _, o := range m.Msg.Map.Owners {
		owners[o]++
	}
	if owners[1] != 4 || owners[2] != 4 {
		t.Fatalf("map owners %v", m.Msg.Map.Owners)
	}
	old := map[uint32]uint64{}
	var rel []*v1.BucketGrant
	for _, g := range ga.Grants {
		old[g.Bucket] = g.Token
		for _, r := range ga.Release {
			if r == g.Bucket {
				rel = append(rel, g)
			}
		}
	}
	// Releasing a bucket at the wrong token, or one not held, is refused.
	_, err = ts.member.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{Session: a, Buckets: []*v1.BucketGrant{{Bucket: rel[0].Bucket, Token: rel[0].Token + 1}}}))
	wantCode(t, err, connect.CodeInvalidArgument, "is held at token")
	// One member cannot release for another.
	_, err = ts.member.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{Session: b, Buckets: rel}))
	wantCode(t, err, connect.CodeInvalidArgument, "is not held by this session")
	forged := strings.Replace(a, "/a/", "/b/", 1)
	_, err = ts.member.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{Session: forged, Buckets: rel}))
	wantCode(t, err, connect.CodeUnauthenticated, "does not verify")

	if _, err := ts.member.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{Session: a, Buckets: rel})); err != nil {
		t.Fatal(err)
	}
	gb = grants(b, func(r *v1.GetGrantsResponse) bool { return len(r.Grants) == 4 })
	for _, g := range gb.Grants {
		if g.Token <= old[g.Bucket] {
			t.Errorf("bucket %d granted to b at token %d, not above a's %d", g.Bucket, g.Token, old[g.Bucket])
		}
	}
	ga = grants(a, func(r *v1.GetGrantsResponse) bool { return len(r.Grants) == 4 })
	if len(ga.Release) != 0 {
		t.Fatalf("a still asked to release %v", ga.Release)
	}

	// Lookup agrees with the map; a keep-alive works; leave drains.
	lk, err := ts.maps.Lookup(ctx, connect.NewRequest(&v1.LookupRequest{Keyspace: "rooms", Keys: []string{"x", "y"}}))
	if err != nil || len(lk.Msg.Owners) != 2 || lk.Msg.Owners[0].Member == "" {
		t.Fatalf("lookup: %v %v", lk, err)
	}
	if _, err := ts.member.KeepAlive(ctx, connect.NewRequest(&v1.KeepAliveRequest{Session: a})); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.member.Leave(ctx, connect.NewRequest(&v1.LeaveRequest{Session: a})); err != nil {
		t.Fatal(err)
	}
	ga = grants(a, func(r *v1.GetGrantsResponse) bool { return len(r.Release) == 4 })
	if _, err := ts.member.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{Session: a, Buckets: ga.Grants})); err != nil {
		t.Fatal(err)
	}
	grants(b, func(r *v1.GetGrantsResponse) bool { return len(r.Grants) == 8 })
	// a's session ends once it holds nothing: its long poll says so.
	var since uint64
	for {
		r, err := ts.member.GetGrants(ctx, connect.NewRequest(&v1.GetGrantsRequest{Session: a, SinceRevision: since, Wait: durationpb.New(10 * time.Second)}))
		if err != nil {
			wantCode(t, err, connect.CodeNotFound, "has ended")
			break
		}
		since = r.Msg.Revision
	}
	_, err = ts.member.KeepAlive(ctx, connect.NewRequest(&v1.KeepAliveRequest{Session: a}))
	wantCode(t, err, connect.CodeNotFound, "has ended")
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("timed out")
	}
}
