package clienttest

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
)

// replicaName is the replica the fake's Status names, as leader too.
const replicaName = "clienttest"

func notFound(format string, args ...any) error {
	return connect.NewError(connect.CodeNotFound, fmt.Errorf(format, args...))
}

func errCancelled() error { return connect.NewError(connect.CodeCanceled, errors.New("cancelled")) }

// --- AdminService ---

type adminService struct{ s *Server }

func (a adminService) CreateKeyspace(_ context.Context, r *connect.Request[keyshardv1.CreateKeyspaceRequest]) (*connect.Response[keyshardv1.CreateKeyspaceResponse], error) {
	s := a.s
	k := proto.Clone(r.Msg.GetKeyspace()).(*keyshardv1.Keyspace)
	if k.GetName() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("keyspace name is empty"))
	}
	withKeyspaceDefaults(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.keyspaces[k.Name]; ok {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("keyspace %q already exists", k.Name))
	}
	s.keyspaces[k.Name] = &keyspace{cfg: k}
	s.notifyLocked()
	return connect.NewResponse(&keyshardv1.CreateKeyspaceResponse{Keyspace: k}), nil
}

func (a adminService) GetKeyspace(_ context.Context, r *connect.Request[keyshardv1.GetKeyspaceRequest]) (*connect.Response[keyshardv1.GetKeyspaceResponse], error) {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	k, ok := a.s.keyspaces[r.Msg.GetName()]
	if !ok {
		return nil, notFound("keyspace %q does not exist", r.Msg.GetName())
	}
	return connect.NewResponse(&keyshardv1.GetKeyspaceResponse{Keyspace: k.cfg}), nil
}

func (a adminService) ListKeyspaces(context.Context, *connect.Request[keyshardv1.ListKeyspacesRequest]) (*connect.Response[keyshardv1.ListKeyspacesResponse], error) {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	resp := &keyshardv1.ListKeyspacesResponse{}
	for _, k := range a.s.keyspaces {
		resp.Keyspaces = append(resp.Keyspaces, k.cfg)
	}
	sort.Slice(resp.Keyspaces, func(i, j int) bool { return resp.Keyspaces[i].Name < resp.Keyspaces[j].Name })
	return connect.NewResponse(resp), nil
}

func (a adminService) UpdateKeyspace(_ context.Context, r *connect.Request[keyshardv1.UpdateKeyspaceRequest]) (*connect.Response[keyshardv1.UpdateKeyspaceResponse], error) {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	in := r.Msg.GetKeyspace()
	k, ok := a.s.keyspaces[in.GetName()]
	if !ok {
		return nil, notFound("keyspace %q does not exist", in.GetName())
	}
	if in.Buckets != 0 && in.Buckets != k.cfg.Buckets {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("keyspace %q: buckets cannot change from %d to %d", k.cfg.Name, k.cfg.Buckets, in.Buckets))
	}
	cfg := proto.Clone(k.cfg).(*keyshardv1.Keyspace)
	if in.LeaseTtl != nil {
		cfg.LeaseTtl = in.LeaseTtl
	}
	if in.DrainTimeout != nil {
		cfg.DrainTimeout = in.DrainTimeout
	}
	k.cfg = cfg
	a.s.notifyLocked()
	return connect.NewResponse(&keyshardv1.UpdateKeyspaceResponse{Keyspace: cfg}), nil
}

// ListMembers lists the live sessions' members, with what the map
// assigns them and what they hold, as keyshard serve does.
func (a adminService) ListMembers(_ context.Context, r *connect.Request[keyshardv1.ListMembersRequest]) (*connect.Response[keyshardv1.ListMembersResponse], error) {
	s := a.s
	s.mu.Lock()
	defer s.mu.Unlock()
	name := r.Msg.GetKeyspace()
	k, ok := s.keyspaces[name]
	if !ok {
		return nil, notFound("keyspace %q does not exist", name)
	}
	resp := &keyshardv1.ListMembersResponse{Epoch: k.m.GetEpoch()}
	target := targets(k.m)
	for _, x := range s.sortedSessionsLocked(name) {
		st := &keyshardv1.MemberStatus{Member: x.member, TargetBuckets: target[x.member.GetId()], Draining: x.draining,
			GrantedBuckets: uint32(len(x.grants))}
		for b := range x.grants {
			if x.release[b] {
				st.ReleasingBuckets++
			}
		}
		resp.Members = append(resp.Members, st)
	}
	return connect.NewResponse(resp), nil
}

