package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/clock"
	"github.com/keyshard/keyshard/placement"
)

// Handler is called by a Worker as it gains and loses buckets.
//
// Acquire and Release are never called concurrently for the same bucket
// (they may be for different buckets): for one bucket the calls strictly
// alternate Acquire, Release, Acquire, ..., each starting after the
// previous one returned, across grants and across sessions. Release is
// called exactly once for every Acquire, even if Acquire returned an
// error.
//
// Acquire is called when the worker is granted a bucket. ctx is the
// grant's context: it stays valid after Acquire returns and is cancelled
// when the grant ends (after a handoff's Release returned; before Release
// is called when the worker self-fences, is hard-stopped, or the server
// took the bucket away). ctx.Err() also checks the clock against the
// session's fence deadline, so it is non-nil at once in a process resumed
// after a pause past the deadline, even before the Worker cancelled ctx;
// g.Valid() says the same. Work done for the bucket should run under ctx,
// check ctx.Err() or g.Valid() right before each write, and pass g.Token
// to storage (see the package documentation on fencing tokens). If Acquire returns an error the Worker logs it and reports it
// through OnEvent; it still holds the grant, and calls Release when the
// grant ends. A handler that cannot serve a bucket should retry inside
// Acquire or make the process leave.
//
// Release is called when the grant of bucket ends. For a handoff (the
// bucket moved to another member, or the worker is leaving) the grant's
// context is still live: finish the bucket's in-flight work, stop taking
// new work for it, and return when done; the next owner is granted the
// bucket only after Release returned (or after the keyspace's drain
// timeout). When the worker self-fences (its lease could not be renewed),
// the grant's context is cancelled first: stop at once, since another
// member may soon hold the bucket. The ctx passed to Release is cancelled
// only when the worker stops without draining (Run's ctx ended or Close's
// ctx expired). An error from Release is logged and reported; the bucket
// is released anyway.
//
// In a stream keyspace, a Handler that also implements FinalPositioner
// gives each bucket's final position after Release returned, and the
// Worker's Release call carries it.
//
// Calls come from the Worker's goroutines; a call that blocks delays only
// its own bucket, but Close waits for every call to return, so a Handler
// must not call Close itself.
type Handler interface {
	Acquire(ctx context.Context, g Grant) error
	Release(ctx context.Context, bucket int) error
}

// EventKind says what happened to a Worker.
type EventKind int

// Event kinds, in the order a worker usually sees them; EventRenewed
// follows every acknowledged keep-alive while a session lives.
const (
	// EventJoined: the worker joined its keyspace (Event.Session is new).
	EventJoined EventKind = iota + 1
	// EventAcquired: Handler.Acquire returned for Event.Grant (Err is
	// its error, if any).
	EventAcquired
	// EventReleased: Handler.Release returned for Event.Grant (Err is its
	// error, if any).
	EventReleased
	// EventFenced: the worker stopped acting on every bucket of the
	// session because it could not renew its lease in time, or because
	// the server ended the session. Err wraps ErrSessionLost and says
	// why. Release calls follow.
	EventFenced
	// EventSessionLost: every Release of the lost session returned;
	// Err wraps ErrSessionLost. The worker re-joins next.
	EventSessionLost
	// EventRejoined: the worker joined again with a new session after
	// losing one.
	EventRejoined
	// EventLeft: the worker left the keyspace gracefully (Close).
	EventLeft
	// EventRenewed: a keep-alive was acknowledged (about every TTL/3);
	// Event.Deadline is the session's fence deadline after it. For lease
	// health: how far ahead the deadline stays.
	EventRenewed
	// EventReleaseRecorded: the server recorded the Release of
	// Event.Grant, with Event.Final if the call carried a final position
	// (a stream keyspace). A bucket whose Release never reached the server
	// (the session was lost first) has EventReleased but not this: its
	// next holder starts at the session's last commit, as after a crash.
	EventReleaseRecorded
	// EventCommitted: the server applied a Commit (stream keyspaces);
	// Event.Commit is what was sent, with the final positions of released
	// buckets the Worker added.
	EventCommitted
)

