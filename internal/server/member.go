package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/internal/coordinator"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
)

// maxWait bounds a long poll.
const maxWait = 60 * time.Second

// maxLag bounds how long a read waits for this replica's copy of the store
// to reach a revision the caller has seen (min_revision, or a write this
// replica just made).
const maxLag = 5 * time.Second

// memberService serves MemberService: a worker's session.
type memberService struct{ s *Server }

func (m *memberService) Join(ctx context.Context, req *connect.Request[v1.JoinRequest]) (*connect.Response[v1.JoinResponse], error) {
	s := m.s
	k, err := s.keyspace(ctx, req.Msg.GetKeyspace())
	if err != nil {
		return nil, err
	}
	in := req.Msg.GetMember()
	if in == nil {
		return nil, invalid("member: missing; send {\"member\": {\"id\": ..., \"address\": ...}}")
	}
	if err := store.ValidateName(store.KindMember, in.GetId()); err != nil {
		return nil, apiError(err)
	}
	w := in.GetWeight()
	switch {
	case math.IsNaN(w) || math.IsInf(w, 0) || w < 0:
		return nil, invalid("member.weight: %v; want a finite number >= 0 (0 means 1)", w)
	case w == 0:
		w = 1
	}
	rec := shard.Member{ID: in.GetId(), Address: in.GetAddress(), Weight: w, Zone: in.GetZone(), Metadata: in.GetMetadata(), JoinedAt: s.clock.Now()}
	if tok := req.Msg.GetFencedSession(); tok != "" {
		fenced, err := s.fencedSession(tok, k.Name, rec.ID, req.Msg.GetReplace())
		if err != nil {
			return nil, err
		}
		rec.Replaces = fenced // store.Join records whether it is the session replaced
	}
	j := &joinOp{s: s, ks: k, rec: rec, replace: req.Msg.GetReplace()}
	err = s.memberStore(ctx, k.Name, j.attempt)
	lease, old, ttl, rev := j.lease, j.old, j.ttl, j.rev
	if err != nil && lease == 0 {
		return nil, apiError(err)
	}
	if err != nil {
		// An abandoned Join may still land; its session then expires
		// unused, as no keep-alive ever names it.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), maxWriteDeadline)
		if rerr := s.store.Revoke(rctx, lease); rerr != nil && !errors.Is(rerr, store.ErrLeaseNotFound) {
			s.log.Warn("could not revoke the lease of a failed join; it expires on its own", "keyspace", k.Name, "member", rec.ID, "lease", lease, "ttl", ttl, "err", rerr)
		}
		cancel()
		if errors.Is(err, store.ErrExists) {
			return nil, connect.NewError(connect.CodeAlreadyExists, errorf("member %q is already joined to %q with a live session; a restarted process passes replace=true to take over, another process needs another id", rec.ID, k.Name))
		}
		return nil, apiError(err)
	}
	if old != 0 && old != lease {
		// The leader revokes the old session (the record names it), after
		// quarantining what it holds: only the leader knows that for sure,
		// as it writes every grant; this replica's view may be behind.
		s.log.Info("member re-joined, replacing its old session; the leader revokes it", "keyspace", k.Name, "member", rec.ID, "old_session", old, "session", lease)
	} else {
		s.log.Info("member joined", "keyspace", k.Name, "member", rec.ID, "address", rec.Address, "weight", w, "zone", rec.Zone)
	}
	s.view.waitRev(ctx, rev)
	return connect.NewResponse(&v1.JoinResponse{
		Session:  s.sessions.token(k.Name, rec.ID, lease),
		LeaseTtl: durationpb.New(ttl),
		Keyspace: keyspaceProto(k),
	}), nil
}

// joinOp is the store operation of a Join, which memberStore may repeat:
// an attempt abandoned at its deadline may still have landed. The
// session's lease is therefore granted once, by the first attempt that
// gets one, and a repeated Join on that lease finds the record already on
// it and succeeds (store.Join is idempotent per lease). Granting a lease
// per attempt instead would have a repeat find the id held by the first
// attempt's live session and refuse the member's join.
type joinOp struct {
	s       *Server
	ks      shard.Keyspace
	rec     shard.Member
	replace bool

	lease, old shard.LeaseID
	ttl        time.Duration
	rev        int64
}

