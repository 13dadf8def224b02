package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
)

// errLeaseDeadline ends a term whose election lease may have expired at
// etcd: no renewal was acknowledged in time.
var errLeaseDeadline = errors.New("server: election lease deadline passed without an acknowledged renewal")

// seams are the parts of a replica's store access that tests replace;
// nil fields mean the store's.
type seams struct {
	renew  func(ctx context.Context, id shard.LeaseID) (time.Duration, error)
	resign func(ctx context.Context, el *store.Election) error
	leader leaderStore                     // what a term's coordinator loop reads and writes
	probe  func(ctx context.Context) error // the readiness probe's read
	// sessionLease: how a member stream asks etcd whether a session's
	// lease lives (sessionAlive).
	sessionLease func(ctx context.Context, id shard.LeaseID) (store.LeaseInfo, error)
}

func (s *Server) renewLease(ctx context.Context, id shard.LeaseID) (time.Duration, error) {
	if s.seams.renew != nil {
		return s.seams.renew(ctx, id)
	}
	return s.store.KeepAliveOnce(ctx, id)
}

func (s *Server) resignElection(ctx context.Context, el *store.Election) error {
	if s.seams.resign != nil {
		return s.seams.resign(ctx, el)
	}
	return el.Resign(ctx)
}

// watchStore starts a watch of st that stop ends and waits for: once stop
// returns, the watch's goroutine has exited.
func watchStore(ctx context.Context, st leaderStore, fromRev int64) (updates <-chan store.Update, stop func()) {
	wctx, cancel := context.WithCancel(ctx)
	updates = st.Watch(wctx, fromRev)
	return updates, func() {
		cancel()
		for range updates { // the watch closes it when its goroutine exits
		}
	}
}

// leaseMargin is how long before the lease's expiry at etcd, as this
// replica reckons it, the leader stops: it covers clock-rate drift between
// this replica and etcd and the time the term takes to stop. As the
// SDK's fence: max(TTL/10, 500 ms), at most TTL/2.
func leaseMargin(ttl time.Duration) time.Duration {
	return min(max(ttl/10, 500*time.Millisecond), ttl/2)
}

// holdLease renews the election lease every ttl/3 of this replica's clock
// and returns errLeaseDeadline once the deadline passes: the send time of
// the last acknowledged renewal (renewed, at first) + ttl − leaseMargin.
// etcd keeps a lease for at least its TTL after receiving a renewal, which
// is after it was sent, so until the deadline no other replica can have
// been elected; past it, one may have been, and this one must stop
// reporting and acting as leader although etcd may be unreachable and
// the session has not noticed (its keep-alives time out only after the
// TTL). It returns errNotLeader if etcd says the lease is gone, and nil
// once ctx is done. Each renewal runs in a goroutine, exited before
// holdLease returns; one still in flight at the next renewal is abandoned.
func (s *Server) holdLease(ctx context.Context, lease shard.LeaseID, ttl time.Duration, renewed time.Time) error {
	deadline := renewed.Add(ttl - leaseMargin(ttl))
	expire := s.clock.NewTimer(deadline.Sub(s.clock.Now()))
	defer expire.Stop()
	next := s.clock.NewTimer(ttl / 3)
	defer next.Stop()

	type result struct {
		seq  int
		sent time.Time
		err  error
	}
	results := make(chan result, 1)
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	seq := 0
	abandon := func() {}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-expire.C():
			if now := s.clock.Now(); now.Before(deadline) { // a renewal moved it after this fired
				expire.Reset(deadline.Sub(now))
				continue
			}
			s.log.Warn("election lease deadline passed without an acknowledged renewal; stopping leading", "deadline", deadline, "ttl", ttl)
			return errLeaseDeadline
		case r := <-results:
			switch {
			case errors.Is(r.err, store.ErrLeaseNotFound):
				return fmt.Errorf("%w: election lease gone: %v", errNotLeader, r.err)
			case r.err != nil && r.seq == seq:
				s.log.Warn("could not renew the election lease; retrying", "err", r.err, "deadline", deadline)
			case r.err != nil: // abandoned for a newer renewal
			case r.sent.Add(ttl - leaseMargin(ttl)).After(deadline):
				deadline = r.sent.Add(ttl - leaseMargin(ttl))
				expire.Reset(deadline.Sub(s.clock.Now()))
			}
		case <-next.C():
			next.Reset(ttl / 3)
			// A renewal still in flight is stuck (on an etcd member that is
			// paused, say, whose connection looks alive): abandon it and
			// send another, which may reach another member.
			abandon()
			seq++
			sent := s.clock.Now()
			one, stop := context.WithCancel(rctx)
			abandon = stop
			wg.Add(1)
			go func(seq int) { // exits when the renewal answers, or is abandoned, and its result is taken or holdLease returns
				defer wg.Done()
				defer stop()
				_, err := s.renewLease(one, lease)
				select {
				case results <- result{seq, sent, err}:
				case <-rctx.Done():
				}
			}(seq)
		}
	}
}
