package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/clock"
)

// PoolMember is a server's membership of a tenant pool: a session that it
// keeps alive from a goroutine of its own (PoolKeepAlive every third of
// the lease TTL), re-joining by itself when the session is lost, and a
// PoolFollower of the pool that says which tenants the server serves
// (Serves, Tenants), so that it can prefetch their data and then report
// them ready (MarkReady). Leave drains the member and then ends the
// session. Its methods are safe for concurrent use.
type PoolMember struct {
	c      *Client
	pool   string
	member *keyshardv1.Member
	clock  clock.Clock
	log    *slog.Logger
	ev     *emitter
	f      *PoolFollower

	cancel context.CancelFunc // stops the keep-alive goroutine
	done   chan struct{}      // closed when it exited

	lost chan struct{} // closed when the session is lost while leaving

	mu      sync.Mutex
	session string
	ttl     time.Duration
	renewed time.Time // when the session was last known alive
	left    bool      // stopped
	leaving bool      // Leave has begun: a lost session is not re-joined
}

// JoinPool joins tenant pool pool as member m (its ID, Address and Zone
// place it; Weight 0 means 1) and returns once the session has started
// and the member holds the pool's snapshot. ctx bounds only that; the
// session lives until Leave, Close or the Client's Close. It takes the
// options Clock, Logger, OnPoolEvent (which receives the member's events
// and its follower's) and ReplaceMember.
//
// A failed Join that may pass (an unreachable control plane) is retried
// until ctx ends. It returns an *ArgError for a bad pool name or member;
// errors wrapping ErrNotFound (no such pool), ErrExists (the id is held by
// a live session and ReplaceMember(true) was not given),
// ErrUnauthenticated or ErrPermissionDenied (a member token is needed);
// or ctx's error with the last failure.
func (c *Client) JoinPool(ctx context.Context, pool string, m Member, opts ...PoolOption) (*PoolMember, error) {
	const fn = "Client.JoinPool"
	if err := validName(fn, "pool name", pool); err != nil {
		return nil, err
	}
	pm, err := memberToProto(fn, m)
	if err != nil {
		return nil, err
	}
	o := newPoolOptions(c, opts)
	p := &PoolMember{
		c: c, pool: pool, member: pm, clock: o.clock,
		log: o.log.With("tenant_pool", pool, "member", m.ID), ev: &emitter{f: o.onEvent},
		done: make(chan struct{}), lost: make(chan struct{}),
	}
	if err := p.join(ctx, o.replace, true); err != nil {
		return nil, err
	}
	p.f, err = c.followPool(ctx, pool, o, p.ev) // one emitter: events stay serialized
	if err != nil {
		p.endSession(context.WithoutCancel(ctx))
		return nil, err
	}
	kctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(c.ctx, cancel)
	p.cancel = func() { stop(); cancel() }
	go func() {
		defer close(p.done)
		p.keepAlive(kctx)
	}()
	return p, nil
}

// join starts a session, retrying failures that may pass until ctx ends.
// first: the caller waits for it (permanent errors end it); otherwise a
// re-join, which retries everything but ErrClosed and bad arguments.
func (p *PoolMember) join(ctx context.Context, replace, first bool) error {
	var b backoff
	p.mu.Lock()
	ttl := p.ttl // 0 before the first session: calls are bounded by ReplicaTimeout per replica
	p.mu.Unlock()
	for {
		// A re-join is bounded by the lease TTL: one that hangs is
		// abandoned and retried (asking to replace what it may have made).
		resp, err := callWithin(ctx, p.c, poolAPI.JoinPool, &keyshardv1.JoinPoolRequest{Pool: p.pool, Member: p.member, Replace: replace}, budget{within: ttl})
		if err == nil {
			now := p.clock.Now()
			ttl := resp.GetLeaseTtl().AsDuration()
			if ttl <= 0 {
				ttl = 10 * time.Second
			}
			p.mu.Lock()
			p.session, p.ttl, p.renewed = resp.GetSession(), ttl, now
			p.mu.Unlock()
			p.log.Info("keyshard: joined the tenant pool", "session", resp.GetSession(), "lease_ttl", ttl)
			p.ev.emit(PoolEvent{Kind: PoolJoined, Pool: p.pool, Session: resp.GetSession()})
			return nil
		}
		if ctx.Err() != nil {
			if first {
				return fmt.Errorf("join tenant pool %q as %q: %w (last attempt: %w)", p.pool, p.member.GetId(), ctx.Err(), err)
			}
			return ctx.Err()
		}
		if errors.Is(err, ErrClosed) || (first && (permanent(err, false) || errors.Is(err, ErrExists))) {
			return fmt.Errorf("join tenant pool %q as %q: %w", p.pool, p.member.GetId(), err)
		}
		// An answer lost on the way may have started a session: replace it.
		replace = true
		p.log.Warn("keyshard: cannot join the tenant pool; retrying", "err", err)
		if !clock.Sleep(ctx, p.clock, b.next()) {
			return ctx.Err()
		}
	}
}

