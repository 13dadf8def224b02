package clienttest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/clock/clocktest"
)

// Options configure a Server. The zero value is a fake that accepts every
// call, on a new fake clock.
type Options struct {
	// Token, if set, is the bearer token every call must carry (what
	// client.Token sends); a call without it fails with code
	// unauthenticated.
	Token string
	// Clock is the fake's time: long polls, delays and the times it
	// reports run on it. Default: a new clocktest.Fake at 2026-01-01
	// 00:00 UTC.
	Clock *clocktest.Fake
}

// Server is a fake keyshard serve: the five services of keyshard.v1
// (admin, member, map, hot keys, tenant pools) over a real HTTP server on loopback
// (HTTP/1.1 and h2c, so the Connect protocol and gRPC both work; Session
// and Sessions streams over HTTP/2 only, as keyshard serve), whose state the test
// scripts and whose faults the test switches on and off.
// It names sessions s1, s2, ... in the order it serves Joins. Its methods
// are safe for concurrent use.
type Server struct {
	tb    testing.TB // nil for Start: scripting mistakes panic
	clock *clocktest.Fake
	token string
	srv   *httptest.Server
	quit  chan struct{} // closed by Close: every held or waiting call ends

	closeOnce sync.Once

	mu               sync.Mutex
	changed          chan struct{} // closed and replaced on every state change
	keyspaces        map[string]*keyspace
	sessions         map[string]*sessionState
	nextID           int
	lastToken        uint64
	pools            map[string]*keyshardv1.HotKeyPool
	sets             map[string]*keyshardv1.OverflowSet
	tpools           map[string]*tenantPool
	psessions        map[string]*poolSession
	nextPoolSession  int
	calls            map[string]int
	streamKeepAlives int // keep-alives that arrived on Session streams, and renewals on Sessions streams
	replicas         []*Replica
	faults           faults

	observers map[string]func(any) // procedure → its Requests' record
	obs       observations
}

type keyspace struct {
	cfg *keyshardv1.Keyspace
	m   *keyshardv1.Map // nil before the first SetMap or Assign
	// target is the member id that the last Assign gave each bucket to
	// ("" = nobody); nil if Assign was never called.
	target []string
	// pos is the committed position of the buckets no session holds
	// (stream keyspaces): where their next grant starts. Absent: 0.
	pos map[uint32]uint64
}

type sessionState struct {
	id       string
	keyspace string
	member   *keyshardv1.Member
	grants   map[uint32]uint64
	from     map[uint32]uint64 // bucket → its grant's from
	release  map[uint32]bool
	commit   *keyshardv1.CommitRequest // the last Commit applied; nil before
	rev      uint64
	renewed  time.Time // Join, then every keep-alive answered
	active   bool      // a keep-alive was answered: Assign's grants may go to it
	gone     bool
	leaving  bool
	draining bool
}

// NewServer starts a fake keyshard serve for the test and returns it
// serving at URL, with no keyspace and no hot-key pool. Close is
// registered with tb.Cleanup. Scripting mistakes (a session or keyspace
// that does not exist, a bucket out of range) fail the test.
func NewServer(tb testing.TB, opts Options) *Server {
	tb.Helper()
	s := newServer(tb, opts)
	tb.Cleanup(s.Close)
	return s
}

// Start is NewServer for code that is not a test (an example, a demo):
// the caller closes the Server, and scripting mistakes panic.
func Start(opts Options) *Server { return newServer(nil, opts) }

