package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/client/clienttest"
	"github.com/keyshard/keyshard/placement"
)

const testTTL = 9 * time.Second // default margin: 900ms; keep-alive every 3s

// recHandler records every call and fails the test if calls for one
// bucket overlap or do not alternate Acquire, Release.
type recHandler struct {
	t        *testing.T
	acquires chan acqCall
	releases chan relCall
	yield    bool // Gosched inside calls, to shake out interleavings

	mu          sync.Mutex
	active      map[int]int
	held        map[int]bool
	gctx        map[int]context.Context
	gateAcquire map[int]chan struct{}
	gateRelease map[int]chan struct{}
}

type acqCall struct {
	g    Grant // bucket and token only, to compare with ==
	full Grant // as the worker passed it
	ctx  context.Context
}

// plain returns g's bucket and token, without what ties it to a worker.
func plain(g Grant) Grant { return Grant{Bucket: g.Bucket, Token: g.Token} }

// grantCmp compares Grants with == (their unexported part included).
var grantCmp = cmpopts.EquateComparable(Grant{})

func plainAll(gs []Grant) []Grant {
	out := make([]Grant, len(gs))
	for i, g := range gs {
		out[i] = plain(g)
	}
	return out
}

type relCall struct {
	bucket int
	// grantCtxErr is the grant context's error when Release was entered.
	grantCtxErr error
	grantCtx    context.Context
}

func newRecHandler(t *testing.T) *recHandler {
	return &recHandler{
		t: t, acquires: make(chan acqCall, 4096), releases: make(chan relCall, 4096),
		active: map[int]int{}, held: map[int]bool{}, gctx: map[int]context.Context{},
		gateAcquire: map[int]chan struct{}{}, gateRelease: map[int]chan struct{}{},
	}
}

func (h *recHandler) enter(b int, acquire bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.active[b]++
	if h.active[b] > 1 {
		h.t.Errorf("bucket %d: %d handler calls at once", b, h.active[b])
	}
	if h.held[b] == acquire {
		h.t.Errorf("bucket %d: Acquire/Release out of order (acquire=%v while held=%v)", b, acquire, h.held[b])
	}
	h.held[b] = acquire
}

func (h *recHandler) exit(b int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.active[b]--
}

func (h *recHandler) Acquire(ctx context.Context, g Grant) error {
	h.enter(g.Bucket, true)
	defer h.exit(g.Bucket)
	h.mu.Lock()
	h.gctx[g.Bucket] = ctx
	gate := h.gateAcquire[g.Bucket]
	h.mu.Unlock()
	h.acquires <- acqCall{plain(g), g, ctx}
	if h.yield {
		runtime.Gosched()
	}
	if gate != nil {
		<-gate
	}
	return nil
}

func (h *recHandler) Release(_ context.Context, b int) error {
	h.enter(b, false)
	defer h.exit(b)
	h.mu.Lock()
	gctx := h.gctx[b]
	gate := h.gateRelease[b]
	h.mu.Unlock()
	h.releases <- relCall{b, gctx.Err(), gctx}
	if h.yield {
		runtime.Gosched()
	}
	if gate != nil {
		<-gate
	}
	return nil
}

// heldNone fails the test if some bucket was acquired and never released.
func (h *recHandler) heldNone() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for b, held := range h.held {
		if held {
			h.t.Errorf("bucket %d: Acquire without a matching Release", b)
		}
	}
}

type testWorker struct {
	*Worker
	events  chan Event // every event but EventRenewed
	runErr  chan error
	renewed chan time.Time // EventRenewed's deadline, after each acknowledged keep-alive
}

func newTestWorker(t *testing.T, f fake, h Handler, opts ...WorkerOption) *testWorker {
	t.Helper()
	return newTestWorkerOn(t, f.dial(t), h, opts...)
}

func newTestWorkerOn(t *testing.T, c *Client, h Handler, opts ...WorkerOption) *testWorker {
	t.Helper()
	return newTestMember(t, c, "w1", h, opts...)
}

// newTestMember is newTestWorkerOn for member id (at <id>.internal:9000).
func newTestMember(t *testing.T, c *Client, id string, h Handler, opts ...WorkerOption) *testWorker {
	t.Helper()
	tw := &testWorker{events: make(chan Event, 4096), runErr: make(chan error, 1), renewed: make(chan time.Time, 4096)}
	opts = append([]WorkerOption{OnEvent(func(e Event) {
		if e.Kind == EventRenewed {
			tw.renewed <- e.Deadline
			return
		}
		tw.events <- e
	})}, opts...)
	w, err := NewWorker(c, "rooms", Member{ID: id, Address: id + ".internal:9000"}, h, opts...)
	if err != nil {
		t.Fatalf("NewWorker: %v", err)
	}
	tw.Worker = w
	return tw
}

func (tw *testWorker) start(t *testing.T) {
	go func() { tw.runErr <- tw.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		tw.Close(ctx) // a hard stop if the test did not close it
	})
}

func startWorker(t *testing.T, f fake, h Handler, opts ...WorkerOption) *testWorker {
	tw := newTestWorker(t, f, h, opts...)
	tw.start(t)
	return tw
}

// waitEvent returns the next event of kind k, skipping others.
func (tw *testWorker) waitEvent(t *testing.T, k EventKind) Event {
	t.Helper()
	for {
		ev := recv(t, tw.events, "event "+k.String())
		if ev.Kind == k {
			return ev
		}
	}
}

