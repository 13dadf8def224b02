package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/keyshard/keyshard/clock"
	"github.com/keyshard/keyshard/internal/coordinator"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
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
	var st leaderStore = s.store
	if s.seams.leader != nil {
		st = s.seams.leader
	}
	g.Go(func() error { return s.holdLease(gctx, sess.LeaseID(), sess.TTL(), renewed) }) // exits when gctx ends or the deadline passes
	g.Go(func() error { return s.lead(gctx, st, fence) })                                // exits when gctx ends or a write is fenced
	g.Go(func() error { return s.aggregateHotKeys(gctx, fence) })                        // exits when gctx ends or a write is fenced
	g.Go(func() error { return s.leadTenantPools(gctx, fence) })                         // exits when gctx ends or a write is fenced
	return g.Wait()
}

// leaderStore is what the leader's loop (lead) needs from the store, and
// no more: the state to start from and the changes after it, the fenced
// transaction each write is, and the leases a revocation reads and
// quarantines on. *store.Store implements it; the loop's tests use one in
// memory.
type leaderStore interface {
	LoadAll(ctx context.Context) (*store.Snapshot, error)
	Watch(ctx context.Context, fromRev int64) <-chan store.Update
	Commit(ctx context.Context, f store.Fence, writes []store.Write, expects []store.Expect) (int64, error)

	// For RevokeSession: Rev, the store's current revision, which the
	// watch must have delivered before a drain timeout is acted on.
	Rev(ctx context.Context) (int64, error)
	QuarantineOf(ctx context.Context, ks, id string) (store.QuarantineInfo, error)
	TimeToLive(ctx context.Context, id shard.LeaseID) (store.LeaseInfo, error)
	Grant(ctx context.Context, ttl time.Duration) (shard.LeaseID, time.Duration, error)
	Revoke(ctx context.Context, id shard.LeaseID) error
}