// targets counts the buckets m assigns to each member.
func targets(m *keyshardv1.Map) map[string]uint32 {
	out := map[string]uint32{}
	for _, o := range m.GetOwners() {
		if o != 0 {
			out[m.GetMembers()[o-1].GetId()]++
		}
	}
	return out
}

// DrainMember marks the member draining and asks for every bucket it
// holds. The fake plans no map: publish the one without it with SetMap or
// Assign.
func (a adminService) DrainMember(_ context.Context, r *connect.Request[keyshardv1.DrainMemberRequest]) (*connect.Response[keyshardv1.DrainMemberResponse], error) {
	s := a.s
	s.mu.Lock()
	defer s.mu.Unlock()
	ks, id := r.Msg.GetKeyspace(), r.Msg.GetMember()
	if _, ok := s.keyspaces[ks]; !ok {
		return nil, notFound("keyspace %q does not exist", ks)
	}
	x := s.liveSessionLocked(ks, id)
	if x == nil {
		return nil, notFound("member %q is not joined to keyspace %q", id, ks)
	}
	x.draining = true
	s.askAllLocked(x)
	return connect.NewResponse(&keyshardv1.DrainMemberResponse{}), nil
}

// askAllLocked lists every bucket x holds for release.
func (s *Server) askAllLocked(x *sessionState) {
	for b := range x.grants {
		x.release[b] = true
	}
	x.rev++
	s.notifyLocked()
}

func (a adminService) Status(context.Context, *connect.Request[keyshardv1.StatusRequest]) (*connect.Response[keyshardv1.StatusResponse], error) {
	s := a.s
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &keyshardv1.StatusResponse{Replica: replicaName, Leader: replicaName}
	for name, k := range s.keyspaces {
		live := s.sortedSessionsLocked(name)
		st := &keyshardv1.KeyspaceStatus{Keyspace: k.cfg, Epoch: k.m.GetEpoch(), Members: uint32(len(live))}
		holder := map[uint32]string{}
		for _, x := range live {
			for b := range x.grants {
				holder[b] = x.member.GetId()
			}
		}
		if k.m == nil {
			st.UnassignedBuckets = k.cfg.Buckets
		}
		owns := map[string]bool{}
		for b, o := range k.m.GetOwners() {
			switch {
			case o == 0:
				st.UnassignedBuckets++
			case holder[uint32(b)] != k.m.GetMembers()[o-1].GetId():
				st.HandoffsInFlight++
			}
			if o != 0 {
				owns[k.m.GetMembers()[o-1].GetId()] = true
			}
		}
		// Active members (a keep-alive answered, not draining or leaving)
		// the map gives nothing: the real server's map yet to be written.
		for _, x := range live {
			if x.active && !x.draining && !x.leaving && !owns[x.member.GetId()] {
				st.MembersWithoutBuckets++
			}
		}
		resp.Keyspaces = append(resp.Keyspaces, st)
	}
	sort.Slice(resp.Keyspaces, func(i, j int) bool { return resp.Keyspaces[i].Keyspace.Name < resp.Keyspaces[j].Keyspace.Name })
	return connect.NewResponse(resp), nil
}