func (k EventKind) String() string {
	switch k {
	case EventJoined:
		return "joined"
	case EventAcquired:
		return "acquired"
	case EventReleased:
		return "released"
	case EventFenced:
		return "fenced"
	case EventSessionLost:
		return "session lost"
	case EventRejoined:
		return "rejoined"
	case EventLeft:
		return "left"
	case EventRenewed:
		return "renewed"
	case EventReleaseRecorded:
		return "release recorded"
	case EventCommitted:
		return "committed"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is something that happened to a Worker, for observability.
type Event struct {
	Kind EventKind
	// Time is the Worker's clock when the event happened.
	Time    time.Time
	Session string
	// Grant is the grant concerned, for EventAcquired and EventReleased.
	Grant Grant
	// Deadline is the session's fence deadline, for EventRenewed (see
	// Grant.Deadline).
	Deadline time.Time
	// Final is, for EventReleased in a stream keyspace, the final position
	// the Release call hands over (the Handler's FinalPositioner gave it
	// and the bucket was asked back, not fenced); nil otherwise.
	Final *uint64
	// Commit is, for EventCommitted, the commit the server applied.
	Commit *Commit
	Err    error
}

type workerOptions struct {
	clock     clock.Clock
	log       *slog.Logger
	replace   bool
	margin    time.Duration
	marginSet bool
	onEvent   func(Event)
}

type workerOpt func(*workerOptions)

func (f workerOpt) applyWorker(o *workerOptions) { f(o) }

// Replace makes the worker's first Join take over its member id from a
// session that is still alive, such as the previous run of a restarted
// process. The old session is revoked, and its buckets move after a full
// lease TTL. Without it, such a Join fails with ErrExists.
func Replace(replace bool) WorkerOption {
	return workerOpt(func(o *workerOptions) { o.replace = replace })
}

// FenceMargin sets how long before its lease could expire at the server
// the worker stops acting on its buckets: it self-fences once
// lastAckedSend + TTL − margin passes, where lastAckedSend is the time at
// which the newest acknowledged keep-alive was sent. The default is
// max(TTL/10, 500ms). The margin must cover the time the application
// takes to notice a cancelled context, and clock drift between the worker
// and the server.
//
// NewWorker refuses a margin that is not positive, or not below
// MaxFenceMargin. The lease TTL comes from the keyspace at Join: a margin
// above TTL/2 is logged and TTL/2 is used.
func FenceMargin(d time.Duration) WorkerOption {
	return workerOpt(func(o *workerOptions) { o.margin, o.marginSet = d, true })
}

// MaxFenceMargin bounds FenceMargin: a keyspace's lease TTL is at most 24
// hours (the server's limit) and at most TTL/2 of a margin is used, so a
// margin of 12 hours or more is always a mistake.
const MaxFenceMargin = 12 * time.Hour

// OnEvent sets a function called with every Event of the worker. Calls
// are serialized, made from the worker's goroutines, and must not block
// (nor call Close).
func OnEvent(f func(Event)) WorkerOption {
	return workerOpt(func(o *workerOptions) { o.onEvent = f })
}

// Worker is a member of a keyspace: it joins, keeps its session alive,
// and calls a Handler as the control plane grants it buckets and asks for
// them back. Create it with NewWorker (which does no IO), run it with Run
// (which blocks), stop it with Close (which drains, then waits for Run).
// Its methods are safe for concurrent use.
//
// Keep-alives: the first goes right after Join, the next ones TTL/3 after
// the previous one was sent (or as soon as it returned, if later), each
// bounded by the fence deadline (newest acknowledged send + TTL − margin);
// a failed one is retried after 50ms, doubling up to TTL/9. Joins are
// bounded by TTL − margin; a Join abandoned that way is followed by one
// with replace. Re-joins after a session that never got a keep-alive
// acknowledged back off exponentially with jitter, up to the TTL.
//
// Over HTTP/2 (GRPC, https, or an HTTPClient that speaks h2c) the grants
// and the keep-alives after the first ride one Session stream: a
// keep-alive is then a small message on it rather than a KeepAlive call.
// One cut off by the stream's end is made again at once as a KeepAlive
// call; one the stream's replica does not answer within its share of the
// time left (at most ReplicaTimeout) ends the stream, as an unanswered
// call does. A Session stream answered UNIMPLEMENTED (an older server, an
// HTTP/1.1 hop) makes the Client's Workers use WatchGrants and KeepAlive
// calls instead, for the rest of the Client's life; the Connect protocol
// over http:// uses them from the start (Dial's transport speaks only
// HTTP/1.1 there). With SharedSessionStreams, the Workers of a Client
// share one Sessions stream per replica instead, with the same timing
// and failure handling; a Sessions stream that fails ends every Worker's
// part of it, and each reconnects as from its own.
//
// Run owns every goroutine of the Worker: a keep-alive loop that also
// self-fences (with one goroutine per keep-alive in flight), a grants
// follower (a Session stream, or WatchGrants, falling back to GetGrants
// long polls), a releaser that batches Release calls, an internal Router
// for Owns, and one goroutine per granted bucket that calls the Handler.
// Run returns after all of them exited. The goroutines of shared
// Sessions streams are the Client's: they exit when no session uses the
// stream any more, and the Client's Close waits for them.
type Worker struct {
	c        *Client
	keyspace string
	member   Member
	pm       *keyshardv1.Member // member, as Join sends it
	h        Handler
	opts     workerOptions
	clock    clock.Clock
	log      *slog.Logger
	router   *Router // follows the keyspace's map for Owns; runs within Run
	life     *lifecycle

	drainCh   chan struct{} // closed by Close: leave
	drainOnce sync.Once
	emitMu    sync.Mutex // serializes OnEvent calls

	mu      sync.Mutex
	hasher  placement.Hasher      // the keyspace's, from Join; zero before
	cur     *session              // the session being served; nil between sessions
	lastTTL time.Duration         // the lease TTL of the newest session; 0 before the first
	grants  map[int]*grantState   // bucket → its current grant, until Release returned
	last    map[int]chan struct{} // bucket → done channel of its latest grant goroutine
	changed chan struct{}         // closed and replaced when Held changes
	actors  sync.WaitGroup        // every grant goroutine
}

// grantState is one grant's lifecycle. Fields marked (mu) are guarded by
// Worker.mu.
type grantState struct {
	g        Grant
	s        *session
	cancel   context.CancelFunc // cancels the grant's context
	end      chan struct{}      // closed when the grant ends
	done     chan struct{}      // closed when its goroutine exits
	how      endKind            // (mu) how it ends; set before end is closed
	ending   bool               // (mu)
	acquired bool               // (mu) Acquire returned
	// releasing: (mu) counted in session.releasing, from its end as a
	// handoff until its Release returned.
	releasing bool
}

type endKind int

const (
	// endHandoff: the server asked for the bucket. Release with the grant
	// context live, then cancel it, then tell the server.
	endHandoff endKind = iota + 1
	// endFence: stop now. Cancel the grant context, then Release; the
	// server is not told (the session is gone or going).
	endFence
)

// session is one Join. Fields marked (mu) are guarded by Worker.mu.
type session struct {
	id       string
	ttl      time.Duration
	margin   time.Duration
	joinSent time.Time // when the Join that created it was sent
	hasher   placement.Hasher
	fenced   bool // (mu) no grant of the session may start
	released map[int]uint64
	// finals: (mu) the final positions of buckets handed off with one
	// (FinalPositioner), at their tokens, while the server may still hold
	// them (until a probe finds it does not, or the bucket is granted
	// again). Commit lists them as exceptions.
	finals  map[int]BucketPosition
	pending []Grant // (mu) released, to tell the server
	held    []Grant // (mu) what it held when it was fenced, to hand back
	// selfFenced: the worker fenced the session itself (its deadline
	// passed; the server had not ended it), so it acts on none of its
	// buckets any more (set once runSession ended).
	selfFenced bool
	kick       chan struct{} // cap 1: pending is not empty
	// releasing: (mu) handoffs whose Release handler is running (their
	// grants ended together, usually, in one map change).
	releasing int
	rev       uint64 // (mu) newest grants revision seen
	minRev    uint64 // (mu) newest revision of the session's own writes (Release): answers must not be older
	actors    sync.WaitGroup

	streamMu sync.Mutex
	stream   keepAliveStream // (streamMu) the open Session stream (or part of a Sessions stream), which keep-alives go on; nil when none

	clock    clock.Clock
	leaseMu  sync.Mutex
	deadline time.Time // (leaseMu) the fence deadline: newest acknowledged send + TTL − margin
	void     bool      // (leaseMu) the deadline passed or the session was fenced; never cleared
	acked    bool      // (leaseMu) a keep-alive was acknowledged
}

// valid reports whether the session is within its fence deadline now.
// Once it has returned false it always does: a renewal acknowledged after
// the deadline does not bring the session back.
func (s *session) valid() bool {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	return s.validLocked()
}

func (s *session) validLocked() bool {
	if !s.void && !s.clock.Now().Before(s.deadline) {
		s.void = true
	}
	return !s.void
}

// fenceDeadline returns the session's fence deadline.
func (s *session) fenceDeadline() time.Time {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	return s.deadline
}

// renewed moves the fence deadline to sent + ttl − margin for a
// keep-alive sent at sent and acknowledged now (ttl: the lease time the
// server says is left, at most the session's TTL). It reports false, and
// moves nothing, if the session is no longer valid.
func (s *session) renewed(sent time.Time, ttl time.Duration) (time.Time, bool) {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	if !s.validLocked() {
		return s.deadline, false
	}
	s.acked = true
	if d := sent.Add(ttl - s.margin); d.After(s.deadline) {
		s.deadline = d
	}
	return s.deadline, true
}

// end makes the session invalid for good.
func (s *session) end() {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	s.void = true
}

func (s *session) wasAcked() bool {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	return s.acked
}

// grantContext is a grant's context. Its Err also compares the clock with
// the session's fence deadline, and cancels the context first if the
// deadline passed: a process resumed after a pause past the deadline sees
// the grant cancelled on its first check, before the Worker's timers have
// run.
type grantContext struct {
	context.Context
	cancel context.CancelCauseFunc
	s      *session
}

func (c *grantContext) Err() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	if !c.s.valid() {
		c.cancel(fmt.Errorf("%w (lease TTL %v, margin %v): %w", errFenced, c.s.ttl, c.s.margin, ErrSessionLost))
	}
	return c.Context.Err()
}

// keepAliveRetry is the first delay before a failed keep-alive is
// retried; it doubles up to TTL/9.
const keepAliveRetry = 50 * time.Millisecond

var (
	errFenced      = errors.New("lease deadline passed")
	errSessionGone = errors.New("the server ended the session")
)

// NewWorker returns a Worker that will join keyspace as member m and call
// h. It does no IO and starts nothing: call Run. The lease TTL comes from
// the keyspace at Join. It returns an *ArgError (wrapping ErrInvalid) for
// a nil Client or Handler, a bad keyspace name, member id or weight, or a
// bad option (see FenceMargin); a keyspace that does not exist is found
// out by Run.
func NewWorker(c *Client, keyspace string, m Member, h Handler, opts ...WorkerOption) (*Worker, error) {
	const fn = "NewWorker"
	if c == nil {
		return nil, argError(fn, "client", "is nil; create one with Dial")
	}
	if err := validName(fn, "keyspace name", keyspace); err != nil {
		return nil, err
	}
	pm, err := memberToProto(fn, m)
	if err != nil {
		return nil, err
	}
	if h == nil {
		return nil, argError(fn, "handler", "is nil")
	}
	o := workerOptions{clock: c.opts.clock, log: c.opts.log}
	for _, opt := range opts {
		if opt != nil {
			opt.applyWorker(&o)
		}
	}
	if o.marginSet {
		switch {
		case o.margin < 0:
			return nil, argError(fn, "FenceMargin", "%v is negative", o.margin)
		case o.margin == 0:
			return nil, argError(fn, "FenceMargin", "is 0; leave the option out for the default, max(TTL/10, 500ms)")
		case o.margin >= MaxFenceMargin:
			return nil, argError(fn, "FenceMargin", "%v is not below %v: no lease TTL leaves room for it", o.margin, MaxFenceMargin)
		}
	}
	r, err := NewRouter(c, keyspace, Clock(o.clock), Logger(o.log))
	if err != nil {
		return nil, err // cannot happen: the keyspace name is valid
	}
	return &Worker{
		c: c, keyspace: keyspace, member: m, pm: pm, h: h, opts: o,
		clock:   o.clock,
		log:     o.log.With("keyspace", keyspace, "member", m.ID),
		router:  r,
		life:    newLifecycle("Worker"),
		drainCh: make(chan struct{}),
		grants:  make(map[int]*grantState),
		last:    make(map[int]chan struct{}),
		changed: make(chan struct{}),
	}, nil
}

// Run joins the keyspace and serves grants until Close, ctx ending, or a
// permanent error. It re-joins by itself with a new session after losing
// one (see ErrSessionLost). It returns nil after Close (which reports
// whether the drain completed), ctx.Err() if ctx ended (the worker then
// stops at once, as if the process died: the server moves its buckets
// when the lease expires), or an error wrapping ErrNotFound (no such
// keyspace), ErrExists (the member id is in use; see Replace),
// ErrUnauthenticated, ErrPermissionDenied, ErrInvalid or ErrClosed (the
// Client, or the Worker before Run, was closed). Run may be called once.
func (w *Worker) Run(ctx context.Context) error {
	parent := ctx
	ctx, end, err := w.life.begin(ctx, w.c)
	if err != nil {
		return err
	}
	defer end()
	var routing sync.WaitGroup
	routerErr := make(chan error, 1)
	routing.Go(func() { routerErr <- w.router.Run(ctx) }) // exits when ctx ends or the router is closed below

	err = w.run(ctx, routerErr)

	// Whatever is still held ends now.
	w.mu.Lock()
	for _, gs := range w.grants {
		w.endGrantLocked(gs, endFence)
	}
	w.mu.Unlock()
	w.actors.Wait()
	w.router.Close()
	routing.Wait()
	switch {
	case err == nil:
		return nil
	case w.c.closed():
		return ErrClosed
	case parent.Err() == nil && w.draining():
		return nil // Close stopped the worker when its ctx expired; Close reports that
	}
	return err
}

// run is Run's loop over sessions.
// The router retries failed fetches itself; routerErr has its error if it
// stopped before it had a map.
func (w *Worker) run(ctx context.Context, routerErr <-chan error) error {
	select {
	case <-w.router.ready:
	case err := <-routerErr:
		if ctx.Err() != nil {
			return w.stopped(ctx)
		}
		return err
	case <-ctx.Done():
		return w.stopped(ctx)
	case <-w.drainCh:
		return w.stopped(ctx)
	}
	// A session that got a keep-alive acknowledged is followed by a Join
	// at once. Sessions lost before that (a replica that cannot serve, a
	// lease that cannot be renewed) are followed by Joins that back off
	// exponentially with jitter, up to the lease TTL (at least 1s, at
	// most 10s), so that they do not turn into a tight loop of Joins.
	var rejoin backoff
	fenced := "" // the session just lost, if the worker fenced it itself
	for first := true; ; first = false {
		s, err := w.join(ctx, w.pm, first, fenced)
		if err != nil {
			return err
		}
		if s == nil {
			return w.stopped(ctx)
		}
		w.mu.Lock()
		w.hasher = s.hasher
		w.lastTTL = s.ttl
		w.cur = s
		w.mu.Unlock()
		if first {
			w.emit(Event{Kind: EventJoined, Session: s.id})
		} else {
			w.emit(Event{Kind: EventRejoined, Session: s.id})
		}
		cause := w.runSession(ctx, s)
		w.mu.Lock()
		w.cur = nil
		w.mu.Unlock()
		switch {
		case cause == nil:
			w.emit(Event{Kind: EventLeft, Session: s.id})
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		}
		fenced = ""
		if s.selfFenced {
			fenced = s.id
		}
		lost := fmt.Errorf("session %s: %w: %w", s.id, cause, ErrSessionLost)
		w.log.Error("keyshard: session lost; re-joining", "session", s.id, "err", cause)
		w.emit(Event{Kind: EventSessionLost, Session: s.id, Err: lost})
		if w.draining() {
			return nil // nothing is held, so nothing is left to drain
		}
		if s.wasAcked() {
			rejoin.reset()
			continue
		}
		rejoin.limit = min(max(s.ttl, time.Second), backoffCap)
		if !w.wait(ctx, rejoin.next()) {
			return w.stopped(ctx)
		}
	}
}

// stopped is what Run returns when it stopped waiting: ctx's error, or
// nil if Close asked it to stop.
func (w *Worker) stopped(ctx context.Context) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return nil
}

