package server

import (
	"context"
	"errors"
	"math"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/internal/store"
)

// maxWait bounds a long poll.
const maxWait = 60 * time.Second

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
	lease, ttl, err := s.store.Grant(ctx, k.LeaseTTL)
	if err != nil {
		return nil, apiError(err)
	}
	rec := store.Member{ID: in.GetId(), Address: in.GetAddress(), Weight: w, Zone: in.GetZone(), Metadata: in.GetMetadata(), JoinedAt: s.clock.Now()}
	old, rev, err := s.store.Join(ctx, k.Name, rec, lease, req.Msg.GetReplace())
	if err != nil {
		_ = s.store.Revoke(context.WithoutCancel(ctx), lease)
		if errors.Is(err, store.ErrExists) {
			return nil, connect.NewError(connect.CodeAlreadyExists, errorf("member %q is already joined to %q with a live session; a restarted process passes replace=true to take over, another process needs another id", rec.ID, k.Name))
		}
		return nil, apiError(err)
	}
	if old != 0 && old != lease {
		// The leader revokes a replaced session that holds buckets, after
		// quarantining them; one that holds nothing can go at once.
		holds := false
		s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
			if ks := snap.Keyspaces[k.Name]; ks != nil {
				g := ks.Grants[rec.ID]
				holds = g.Exists() && g.Value.Session == old && len(g.Value.Buckets) > 0
			}
		})
		if !holds {
			_ = s.store.Revoke(ctx, old)
		}
		s.log.Info("member re-joined, replacing its old session", "keyspace", k.Name, "member", rec.ID, "old_session", old, "session", lease)
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

func (m *memberService) KeepAlive(ctx context.Context, req *connect.Request[v1.KeepAliveRequest]) (*connect.Response[v1.KeepAliveResponse], error) {
	sess, err := m.s.sessions.parse(req.Msg.GetSession())
	if err != nil {
		return nil, err
	}
	ttl, err := m.s.store.KeepAliveOnce(ctx, sess.lease)
	if err != nil {
		if errors.Is(err, store.ErrLeaseNotFound) {
			return nil, sessionEnded(sess)
		}
		return nil, apiError(err)
	}
	return connect.NewResponse(&v1.KeepAliveResponse{Ttl: durationpb.New(ttl)}), nil
}

func sessionEnded(sess session) error {
	return notFound("session of member %q in %q has ended (expired, revoked, or the member left); join again", sess.member, sess.keyspace)
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
	info, err := s.store.TimeToLive(ctx, sess.lease)
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

// grantsState is what a member should know: what it holds and what it
// must release, at a version that changes whenever either may.
func (s *Server) grantsState(sess session) (resp *v1.GetGrantsResponse, alive bool) {
	resp = &v1.GetGrantsResponse{}
	s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		ks := snap.Keyspaces[sess.keyspace]
		if ks == nil {
			return
		}
		mem, joined := ks.Members[sess.member]
		g, held := ks.Grants[sess.member]
		alive = joined && mem.Value.Session == sess.lease || held && g.Value.Session == sess.lease
		resp.Epoch = ks.Map.Value.Epoch
		resp.Revision = uint64(max(ks.Map.ModRevision, g.ModRevision))
		if !held || g.Value.Session != sess.lease {
			return
		}
		for _, bt := range g.Value.Buckets {
			resp.Grants = append(resp.Grants, &v1.BucketGrant{Bucket: uint32(bt.Bucket), Token: bt.Token})
			if ks.Map.Value.Owner(bt.Bucket) != sess.member {
				resp.Release = append(resp.Release, uint32(bt.Bucket))
			}
		}
	})
	return resp, alive
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
	timer := m.s.clock.NewTimer(wait)
	defer timer.Stop()
	for {
		changed := m.s.view.read(func(*store.Snapshot, map[string]*mapView) {})
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
	sess, err := m.s.sessions.parse(req.Msg.GetSession())
	if err != nil {
		return err
	}
	var sent uint64
	first := true
	for {
		changed := m.s.view.read(func(*store.Snapshot, map[string]*mapView) {})
		resp, err := m.s.liveGrants(ctx, sess)
		if err != nil {
			return err
		}
		if first || resp.Revision != sent {
			if err := stream.Send(resp); err != nil {
				return err
			}
			sent, first = resp.Revision, false
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil
		}
	}
}

func (m *memberService) Release(ctx context.Context, req *connect.Request[v1.ReleaseRequest]) (*connect.Response[v1.ReleaseResponse], error) {
	sess, err := m.s.sessions.parse(req.Msg.GetSession())
	if err != nil {
		return nil, err
	}
	buckets := make([]store.BucketToken, len(req.Msg.GetBuckets()))
	for i, bg := range req.Msg.GetBuckets() {
		buckets[i] = store.BucketToken{Bucket: int(bg.GetBucket()), Token: bg.GetToken()}
	}
	// The view's copy saves a read when it is current; the store checks it.
	var guess *store.ReleaseState
	m.s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		if ks := snap.Keyspaces[sess.keyspace]; ks != nil {
			g, r := ks.Grants[sess.member], ks.Releases[sess.member]
			guess = &store.ReleaseState{Grants: g.Value, GrantsRev: g.ModRevision, Releases: r.Value, ReleasesRev: r.ModRevision}
		}
	})
	// No read-your-writes wait here: a member never reads its releases
	// back, and the handoff should not wait for this replica's watch.
	_, err = m.s.store.Release(ctx, sess.keyspace, sess.member, sess.lease, buckets, guess)
	var notHeld *store.NotHeldError
	switch {
	case err == nil:
		return connect.NewResponse(&v1.ReleaseResponse{}), nil
	case errors.As(err, &notHeld):
		for i, bt := range buckets {
			if bt.Bucket == notHeld.Bucket {
				return nil, invalid("buckets[%d]: %v", i, notHeld)
			}
		}
		return nil, invalid("%v", notHeld)
	case errors.Is(err, store.ErrFenced), errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrLeaseNotFound):
		return nil, sessionEnded(sess)
	}
	return nil, apiError(err)
}

func (m *memberService) Leave(ctx context.Context, req *connect.Request[v1.LeaveRequest]) (*connect.Response[v1.LeaveResponse], error) {
	sess, err := m.s.sessions.parse(req.Msg.GetSession())
	if err != nil {
		return nil, err
	}
	rev, err := m.s.store.PutDrain(ctx, sess.keyspace, sess.member, store.DrainRequest{RequestedAt: m.s.clock.Now(), By: "member", Leave: true})
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
