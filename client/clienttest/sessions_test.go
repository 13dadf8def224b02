package clienttest_test

import (
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/client/clienttest"
)

type sessionsStream = connect.BidiStreamForClient[keyshardv1.SessionsRequest, keyshardv1.SessionsResponse]

// openSessions opens a Sessions stream with m and sends first.
func openSessions(t *testing.T, m keyshardv1connect.MemberServiceClient, first *keyshardv1.SessionsRequest) *sessionsStream {
	t.Helper()
	st := m.Sessions(t.Context())
	if err := st.Send(first); err != nil && !errors.Is(err, io.EOF) { // io.EOF: refused at once; Receive says why
		t.Fatalf("send the first message: %v", err)
	}
	t.Cleanup(func() { _ = st.CloseRequest(); _ = st.CloseResponse() })
	return st
}

func receiveSessions(t *testing.T, st *sessionsStream) *keyshardv1.SessionsResponse {
	t.Helper()
	msg, err := st.Receive()
	if err != nil {
		t.Fatalf("Receive: %v", err)
	}
	return msg
}

// sessionsEnded receives from st until it ends, and returns its error.
func sessionsEnded(st *sessionsStream) error {
	for {
		if _, err := st.Receive(); err != nil {
			return err
		}
	}
}

// grantsByID receives from st until it has the grants of every id in
// ids, and returns the newest of each; an answer to a keep-alive or an
// ended session meanwhile fails the test.
func grantsByID(t *testing.T, st *sessionsStream, ids ...uint32) map[uint32]*keyshardv1.GetGrantsResponse {
	t.Helper()
	out := map[uint32]*keyshardv1.GetGrantsResponse{}
	for len(out) < len(ids) {
		msg := receiveSessions(t, st)
		if msg.GetKeepAlive() != nil || len(msg.GetEnded()) > 0 {
			t.Fatalf("message %v; want grants only", msg)
		}
		for _, g := range msg.GetGrants() {
			if !slices.Contains(ids, g.GetId()) {
				t.Fatalf("grants of id %d; want those of %v", g.GetId(), ids)
			}
			out[g.GetId()] = g.GetGrants()
		}
	}
	return out
}

// sessionsKeepAlive sends keep-alive n renewing ids on st and returns its
// answer, skipping grants.
func sessionsKeepAlive(t *testing.T, st *sessionsStream, n uint64, ids ...uint32) *keyshardv1.SessionsKeepAliveAnswer {
	t.Helper()
	if err := st.Send(&keyshardv1.SessionsRequest{KeepAlive: n, Renew: ids}); err != nil {
		t.Fatalf("send keep-alive %d: %v", n, err)
	}
	for {
		msg := receiveSessions(t, st)
		if len(msg.GetEnded()) > 0 {
			t.Fatalf("sessions ended %v while waiting for the answer to keep-alive %d", msg.GetEnded(), n)
		}
		if a := msg.GetKeepAlive(); a != nil {
			if a.GetKeepAlive() != n || len(a.GetRenewals()) != len(ids) {
				t.Fatalf("answer %v; want keep-alive %d with %d renewals", a, n, len(ids))
			}
			for i, r := range a.GetRenewals() {
				if r.GetId() != ids[i] {
					t.Fatalf("answer %v; want renewals in the order %v", a, ids)
				}
			}
			return a
		}
	}
}

