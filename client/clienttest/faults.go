package clienttest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
)

// faults are the switches the test sets; guarded by Server.mu.
type faults struct {
	unavailable    bool // every call fails with Unavailable; open streams end
	hotKeysDown    bool // the same, for the HotKeyService only
	keepAlive      KeepAliveFault
	keepAliveDelay time.Duration
	keepAliveGate  *Gate
	joinDelay      time.Duration
	joinHangs      int
	releaseGate    *Gate
	hotKeysGate    *Gate
	poolsDown      bool
	poolsGate      *Gate
	loseReports    int
	stallLeaves    bool
	failures       map[string]*failure // procedure → what its calls fail with
	// streams is cancelled by EndStreams: the streams open then end.
	streams    context.Context
	endStreams context.CancelFunc
}

type failure struct {
	err error
	n   int // calls left to fail; < 0: every call
}

// setFault changes the fault switches and wakes the calls that wait on
// the fake's state, so that streams and long polls see the change.
func (s *Server) setFault(set func(f *faults)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	set(&s.faults)
	s.notifyLocked()
}

// errUnreachable is the answer of a control plane cut off from its
// store, as keyshard serve gives it when etcd is unreachable.
func errUnreachable() error {
	return connect.NewError(connect.CodeUnavailable, errors.New("etcd is unreachable"))
}

// refuseLocked returns the error that a new call of procedure is answered
// with before it is served, if any.
func (f *faults) refuseLocked(procedure string) error {
	if f.unavailable || f.hotKeysDown && strings.HasPrefix(procedure, hotKeys) || f.poolsDown && strings.HasPrefix(procedure, tenantPools) {
		return errUnreachable()
	}
	fl := f.failures[procedure]
	if fl == nil {
		return nil
	}
	if fl.n > 0 {
		fl.n--
		if fl.n == 0 {
			delete(f.failures, procedure)
		}
	}
	return fl.err
}

// arrival is what the faults in force when a unary call arrived make
// its handler do.
type arrival struct {
	keepAlive      KeepAliveFault
	keepAliveDelay time.Duration
	keepAliveGate  *Gate
	joinDelay      time.Duration
	joinHang       bool
	releaseGate    *Gate
	gate           *Gate // HoldHotKeys or HoldPools: the interceptor holds the call there
	stallLeaves    bool
}

type arrivalKey struct{}

// arrivalOf returns the faults a call took when it arrived.
func arrivalOf(ctx context.Context) arrival {
	a, _ := ctx.Value(arrivalKey{}).(arrival)
	return a
}

// arrivalLocked takes the faults for a call of procedure that arrives
// now.
func (f *faults) arrivalLocked(procedure string) arrival {
	a := arrival{
		keepAlive: f.keepAlive, keepAliveDelay: f.keepAliveDelay, keepAliveGate: f.keepAliveGate,
		joinDelay: f.joinDelay, releaseGate: f.releaseGate, stallLeaves: f.stallLeaves,
	}
	if procedure == keyshardv1connect.MemberServiceJoinProcedure && f.joinHangs > 0 {
		f.joinHangs--
		a.joinHang = true
	}
	if strings.HasPrefix(procedure, hotKeys) {
		a.gate = f.hotKeysGate
	}
	if strings.HasPrefix(procedure, tenantPools) {
		a.gate = f.poolsGate
	}
	return a
}

// Fail makes every call of procedure (a keyshardv1connect ...Procedure
// constant) fail with err until Fail(procedure, nil). err is returned as
// the handler's error: give a *connect.Error to choose the code, for
// example
//
//	f.Fail(keyshardv1connect.MapServiceWatchMapProcedure,
//		connect.NewError(connect.CodeUnimplemented, errors.New("no streams behind this proxy")))
//
// to make routers fall back to long polls. The call is counted and
// recorded (CallCount, the Requests of its kind) before it fails.
func (s *Server) Fail(procedure string, err error) {
	s.FailNext(procedure, -1, err)
}

// FailNext makes the next n calls of procedure fail with err, as Fail
// does, and then serves them again. n < 0 is Fail; a nil err or n == 0
// serves them again at once.
func (s *Server) FailNext(procedure string, n int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil || n == 0 {
		delete(s.faults.failures, procedure)
		return
	}
	s.faults.failures[procedure] = &failure{err: err, n: n}
}

// SetUnavailable cuts the control plane off (true), as when keyshard
// serve cannot reach etcd, or brings it back (false). While it is off,
// every new call fails with code unavailable ("etcd is unreachable"),
// and open streams and long polls end with the same error: workers cannot
// renew their sessions, routers and producers keep what they have. The
// fake's state is kept, and nothing expires meanwhile: end sessions with
// EndSession to play a lease that ran out.
func (s *Server) SetUnavailable(down bool) {
	s.setFault(func(f *faults) { f.unavailable = down })
}

// SetHotKeysUnavailable is SetUnavailable for the HotKeyService alone:
// reports and overflow-set reads fail with code unavailable, and open
// overflow-set watches end, while the other services serve.
func (s *Server) SetHotKeysUnavailable(down bool) {
	s.setFault(func(f *faults) { f.hotKeysDown = down })
}

// EndStreams ends every stream open now (grant, map, overflow-set and
// pool-snapshot watches, and Session and Sessions streams, a keep-alive
// held on one included) with code unavailable, as a proxy that cuts them or a
// restarting replica does; the fake serves the streams and calls that
// come next. A client reconnects, and a worker makes the keep-alive the
// stream cut off again at once.
func (s *Server) EndStreams() {
	s.setFault(func(f *faults) {
		f.endStreams()
		f.streams, f.endStreams = context.WithCancel(context.Background())
	})
}

