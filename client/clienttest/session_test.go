package clienttest_test

import (
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/client/clienttest"
)

type sessionStream = connect.BidiStreamForClient[keyshardv1.SessionRequest, keyshardv1.SessionResponse]

// h2cMembers returns a member API client of f over HTTP/2 without TLS.
func h2cMembers(f *clienttest.Server, opts ...connect.ClientOption) keyshardv1connect.MemberServiceClient {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return keyshardv1connect.NewMemberServiceClient(&http.Client{Transport: tr}, f.URL(), opts...)
}

// openSession opens a Session stream with m and sends first.
func openSession(t *testing.T, m keyshardv1connect.MemberServiceClient, first *keyshardv1.SessionRequest) *sessionStream {
	t.Helper()
	st := m.Session(t.Context())
	// A stream the server refuses at once may be closed before the first
	// message is written: Send then reports io.EOF, and Receive the
	// server's error.
	if err := st.Send(first); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("send the first message: %v", err)
	}
	t.Cleanup(func() { _ = st.CloseRequest(); _ = st.CloseResponse() })
	return st
}

func receive(t *testing.T, st *sessionStream) *keyshardv1.SessionResponse {
	t.Helper()
	msg, err := st.Receive()
	if err != nil {
		t.Fatalf("Receive: %v", err)
	}
	return msg
}

// ended receives from st until it ends, and returns its error; an answer
// to a keep-alive meanwhile fails the test.
func ended(t *testing.T, st *sessionStream) error {
	t.Helper()
	for {
		msg, err := st.Receive()
		if err != nil {
			return err
		}
		if msg.GetKeepAlive() != nil {
			t.Fatalf("answer %v; want the stream to end", msg.GetKeepAlive())
		}
	}
}

// keepAlive sends keep-alive n on st and returns its answer, skipping
// grants.
func keepAlive(t *testing.T, st *sessionStream, n uint64) *keyshardv1.KeepAliveAnswer {
	t.Helper()
	if err := st.Send(&keyshardv1.SessionRequest{KeepAlive: n}); err != nil {
		t.Fatalf("send keep-alive %d: %v", n, err)
	}
	for {
		if a := receive(t, st).GetKeepAlive(); a != nil {
			if a.GetKeepAlive() != n {
				t.Fatalf("answer to keep-alive %d, want %d", a.GetKeepAlive(), n)
			}
			return a
		}
	}
}