// noLoss fails the test if the worker lost a session, by the events it
// has had.
func (tw *testWorker) noLoss(t *testing.T) {
	t.Helper()
	for len(tw.events) > 0 {
		if ev := <-tw.events; ev.Kind == EventFenced || ev.Kind == EventSessionLost {
			t.Errorf("event %v: %v", ev.Kind, ev.Err)
		}
	}
}

// waitFor blocks until cond, checked under the worker's lock each time the
// worker's state changes.
func (tw *testWorker) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for {
		tw.mu.Lock()
		ok := cond()
		ch := tw.changed
		tw.mu.Unlock()
		if ok {
			return
		}
		recv(t, ch, what)
	}
}

// keyInBucket returns a key of bucket b among buckets.
func keyInBucket(t *testing.T, b, buckets int) string {
	h, err := placement.NewHasher(placement.HashXXH64, buckets)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		if k := fmt.Sprintf("room-%d", i); h.BucketString(k) == b {
			return k
		}
	}
}

func TestWorkerHandoff(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	h := newRecHandler(t)
	w := startWorker(t, f, h)
	join := f.Joins().Next(t)
	want := &keyshardv1.JoinRequest{Keyspace: "rooms", Member: &keyshardv1.Member{Id: "w1", Address: "w1.internal:9000"}}
	if join.GetKeyspace() != want.Keyspace || join.GetMember().GetId() != "w1" || join.GetMember().GetAddress() != "w1.internal:9000" || join.GetReplace() {
		t.Errorf("Join = %v, want %v", join, want)
	}
	sid := w.waitEvent(t, EventJoined).Session

	tok := f.Grant(sid, 3)
	a := recv(t, h.acquires, "Acquire")
	if a.g != (Grant{Bucket: 3, Token: tok}) {
		t.Errorf("Acquire(%+v), want bucket 3 token %d", a.g, tok)
	}
	if ev := w.waitEvent(t, EventAcquired); plain(ev.Grant) != a.g || ev.Err != nil {
		t.Errorf("acquired event = %+v", ev)
	}
	if diff := cmp.Diff([]Grant{{Bucket: 3, Token: tok}}, plainAll(w.Held()), grantCmp); diff != "" {
		t.Errorf("Held (-want +got):\n%s", diff)
	}
	if g, err := w.OwnsString(keyInBucket(t, 3, 16)); err != nil || plain(g) != a.g {
		t.Errorf("Owns(key of bucket 3) = %+v, %v", g, err)
	}

	f.AskRelease(sid, 3)
	rel := recv(t, h.releases, "Release")
	if rel.bucket != 3 || rel.grantCtxErr != nil {
		t.Errorf("Release(%d) with grant ctx err %v; want bucket 3 with the grant still live during a handoff", rel.bucket, rel.grantCtxErr)
	}
	w.waitEvent(t, EventReleased)
	if a.ctx.Err() == nil {
		t.Errorf("grant ctx still live after Release returned")
	}
	rr := f.Releases().Next(t)
	if diff := cmp.Diff([]Grant{{Bucket: 3, Token: tok}}, grantsFromProto(rr.GetBuckets()), grantCmp); diff != "" || rr.GetSession() != sid {
		t.Errorf("Release RPC session %q (-want +got):\n%s", rr.GetSession(), diff)
	}
	if got := w.Held(); len(got) != 0 {
		t.Errorf("Held after release = %v", got)
	}

	if err := w.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
	if err := recv(t, w.runErr, "Run"); err != nil {
		t.Errorf("Run = %v", err)
	}
	w.waitEvent(t, EventLeft)
	h.heldNone()
	if err := w.Close(context.Background()); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

func grantsFromProto(gs []*keyshardv1.BucketGrant) []Grant {
	var out []Grant
	for _, g := range gs {
		out = append(out, Grant{Bucket: int(g.GetBucket()), Token: g.GetToken()})
	}
	return out
}

// TestWorkerSelfFence: with keep-alives failing or hanging, the worker
// holds on until just before lastAckedSend + TTL − margin, then cancels
// the grant's context, calls Release, reports ErrSessionLost and re-joins:
// all before the lease TTL has passed since the last acknowledged send.
func TestWorkerSelfFence(t *testing.T) {
	for _, mode := range []clienttest.KeepAliveFault{clienttest.KeepAliveFail, clienttest.KeepAliveHang} {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFake(t)
			f.AddKeyspace("rooms", 16, testTTL)
			h := newRecHandler(t)
			t0 := f.Clock().Now() // the Join and the first keep-alive are sent at t0
			w := startWorker(t, f, h)
			sid := w.waitEvent(t, EventJoined).Session
			recv(t, w.renewed, "the first keep-alive, sent at once")
			f.Grant(sid, 5)
			a := recv(t, h.acquires, "Acquire")
			w.waitEvent(t, EventAcquired)

			f.SetKeepAlives(mode)
			f.Clock().MustBlockUntil(t, 2) // the keep-alive and fence timers
			margin := testTTL / 10
			f.Clock().Advance(testTTL - margin - time.Nanosecond)
			if a.ctx.Err() != nil || len(h.releases) != 0 || len(w.Held()) != 1 {
				t.Fatalf("fenced before lastAckedSend + TTL − margin (ctx err %v, %d releases, held %v)", a.ctx.Err(), len(h.releases), w.Held())
			}
			f.Clock().Advance(2 * time.Nanosecond)
			rel := recv(t, h.releases, "Release after the fence")
			if rel.bucket != 5 || rel.grantCtxErr == nil {
				t.Errorf("Release(%d) with grant ctx err %v; want bucket 5 with the grant ctx already cancelled", rel.bucket, rel.grantCtxErr)
			}
			if since := f.Clock().Since(t0); since >= testTTL {
				t.Errorf("fenced %v after the last acknowledged send; must be before the TTL %v", since, testTTL)
			}
			ev := w.waitEvent(t, EventFenced)
			if !errors.Is(ev.Err, ErrSessionLost) || ev.Session != sid {
				t.Errorf("fenced event = %+v, want ErrSessionLost for %s", ev, sid)
			}
			if ev := w.waitEvent(t, EventSessionLost); !errors.Is(ev.Err, ErrSessionLost) {
				t.Errorf("session lost event err = %v", ev.Err)
			}
			if got := w.Held(); len(got) != 0 {
				t.Errorf("Held after the fence = %v", got)
			}
			// It re-joins replacing the session it fenced and naming it,
			// so that the leader revokes it without quarantine; it does
			// not release (the new session may be granted the buckets
			// back at once).
			if j := f.Joins().Next(t); j.GetReplace() || j.GetFencedSession() != "" {
				t.Errorf("first Join = %v; want no replace", j)
			}
			if j := f.Joins().Next(t); !j.GetReplace() || j.GetFencedSession() != sid {
				t.Errorf("re-Join after the fence = %v; want replace with fenced_session %s", j, sid)
			}
			if ev := w.waitEvent(t, EventRejoined); ev.Session == sid || ev.Session == "" {
				t.Errorf("rejoined with session %q", ev.Session)
			}
			if n := f.Releases().Len(); n != 0 {
				t.Errorf("%d Release RPCs after a fence", n)
			}
			f.SetKeepAlives(clienttest.KeepAliveServe)
			if err := w.Close(context.Background()); err != nil {
				t.Errorf("Close = %v", err)
			}
			h.heldNone()
		})
	}
}