// KeepAliveFault is how the fake answers keep-alives (see SetKeepAlives).
type KeepAliveFault int

const (
	// KeepAliveServe renews the session: the default.
	KeepAliveServe KeepAliveFault = iota
	// KeepAliveFail answers code unavailable at once, as a replica cut off
	// from etcd does. The worker retries until its fence deadline.
	KeepAliveFail
	// KeepAliveHang holds each keep-alive until the caller gives up, as a
	// paused replica or a black-holed network does. The worker abandons it
	// at its fence deadline.
	KeepAliveHang
	// KeepAliveNotFound answers code not_found and ends the session, as
	// the server does once the session's lease has expired or another
	// session replaced it. The worker fences at once and re-joins.
	KeepAliveNotFound
)

func (k KeepAliveFault) String() string {
	switch k {
	case KeepAliveServe:
		return "serve"
	case KeepAliveFail:
		return "fail"
	case KeepAliveHang:
		return "hang"
	case KeepAliveNotFound:
		return "not found"
	}
	return "KeepAliveFault(?)"
}

// SetKeepAlives sets how the fake answers the keep-alives that arrive
// from now on. The session's lease does not expire at the fake while its
// keep-alives fail or hang (see LeaseExpiry and EndSession).
func (s *Server) SetKeepAlives(k KeepAliveFault) {
	s.setFault(func(f *faults) { f.keepAlive = k })
}

// DelayKeepAlives makes each keep-alive that arrives from now on answer
// after d of fake time (0: at once). Each one is recorded in Delays once
// its timer is set, so that the test knows when to advance the clock.
func (s *Server) DelayKeepAlives(d time.Duration) {
	s.setFault(func(f *faults) { f.keepAliveDelay = d })
}

// HoldKeepAlives holds every keep-alive that arrives from now on at a new
// Gate, after its delay, until the test lets it through; a held call whose
// caller gives up ends.
func (s *Server) HoldKeepAlives() *Gate {
	g := newGate()
	s.setFault(func(f *faults) { f.keepAliveGate = g })
	return g
}

// DelayJoins makes each Join that arrives from now on answer after d of
// fake time (0: at once), recorded in Delays as DelayKeepAlives does.
func (s *Server) DelayJoins(d time.Duration) {
	s.setFault(func(f *faults) { f.joinDelay = d })
}

// HangJoins makes the next n Joins hang until their callers give up,
// creating no session. A worker bounds a Join by its lease TTL minus the
// fence margin (by client.ReplicaTimeout before its first session), then
// retries asking to replace what the abandoned Join may have created.
func (s *Server) HangJoins(n int) {
	s.setFault(func(f *faults) { f.joinHangs = n })
}

// HoldReleases holds every Release that arrives from now on at a new
// Gate, before the fake applies it, until the test lets it through: the
// releases a worker sends meanwhile pile up behind it.
func (s *Server) HoldReleases() *Gate {
	g := newGate()
	s.setFault(func(f *faults) { f.releaseGate = g })
	return g
}

// HoldHotKeys holds every call of the HotKeyService that arrives from
// now on (reports, overflow-set reads and watches) at a new Gate, before
// the fake serves it, until the test lets it through; the other services
// serve as before. Left shut, the gate plays a control plane that accepts
// connections and never answers: each held call ends only when its caller
// gives up or the fake closes. A watch, once through, is not held again.
func (s *Server) HoldHotKeys() *Gate {
	g := newGate()
	s.setFault(func(f *faults) { f.hotKeysGate = g })
	return g
}

// StallLeaves makes Leave succeed without effect (true): the fake neither
// asks for the member's buckets nor ends its session, as when no other
// member can take them. A worker's Close then waits until its ctx ends or
// the session ends another way. StallLeaves(false) drains again.
func (s *Server) StallLeaves(stall bool) {
	s.setFault(func(f *faults) { f.stallLeaves = stall })
}

// Gate holds calls until the test lets them through, one at a time with
// Pass or all with Open. Its methods are safe for concurrent use.
type Gate struct {
	mu      sync.Mutex
	open    bool
	permits int
	held    int
	changed chan struct{} // closed and replaced on Pass and Open, and when held changes
}

func newGate() *Gate { return &Gate{changed: make(chan struct{})} }

// Pass lets one call through: one that is held now, or else the next one
// to arrive. It does not wait.
func (g *Gate) Pass() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.permits++
	g.notifyLocked()
}

// Open lets every held call through, and every later one: the gate stops
// holding. It is idempotent.
func (g *Gate) Open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open = true
	g.notifyLocked()
}

// Held returns how many calls are held at the gate now.
func (g *Gate) Held() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held
}

func (g *Gate) notifyLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// wait holds a call until the gate lets it through (true), or ctx ends
// or quit closes (false). A nil Gate lets everything through.
func (g *Gate) wait(ctx context.Context, quit <-chan struct{}) bool {
	if g == nil {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held++
	g.notifyLocked()
	defer func() { g.held--; g.notifyLocked() }()
	for !g.open && g.permits == 0 {
		ch := g.changed
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		case <-quit:
		}
		g.mu.Lock()
		if ctx.Err() != nil || isClosed(quit) {
			return false
		}
	}
	if !g.open {
		g.permits--
	}
	return true
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