// lead runs the coordinator on st while this replica is leader.
//
// Writes are serial: each is one fenced transaction, bounded by its own
// deadline (writeDeadline) so that a write stuck on a lost etcd leader does
// not hold up every handoff for etcd's whole request timeout. A failed or
// abandoned write is counted, and the machine replans it from its latest
// view once a backoff (writeBackoff) has passed. The store is not reloaded
// for it: the watch brings every change, and the revisions each write
// expects keep one planned from a view that is behind from applying.
//
// An abandoned write may still be applied by etcd later, but never as well
// as its retry: both are fenced by the term's election key (Commit compares
// its CreateRevision) and carry the revisions of the keys they were
// planned from: every grant round expects the keyspace's tokens key, and
// every map write its map key, at the revision the machine last saw, and
// writes that key. Whichever of the two applies first moves that key's
// ModRevision, so the other's comparison fails and it writes nothing
// (ErrConflict). A retry planned after the abandoned write's echo arrived
// expects the new revision and is a new round on top of it, not the same
// one again. RevokeSession is idempotent: a second quarantine of the same
// buckets only extends it, and revoking a revoked lease is a no-op.
func (s *Server) lead(ctx context.Context, st leaderStore, fence store.Fence) error {
	m := coordinator.New()
	m.SetEpochGap(s.cfg.RebalanceGap)
	// plan steps the machine, timed for keyshard_leader_plan_seconds (on
	// the wall clock: it measures CPU work, not the server's clock).
	// lastPlan is when the last step ended and how long it took.
	var lastPlan struct {
		end  time.Time
		took time.Duration
	}
	plan := func(evs []coordinator.Event) []coordinator.Action {
		start := time.Now()
		as := m.StepAll(evs, s.clock.Now())
		lastPlan.end = time.Now()
		lastPlan.took = lastPlan.end.Sub(start)
		s.metrics.leaderPlan.Observe(lastPlan.took.Seconds())
		return as
	}
	snap, err := s.loadAll(ctx, st)
	if err != nil {
		return fmt.Errorf("load state: %w", err)
	}
	pending := plan(snapshotEvents(snap))
	updates, stopWatch := watchStore(ctx, st, snap.Rev+1)
	defer stopWatch() // the term ends only once the watch goroutine has exited
	defer s.metrics.leaderWatchBehind.Set(0)
	tick := s.clock.NewTicker(time.Second)
	defer tick.Stop()
	own := newOwnWrites()
	// seen is the revision the watch has delivered up to. checked holds,
	// per session whose drain timeout the machine reported, the store's
	// revision when it first did: the revocation waits until the watch
	// has delivered that far, so that the machine has seen every release
	// the member made before it was found late (the drain timeout counts
	// from the leader's own map write, which it learns at once, while the
	// member's release arrives through the watch, which can run far
	// behind: the machine must not revoke a member for a release that is
	// in etcd and not yet delivered).
	seen := snap.Rev
	checked := map[shard.LeaseID]int64{}
	// deferredRevoke: the last action was a drain-timeout revocation put
	// off until the watch catches up.
	deferredRevoke := false
	// alone: how many of the next actions are written each in its own
	// transaction, after a transaction of several failed.
	alone := 0
	// failed are the writes that failed since the last retry; the machine
	// still counts them in flight, so it plans nothing in their place until
	// the retry timer replans them. failures counts the consecutive failed
	// writes of each keyspace, for the backoff.
	var failed []coordinator.Event
	failures := map[string]int{}
	var retry clock.Timer
	// wake steps the machine when a map it held back for the rebalance
	// gap is due (wakeAt: the time it was set for).
	var wake clock.Timer
	var wakeAt time.Time
	defer func() {
		if retry != nil {
			retry.Stop()
		}
		if wake != nil {
			wake.Stop()
		}
	}()
	// waiting adds to evs the events of the updates the watch has ready
	// (up to 256), without blocking; false: the watch has ended.
	// saw notes that the watch delivered u: how far it has come, and how
	// long the echoes of the leader's writes took (the watch's lag).
	saw := func(u store.Update) {
		seen = max(seen, u.Rev)
		own.echoed(seen, func(at time.Time) { s.metrics.leaderWatchLag.Observe(time.Since(at).Seconds()) })
		s.metrics.leaderWatchBehind.Set(float64(own.behind(seen)))
	}
	waiting := func(evs []coordinator.Event) ([]coordinator.Event, bool) {
		for range 256 {
			select {
			case u, ok := <-updates:
				if !ok {
					return evs, false
				}
				saw(u)
				evs = own.events(evs, u)
			default:
				return evs, true
			}
		}
		return evs, true
	}
	for {
		// committed collects what the writes of pending committed; the
		// machine steps once on all of it when pending is done, not after
		// each write: a grant round of a thousand members is a thousand
		// writes, and a step after each planned nothing new (the others
		// were in flight) at milliseconds apiece.
		var committed []coordinator.Event
		for len(pending) > 0 || len(committed) > 0 {
			if len(pending) == 0 {
				// With the updates that came during the writes: the step
				// after a write would otherwise see nothing new, and the
				// next one see the updates.
				evs, open := waiting(committed)
				if !open {
					return errNotLeader
				}
				pending, committed = plan(evs), nil
				continue
			}
			a := pending[0]
			pending = pending[1:]
			// The machine reports a drain timeout right after its
			// revocation; a revocation deferred below is not made, so
			// neither is its report. (Reported at each retry of the
			// deferred decision, every 50 ms, a fleet of thousands of
			// late members logged millions of lines and starved the loop.)
			if rep, ok := a.(coordinator.Report); ok && deferredRevoke && rep.Kind == coordinator.ReportDrainTimeout {
				deferredRevoke = false
				continue
			}
			deferredRevoke = false
			if r, ok := a.(coordinator.RevokeSession); ok && drainTimeout(r) {
				if wait, err := s.watchBehind(ctx, st, checked, r.Session, seen); err != nil || wait {
					if err == nil {
						err = fmt.Errorf("%w: the watch has not delivered revision %d yet; the machine decides again once it has", errWatchBehind, checked[r.Session])
					}
					failed = append(failed, coordinator.WriteFailed{Action: a, Err: err})
					deferredRevoke = true
					continue
				}
			}
			// Writes of other keyspaces planned right after this one
			// go in its transaction: a fleet over a hundred keyspaces
			// made a hundred transactions a step, one after the other,
			// and the leader fell behind its watch.
			if alone == 0 {
				if n, writes, expects := s.gather(a, pending, batchBudget(st)); n > 0 {
					batch := append([]coordinator.Action{a}, pending[:n]...)
					rev, err := s.writeTogether(ctx, st, fence, batch, writes, expects, writeDeadline(m.MinLeaseTTL()))
					switch {
					case err == nil:
						pending = pending[n:]
						now := time.Now()
						for _, b := range batch {
							delete(failures, actionKeyspace(b))
							committed = append(committed, own.committed(b, rev, now)...)
						}
						s.metrics.leaderWatchBehind.Set(float64(own.behind(seen)))
						continue
					case errors.Is(err, store.ErrFenced):
						return errNotLeader
					case ctx.Err() != nil:
						return ctx.Err()
					}
					// One of them failed the transaction (a conflict, a
					// lease that expired) or etcd did: write them one by
					// one, so that only the failing ones are replanned.
					s.log.Debug("leader transaction of several keyspaces failed; writing them one by one", "keyspaces", len(batch), "err", err)
					s.metrics.writeFailures.WithLabelValues("batch", writeFailureCause(err)).Inc()
					alone = n + 1
				}
			}
			if alone > 0 {
				alone--
			}
			rev, err := s.write(ctx, st, fence, a, writeDeadline(m.MinLeaseTTL()))
			switch {
			case err == nil:
				delete(failures, actionKeyspace(a))
				// Tell the machine what it just wrote, at the revision it was
				// written, so it can plan the next round now instead of when
				// the watch echoes the write (the echo is then dropped).
				committed = append(committed, own.committed(a, rev, time.Now())...)
				s.metrics.leaderWatchBehind.Set(float64(own.behind(seen)))
			case errors.Is(err, store.ErrFenced):
				return errNotLeader
			case ctx.Err() != nil:
				return ctx.Err()
			default:
				s.log.Warn("leader write failed; replanning it after a backoff", "action", fmt.Sprintf("%T", a), "err", err)
				s.metrics.writeFailures.WithLabelValues(actionName(a), writeFailureCause(err)).Inc()
				failed = append(failed, coordinator.WriteFailed{Action: a, Err: err})
				failures[actionKeyspace(a)]++
			}
		}
		var retryC <-chan time.Time
		if len(failed) > 0 {
			if retry == nil {
				// Updates do not move the retry: a steady stream of them must
				// not starve it.
				retry = s.clock.NewTimer(writeBackoff(maxValue(failures)))
			}
			retryC = retry.C()
		}
		var wakeC <-chan time.Time
		if at, ok := m.Wake(); ok {
			if wake == nil || !at.Equal(wakeAt) {
				if wake != nil {
					wake.Stop()
				}
				wake, wakeAt = s.clock.NewTimer(max(at.Sub(s.clock.Now()), 0)), at
			}
			wakeC = wake.C()
		} else if wake != nil {
			wake.Stop()
			wake = nil
		}
		select {
		case <-ctx.Done():
			return errNotLeader
		case <-wakeC:
			wake = nil
			pending = plan([]coordinator.Event{coordinator.Tick{}})
		case <-retryC:
			retry = nil
			pending = plan(failed)
			failed = nil
		case u, ok := <-updates:
			if !ok {
				return errNotLeader
			}
			if u.Progress {
				// Only how far the watch has come, asked for by the
				// view's keep-alive checks (the watches share etcd's
				// stream): nothing to plan.
				saw(u)
				own.events(nil, u)
				continue
			}
			// Take every update already waiting too, and plan once: a burst
			// of releases becomes one grant round, not one round each.
			saw(u)
			evs, open := waiting(own.events(nil, u))
			if !open {
				return errNotLeader
			}
			// Steps back to back (a join storm's releases, arriving a few
			// at a time) are spaced by as long as the last one took, so
			// that each gathers what came meanwhile and the leader spends
			// at most about half its time stepping. An update after a
			// quiet spell is stepped at once.
			if pause := min(lastPlan.took-time.Since(lastPlan.end), maxStepPause); pause > 0 {
				t := time.NewTimer(pause)
				select {
				case <-ctx.Done():
					t.Stop()
					return errNotLeader
				case <-t.C:
				}
				if evs, open = waiting(evs); !open {
					return errNotLeader
				}
			}
			pending = plan(evs)
		case <-tick.C():
			pending = plan([]coordinator.Event{coordinator.Tick{}})
		}
	}
}