func (a adminService) PutHotKeyPool(_ context.Context, r *connect.Request[keyshardv1.PutHotKeyPoolRequest]) (*connect.Response[keyshardv1.PutHotKeyPoolResponse], error) {
	p := proto.Clone(r.Msg.GetPool()).(*keyshardv1.HotKeyPool)
	if p.GetName() == "" || !(p.GetThreshold() > 0) {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("pool.name is empty or pool.threshold is not > 0"))
	}
	withPoolDefaults(p)
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	a.s.pools[p.Name] = p
	a.s.notifyLocked()
	return connect.NewResponse(&keyshardv1.PutHotKeyPoolResponse{Pool: p}), nil
}

func (a adminService) ListHotKeyPools(context.Context, *connect.Request[keyshardv1.ListHotKeyPoolsRequest]) (*connect.Response[keyshardv1.ListHotKeyPoolsResponse], error) {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	resp := &keyshardv1.ListHotKeyPoolsResponse{}
	for _, p := range a.s.pools {
		resp.Pools = append(resp.Pools, p)
	}
	sort.Slice(resp.Pools, func(i, j int) bool { return resp.Pools[i].Name < resp.Pools[j].Name })
	return connect.NewResponse(resp), nil
}

// --- MemberService ---

type memberService struct{ s *Server }

// Join creates a session. Like keyshard serve, it refuses a member that
// has a live session unless the Join asks to replace it, and then ends
// that session.
func (m memberService) Join(ctx context.Context, r *connect.Request[keyshardv1.JoinRequest]) (*connect.Response[keyshardv1.JoinResponse], error) {
	s := m.s
	a := arrivalOf(ctx)
	if a.joinHang {
		s.hold(ctx)
		return nil, connect.NewError(connect.CodeCanceled, errors.New("gave up while the fake held the Join"))
	}
	if err := s.delay(ctx, keyshardv1connect.MemberServiceJoinProcedure, a.joinDelay); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	req := r.Msg
	k, ok := s.keyspaces[req.GetKeyspace()]
	if !ok {
		return nil, notFound("keyspace %q does not exist", req.GetKeyspace())
	}
	id := req.GetMember().GetId()
	if id == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("member.id is empty"))
	}
	if old := s.liveSessionLocked(k.cfg.Name, id); old != nil {
		if !req.GetReplace() {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("member %q has a live session; join with replace to take it over", id))
		}
		s.endSessionLocked(old)
	}
	s.nextID++
	x := &sessionState{id: fmt.Sprintf("s%d", s.nextID), keyspace: k.cfg.Name, member: proto.Clone(req.GetMember()).(*keyshardv1.Member),
		grants: map[uint32]uint64{}, from: map[uint32]uint64{}, release: map[uint32]bool{}, rev: 1, renewed: s.clock.Now()}
	s.sessions[x.id] = x
	s.notifyLocked()
	return connect.NewResponse(&keyshardv1.JoinResponse{Session: x.id, LeaseTtl: k.cfg.LeaseTtl, Keyspace: k.cfg}), nil
}

// liveLocked returns session id if it is live, or the not_found error
// keyshard serve answers for a session that ended.
func (s *Server) liveLocked(id string) (*sessionState, error) {
	x := s.sessions[id]
	if x == nil || x.gone {
		return nil, notFound("session %q does not exist; it ended or was replaced", id)
	}
	return x, nil
}

func (m memberService) KeepAlive(ctx context.Context, r *connect.Request[keyshardv1.KeepAliveRequest]) (*connect.Response[keyshardv1.KeepAliveResponse], error) {
	ttl, err := m.s.keepAlive(ctx, r.Msg.GetSession(), arrivalOf(ctx))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&keyshardv1.KeepAliveResponse{Ttl: ttl}), nil
}