func join(t *testing.T, m keyshardv1connect.MemberServiceClient, member string) string {
	t.Helper()
	resp, err := m.Join(t.Context(), connect.NewRequest(&keyshardv1.JoinRequest{Keyspace: "rooms", Member: &keyshardv1.Member{Id: member}}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.GetSession()
}

// TestSessionsStream: the fake serves Sessions streams as keyshard serve
// does, over HTTP/2: each session opened gets its grants first and on
// every change; a keep-alive renews each session it lists, each renewal
// recorded with KeepAlive calls, counted as a stream keep-alive and
// taking the keep-alive faults of its own, and is answered with every
// renewal in order; a failed renewal is answered with its code and the
// stream goes on. A session that ends is listed in ended not_found and
// the others go on; EndStreams ends the stream unavailable; over HTTP/1.1
// the call is unimplemented.
func TestSessionsStream(t *testing.T) {
	f := clienttest.NewServer(t, clienttest.Options{})
	f.AddKeyspace("rooms", 4, 9*time.Second)
	m := h2cMembers(f, connect.WithGRPC())
	sid1, sid2 := join(t, m, "w1"), join(t, m, "w2")

	st := openSessions(t, m, &keyshardv1.SessionsRequest{Open: []*keyshardv1.SessionsOpen{{Id: 1, Session: sid1}, {Id: 2, Session: sid2}}})
	for id, g := range grantsByID(t, st, 1, 2) {
		if len(g.GetGrants()) != 0 {
			t.Errorf("id %d: first grants %v; want none", id, g)
		}
	}
	if first := f.SessionsStreams().Next(t); len(first.GetOpen()) != 2 {
		t.Errorf("SessionsStreams recorded %v", first)
	}
	tok := f.Grant(sid2, 1)
	if g := grantsByID(t, st, 2)[2].GetGrants(); len(g) != 1 || g[0].GetBucket() != 1 || g[0].GetToken() != tok {
		t.Fatalf("grants of id 2 after Grant = %v", g)
	}

	f.Clock().Advance(time.Second)
	a := sessionsKeepAlive(t, st, 1, 2, 1)
	for _, r := range a.GetRenewals() {
		if r.GetTtl().AsDuration() != 9*time.Second || r.GetErrorCode() != "" {
			t.Errorf("renewal %v; want 9s", r)
		}
	}
	for _, sid := range []string{sid2, sid1} {
		if ka := f.KeepAlives().Next(t); ka.GetSession() != sid {
			t.Errorf("keep-alive recorded for %q, want %q", ka.GetSession(), sid)
		}
		if got, want := f.LeaseExpiry(sid), f.Clock().Now().Add(9*time.Second); !got.Equal(want) {
			t.Errorf("session %s: lease expiry %v, want %v", sid, got, want)
		}
	}

	// Each renewal takes the faults of its own: FailNext fails one.
	f.FailNext(keyshardv1connect.MemberServiceKeepAliveProcedure, 1, connect.NewError(connect.CodeDeadlineExceeded, errors.New("slow etcd")))
	a = sessionsKeepAlive(t, st, 2, 1, 2)
	if r := a.GetRenewals(); r[0].GetErrorCode() != "deadline_exceeded" || r[0].GetErrorMessage() != "slow etcd" || r[1].GetErrorCode() != "" {
		t.Errorf("renewals %v; want the first failed by FailNext, the second renewed", r)
	}
	// Delayed renewals wait together.
	f.DelayKeepAlives(time.Second)
	if err := st.Send(&keyshardv1.SessionsRequest{KeepAlive: 3, Renew: []uint32{1, 2}}); err != nil {
		t.Fatal(err)
	}
	f.Delays().Next(t)
	f.Delays().Next(t)
	f.Clock().Advance(time.Second)
	if a := receiveSessions(t, st).GetKeepAlive(); a.GetKeepAlive() != 3 || len(a.GetRenewals()) != 2 || a.GetRenewals()[1].GetErrorCode() != "" {
		t.Errorf("delayed keep-alive answered %v", a)
	}
	f.DelayKeepAlives(0)
	if s, n, ka := f.CallCount(keyshardv1connect.MemberServiceSessionsProcedure), f.StreamKeepAlives(), f.CallCount(keyshardv1connect.MemberServiceKeepAliveProcedure); s != 1 || n != 6 || ka != 0 {
		t.Errorf("%d Sessions calls, %d keep-alives on streams, %d KeepAlive calls; want 1, 6, 0", s, n, ka)
	}

	// A session that ends is listed in ended; the others go on.
	f.EndSession(sid1)
	msg := receiveSessions(t, st)
	if e := msg.GetEnded(); len(e) != 1 || e[0].GetId() != 1 || e[0].GetErrorCode() != "not_found" {
		t.Fatalf("after EndSession: %v; want id 1 ended not_found", msg)
	}
	a = sessionsKeepAlive(t, st, 4, 1, 2)
	if r := a.GetRenewals(); r[0].GetErrorCode() != "not_found" || r[1].GetErrorCode() != "" {
		t.Errorf("renewals %v; want the ended session not_found, the other renewed", r)
	}
	tok = f.Grant(sid2, 2)
	if g := grantsByID(t, st, 2)[2].GetGrants(); len(g) != 2 || g[1].GetToken() != tok {
		t.Errorf("grants of id 2 after another Grant = %v", g)
	}
	// Opening an ended session lists it ended at once.
	if err := st.Send(&keyshardv1.SessionsRequest{Open: []*keyshardv1.SessionsOpen{{Id: 3, Session: sid1}}}); err != nil {
		t.Fatal(err)
	}
	if e := receiveSessions(t, st).GetEnded(); len(e) != 1 || e[0].GetId() != 3 || e[0].GetErrorCode() != "not_found" {
		t.Errorf("open of an ended session: %v; want id 3 ended not_found", e)
	}
	// A renewal of an id not followed (never opened, or closed) is
	// answered not_found, and renews nothing.
	if err := st.Send(&keyshardv1.SessionsRequest{Close: []uint32{2}}); err != nil {
		t.Fatal(err)
	}
	before := f.StreamKeepAlives()
	a = sessionsKeepAlive(t, st, 5, 2, 9)
	for _, r := range a.GetRenewals() {
		if r.GetErrorCode() != "not_found" || !strings.Contains(r.GetErrorMessage(), "no session is followed as id") {
			t.Errorf("renewal %v; want not_found: not followed", r)
		}
	}
	if n := f.StreamKeepAlives(); n != before {
		t.Errorf("%d keep-alives counted for ids not followed, want none", n-before)
	}
	// Every message is recorded.
	if n := f.SessionsMessages().Len(); n != 8 {
		t.Errorf("%d messages recorded, want 8", n)
	}

	f.EndStreams()
	if err := sessionsEnded(st); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("stream cut by EndStreams ended with %v; want unavailable", err)
	}

	open := func(id uint32, sid string) *keyshardv1.SessionsOpen {
		return &keyshardv1.SessionsOpen{Id: id, Session: sid}
	}
	for _, tc := range []struct {
		name        string
		first, next *keyshardv1.SessionsRequest
	}{
		{"id 0", &keyshardv1.SessionsRequest{Open: []*keyshardv1.SessionsOpen{open(0, sid2)}}, nil},
		{"no session", &keyshardv1.SessionsRequest{Open: []*keyshardv1.SessionsOpen{open(1, "")}}, nil},
		{"id followed twice", &keyshardv1.SessionsRequest{Open: []*keyshardv1.SessionsOpen{open(1, sid2)}}, &keyshardv1.SessionsRequest{Open: []*keyshardv1.SessionsOpen{open(1, sid1)}}},
		{"session followed twice", &keyshardv1.SessionsRequest{Open: []*keyshardv1.SessionsOpen{open(1, sid2), open(2, sid2)}}, nil},
		{"keep-alive 0", &keyshardv1.SessionsRequest{Open: []*keyshardv1.SessionsOpen{open(1, sid2)}, Renew: []uint32{1}}, nil},
		{"keep-alive without renew", &keyshardv1.SessionsRequest{Open: []*keyshardv1.SessionsOpen{open(1, sid2)}, KeepAlive: 1}, nil},
		{"renew listing an id twice", &keyshardv1.SessionsRequest{Open: []*keyshardv1.SessionsOpen{open(1, sid2)}, KeepAlive: 1, Renew: []uint32{1, 1}}, nil},
	} {
		st := openSessions(t, m, tc.first)
		if tc.next != nil {
			if err := st.Send(tc.next); err != nil && !errors.Is(err, io.EOF) {
				t.Fatalf("%s: %v", tc.name, err)
			}
		}
		if err := sessionsEnded(st); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("%s: stream ended with %v; want invalid_argument", tc.name, err)
		}
	}

	// Over HTTP/1.1, as keyshard serve: UNIMPLEMENTED, counted.
	before = f.CallCount(keyshardv1connect.MemberServiceSessionsProcedure)
	h1 := keyshardv1connect.NewMemberServiceClient(&http.Client{Transport: &http.Transport{}}, f.URL())
	st1 := h1.Sessions(t.Context())
	_ = st1.Send(&keyshardv1.SessionsRequest{Open: []*keyshardv1.SessionsOpen{open(1, sid2)}})
	if _, err := st1.Receive(); connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Errorf("Sessions over HTTP/1.1: %v; want unimplemented", err)
	}
	_ = st1.CloseRequest()
	_ = st1.CloseResponse()
	if n := f.CallCount(keyshardv1connect.MemberServiceSessionsProcedure); n != before+1 {
		t.Errorf("Sessions calls %d after one over HTTP/1.1, want %d", n, before+1)
	}
}

