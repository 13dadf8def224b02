package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/client/clienttest"
)

const sessionsProc = keyshardv1connect.MemberServiceSessionsProcedure

// startShared starts worker id on c (which shares Sessions streams) and
// returns it with its handler and session once its first keep-alive (a
// KeepAlive call) was answered and bucket, granted to it then, was
// acquired: its part of the shared stream is open and carries its next
// keep-alives.
func startShared(t *testing.T, f fake, c *Client, id string, bucket int, opts ...WorkerOption) (*testWorker, *recHandler, string) {
	t.Helper()
	h := newRecHandler(t)
	w := newTestMember(t, c, id, h, opts...)
	joined := f.Clock().Now()
	w.start(t)
	sid := w.waitEvent(t, EventJoined).Session
	w.renewedFrom(t, joined, id+"'s first keep-alive")
	if ka := f.KeepAlives().Next(t); ka.GetSession() != sid {
		t.Fatalf("first keep-alive for %q, want %q", ka.GetSession(), sid)
	}
	streamUp(t, f, h, sid, bucket)
	return w, h, sid
}

// sessionsLog reads the messages of the fake's Sessions stream (one
// stream: ids are the stream's).
type sessionsLog struct {
	f   fake
	ids map[uint32]string // id → its session, from the opens
}

// take takes every message recorded so far and returns the sessions they
// opened, and the sessions each keep-alive message renewed, in order.
func (l *sessionsLog) take(t *testing.T) (opened []string, keepAlives [][]string) {
	t.Helper()
	if l.ids == nil {
		l.ids = map[uint32]string{}
	}
	for l.f.SessionsMessages().Len() > 0 {
		msg := l.f.SessionsMessages().Next(t)
		for _, o := range msg.GetOpen() {
			l.ids[o.GetId()] = o.GetSession()
			opened = append(opened, o.GetSession())
		}
		if msg.GetKeepAlive() == 0 {
			continue
		}
		var renew []string
		for _, id := range msg.GetRenew() {
			renew = append(renew, l.ids[id])
		}
		keepAlives = append(keepAlives, renew)
	}
	return opened, keepAlives
}

// dialShared returns a Client of the fake that shares Sessions streams,
// with no keep-alive window (each keep-alive goes at once), so that
// keep-alives that fall due together need no more time to go.
func dialShared(t *testing.T, f fake, opts ...Option) *Client {
	t.Helper()
	c := f.dial(t, append([]Option{GRPC(), SharedSessionStreams()}, opts...)...)
	c.shared.window = 0
	return c
}

