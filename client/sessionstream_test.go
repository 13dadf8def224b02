package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/client/clienttest"
)

const (
	sessionProc   = keyshardv1connect.MemberServiceSessionProcedure
	keepAliveProc = keyshardv1connect.MemberServiceKeepAliveProcedure
	watchProc     = keyshardv1connect.MemberServiceWatchGrantsProcedure
)

// h2c returns an http.Client that speaks HTTP/2 without TLS (prior
// knowledge), for the Connect protocol over HTTP/2.
func h2c() *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: tr}
}

// streamUp grants bucket to session sid and waits until the worker
// acquired it: its grants stream is up. A Session stream carries the
// keep-alives from its first answer on, so it does once streamUp returns.
func streamUp(t *testing.T, f fake, h *recHandler, sid string, bucket int) {
	t.Helper()
	tok := f.Grant(sid, bucket)
	if a := recv(t, h.acquires, "Acquire"); a.g != (Grant{Bucket: bucket, Token: tok}) {
		t.Fatalf("Acquire(%+v), want bucket %d at %d", a.g, bucket, tok)
	}
}

// renewedFrom receives the worker's next renewal and fails the test
// unless it moved the fence deadline to sent + TTL − margin, for a
// keep-alive sent at sent.
func (tw *testWorker) renewedFrom(t *testing.T, sent time.Time, what string) {
	t.Helper()
	margin := testTTL / 10
	if d := recv(t, tw.renewed, what); !d.Equal(sent.Add(testTTL - margin)) {
		t.Errorf("%s: deadline = send%+v, want send + TTL − margin (%v)", what, d.Sub(sent), testTTL-margin)
	}
}

// wantPaths fails the test unless the fake counted sessions Session
// calls, onStreams keep-alives on Session streams, and calls KeepAlive
// calls.
func wantPaths(t *testing.T, f fake, sessions, onStreams, calls int) {
	t.Helper()
	if s, k, ka := f.CallCount(sessionProc), f.StreamKeepAlives(), f.CallCount(keepAliveProc); s != sessions || k != onStreams || ka != calls {
		t.Errorf("%d Session calls, %d keep-alives on Session streams, %d KeepAlive calls; want %d, %d, %d", s, k, ka, sessions, onStreams, calls)
	}
}

// startOnStream starts a worker on c (which speaks HTTP/2) with opts and
// returns it with its handler and session once its first keep-alive (a
// KeepAlive call) was answered and its Session stream carries the next
// ones; bucket 3 is granted to it then.
func startOnStream(t *testing.T, f fake, c *Client, opts ...WorkerOption) (*testWorker, *recHandler, string) {
	t.Helper()
	h := newRecHandler(t)
	w := newTestWorkerOn(t, c, h, opts...)
	joined := f.Clock().Now() // the Join and the first keep-alive are sent now
	w.start(t)
	sid := w.waitEvent(t, EventJoined).Session
	w.renewedFrom(t, joined, "the first keep-alive")
	if ka := f.KeepAlives().Next(t); ka.GetSession() != sid {
		t.Fatalf("first keep-alive for %q, want %q", ka.GetSession(), sid)
	}
	streamUp(t, f, h, sid, 3)
	return w, h, sid
}