func (j *joinOp) attempt(ctx context.Context) (err error) {
	if j.lease == 0 {
		if j.lease, j.ttl, err = j.s.store.Grant(ctx, j.ks.LeaseTTL); err != nil {
			j.lease = 0
			return err
		}
	}
	j.old, j.rev, err = j.s.store.Join(ctx, j.ks.Name, j.rec, j.lease, j.replace)
	return err
}

// fencedSession checks a Join's fenced_session: a session of the same
// keyspace and member, issued by this cluster, sent with replace.
func (s *Server) fencedSession(tok, ks, id string, replace bool) (shard.LeaseID, error) {
	if !replace {
		return 0, invalid("fenced_session: set, but replace is not; a process re-joining after fencing itself sends both")
	}
	sess, err := s.sessions.parse(tok)
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			err = errors.New(ce.Message())
		}
		return 0, invalid("fenced_session: %v", err)
	}
	if sess.keyspace != ks || sess.member != id {
		return 0, invalid("fenced_session: a session of member %q in %q, not of %q in %q; pass the session this process held", sess.member, sess.keyspace, id, ks)
	}
	return sess.lease, nil
}

func (m *memberService) KeepAlive(ctx context.Context, req *connect.Request[v1.KeepAliveRequest]) (*connect.Response[v1.KeepAliveResponse], error) {
	sess, err := m.s.sessions.parse(req.Msg.GetSession())
	if err != nil {
		return nil, err
	}
	ttl, err := m.keepAlive(ctx, sess)
	m.s.metrics.keepAlives.WithLabelValues("call", keepAliveResult(err)).Inc()
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.KeepAliveResponse{Ttl: durationpb.New(ttl)}), nil
}

// keepAliveResult is the result label of keyshard_member_keepalives_total
// for a keep-alive that ended with err.
func keepAliveResult(err error) string {
	switch {
	case err == nil:
		return "renewed"
	case connect.CodeOf(err) == connect.CodeNotFound:
		return "ended"
	}
	return "failed"
}

// keepAlive renews session sess, as KeepAlive and a Session stream's
// keep-alives do, and returns the TTL etcd renewed. Errors are connect
// errors: NOT_FOUND once the session has ended or was replaced.
func (m *memberService) keepAlive(ctx context.Context, sess session) (time.Duration, error) {
	// A session this replica knows was replaced is not renewed: the
	// leader may have put its quarantine on its lease (see revoke).
	replaced, active, deadline := m.s.sessionState(sess)
	if replaced {
		return 0, sessionReplaced(sess)
	}
	// Renew, then check that the member record is still on this session,
	// and activate it on its first keep-alive. A session that was replaced
	// so never has a renewal acknowledged after its replacement was
	// written: the leader can then quarantine its buckets for only what
	// remains of its lease.
	// A member this replica's view already shows active on the session
	// only needs the renewal and the check, which the store makes for many
	// keep-alives at once (store.RenewMember); a view that is behind sends
	// it the long way.
	var (
		ttl time.Duration
		rev int64
		err error
	)
	if active {
		err = m.s.memberStoreWithin(ctx, deadline, func(within time.Duration) (err error) {
			ttl, err = m.s.store.RenewMember(ctx, sess.keyspace, sess.member, sess.lease, within)
			return err
		})
	} else {
		err = m.s.memberStore(ctx, sess.keyspace, func(ctx context.Context) (err error) {
			if ttl, err = m.s.store.KeepAliveOnce(ctx, sess.lease); err != nil {
				return err
			}
			rev, err = m.s.store.Activate(ctx, sess.keyspace, sess.member, sess.lease)
			return err
		})
	}
	if errors.Is(err, store.ErrLeaseNotFound) {
		return 0, sessionEnded(sess)
	}
	switch {
	case errors.Is(err, store.ErrFenced):
		return 0, sessionReplaced(sess)
	case errors.Is(err, store.ErrNotFound):
		return 0, sessionEnded(sess)
	case err != nil:
		return 0, apiError(err)
	case rev != 0:
		m.s.log.Info("member session active", "keyspace", sess.keyspace, "member", sess.member, "session", sess.lease)
		m.s.view.waitRev(ctx, rev)
	}
	return ttl, nil
}

