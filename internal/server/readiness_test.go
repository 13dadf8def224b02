package server

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/internal/grpcbridge"
	"github.com/keyshard/keyshard/internal/store"
)

func readyz(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// failingProbe makes s's etcd probe fail while the flag it returns is set.
func failingProbe(s *Server) *atomic.Bool {
	var failing atomic.Bool
	s.seams.probe = func(context.Context) error {
		if failing.Load() {
			return errors.New("injected: etcd unreachable")
		}
		return nil
	}
	return &failing
}

// TestUnreachableStore: once the etcd probe has failed for 3 s of the
// replica's clock, /readyz answers 503, keyshard_store_reachable is 0,
// member, map and hot-key calls answer UNAVAILABLE at once and open
// streams end so, while AdminService still answers; one successful probe
// makes the replica ready again.
func TestUnreachableStore(t *testing.T) {
	ctx, s, clk := fakeReplica(t)
	withStore(t, s)
	failing := failingProbe(s)
	s.view.apply(store.Update{Resync: &store.Resync{Snapshot: store.NewSnapshot(0)}})
	apply(s, 5, roomsChanges()...)
	hs, err := s.httpServer()
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(hs.Handler)
	defer ts.Close()
	members := keyshardv1connect.NewMemberServiceClient(ts.Client(), ts.URL)
	maps := keyshardv1connect.NewMapServiceClient(ts.Client(), ts.URL)
	hot := keyshardv1connect.NewHotKeyServiceClient(ts.Client(), ts.URL)
	admin := keyshardv1connect.NewAdminServiceClient(ts.Client(), ts.URL)

	s.checkStore(ctx) // reachable at start
	if code, body := readyz(t, ts.URL); code != http.StatusOK {
		t.Fatalf("readyz %d %q while etcd answers", code, body)
	}
	if got := metricValue(t, s, "keyshard_store_reachable"); got != 1 {
		t.Fatalf("keyshard_store_reachable = %v while etcd answers", got)
	}
	stream, err := maps.WatchMap(ctx, connect.NewRequest(&v1.WatchMapRequest{Keyspace: "rooms"}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatalf("WatchMap sent no map: %v", stream.Err())
	}

	failing.Store(true)
	for range 2 { // 2 s without a successful probe: still ready
		clk.Advance(time.Second)
		s.checkStore(ctx)
	}
	if code, body := readyz(t, ts.URL); code != http.StatusOK {
		t.Fatalf("readyz %d %q after 2 s unreachable, want still ready", code, body)
	}
	clk.Advance(time.Second)
	s.checkStore(ctx)
	if code, body := readyz(t, ts.URL); code != http.StatusServiceUnavailable || !strings.Contains(body, "etcd unreachable") {
		t.Fatalf("readyz %d %q after 3 s unreachable, want 503 naming etcd", code, body)
	}
	if got := metricValue(t, s, "keyshard_store_reachable"); got != 0 {
		t.Fatalf("keyshard_store_reachable = %v after 3 s unreachable", got)
	}
	if stream.Receive() {
		t.Fatal("the open WatchMap stream sent again instead of ending")
	}
	if connect.CodeOf(stream.Err()) != connect.CodeUnavailable {
		t.Fatalf("open WatchMap stream ended with %v, want UNAVAILABLE", stream.Err())
	}
	stream.Close()

	wantUnavailable := func(what string, err error) {
		t.Helper()
		if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "cannot reach etcd") {
			t.Errorf("%s while etcd is unreachable: %v, want UNAVAILABLE naming etcd", what, err)
		}
	}
	_, err = members.KeepAlive(ctx, connect.NewRequest(&v1.KeepAliveRequest{Session: s.sessions.token("rooms", "a", testLease)}))
	wantUnavailable("KeepAlive", err)
	_, err = maps.GetMap(ctx, connect.NewRequest(&v1.GetMapRequest{Keyspace: "rooms"}))
	wantUnavailable("GetMap", err)
	_, err = hot.GetOverflowSet(ctx, connect.NewRequest(&v1.GetOverflowSetRequest{Pool: "ingest"}))
	wantUnavailable("GetOverflowSet", err)
	ws, err := members.WatchGrants(ctx, connect.NewRequest(&v1.WatchGrantsRequest{Session: s.sessions.token("rooms", "a", testLease)}))
	if err == nil {
		ws.Receive()
		err = ws.Err()
		ws.Close()
	}
	wantUnavailable("WatchGrants", err)
	if _, err := admin.ListKeyspaces(ctx, connect.NewRequest(&v1.ListKeyspacesRequest{})); err != nil {
		t.Errorf("ListKeyspaces while the probe fails: %v, want AdminService open", err)
	}

	failing.Store(false)
	clk.Advance(time.Second)
	s.checkStore(ctx)
	if code, body := readyz(t, ts.URL); code != http.StatusOK {
		t.Fatalf("readyz %d %q after a successful probe", code, body)
	}
	if _, err := maps.GetMap(ctx, connect.NewRequest(&v1.GetMapRequest{Keyspace: "rooms"})); err != nil {
		t.Fatalf("GetMap once etcd is reachable again: %v", err)
	}
}

// TestUnreachableStoreEndsGRPCSession: a Session stream over gRPC in
// protobuf (served on grpc-go's stream, grpcSession) ends when etcd
// becomes unreachable, as connect's streams do through reachGate, and a
// new one is refused UNAVAILABLE naming etcd.
func TestUnreachableStoreEndsGRPCSession(t *testing.T) {
	ctx, s, clk := fakeReplica(t)
	withStore(t, s)
	failing := failingProbe(s)
	s.view.apply(store.Update{Resync: &store.Resync{Snapshot: store.NewSnapshot(0)}})
	apply(s, 5, roomsChanges()...)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := grpcbridge.New(http.NotFoundHandler(), grpcbridge.Options{Streams: map[string]grpcbridge.StreamHandler{
		keyshardv1connect.MemberServiceSessionProcedure: s.grpcSession,
	}})
	done := make(chan error, 1)
	go func() { done <- b.Serve(ln) }() // exits at Stop
	t.Cleanup(func() { b.Stop(); <-done })
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	members := keyshardv1connect.NewMemberServiceClient(&http.Client{Transport: tr}, "http://"+ln.Addr().String(), connect.WithGRPC())
	token := s.sessions.token("rooms", "a", testLease)

	s.checkStore(ctx) // reachable at start
	st := members.Session(ctx)
	defer func() { _ = st.CloseRequest(); _ = st.CloseResponse() }()
	if err := st.Send(&v1.SessionRequest{Session: token}); err != nil {
		t.Fatal(err)
	}
	first, err := st.Receive()
	if err != nil || len(first.GetGrants().GetGrants()) != 4 {
		t.Fatalf("first message %v, %v; want a's 4 grants", first, err)
	}
	failing.Store(true)
	for range 3 {
		clk.Advance(time.Second)
		s.checkStore(ctx)
	}
	// grpc-go ends a stream cut while it waits for the member's next
	// message CANCELED, whatever the reason (see grpcbridge.Stream.Cut).
	if msg, err := st.Receive(); connect.CodeOf(err) != connect.CodeCanceled {
		t.Fatalf("the open stream went on (%v, %v) after etcd became unreachable; want it ended", msg, err)
	}
	again := members.Session(ctx)
	defer func() { _ = again.CloseRequest(); _ = again.CloseResponse() }()
	// The refusal may close the stream before the first message is
	// written: Send then reports io.EOF, and Receive the server's error.
	if err := again.Send(&v1.SessionRequest{Session: token}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if _, err := again.Receive(); connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "cannot reach etcd") {
		t.Fatalf("a new stream while etcd is unreachable: %v; want UNAVAILABLE naming etcd", err)
	}
}