// keepAlive renews session id, a KeepAlive call's or a Session stream's
// keep-alive, as the faults a that it took when it arrived say, and
// returns the lease TTL.
func (s *Server) keepAlive(ctx context.Context, id string, a arrival) (*durationpb.Duration, error) {
	s.mu.Lock()
	x, err := s.liveLocked(id)
	if err == nil && a.keepAlive == KeepAliveNotFound {
		s.endSessionLocked(x)
		_, err = s.liveLocked(id)
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	switch a.keepAlive {
	case KeepAliveFail:
		return nil, errUnreachable()
	case KeepAliveHang:
		s.hold(ctx)
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("gave up while the fake held the keep-alive"))
	}
	if err := s.delay(ctx, keyshardv1connect.MemberServiceKeepAliveProcedure, a.keepAliveDelay); err != nil {
		return nil, err
	}
	if !a.keepAliveGate.wait(ctx, s.quit) {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("gave up while the fake held the keep-alive"))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if x, err = s.liveLocked(id); err != nil {
		return nil, err
	}
	x.renewed = s.clock.Now()
	if !x.active {
		x.active = true
		s.settleLocked(s.keyspaces[x.keyspace])
	}
	return s.keyspaces[x.keyspace].cfg.GetLeaseTtl(), nil
}

func (s *Server) grantsMsgLocked(x *sessionState) *keyshardv1.GetGrantsResponse {
	resp := &keyshardv1.GetGrantsResponse{Revision: x.rev, Epoch: s.keyspaces[x.keyspace].m.GetEpoch()}
	for b, tok := range x.grants {
		resp.Grants = append(resp.Grants, &keyshardv1.BucketGrant{Bucket: b, Token: tok, From: x.from[b]})
		if x.release[b] {
			resp.Release = append(resp.Release, b)
		}
	}
	sort.Slice(resp.Grants, func(i, j int) bool { return resp.Grants[i].Bucket < resp.Grants[j].Bucket })
	sort.Slice(resp.Release, func(i, j int) bool { return resp.Release[i] < resp.Release[j] })
	return resp
}

func (m memberService) GetGrants(ctx context.Context, r *connect.Request[keyshardv1.GetGrantsRequest]) (*connect.Response[keyshardv1.GetGrantsResponse], error) {
	s := m.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return longPoll(ctx, s, r.Msg.GetWait().AsDuration(), "", func(timedOut bool) (*keyshardv1.GetGrantsResponse, bool, error) {
		x, err := s.liveLocked(r.Msg.GetSession())
		if err != nil {
			return nil, false, err
		}
		return s.grantsMsgLocked(x), x.rev > r.Msg.GetSinceRevision() || timedOut, nil
	})
}

func (m memberService) WatchGrants(ctx context.Context, r *connect.Request[keyshardv1.WatchGrantsRequest], st *connect.ServerStream[keyshardv1.GetGrantsResponse]) error {
	s := m.s
	s.mu.Lock()
	defer s.mu.Unlock()
	var sent uint64
	return follow(ctx, s, "", st, func() (*keyshardv1.GetGrantsResponse, error) {
		x, err := s.liveLocked(r.Msg.GetSession())
		if err != nil || x.rev <= sent {
			return nil, err
		}
		sent = x.rev
		return s.grantsMsgLocked(x), nil
	})
}

func (m memberService) Release(ctx context.Context, r *connect.Request[keyshardv1.ReleaseRequest]) (*connect.Response[keyshardv1.ReleaseResponse], error) {
	s := m.s
	if !arrivalOf(ctx).releaseGate.wait(ctx, s.quit) {
		return nil, errCancelled()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	x, err := s.liveLocked(r.Msg.GetSession())
	if err != nil {
		return nil, err
	}
	// Like keyshard serve: one bucket not held at its token refuses the
	// whole call.
	listed := map[uint32]uint64{}
	for i, g := range r.Msg.GetBuckets() {
		if tok, ok := x.grants[g.GetBucket()]; !ok || tok != g.GetToken() {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("buckets[%d]: bucket %d is not held at token %d", i, g.GetBucket(), g.GetToken()))
		}
		listed[g.GetBucket()] = g.GetToken()
	}
	final, err := s.releasePositionsLocked(x, listed, r.Msg.GetPositions())
	if err != nil {
		return nil, err
	}
	for _, g := range r.Msg.GetBuckets() {
		// The fake hands a released bucket over at once: its position
		// folds into the keyspace's now.
		s.foldLocked(x, g.GetBucket(), final[g.GetBucket()])
		delete(x.grants, g.GetBucket())
		delete(x.from, g.GetBucket())
		delete(x.release, g.GetBucket())
	}
	x.rev++
	rev := ReleaseRevisionBase + x.rev
	s.notifyLocked()
	if x.leaving && len(x.grants) == 0 {
		s.endSessionLocked(x)
	} else {
		s.settleLocked(s.keyspaces[x.keyspace])
	}
	return connect.NewResponse(&keyshardv1.ReleaseResponse{Revision: rev}), nil
}