// TestWorkerFenceCountsFromSend: a renewal moves the deadline to the time
// its keep-alive was SENT plus TTL − margin, not to when the answer came.
func TestWorkerFenceCountsFromSend(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	h := newRecHandler(t)
	w := newTestWorker(t, f, h)
	t0 := f.Clock().Now()
	w.start(t)
	sid := w.waitEvent(t, EventJoined).Session
	recv(t, w.renewed, "the first keep-alive, sent at once")
	f.KeepAlives().Next(t).GetSession()
	f.Grant(sid, 5)
	a := recv(t, h.acquires, "Acquire")

	gate := f.HoldKeepAlives()
	f.Clock().MustBlockUntil(t, 2)
	f.Clock().Advance(testTTL / 3) // the keep-alive is sent at t0+3s ...
	f.KeepAlives().Next(t).GetSession()
	f.Clock().Advance(time.Second) // ... and answered at t0+4s
	gate.Pass()
	deadline := recv(t, w.renewed, "renewal")
	margin := testTTL / 10
	if want := t0.Add(testTTL/3 + testTTL - margin); !deadline.Equal(want) {
		t.Fatalf("deadline after renewal = t0+%v, want t0+%v (send time + TTL − margin)", deadline.Sub(t0), want.Sub(t0))
	}
	f.SetKeepAlives(clienttest.KeepAliveFail)
	f.Clock().Advance(deadline.Sub(f.Clock().Now()) - time.Nanosecond) // past the first deadline, t0+8.1s
	if a.ctx.Err() != nil || len(h.releases) != 0 {
		t.Fatalf("fenced before the renewed deadline")
	}
	f.Clock().Advance(2 * time.Nanosecond)
	if rel := recv(t, h.releases, "Release after the fence"); rel.grantCtxErr == nil {
		t.Errorf("Release called before the grant ctx was cancelled")
	}
	w.waitEvent(t, EventFenced)
}

// TestWorkerSessionEnded: the server ends the session (its grants stream
// says NotFound): the worker fences, re-joins, and takes new grants.
func TestWorkerSessionEnded(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	h := newRecHandler(t)
	w := startWorker(t, f, h)
	sid := w.waitEvent(t, EventJoined).Session
	recv(t, w.renewed, "the first keep-alive")
	tok1 := f.Grant(sid, 2)
	recv(t, h.acquires, "Acquire")

	f.EndSession(sid)
	if rel := recv(t, h.releases, "Release"); rel.grantCtxErr == nil {
		t.Errorf("Release before the grant ctx was cancelled")
	}
	w.waitEvent(t, EventFenced)
	w.waitEvent(t, EventSessionLost)
	sid2 := w.waitEvent(t, EventRejoined).Session
	tok2 := f.Grant(sid2, 2)
	if a := recv(t, h.acquires, "Acquire in the new session"); a.g.Token != tok2 || tok2 <= tok1 {
		t.Errorf("Acquire(%+v), want token %d > %d", a.g, tok2, tok1)
	}
	if err := w.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
	h.heldNone()
}

// TestWorkerKeepAliveNotFound: a keep-alive answered NotFound ends the
// session at once, without waiting for the deadline.
func TestWorkerKeepAliveNotFound(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	h := newRecHandler(t)
	w := startWorker(t, f, h)
	sid := w.waitEvent(t, EventJoined).Session
	recv(t, w.renewed, "the first keep-alive")
	f.Grant(sid, 2)
	recv(t, h.acquires, "Acquire")
	f.SetKeepAlives(clienttest.KeepAliveNotFound)
	f.Clock().MustBlockUntil(t, 2)
	f.Clock().Advance(testTTL / 3)
	recv(t, h.releases, "Release")
	if ev := w.waitEvent(t, EventFenced); !errors.Is(ev.Err, ErrSessionLost) || !strings.Contains(ev.Err.Error(), "ended the session") {
		t.Errorf("fenced event err = %v", ev.Err)
	}
	f.SetKeepAlives(clienttest.KeepAliveServe)
	w.waitEvent(t, EventRejoined)
}