// checkRenewals is the store's RenewCheck: after a batch of keep-alives
// was renewed, and etcd's revision rev read, it reports whether this
// replica's view, once at rev or later, has each member's record on the
// lease renewed. A view that does not reach rev within renewCheckWait,
// or shows any record elsewhere, leaves the batch to the check in etcd;
// after a miss, the next renewCheckOff of batches go to etcd directly:
// batches are checked one after another, and a view that lags (a
// resync, a burst of joins) must not hold each of them up by the wait.
func (s *Server) checkRenewals(ctx context.Context, rev int64, ms []store.MemberLease) bool {
	held := s.viewHolds(ctx, rev, ms)
	by := "replica"
	if !held {
		by = "etcd"
	}
	s.metrics.keepAliveChecks.WithLabelValues(by).Inc()
	return held
}

// viewHolds is checkRenewals' answer, before it is counted.
func (s *Server) viewHolds(ctx context.Context, rev int64, ms []store.MemberLease) bool {
	if s.clock.Now().UnixNano() < s.copyCheckOffUntil.Load() {
		return false
	}
	if !s.view.reach(ctx, s.store, rev, renewCheckWait) {
		s.copyCheckOffUntil.Store(s.clock.Now().Add(renewCheckOff).UnixNano())
		return false
	}
	held := true
	s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		for _, m := range ms {
			k := snap.Keyspaces[m.Keyspace]
			if k == nil {
				held = false
				return
			}
			if e, ok := k.Members[m.ID]; !ok || e.Lease != m.Lease {
				held = false
				return
			}
		}
	})
	return held
}

// renewCheckWait bounds how long checkRenewals waits for the view to
// reach etcd's revision before the batch is checked in etcd instead.
// The view is usually there already: keep-alives write nothing.
const renewCheckWait = 100 * time.Millisecond

// renewCheckOff is how long batches go to etcd directly after the view
// missed renewCheckWait.
const renewCheckOff = time.Second

// replaced reports whether this replica's view has session sess replaced
// (see sessionState).
func (s *Server) replaced(sess session) bool {
	r, _, _ := s.sessionState(sess)
	return r
}

// sessionState reads this replica's view of session sess once: replaced,
// when the view has member sess.member on another session than sess, or
// the member's quarantine on sess's lease (which only a replaced session
// carries); active, when it has the member on sess and no longer
// pending. (A view that is behind says neither; the check after the
// renewal catches a replacement.) And the deadline of the member's store
// operations (memberDeadline), from the same read.
func (s *Server) sessionState(sess session) (replaced, active bool, deadline time.Duration) {
	s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		ks := snap.Keyspaces[sess.keyspace]
		deadline = memberDeadline(ks)
		if ks == nil {
			return
		}
		if m, ok := ks.Members[sess.member]; ok {
			replaced = m.Lease != 0 && m.Lease != sess.lease
			active = m.Lease == sess.lease && !m.Value.Pending
		}
		if q, ok := ks.Quarantines[sess.member]; ok && q.Lease == sess.lease {
			replaced = true
		}
	})
	return replaced, active && !replaced, deadline
}

func sessionEnded(sess session) error {
	return notFound("session of member %q in %q has ended (expired, revoked, or the member left); join again", sess.member, sess.keyspace)
}

// quarantineTTL is how long the leader quarantines the buckets of session
// a.Session before it revokes it. 0 means there is nothing to
// quarantine: it held no bucket, or its lease is gone already (and with
// it every key it held; the member's own deadline, its last acknowledged
// renewal + TTL - margin, passed before etcd let the lease expire).
// Otherwise it is a.TTL: a
// live session may have a renewal acknowledged between this check and the
// revoke. A superseded session (its member record is on a newer one, so
// KeepAlive acknowledges no renewal of it any more) is quarantined for
// only what remains of its lease if that is shorter, one second added
// because etcd reports whole seconds rounded down.
func quarantineTTL(ctx context.Context, st leaderStore, a coordinator.RevokeSession) (time.Duration, error) {
	if len(a.Quarantine) == 0 {
		return 0, nil
	}
	info, err := st.TimeToLive(ctx, a.Session)
	switch {
	case errors.Is(err, store.ErrLeaseNotFound):
		return 0, nil
	case err != nil:
		return 0, err
	case info.TTL < 0: // etcd reports -1 for a lease that is gone
		return 0, nil
	case !a.Superseded:
		return a.TTL, nil
	}
	return min(a.TTL, info.TTL+time.Second), nil
}