// wait sleeps d and reports whether it did (false: ctx ended or Close was
// called).
func (w *Worker) wait(ctx context.Context, d time.Duration) bool {
	t := w.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-ctx.Done():
		return false
	case <-w.drainCh:
		return false
	}
}

func (w *Worker) draining() bool {
	select {
	case <-w.drainCh:
		return true
	default:
		return false
	}
}

// permanent reports whether retrying err cannot help.
func permanent(err error, first bool) bool {
	for _, s := range []error{ErrInvalid, ErrNotFound, ErrImmutable, ErrUnauthenticated, ErrPermissionDenied, ErrClosed} {
		if errors.Is(err, s) {
			return true
		}
	}
	// At a re-join, our own old session may still be alive: wait for it
	// to expire.
	return first && errors.Is(err, ErrExists)
}

// join joins the keyspace, retrying failures that may pass. It returns
// nil and no error if ctx ended or Close was called meanwhile.
//
// A Join is bounded by the lease TTL minus the fence margin (before the
// first session, when the TTL is not known yet, by ReplicaTimeout per
// replica): an answer that comes later would start a session whose fence
// deadline has already passed. A Join abandoned that way, or failed
// without a clear refusal, may still have created a session at the
// server, so the next Join asks to replace it.
//
// After the worker fenced its session itself, fenced is that session: the
// Join replaces it and names it (fenced_session), so the leader revokes it
// without quarantine and its buckets are granted again at once, instead
// of after what remained of its lease (which etcd extends by a whole TTL
// when it changes leaders).
func (w *Worker) join(ctx context.Context, pm *keyshardv1.Member, first bool, fenced string) (*session, error) {
	req := &keyshardv1.JoinRequest{Keyspace: w.keyspace, Member: pm, Replace: w.opts.replace || fenced != "", FencedSession: fenced}
	var b backoff
	for !w.draining() {
		w.mu.Lock()
		within := w.lastTTL - w.marginFor(w.lastTTL)
		w.mu.Unlock()
		if within <= 0 {
			within = w.c.opts.replicaTimeout * time.Duration(len(w.c.eps))
		}
		sent := w.clock.Now()
		resp, err := callWithin(ctx, w.c, memberAPI.Join, req, budget{within: within})
		if err == nil {
			s, err := w.newSession(resp, sent)
			if err != nil {
				w.abandon(ctx, resp.GetSession())
				return nil, err
			}
			if s.valid() {
				return s, nil
			}
			err = fmt.Errorf("%w: the Join's answer came %v after it was sent, past the session's fence deadline (lease TTL %v, margin %v)",
				ErrUnavailable, w.clock.Since(sent), s.ttl, s.margin)
		}
		if ctx.Err() != nil {
			return nil, nil
		}
		if errors.Is(err, ErrUnavailable) || errors.Is(err, ErrConflict) || connect.CodeOf(err) == connect.CodeUnknown {
			req.Replace = true // our Join may have created a session that nobody keeps alive
		}
		if permanent(err, first) {
			if errors.Is(err, ErrExists) {
				return nil, fmt.Errorf("join keyspace %q as %q: %w (pass client.Replace(true) to take over the id from a live session)", w.keyspace, w.member.ID, err)
			}
			return nil, fmt.Errorf("join keyspace %q as %q: %w", w.keyspace, w.member.ID, err)
		}
		w.log.Warn("keyshard: join failed; retrying", "err", err)
		if !w.wait(ctx, b.next()) {
			return nil, nil
		}
	}
	return nil, nil
}