// TestWorkerReleaseWaitsForAcquire: a release asked while Acquire is
// still running is handled once Acquire returned.
func TestWorkerReleaseWaitsForAcquire(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	h := newRecHandler(t)
	gate := make(chan struct{})
	h.gateAcquire[4] = gate
	w := startWorker(t, f, h)
	sid := w.waitEvent(t, EventJoined).Session
	tok := f.Grant(sid, 4)
	recv(t, h.acquires, "Acquire (blocked)")
	f.AskRelease(sid, 4)
	w.waitFor(t, "the release to be seen", func() bool { gs := w.grants[4]; return gs != nil && gs.ending })
	if len(h.releases) != 0 {
		t.Fatalf("Release called while Acquire runs")
	}
	close(gate)
	recv(t, h.releases, "Release")
	rr := f.Releases().Next(t)
	if diff := cmp.Diff([]Grant{{Bucket: 4, Token: tok}}, grantsFromProto(rr.GetBuckets()), grantCmp); diff != "" {
		t.Errorf("Release RPC (-want +got):\n%s", diff)
	}
	if err := w.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
	h.heldNone()
}

// TestWorkerAcquireWaitsForRelease: a new grant of a bucket whose Release
// is still running is acquired once that Release returned.
func TestWorkerAcquireWaitsForRelease(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	h := newRecHandler(t)
	gate := make(chan struct{})
	h.gateRelease[4] = gate
	w := startWorker(t, f, h)
	sid := w.waitEvent(t, EventJoined).Session
	f.Grant(sid, 4)
	recv(t, h.acquires, "Acquire")
	f.AskRelease(sid, 4)
	recv(t, h.releases, "Release (blocked)")
	// The server takes the bucket back and grants it again.
	tok2 := f.Grant(sid, 4)
	w.waitFor(t, "the new grant", func() bool { gs := w.grants[4]; return gs != nil && gs.g.Token == tok2 })
	if len(h.acquires) != 0 {
		t.Fatalf("Acquire called while Release runs")
	}
	h.mu.Lock()
	delete(h.gateRelease, 4)
	h.mu.Unlock()
	close(gate)
	if a := recv(t, h.acquires, "the second Acquire"); a.g.Token != tok2 {
		t.Errorf("second Acquire token %d, want %d", a.g.Token, tok2)
	}
	if err := w.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
	h.heldNone()
}

// TestWorkerStress drives random grants, releases and take-backs over
// many buckets; the handler checks that calls for one bucket never
// overlap and alternate. Run with -race.
func TestWorkerStress(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	h := newRecHandler(t)
	h.yield = true
	w := startWorker(t, f, h)
	sid := w.waitEvent(t, EventJoined).Session
	rng := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		b := rng.IntN(16)
		switch rng.IntN(3) {
		case 0, 1:
			f.Grant(sid, b) // a new grant, or a take-back and re-grant
		case 2:
			f.AskRelease(sid, b)
		}
		if rng.IntN(8) == 0 {
			runtime.Gosched()
		}
	}
	if err := w.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
	if err := recv(t, w.runErr, "Run"); err != nil {
		t.Errorf("Run = %v", err)
	}
	h.heldNone()
	if f.Live(sid) {
		t.Errorf("the session is still alive after Close")
	}
}

// TestWorkerCloseDrains: Close leaves, releases what the server asks for
// with the grants live, and returns once the server ended the session.
func TestWorkerCloseDrains(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	h := newRecHandler(t)
	w := startWorker(t, f, h)
	sid := w.waitEvent(t, EventJoined).Session
	toks := map[int]uint64{1: f.Grant(sid, 1), 2: f.Grant(sid, 2)}
	recv(t, h.acquires, "Acquire")
	recv(t, h.acquires, "Acquire")
	closed := make(chan error, 1)
	go func() { closed <- w.Close(context.Background()) }()
	if got := f.Leaves().Next(t).GetSession(); got != sid {
		t.Errorf("Leave(%q), want %q", got, sid)
	}
	for range 2 {
		if rel := recv(t, h.releases, "Release"); rel.grantCtxErr != nil {
			t.Errorf("Release(%d) during a drain with the grant ctx cancelled", rel.bucket)
		}
	}
	got := map[int]uint64{}
	for len(got) < 2 {
		for _, g := range f.Releases().Next(t).GetBuckets() {
			got[int(g.GetBucket())] = g.GetToken()
		}
	}
	if diff := cmp.Diff(toks, got); diff != "" {
		t.Errorf("released tokens (-want +got):\n%s", diff)
	}
	if err := recv(t, closed, "Close"); err != nil {
		t.Errorf("Close = %v", err)
	}
	if err := recv(t, w.runErr, "Run"); err != nil {
		t.Errorf("Run = %v", err)
	}
	w.waitEvent(t, EventLeft)
	h.heldNone()
}