func newServer(tb testing.TB, opts Options) *Server {
	clk := opts.Clock
	if clk == nil {
		clk = clocktest.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	}
	s := &Server{
		tb:        tb,
		clock:     clk,
		token:     opts.Token,
		quit:      make(chan struct{}),
		changed:   make(chan struct{}),
		keyspaces: map[string]*keyspace{},
		sessions:  map[string]*sessionState{},
		pools:     map[string]*keyshardv1.HotKeyPool{},
		sets:      map[string]*keyshardv1.OverflowSet{},
		tpools:    map[string]*tenantPool{},
		psessions: map[string]*poolSession{},
		calls:     map[string]int{},
		faults:    faults{failures: map[string]*failure{}},
	}
	s.faults.streams, s.faults.endStreams = context.WithCancel(context.Background())
	s.observers = s.obs.init()
	mux := http.NewServeMux()
	opt := connect.WithInterceptors(interceptor{s})
	mux.Handle(keyshardv1connect.NewAdminServiceHandler(adminService{s}, opt))
	mux.Handle(keyshardv1connect.NewMemberServiceHandler(memberService{s}, opt))
	mux.Handle(keyshardv1connect.NewMapServiceHandler(mapService{s}, opt))
	mux.Handle(keyshardv1connect.NewHotKeyServiceHandler(hotKeyService{s}, opt))
	mux.Handle(keyshardv1connect.NewTenantPoolServiceHandler(tenantPoolService{s}, opt))
	s.srv = serve(s.http2Only(mux))
	return s
}

// serve serves h on loopback over HTTP/1.1 and h2c.
func serve(h http.Handler) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	return srv
}

// URL returns the base URL of the API, for client.Dial.
func (s *Server) URL() string { return s.srv.URL }

// Clock returns the fake's clock. Give it to the clients under test
// (client.Clock) so that their timers and the fake's long polls move
// together, when the test advances it.
func (s *Server) Clock() *clocktest.Fake { return s.clock }

// Close ends every call the fake holds (hung, gated, delayed, long polls
// and streams), then stops the server and its replicas and waits for
// their handlers to return. It is idempotent. A Server from NewServer is
// closed when its test ends; close the clients first (a cleanup
// registered after NewServer runs before it).
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.quit)
		s.mu.Lock()
		replicas := s.replicas
		s.mu.Unlock()
		for _, r := range replicas {
			r.srv.Close()
		}
		s.srv.Close()
	})
}

// CallCount returns how many calls of procedure (a keyshardv1connect
// ...Procedure constant, such as
// keyshardv1connect.MemberServiceKeepAliveProcedure) reached the fake,
// through any replica, refused ones included.
func (s *Server) CallCount(procedure string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[procedure]
}

// StreamKeepAlives returns how many keep-alives arrived on Session
// streams and Sessions streams (one for each session a Sessions stream's
// keep-alive lists), through any replica: a worker's keep-alives go there
// while its stream is open (over HTTP/2), and are KeepAlive calls
// otherwise, which CallCount(keyshardv1connect.MemberServiceKeepAliveProcedure)
// counts. KeepAlives records both.
func (s *Server) StreamKeepAlives() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streamKeepAlives
}

// WaitFor returns once cond is true. It checks cond at once and after
// every change of the fake's state (cond may call the Server's methods),
// and fails tb, naming what, if cond is still false after a minute of
// real time: a guard against a hang, never a pace.
func (s *Server) WaitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), stuckAfter)
	defer cancel()
	for {
		s.mu.Lock()
		ch := s.changed
		s.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			tb.Fatalf("clienttest: waiting for %s: %v", what, ctx.Err())
		}
	}
}

// stuckAfter bounds the waits of the test's goroutine (WaitFor,
// Requests.Next): a guard against a hang, never a pace.
const stuckAfter = time.Minute

// fatalf reports a scripting mistake: it fails the test, or panics
// without one. It is called without s.mu held.
func (s *Server) fatalf(format string, args ...any) {
	msg := fmt.Sprintf("clienttest: "+format, args...)
	if s.tb == nil {
		panic(msg)
	}
	s.tb.Helper()
	s.tb.Fatal(msg)
}

// notifyLocked wakes every waiter on the fake's state.
func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

type waitResult int

const (
	waitChanged waitResult = iota
	waitTimedOut
	waitCancelled
)