func (w *Worker) newSession(resp *keyshardv1.JoinResponse, sent time.Time) (*session, error) {
	ttl := resp.GetLeaseTtl().AsDuration()
	if ttl <= 0 {
		ttl = resp.GetKeyspace().GetLeaseTtl().AsDuration()
	}
	if resp.GetSession() == "" || ttl <= 0 {
		return nil, fmt.Errorf("join keyspace %q: the server's answer lacks the session or its lease TTL", w.keyspace)
	}
	k := resp.GetKeyspace()
	h, err := placement.NewHasher(placement.HashMode(k.GetHash()), int(k.GetBuckets()))
	if err != nil {
		return nil, fmt.Errorf("join keyspace %q: %w: the keyspace's hash %q with %d buckets cannot be used by this SDK (%v); upgrade the client",
			w.keyspace, ErrInvalid, k.GetHash(), k.GetBuckets(), err)
	}
	margin := w.marginFor(ttl)
	if w.opts.margin > margin {
		w.log.Warn("keyshard: fence margin too large for the lease TTL; using TTL/2", "margin", w.opts.margin, "ttl", ttl)
	}
	return &session{
		id: resp.GetSession(), ttl: ttl, margin: margin, joinSent: sent,
		hasher:   h,
		released: make(map[int]uint64),
		finals:   make(map[int]BucketPosition),
		kick:     make(chan struct{}, 1),
		clock:    w.clock,
		deadline: sent.Add(ttl - margin),
	}, nil
}

// marginFor returns the fence margin for a lease TTL: FenceMargin, or
// max(TTL/10, 500ms), at most TTL/2.
func (w *Worker) marginFor(ttl time.Duration) time.Duration {
	margin := w.opts.margin
	if margin <= 0 {
		margin = max(ttl/10, 500*time.Millisecond)
	}
	return min(margin, ttl/2)
}

// abandon tries once to end a session the worker will not use, so that
// it does not linger until its lease expires.
func (w *Worker) abandon(ctx context.Context, session string) {
	if session == "" {
		return
	}
	if _, err := callWithin(ctx, w.c, memberAPI.Leave, &keyshardv1.LeaveRequest{Session: session}, budget{within: w.c.opts.replicaTimeout}); err != nil {
		w.log.Warn("keyshard: could not leave an unusable session; it ends when its lease expires", "session", session, "err", err)
	}
}

// runSession serves one session until it ends. It returns nil if the
// worker left, ctx.Err() if ctx ended, or why the session was lost.
func (w *Worker) runSession(ctx context.Context, s *session) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	ended := make(chan error, 3) // each of keep, followGrants and leave sends at most once
	// Each of these exits when sctx ends; keep and followGrants also when
	// the session ends.
	wg.Go(func() {
		if err := w.keep(sctx, s); err != nil {
			ended <- err
		}
	})
	wg.Go(func() {
		if err := w.followGrants(sctx, ctx, s); err != nil {
			ended <- err
		}
	})
	wg.Go(func() { w.releaseLoop(sctx, s) })

	leaving := false
	drain := w.drainCh
	var cause error
	for cause == nil {
		select {
		case <-ctx.Done():
			cause = ctx.Err()
		case <-drain:
			drain, leaving = nil, true
			wg.Go(func() { // exits once Leave succeeded, or sctx ends
				if err := w.leave(sctx, s); err != nil {
					ended <- err
				}
			})
		case cause = <-ended:
		}
	}
	left := leaving && errors.Is(cause, errSessionGone)
	// Whatever the session still holds ends now, before anything waits.
	w.fence(s, cause, !left && ctx.Err() == nil)
	cancel()
	wg.Wait()
	s.actors.Wait()
	if left {
		return nil
	}
	if ctx.Err() == nil && !errors.Is(cause, errSessionGone) {
		s.selfFenced = true
		if w.draining() {
			// No Join follows: give back what the session held now.
			w.handBack(ctx, s)
		}
	}
	return cause
}