// Leave drains the member: every bucket it holds is asked back, and its
// session ends once it holds nothing (see StallLeaves).
func (m memberService) Leave(ctx context.Context, r *connect.Request[keyshardv1.LeaveRequest]) (*connect.Response[keyshardv1.LeaveResponse], error) {
	s := m.s
	s.mu.Lock()
	defer s.mu.Unlock()
	x, err := s.liveLocked(r.Msg.GetSession())
	if err != nil {
		return nil, err
	}
	if arrivalOf(ctx).stallLeaves {
		return connect.NewResponse(&keyshardv1.LeaveResponse{}), nil
	}
	x.leaving, x.draining = true, true
	if len(x.grants) == 0 {
		s.endSessionLocked(x)
	} else {
		s.askAllLocked(x)
	}
	return connect.NewResponse(&keyshardv1.LeaveResponse{}), nil
}

// --- MapService ---

type mapService struct{ s *Server }

func (m mapService) GetMap(ctx context.Context, r *connect.Request[keyshardv1.GetMapRequest]) (*connect.Response[keyshardv1.GetMapResponse], error) {
	s := m.s
	s.mu.Lock()
	defer s.mu.Unlock()
	name := r.Msg.GetKeyspace()
	return longPoll(ctx, s, r.Msg.GetWait().AsDuration(), "", func(timedOut bool) (*keyshardv1.GetMapResponse, bool, error) {
		k, ok := s.keyspaces[name]
		if !ok {
			return nil, false, notFound("keyspace %q does not exist", name)
		}
		changed := k.m != nil && k.m.Epoch > r.Msg.GetSinceEpoch() // nil before the first epoch
		return &keyshardv1.GetMapResponse{Map: k.m, Changed: changed}, changed || timedOut, nil
	})
}

func (m mapService) WatchMap(ctx context.Context, r *connect.Request[keyshardv1.WatchMapRequest], st *connect.ServerStream[keyshardv1.Map]) error {
	s := m.s
	s.mu.Lock()
	defer s.mu.Unlock()
	name := r.Msg.GetKeyspace()
	since := r.Msg.GetSinceEpoch()
	return follow(ctx, s, "", st, func() (*keyshardv1.Map, error) {
		k, ok := s.keyspaces[name]
		if !ok {
			return nil, notFound("keyspace %q does not exist", name)
		}
		if k.m == nil || k.m.Epoch <= since {
			return nil, nil
		}
		since = k.m.Epoch
		return k.m, nil
	})
}

// Lookup is not served: the fake does not hash keys (a Router does).
func (m mapService) Lookup(context.Context, *connect.Request[keyshardv1.LookupRequest]) (*connect.Response[keyshardv1.LookupResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("clienttest does not serve Lookup; follow the map with a Router"))
}

// --- HotKeyService ---

type hotKeyService struct{ s *Server }

const hotKeys = "/keyshard.v1.HotKeyService/"

func (h hotKeyService) poolLocked(name string) (*keyshardv1.HotKeyPool, error) {
	p, ok := h.s.pools[name]
	if !ok {
		return nil, notFound("hot-key pool %q does not exist", name)
	}
	return p, nil
}