// TestWorkerSessionStream: over HTTP/2 (gRPC, or the Connect protocol
// over h2c) a worker's grants and keep-alives ride one Session stream.
// The first keep-alive goes as a KeepAlive call right after the Join; the
// next ones go on the stream, TTL/3 after the previous send, each
// renewing the session and moving the fence deadline to its send + TTL −
// margin, as KeepAlive calls do. No WatchGrants and no other KeepAlive
// call is made.
func TestWorkerSessionStream(t *testing.T) {
	for name, opt := range map[string]Option{"grpc": GRPC(), "connect over h2c": HTTPClient(h2c())} {
		t.Run(name, func(t *testing.T) {
			f := newFake(t)
			f.AddKeyspace("rooms", 16, testTTL)
			w, h, sid := startOnStream(t, f, f.dial(t, opt))
			if first := f.SessionStreams().Next(t); first.GetSession() != sid || first.GetKeepAlive() != 0 {
				t.Fatalf("the Session stream opened with %v; want session %s and no keep-alive", first, sid)
			}
			for i := 1; i <= 4; i++ {
				f.Clock().MustBlockUntil(t, 2) // the keep-alive and fence timers
				f.Clock().Advance(testTTL / 3)
				sent := f.Clock().Now()
				if ka := f.KeepAlives().Next(t); ka.GetSession() != sid {
					t.Fatalf("keep-alive %d for %q, want %q", i, ka.GetSession(), sid)
				}
				w.renewedFrom(t, sent, fmt.Sprintf("keep-alive %d on the stream", i))
				if got := f.LeaseExpiry(sid); !got.Equal(sent.Add(testTTL)) {
					t.Fatalf("keep-alive %d: the fake's lease runs to send%+v, want send+%v", i, got.Sub(sent), testTTL)
				}
			}
			wantPaths(t, f, 1, 4, 1) // the first keep-alive went before the stream was up
			if n := f.CallCount(watchProc); n != 0 {
				t.Errorf("%d WatchGrants calls, want 0", n)
			}
			if err := w.Close(context.Background()); err != nil {
				t.Errorf("Close = %v", err)
			}
			w.noLoss(t)
			h.heldNone()
		})
	}
}

// TestWorkerSessionStreamCut: a Session stream cut while a keep-alive is
// in flight on it fails that keep-alive at once, and the worker makes it
// again at once as a KeepAlive call (the clock does not move), then keeps
// alive on the next stream. The session is never fenced.
func TestWorkerSessionStreamCut(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	logs := make(chan string, 1024)
	w, h, sid := startOnStream(t, f, f.dial(t, GRPC()), Logger(slog.New(msgHandler(logs))))

	gate := f.HoldKeepAlives()
	f.Clock().MustBlockUntil(t, 2)
	f.Clock().Advance(testTTL / 3)
	sent := f.Clock().Now()
	f.KeepAlives().Next(t) // on the stream, held
	if n := f.StreamKeepAlives(); n != 1 {
		t.Fatalf("%d keep-alives on the stream, want 1", n)
	}
	f.EndStreams()
	f.KeepAlives().Next(t) // made again at once ...
	if n := f.CallCount(keepAliveProc); n != 2 {
		t.Fatalf("%d KeepAlive calls, want 2: the first, and the cut keep-alive made again", n)
	}
	if now := f.Clock().Now(); !now.Equal(sent) {
		t.Fatalf("the clock moved")
	}
	gate.Open() // ... and answered
	w.renewedFrom(t, sent, "the renewal by the retry")
	for msg := ""; !strings.HasPrefix(msg, "keyshard: keep-alive's stream ended before its answer; retrying at once"); {
		msg = recv(t, logs, "the log of the cut keep-alive")
	}

	// The grants stream reconnects after its backoff, and carries the
	// keep-alives again.
	f.Clock().MustBlockUntil(t, 4) // keep-alive, fence, and the grant and map streams' backoff
	f.Clock().Advance(backoffBase)
	f.SessionStreams().Next(t)
	streamUp(t, f, h, sid, 4)
	f.Clock().Advance(testTTL/3 - backoffBase)
	w.renewedFrom(t, f.Clock().Now(), "a renewal on the new stream")
	wantPaths(t, f, 2, 2, 2)
	w.noLoss(t)
}