// handBack gives the server back every bucket session s held when the
// worker fenced itself while leaving: no Join follows to name the session
// as fenced, and nothing acts on its buckets any more (the fence deadline
// passed, every handler has returned, no grant of s starts again), so
// they need not wait for the session's lease to expire at etcd. It asks
// the server what the session holds (grants whose news the fence cut off
// included) and releases all of it. It is best effort, for at most one
// TTL: the lease's expiry hands the buckets over anyway.
func (w *Worker) handBack(ctx context.Context, s *session) {
	w.mu.Lock()
	held := map[int]uint64{}
	for b, tok := range s.released {
		held[b] = tok
	}
	for _, g := range append(s.pending, s.held...) {
		held[g.Bucket] = g.Token
	}
	s.pending, s.held = nil, nil
	minRev := max(s.rev, s.minRev)
	w.mu.Unlock()
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t := w.clock.AfterFunc(s.ttl, cancel)
	defer t.Stop()
	resp, err := callWithin(hctx, w.c, memberAPI.GetGrants, &keyshardv1.GetGrantsRequest{Session: s.id, MinRevision: minRev}, budget{within: s.ttl})
	switch {
	case errors.Is(err, ErrNotFound):
		return // the session is gone: so are its grants
	case err != nil:
		w.log.Warn("keyshard: cannot read the fenced session's grants; handing back the ones it knew", "session", s.id, "err", err)
	default:
		for _, g := range resp.GetGrants() {
			held[int(g.GetBucket())] = g.GetToken()
		}
	}
	if len(held) > 0 {
		batch := make([]Grant, 0, len(held))
		for b, tok := range held {
			batch = append(batch, Grant{Bucket: b, Token: tok})
		}
		slices.SortFunc(batch, func(a, b Grant) int { return a.Bucket - b.Bucket })
		w.log.Info("keyshard: handing back the buckets of the fenced session", "session", s.id, "buckets", len(batch))
		w.sendRelease(hctx, s, batch)
	}
}

// keep renews the session and self-fences when its fence deadline
// (newest acknowledged send + TTL − margin) passes. It sends the first
// keep-alive at once and the next ones TTL/3 after the previous one was
// sent, whenever the answer came; one keep-alive is in flight at a time,
// bounded by the fence deadline (a slow answer is still useful until
// then). Each goes on the session's Session stream while one is open, as
// a KeepAlive call otherwise (see keepAliveOnce). A failed keep-alive is
// retried promptly, with a short backoff; one whose stream ended before
// its answer is made again at once. It returns nil when ctx ends, or why
// the session ended.
func (w *Worker) keep(ctx context.Context, s *session) error {
	interval := s.ttl / 3
	retry := backoff{base: keepAliveRetry, limit: max(interval/3, keepAliveRetry)}
	deadline := s.fenceDeadline()
	fence := w.clock.NewTimer(deadline.Sub(w.clock.Now()))
	defer fence.Stop()
	next := w.clock.NewTimer(interval)
	defer next.Stop()

	type result struct {
		sent time.Time
		ttl  time.Duration // the time left on the lease, as the server answered
		err  error
	}
	results := make(chan result, 1) // at most one call in flight
	inflight, due := false, false
	var calls sync.WaitGroup
	callCtx, callCancel := context.WithCancel(ctx)
	defer func() { callCancel(); calls.Wait() }()
	fenced := func() error {
		cause := fmt.Errorf("%w: no keep-alive acknowledged in time (lease TTL %v, margin %v)", errFenced, s.ttl, s.margin)
		w.fence(s, cause, true)
		return cause
	}
	// send starts a keep-alive; it reports false if the deadline has
	// passed already.
	first := true
	send := func() bool {
		sent := w.clock.Now()
		left := s.fenceDeadline().Sub(sent)
		if left <= 0 {
			return false
		}
		inflight = true
		next.Reset(interval) // counted from this send, not from its answer
		onStream := !first
		first = false
		calls.Go(func() { // exits when the keep-alive is answered or failed; bounded by the fence deadline and callCtx
			ttl, err := w.keepAliveOnce(callCtx, s, left, onStream)
			results <- result{sent, ttl, err}
		})
		return true
	}

	// The first keep-alive goes at once, as a KeepAlive call, not waiting
	// for the Session stream: the Join may have been slow, and the server
	// assigns buckets to a session only once it is renewed.
	if !send() {
		return fenced()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-fence.C():
			if s.valid() { // a stale tick from before a renewal
				fence.Reset(s.fenceDeadline().Sub(w.clock.Now()))
				continue
			}
			return fenced()
		case <-next.C():
			if inflight {
				due = true // sent when the call returns
				continue
			}
			if !send() {
				return fenced()
			}
		case r := <-results:
			inflight = false
			switch {
			case r.err == nil:
				ttl := s.ttl
				if left := r.ttl; left > 0 && left < ttl {
					ttl = left // the server renewed after we sent, so sent+left is still early
				}
				d, ok := s.renewed(r.sent, ttl)
				if !ok {
					return fenced() // acknowledged, but only after the deadline had passed
				}
				fence.Reset(d.Sub(w.clock.Now()))
				retry.reset()
				w.emit(Event{Kind: EventRenewed, Session: s.id, Deadline: d})
			case errors.Is(r.err, ErrNotFound):
				return fmt.Errorf("keep-alive: %w: %w", errSessionGone, r.err)
			case ctx.Err() != nil:
				return nil
			case errors.Is(r.err, errStreamEnded):
				// Not refused, just cut off: made again at once (as a
				// KeepAlive call, or on the next stream).
				w.log.Warn("keyshard: keep-alive's stream ended before its answer; retrying at once", "session", s.id, "err", r.err)
				due = true
			default:
				w.log.Warn("keyshard: keep-alive failed; retrying", "session", s.id, "err", r.err)
				due = false
				next.Reset(retry.next())
			}
			if due {
				due = false
				if !send() {
					return fenced()
				}
			}
		}
	}
}

// keepAliveOnce makes one keep-alive of session s, within left, and
// returns the time left on the lease that its answer gives. With
// onStream, it goes on the session's Session stream if one is open (or
// its part of a shared Sessions stream, in the stream's next keep-alive
// message),
// bounded there as a call's first attempt would be (at most
// ReplicaTimeout, with several replicas); else, or if the stream ended
// before it could be sent, it is a KeepAlive call.
func (w *Worker) keepAliveOnce(ctx context.Context, s *session, left time.Duration, onStream bool) (time.Duration, error) {
	if ss := s.openStream(); onStream && ss != nil {
		limit := left
		if n := len(w.c.eps); n > 1 {
			limit = min(w.c.opts.replicaTimeout, left/time.Duration(n))
		}
		ttl, err := ss.keepAlive(ctx, limit)
		if !errors.Is(err, errNotSent) {
			return ttl, err
		}
	}
	resp, err := callWithin(ctx, w.c, memberAPI.KeepAlive, &keyshardv1.KeepAliveRequest{Session: s.id}, budget{within: left})
	if err != nil {
		return 0, err
	}
	return resp.GetTtl().AsDuration(), nil
}