func (h hotKeyService) ReportHotKeys(_ context.Context, r *connect.Request[keyshardv1.ReportHotKeysRequest]) (*connect.Response[keyshardv1.ReportHotKeysResponse], error) {
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := h.poolLocked(r.Msg.GetPool())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&keyshardv1.ReportHotKeysResponse{Pool: p, Version: s.sets[p.Name].GetVersion()}), nil
}

func (h hotKeyService) GetOverflowSet(ctx context.Context, r *connect.Request[keyshardv1.GetOverflowSetRequest]) (*connect.Response[keyshardv1.GetOverflowSetResponse], error) {
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return longPoll(ctx, s, r.Msg.GetWait().AsDuration(), hotKeys, func(timedOut bool) (*keyshardv1.GetOverflowSetResponse, bool, error) {
		if _, err := h.poolLocked(r.Msg.GetPool()); err != nil {
			return nil, false, err
		}
		cur := s.sets[r.Msg.GetPool()]
		changed := cur != nil && cur.Version > r.Msg.GetSinceVersion()
		return &keyshardv1.GetOverflowSetResponse{Set: cur, Changed: changed}, changed || timedOut, nil
	})
}

func (h hotKeyService) WatchOverflowSet(ctx context.Context, r *connect.Request[keyshardv1.WatchOverflowSetRequest], st *connect.ServerStream[keyshardv1.OverflowSet]) error {
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	since := r.Msg.GetSinceVersion()
	return follow(ctx, s, hotKeys, st, func() (*keyshardv1.OverflowSet, error) {
		if _, err := h.poolLocked(r.Msg.GetPool()); err != nil {
			return nil, err
		}
		cur := s.sets[r.Msg.GetPool()]
		if cur == nil || cur.Version <= since {
			return nil, nil
		}
		since = cur.Version
		return cur, nil
	})
}

// downLocked reports whether calls of service (a procedure prefix, or ""
// for the member and map services) are cut off now.
func (s *Server) downLocked(service string) bool {
	return s.faults.unavailable || service == hotKeys && s.faults.hotKeysDown || service == tenantPools && s.faults.poolsDown
}

// longPoll answers a long poll that waits up to wait of fake time:
// answer(false) says what to answer and whether to answer now; once the
// wait ran out, answer(true) is sent. It is called with s.mu held, and
// ends with the fake's unavailable error when service is cut off
// (SetUnavailable, SetHotKeysUnavailable).
func longPoll[T any](ctx context.Context, s *Server, wait time.Duration, service string, answer func(timedOut bool) (*T, bool, error)) (*connect.Response[T], error) {
	var timer <-chan time.Time
	timedOut := wait <= 0
	for {
		if s.downLocked(service) {
			return nil, errUnreachable()
		}
		msg, now, err := answer(timedOut)
		if err != nil {
			return nil, err
		}
		if now {
			return connect.NewResponse(msg), nil
		}
		if timer == nil {
			t := s.clock.NewTimer(wait)
			defer t.Stop()
			timer = t.C()
		}
		switch s.waitChangeLocked(ctx, timer) {
		case waitCancelled:
			return nil, errCancelled()
		case waitTimedOut:
			timedOut = true
		}
	}
}

// follow serves a stream: next returns the next message to send (nil:
// nothing new) or the error that ends the stream. It is called with s.mu
// held. The stream ends when ctx ends or the fake closes, and with the
// fake's unavailable error when service is cut off or EndStreams ends it.
func follow[T any](ctx context.Context, s *Server, service string, st *connect.ServerStream[T], next func() (*T, error)) error {
	ended := s.faults.streams
	for {
		if s.downLocked(service) {
			return errUnreachable()
		}
		if ended.Err() != nil {
			return errStreamsEnded()
		}
		msg, err := next()
		if err != nil {
			return err
		}
		if msg != nil {
			s.mu.Unlock()
			err := st.Send(msg)
			s.mu.Lock()
			if err != nil {
				return err
			}
			continue
		}
		if s.waitChangeLocked(ctx, nil) == waitCancelled {
			return nil
		}
	}
}