// TestWorkerSessionStreamStuckReplica: a keep-alive that the replica
// holding the Session stream does not answer is abandoned after its share
// of the time left (as a call's first attempt is), the stream with it,
// and made at once at the other replica, which streams next.
func TestWorkerSessionStreamStuckReplica(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	a, b := f.AddReplica(), f.AddReplica()
	c := dialReplicas(t, f, []*clienttest.Replica{a, b}, GRPC())
	logs := make(chan string, 1024)
	w, h, sid := startOnStream(t, f, c, Logger(slog.New(msgHandler(logs))))
	if n := a.CallCount(sessionProc); n != 1 {
		t.Fatalf("%d Session calls at the first replica, want 1", n)
	}

	gate := f.HoldKeepAlives() // the stream's replica does not answer
	f.Clock().MustBlockUntil(t, 2)
	f.Clock().Advance(testTTL / 3)
	f.KeepAlives().Next(t)
	// Abandoned after half the time left to the deadline (t0+8.1s) ...
	margin := testTTL / 10
	share := (testTTL - margin - testTTL/3) / 2
	f.Clock().MustBlockUntil(t, 3) // keep-alive, fence, and the keep-alive's bound
	f.Clock().Advance(share - time.Nanosecond)
	if n := f.CallCount(keepAliveProc); n != 1 {
		t.Fatalf("the keep-alive was made again before its share of the time left")
	}
	f.Clock().Advance(time.Nanosecond)
	// ... and made again at once, at the other replica.
	if ka := f.KeepAlives().Next(t); ka.GetSession() != sid {
		t.Fatalf("keep-alive for %q", ka.GetSession())
	}
	if n := b.CallCount(keepAliveProc); n != 1 {
		t.Fatalf("%d KeepAlive calls at the other replica, want 1", n)
	}
	if c.URL() != b.URL() {
		t.Errorf("URL() = %q, want %q", c.URL(), b.URL())
	}
	retried := f.Clock().Now()
	gate.Open()
	w.renewedFrom(t, retried, "the renewal at the other replica")
	for msg := ""; !strings.Contains(msg, "keep-alive 1 not answered within "+share.String()); {
		msg = recv(t, logs, "the log of the abandoned keep-alive")
	}
	f.Clock().MustBlockUntil(t, 4) // keep-alive, fence, and both streams' backoff
	f.Clock().Advance(backoffBase)
	streamUp(t, f, h, sid, 4)
	if n := b.CallCount(sessionProc); n != 1 {
		t.Errorf("%d Session calls at the other replica, want 1", n)
	}
	w.noLoss(t)
}

// infoLog collects the messages of a logger's records at Info and above.
type infoLog struct {
	mu   sync.Mutex
	msgs []string
}

func (l *infoLog) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelInfo }
func (l *infoLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	return nil
}
func (l *infoLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *infoLog) WithGroup(string) slog.Handler      { return l }

func (l *infoLog) count(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
}

// TestWorkerSessionStreamUnimplemented: when a Session stream (or, with
// SharedSessionStreams, a Sessions stream) is answered UNIMPLEMENTED (an
// older server, a transport that speaks HTTP/1.1), or cannot be had (the
// default transport over http://), the Client's workers follow their
// grants with WatchGrants and keep alive with KeepAlive calls, for the
// rest of the Client's life: a second worker does not try again. The
// Client logs it once.
func TestWorkerSessionStreamUnimplemented(t *testing.T) {
	for _, kind := range []struct {
		name        string
		proc, other string   // the stream the workers open, and the one they must not
		opts        []Option // what makes them open it
	}{
		{"Session", sessionProc, sessionsProc, nil},
		{"Sessions", sessionsProc, sessionProc, []Option{SharedSessionStreams()}},
	} {
		for _, tc := range []struct {
			name     string
			opt      Option
			fail     bool // the fake answers the stream UNIMPLEMENTED
			sessions int  // stream calls made
		}{
			{"older server", GRPC(), true, 1},
			{"HTTP/1.1 transport", HTTPClient(&http.Client{Transport: &http.Transport{}}), false, 1},
			{"default transport over http", nil, false, 0},
		} {
			t.Run(kind.name+"/"+tc.name, func(t *testing.T) {
				f := newFake(t)
				f.AddKeyspace("rooms", 16, testTTL)
				if tc.fail {
					f.Fail(kind.proc, connect.NewError(connect.CodeUnimplemented, errors.New("an older server")))
				}
				var log infoLog
				c := f.dial(t, append([]Option{tc.opt, Logger(slog.New(&log))}, kind.opts...)...)
				h := newRecHandler(t)
				w := newTestWorkerOn(t, c, h)
				w.start(t)
				sid := w.waitEvent(t, EventJoined).Session
				recv(t, w.renewed, "the first keep-alive")
				streamUp(t, f, h, sid, 3) // on WatchGrants, opened after the fallback

				// A second worker of the Client goes straight to WatchGrants.
				h2 := newRecHandler(t)
				w2 := newTestMember(t, c, "w2", h2)
				w2.start(t)
				sid2 := w2.waitEvent(t, EventJoined).Session
				recv(t, w2.renewed, "the second worker's first keep-alive")
				streamUp(t, f, h2, sid2, 5)

				f.Clock().MustBlockUntil(t, 4) // each worker's keep-alive and fence timers
				f.Clock().Advance(testTTL / 3)
				recv(t, w.renewed, "a renewal")
				recv(t, w2.renewed, "a renewal of the second worker")
				if s, o, k, ka := f.CallCount(kind.proc), f.CallCount(kind.other), f.StreamKeepAlives(), f.CallCount(keepAliveProc); s != tc.sessions || o != 0 || k != 0 || ka != 4 {
					t.Errorf("%d %s calls, %d of the other stream, %d keep-alives on streams, %d KeepAlive calls; want %d, 0, 0, 4", s, kind.name, o, k, ka, tc.sessions)
				}
				if n := f.CallCount(watchProc); n != 2 {
					t.Errorf("%d WatchGrants calls, want 2", n)
				}
				if n := log.count("keyshard: workers keep alive with KeepAlive calls and follow grants with WatchGrants"); n != 1 {
					t.Errorf("logged the fallback %d times, want once", n)
				}
			})
		}
	}
}

