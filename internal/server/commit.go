package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
)

// Commit records the session's stream positions (store.CommitPositions:
// one write of one small value however many buckets it holds).
//
// Concurrent commits of one session are coalesced: while a store write of
// the session's commits is in flight, later ones queue; then the newest
// queued one is written, and every queued commit it covers (no newer in
// any field, same exceptions: see covers) that is itself valid against
// the state the write was checked against is answered with that write's
// revision. A commit is answered with success only once it, or one that
// covers it, is durably written. Each write starts from a guess of the
// member's grants, release record and commit record (the previous
// write's, or this replica's view), which the write's compares verify:
// one etcd round trip when the guess is current. A bucket the session
// released without a final position and that is not handed over yet
// keeps its position (store.CommitState.Stored).
//
// Errors: INVALID_ARGUMENT naming the field (an exception outside the
// keyspace, listed twice or at token 0; max_token above the last token
// issued; an exclusive keyspace), FAILED_PRECONDITION for an exception
// not held at its token (naming it) or a position moving backwards
// ("backwards"), NOT_FOUND for a session that ended or was replaced,
// ABORTED ("retry") when the member's earlier session's positions are
// not folded yet or the write stayed contended, UNAVAILABLE when etcd did
// not answer in time.
func (m *memberService) Commit(ctx context.Context, req *connect.Request[v1.CommitRequest]) (*connect.Response[v1.CommitResponse], error) {
	s := m.s
	sess, err := s.sessions.parse(req.Msg.GetSession())
	if err != nil {
		return nil, err
	}
	k, err := s.keyspace(ctx, sess.keyspace)
	if err != nil {
		return nil, err
	}
	if k.Mode != shard.ModeStream {
		return nil, invalid("session: keyspace %q is in %s mode; Commit is for stream keyspaces (mode KEYSPACE_MODE_STREAM)", k.Name, k.Mode)
	}
	c, index, err := commitOf(req.Msg, sess.lease, k)
	if err != nil {
		return nil, err
	}
	if s.replaced(sess) {
		return nil, sessionReplaced(sess)
	}
	call := &commitCall{c: c, done: make(chan commitResult, 1)}
	s.commits.add(s, sess, call)
	var r commitResult
	select {
	case r = <-call.done:
	case <-ctx.Done():
		// The commit may still be written; a retry is safe.
		return nil, apiError(ctx.Err())
	}
	s.metrics.commits.WithLabelValues(sess.keyspace).Inc()
	if r.err != nil {
		return nil, commitError(sess, c, index, r.err)
	}
	// Read-your-writes through this replica (GetPositions), and a current
	// guess for the session's next commit.
	s.view.waitRev(ctx, r.rev)
	return connect.NewResponse(&v1.CommitResponse{Revision: uint64(r.rev)}), nil
}

// commitOf reads a CommitRequest into a commit of session lease, its
// exceptions sorted by bucket, and the index of each exception's bucket in
// the request, for errors. Exceptions may come in any order.
func commitOf(req *v1.CommitRequest, lease shard.LeaseID, k shard.Keyspace) (shard.Commit, map[int]int, error) {
	c := shard.Commit{Session: lease, MaxToken: req.GetMaxToken(), Default: req.GetPosition()}
	index := make(map[int]int, len(req.GetExceptions()))
	for i, e := range req.GetExceptions() {
		b := e.GetBucket()
		if b >= uint32(k.Buckets) {
			return c, nil, invalid("exceptions[%d].bucket: %d is out of range: keyspace %q has buckets 0-%d", i, b, k.Name, k.Buckets-1)
		}
		if e.GetToken() == 0 {
			return c, nil, invalid("exceptions[%d].token: 0; give the token the session holds bucket %d at (tokens start at 1)", i, b)
		}
		if j, dup := index[int(b)]; dup {
			return c, nil, invalid("exceptions[%d] and exceptions[%d] both name bucket %d; list each bucket once", j, i, b)
		}
		index[int(b)] = i
		c.Exceptions = append(c.Exceptions, shard.BucketPosition{Bucket: int(b), Token: e.GetToken(), Position: e.GetPosition()})
	}
	slices.SortFunc(c.Exceptions, func(a, b shard.BucketPosition) int { return a.Bucket - b.Bucket })
	return c, index, nil
}