// keepAlive renews the session every third of its TTL until ctx ends,
// re-joining when it is lost. The first keep-alive of a session goes at
// once: the leader places a member only once its session was renewed.
func (p *PoolMember) keepAlive(ctx context.Context) {
	var b backoff
	wait := time.Duration(0)
	for {
		if wait > 0 && !clock.Sleep(ctx, p.clock, wait) {
			return
		}
		if ctx.Err() != nil {
			return
		}
		p.mu.Lock()
		session, ttl, renewed := p.session, p.ttl, p.renewed
		p.mu.Unlock()
		left := ttl - p.clock.Since(renewed)
		var err error
		if left > 0 {
			_, err = callWithin(ctx, p.c, poolAPI.PoolKeepAlive, &keyshardv1.PoolKeepAliveRequest{Session: session}, budget{within: left})
		} else {
			err = fmt.Errorf("%w: no keep-alive answered within the lease TTL %v", ErrSessionLost, ttl)
		}
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			b.reset()
			p.mu.Lock()
			p.renewed = p.clock.Now()
			p.mu.Unlock()
			wait = p.interval()
			continue
		case errors.Is(err, ErrClosed):
			return
		case errors.Is(err, ErrNotFound), errors.Is(err, ErrSessionLost), p.clock.Since(renewed) >= ttl:
			lost := fmt.Errorf("%w: session %s of tenant pool %q: %w", ErrSessionLost, session, p.pool, err)
			if p.isLeaving() {
				// Dropped as after a crash: no re-join, Leave returns.
				p.log.Error("keyshard: tenant pool session lost while leaving", "err", lost)
				p.ev.emit(PoolEvent{Kind: PoolSessionLost, Pool: p.pool, Session: session, Err: lost})
				close(p.lost)
				return
			}
			p.log.Error("keyshard: tenant pool session lost; re-joining", "err", lost)
			p.ev.emit(PoolEvent{Kind: PoolSessionLost, Pool: p.pool, Session: session, Err: lost})
			if p.join(ctx, true, false) != nil {
				return
			}
			b.reset()
			wait = 0 // the new session is placed once renewed
		default:
			p.log.Warn("keyshard: tenant pool keep-alive failed; retrying", "err", err)
			wait = min(b.next(), max(ttl/6, time.Millisecond))
		}
	}
}

func (p *PoolMember) interval() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return max(p.ttl/3, time.Millisecond)
}

// Session returns the id of the member's current session.
func (p *PoolMember) Session() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.session
}

// Follower returns the member's follower of the pool's snapshot.
func (p *PoolMember) Follower() *PoolFollower { return p.f }

// Serves reports whether this member serves tenant (see
// PoolFollower.Serves).
func (p *PoolMember) Serves(tenant string) bool { return p.f.Serves(p.member.GetId(), tenant) }

// Tenants returns the tenants of the snapshot this member serves, sorted
// (see PoolFollower.Tenants); read-only.
func (p *PoolMember) Tenants() []string { return p.f.Tenants(p.member.GetId()) }

