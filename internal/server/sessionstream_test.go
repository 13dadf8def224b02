package server_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/internal/server"
)

// The protocols a Session stream is tested over: the Connect protocol over
// HTTP/2 (net/http's server and connect's handler) and gRPC (grpc-go's
// server, and grpc-go's stream: grpcSession).
var streamProtocols = []struct {
	name string
	opts []connect.ClientOption
}{
	{"connect", nil},
	{"grpc", []connect.ClientOption{connect.WithGRPC()}},
}

// sessionStream opens a Session stream over HTTP/2 to ts, in protocol p
// (streamProtocols), and sends first.
func sessionStream(t *testing.T, ctx context.Context, ts *testServer, p []connect.ClientOption, first *v1.SessionRequest) *connect.BidiStreamForClient[v1.SessionRequest, v1.SessionResponse] {
	t.Helper()
	members := keyshardv1connect.NewMemberServiceClient(h2cClient(), ts.url, append([]connect.ClientOption{connect.WithInterceptors(bearerToken(memberToken))}, p...)...)
	st := members.Session(ctx)
	// A stream the server refuses at once may be closed before the first
	// message is written: Send then reports io.EOF, and Receive the
	// server's error.
	if err := st.Send(first); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("send the first message: %v", err)
	}
	t.Cleanup(func() { _ = st.CloseRequest(); _ = st.CloseResponse() })
	return st
}

// receiveUntil receives from st until cond holds on a message, and returns
// that message; any error fails the test.
func receiveUntil(t *testing.T, st *connect.BidiStreamForClient[v1.SessionRequest, v1.SessionResponse], what string, cond func(*v1.SessionResponse) bool) *v1.SessionResponse {
	t.Helper()
	for {
		msg, err := st.Receive()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if cond(msg) {
			return msg
		}
	}
}

// TestSessionStream: a member's grants and keep-alives on one stream. The
// first keep-alive activates a pending session, whose grants then come on
// the same stream; every keep-alive is answered with its number and the
// TTL; a member that half-closes gets its last answer, then the stream
// ends cleanly. Over both protocols; gRPC connections are served by
// grpc-go's server (keyshard_api_connections_total{server="grpc"}).
func TestSessionStream(t *testing.T) {
	ts := startServer(t, nil)
	ctx := ctxT(t)
	for _, p := range streamProtocols {
		t.Run(p.name, func(t *testing.T) {
			ks := "rooms-" + p.name
			if _, err := ts.admin.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: &v1.Keyspace{Name: ks, Buckets: 8}})); err != nil {
				t.Fatal(err)
			}
			sessionStreamOver(t, ctx, ts, p.opts, ks)
		})
	}
	if got := metricLine(t, ts, `keyshard_api_connections_total{server="grpc"}`); got != 1 {
		t.Errorf("gRPC connections served by grpc-go's server: %v; want 1", got)
	}
}

func sessionStreamOver(t *testing.T, ctx context.Context, ts *testServer, p []connect.ClientOption, ks string) {
	sess := rawJoin(t, ctx, ts, ks, "a", false)
	st := sessionStream(t, ctx, ts, p, &v1.SessionRequest{Session: sess, KeepAlive: 1})

	first, err := st.Receive()
	if err != nil {
		t.Fatal(err)
	}
	if a := first.GetKeepAlive(); a.GetKeepAlive() != 1 || a.GetTtl().AsDuration() <= 0 || a.GetErrorCode() != "" {
		t.Fatalf("first message %v; want the answer to keep-alive 1 with a TTL", first)
	}
	// Active now: the map gives a every bucket, and the grants come on
	// the stream (no KeepAlive call was ever made).
	receiveUntil(t, st, "8 grants", func(m *v1.SessionResponse) bool {
		if m.GetKeepAlive() != nil {
			t.Fatalf("an answer %v to no keep-alive", m.GetKeepAlive())
		}
		return len(m.GetGrants().GetGrants()) == 8
	})
	for n := uint64(2); n <= 3; n++ {
		if err := st.Send(&v1.SessionRequest{KeepAlive: n}); err != nil {
			t.Fatal(err)
		}
		a := receiveUntil(t, st, "a keep-alive's answer", func(m *v1.SessionResponse) bool { return m.GetKeepAlive() != nil }).GetKeepAlive()
		if a.GetKeepAlive() != n || a.GetTtl().AsDuration() <= 0 || a.GetErrorCode() != "" {
			t.Fatalf("answer %v; want keep-alive %d renewed", a, n)
		}
	}
	// Half-closed after keep-alive 4: its answer comes, then the end.
	if err := st.Send(&v1.SessionRequest{Session: sess, KeepAlive: 4}); err != nil {
		t.Fatal(err)
	}
	if err := st.CloseRequest(); err != nil {
		t.Fatal(err)
	}
	receiveUntil(t, st, "keep-alive 4's answer", func(m *v1.SessionResponse) bool { return m.GetKeepAlive().GetKeepAlive() == 4 })
	if msg, err := st.Receive(); err == nil {
		for err == nil {
			if msg.GetKeepAlive() != nil {
				t.Fatalf("answer %v after the last keep-alive", msg)
			}
			msg, err = st.Receive()
		}
		if connect.CodeOf(err) != connect.CodeUnknown || err.Error() != "EOF" {
			t.Fatalf("stream ended with %v; want a clean end", err)
		}
	}
}