// maxStepPause bounds the pause between two steps of the leader's
// machine made back to back (see lead).
const maxStepPause = 50 * time.Millisecond

// errWatchBehind: a drain-timeout revocation waits for the watch.
var errWatchBehind = errors.New("server: revocation deferred")

// drainTimeout reports whether a revokes a live session for buckets it
// has not released (not a superseded one, nor one that left).
func drainTimeout(a coordinator.RevokeSession) bool {
	return !a.Superseded && len(a.Quarantine) > 0
}

// watchBehind reports whether the revocation of session must wait for the
// watch: it records the store's revision the first time the session is
// found late, and says to wait until seen (what the watch has delivered)
// reaches it. The second decision after that is acted on.
func (s *Server) watchBehind(ctx context.Context, st leaderStore, checked map[shard.LeaseID]int64, session shard.LeaseID, seen int64) (bool, error) {
	if at, ok := checked[session]; ok {
		if seen >= at {
			delete(checked, session)
			return false, nil
		}
		return true, nil
	}
	rctx, cancel := context.WithTimeout(ctx, maxWriteDeadline)
	defer cancel()
	rev, err := st.Rev(rctx)
	if err != nil {
		return true, err
	}
	if seen >= rev {
		return false, nil
	}
	checked[session] = rev
	return true, nil
}