// commitError turns the store's refusal of commit c into the API's error,
// naming the request's field.
func commitError(sess session, c shard.Commit, index map[int]int, err error) error {
	var notHeld *store.NotHeldError
	var back *store.BackwardsError
	switch {
	case errors.As(err, &notHeld):
		return failedPrecondition("exceptions[%d]: %v; commit positions only of buckets this session holds, at their grants' tokens", index[notHeld.Bucket], notHeld)
	case errors.As(err, &back):
		field := "position"
		switch {
		case back.Field == "max_token":
			field = "max_token"
		case back.Field == "exceptions" && back.Bucket >= 0:
			field = fmt.Sprintf("exceptions[%d]", index[back.Bucket])
		}
		if back.Bucket < 0 {
			return failedPrecondition("%s: %d is lower than the %d this session committed before; positions never go backwards", field, back.Given, back.Committed)
		}
		return failedPrecondition("%s: bucket %d would go backwards, from its committed position %d to %d; give it an exception at its own position", field, back.Bucket, back.Committed, back.Given)
	case errors.Is(err, store.ErrFenced):
		return sessionReplaced(sess)
	case errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrLeaseNotFound):
		return sessionEnded(sess)
	case errors.Is(err, store.ErrConflict):
		return connect.NewError(connect.CodeAborted, errorf("commit not applied: %v; retry", err))
	case errors.Is(err, store.ErrInvalid):
		// What the API does not check itself: a max_token above the last
		// token issued in the keyspace.
		why := err.Error()
		if _, after, ok := strings.Cut(why, `field "max_token": `); ok {
			why = after
		}
		return invalid("max_token: %s; pass the highest token among the grants the worker read", why)
	}
	return apiError(err)
}

// commitResult is the answer to one queued commit: the revision of the
// write that made it durable, or why it was refused.
type commitResult struct {
	rev int64
	err error
}

// commitCall is one Commit call waiting for its write.
type commitCall struct {
	c    shard.Commit
	done chan commitResult // buffered: the writer never blocks on it
}

// commits queues the Commit calls of each member session while a store
// write of that session's commits is in flight.
type commits struct {
	mu     sync.Mutex
	queues map[session]*commitQueue // sessions with a writer running
}

// commitQueue is one session's calls waiting for the next write.
type commitQueue struct {
	calls   []*commitCall
	arrived chan struct{} // signalled (without blocking) by every add
}

// add queues call for sess, and starts the session's writer if none runs.
func (cs *commits) add(s *Server, sess session, call *commitCall) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if q, running := cs.queues[sess]; running {
		q.calls = append(q.calls, call)
		select {
		case q.arrived <- struct{}{}:
		default:
		}
		return
	}
	if cs.queues == nil {
		cs.queues = map[session]*commitQueue{}
	}
	q := &commitQueue{calls: []*commitCall{call}, arrived: make(chan struct{}, 1)}
	cs.queues[sess] = q
	go s.writeCommits(sess, q) // exits once the session's queue is empty
}

// take returns q's calls, or, if there are none, ends the session's
// writer and returns nil.
func (cs *commits) take(sess session, q *commitQueue) []*commitCall {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if len(q.calls) == 0 {
		delete(cs.queues, sess)
		return nil
	}
	calls := q.calls
	q.calls = nil
	return calls
}

// queued returns how many calls q holds.
func (cs *commits) queued(q *commitQueue) int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return len(q.calls)
}

// commitLinger bounds how long a session's writer waits, after a write
// that answered several calls, for those callers' next commits before it
// writes what is queued: a worker that keeps n calls in flight gets them
// answered in one write instead of in two halves (the callers answered by
// a write come back while the next one, with the others, is in flight).
// It is well below a write's cost (an etcd fsync, a few milliseconds),
// and a worker that commits one call at a time never waits on it.
const commitLinger = time.Millisecond

// writeCommits is a session's writer: it writes the queued commits, batch
// by batch, until none are left.
func (s *Server) writeCommits(sess session, q *commitQueue) {
	var st *store.CommitState // after the last write of this run
	answered := 0
	for {
		if answered > 1 {
			s.commits.linger(q, answered)
		}
		batch := s.commits.take(sess, q)
		if batch == nil {
			return
		}
		answered = len(batch)
		st = s.writeBatch(sess, batch, st)
	}
}

// linger waits until q holds want calls, for at most commitLinger of
// real time (a pause of the scheduler, not of the server's clock).
func (cs *commits) linger(q *commitQueue, want int) {
	t := time.NewTimer(commitLinger)
	defer t.Stop()
	for cs.queued(q) < want {
		select {
		case <-q.arrived:
		case <-t.C:
			return
		}
	}
}