// fence ends every grant of s at once (cancelling their contexts first)
// and stops new ones. It is idempotent; report says whether to emit
// EventFenced.
func (w *Worker) fence(s *session, cause error, report bool) {
	w.mu.Lock()
	if s.fenced {
		w.mu.Unlock()
		return
	}
	s.fenced = true
	s.end()
	for _, gs := range w.grants {
		if gs.s == s {
			s.held = append(s.held, gs.g)
			w.endGrantLocked(gs, endFence)
		}
	}
	w.notifyLocked()
	w.mu.Unlock()
	if report {
		w.log.Error("keyshard: self-fenced: stopped acting on every bucket", "session", s.id, "err", cause)
		w.emit(Event{Kind: EventFenced, Session: s.id, Err: fmt.Errorf("%w: %w", cause, ErrSessionLost)})
	}
}

// followGrants applies the session's grants as the server publishes
// them: on a Session stream, which carries keep's keep-alives too (with
// SharedSessionStreams, on the Client's shared Sessions stream), or on
// WatchGrants if the Client has no Session streams. It returns nil when
// sctx ends, or an error wrapping errSessionGone.
func (w *Worker) followGrants(sctx, runCtx context.Context, s *session) error {
	f := follower[keyshardv1.GetGrantsResponse]{
		clock: w.clock,
		log:   w.log,
		what:  "grants",
		watch: func(ctx context.Context, yield func(*keyshardv1.GetGrantsResponse)) error {
			w.mu.Lock()
			minRev := max(s.rev, s.minRev)
			w.mu.Unlock()
			if w.c.sessionStreams() {
				rpc, follow := "Session", w.followSession
				if w.c.opts.sharedSessions {
					rpc, follow = "Sessions", w.followShared
				}
				err := follow(ctx, s, minRev, yield)
				if connect.CodeOf(err) != connect.CodeUnimplemented {
					return err
				}
				// An older server, or HTTP/1.1 on the way: WatchGrants
				// and KeepAlive calls, from now on.
				w.c.noSessionStreams(rpc, err)
			}
			return stream(ctx, w.c, memberAPI.WatchGrants, &keyshardv1.WatchGrantsRequest{Session: s.id, MinRevision: minRev}, yield)
		},
		poll: func(ctx context.Context) (*keyshardv1.GetGrantsResponse, bool, error) {
			w.mu.Lock()
			since, minRev := s.rev, max(s.rev, s.minRev)
			w.mu.Unlock()
			req := &keyshardv1.GetGrantsRequest{Session: s.id, SinceRevision: since, MinRevision: minRev, Wait: durationpb.New(pollWait)}
			resp, err := callWithin(ctx, w.c, memberAPI.GetGrants, req, budget{wait: pollWait})
			if err != nil {
				return nil, false, err
			}
			return resp, resp.GetRevision() > since, nil
		},
		apply: func(m *keyshardv1.GetGrantsResponse) { w.reconcile(sctx, runCtx, s, m) },
		fatal: func(err error) bool { return errors.Is(err, ErrNotFound) || errors.Is(err, ErrClosed) },
	}
	err := f.run(sctx)
	if errors.Is(err, ErrNotFound) {
		return fmt.Errorf("watch grants: %w: %w", errSessionGone, err)
	}
	return err
}

// reconcile makes the worker's grants of session s match what the server
// says: new grants start, grants listed in release are handed off, and
// grants the server no longer lists end at once.
func (w *Worker) reconcile(sctx, runCtx context.Context, s *session, m *keyshardv1.GetGrantsResponse) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s.fenced || sctx.Err() != nil {
		return
	}
	if rev := m.GetRevision(); rev != 0 {
		if rev < s.rev {
			return // older than what we applied
		}
		s.rev = rev
	}
	granted := make(map[int]Grant, len(m.GetGrants()))
	for _, g := range m.GetGrants() {
		granted[int(g.GetBucket())] = Grant{Bucket: int(g.GetBucket()), Token: g.GetToken(), From: g.GetFrom()}
	}
	for b, tok := range s.released {
		if g, ok := granted[b]; !ok || g.Token != tok {
			delete(s.released, b) // the server has taken our release in
		}
	}
	for b, gs := range w.grants {
		if gs.s != s {
			continue
		}
		if g, ok := granted[b]; !ok || g.Token != gs.g.Token {
			w.log.Warn("keyshard: the server took back a bucket without a release; stopping it", "bucket", b, "token", gs.g.Token)
			w.endGrantLocked(gs, endFence)
		}
	}
	for b, g := range granted {
		if t, ok := s.released[b]; ok && t == g.Token {
			continue
		}
		if gs := w.grants[b]; gs != nil && gs.s == s && gs.g.Token == g.Token {
			continue
		}
		if f, ok := s.finals[b]; ok && f.Token != g.Token {
			delete(s.finals, b) // granted again: the old token is not held any more
		}
		w.startGrantLocked(runCtx, s, g)
	}
	for _, b := range m.GetRelease() {
		if gs := w.grants[int(b)]; gs != nil && gs.s == s {
			w.endGrantLocked(gs, endHandoff)
		}
	}
	w.notifyLocked()
}

func (w *Worker) startGrantLocked(runCtx context.Context, s *session, g Grant) {
	ctx, cancel := context.WithCancelCause(runCtx)
	gctx := &grantContext{Context: ctx, cancel: cancel, s: s}
	g.life = &grantLife{done: ctx.Done(), s: s}
	gs := &grantState{g: g, s: s, cancel: func() { cancel(nil) }, end: make(chan struct{}), done: make(chan struct{})}
	prev := w.last[g.Bucket]
	w.last[g.Bucket] = gs.done
	w.grants[g.Bucket] = gs
	w.actors.Add(1)
	s.actors.Add(1)
	go w.serveGrant(gctx, runCtx, gs, prev) // exits once the grant ended and Release returned
}

// endGrantLocked ends gs. A fence cancels the grant's context at once,
// even if a handoff is already under way.
func (w *Worker) endGrantLocked(gs *grantState, how endKind) {
	if how == endFence {
		gs.cancel()
		gs.how = endFence
	}
	if !gs.ending {
		gs.ending = true
		gs.how = how
		close(gs.end)
		if how == endHandoff && !gs.s.fenced {
			gs.releasing = true
			gs.s.releasing++
		}
	}
}