// PoolReady is the answer of MarkReady.
type PoolReady struct {
	// Marked counts the tenants marked ready; Ignored those the member is
	// not placed on (as the leader sees it).
	Marked, Ignored int
}

// MarkReady tells the leader that this member has loaded what it needs to
// serve tenants, so that clients may read them from it before the pool's
// warm-up ends. It sends batches of at most MaxPoolBatch tenants, one
// call each, in order; if one fails it returns what the calls before
// marked and the error (the tenants of the failed call and after are not
// marked: call again). It returns an *ArgError naming the first empty or
// too long tenant before any call; an error wrapping ErrNotFound if the
// session was lost meanwhile (the member re-joins by itself: mark again
// once it has).
func (p *PoolMember) MarkReady(ctx context.Context, tenants ...string) (PoolReady, error) {
	var out PoolReady
	for i, t := range tenants {
		if err := validTenant("PoolMember.MarkReady", fmt.Sprintf("tenants[%d]", i), t); err != nil {
			return out, err
		}
	}
	session := p.Session()
	for len(tenants) > 0 {
		n := min(len(tenants), MaxPoolBatch)
		resp, err := call(ctx, p.c, poolAPI.MarkReady, &keyshardv1.MarkReadyRequest{Session: session, Tenants: tenants[:n]})
		if err != nil {
			return out, fmt.Errorf("mark %d tenants ready in tenant pool %q: %w", n, p.pool, err)
		}
		out.Marked += int(resp.GetMarked())
		out.Ignored += int(resp.GetIgnored())
		tenants = tenants[n:]
	}
	return out, nil
}

func (p *PoolMember) isLeaving() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.leaving
}

// Leave leaves the pool without losing reads (a graceful leave). It asks
// the control plane to drain the member (LeavePool): at the leader's next
// round the member leaves every subset, each place taken by another
// member, and stays a read target of its tenants for the pool's lookback
// (and until the members that took its places are read). Meanwhile Leave
// keeps the session alive and follows the pool's snapshot, until no
// tenant lists the member any more (or the control plane says it is
// done); then it ends the session, and stops the keep-alives and the
// follower. Progress is logged and sent as PoolDraining events; the end
// as a PoolLeft event.
//
// ctx bounds the wait: when it ends first, Leave ends the session at once
// and returns an error wrapping ctx's error (reads of data only this
// member held may miss). If the session is lost (it expired) before or
// during the drain, the member was dropped as after a crash: Leave
// returns an error wrapping ErrSessionLost. If Close or the Client's Close
// stops the member meanwhile, Leave ends the session at once and returns
// an error wrapping ErrClosed. Later calls, and calls after Close, return
// nil.
func (p *PoolMember) Leave(ctx context.Context) error {
	p.mu.Lock()
	if p.left || p.leaving {
		p.mu.Unlock()
		return nil
	}
	p.leaving = true
	p.mu.Unlock()
	id := p.member.GetId()
	var resp *keyshardv1.LeavePoolResponse
	var b backoff
	for {
		var err error
		resp, err = call(ctx, p.c, poolAPI.LeavePool, &keyshardv1.LeavePoolRequest{Session: p.Session()})
		switch {
		case err == nil:
		case errors.Is(err, ErrNotFound):
			return p.end(ctx, fmt.Errorf("%w: the session had ended before the drain: the member was dropped as after a crash (%w)", ErrSessionLost, err), -1)
		case ctx.Err() != nil, errors.Is(err, ErrClosed), permanent(err, false):
			return p.end(ctx, err, -1)
		default:
			p.log.Warn("keyshard: cannot start draining; retrying", "err", err)
			if !clock.Sleep(ctx, p.clock, b.next()) {
				return p.end(ctx, ctx.Err(), -1)
			}
			continue
		}
		break
	}
	tenants, until := int(resp.GetTenants()), time.Time{}
	if resp.GetReadUntil() != nil {
		until = resp.GetReadUntil().AsTime()
	}
	p.log.Info("keyshard: leaving the tenant pool: draining (in no subset from the leader's next round, read while the lookback keeps it)", "tenants", tenants)
	p.ev.emit(PoolEvent{Kind: PoolDraining, Pool: p.pool, Session: p.Session(), Tenants: tenants, Until: until})
	done := resp.GetDone()
	for !done {
		snap := p.f.cur.Load()
		// A snapshot older than the server's answer may not place the
		// member yet: judge from that version on.
		if snap.version >= resp.GetVersion() && snap.drained(id) {
			break
		}
		if n, u := len(snap.byMem[id]), snap.readUntil(id); n != tenants || !u.Equal(until) {
			tenants, until = n, u
			p.log.Info("keyshard: draining from the tenant pool", "tenants", n, "read_until", u, "version", snap.version)
			p.ev.emit(PoolEvent{Kind: PoolDraining, Pool: p.pool, Session: p.Session(), Version: snap.version, Tenants: n, Until: u})
		}
		lost := fmt.Errorf("%w: the session expired while draining: the member was dropped as after a crash", ErrSessionLost)
		select {
		case <-snap.next:
		case <-ctx.Done():
			return p.end(ctx, ctx.Err(), tenants)
		case <-p.lost:
			return p.end(ctx, lost, tenants)
		case <-p.done: // Close, or the Client's Close; or the session lost
			if isClosedChan(p.lost) {
				return p.end(ctx, lost, tenants)
			}
			return p.end(ctx, ErrClosed, tenants)
		}
	}
	return p.end(ctx, nil, 0)
}