// TestWorkerSharedSessions: with SharedSessionStreams the workers of a
// Client follow their sessions on one Sessions stream: each gets its own
// grants on it, and after each one's first keep-alive (a KeepAlive call)
// their keep-alives ride on it, those that fall due within the window of
// the previous keep-alive message together in the next. Each renewal
// moves its worker's fence deadline from when the worker asked for it.
func TestWorkerSharedSessions(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	c := f.dial(t, GRPC(), SharedSessionStreams())
	t0 := f.Clock().Now()
	w1, _, sid1 := startShared(t, f, c, "w1", 1)
	// The others join half a window later: their keep-alives fall due
	// within the window of w1's.
	f.Clock().Advance(sessionsWindow / 2)
	ws := []*testWorker{w1}
	sids := []string{sid1}
	for i := 2; i <= 4; i++ {
		w, _, sid := startShared(t, f, c, fmt.Sprintf("w%d", i), i)
		ws, sids = append(ws, w), append(sids, sid)
	}
	if n := f.CallCount(sessionsProc); n != 1 {
		t.Fatalf("%d Sessions calls, want one shared by the 4 workers", n)
	}
	log := sessionsLog{f: f}
	if opened, _ := log.take(t); !slices.Equal(opened, sids) {
		t.Errorf("sessions opened on the stream: %v, want %v", opened, sids)
	}

	// w1's keep-alive goes at once ...
	f.Clock().MustBlockUntil(t, 8) // each worker's keep-alive and fence timers
	f.Clock().Advance(t0.Add(testTTL / 3).Sub(f.Clock().Now()))
	w1.renewedFrom(t, f.Clock().Now(), "w1's keep-alive on the shared stream")
	// ... the others', due half a window later, wait for the window.
	f.Clock().Advance(sessionsWindow / 2)
	sent := f.Clock().Now()
	f.Clock().MustBlockUntil(t, 12) // + the three keep-alives' bounds and the window
	if _, msgs := log.take(t); len(msgs) != 1 || !slices.Equal(msgs[0], []string{sid1}) {
		t.Fatalf("keep-alive messages before the window passed: %v; want one renewing w1", msgs)
	}
	f.Clock().Advance(sessionsWindow / 2)
	for i, w := range ws[1:] {
		w.renewedFrom(t, sent, fmt.Sprintf("w%d's keep-alive on the shared stream", i+2))
	}
	_, msgs := log.take(t)
	if len(msgs) != 1 || len(msgs[0]) != 3 {
		t.Fatalf("keep-alive messages after the window: %v; want one renewing w2, w3 and w4", msgs)
	}
	slices.Sort(msgs[0])
	if want := slices.Sorted(slices.Values(sids[1:])); !slices.Equal(msgs[0], want) {
		t.Errorf("the second keep-alive renewed %v, want %v", msgs[0], want)
	}
	for i, sid := range sids {
		if got, want := f.LeaseExpiry(sid), f.Clock().Now().Add(testTTL); i > 0 && !got.Equal(want) {
			t.Errorf("%s: the fake's lease runs to %v, want %v", sid, got, want)
		}
	}
	if s, k, ka, sessions, watches := f.CallCount(sessionsProc), f.StreamKeepAlives(), f.CallCount(keepAliveProc), f.CallCount(sessionProc), f.CallCount(watchProc); s != 1 || k != 4 || ka != 4 || sessions != 0 || watches != 0 {
		t.Errorf("%d Sessions calls, %d keep-alives on streams, %d KeepAlive calls, %d Session calls, %d WatchGrants calls; want 1, 4, 4, 0, 0", s, k, ka, sessions, watches)
	}

	// Workers that leave close their part; the last one closes the
	// stream, and the Client's Close waits for its goroutines.
	for _, w := range ws {
		if err := w.Close(context.Background()); err != nil {
			t.Errorf("Close = %v", err)
		}
		w.noLoss(t)
	}
	c.Close()
	c.shared.mu.Lock()
	defer c.shared.mu.Unlock()
	if n := len(c.shared.byEp); n != 0 {
		t.Errorf("%d shared streams after every worker left", n)
	}
}

// TestWorkerSharedSessionsEnded: a session that ends at the server (its
// lease ran out) ends only its worker's part of the shared stream: that
// worker fences and re-joins on the same stream, while the others keep
// their grants and keep alive on it.
func TestWorkerSharedSessionsEnded(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	c := dialShared(t, f)
	w1, h1, sid1 := startShared(t, f, c, "w1", 1)
	w2, h2, sid2 := startShared(t, f, c, "w2", 2)
	w3, _, _ := startShared(t, f, c, "w3", 3)

	f.EndSession(sid2)
	ev := w2.waitEvent(t, EventFenced)
	if ev.Session != sid2 || !errors.Is(ev.Err, ErrSessionLost) || !strings.Contains(ev.Err.Error(), "the server ended the session") {
		t.Errorf("fenced event = %+v; want session %s ended by the server", ev, sid2)
	}
	if rel := recv(t, h2.releases, "w2's Release after the fence"); rel.bucket != 2 {
		t.Errorf("w2 released bucket %d, want 2", rel.bucket)
	}
	new2 := w2.waitEvent(t, EventRejoined).Session
	recv(t, w2.renewed, "the new session's first keep-alive")
	if ka := f.KeepAlives().Next(t); ka.GetSession() != new2 {
		t.Fatalf("keep-alive for %q, want the new session %s's first", ka.GetSession(), new2)
	}
	streamUp(t, f, h2, new2, 5)

	// The others held on: no loss, and w1 gets a new grant on the stream.
	streamUp(t, f, h1, sid1, 6)
	w1.waitFor(t, "w1 to hold buckets 1 and 6", func() bool {
		gs1, gs6 := w1.grants[1], w1.grants[6]
		return gs1 != nil && gs1.acquired && !gs1.ending && gs6 != nil && gs6.acquired && !gs6.ending
	})
	w1.noLoss(t)
	w3.noLoss(t)
	if n := f.CallCount(sessionsProc); n != 1 {
		t.Errorf("%d Sessions calls, want 1: the new session opened on the same stream", n)
	}
	// All three keep alive on the stream.
	f.Clock().MustBlockUntil(t, 6)
	f.Clock().Advance(testTTL / 3)
	for _, w := range []*testWorker{w1, w2, w3} {
		recv(t, w.renewed, "a renewal on the shared stream")
	}
	if k := f.StreamKeepAlives(); k != 3 {
		t.Errorf("%d keep-alives on the stream, want 3", k)
	}
}