// serveGrant calls the handler for one grant: Acquire, then Release once
// the grant ends. It runs after the previous grant of the bucket's
// goroutine (prev) exited, so calls for one bucket never overlap.
func (w *Worker) serveGrant(gctx, runCtx context.Context, gs *grantState, prev <-chan struct{}) {
	defer w.actors.Done()
	defer gs.s.actors.Done()
	defer close(gs.done)
	if prev != nil {
		<-prev
	}
	b := gs.g.Bucket
	var final uint64
	var finalOK bool
	w.mu.Lock()
	skip := gs.ending // ended before it started: no Acquire, so no Release
	w.mu.Unlock()
	_, positioner := w.h.(FinalPositioner)
	if skip && positioner {
		// Nothing of the bucket was handled: hand it over where it
		// started, so that no later commit of the session moves it.
		final, finalOK = gs.g.From, true
	}
	if !skip {
		err := w.h.Acquire(gctx, gs.g)
		if err != nil {
			w.log.Error("keyshard: Acquire failed; the bucket stays held until released", "bucket", b, "token", gs.g.Token, "err", err)
		}
		w.mu.Lock()
		gs.acquired = true
		w.notifyLocked()
		w.mu.Unlock()
		w.emit(Event{Kind: EventAcquired, Session: gs.s.id, Grant: gs.g, Err: err})
		<-gs.end
		err = w.h.Release(runCtx, b)
		gs.cancel()
		if err != nil {
			w.log.Error("keyshard: Release failed; releasing the bucket anyway", "bucket", b, "token", gs.g.Token, "err", err)
		}
		if fp, ok := w.h.(FinalPositioner); ok {
			if final, finalOK = fp.FinalPosition(b); !finalOK {
				final, finalOK = gs.g.From, true // it handled nothing of the bucket
			}
		}
		ev := Event{Kind: EventReleased, Session: gs.s.id, Grant: gs.g, Err: err}
		w.mu.Lock()
		if finalOK && gs.how == endHandoff && !gs.s.fenced {
			f := final
			ev.Final = &f
		}
		w.mu.Unlock()
		w.emit(ev)
	}
	gs.cancel()

	// In one step: the grant leaves Granted and its final position
	// enters s.finals, so a commit computed from Granted never misses it.
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.grants[b] == gs {
		delete(w.grants, b)
	}
	if w.last[b] == gs.done {
		delete(w.last, b)
	}
	if gs.releasing {
		gs.releasing = false
		gs.s.releasing--
	}
	if gs.how == endHandoff && !gs.s.fenced {
		if finalOK {
			gs.s.finals[b] = BucketPosition{Bucket: b, Token: gs.g.Token, Position: final}
		}
		gs.s.released[b] = gs.g.Token
		gs.s.pending = append(gs.s.pending, gs.g)
		select {
		case gs.s.kick <- struct{}{}:
		default:
		}
	}
	w.notifyLocked()
}

// releaseCoalesce bounds how long released buckets wait for the other
// handoffs of their burst (those whose Release handlers are still running)
// before they are sent without them.
const releaseCoalesce = 2 * time.Millisecond

// releaseLoop tells the server about released buckets, one call at a
// time. A map change usually ends many grants at once, whose handlers
// return within microseconds of each other: the loop sends once none of
// them is still running, so that the burst goes in one call rather than
// one call for the first bucket and, a round trip later, one for the
// rest. A slow handler holds the others back by at most releaseCoalesce;
// buckets released while a call is in flight go in the next. It exits
// when ctx ends.
func (w *Worker) releaseLoop(ctx context.Context, s *session) {
	var bound clock.Timer // running while released buckets wait for their burst
	defer func() {
		if bound != nil {
			bound.Stop()
		}
	}()
	for {
		var boundC <-chan time.Time
		if bound != nil {
			boundC = bound.C()
		}
		expired := false
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		case <-boundC:
			bound, expired = nil, true
		}
		for {
			w.mu.Lock()
			if len(s.pending) > 0 && s.releasing > 0 && !expired {
				// More of the burst is coming: wait for its kick, or
				// the bound.
				if bound == nil {
					bound = w.clock.NewTimer(releaseCoalesce)
				}
				w.mu.Unlock()
				break
			}
			batch := s.pending
			s.pending = nil
			w.mu.Unlock()
			if bound != nil {
				bound.Stop()
				bound = nil
			}
			expired = false
			if len(batch) == 0 {
				break
			}
			if !w.sendRelease(ctx, s, batch) {
				return
			}
		}
	}
}

// sendRelease sends one Release call for batch, retrying failures that
// may pass. The server refuses a whole call if one of its buckets is no
// longer held at that token (it was taken back meanwhile); the buckets are
// then sent one by one, so the others still go through. Buckets with a
// final position (session.finals) carry it. A bucket whose final position
// the server refuses (FAILED_PRECONDITION: below its committed position)
// is released again without one, keeping its committed position. It
// reports false if ctx ended.
func (w *Worker) sendRelease(ctx context.Context, s *session, batch []Grant) bool {
	return w.sendReleaseWith(ctx, s, batch, true)
}

func (w *Worker) sendReleaseWith(ctx context.Context, s *session, batch []Grant, positions bool) bool {
	var b backoff
	for {
		req := &keyshardv1.ReleaseRequest{Session: s.id, Buckets: grantsToProto(batch)}
		if positions {
			w.mu.Lock()
			for _, g := range batch {
				if f, ok := s.finals[g.Bucket]; ok && f.Token == g.Token {
					req.Positions = append(req.Positions, &keyshardv1.BucketPosition{Bucket: uint32(f.Bucket), Token: f.Token, Position: f.Position})
				}
			}
			w.mu.Unlock()
		}
		resp, err := call(ctx, w.c, memberAPI.Release, req)
		switch {
		case err == nil:
			// Later answers, through any replica, must include this release.
			w.mu.Lock()
			s.minRev = max(s.minRev, resp.GetRevision())
			w.mu.Unlock()
			finals := make(map[int]uint64, len(req.Positions))
			for _, p := range req.Positions {
				finals[int(p.GetBucket())] = p.GetPosition()
			}
			for _, g := range batch {
				ev := Event{Kind: EventReleaseRecorded, Session: s.id, Grant: g}
				if f, ok := finals[g.Bucket]; ok {
					ev.Final = &f
				}
				w.emit(ev)
			}
			return true
		case ctx.Err() != nil:
			return false
		case errors.Is(err, ErrNotFound):
			return true // the session is gone; the keep-alive loop sees it too
		case (errors.Is(err, ErrInvalid) || errors.Is(err, ErrImmutable)) && len(batch) > 1:
			for _, g := range batch {
				if !w.sendReleaseWith(ctx, s, []Grant{g}, positions) {
					return false
				}
			}
			return true
		case errors.Is(err, ErrImmutable) && len(req.Positions) > 0:
			w.log.Warn("keyshard: the server refused a release's final position; releasing at the committed position", "session", s.id, "bucket", batch[0].Bucket, "token", batch[0].Token, "err", err)
			w.mu.Lock()
			if f, ok := s.finals[batch[0].Bucket]; ok && f.Token == batch[0].Token {
				delete(s.finals, batch[0].Bucket)
			}
			w.mu.Unlock()
			return w.sendReleaseWith(ctx, s, batch, false)
		case errors.Is(err, ErrInvalid) || errors.Is(err, ErrImmutable):
			w.log.Warn("keyshard: the server refused a release; the bucket is no longer held at that token", "session", s.id, "bucket", batch[0].Bucket, "token", batch[0].Token, "err", err)
			return true
		}
		w.log.Warn("keyshard: release failed; retrying", "session", s.id, "buckets", len(batch), "err", err)
		if !clock.Sleep(ctx, w.clock, b.next()) {
			return false
		}
	}
}