// Bounds of a leader write's deadline, and of the wait before a failed
// write is replanned.
const (
	minWriteDeadline = 500 * time.Millisecond
	maxWriteDeadline = 2 * time.Second
	minWriteBackoff  = 50 * time.Millisecond
	maxWriteBackoff  = time.Second
)

// errWriteDeadline: a leader write took longer than its deadline and was
// abandoned.
var errWriteDeadline = errors.New("server: leader write deadline exceeded")

// writeDeadline is how long one leader write may take, given the shortest
// member lease TTL of the keyspaces (0 if there are none): a third of it,
// clamped to [500 ms, 2 s]. A member whose holder released its buckets
// then waits for the grant no more than about a third of its lease when
// etcd loses its leader mid-write, instead of etcd's request timeout (7 s
// with its default election timeout).
func writeDeadline(minTTL time.Duration) time.Duration {
	return min(max(minTTL/3, minWriteDeadline), maxWriteDeadline)
}

// writeBackoff is the wait before replanning after failures consecutive
// failed writes (1, 2, ...) of a keyspace: 50 ms, doubling up to 1 s.
func writeBackoff(failures int) time.Duration {
	return min(minWriteBackoff<<min(max(failures-1, 0), 10), maxWriteBackoff)
}

func maxValue(counts map[string]int) int {
	n := 0
	for _, c := range counts {
		n = max(n, c)
	}
	return n
}

// loadAll reads the whole store for a new term, each attempt bounded by
// the longest write deadline and retried while the term lasts: a read
// sent to an etcd member that is paused (its connection looks alive) would
// otherwise hold the term up until the member resumes.
func (s *Server) loadAll(ctx context.Context, st leaderStore) (*store.Snapshot, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, maxWriteDeadline)
		snap, err := st.LoadAll(actx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return snap, err
		}
		s.log.Warn("could not load the store for the new term; retrying", "err", err)
		t := s.clock.NewTimer(minWriteBackoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C():
		}
	}
}

// actionKeyspace is the keyspace an action writes to, or "" for actions
// that write nothing (reports), whose success says nothing of the store.
func actionKeyspace(a coordinator.Action) string {
	switch a := a.(type) {
	case coordinator.WriteMap:
		return a.Keyspace
	case coordinator.WriteGrants:
		return a.Keyspace
	case coordinator.RevokeSession:
		return a.Keyspace
	case coordinator.WriteReservation:
		return a.Keyspace
	}
	return ""
}