// TestWorkerFenceWhileLeaving: a worker that fences itself while it drains
// (its keep-alives fail) does not re-join, so it hands back what the
// session held: once every handler has returned, it releases every bucket
// the server lists for the session, so that they do not wait for the
// lease to expire.
func TestWorkerFenceWhileLeaving(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	f.StallLeaves(true) // the server does not move the buckets away
	h := newRecHandler(t)
	w := startWorker(t, f, h)
	sid := w.waitEvent(t, EventJoined).Session
	recv(t, w.renewed, "the first keep-alive")
	tok := f.Grant(sid, 3)
	recv(t, h.acquires, "Acquire")
	closed := make(chan error, 1)
	go func() { closed <- w.Close(context.Background()) }()
	f.Leaves().Next(t).GetSession()
	f.SetKeepAlives(clienttest.KeepAliveFail)
	f.Clock().MustBlockUntil(t, 2) // the keep-alive and fence timers
	f.Clock().Advance(testTTL)
	if rel := recv(t, h.releases, "Release after the fence"); rel.bucket != 3 || rel.grantCtxErr == nil {
		t.Errorf("Release(%d) with grant ctx err %v; want bucket 3, fenced", rel.bucket, rel.grantCtxErr)
	}
	r := f.Releases().Next(t)
	if r.GetSession() != sid || len(r.GetBuckets()) != 1 || r.GetBuckets()[0].GetBucket() != 3 || r.GetBuckets()[0].GetToken() != tok {
		t.Errorf("Release RPC %v; want bucket 3 at token %d of %s", r, tok, sid)
	}
	if err := recv(t, w.runErr, "Run"); err != nil {
		t.Errorf("Run = %v", err)
	}
	recv(t, closed, "Close")
	if n := f.Joins().Len(); n != 1 {
		t.Errorf("%d Joins; a leaving worker must not re-join", n)
	}
	h.heldNone()
}

// TestWorkerCloseDeadline: if the drain does not finish before Close's ctx
// ends, Close stops the worker at once (grants cancelled before Release)
// and says so.
func TestWorkerCloseDeadline(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	f.StallLeaves(true)
	h := newRecHandler(t)
	w := startWorker(t, f, h)
	sid := w.waitEvent(t, EventJoined).Session
	f.Grant(sid, 1)
	recv(t, h.acquires, "Acquire")
	ctx, cancel := context.WithCancel(context.Background())
	closed := make(chan error, 1)
	go func() { closed <- w.Close(ctx) }()
	f.Leaves().Next(t).GetSession()
	cancel()
	if err := recv(t, closed, "Close"); !errors.Is(err, context.Canceled) {
		t.Errorf("Close = %v, want context.Canceled", err)
	}
	if rel := recv(t, h.releases, "Release"); rel.grantCtxErr == nil {
		t.Errorf("hard stop: Release before the grant ctx was cancelled")
	}
	if err := recv(t, w.runErr, "Run"); err != nil {
		t.Errorf("Run = %v, want nil after Close", err)
	}
	h.heldNone()
}