// leave asks the server to drain the member and end its session once it
// holds nothing. It returns nil once Leave succeeded or ctx ended, and an
// error wrapping errSessionGone if the session is already gone.
func (w *Worker) leave(ctx context.Context, s *session) error {
	var b backoff
	for {
		_, err := call(ctx, w.c, memberAPI.Leave, &keyshardv1.LeaveRequest{Session: s.id})
		switch {
		case err == nil, ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrNotFound):
			return fmt.Errorf("leave: %w: %w", errSessionGone, err)
		case permanent(err, false):
			w.log.Error("keyshard: leave refused; waiting for the session to end", "err", err)
			return nil
		}
		w.log.Warn("keyshard: leave failed; retrying", "err", err)
		if !clock.Sleep(ctx, w.clock, b.next()) {
			return nil
		}
	}
}

// Close leaves the keyspace gracefully and stops the worker, in two
// phases. Drain: it asks the server to move the worker's buckets away
// (Leave), keeps releasing what the server asks for, and waits until the
// server ends the session (a keep-alive answers NotFound). If ctx ends
// first, close: it stops at once, ending every grant as a self-fence
// does. Either way Close returns after Run returned and every goroutine
// exited; it returns nil after a complete drain, or an error wrapping
// ctx.Err(). Close is idempotent; later calls wait the same way and
// return nil. Close before Run makes Run return ErrClosed.
func (w *Worker) Close(ctx context.Context) error {
	started := w.life.close()
	w.drainOnce.Do(func() { close(w.drainCh) })
	if !started {
		return w.router.Close()
	}
	select {
	case <-w.life.done:
		return nil
	case <-ctx.Done():
	}
	w.life.stop()
	return fmt.Errorf("keyshard: worker stopped before it finished draining: %w", ctx.Err())
}

// Held returns the grants the worker acts on, sorted by bucket: granted,
// Acquire returned, not being released, and valid (see Grant.Valid).
func (w *Worker) Held() []Grant {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []Grant
	for _, gs := range w.grants {
		if gs.acquired && !gs.ending && gs.g.Valid() {
			out = append(out, gs.g)
		}
	}
	slices.SortFunc(out, func(a, b Grant) int { return a.Bucket - b.Bucket })
	return out
}

// Owns returns the worker's grant for key's bucket if the worker holds it
// (as Held counts it: the grant must also be valid by the clock, so a
// process resumed after a pause past its fence deadline is told no at
// once). Otherwise it returns a *WrongOwnerError naming the bucket's owner
// under the worker's current map ("" if the bucket is unassigned; turn
// the error into an answer to a misrouted request with WrongOwner), or an
// error wrapping ErrNotGranted if the map names this worker but the grant
// has not arrived or Acquire has not returned yet (hold the request, or
// use WaitGrant), if the worker has not joined yet, or if the session's
// fence deadline passed (then it wraps ErrSessionLost as well; the worker
// re-joins).
func (w *Worker) Owns(key []byte) (Grant, error) {
	w.mu.Lock()
	h := w.hasher
	w.mu.Unlock()
	if h.Buckets() == 0 {
		return Grant{}, fmt.Errorf("worker has not joined yet: %w", ErrNotGranted)
	}
	return w.owns(h.Bucket(key))
}

// OwnsString is Owns for a string key.
func (w *Worker) OwnsString(key string) (Grant, error) {
	w.mu.Lock()
	h := w.hasher
	w.mu.Unlock()
	if h.Buckets() == 0 {
		return Grant{}, fmt.Errorf("worker has not joined yet: %w", ErrNotGranted)
	}
	return w.owns(h.BucketString(key))
}

func (w *Worker) owns(b int) (Grant, error) {
	w.mu.Lock()
	gs := w.grants[b]
	if gs != nil && gs.acquired && !gs.ending {
		g := gs.g
		w.mu.Unlock()
		if !g.Valid() {
			return Grant{}, fmt.Errorf("bucket %d: the session's fence deadline passed (lease TTL %v, margin %v); the worker is fencing: %w: %w",
				b, gs.s.ttl, gs.s.margin, ErrNotGranted, ErrSessionLost)
		}
		return g, nil
	}
	w.mu.Unlock()
	rt := w.router.cur.Load()
	owner, _ := rt.table.BucketOwner(b)
	if owner == w.member.ID {
		return Grant{}, fmt.Errorf("bucket %d: %w", b, ErrNotGranted)
	}
	return Grant{}, &WrongOwnerError{Bucket: b, Owner: owner, Address: rt.addrs[owner], Epoch: rt.epoch}
}

// WaitGrant returns the worker's grant for key's bucket once it holds it
// (as Owns counts it), or an answer that waiting would not change: a
// *WrongOwnerError from a map that names this worker among its members
// and gives the bucket to another (the bucket is someone else's now), or
// from any map once Close has begun (the worker is leaving); ctx.Err() if
// ctx ends first; ErrClosed once Run has returned (or the Worker was
// closed before Run).
//
// It waits while the grant has not arrived or Acquire has not returned,
// while the worker joins or re-joins, while the bucket is unassigned, and
// while the worker's map does not name it yet: a map from before its
// join took effect, such as the empty map of a new keyspace, whose owners
// say nothing about what this worker will hold.
func (w *Worker) WaitGrant(ctx context.Context, key []byte) (Grant, error) {
	for {
		w.mu.Lock()
		changed := w.changed
		w.mu.Unlock()
		mapChanged := w.router.changed()
		g, err := w.Owns(key)
		if w.settled(err) {
			return g, err
		}
		select {
		case <-changed:
		case <-mapChanged:
		case <-ctx.Done():
			return Grant{}, ctx.Err()
		case <-w.life.done:
			return Grant{}, ErrClosed
		}
	}
}

// settled reports whether err, from Owns, is WaitGrant's answer: nil, or
// a WrongOwnerError that the next map is not expected to change.
func (w *Worker) settled(err error) bool {
	if errors.Is(err, ErrNotGranted) {
		return false
	}
	var wo *WrongOwnerError
	if !errors.As(err, &wo) || w.draining() {
		return true
	}
	if wo.Owner == "" {
		return false
	}
	rt := w.router.cur.Load()
	_, named := rt.addrs[w.member.ID]
	return named && rt.epoch == wo.Epoch // a newer map: look again
}

func (w *Worker) notifyLocked() {
	close(w.changed)
	w.changed = make(chan struct{})
}

func (w *Worker) emit(ev Event) {
	ev.Time = w.clock.Now()
	w.log.Debug("keyshard: worker event", "event", ev.Kind.String(), "session", ev.Session, "bucket", ev.Grant.Bucket, "token", ev.Grant.Token, "err", ev.Err)
	if w.opts.onEvent == nil {
		return
	}
	w.emitMu.Lock()
	defer w.emitMu.Unlock()
	w.opts.onEvent(ev)
}
