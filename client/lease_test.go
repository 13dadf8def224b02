package client

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/client/clienttest"
	"github.com/keyshard/keyshard/clock/clocktest"
	"github.com/keyshard/keyshard/placement"
)

// pausedClock is the time a process sees when it resumes from a pause:
// jump moves Now forward while the timers, which run on the fake clock
// underneath, have not fired yet (the process has not run since); resume
// lets them fire.
type pausedClock struct {
	*clocktest.Fake
	mu    sync.Mutex
	ahead time.Time // Now is at least this
}

func (c *pausedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := c.Fake.Now(); now.After(c.ahead) {
		return now
	}
	return c.ahead
}

func (c *pausedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// jump moves Now to t without firing any timer.
func (c *pausedClock) jump(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ahead = t
}

// resume advances the fake clock to Now, firing the timers due by then.
func (c *pausedClock) resume() {
	c.Fake.Advance(c.Now().Sub(c.Fake.Now()))
}

// TestWorkerPausedPastDeadline: a process paused past its fence deadline
// (its clock jumps while none of its timers has run yet) is told at once,
// by the clock, that its grant is no longer valid: Owns, Held,
// Grant.Valid, Grant.Deadline and the grant context's Err all say so
// before the keep-alive loop has fenced anything.
func TestWorkerPausedPastDeadline(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	f.SetMap("rooms", members("w1"), func(int) string { return "w1" })
	h := newRecHandler(t)
	clk := &pausedClock{Fake: f.Clock()}
	w := newTestWorker(t, f, h, Clock(clk))
	t0 := f.Clock().Now()
	w.start(t)
	sid := w.waitEvent(t, EventJoined).Session
	deadline := recv(t, w.renewed, "the first keep-alive")
	margin := testTTL / 10
	if want := t0.Add(testTTL - margin); !deadline.Equal(want) {
		t.Fatalf("fence deadline = t0+%v, want t0+%v", deadline.Sub(t0), want.Sub(t0))
	}
	tok := f.Grant(sid, 5)
	a := recv(t, h.acquires, "Acquire")
	w.waitEvent(t, EventAcquired)
	key := keyInBucket(t, 5, 16)
	if g, err := w.OwnsString(key); err != nil || plain(g) != (Grant{Bucket: 5, Token: tok}) || !g.Valid() || !g.Deadline().Equal(deadline) {
		t.Fatalf("Owns before the deadline = %+v (valid %v, deadline %v), %v", g, g.Valid(), g.Deadline(), err)
	}
	if !a.full.Valid() || a.ctx.Err() != nil {
		t.Fatalf("the grant is not valid before its deadline")
	}

	clk.jump(deadline) // the process resumes at the deadline; no timer has run

	if g, err := w.OwnsString(key); !errors.Is(err, ErrNotGranted) || !errors.Is(err, ErrSessionLost) || !strings.Contains(err.Error(), "fence deadline passed") {
		t.Errorf("Owns past the deadline = %+v, %v; want ErrNotGranted and ErrSessionLost", g, err)
	}
	if got := w.Held(); len(got) != 0 {
		t.Errorf("Held past the deadline = %v", got)
	}
	if a.full.Valid() || !a.full.Deadline().IsZero() {
		t.Errorf("Grant.Valid past the deadline = %v, Deadline = %v", a.full.Valid(), a.full.Deadline())
	}
	if err := a.ctx.Err(); !errors.Is(err, context.Canceled) {
		t.Errorf("grant ctx Err past the deadline = %v, want context.Canceled", err)
	}
	select {
	case <-a.ctx.Done():
	default:
		t.Errorf("grant ctx Err returned an error but Done is not closed")
	}
	if cause := context.Cause(a.ctx); !errors.Is(cause, ErrSessionLost) {
		t.Errorf("grant ctx cause = %v, want ErrSessionLost", cause)
	}
	if len(h.releases) != 0 {
		t.Fatalf("the paused worker released something")
	}

	// The process runs again: its timers fire, it fences and re-joins.
	clk.resume()
	if ev := w.waitEvent(t, EventFenced); ev.Session != sid {
		t.Errorf("fenced session %q, want %q", ev.Session, sid)
	}
	if rel := recv(t, h.releases, "Release"); rel.bucket != 5 || rel.grantCtxErr == nil {
		t.Errorf("Release(%d) with grant ctx err %v", rel.bucket, rel.grantCtxErr)
	}
	if a.full.Valid() {
		t.Errorf("the grant became valid again")
	}
	w.waitEvent(t, EventRejoined)
}

// TestGrantNotFromWorker: a Grant made by hand is never valid.
func TestGrantNotFromWorker(t *testing.T) {
	g := Grant{Bucket: 1, Token: 2}
	if g.Valid() || !g.Deadline().IsZero() {
		t.Errorf("hand-made grant: Valid %v, Deadline %v", g.Valid(), g.Deadline())
	}
}

// TestWorkerSlowKeepAlives: keep-alives that take 0.6s (or 1.2s, more
// than TTL/3) of a 3s TTL never cost the session: the first goes at once
// after a slow Join, each next one TTL/3 after the previous SEND (or as
// soon as the previous one returned, if later), and none is abandoned
// before the fence deadline.
func TestWorkerSlowKeepAlives(t *testing.T) {
	const ttl = 3 * time.Second
	const margin = 500 * time.Millisecond // the default: max(TTL/10, 500ms)
	for _, delay := range []time.Duration{600 * time.Millisecond, 1200 * time.Millisecond} {
		t.Run(delay.String(), func(t *testing.T) {
			f := newFake(t)
			f.AddKeyspace("rooms", 16, ttl)
			f.DelayJoins(delay)
			f.DelayKeepAlives(delay)
			h := newRecHandler(t)
			w := startWorker(t, f, h)
			if what := f.Delays().Next(t); what != keyshardv1connect.MemberServiceJoinProcedure {
				t.Fatalf("armed %q, want the join", what)
			}
			f.Clock().Advance(delay)
			sid := w.waitEvent(t, EventJoined).Session
			send := f.Clock().Now() // the first keep-alive goes at once
			for i := range 15 {
				if what := f.Delays().Next(t); what != keyshardv1connect.MemberServiceKeepAliveProcedure {
					t.Fatalf("armed %q, want a keep-alive", what)
				}
				if now := f.Clock().Now(); !now.Equal(send) {
					t.Fatalf("keep-alive %d sent at %v, want %v", i, now, send)
				}
				if s := f.KeepAlives().Next(t).GetSession(); s != sid {
					t.Fatalf("keep-alive %d for session %q, want %q (the session was lost)", i, s, sid)
				}
				f.Clock().Advance(delay)
				d := recv(t, w.renewed, "the renewal")
				if want := send.Add(ttl - margin); !d.Equal(want) {
					t.Fatalf("keep-alive %d: deadline %v, want send + TTL − margin = %v", i, d, want)
				}
				next := send.Add(max(ttl/3, delay))
				f.Clock().Advance(next.Sub(f.Clock().Now()))
				send = next
			}
			for len(w.events) > 0 {
				if ev := <-w.events; ev.Kind != EventJoined {
					t.Errorf("event %v (session %s): %v", ev.Kind, ev.Session, ev.Err)
				}
			}
		})
	}
}

// TestWorkerJoinBoundedByTTL: a re-Join that hangs is abandoned after
// TTL − margin, and the next Join asks to replace whatever the abandoned
// one may have created.
func TestWorkerJoinBoundedByTTL(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	h := newRecHandler(t)
	logs := make(chan string, 1024)
	w := startWorker(t, f, h, Logger(slog.New(msgHandler(logs))))
	sid := w.waitEvent(t, EventJoined).Session
	recv(t, w.renewed, "the first keep-alive")
	if j := f.Joins().Next(t); j.GetReplace() {
		t.Fatalf("first Join asks to replace")
	}
	f.HangJoins(1)
	f.EndSession(sid)
	if ev := w.waitEvent(t, EventSessionLost); ev.Session != sid {
		t.Fatalf("lost session %q, want %q", ev.Session, sid)
	}
	if j := f.Joins().Next(t); j.GetReplace() {
		t.Fatalf("re-Join asks to replace before any Join was abandoned")
	}
	margin := testTTL / 10
	f.Clock().Advance(testTTL - margin - time.Nanosecond)
	if f.Joins().Len() != 0 {
		t.Fatalf("a Join was sent while the first one is still within its bound")
	}
	f.Clock().Advance(time.Nanosecond) // the Join is abandoned ...
	for msg := ""; !strings.HasPrefix(msg, "keyshard: join failed; retrying"); {
		msg = recv(t, logs, "the worker to abandon the Join")
	}
	f.Clock().MustBlockUntil(t, 1) // ... and the next one waits out its backoff
	f.Clock().Advance(backoffBase)
	if j := f.Joins().Next(t); !j.GetReplace() {
		t.Errorf("the Join after an abandoned one does not ask to replace")
	}
	if ev := w.waitEvent(t, EventRejoined); ev.Session == sid {
		t.Errorf("rejoined with the old session")
	}
}

// TestWorkerLateJoinAnswer: a first Join whose answer comes after the new
// session's fence deadline (its TTL was not known when it was sent) is
// not used; the next Join asks to replace it.
func TestWorkerLateJoinAnswer(t *testing.T) {
	const ttl = 3 * time.Second
	f := newFake(t)
	f.AddKeyspace("rooms", 16, ttl)
	f.DelayJoins(ttl)
	h := newRecHandler(t)
	logs := make(chan string, 1024)
	w := startWorker(t, f, h, Logger(slog.New(msgHandler(logs))))
	f.Delays().Next(t)
	f.Joins().Next(t)
	f.DelayJoins(0)
	f.Clock().Advance(ttl) // answered past joinSent + TTL − margin
	for msg := ""; !strings.HasPrefix(msg, "keyshard: join failed; retrying"); {
		msg = recv(t, logs, "the worker to see the late answer")
	}
	f.Clock().MustBlockUntil(t, 1) // the backoff: the Join's own timer was stopped before the log
	f.Clock().Advance(backoffBase)
	if j := f.Joins().Next(t); !j.GetReplace() {
		t.Errorf("the Join after a late answer does not ask to replace")
	}
	if ev := w.waitEvent(t, EventJoined); ev.Session != "s2" {
		t.Errorf("joined with session %q, want s2 (s1 came too late)", ev.Session)
	}
}

// msgHandler is a slog.Handler that sends each record's message to ch.
type msgHandler chan<- string

func (h msgHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h msgHandler) Handle(_ context.Context, r slog.Record) error {
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
	h <- msg
	return nil
}
func (h msgHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h msgHandler) WithGroup(string) slog.Handler      { return h }

// TestWorkerRejoinBackoff: sessions lost before any keep-alive was
// acknowledged are followed by re-Joins that back off exponentially.
func TestWorkerRejoinBackoff(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	f.SetKeepAlives(clienttest.KeepAliveNotFound)
	h := newRecHandler(t)
	w := startWorker(t, f, h)
	f.Joins().Next(t)
	for n := range 5 {
		lost := w.waitEvent(t, EventSessionLost)
		f.Clock().MustBlockUntil(t, 1) // the backoff timer
		d := min(backoffBase<<n, testTTL)
		f.Clock().Advance(d/2 - time.Nanosecond)
		if f.Clock().Waiters() != 1 || f.Joins().Len() != 0 {
			t.Fatalf("re-join %d: the backoff ended before %v", n, d/2)
		}
		f.Clock().Advance(d/2 + time.Nanosecond)
		f.Joins().Next(t)
		if joins := f.CallCount(keyshardv1connect.MemberServiceJoinProcedure); joins != n+2 {
			t.Fatalf("%d Joins after %d sessions lost, want %d: re-joins do not wait", joins, n+1, n+2)
		}
		// A session's lease runs from the Join that created it.
		rejoined := w.waitEvent(t, EventRejoined)
		joinedAt := f.LeaseExpiry(rejoined.Session).Add(-testTTL)
		if gap := joinedAt.Sub(lost.Time); gap < d/2 {
			t.Fatalf("re-join %d sent %v after the session was lost, want at least %v", n, gap, d/2)
		}
	}
}

// TestWorkerBadHash: a keyspace whose hash this SDK cannot use makes Run
// return an error naming it, and the session is left at once.
func TestWorkerBadHash(t *testing.T) {
	f := newFake(t)
	f.PutKeyspace(&keyshardv1.Keyspace{Name: "rooms", Buckets: 16, Hash: "sha3-fancy", LeaseTtl: durationpb.New(testTTL)})
	h := newRecHandler(t)
	w := startWorker(t, f, h)
	err := recv(t, w.runErr, "Run")
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `hash "sha3-fancy"`) {
		t.Errorf("Run = %v; want ErrInvalid naming the hash", err)
	}
	if got := f.Leaves().Next(t).GetSession(); got != "s1" {
		t.Errorf("left %q, want s1", got)
	}
	if _, err := placement.NewHasher("sha3-fancy", 16); err == nil {
		t.Fatalf("the test's hash is valid")
	}
}
