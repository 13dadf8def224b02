package server

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/keyshard/keyshard/internal/coordinator"
	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/placement"
)

// errNotLeader ends a term: the session ended or a write was fenced.
var errNotLeader = errors.New("server: no longer leader")

// campaign runs elections until ctx ends: campaign, lead while elected,
// resign, repeat. It returns when ctx is done.
func (s *Server) campaign(ctx context.Context) error {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := s.term(ctx)
		if ctx.Err() != nil {
			return nil
		}
		s.log.Warn("leadership ended; campaigning again", "err", err)
		t := s.clock.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	return nil
}

// term campaigns once and, if elected, leads until it loses the session,
// a write is fenced, its lease deadline passes, or ctx ends. While it
// leads it runs three goroutines, all exited before term returns: the
// coordinator (lead) and the hot-key aggregation (aggregateHotKeys), both
// fenced by the term's election key, either one's fenced write ending the
// term; and holdLease, which ends the term once this replica can no
// longer be sure etcd still holds its lease, even if etcd never answers.
func (s *Server) term(ctx context.Context) error {
	sess, err := s.store.NewSession(ctx, s.cfg.ElectionTTL)
	if err != nil {
		return fmt.Errorf("election session: %w", err)
	}
	defer sess.Close()
	el := s.store.NewElection(sess)
	fence, err := el.Campaign(ctx, s.cfg.Replica)
	if err != nil {
		return fmt.Errorf("campaign: %w", err)
	}
	defer func() {
		// The gauge first: a deposed leader must not report itself while
		// Resign waits on an etcd it may not reach.
		s.metrics.leader.Set(0)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = s.resignElection(rctx, el) // best effort: the session's end resigns too
	}()
	// The lease deadline counts from a renewal sent now, not from the
	// grant: the campaign may have waited for longer than the TTL.
	renewed := s.clock.Now()
	if _, err := s.renewLease(ctx, sess.LeaseID()); err != nil {
		return fmt.Errorf("renew the election lease after winning: %w", err)
	}
	s.log.Info("elected leader", "replica", s.cfg.Replica, "election_ttl", sess.TTL())
	s.metrics.leader.Set(1)

	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // exits when the term ends (lctx) or the session does
		select {
		case <-sess.Done():
			cancel()
		case <-lctx.Done():
		}
	}()
	g, gctx := errgroup.WithContext(lctx)
	g.Go(func() error { return s.holdLease(gctx, sess.LeaseID(), sess.TTL(), renewed) }) // exits when gctx ends or the deadline passes
	g.Go(func() error { return s.lead(gctx, fence) })                                    // exits when gctx ends or a write is fenced
	g.Go(func() error { return s.aggregateHotKeys(gctx, fence) })                        // exits when gctx ends or a write is fenced
	return g.Wait()
}

// lead runs the coordinator while this replica is leader.
func (s *Server) lead(ctx context.Context, fence store.Fence) error {
	m := coordinator.New()
	snap, err := s.store.LoadAll(ctx)
	if err != nil {
		return fmt.Errorf("load state: %w", err)
	}
	pending := m.StepAll(append(snapshotEvents(snap), coordinator.BecameLeader{}), s.clock.Now())
	updates, stopWatch := s.watchStore(ctx, snap.Rev+1)
	defer stopWatch() // the term ends only once the watch goroutine has exited
	tick := s.clock.NewTicker(time.Second)
	defer tick.Stop()
	for {
		var retry []coordinator.Action
		for len(pending) > 0 {
			a := pending[0]
			pending = pending[1:]
			rev, err := s.do(ctx, fence, a)
			switch {
			case err == nil:
				// Tell the machine what it just wrote, at the revision it was
				// written, so it can plan the next round now instead of when
				// the watch echoes the write (the echo then changes nothing).
				if evs := committedEvents(a, rev); len(evs) > 0 {
					pending = append(pending, m.StepAll(evs, s.clock.Now())...)
				}
			case errors.Is(err, store.ErrFenced):
				return errNotLeader
			case ctx.Err() != nil:
				return ctx.Err()
			default:
				s.log.Warn("leader write failed; replanning from the store", "action", fmt.Sprintf("%T", a), "err", err)
				s.metrics.writeFailures.Inc()
				// Replanned actions wait for the next change or tick, so a
				// write that keeps failing does not spin.
				retry = append(retry, m.Step(coordinator.WriteFailed{Action: a, Err: err}, s.clock.Now())...)
			}
		}
		pending = retry
		select {
		case <-ctx.Done():
			return errNotLeader
		case u, ok := <-updates:
			if !ok {
				return errNotLeader
			}
			// Take every update already waiting too, and plan once: a burst
			// of releases becomes one grant round, not one round each.
			evs := updateEvents(nil, u)
		drain:
			for range 256 {
				select {
				case u, ok := <-updates:
					if !ok {
						return errNotLeader
					}
					evs = updateEvents(evs, u)
				default:
					break drain
				}
			}
			pending = append(pending, m.StepAll(evs, s.clock.Now())...)
		case <-tick.C():
			pending = append(pending, m.Step(coordinator.Tick{}, s.clock.Now())...)
		}
	}
}