// TestSessionStream: the fake serves Session streams as keyshard serve
// does, over HTTP/2: the first keep-alive is answered first (it activates
// the session), the grants come first and on every change, keep-alives
// are answered by number with the TTL and take the keep-alive faults (a
// failure is answered on the stream, which goes on); they are recorded
// with KeepAlive calls, and counted apart. EndStreams ends the stream
// unavailable, an ended session ends it not_found, and over HTTP/1.1 the
// call is unimplemented.
func TestSessionStream(t *testing.T) {
	f := clienttest.NewServer(t, clienttest.Options{})
	f.AddKeyspace("rooms", 4, 9*time.Second)
	m := h2cMembers(f, connect.WithGRPC())
	ctx := t.Context()
	join, err := m.Join(ctx, connect.NewRequest(&keyshardv1.JoinRequest{Keyspace: "rooms", Member: &keyshardv1.Member{Id: "w1"}}))
	if err != nil {
		t.Fatal(err)
	}
	sid := join.Msg.GetSession()

	st := openSession(t, m, &keyshardv1.SessionRequest{Session: sid, KeepAlive: 1})
	if a := receive(t, st).GetKeepAlive(); a.GetKeepAlive() != 1 || a.GetTtl().AsDuration() != 9*time.Second || a.GetErrorCode() != "" {
		t.Fatalf("first message answers %v; want keep-alive 1 renewed for 9s", a)
	}
	if g := receive(t, st).GetGrants(); g == nil || len(g.GetGrants()) != 0 {
		t.Fatalf("second message has grants %v; want the (empty) grants", g)
	}
	if first := f.SessionStreams().Next(t); first.GetSession() != sid || first.GetKeepAlive() != 1 {
		t.Errorf("SessionStreams recorded %v", first)
	}
	tok := f.Grant(sid, 2)
	if g := receive(t, st).GetGrants().GetGrants(); len(g) != 1 || g[0].GetBucket() != 2 || g[0].GetToken() != tok {
		t.Fatalf("grants after Grant = %v", g)
	}
	f.Clock().Advance(time.Second)
	keepAlive(t, st, 2)
	if got, want := f.LeaseExpiry(sid), f.Clock().Now().Add(9*time.Second); !got.Equal(want) {
		t.Errorf("lease expiry %v after keep-alive 2, want %v", got, want)
	}

	f.SetKeepAlives(clienttest.KeepAliveFail)
	if a := keepAlive(t, st, 3); a.GetErrorCode() != "unavailable" || a.GetErrorMessage() != "etcd is unreachable" || a.GetTtl() != nil {
		t.Errorf("failed keep-alive answered %v; want unavailable on the stream", a)
	}
	f.SetKeepAlives(clienttest.KeepAliveServe)
	f.FailNext(keyshardv1connect.MemberServiceKeepAliveProcedure, 1, connect.NewError(connect.CodeDeadlineExceeded, errors.New("slow etcd")))
	if a := keepAlive(t, st, 4); a.GetErrorCode() != "deadline_exceeded" || a.GetErrorMessage() != "slow etcd" {
		t.Errorf("keep-alive failed by FailNext answered %v", a)
	}
	gate := f.HoldKeepAlives()
	if err := st.Send(&keyshardv1.SessionRequest{KeepAlive: 5}); err != nil {
		t.Fatal(err)
	}
	f.KeepAlives().Next(t) // the first four ...
	f.KeepAlives().Next(t)
	f.KeepAlives().Next(t)
	f.KeepAlives().Next(t)
	if ka := f.KeepAlives().Next(t); ka.GetSession() != sid { // ... and the held one
		t.Errorf("keep-alive recorded for %q, want %q", ka.GetSession(), sid)
	}
	gate.Open()
	if a := receive(t, st).GetKeepAlive(); a.GetKeepAlive() != 5 || a.GetErrorCode() != "" {
		t.Errorf("held keep-alive answered %v", a)
	}
	if s, n, ka := f.CallCount(keyshardv1connect.MemberServiceSessionProcedure), f.StreamKeepAlives(), f.CallCount(keyshardv1connect.MemberServiceKeepAliveProcedure); s != 1 || n != 5 || ka != 0 {
		t.Errorf("%d Session calls, %d keep-alives on streams, %d KeepAlive calls; want 1, 5, 0", s, n, ka)
	}

	f.EndStreams()
	if err := ended(t, st); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("stream cut by EndStreams ended with %v; want unavailable", err)
	}
	st2 := openSession(t, m, &keyshardv1.SessionRequest{Session: sid})
	receive(t, st2)
	f.EndSession(sid)
	if err := ended(t, st2); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("stream of an ended session ended with %v; want not_found", err)
	}
	if err := ended(t, openSession(t, m, &keyshardv1.SessionRequest{Session: sid})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("stream of an ended session opened: %v; want not_found", err)
	}

	sid2 := f.Session("rooms", "w1")
	if sid2 != "" {
		t.Fatalf("w1 still has session %q", sid2)
	}
	join, err = m.Join(ctx, connect.NewRequest(&keyshardv1.JoinRequest{Keyspace: "rooms", Member: &keyshardv1.Member{Id: "w1"}}))
	if err != nil {
		t.Fatal(err)
	}
	sid2 = join.Msg.GetSession()
	for _, tc := range []struct {
		name        string
		first, next *keyshardv1.SessionRequest
		code        connect.Code
	}{
		{"no session", &keyshardv1.SessionRequest{KeepAlive: 1}, nil, connect.CodeInvalidArgument},
		{"keep-alive 0 after the first", &keyshardv1.SessionRequest{Session: sid2}, &keyshardv1.SessionRequest{}, connect.CodeInvalidArgument},
		{"another session", &keyshardv1.SessionRequest{Session: sid2}, &keyshardv1.SessionRequest{Session: sid, KeepAlive: 1}, connect.CodeInvalidArgument},
	} {
		st := openSession(t, m, tc.first)
		if tc.next != nil {
			// io.EOF: the fake ended the stream, at this message,
			// before Send returned; Receive says why.
			if err := st.Send(tc.next); err != nil && !errors.Is(err, io.EOF) {
				t.Fatalf("%s: %v", tc.name, err)
			}
		}
		if err := ended(t, st); connect.CodeOf(err) != tc.code {
			t.Errorf("%s: stream ended with %v; want %v", tc.name, err, tc.code)
		}
	}

	// Over HTTP/1.1, as keyshard serve: UNIMPLEMENTED, counted.
	before := f.CallCount(keyshardv1connect.MemberServiceSessionProcedure)
	h1 := keyshardv1connect.NewMemberServiceClient(&http.Client{Transport: &http.Transport{}}, f.URL())
	st1 := h1.Session(ctx)
	_ = st1.Send(&keyshardv1.SessionRequest{Session: sid2, KeepAlive: 1})
	if _, err := st1.Receive(); connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Errorf("Session over HTTP/1.1: %v; want unimplemented", err)
	}
	_ = st1.CloseRequest()
	_ = st1.CloseResponse()
	if n := f.CallCount(keyshardv1connect.MemberServiceSessionProcedure); n != before+1 {
		t.Errorf("Session calls %d after one over HTTP/1.1, want %d", n, before+1)
	}
}

// TestSessionStreamUnavailable: a fake cut off from etcd ends its Session
// streams unavailable, as its other streams (here over the Connect
// protocol).
func TestSessionStreamUnavailable(t *testing.T) {
	f := clienttest.NewServer(t, clienttest.Options{})
	f.AddKeyspace("rooms", 4, 9*time.Second)
	m := h2cMembers(f) // the Connect protocol, over HTTP/2
	join, err := m.Join(t.Context(), connect.NewRequest(&keyshardv1.JoinRequest{Keyspace: "rooms", Member: &keyshardv1.Member{Id: "w1"}}))
	if err != nil {
		t.Fatal(err)
	}
	st := openSession(t, m, &keyshardv1.SessionRequest{Session: join.Msg.GetSession()})
	receive(t, st)
	f.SetUnavailable(true)
	if err := ended(t, st); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("stream ended with %v; want unavailable", err)
	}
}