func sessionReplaced(sess session) error {
	return notFound("session of member %q in %q was replaced by a newer session of the same id (Join with replace); stop acting as this member", sess.member, sess.keyspace)
}

// catchUp waits until this replica's copy of the store has reached
// revision rev, one the caller has seen (for example its Release's), so
// that no answer it gets is older than its own writes, whichever replica
// made them. It gives up after maxLag with UNAVAILABLE.
func (s *Server) catchUp(ctx context.Context, rev uint64) error {
	if rev == 0 {
		return nil
	}
	timer := s.clock.NewTimer(maxLag)
	defer timer.Stop()
	for {
		var at int64
		changed := s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) { at = snap.Rev })
		if at >= 0 && uint64(at) >= rev {
			return nil
		}
		select {
		case <-changed:
		case <-timer.C():
			return connect.NewError(connect.CodeUnavailable, errorf("this replica's copy of the store is at revision %d, behind min_revision %d after %v; retry, or ask another replica", at, rev, maxLag))
		case <-ctx.Done():
			return apiError(ctx.Err())
		}
	}
}

// liveGrants is grantsState, but a session the view does not know (it
// joined through another replica a moment ago, and the watch has not
// delivered it yet) is asked of etcd before it is declared ended.
func (s *Server) liveGrants(ctx context.Context, sess session) (*v1.GetGrantsResponse, error) {
	resp, alive := s.grantsState(sess)
	if alive {
		return resp, nil
	}
	if err := s.sessionAlive(ctx, sess); err != nil {
		return nil, err
	}
	return resp, nil
}

// sessionAlive asks etcd whether the session's lease still lives.
func (s *Server) sessionAlive(ctx context.Context, sess session) error {
	ttl := s.store.TimeToLive
	if s.seams.sessionLease != nil {
		ttl = s.seams.sessionLease
	}
	info, err := ttl(ctx, sess.lease)
	switch {
	case errors.Is(err, store.ErrLeaseNotFound):
		return sessionEnded(sess)
	case err != nil:
		return apiError(err)
	case info.TTL < 0: // etcd reports -1 for a lease that is gone
		return sessionEnded(sess)
	}
	return nil
}

// grantsState is what a member should know: what it holds and has not
// released, and which of those it must release, at a version that changes
// whenever either may. A bucket the member released at the token it holds
// it by is left out of both, although the grants still list it until the
// leader hands it over: the member's own release must never be shown back
// to it as a grant (read-your-writes).
func (s *Server) grantsState(sess session) (resp *v1.GetGrantsResponse, alive bool) {
	resp = &v1.GetGrantsResponse{}
	s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		ks := snap.Keyspaces[sess.keyspace]
		if ks == nil {
			return
		}
		var rev uint64
		rev, alive = grantsRevision(ks, sess)
		g, held := ks.Grants[sess.member]
		r := ks.Releases[sess.member]
		resp.Epoch = ks.Map.Value.Epoch
		resp.Revision = rev
		if !held || g.Value.Session != sess.lease {
			return
		}
		stream := ks.Config.Value.Mode == shard.ModeStream
		released := make(map[int]uint64, len(r.Value.Buckets))
		for _, bt := range r.Value.Buckets {
			released[bt.Bucket] = bt.Token
		}
		for _, bt := range g.Value.Buckets {
			if t, ok := released[bt.Bucket]; ok && t == bt.Token {
				continue
			}
			grant := &v1.BucketGrant{Bucket: uint32(bt.Bucket), Token: bt.Token}
			if stream {
				grant.From = bt.Position
			}
			resp.Grants = append(resp.Grants, grant)
			if ks.Map.Value.Assignment.Owner(bt.Bucket) != sess.member {
				resp.Release = append(resp.Release, uint32(bt.Bucket))
			}
		}
	})
	return resp, alive
}