// TestWorkerSharedSessionsCut: a shared stream that is cut ends every
// worker's part: each follower reconnects after its backoff, and the
// first to do so opens a new shared stream that the others join; the
// keep-alives then ride on it. No session is lost.
func TestWorkerSharedSessionsCut(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	c := dialShared(t, f)
	var ws []*testWorker
	var hs []*recHandler
	var sids []string
	for i := 1; i <= 3; i++ {
		w, h, sid := startShared(t, f, c, fmt.Sprintf("w%d", i), i)
		ws, hs, sids = append(ws, w), append(hs, h), append(sids, sid)
	}
	log := sessionsLog{f: f}
	log.take(t) // the opens

	f.EndStreams()
	f.Clock().MustBlockUntil(t, 12) // per worker: keep-alive, fence, and the grant and map streams' backoff
	f.Clock().Advance(backoffBase)
	var opened []string
	for len(opened) < 3 {
		for _, o := range f.SessionsMessages().Next(t).GetOpen() {
			opened = append(opened, o.GetSession())
		}
	}
	slices.Sort(opened)
	if !slices.Equal(opened, sids) {
		t.Errorf("sessions opened again: %v, want %v", opened, sids)
	}
	for i, h := range hs {
		streamUp(t, f, h, sids[i], 10+i) // grants come on the new stream
	}
	if n := f.CallCount(sessionsProc); n != 2 {
		t.Errorf("%d Sessions calls, want 2: the first and the one after the cut", n)
	}
	f.Clock().Advance(testTTL/3 - backoffBase)
	for _, w := range ws {
		recv(t, w.renewed, "a renewal on the new stream")
	}
	if k, ka := f.StreamKeepAlives(), f.CallCount(keepAliveProc); k != 3 || ka != 3 {
		t.Errorf("%d keep-alives on streams, %d KeepAlive calls; want 3 and 3", k, ka)
	}
	for _, w := range ws {
		w.noLoss(t)
	}
}