// write is do bounded by deadline d (by s's clock): when it passes, the
// write's context is cancelled and write returns an error wrapping
// errWriteDeadline. ctx still bounds it as a whole.
// actionName names a leader write's action for the write-failure series.
func actionName(a coordinator.Action) string {
	switch a.(type) {
	case coordinator.WriteMap:
		return "map"
	case coordinator.WriteGrants:
		return "grants"
	case coordinator.RevokeSession:
		return "revoke"
	case coordinator.WriteReservation:
		return "reservation"
	}
	return "other"
}

// writeFailureCause sorts a failed leader write's error for the
// write-failure series: a conflict means the machine planned on a stale
// view (it replans on the watch's news); deadline and unavailable mean
// etcd is slow or unreachable; too_large a write etcd's request size
// refuses.
func writeFailureCause(err error) string {
	switch {
	case errors.Is(err, store.ErrConflict):
		return "conflict"
	case errors.Is(err, errWriteDeadline), errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, store.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, store.ErrTooLarge):
		return "too_large"
	}
	return "other"
}

func (s *Server) write(ctx context.Context, st leaderStore, fence store.Fence, a coordinator.Action, d time.Duration) (int64, error) {
	return s.timed(ctx, d, func(wctx context.Context) (int64, error) { return s.do(wctx, st, fence, a) })
}

// timed runs the leader write w bounded by deadline d, timed for
// keyshard_leader_write_seconds (see write).
func (s *Server) timed(ctx context.Context, d time.Duration, w func(context.Context) (int64, error)) (int64, error) {
	var rev int64
	start := time.Now()
	defer func() { s.metrics.leaderWrite.Observe(time.Since(start).Seconds()) }()
	timedOut, err := s.within(ctx, d, errWriteDeadline, func(wctx context.Context) (err error) {
		rev, err = w(wctx)
		return err
	})
	if timedOut {
		return 0, fmt.Errorf("%w (%v): %w", errWriteDeadline, d, err)
	}
	return rev, err
}

// ownWrites are the keys this leader committed that the watch has not
// delivered since, each with the revision and the event of its last
// commit. The watch runs behind the leader: it still delivers the echoes
// of its earlier writes after the machine has learnt of later ones (from
// the commits themselves), and applying such an echo would take the
// machine back to an older value and revision of the key: it would plan
// on a stale view, and its next write, expecting the old revision, would
// conflict.
//
// The keys are also queued in the order they were committed (so by
// revision): forgetting the keys an update passed costs only those keys,
// not a look at every key the leader wrote and the watch has not echoed
// yet (ten thousand grants records, when the watch runs behind a fleet's
// joins, looked at for each of its updates).
type ownWrites struct {
	keys  map[string]ownWrite
	order []ownKey // keys[order[i].key] is forgotten once the watch passes order[i].rev
	// commits are the revisions committed that the watch has not
	// delivered yet, with when: the echo's delay is the watch's lag.
	commits []ownCommit
}

type ownWrite struct {
	rev int64
	ev  coordinator.Event
}

type ownKey struct {
	key string
	rev int64
}

type ownCommit struct {
	rev int64
	at  time.Time
}

func newOwnWrites() *ownWrites { return &ownWrites{keys: map[string]ownWrite{}} }

// put records key's commit at rev.
func (o *ownWrites) put(key string, rev int64, ev coordinator.Event) {
	o.keys[key] = ownWrite{rev, ev}
	o.order = append(o.order, ownKey{key, rev})
}

// echoed drops the commits the watch has delivered (up to rev), calling
// f with when each was made.
func (o *ownWrites) echoed(rev int64, f func(at time.Time)) {
	n := 0
	for n < len(o.commits) && o.commits[n].rev <= rev {
		f(o.commits[n].at)
		n++
	}
	o.commits = o.commits[n:]
}

// behind is how many revisions the watch, having delivered up to seen,
// is behind the latest commit (0: none).
func (o *ownWrites) behind(seen int64) int64 {
	if len(o.commits) == 0 {
		return 0
	}
	return max(o.commits[len(o.commits)-1].rev-seen, 0)
}