// updateEvents appends the coordinator events of one watch update.
func updateEvents(evs []coordinator.Event, u store.Update) []coordinator.Event {
	if u.Resync != nil {
		evs = append(evs, snapshotEvents(u.Resync.Snapshot)...)
	}
	for _, c := range u.Changes {
		if ev := changeEvent(c); ev != nil {
			evs = append(evs, ev)
		}
	}
	return evs
}

// committedEvents are the changes a committed action made, as the watch
// will deliver them.
func committedEvents(a coordinator.Action, rev int64) []coordinator.Event {
	switch a := a.(type) {
	case coordinator.WriteMap:
		return []coordinator.Event{coordinator.MapPut{Keyspace: a.Keyspace, Map: a.Map, Rev: rev}}
	case coordinator.WriteGrants:
		evs := make([]coordinator.Event, 0, len(a.Grants)+1)
		for id, g := range a.Grants {
			evs = append(evs, coordinator.GrantsPut{Keyspace: a.Keyspace, ID: id, Grants: g, Rev: rev})
		}
		return append(evs, coordinator.TokensPut{Keyspace: a.Keyspace, Token: a.Token, Rev: rev})
	}
	return nil
}

// do applies one action as a fenced store write and returns the revision
// it was committed at (0 for actions that are not one transaction).
func (s *Server) do(ctx context.Context, fence store.Fence, a coordinator.Action) (int64, error) {
	switch a := a.(type) {
	case coordinator.WriteMap:
		m, err := store.MapFromAssignment(a.Map.Epoch, a.Hash, a.Map.Assignment)
		if err != nil {
			return 0, err
		}
		rev, err := s.store.Commit(ctx, fence, []store.Write{store.PutMap(a.Keyspace, m)}, []store.Expect{{Key: store.MapKey(a.Keyspace), ModRevision: a.Expect.Rev}})
		if err != nil {
			return 0, err
		}
		s.metrics.epochs.WithLabelValues(a.Keyspace).Inc()
		s.metrics.moves.WithLabelValues(a.Keyspace).Add(float64(a.Moves))
		s.log.Info("new map", "keyspace", a.Keyspace, "epoch", a.Map.Epoch, "moves", a.Moves, "members", len(a.Map.Assignment.Counts()), "buckets_per_member", countsSummary(a.Map.Assignment))
		return rev, nil
	case coordinator.WriteGrants:
		var writes []store.Write
		var expects []store.Expect
		for id, g := range a.Grants {
			writes = append(writes, store.PutGrants(a.Keyspace, id, store.Grants{Session: store.LeaseID(g.Session), Buckets: storePairs(g.Buckets)}))
		}
		for _, e := range a.Expects {
			switch e.Kind {
			case coordinator.KeyGrants:
				expects = append(expects, store.Expect{Key: store.GrantsKey(a.Keyspace, e.ID), ModRevision: e.Rev})
			case coordinator.KeyTokens:
				expects = append(expects, store.Expect{Key: store.TokensKey(a.Keyspace), ModRevision: e.Rev})
			}
		}
		writes = append(writes, store.PutTokens(a.Keyspace, a.Token))
		rev, err := s.store.Commit(ctx, fence, writes, expects)
		if err != nil {
			return 0, err
		}
		s.metrics.granted.WithLabelValues(a.Keyspace).Add(float64(a.Granted))
		return rev, nil
	case coordinator.RevokeSession:
		lease := store.LeaseID(a.Session)
		qttl, err := s.quarantineTTL(ctx, a)
		if err != nil {
			return 0, err
		}
		if len(a.Quarantine) > 0 && qttl > 0 {
			qlease, _, err := s.store.Grant(ctx, qttl)
			if err != nil {
				return 0, err
			}
			q := store.Quarantine{Session: lease, Buckets: a.Quarantine}
			if _, err := s.store.Commit(ctx, fence, []store.Write{store.PutQuarantine(a.Keyspace, a.ID, q, qlease)}, nil); err != nil {
				if rerr := s.store.Revoke(context.WithoutCancel(ctx), qlease); rerr != nil && !errors.Is(rerr, store.ErrLeaseNotFound) {
					s.log.Warn("could not revoke the lease of an unwritten quarantine; it expires on its own", "keyspace", a.Keyspace, "member", a.ID, "lease", qlease, "ttl", qttl, "err", rerr)
				}
				return 0, err
			}
		}
		if err := s.store.Revoke(ctx, lease); err != nil && !errors.Is(err, store.ErrLeaseNotFound) {
			return 0, err
		}
		s.log.Warn("revoked a member session", "keyspace", a.Keyspace, "member", a.ID, "session", lease, "reason", a.Reason, "quarantined_buckets", len(a.Quarantine), "quarantine", qttl)
	case coordinator.Report:
		s.metrics.reports.WithLabelValues(a.Keyspace, string(a.Kind)).Inc()
		s.log.Warn(a.Message, "keyspace", a.Keyspace, "kind", a.Kind)
	}
	return 0, nil
}

// countsSummary is "a:12 b:11 ..." for up to 16 members, for logs.
func countsSummary(a placement.Assignment) string {
	counts := a.Counts()
	ids := make([]string, 0, len(counts))
	for id := range counts {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var sb strings.Builder
	for i, id := range ids {
		if i == 16 {
			fmt.Fprintf(&sb, " and %d more", len(ids)-16)
			break
		}
		if i > 0 {
			sb.WriteByte(' ')
		}
		fmt.Fprintf(&sb, "%s:%d", id, counts[id])
	}
	return sb.String()
}
