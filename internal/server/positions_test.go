package server_test

import (
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/internal/store"
)

// TestPositionsAPI: GetPositions and ResetPositions on a real server:
// the view over every bucket, a reset of unheld buckets that the next
// grant starts from, the refusal of a held one, and bad input.
func TestPositionsAPI(t *testing.T) {
	ts := startServer(t, nil)
	ctx := ctxT(t)
	for _, k := range []*v1.Keyspace{{Name: "ev", Buckets: 8, Mode: v1.KeyspaceMode_KEYSPACE_MODE_STREAM}, {Name: "rooms", Buckets: 8}} {
		if _, err := ts.admin.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: k})); err != nil {
			t.Fatal(err)
		}
	}
	get := func(behind uint32) *v1.GetPositionsResponse {
		t.Helper()
		r, err := ts.admin.GetPositions(ctx, connect.NewRequest(&v1.GetPositionsRequest{Keyspace: "ev", Behind: behind}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg
	}
	p := get(0)
	if p.Min != 0 || p.Max != 0 || len(p.Runs) != 1 || p.Runs[0].Count != 8 || len(p.Behind) != 8 || p.Revision == 0 {
		t.Fatalf("fresh keyspace: %v", p)
	}

	reset := func(req *v1.ResetPositionsRequest) (*v1.ResetPositionsResponse, error) {
		r, err := ts.admin.ResetPositions(ctx, connect.NewRequest(req))
		if err != nil {
			return nil, err
		}
		return r.Msg, nil
	}
	r, err := reset(&v1.ResetPositionsRequest{Keyspace: "ev", Buckets: []uint32{0, 1, 2, 3}, Position: 100})
	if err != nil || r.Buckets != 4 || r.Revision == 0 {
		t.Fatalf("reset: %v, %v", r, err)
	}
	p = get(3)
	if p.Min != 0 || p.Max != 100 || p.Spread != 100 || len(p.Runs) != 2 || p.Runs[0].Position != 100 || p.Runs[1].First != 4 || p.Runs[1].Count != 4 || len(p.Behind) != 3 || p.Behind[0].Bucket != 4 || p.Revision < r.Revision {
		t.Fatalf("after reset: %v", p)
	}

	// A member joins: its grants start at the reset positions.
	joinMember(t, ts, "ev", "a")
	if err := ts.srv.WaitView(ctx, func(s *store.Snapshot) bool { return len(s.Keyspaces["ev"].Grants["a"].Value.Buckets) == 8 }); err != nil {
		t.Fatal(err)
	}
	ts.srv.WaitView(ctx, func(s *store.Snapshot) bool {
		for _, bt := range s.Keyspaces["ev"].Grants["a"].Value.Buckets {
			if want := map[bool]uint64{true: 100, false: 0}[bt.Bucket < 4]; bt.Position != want {
				t.Errorf("bucket %d granted from %d, want %d", bt.Bucket, bt.Position, want)
			}
		}
		return true
	})
	p = get(1)
	if len(p.Behind) != 1 || p.Behind[0].Member != "a" || p.Behind[0].Token == 0 || p.Epoch == 0 {
		t.Fatalf("held: %v", p)
	}

	// Refusals.
	_, err = reset(&v1.ResetPositionsRequest{Keyspace: "ev", Buckets: []uint32{6, 2}, Position: 1})
	wantCode(t, err, connect.CodeFailedPrecondition, `bucket 6 is held by member "a"`)
	wantCode(t, err, connect.CodeFailedPrecondition, "drain the member (keyshard drain ev a) or stop it first. Nothing was reset")
	_, err = reset(&v1.ResetPositionsRequest{Keyspace: "ev", AllBuckets: true})
	wantCode(t, err, connect.CodeFailedPrecondition, "is held by member")
	if p2 := get(0); p2.Max != 100 || len(p2.Runs) != 2 {
		t.Fatalf("a refused reset changed positions: %v", p2)
	}
	for _, tc := range []struct {
		req  *v1.ResetPositionsRequest
		code connect.Code
		want string
	}{
		{&v1.ResetPositionsRequest{Buckets: []uint32{1}}, connect.CodeInvalidArgument, "keyspace: empty"},
		{&v1.ResetPositionsRequest{Keyspace: "nope", Buckets: []uint32{1}}, connect.CodeNotFound, `keyspace "nope" does not exist`},
		{&v1.ResetPositionsRequest{Keyspace: "rooms", Buckets: []uint32{1}}, connect.CodeInvalidArgument, `keyspace: "rooms" is in exclusive mode`},
		{&v1.ResetPositionsRequest{Keyspace: "ev"}, connect.CodeInvalidArgument, "buckets: empty; name the buckets to reset, or set all_buckets"},
		{&v1.ResetPositionsRequest{Keyspace: "ev", Buckets: []uint32{1}, AllBuckets: true}, connect.CodeInvalidArgument, "buckets: 1 buckets given with all_buckets"},
		{&v1.ResetPositionsRequest{Keyspace: "ev", Buckets: []uint32{1, 8}}, connect.CodeInvalidArgument, "buckets[1]: bucket 8 is outside the keyspace's range [0, 8)"},
		{&v1.ResetPositionsRequest{Keyspace: "ev", Buckets: []uint32{1, 2, 1}}, connect.CodeInvalidArgument, "buckets[2]: bucket 1 is listed twice (also buckets[0])"},
	} {
		_, err := reset(tc.req)
		wantCode(t, err, tc.code, tc.want)
	}
	for _, tc := range []struct {
		req  *v1.GetPositionsRequest
		code connect.Code
		want string
	}{
		{&v1.GetPositionsRequest{Keyspace: "ev", Behind: 1001}, connect.CodeInvalidArgument, "behind: 1001 is above the limit of 1000"},
		{&v1.GetPositionsRequest{Keyspace: "rooms"}, connect.CodeInvalidArgument, `keyspace: "rooms" is in exclusive mode`},
		{&v1.GetPositionsRequest{Keyspace: "bad name"}, connect.CodeInvalidArgument, "keyspace name"},
	} {
		_, err := ts.admin.GetPositions(ctx, connect.NewRequest(tc.req))
		wantCode(t, err, tc.code, tc.want)
	}

	// Members may read them (GetPositions has no side effects) but not
	// reset them; plain HTTP/JSON works.
	mem := keyshardv1connect.NewAdminServiceClient(http.DefaultClient, ts.url, connect.WithInterceptors(bearer(memberToken)))
	if _, err := mem.GetPositions(ctx, connect.NewRequest(&v1.GetPositionsRequest{Keyspace: "ev"})); err != nil {
		t.Fatalf("get positions as member: %v", err)
	}
	_, err = mem.ResetPositions(ctx, connect.NewRequest(&v1.ResetPositionsRequest{Keyspace: "ev", AllBuckets: true}))
	wantCode(t, err, connect.CodePermissionDenied, "needs an admin token")
	status, e := call(t, http.MethodPost, ts.url+keyshardv1connect.AdminServiceResetPositionsProcedure, "application/json", `{"keyspace":"ev","buckets":[1],"all_buckets":true,"position":"5"}`)
	if status != 400 || !strings.Contains(e.Message, "all_buckets") {
		t.Errorf("JSON reset with both: %d %+v", status, e)
	}
	status, _ = call(t, http.MethodPost, ts.url+keyshardv1connect.AdminServiceGetPositionsProcedure, "application/json", `{"keyspace":"ev","behind":2}`)
	if status != 200 {
		t.Errorf("JSON GetPositions: %d", status)
	}
}