// waitChangeLocked waits for a state change, ctx, the fake's Close, or
// timer (a fake-clock timer, or nil). It is called with s.mu held and
// returns with it held.
func (s *Server) waitChangeLocked(ctx context.Context, timer <-chan time.Time) waitResult {
	ch := s.changed
	s.mu.Unlock()
	defer s.mu.Lock()
	select {
	case <-ch:
		return waitChanged
	case <-timer:
		return waitTimedOut
	case <-ctx.Done():
		return waitCancelled
	case <-s.quit:
		return waitCancelled
	}
}

// hold blocks until ctx ends or the fake closes: a call that hangs.
func (s *Server) hold(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-s.quit:
	}
}

// delay waits d of fake time (if d > 0), first recording procedure in
// Delays once its timer is set.
func (s *Server) delay(ctx context.Context, procedure string, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := s.clock.NewTimer(d)
	defer t.Stop()
	s.obs.delays.add(procedure)
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
	case <-s.quit:
	}
	return connect.NewError(connect.CodeCanceled, errors.New("gave up while the fake delayed the answer"))
}

// interceptor counts calls, checks the token, records requests and
// applies the faults that refuse a call before it is served.
type interceptor struct{ s *Server }

func (i interceptor) admit(procedure string, h http.Header) error {
	s := i.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[procedure]++
	if s.token != "" && h.Get("Authorization") != "Bearer "+s.token {
		return connect.NewError(connect.CodeUnauthenticated, errors.New("missing or bad bearer token"))
	}
	return nil
}

// arrived records the request of a call that was admitted and, in the
// same step, takes the faults that answer it: the error that refuses it,
// if any, and the rest for its handler. A fault switched after the test
// took the request from its Requests does not change its answer. A call
// that took a hot-key Gate then waits there; it fails if its caller gives
// up meanwhile.
func (i interceptor) arrived(ctx context.Context, procedure string, msg any) (arrival, error) {
	s := i.s
	a, err := func() (arrival, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if record := s.observers[procedure]; record != nil {
			record(msg)
		}
		if err := s.faults.refuseLocked(procedure); err != nil {
			return arrival{}, err
		}
		return s.faults.arrivalLocked(procedure), nil
	}()
	if err == nil && !a.gate.wait(ctx, s.quit) {
		err = errCancelled()
	}
	return a, err
}

func (i interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		p := req.Spec().Procedure
		if err := i.admit(p, req.Header()); err != nil {
			return nil, err
		}
		a, err := i.arrived(ctx, p, req.Any())
		if err != nil {
			return nil, err
		}
		return next(context.WithValue(ctx, arrivalKey{}, a), req)
	}
}

func (i interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if err := i.admit(conn.Spec().Procedure, conn.RequestHeader()); err != nil {
			return err
		}
		return next(ctx, &arrivingConn{StreamingHandlerConn: conn, i: i, ctx: ctx})
	}
}

// arrivingConn applies arrived to the request of a server stream, which
// the handler reads with Receive.
type arrivingConn struct {
	connect.StreamingHandlerConn
	i    interceptor
	ctx  context.Context // the call's, for arrived's gate
	seen bool
}

func (c *arrivingConn) Receive(msg any) error {
	if err := c.StreamingHandlerConn.Receive(msg); err != nil || c.seen {
		return err
	}
	c.seen = true
	_, err := c.i.arrived(c.ctx, c.Spec().Procedure, msg) // streams take no other fault
	return err
}

// sortedSessionsLocked returns the live sessions of keyspace ks, by
// member id.
func (s *Server) sortedSessionsLocked(ks string) []*sessionState {
	var out []*sessionState
	for _, x := range s.sessions {
		if x.keyspace == ks && !x.gone {
			out = append(out, x)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].member.GetId() < out[j].member.GetId() })
	return out
}

// liveSessionLocked returns member's live session in keyspace ks, or nil.
func (s *Server) liveSessionLocked(ks, member string) *sessionState {
	for _, x := range s.sessions {
		if x.keyspace == ks && !x.gone && x.member.GetId() == member {
			return x
		}
	}
	return nil
}