// TestSessionStreamEnds: a replaced session's stream ends NOT_FOUND at
// its next keep-alive, as KeepAlive answers; bad messages end the stream
// INVALID_ARGUMENT naming the field; over HTTP/1.1 the call is
// UNIMPLEMENTED, so a member knows to use WatchGrants and KeepAlive.
// Over gRPC a stream the server ends while waiting for the member's next
// message (here: the grants' sender learned of the replacement first)
// ends CANCELED (grpcbridge); the member's next stream is then NOT_FOUND.
func TestSessionStreamEnds(t *testing.T) {
	ts := startServer(t, nil)
	ctx := ctxT(t)
	if _, err := ts.admin.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "rooms", Buckets: 8}})); err != nil {
		t.Fatal(err)
	}
	sess := rawJoin(t, ctx, ts, "rooms", "b", false)
	for _, p := range streamProtocols {
		t.Run(p.name, func(t *testing.T) {
			id := "a-" + p.name
			old := rawJoin(t, ctx, ts, "rooms", id, false)
			st := sessionStream(t, ctx, ts, p.opts, &v1.SessionRequest{Session: old, KeepAlive: 1})
			receiveUntil(t, st, "keep-alive 1's answer", func(m *v1.SessionResponse) bool { return m.GetKeepAlive().GetKeepAlive() == 1 })
			rawJoin(t, ctx, ts, "rooms", id, true) // a restarted process takes the id over
			// The stream may have ended already (the grants' sender
			// learned of the replacement first): Send then reports
			// io.EOF, and Receive how it ended.
			if err := st.Send(&v1.SessionRequest{KeepAlive: 2}); err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			for {
				msg, err := st.Receive()
				if err == nil {
					if a := msg.GetKeepAlive(); a != nil {
						t.Fatalf("keep-alive of a replaced session answered %v; want the stream to end NOT_FOUND", a)
					}
					continue
				}
				if p.name == "grpc" && connect.CodeOf(err) == connect.CodeCanceled {
					st = sessionStream(t, ctx, ts, p.opts, &v1.SessionRequest{Session: old, KeepAlive: 3})
					continue
				}
				if connect.CodeOf(err) != connect.CodeNotFound {
					t.Fatalf("replaced session's stream ended with %v; want NOT_FOUND", err)
				}
				break
			}

			for _, tc := range []struct {
				name        string
				first, next *v1.SessionRequest
				want        string
			}{
				{"no session", &v1.SessionRequest{KeepAlive: 1}, nil, "session: missing"},
				{"keep-alive 0 after the first", &v1.SessionRequest{Session: sess}, &v1.SessionRequest{}, "keep_alive: 0"},
				{"another session", &v1.SessionRequest{Session: sess}, &v1.SessionRequest{Session: old, KeepAlive: 1}, "another session"},
			} {
				st := sessionStream(t, ctx, ts, p.opts, tc.first)
				if tc.next != nil {
					// io.EOF: the stream has ended already; Receive
					// says how.
					if err := st.Send(tc.next); err != nil && !errors.Is(err, io.EOF) {
						t.Fatal(err)
					}
				}
				var err error
				for err == nil {
					_, err = st.Receive()
				}
				if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: stream ended with %v; want INVALID_ARGUMENT naming %q", tc.name, err, tc.want)
				}
			}
		})
	}

	http1 := keyshardv1connect.NewMemberServiceClient(&http.Client{Transport: &http.Transport{}}, ts.url, connect.WithInterceptors(bearerToken(memberToken)))
	st1 := http1.Session(ctx)
	_ = st1.Send(&v1.SessionRequest{Session: sess, KeepAlive: 1})
	_, err := st1.Receive()
	if connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Fatalf("Session over HTTP/1.1: %v; want UNIMPLEMENTED", err)
	}
	_ = st1.CloseRequest()
	_ = st1.CloseResponse()
}

// TestSessionStreamGates: a Session stream passes the gates every call
// passes, in both protocols (over gRPC in protobuf, served on grpc-go's
// stream without connect's handler): the member token, and the request
// limit on each message, which over gRPC names its flag.
func TestSessionStreamGates(t *testing.T) {
	ts := startServer(t, func(c *server.Config) { c.Limits.MaxRequestBytes = 1000 })
	ctx := ctxT(t)
	open := func(p []connect.ClientOption, token string, first *v1.SessionRequest) error {
		t.Helper()
		opts := p
		if token != "" {
			opts = append([]connect.ClientOption{connect.WithInterceptors(bearerToken(token))}, p...)
		}
		st := keyshardv1connect.NewMemberServiceClient(h2cClient(), ts.url, opts...).Session(ctx)
		defer func() { _ = st.CloseRequest(); _ = st.CloseResponse() }()
		if err := st.Send(first); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		msg, err := st.Receive()
		if err == nil {
			t.Fatalf("the stream answered %v; want it refused", msg)
		}
		return err
	}
	small := &v1.SessionRequest{Session: "s", KeepAlive: 1}
	for _, p := range streamProtocols {
		t.Run(p.name, func(t *testing.T) {
			wantCode(t, open(p.opts, "", small), connect.CodeUnauthenticated, "missing bearer token")
			wantCode(t, open(p.opts, "not-a-real-token-at-all", small), connect.CodeUnauthenticated, "unknown bearer token")
			wantCode(t, open(p.opts, adminToken, small), connect.CodePermissionDenied, "needs a member token")
			big := &v1.SessionRequest{Session: strings.Repeat("s", 2000), KeepAlive: 1}
			msg := "" // connect's own limit, over the Connect protocol
			if p.name == "grpc" {
				msg = "this replica takes at most 1000 (--max-request-bytes, limits.max_request_bytes)"
			}
			wantCode(t, open(p.opts, memberToken, big), connect.CodeResourceExhausted, msg)
		})
	}
}