// committed records that action a was committed at rev and returns the
// changes it made, as the watch will deliver them.
func (o *ownWrites) committed(a coordinator.Action, rev int64, at time.Time) []coordinator.Event {
	var evs []coordinator.Event
	o.commits = append(o.commits, ownCommit{rev, at})
	switch a := a.(type) {
	case coordinator.WriteMap:
		ev := coordinator.MapPut{Keyspace: a.Keyspace, Map: a.Map, Rev: rev}
		o.put(store.MapKey(a.Keyspace), rev, ev)
		evs = append(evs, ev)
	case coordinator.WriteGrants:
		for id, g := range a.Grants {
			ev := coordinator.GrantsPut{Keyspace: a.Keyspace, ID: id, Grants: g, Rev: rev}
			o.put(store.GrantsKey(a.Keyspace, id), rev, ev)
			evs = append(evs, ev)
		}
		ev := coordinator.TokensPut{Keyspace: a.Keyspace, Token: a.Token, Rev: rev}
		o.put(store.TokensKey(a.Keyspace), rev, ev)
		evs = append(evs, ev)
		was, now := store.SplitPositions(a.WasPositions), store.SplitPositions(a.Positions)
		for c := range now {
			if slices.Equal(was[c].Runs, now[c].Runs) {
				continue
			}
			var ev coordinator.Event = coordinator.BucketPosPut{Keyspace: a.Keyspace, Chunk: c, Positions: now[c], Rev: rev}
			if len(now[c].Runs) == 0 {
				ev = coordinator.BucketPosDeleted{Keyspace: a.Keyspace, Chunk: c}
			}
			o.put(store.BucketPosKey(a.Keyspace, c), rev, ev)
			evs = append(evs, ev)
		}
		for _, id := range a.Folded {
			ev := coordinator.CommitDeleted{Keyspace: a.Keyspace, ID: id}
			o.put(store.PositionsKey(a.Keyspace, id), rev, ev)
			evs = append(evs, ev)
		}
		for _, id := range slices.Sorted(maps.Keys(a.Held)) {
			ev := coordinator.HeldPut{Keyspace: a.Keyspace, ID: id, Held: a.Held[id], Rev: rev}
			o.put(store.HeldKey(a.Keyspace, id), rev, ev)
			evs = append(evs, ev)
		}
		for _, id := range a.Unheld {
			ev := coordinator.HeldDeleted{Keyspace: a.Keyspace, ID: id}
			o.put(store.HeldKey(a.Keyspace, id), rev, ev)
			evs = append(evs, ev)
		}
	case coordinator.WriteReservation:
		var ev coordinator.Event = coordinator.ReservationPut{Keyspace: a.Keyspace, Reservation: a.Reservation, Rev: rev}
		if len(a.Reservation.Members) == 0 {
			ev = coordinator.ReservationDeleted{Keyspace: a.Keyspace}
		}
		o.put(store.ReservedKey(a.Keyspace), rev, ev)
		evs = append(evs, ev)
	}
	return evs
}

// events appends the coordinator events of watch update u, leaving out
// every change of a key at or below the revision this leader last
// committed it at: the machine has that value, or a newer one, already. A
// resync to a snapshot older than some of its commits is followed by
// those commits again. Keys the watch has passed are forgotten.
func (o *ownWrites) events(evs []coordinator.Event, u store.Update) []coordinator.Event {
	if u.Resync != nil {
		evs = append(evs, snapshotEvents(u.Resync.Snapshot)...)
		keys := make([]string, 0, len(o.keys))
		for key, w := range o.keys {
			if w.rev > u.Resync.Rev {
				keys = append(keys, key)
			}
		}
		sort.Strings(keys)
		for _, key := range keys {
			evs = append(evs, o.keys[key].ev)
		}
	}
	for _, c := range u.Changes {
		if w, ok := o.keys[c.Key]; ok && c.ModRevision <= w.rev {
			continue
		}
		if ev := changeEvent(c); ev != nil {
			evs = append(evs, ev)
		}
	}
	n := 0
	for n < len(o.order) && o.order[n].rev <= u.Rev {
		// A key committed again later stays for its later commit.
		if k := o.order[n]; o.keys[k.key].rev == k.rev {
			delete(o.keys, k.key)
		}
		n++
	}
	o.order = o.order[n:]
	return evs
}