// writeBatch answers every call of batch, in as few writes as it can: the
// newest commit (see newest) is written, and the calls it covers are
// answered with it; calls left over (not covered, or refused by the state
// of the write) go the same way. It returns the state after the last
// successful write, a guess for the next batch (nil if none).
func (s *Server) writeBatch(sess session, batch []*commitCall, st *store.CommitState) *store.CommitState {
	for len(batch) > 0 {
		i := newest(batch)
		w := batch[i]
		batch = slices.Delete(batch, i, i+1)
		guess := s.commitGuess(sess, st)
		var (
			rev    int64
			before store.CommitState
		)
		err := s.memberStore(context.Background(), sess.keyspace, func(ctx context.Context) (err error) {
			rev, before, err = s.store.CommitPositionsWith(ctx, sess.keyspace, sess.member, sess.lease, w.c, guess)
			return err
		})
		switch {
		case err == nil:
			s.metrics.commitWrites.WithLabelValues(sess.keyspace).Inc() // a refused commit writes nothing
			w.done <- commitResult{rev: rev}
			after := before
			after.Commit, after.CommitRev = before.Stored(w.c), rev // as written: with its pins
			st = &after
			// The calls w covers and that were valid when it was written
			// are durable with it; one refused by that state is answered
			// so (the state was current then, within every queued call).
			// The rest are tried on their own.
			rest := batch[:0]
			for _, p := range batch {
				switch cerr := before.Check(p.c, sess.lease); {
				case cerr == nil && covers(w.c, p.c):
					p.done <- commitResult{rev: rev}
				case cerr != nil && !errors.Is(cerr, store.ErrInvalid):
					// Invalid is left to the store: the guessed
					// state's last token may be behind.
					p.done <- commitResult{err: cerr}
				default:
					rest = append(rest, p)
				}
			}
			batch = rest
		case before.Buckets > 0:
			// Refused by the state the store has just read: check the
			// others against it too.
			w.done <- commitResult{err: err}
			fresh := before
			st = &fresh
			rest := batch[:0]
			for _, p := range batch {
				if cerr := before.Check(p.c, sess.lease); cerr != nil {
					p.done <- commitResult{err: cerr}
				} else {
					rest = append(rest, p)
				}
			}
			batch = rest
		default:
			// The session ended, etcd did not answer, ...: the same for
			// every call of the batch.
			w.done <- commitResult{err: err}
			for _, p := range batch {
				p.done <- commitResult{err: err}
			}
			return nil
		}
	}
	return st
}

// newest returns the index in batch of the commit to write first: the
// last queued, or one that covers it (concurrent calls of a worker arrive
// in any order; the highest covers the others).
func newest(batch []*commitCall) int {
	best := len(batch) - 1
	for i := len(batch) - 2; i >= 0; i-- {
		if covers(batch[i].c, batch[best].c) {
			best = i
		}
	}
	return best
}

// covers reports whether commit w makes p durable: the same session, no
// field of p newer than w's, and the same exceptions (bucket and token),
// none at a higher position in p. Positions only rise with each field
// (shard.Positions), so every bucket is at least as far in w as in p.
func covers(w, p shard.Commit) bool {
	if p.Session != w.Session || p.MaxToken > w.MaxToken || p.Default > w.Default || len(p.Exceptions) != len(w.Exceptions) {
		return false
	}
	for i, e := range p.Exceptions {
		we := w.Exceptions[i]
		if e.Bucket != we.Bucket || e.Token != we.Token || e.Position > we.Position {
			return false
		}
	}
	return true
}

// commitGuess is what a commit of sess is checked against before it is
// written: this replica's view of the member's grants, release record,
// commit record and the keyspace's last token, or st (the state after this writer's last
// write) where that is newer. Nil if the view does not have the keyspace:
// the store then reads.
func (s *Server) commitGuess(sess session, st *store.CommitState) *store.CommitState {
	var guess *store.CommitState
	s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		ks := snap.Keyspaces[sess.keyspace]
		if ks == nil || !ks.Config.Exists() {
			return
		}
		g, r, c := ks.Grants[sess.member], ks.Releases[sess.member], ks.Commits[sess.member]
		guess = &store.CommitState{Buckets: ks.Config.Value.Buckets, Grants: g.Value, GrantsRev: g.ModRevision,
			Releases: r.Value, ReleasesRev: r.ModRevision, Commit: c.Value, CommitRev: c.ModRevision, LastToken: ks.Tokens.Value}
	})
	if st == nil {
		return guess
	}
	if guess == nil {
		return st
	}
	if st.GrantsRev > guess.GrantsRev {
		guess.Grants, guess.GrantsRev = st.Grants, st.GrantsRev
	}
	if st.ReleasesRev > guess.ReleasesRev {
		guess.Releases, guess.ReleasesRev = st.Releases, st.ReleasesRev
	}
	if st.CommitRev > guess.CommitRev {
		guess.Commit, guess.CommitRev = st.Commit, st.CommitRev
	}
	guess.LastToken = max(guess.LastToken, st.LastToken)
	return guess
}