// grantsRevision is the version grantsState answers at (the revision of
// the keyspace's map, the member's grants or its releases, whichever is
// latest), and whether the session is alive as far as the view shows.
func grantsRevision(ks *store.KeyspaceState, sess session) (rev uint64, alive bool) {
	mem, joined := ks.Members[sess.member]
	g, held := ks.Grants[sess.member]
	r := ks.Releases[sess.member]
	alive = joined && mem.Value.Session == sess.lease || held && g.Value.Session == sess.lease
	return uint64(max(ks.Map.ModRevision, g.ModRevision, r.ModRevision)), alive
}

// grantsUnchanged reports whether the session's grants state is still at
// rev and the session alive: a stream woken by a change to its keyspace
// that is not its own sends nothing, and need not build the state to
// know it (a join storm wakes 1,000 streams per change).
func (s *Server) grantsUnchanged(sess session, rev uint64) bool {
	same := false
	s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		if ks := snap.Keyspaces[sess.keyspace]; ks != nil {
			r, alive := grantsRevision(ks, sess)
			same = alive && r == rev
		}
	})
	return same
}

func (m *memberService) GetGrants(ctx context.Context, req *connect.Request[v1.GetGrantsRequest]) (*connect.Response[v1.GetGrantsResponse], error) {
	sess, err := m.s.sessions.parse(req.Msg.GetSession())
	if err != nil {
		return nil, err
	}
	wait, err := waitOf(req.Msg.GetWait())
	if err != nil {
		return nil, err
	}
	release, err := m.s.polls.holdIf(wait > 0)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := m.s.catchUp(ctx, req.Msg.GetMinRevision()); err != nil {
		return nil, err
	}
	timer := m.s.clock.NewTimer(wait)
	defer timer.Stop()
	for {
		changed := m.s.view.keyspaceChanged(sess.keyspace)
		resp, err := m.s.liveGrants(ctx, sess)
		if err != nil {
			return nil, err
		}
		if resp.Revision > req.Msg.GetSinceRevision() || wait == 0 {
			return connect.NewResponse(resp), nil
		}
		select {
		case <-changed:
		case <-timer.C():
			return connect.NewResponse(resp), nil
		case <-ctx.Done():
			return nil, apiError(ctx.Err())
		}
	}
}

func (m *memberService) WatchGrants(ctx context.Context, req *connect.Request[v1.WatchGrantsRequest], stream *connect.ServerStream[v1.GetGrantsResponse]) error {
	sess, release, err := m.openGrants(ctx, req.Msg.GetSession(), req.Msg.GetMinRevision())
	if err != nil {
		return err
	}
	defer release()
	var news grantsNews
	for {
		changed := m.s.view.keyspaceChanged(sess.keyspace)
		resp, err := news.next(ctx, m.s, sess)
		if err != nil {
			return err
		}
		if resp != nil {
			if err := stream.Send(resp); err != nil {
				return err
			}
			news.sent(resp)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil
		}
	}
}

// openGrants opens a stream of a session's grants (WatchGrants,
// Session): it checks the session's token, takes a place among the
// replica's long polls (release gives it back) and waits for this
// replica's copy of the store to reach minRev.
func (m *memberService) openGrants(ctx context.Context, token string, minRev uint64) (sess session, release func(), err error) {
	if sess, err = m.s.sessions.parse(token); err != nil {
		return session{}, nil, err
	}
	if release, err = m.s.polls.hold(); err != nil {
		return session{}, nil, err
	}
	if err := m.s.catchUp(ctx, minRev); err != nil {
		release()
		return session{}, nil, err
	}
	return sess, release, nil
}

// grantsNews is what a stream of a session's grants (WatchGrants, Session)
// has sent: the first message always carries the grants, later ones only
// when they changed.
type grantsNews struct {
	rev     uint64 // the revision of the last grants sent
	started bool   // whether any were sent
	// seen: this replica's view has shown the session alive. Until it
	// has, asked is when etcd was last asked whether it lives.
	seen  bool
	asked time.Time
}

// unseenRecheck is how often at most a stream asks etcd whether its
// session lives while this replica's view has yet to show the session
// (it joined through another replica, or the view is behind etcd).
// Asking at every change of the keyspace instead multiplied the load of
// an etcd already behind: every stream of a keyspace asked at every
// change (55,085 retried LeaseTimeToLive calls in one run of 10,000
// members on three etcd members sharing two cores).
const unseenRecheck = time.Second