// do applies one action as a fenced write to st and returns the revision
// it was committed at (0 for actions that are not one transaction).
func (s *Server) do(ctx context.Context, st leaderStore, fence store.Fence, a coordinator.Action) (int64, error) {
	switch a := a.(type) {
	case coordinator.WriteMap, coordinator.WriteGrants:
		writes, expects := s.txnOf(a)
		rev, err := st.Commit(ctx, fence, writes, expects)
		if err != nil {
			return 0, err
		}
		s.applied(a)
		return rev, nil
	case coordinator.WriteReservation:
		rev, err := st.Commit(ctx, fence, []store.Write{store.PutReservation(a.Keyspace, a.Reservation)}, []store.Expect{{Key: store.ReservedKey(a.Keyspace), ModRevision: a.Expect.Rev}})
		if err != nil {
			return 0, err
		}
		if len(a.Joined) > 0 {
			s.log.Info("imported instances joined", "keyspace", a.Keyspace, "joined", a.Joined, "still_awaited", a.Reservation.Members)
		}
		return rev, nil
	case coordinator.RevokeSession:
		return 0, s.revoke(ctx, st, fence, a)
	case coordinator.Report:
		s.metrics.reports.WithLabelValues(a.Keyspace, string(a.Kind)).Inc()
		s.log.Warn(a.Message, "keyspace", a.Keyspace, "kind", a.Kind)
	}
	return 0, nil
}

// txnOf returns the writes and expectations of the transaction that
// applies a, a WriteMap or WriteGrants (nothing for other actions).
func (s *Server) txnOf(a coordinator.Action) (writes []store.Write, expects []store.Expect) {
	switch a := a.(type) {
	case coordinator.WriteMap:
		// The map and its entry in the map history, in one transaction.
		writes = append([]store.Write{store.PutMap(a.Keyspace, a.Map)}, store.PutHistory(a.Keyspace, historyEntry(a, s.clock.Now()))...)
		expects = []store.Expect{{Key: store.MapKey(a.Keyspace), ModRevision: a.Expect.Rev}}
	case coordinator.WriteGrants:
		for id, g := range a.Grants {
			writes = append(writes, store.PutGrants(a.Keyspace, id, g))
		}
		for _, e := range a.Expects {
			switch e.Kind {
			case coordinator.KeyGrants:
				expects = append(expects, store.Expect{Key: store.GrantsKey(a.Keyspace, e.ID), ModRevision: e.Rev})
			case coordinator.KeyTokens:
				expects = append(expects, store.Expect{Key: store.TokensKey(a.Keyspace), ModRevision: e.Rev})
			case coordinator.KeyCommit:
				expects = append(expects, store.Expect{Key: store.PositionsKey(a.Keyspace, e.ID), ModRevision: e.Rev})
			case coordinator.KeyBucketPos:
				expects = append(expects, store.Expect{Key: store.BucketPosKey(a.Keyspace, e.Chunk), ModRevision: e.Rev})
			case coordinator.KeyHeld:
				expects = append(expects, store.Expect{Key: store.HeldKey(a.Keyspace, e.ID), ModRevision: e.Rev})
			}
		}
		writes = append(writes, store.PutTokens(a.Keyspace, a.Token))
		// Stream keyspaces: the positions of the buckets that left their
		// holders, folded, and the commit records of ended sessions.
		writes = append(writes, store.PutBucketPositions(a.Keyspace, a.WasPositions, a.Positions)...)
		for _, id := range a.Folded {
			writes = append(writes, store.Delete(store.PositionsKey(a.Keyspace, id)))
		}
		// And the copies of the grants, without a lease, in the same
		// transaction as the grants they copy.
		for id, h := range a.Held {
			writes = append(writes, store.PutHeld(a.Keyspace, id, h))
		}
		for _, id := range a.Unheld {
			writes = append(writes, store.Delete(store.HeldKey(a.Keyspace, id)))
		}
	}
	return writes, expects
}