// TestWorkerSharedSessionsStuckReplica: a keep-alive that the shared
// stream's replica does not answer within its bound (its share of the
// time left) ends the whole stream: every worker's keep-alive in flight
// on it is made again at once, at the other replica, where the workers
// share the next stream.
func TestWorkerSharedSessionsStuckReplica(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	a, b := f.AddReplica(), f.AddReplica()
	c := dialReplicas(t, f, []*clienttest.Replica{a, b}, GRPC(), SharedSessionStreams())
	logs := make(chan string, 1024)
	t0 := f.Clock().Now()
	w1, h1, sid1 := startShared(t, f, c, "w1", 1, Logger(slog.New(msgHandler(logs))))
	f.Clock().Advance(time.Second)
	w2, h2, sid2 := startShared(t, f, c, "w2", 2)
	if n := a.CallCount(sessionsProc); n != 1 {
		t.Fatalf("%d Sessions calls at the first replica, want 1", n)
	}

	gate := f.HoldKeepAlives() // the stream's replica does not answer
	f.Clock().MustBlockUntil(t, 4)
	f.Clock().Advance(testTTL/3 - time.Second) // w1's keep-alive, at t0+3s
	if ka := f.KeepAlives().Next(t); ka.GetSession() != sid1 {
		t.Fatalf("keep-alive for %q, want w1's", ka.GetSession())
	}
	f.Clock().MustBlockUntil(t, 5) // + its bound
	f.Clock().Advance(time.Second) // w2's, at t0+4s
	if ka := f.KeepAlives().Next(t); ka.GetSession() != sid2 {
		t.Fatalf("keep-alive for %q, want w2's", ka.GetSession())
	}
	f.Clock().MustBlockUntil(t, 6)
	// w1's is abandoned after half the time left to its deadline (t0+8.1s) ...
	margin := testTTL / 10
	share := (testTTL - margin - testTTL/3) / 2
	f.Clock().Advance(t0.Add(testTTL/3 + share - time.Nanosecond).Sub(f.Clock().Now()))
	if n := f.CallCount(keepAliveProc); n != 2 {
		t.Fatalf("%d KeepAlive calls before w1's keep-alive's bound; want the first two only", n)
	}
	f.Clock().Advance(time.Nanosecond)
	// ... with the stream: both are made again at once, at the other replica.
	retried := f.Clock().Now()
	got := []string{f.KeepAlives().Next(t).GetSession(), f.KeepAlives().Next(t).GetSession()}
	slices.Sort(got)
	if !slices.Equal(got, []string{sid1, sid2}) {
		t.Fatalf("keep-alives made again for %v, want both sessions", got)
	}
	if n := b.CallCount(keepAliveProc); n != 2 {
		t.Fatalf("%d KeepAlive calls at the other replica, want 2", n)
	}
	if c.URL() != b.URL() {
		t.Errorf("URL() = %q, want %q", c.URL(), b.URL())
	}
	gate.Open()
	w1.renewedFrom(t, retried, "w1's renewal at the other replica")
	w2.renewedFrom(t, retried, "w2's renewal at the other replica")
	for msg := ""; !strings.Contains(msg, fmt.Sprintf("the keep-alive of session %s not answered within %v", sid1, share)); {
		msg = recv(t, logs, "the log of the abandoned keep-alive")
	}

	f.Clock().MustBlockUntil(t, 8) // per worker: keep-alive, fence, and both streams' backoff
	f.Clock().Advance(backoffBase)
	streamUp(t, f, h1, sid1, 4)
	streamUp(t, f, h2, sid2, 5)
	if n := b.CallCount(sessionsProc); n != 1 {
		t.Errorf("%d Sessions calls at the other replica, want 1 shared by both workers", n)
	}
	w1.noLoss(t)
	w2.noLoss(t)
}

// TestWorkerSharedSessionsErrorAnswer: a renewal answered with an error
// on the shared stream (the session may still live: etcd unreachable) is
// a failed keep-alive, retried after the short backoff on the same
// stream, as on a Session stream.
func TestWorkerSharedSessionsErrorAnswer(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	logs := make(chan string, 1024)
	c := f.dial(t, GRPC(), SharedSessionStreams(), Logger(slog.New(msgHandler(logs))))
	w, _, _ := startShared(t, f, c, "w1", 3)

	f.SetKeepAlives(clienttest.KeepAliveFail)
	f.Clock().MustBlockUntil(t, 2)
	f.Clock().Advance(testTTL / 3)
	f.KeepAlives().Next(t)
	for msg := ""; !strings.HasPrefix(msg, "keyshard: keep-alive failed; retrying"); {
		msg = recv(t, logs, "the failed keep-alive's log")
		if strings.HasPrefix(msg, "keyshard: keep-alive failed; retrying") &&
			(!strings.Contains(msg, "keyshard: unavailable: etcd is unreachable") || !strings.Contains(msg, "answered on the Sessions stream")) {
			t.Errorf("log %q; want the answer's code and message", msg)
		}
	}
	f.SetKeepAlives(clienttest.KeepAliveServe)
	f.Clock().MustBlockUntilDue(t, 1, keepAliveRetry) // the retry's timer
	f.Clock().Advance(keepAliveRetry)
	asked := f.Clock().Now()
	// The retry waits for the window since the failed keep-alive's
	// message.
	f.Clock().MustBlockUntilDue(t, 1, sessionsWindow-keepAliveRetry)
	f.Clock().Advance(sessionsWindow - keepAliveRetry)
	w.renewedFrom(t, asked, "the renewal by the retry")
	if s, k, ka := f.CallCount(sessionsProc), f.StreamKeepAlives(), f.CallCount(keepAliveProc); s != 1 || k != 2 || ka != 1 {
		t.Errorf("%d Sessions calls, %d keep-alives on streams, %d KeepAlive calls; want 1, 2, 1", s, k, ka)
	}
	w.noLoss(t)
}