func TestWorkerOwns(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	epoch := f.SetMap("rooms", members("w1", "w2"), func(b int) string {
		if b < 8 {
			return "w1"
		}
		return "w2"
	})
	h := newRecHandler(t)
	w := newTestWorker(t, f, h)
	if _, err := w.OwnsString("x"); !errors.Is(err, ErrNotGranted) {
		t.Errorf("Owns before Run = %v, want ErrNotGranted", err)
	}
	w.start(t)
	sid := w.waitEvent(t, EventJoined).Session

	_, err := w.Owns([]byte(keyInBucket(t, 10, 16)))
	wo, ok := AsWrongOwner(err)
	if !ok || !errors.Is(err, ErrWrongOwner) {
		t.Fatalf("Owns(key of w2) = %v, want a *WrongOwnerError", err)
	}
	want := WrongOwnerError{Bucket: 10, Owner: "w2", Address: "w2.internal:9000", Epoch: epoch}
	if *wo != want {
		t.Errorf("WrongOwnerError = %+v, want %+v", *wo, want)
	}
	// The answer a worker's RPC server gives decodes to the same.
	cerr := WrongOwner(err)
	if cerr.Code() != connect.CodeFailedPrecondition {
		t.Errorf("WrongOwner code = %v", cerr.Code())
	}
	if back, ok := AsWrongOwner(cerr); !ok || *back != want {
		t.Errorf("AsWrongOwner(WrongOwner(err)) = %+v, %v", back, ok)
	}

	key := []byte(keyInBucket(t, 3, 16))
	if _, err := w.Owns(key); !errors.Is(err, ErrNotGranted) || !strings.Contains(err.Error(), "bucket 3") {
		t.Errorf("Owns(own key before its grant) = %v, want ErrNotGranted", err)
	}
	type result struct {
		g   Grant
		err error
	}
	waited := make(chan result, 1)
	go func() {
		g, err := w.WaitGrant(context.Background(), key)
		waited <- result{g, err}
	}()
	tok := f.Grant(sid, 3)
	if r := recv(t, waited, "WaitGrant"); r.err != nil || plain(r.g) != (Grant{Bucket: 3, Token: tok}) {
		t.Errorf("WaitGrant = %+v, %v", r.g, r.err)
	}
	// The map moves bucket 3 to w2: while the grant is held it is still
	// ours; once released, Owns names w2.
	f.SetMap("rooms", members("w1", "w2"), func(b int) string { return "w2" })
	f.AskRelease(sid, 3)
	recv(t, h.releases, "Release")
	w.waitFor(t, "the release", func() bool { return w.grants[3] == nil })
	if err := w.router.WaitEpoch(context.Background(), epoch+1); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Owns(key); !errors.Is(err, ErrWrongOwner) {
		t.Errorf("Owns after the handoff = %v, want ErrWrongOwner", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := w.WaitGrant(ctx, key); !errors.Is(err, ErrWrongOwner) {
		t.Errorf("WaitGrant for another member's key = %v, want ErrWrongOwner", err)
	}
}

func TestWorkerBadInput(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	c := f.dial(t)
	h := newRecHandler(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		c        *Client
		keyspace string
		m        Member
		h        Handler
		opts     []WorkerOption
		arg      string // the *ArgError's Arg
		text     string // in its Reason
	}{
		{"nil client", nil, "rooms", Member{ID: "w1"}, h, nil, "client", "is nil"},
		{"empty keyspace", c, "", Member{ID: "w1"}, h, nil, "keyspace name", "is empty"},
		{"bad keyspace", c, "rooms/1", Member{ID: "w1"}, h, nil, "keyspace name", "has '/' at byte 5"},
		{"empty member", c, "rooms", Member{}, h, nil, "Member.ID", "is empty"},
		{"bad member", c, "rooms", Member{ID: "w 1"}, h, nil, "Member.ID", `"w 1" has ' '`},
		{"negative weight", c, "rooms", Member{ID: "w1", Weight: -1}, h, nil, "Member.Weight", "-1 is not a finite number"},
		{"NaN weight", c, "rooms", Member{ID: "w1", Weight: math.NaN()}, h, nil, "Member.Weight", "NaN is not a finite number"},
		{"nil handler", c, "rooms", Member{ID: "w1"}, nil, nil, "handler", "is nil"},
		{"negative margin", c, "rooms", Member{ID: "w1"}, h, []WorkerOption{FenceMargin(-time.Second)}, "FenceMargin", "-1s is negative"},
		{"zero margin", c, "rooms", Member{ID: "w1"}, h, []WorkerOption{FenceMargin(0)}, "FenceMargin", "leave the option out for the default"},
		{"huge margin", c, "rooms", Member{ID: "w1"}, h, []WorkerOption{FenceMargin(MaxFenceMargin)}, "FenceMargin", "12h0m0s is not below 12h0m0s"},
		{"last margin wins", c, "rooms", Member{ID: "w1"}, h, []WorkerOption{FenceMargin(time.Second), FenceMargin(-2 * time.Second)}, "FenceMargin", "-2s is negative"},
	} {
		w, err := NewWorker(tc.c, tc.keyspace, tc.m, tc.h, tc.opts...)
		if w != nil {
			t.Errorf("%s: NewWorker returned a Worker with its error", tc.name)
		}
		checkArgError(t, tc.name, err, "NewWorker", tc.arg, tc.text)
	}
	if n := f.CallCount("/keyshard.v1.MemberService/Join") + f.CallCount("/keyshard.v1.MapService/GetMap"); n != 0 {
		t.Errorf("%d calls reached the server; NewWorker must do no IO", n)
	}
	if _, err := NewWorker(c, "rooms", Member{ID: "w1"}, h, FenceMargin(MaxFenceMargin-time.Nanosecond)); err != nil {
		t.Errorf("NewWorker with a margin just below MaxFenceMargin = %v", err)
	}

	// A keyspace that does not exist is found out by Run.
	w, err := NewWorker(c, "halls", Member{ID: "w1"}, h)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(ctx); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), `keyspace "halls" does not exist`) {
		t.Errorf("Run(unknown keyspace) = %v; want ErrNotFound naming it", err)
	}

	// A live session holds the id: a clear error, and Replace sends replace.
	f.FailNext(keyshardv1connect.MemberServiceJoinProcedure, 1, connect.NewError(connect.CodeAlreadyExists, errors.New(`member "w1" has a live session`)))
	w, err = NewWorker(c, "rooms", Member{ID: "w1"}, h)
	if err != nil {
		t.Fatal(err)
	}
	err = w.Run(ctx)
	if !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), "Replace(true)") {
		t.Errorf("Run with the id taken = %v; want ErrExists suggesting Replace(true)", err)
	}
	f.Joins().Next(t)
	w, err = NewWorker(c, "rooms", Member{ID: "w1"}, h, Replace(true))
	if err != nil {
		t.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- w.Run(ctx) }()
	if j := f.Joins().Next(t); !j.GetReplace() {
		t.Errorf("Join.replace = false with Replace(true)")
	}
	if err := w.Run(ctx); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "called twice") {
		t.Errorf("second Run = %v", err)
	}
	if err := w.Close(ctx); err != nil {
		t.Errorf("Close = %v", err)
	}
	if err := recv(t, runErr, "Run"); err != nil {
		t.Errorf("Run = %v", err)
	}
	if err := w.Close(ctx); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