// end stops the member and ends its session at once; cause is why it
// ends before the drain finished (nil: it finished), with tenants still
// listing it (-1: not known).
func (p *PoolMember) end(ctx context.Context, cause error, tenants int) error {
	session := p.Session()
	p.stop()
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.sessionTTL())
	defer cancel()
	err := p.endSession(ectx)
	if cause == nil && err != nil {
		cause = err
	}
	if cause == nil {
		p.log.Info("keyshard: left the tenant pool: drained, session ended")
		p.ev.emit(PoolEvent{Kind: PoolLeft, Pool: p.pool, Session: session})
		return nil
	}
	left := "an unknown number of"
	if tenants >= 0 {
		left = fmt.Sprint(tenants)
	}
	werr := fmt.Errorf("leave tenant pool %q: session ended before the drain finished (%s tenants still read this member; reads of data only it held may miss): %w", p.pool, left, cause)
	p.log.Warn("keyshard: left the tenant pool before the drain finished", "err", werr)
	p.ev.emit(PoolEvent{Kind: PoolLeft, Pool: p.pool, Session: session, Tenants: max(tenants, 0), Err: werr})
	return werr
}

func (p *PoolMember) sessionTTL() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return max(p.ttl, time.Second)
}

// endSession ends the session at once (LeavePool with end_session). A
// session already gone is not an error.
func (p *PoolMember) endSession(ctx context.Context) error {
	_, err := call(ctx, p.c, poolAPI.LeavePool, &keyshardv1.LeavePoolRequest{Session: p.Session(), EndSession: true})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("end the session: %w", err)
	}
	return nil
}

// Close stops the keep-alives and the follower without leaving: the
// session ends when its lease runs out, and the member is dropped then as
// after a crash. Use Leave to leave without losing reads. Close is
// idempotent and returns nil.
func (p *PoolMember) Close() error {
	p.stop()
	return nil
}

// stop stops the goroutines once; it reports whether this call did.
func (p *PoolMember) stop() bool {
	p.mu.Lock()
	first := !p.left
	p.left = true
	p.mu.Unlock()
	if first {
		p.cancel()
		<-p.done
		p.f.Close()
	}
	return first
}

// validTenant checks a tenant id given to fn as arg.
func validTenant(fn, arg, t string) error {
	switch {
	case t == "":
		return argError(fn, arg, "is empty")
	case len(t) > MaxTenantLen:
		return argError(fn, arg, "%.20q... is %d bytes long; the limit is %d", t, len(t), MaxTenantLen)
	}
	return nil
}