// TestWorkerSessionStreamErrorAnswer: a keep-alive answered on the stream
// with an error (the session may still live: etcd unreachable) is a
// failed keep-alive, retried after the short backoff, on the same stream.
func TestWorkerSessionStreamErrorAnswer(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	logs := make(chan string, 1024)
	w, _, _ := startOnStream(t, f, f.dial(t, GRPC()), Logger(slog.New(msgHandler(logs))))

	f.SetKeepAlives(clienttest.KeepAliveFail)
	f.Clock().MustBlockUntil(t, 2)
	f.Clock().Advance(testTTL / 3)
	f.KeepAlives().Next(t)
	for msg := ""; !strings.HasPrefix(msg, "keyshard: keep-alive failed; retrying"); {
		msg = recv(t, logs, "the failed keep-alive's log")
		if strings.HasPrefix(msg, "keyshard: keep-alive failed; retrying") &&
			(!strings.Contains(msg, "keyshard: unavailable: etcd is unreachable") || !strings.Contains(msg, "answered on the Session stream")) {
			t.Errorf("log %q; want the answer's code and message", msg)
		}
	}
	f.SetKeepAlives(clienttest.KeepAliveServe)
	f.Clock().MustBlockUntilDue(t, 1, keepAliveRetry) // the retry's timer
	f.Clock().Advance(keepAliveRetry)
	w.renewedFrom(t, f.Clock().Now(), "the renewal by the retry")
	wantPaths(t, f, 1, 2, 1)
	w.noLoss(t)
}

// TestWorkerSessionStreamNotFound: a Session stream whose session ended
// (its keep-alive finds it gone) ends NOT_FOUND: the worker fences, the
// keep-alive is not made again, and the worker re-joins with a new
// session.
func TestWorkerSessionStreamNotFound(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	w, h, sid := startOnStream(t, f, f.dial(t, GRPC()))

	gate := f.HoldKeepAlives()
	f.Clock().MustBlockUntil(t, 2)
	f.Clock().Advance(testTTL / 3)
	f.KeepAlives().Next(t) // on the stream, held ...
	f.EndSession(sid)      // ... while the session's lease runs out
	gate.Pass()
	ev := w.waitEvent(t, EventFenced)
	if ev.Session != sid || !errors.Is(ev.Err, ErrSessionLost) || !strings.Contains(ev.Err.Error(), "the server ended the session") {
		t.Errorf("fenced event = %+v; want session %s ended by the server", ev, sid)
	}
	if rel := recv(t, h.releases, "Release after the fence"); rel.bucket != 3 || rel.grantCtxErr == nil {
		t.Errorf("Release(%d) with grant ctx err %v", rel.bucket, rel.grantCtxErr)
	}
	w.waitEvent(t, EventSessionLost)
	sid2 := w.waitEvent(t, EventRejoined).Session
	if ka := f.KeepAlives().Next(t); ka.GetSession() != sid2 {
		t.Errorf("keep-alive for %q after the stream ended NOT_FOUND; want the new session %s's first", ka.GetSession(), sid2)
	}
	gate.Open()
	recv(t, w.renewed, "the new session's first keep-alive")
	if n := f.StreamKeepAlives(); n != 1 {
		t.Errorf("%d keep-alives on streams, want 1", n)
	}
}
