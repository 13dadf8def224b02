package server

import (
	"context"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
)

// How this replica decides that it cannot reach etcd: a probe does a
// linearizable read every probeInterval, each bounded by probeTimeout,
// and the replica counts as unreachable once no probe has succeeded for
// unreachableAfter. A replica that cannot reach etcd cannot renew member
// sessions nor see releases, so it is better to send workers elsewhere.
const (
	probeInterval    = time.Second
	probeTimeout     = time.Second
	unreachableAfter = 3 * time.Second
)

// reachability is whether this replica reaches etcd, as its probe last
// found. Its zero value is reachable. Safe for concurrent use.
type reachability struct {
	mu          sync.Mutex
	lastOK      time.Time // the last successful probe, or when probing started
	unreachable bool      // no successful probe for unreachableAfter
	// lost is cancelled when the replica becomes unreachable, then
	// replaced. A context rather than a channel: a stream registers a
	// callback on it (context.AfterFunc) instead of parking a goroutine
	// to wait for it, one per stream.
	lost     context.Context
	loseNext context.CancelFunc
}

// state reports whether etcd is unreachable, since when it has not been
// reached, and a context cancelled when it next becomes unreachable.
func (r *reachability) state() (unreachable bool, lastOK time.Time, lost context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lost == nil {
		r.lost, r.loseNext = context.WithCancel(context.Background())
	}
	return r.unreachable, r.lastOK, r.lost
}

// probeStore probes etcd at every tick until ctx ends. Run makes tick
// (probeInterval on s.clock) before it starts the goroutine, so that tests
// counting the fake clock's timers see it from the start.
func (s *Server) probeStore(ctx context.Context, tick interface {
	C() <-chan time.Time
	Stop()
}) error {
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C():
			s.checkStore(ctx)
		}
	}
}

// checkStore probes etcd once and records the outcome: reachable at once
// on success, unreachable once no probe has succeeded for
// unreachableAfter. The gauge keyshard_store_reachable follows.
func (s *Server) checkStore(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	var err error
	if s.seams.probe != nil {
		err = s.seams.probe(pctx)
	} else {
		_, err = s.store.Rev(pctx) // linearizable: it needs an etcd quorum
	}
	cancel()
	if ctx.Err() != nil {
		return // shutting down: not etcd's fault
	}
	now := s.clock.Now()
	r := &s.reach
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lastOK.IsZero() {
		r.lastOK = now // the store answered at start
	}
	switch {
	case err == nil:
		if r.unreachable {
			s.log.Info("etcd reachable again; ready", "unreachable_for", now.Sub(r.lastOK))
		}
		r.lastOK, r.unreachable = now, false
		s.metrics.storeReachable.Set(1)
	case !r.unreachable && now.Sub(r.lastOK) >= unreachableAfter:
		s.log.Warn("etcd unreachable; not ready, and member, map and hot-key calls answer unavailable until it is reached again", "since", r.lastOK, "err", err)
		r.unreachable = true
		s.metrics.storeReachable.Set(0)
		if r.lost != nil {
			r.loseNext()
		}
		r.lost, r.loseNext = context.WithCancel(context.Background())
	}
}

// unreachableErr is the answer of a gated call while etcd is unreachable.
func (s *Server) unreachableErr(lastOK time.Time) error {
	return connect.NewError(connect.CodeUnavailable, errorf("replica %s cannot reach etcd (no successful read for %v); ask another replica", s.cfg.Replica, s.clock.Since(lastOK).Truncate(time.Millisecond)))
}

// reachGate is a connect interceptor: while this replica cannot reach
// etcd, MemberService, MapService and HotKeyService calls answer
// UNAVAILABLE at once, and their open streams end so, so that clients
// with several replica URLs move to another replica instead of waiting on
// this one. AdminService stays open: operators need Status most then.
type reachGate struct{ s *Server }

func gated(procedure string) bool {
	return !strings.HasPrefix(procedure, "/"+keyshardv1connect.AdminServiceName+"/")
}

func (g reachGate) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if gated(req.Spec().Procedure) {
			if down, lastOK, _ := g.s.reach.state(); down {
				return nil, g.s.unreachableErr(lastOK)
			}
		}
		return next(ctx, req)
	}
}

func (g reachGate) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (g reachGate) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return g.s.gateStream(ctx, conn.Spec().Procedure, nil, func(ctx context.Context) error { return next(ctx, conn) })
	}
}

// gateStream runs stream, a streaming call of procedure, as reachGate
// lets it: not at all while etcd is unreachable, and ended by end when
// etcd becomes so. A nil end ends it through its context: a child of ctx
// that gateStream cancels.
func (s *Server) gateStream(ctx context.Context, procedure string, end func(), stream func(context.Context) error) error {
	if !gated(procedure) {
		return stream(ctx)
	}
	down, lastOK, lost := s.reach.state()
	if down {
		return s.unreachableErr(lastOK)
	}
	if end == nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		end = cancel
	}
	// The stream ends when etcd becomes unreachable: a callback on
	// lost, not a goroutine waiting for it (a replica holds a stream
	// per member, and a goroutine's stack is most of what one costs).
	stop := context.AfterFunc(lost, end)
	err := stream(ctx)
	stop()
	if lost.Err() != nil {
		_, lastOK, _ := s.reach.state()
		return s.unreachableErr(lastOK)
	}
	return err
}