// next returns the session's grants if the stream has yet to send them,
// or nil. A stream woken by a change to its keyspace that is not its own
// learns that from the revision alone (grantsUnchanged), without building
// the state (a join storm wakes 1,000 streams per change). A session the
// view does not show alive is asked of etcd (liveGrants): at once if the
// view has shown it before (it has ended, most likely), else at most once
// per unseenRecheck, sending nothing in between.
func (g *grantsNews) next(ctx context.Context, s *Server, sess session) (*v1.GetGrantsResponse, error) {
	if g.started && s.grantsUnchanged(sess, g.rev) {
		g.seen = true
		return nil, nil
	}
	resp, alive := s.grantsState(sess)
	switch {
	case alive:
		g.seen = true
	case g.started && !g.seen && s.clock.Since(g.asked) < unseenRecheck:
		return nil, nil
	default:
		g.asked = s.clock.Now()
		if err := s.sessionAlive(ctx, sess); err != nil {
			return nil, err
		}
	}
	if g.started && resp.Revision == g.rev {
		return nil, nil
	}
	return resp, nil
}

// sent records that resp went out.
func (g *grantsNews) sent(resp *v1.GetGrantsResponse) { g.rev, g.started = resp.Revision, true }

// Release records that the member has handed buckets back, each at the
// token it holds it by. The whole call is refused with INVALID_ARGUMENT,
// naming the entry, for a bucket outside the keyspace, a bucket listed
// twice, or one the session does not hold at that token. Releasing a
// bucket again at the same token before the leader has handed it over
// succeeds again (a retry after a timeout is safe); a bucket the member
// was not asked to release is given up and granted back at a higher token.
// The answer carries the revision of the write, and comes once this
// replica's view has it, so the member's next GetGrants through this
// replica, or through any with min_revision set to it, no longer lists the
// buckets.
//
// In a stream keyspace, positions give released buckets their final
// positions (INVALID_ARGUMENT naming positions[i] for an entry that is not
// one of the released buckets at its token, or is listed twice; positions
// in an exclusive keyspace are INVALID_ARGUMENT too). A position below the
// bucket's committed one is refused FAILED_PRECONDITION ("backwards"),
// releasing nothing: the store checks it against the commit record in the
// transaction that writes, so no concurrent Commit slips between.
func (m *memberService) Release(ctx context.Context, req *connect.Request[v1.ReleaseRequest]) (*connect.Response[v1.ReleaseResponse], error) {
	sess, err := m.s.sessions.parse(req.Msg.GetSession())
	if err != nil {
		return nil, err
	}
	if len(req.Msg.GetBuckets()) == 0 {
		return nil, invalid("buckets: empty; list each bucket to release with the token it was granted with")
	}
	k, err := m.s.keyspace(ctx, sess.keyspace)
	if err != nil {
		return nil, err
	}
	buckets := make([]shard.BucketToken, len(req.Msg.GetBuckets()))
	index := make(map[uint32]int, len(buckets))
	for i, bg := range req.Msg.GetBuckets() {
		b := bg.GetBucket()
		if b >= uint32(k.Buckets) {
			return nil, invalid("buckets[%d].bucket: %d is out of range: keyspace %q has buckets 0-%d", i, b, k.Name, k.Buckets-1)
		}
		if j, dup := index[b]; dup {
			return nil, invalid("buckets[%d] and buckets[%d] both name bucket %d; list each bucket once", j, i, b)
		}
		index[b] = i
		buckets[i] = shard.BucketToken{Bucket: int(b), Token: bg.GetToken()}
	}
	posIndex, err := releasePositions(k, req.Msg.GetPositions(), buckets, index)
	if err != nil {
		return nil, err
	}
	// The view's copy saves a read when it is current; the store checks it.
	var guess *store.ReleaseState
	m.s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		if ks := snap.Keyspaces[sess.keyspace]; ks != nil {
			g, r, c := ks.Grants[sess.member], ks.Releases[sess.member], ks.Commits[sess.member]
			guess = &store.ReleaseState{Grants: g.Value, GrantsRev: g.ModRevision, Releases: r.Value, ReleasesRev: r.ModRevision, Commit: c.Value, CommitRev: c.ModRevision}
		}
	})
	var rev int64
	err = m.s.memberStore(ctx, sess.keyspace, func(ctx context.Context) (err error) {
		rev, err = m.s.store.Release(ctx, sess.keyspace, sess.member, sess.lease, buckets, guess)
		return err
	})
	var notHeld *store.NotHeldError
	var back *store.BackwardsError
	switch {
	case err == nil:
		// Read-your-writes through this replica, for callers that do not
		// pass min_revision. The leader follows its own watch, so the
		// handoff does not wait for this.
		m.s.view.waitRev(ctx, rev)
		return connect.NewResponse(&v1.ReleaseResponse{Revision: uint64(rev)}), nil
	case errors.As(err, &notHeld):
		hint := ""
		if notHeld.Held == 0 || notHeld.Held > notHeld.Token {
			hint = fmt.Sprintf("; if this session released it at token %d before, that release has been handed over since: treat it as released", notHeld.Token)
		}
		return nil, invalid("buckets[%d]: %v%s", index[uint32(notHeld.Bucket)], notHeld, hint)
	case errors.As(err, &back):
		return nil, failedPrecondition("positions[%d]: bucket %d would go backwards, from its committed position %d to %d; nothing was released", posIndex[back.Bucket], back.Bucket, back.Committed, back.Given)
	case errors.Is(err, store.ErrFenced):
		return nil, sessionReplaced(sess)
	case errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrLeaseNotFound):
		return nil, sessionEnded(sess)
	}
	return nil, apiError(err)
}