// applied counts and logs a WriteMap or WriteGrants once committed.
func (s *Server) applied(a coordinator.Action) {
	switch a := a.(type) {
	case coordinator.WriteMap:
		s.metrics.epochs.WithLabelValues(a.Keyspace).Inc()
		s.metrics.moves.WithLabelValues(a.Keyspace).Add(float64(a.Moves))
		if s.log.Enabled(context.Background(), slog.LevelInfo) {
			counts := a.Map.Assignment.Counts()
			s.log.Info("new map", "keyspace", a.Keyspace, "epoch", a.Map.Epoch, "moves", a.Moves, "reason", a.Reason, "why", a.Detail, "members", len(counts), "buckets_per_member", countsSummary(counts))
		}
	case coordinator.WriteGrants:
		s.metrics.granted.WithLabelValues(a.Keyspace).Add(float64(a.Granted))
	}
}

// txnBudget bounds one leader transaction: its writes and expectations
// (each at most etcd's --max-txn-ops less the fence) and the bytes of its
// keys and values (below etcd's default request limit of 1.5 MiB).
type txnBudget struct{ ops, bytes int }

// batchBudget is the budget of a transaction of several keyspaces' writes
// on st.
func batchBudget(st leaderStore) txnBudget {
	ops := store.DefaultMaxTxnOps - 1
	if m, ok := st.(interface{ MaxTxnWrites() int }); ok {
		ops = m.MaxTxnWrites()
	}
	return txnBudget{ops: ops, bytes: store.DefaultTenantTxnBytes}
}

// maxBatch bounds the actions in one leader transaction, so that one that
// fails costs at most that many writes made again one by one.
const maxBatch = 64

// gather returns how many of the actions that follow a (rest) go into
// a's transaction, and its writes and expectations: the maps and grant
// rounds right after it, each of a keyspace of its own, within budget b.
// n == 0: a is written alone (and nothing is returned).
func (s *Server) gather(a coordinator.Action, rest []coordinator.Action, b txnBudget) (n int, writes []store.Write, expects []store.Expect) {
	if !batchable(a) || len(rest) == 0 || !batchable(rest[0]) || actionKeyspace(rest[0]) == actionKeyspace(a) {
		return 0, nil, nil
	}
	seen := map[string]bool{actionKeyspace(a): true}
	writes, expects = s.txnOf(a)
	bytes := writesSize(writes)
	for _, next := range rest {
		if n+1 >= maxBatch || !batchable(next) || seen[actionKeyspace(next)] {
			break
		}
		w, e := s.txnOf(next)
		if len(writes)+len(w) > b.ops || len(expects)+len(e) > b.ops || bytes+writesSize(w) > b.bytes {
			break
		}
		writes, expects, bytes = append(writes, w...), append(expects, e...), bytes+writesSize(w)
		seen[actionKeyspace(next)] = true
		n++
	}
	if n == 0 {
		return 0, nil, nil
	}
	return n, writes, expects
}

func batchable(a coordinator.Action) bool {
	switch a.(type) {
	case coordinator.WriteMap, coordinator.WriteGrants:
		return true
	}
	return false
}

func writesSize(ws []store.Write) int {
	n := 0
	for _, w := range ws {
		n += w.Size()
	}
	return n
}

// writeTogether commits writes and expects, the transaction of the
// actions of batch (maps and grant rounds of distinct keyspaces), bounded
// by deadline d as write is, and counts and logs each once committed.
func (s *Server) writeTogether(ctx context.Context, st leaderStore, fence store.Fence, batch []coordinator.Action, writes []store.Write, expects []store.Expect, d time.Duration) (int64, error) {
	rev, err := s.timed(ctx, d, func(wctx context.Context) (int64, error) { return st.Commit(wctx, fence, writes, expects) })
	if err != nil {
		return 0, err
	}
	for _, a := range batch {
		s.applied(a)
	}
	return rev, nil
}

// historyEntry is the map history's entry for map write a, at now.
func historyEntry(a coordinator.WriteMap, now time.Time) store.EpochChange {
	c := store.EpochChange{Epoch: a.Map.Epoch, Time: now, Reason: string(a.Reason), Members: a.Members, Moved: a.Moves, Detail: a.Detail}
	for _, p := range a.Pairs {
		c.Moves = append(c.Moves, store.HistoryMove{From: p.From, To: p.To, Buckets: p.Buckets})
	}
	return c
}

// countsSummary is "a:12 b:11 ..." for up to 16 members, for logs.
func countsSummary(counts map[string]int) string {
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