// TestSessionsStreamHeld: a keep-alive held by HoldKeepAlives holds its
// answer, and the answers after it, while the keep-alives after it are
// recorded as they arrive; SetUnavailable ends the stream unavailable.
func TestSessionsStreamHeld(t *testing.T) {
	f := clienttest.NewServer(t, clienttest.Options{})
	f.AddKeyspace("rooms", 4, 9*time.Second)
	m := h2cMembers(f) // the Connect protocol, over HTTP/2
	sid1, sid2 := join(t, m, "w1"), join(t, m, "w2")
	st := openSessions(t, m, &keyshardv1.SessionsRequest{Open: []*keyshardv1.SessionsOpen{{Id: 1, Session: sid1}, {Id: 2, Session: sid2}}})
	grantsByID(t, st, 1, 2)

	gate := f.HoldKeepAlives()
	for n, id := range []uint32{1, 2} {
		if err := st.Send(&keyshardv1.SessionsRequest{KeepAlive: uint64(n + 1), Renew: []uint32{id}}); err != nil {
			t.Fatal(err)
		}
	}
	if ka := f.KeepAlives().Next(t); ka.GetSession() != sid1 {
		t.Errorf("first keep-alive for %q", ka.GetSession())
	}
	if ka := f.KeepAlives().Next(t); ka.GetSession() != sid2 { // recorded while the first is held
		t.Errorf("second keep-alive for %q", ka.GetSession())
	}
	gate.Open()
	for n := uint64(1); n <= 2; n++ {
		if a := receiveSessions(t, st).GetKeepAlive(); a.GetKeepAlive() != n || a.GetRenewals()[0].GetErrorCode() != "" {
			t.Errorf("answer %v; want keep-alive %d renewed", a, n)
		}
	}
	f.SetUnavailable(true)
	if err := sessionsEnded(st); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("stream ended with %v; want unavailable", err)
	}
}