// TestWorkerCloseWithoutRun: Close before Run is fine and idempotent; Run
// then returns ErrClosed without a call, and WaitGrant does not block.
func TestWorkerCloseWithoutRun(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	w, err := NewWorker(f.dial(t), "rooms", Member{ID: "w9"}, newRecHandler(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 2 {
		if err := w.Close(ctx); err != nil {
			t.Errorf("Close %d before Run = %v", i+1, err)
		}
	}
	if err := w.Run(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after Close = %v, want ErrClosed", err)
	}
	if _, err := w.WaitGrant(ctx, []byte("k")); !errors.Is(err, ErrClosed) {
		t.Errorf("WaitGrant on a closed Worker = %v, want ErrClosed", err)
	}
	if n := f.CallCount("/keyshard.v1.MemberService/Join") + f.CallCount("/keyshard.v1.MapService/GetMap"); n != 0 {
		t.Errorf("%d calls reached the server", n)
	}
}

// TestWorkerGrantsLongPoll: without WatchGrants the worker long-polls
// GetGrants.
func TestWorkerGrantsLongPoll(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 256, testTTL)
	f.Fail(keyshardv1connect.MemberServiceWatchGrantsProcedure, connect.NewError(connect.CodeUnimplemented, errors.New("no streams here")))
	h := newRecHandler(t)
	w := startWorker(t, f, h)
	sid := w.waitEvent(t, EventJoined).Session
	recv(t, w.renewed, "the first keep-alive")
	f.Clock().MustBlockUntil(t, 3) // keep-alive, fence, and the backoff after Unimplemented
	f.Clock().Advance(backoffBase)
	f.GrantPolls().Next(t)
	if req := f.GrantPolls().Next(t); req.GetSinceRevision() == 0 || req.GetWait().AsDuration() != pollWait {
		t.Errorf("long poll = %v", req)
	}
	tok := f.Grant(sid, 7)
	if a := recv(t, h.acquires, "Acquire"); a.g != (Grant{Bucket: 7, Token: tok}) {
		t.Errorf("Acquire(%+v)", a.g)
	}
	f.AskRelease(sid, 7)
	recv(t, h.releases, "Release")
	f.Releases().Next(t)
	// Later polls ask for answers at least as new as the release, so a
	// replica that has not seen it yet cannot list the bucket again.
	// Each new grant answers the pending poll, so the worker polls again;
	// once the Release call has returned, the poll carries its revision.
	// (When that is depends on the scheduler: the loop grants up to 248
	// more buckets, each answering the pending poll, to wait for it.)
	for b := 8; ; b++ {
		if b == 256 {
			t.Fatal("no GetGrants carried the release's revision as min_revision")
		}
		req := f.GrantPolls().Next(t)
		if req.GetMinRevision() > clienttest.ReleaseRevisionBase {
			break
		}
		f.Grant(sid, b)
		recv(t, h.acquires, "Acquire")
	}
	if err := w.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
	h.heldNone()
}

// TestWorkerReleaseBatchSplit: releases that pile up while a Release call
// is in flight go in one call; if the server refuses it because one bucket
// was taken back meanwhile, the others still get through one by one.
func TestWorkerReleaseBatchSplit(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	gate := f.HoldReleases()
	h := newRecHandler(t)
	w := startWorker(t, f, h)
	sid := w.waitEvent(t, EventJoined).Session
	tok := map[int]uint64{1: f.Grant(sid, 1), 2: f.Grant(sid, 2), 3: f.Grant(sid, 3)}
	for range 3 {
		recv(t, h.acquires, "Acquire")
	}
	f.AskRelease(sid, 1)
	if got := grantsFromProto(f.Releases().Next(t).GetBuckets()); !cmp.Equal(got, []Grant{{Bucket: 1, Token: tok[1]}}, grantCmp) {
		t.Errorf("first Release RPC = %v", got)
	}
	f.AskRelease(sid, 2)
	f.AskRelease(sid, 3)
	w.waitFor(t, "releases of 2 and 3", func() bool { return w.grants[2] == nil && w.grants[3] == nil })
	tok2 := f.Grant(sid, 2) // taken back and granted again
	if a := recv(t, h.acquires, "Acquire of the new grant"); a.g != (Grant{Bucket: 2, Token: tok2}) {
		t.Errorf("Acquire(%+v), want bucket 2 at %d", a.g, tok2)
	}
	gate.Open()
	batch := grantsFromProto(f.Releases().Next(t).GetBuckets())
	slices.SortFunc(batch, func(a, b Grant) int { return a.Bucket - b.Bucket })
	if !cmp.Equal(batch, []Grant{{Bucket: 2, Token: tok[2]}, {Bucket: 3, Token: tok[3]}}, grantCmp) {
		t.Errorf("batched Release RPC = %v", batch)
	}
	var singles []Grant
	for range 2 {
		singles = append(singles, grantsFromProto(f.Releases().Next(t).GetBuckets())...)
	}
	slices.SortFunc(singles, func(a, b Grant) int { return a.Bucket - b.Bucket })
	if !cmp.Equal(singles, []Grant{{Bucket: 2, Token: tok[2]}, {Bucket: 3, Token: tok[3]}}, grantCmp) {
		t.Errorf("Release RPCs after the refusal = %v", singles)
	}
	f.WaitFor(t, "the server to drop bucket 3", func() bool { _, ok := f.Grants(sid)[3]; return !ok })
	if held := f.Grants(sid); !cmp.Equal(held, map[int]uint64{2: tok2}) {
		t.Errorf("server-side grants = %v, want only bucket 2 at %d", held, tok2)
	}
	if err := w.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
	h.heldNone()
}

// TestWorkerReleaseBurst: handoffs that end together are told to the
// server in one Release call once their handlers have all returned, not
// one call for the first and another for the rest; and a slow handler
// holds the others back only until releaseCoalesce has passed (on the
// fake clock, so the test needs no timing).
func TestWorkerReleaseBurst(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	h := newRecHandler(t)
	gates := map[int]chan struct{}{}
	h.mu.Lock()
	for _, b := range []int{1, 2, 3, 4, 5} {
		gates[b] = make(chan struct{})
		h.gateRelease[b] = gates[b]
	}
	h.mu.Unlock()
	w := startWorker(t, f, h)
	sid := w.waitEvent(t, EventJoined).Session
	tok := map[int]uint64{}
	for _, b := range []int{1, 2, 3, 4, 5} {
		tok[b] = f.Grant(sid, b)
	}
	for range 5 {
		recv(t, h.acquires, "Acquire")
	}
	released := func(bs ...int) func() bool {
		return func() bool {
			for _, b := range bs {
				if w.grants[b] != nil {
					return false
				}
			}
			return true
		}
	}

	// A burst of three: all handlers running, then two return.
	for _, b := range []int{1, 2, 3} {
		f.AskRelease(sid, b)
	}
	for range 3 {
		recv(t, h.releases, "Release of the burst")
	}
	close(gates[1])
	close(gates[2])
	w.waitFor(t, "releases of 1 and 2", released(1, 2))
	if n := f.Releases().Len(); n != 0 {
		t.Fatalf("%d Release RPCs while bucket 3's handler still runs and the bound has not passed; want 0", n)
	}
	close(gates[3])
	got := grantsFromProto(f.Releases().Next(t).GetBuckets())
	slices.SortFunc(got, func(a, b Grant) int { return a.Bucket - b.Bucket })
	if want := []Grant{{Bucket: 1, Token: tok[1]}, {Bucket: 2, Token: tok[2]}, {Bucket: 3, Token: tok[3]}}; !cmp.Equal(got, want, grantCmp) {
		t.Errorf("Release RPC of the burst = %v, want one call with %v", got, want)
	}

	// A slow handler: bucket 5 is sent once the bound has passed, while
	// bucket 4's handler still runs; bucket 4 follows when it returns.
	f.AskRelease(sid, 4)
	f.AskRelease(sid, 5)
	recv(t, h.releases, "Release of 4 or 5")
	recv(t, h.releases, "Release of 4 or 5")
	close(gates[5])
	w.waitFor(t, "release of 5", released(5))
	f.Clock().MustBlockUntilDue(t, 1, releaseCoalesce)
	if n := f.Releases().Len(); n != 0 {
		t.Fatalf("%d Release RPCs before the bound passed; want 0", n)
	}
	f.Clock().Advance(releaseCoalesce)
	if got := grantsFromProto(f.Releases().Next(t).GetBuckets()); !cmp.Equal(got, []Grant{{Bucket: 5, Token: tok[5]}}, grantCmp) {
		t.Errorf("Release RPC after the bound = %v, want bucket 5 alone", got)
	}
	close(gates[4])
	if got := grantsFromProto(f.Releases().Next(t).GetBuckets()); !cmp.Equal(got, []Grant{{Bucket: 4, Token: tok[4]}}, grantCmp) {
		t.Errorf("Release RPC of the slow handler = %v, want bucket 4", got)
	}
	if err := w.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
	h.heldNone()
}

// TestWorkerOwnsBeforeFirstMap: a keyspace with no map yet (the real
// server has none until a member joins): the worker joins, and keys are
// unassigned until the first map arrives.
func TestWorkerOwnsBeforeFirstMap(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	h := newRecHandler(t)
	w := startWorker(t, f, h)
	w.waitEvent(t, EventJoined)
	_, err := w.OwnsString(keyInBucket(t, 9, 16))
	if wo, ok := AsWrongOwner(err); !ok || *wo != (WrongOwnerError{Bucket: 9}) {
		t.Errorf("Owns before the first map = %v, want bucket 9 unassigned at epoch 0", err)
	}
	f.SetMap("rooms", members("w1"), func(int) string { return "w1" })
	if err := w.router.WaitEpoch(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if _, err := w.OwnsString(keyInBucket(t, 9, 16)); !errors.Is(err, ErrNotGranted) {
		t.Errorf("Owns once the map names us = %v, want ErrNotGranted", err)
	}
}

// TestWorkerWaitGrantAfterJoin: right after a join, the worker's map can
// be one from before its join took effect (the empty map of a new
// keyspace, or a map of other members): WaitGrant waits through it
// instead of answering WrongOwner, and returns once the worker holds the
// bucket. WrongOwner is its answer only under a map that names the
// worker.
func TestWorkerWaitGrantAfterJoin(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	f.SetMap("rooms", nil, nil) // epoch 1: the empty map of a new keyspace
	h := newRecHandler(t)
	w := startWorker(t, f, h)
	sid := w.waitEvent(t, EventJoined).Session
	if err := w.router.WaitEpoch(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	key := []byte(keyInBucket(t, 10, 16))
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if g, err := w.WaitGrant(cancelled, key); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitGrant under the empty map = %+v, %v; want it to wait (context.Canceled)", g, err)
	}
	// A map of other members, from before the worker's join took effect.
	f.SetMap("rooms", members("w2"), func(int) string { return "w2" })
	if err := w.router.WaitEpoch(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	if g, err := w.WaitGrant(cancelled, key); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitGrant under a map without w1 = %+v, %v; want it to wait (context.Canceled)", g, err)
	}

	type result struct {
		g   Grant
		err error
	}
	waited := make(chan result, 1)
	go func() { // exits once WaitGrant returns: the grant below, or the worker's Close
		g, err := w.WaitGrant(context.Background(), key)
		waited <- result{g, err}
	}()
	owner := func(b int) string { return []string{"w1", "w2"}[b%2] } // bucket 10 is w1's
	f.SetMap("rooms", members("w1", "w2"), owner)
	tok := f.Grant(sid, 10)
	if r := recv(t, waited, "WaitGrant"); r.err != nil || plain(r.g) != (Grant{Bucket: 10, Token: tok}) {
		t.Errorf("WaitGrant = %+v, %v; want bucket 10 at token %d", r.g, r.err, tok)
	}
	// Under a map that names w1, another member's bucket is a final answer.
	if err := w.router.WaitEpoch(context.Background(), 3); err != nil {
		t.Fatal(err)
	}
	_, err := w.WaitGrant(cancelled, []byte(keyInBucket(t, 3, 16)))
	if wo, ok := AsWrongOwner(err); !ok || *wo != (WrongOwnerError{Bucket: 3, Owner: "w2", Address: "w2.internal:9000", Epoch: 3}) {
		t.Errorf("WaitGrant for w2's bucket = %v, want WrongOwner naming w2 at epoch 3", err)
	}
}