// releasePositions sets the final positions of a Release's buckets from
// its positions field: each entry names one of the released buckets, at
// the token it is released at, once, and only in a stream keyspace. It
// returns each positioned bucket's index in positions, for errors.
func releasePositions(k shard.Keyspace, positions []*v1.BucketPosition, buckets []shard.BucketToken, index map[uint32]int) (map[int]int, error) {
	if len(positions) == 0 {
		return nil, nil
	}
	if k.Mode != shard.ModeStream {
		return nil, invalid("positions: keyspace %q is in %s mode; release positions belong to stream keyspaces (mode KEYSPACE_MODE_STREAM): leave positions out", k.Name, k.Mode)
	}
	posIndex := make(map[int]int, len(positions))
	for i, p := range positions {
		j, ok := index[p.GetBucket()]
		if !ok {
			return nil, invalid("positions[%d]: bucket %d is not among the buckets released; each entry names one of buckets, at the same token", i, p.GetBucket())
		}
		if p.GetToken() != buckets[j].Token {
			return nil, invalid("positions[%d]: bucket %d at token %d, but buckets[%d] releases it at token %d; give the same token", i, p.GetBucket(), p.GetToken(), j, buckets[j].Token)
		}
		if first, dup := posIndex[buckets[j].Bucket]; dup {
			return nil, invalid("positions[%d] and positions[%d] both name bucket %d; list each bucket once", first, i, p.GetBucket())
		}
		posIndex[buckets[j].Bucket] = i
		buckets[j].Position = p.GetPosition()
	}
	return posIndex, nil
}

func (m *memberService) Leave(ctx context.Context, req *connect.Request[v1.LeaveRequest]) (*connect.Response[v1.LeaveResponse], error) {
	sess, err := m.s.sessions.parse(req.Msg.GetSession())
	if err != nil {
		return nil, err
	}
	var rev int64
	err = m.s.memberStore(ctx, sess.keyspace, func(ctx context.Context) (err error) {
		rev, err = m.s.store.PutDrain(ctx, sess.keyspace, sess.member, shard.Drain{RequestedAt: m.s.clock.Now(), By: "member", Leave: true})
		return err
	})
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, sessionEnded(sess)
		}
		return nil, apiError(err)
	}
	m.s.view.waitRev(ctx, rev)
	m.s.log.Info("member leaving", "keyspace", sess.keyspace, "member", sess.member)
	return connect.NewResponse(&v1.LeaveResponse{}), nil
}

// waitOf reads a long-poll wait: absent means 0 (answer at once), at most
// maxWait.
func waitOf(d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, invalid("wait: %v", err)
	}
	w := d.AsDuration()
	if w < 0 {
		return 0, invalid("wait: %v; want a duration >= 0", w)
	}
	return min(w, maxWait), nil
}
