package clienttest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
)

// Tenant pools. The fake plans nothing: the test publishes each version
// of a pool's snapshot whole (SetPoolSnapshot), and the fake serves it as
// keyshard serve does: GetPoolSnapshot long polls, and WatchPoolSnapshot
// streams that send the full snapshot first, then, per version, only the
// tenants that changed since the stream's previous message, with
// removed_tenants. It keeps members' sessions (JoinPool, PoolKeepAlive,
// LeavePool; EndPoolSession ends one as an expired lease does), records
// MarkReady per session, and counts load reports with the server's seq
// rule: a report whose seq is not above the reporter's last counted one
// is answered REPLAYED and not counted again.
//
// A LeavePool without end_session marks the session leaving
// (PoolLeaving) and keeps it; the fake plans nothing, so the test
// publishes the drain itself: snapshots where the member has weight 0,
// then leaves the tenants' subsets and targets. LeavePool answers done
// once the current snapshot lists the member in no tenant (members,
// removed or targets) and with weight 0 or not at all, as the server
// does; read_until is not set.

const tenantPools = "/keyshard.v1.TenantPoolService/"

// defaultPoolLeaseTTL is the lease TTL of a pool put without one.
const defaultPoolLeaseTTL = 10 * time.Second

type tenantPool struct {
	cfg     *keyshardv1.TenantPool
	snap    *keyshardv1.PoolSnapshot // full; version 0 before the first SetPoolSnapshot
	lastSeq map[string]uint64        // reporter → last seq counted
	load    map[string]int64         // tenant → requests counted
}

type poolSession struct {
	id      string
	pool    string
	member  *keyshardv1.Member
	ready   []string // tenants marked ready, in order
	leaving bool
	gone    bool
}

// PutTenantPool creates tenant pool name (or replaces its settings) with
// policy (nil: capacity 1, min size 1) and lease TTL ttl (0: 10s), as
// PutTenantPool does. Its snapshot stays at version 0 until
// SetPoolSnapshot.
func (s *Server) PutTenantPool(name string, policy *keyshardv1.TenantPoolPolicy, ttl time.Duration) {
	if policy == nil {
		policy = &keyshardv1.TenantPoolPolicy{CapacityPerMember: 1, MinSize: 1}
	}
	if ttl <= 0 {
		ttl = defaultPoolLeaseTTL
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.putPoolLocked(&keyshardv1.TenantPool{Name: name, Policy: proto.Clone(policy).(*keyshardv1.TenantPoolPolicy), LeaseTtl: durationpb.New(ttl)})
	s.notifyLocked()
}

func (s *Server) putPoolLocked(cfg *keyshardv1.TenantPool) *tenantPool {
	p := s.tpools[cfg.GetName()]
	if p == nil {
		p = &tenantPool{
			snap:    &keyshardv1.PoolSnapshot{Pool: cfg.GetName(), Full: true, Policy: cfg.GetPolicy()},
			lastSeq: map[string]uint64{},
			load:    map[string]int64{},
		}
		s.tpools[cfg.GetName()] = p
	}
	p.cfg = cfg
	return p
}

// SetPoolSnapshot publishes snap (every tenant of it: the full state) as
// its pool's current snapshot, creating the pool if it does not exist.
// Its version must be above the current one; a nil Policy takes the
// pool's. Streams then send the tenants that changed.
func (s *Server) SetPoolSnapshot(snap *keyshardv1.PoolSnapshot) {
	if s.tb != nil {
		s.tb.Helper()
	}
	err := func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		name := snap.GetPool()
		p := s.tpools[name]
		if p == nil {
			p = s.putPoolLocked(&keyshardv1.TenantPool{Name: name, Policy: snap.GetPolicy(), LeaseTtl: durationpb.New(defaultPoolLeaseTTL)})
		}
		if snap.GetVersion() <= p.snap.GetVersion() {
			return fmt.Errorf("SetPoolSnapshot: pool %q: version %d is not above the current %d", name, snap.GetVersion(), p.snap.GetVersion())
		}
		c := proto.Clone(snap).(*keyshardv1.PoolSnapshot)
		c.Full, c.RemovedTenants = true, nil
		if c.Policy == nil {
			c.Policy = p.cfg.GetPolicy()
		}
		p.snap = c
		s.notifyLocked()
		return nil
	}()
	if err != nil {
		s.fatalf("%v", err)
	}
}

// PoolSnapshot returns a copy of pool's current snapshot, or nil if the
// pool does not exist.
func (s *Server) PoolSnapshot(pool string) *keyshardv1.PoolSnapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.tpools[pool]; p != nil {
		return proto.Clone(p.snap).(*keyshardv1.PoolSnapshot)
	}
	return nil
}

// PoolLoad returns the requests counted per tenant of pool, over every
// report counted (replays are not counted again).
func (s *Server) PoolLoad(pool string) map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int64{}
	if p := s.tpools[pool]; p != nil {
		for t, n := range p.load {
			out[t] = n
		}
	}
	return out
}

// PoolSessions returns the live sessions of pool's members, by member id.
func (s *Server) PoolSessions(pool string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	for _, x := range s.psessions {
		if x.pool == pool && !x.gone {
			out[x.member.GetId()] = x.id
		}
	}
	return out
}

// ReadyTenants returns the tenants session marked ready (MarkReady) that
// the snapshot placed it on, in the order marked.
func (s *Server) ReadyTenants(session string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if x := s.psessions[session]; x != nil {
		return slices.Clone(x.ready)
	}
	return nil
}

// PoolLeaving reports whether session was marked leaving by a LeavePool
// without end_session (it stays so after the session ends).
func (s *Server) PoolLeaving(session string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	x := s.psessions[session]
	return x != nil && x.leaving
}

// EndPoolSession ends a pool member's session, as the server does when
// its lease expires: its keep-alives are answered not_found from now on.
func (s *Server) EndPoolSession(session string) {
	if s.tb != nil {
		s.tb.Helper()
	}
	s.mu.Lock()
	x := s.psessions[session]
	if x != nil {
		x.gone = true
		s.notifyLocked()
	}
	s.mu.Unlock()
	if x == nil {
		s.fatalf("EndPoolSession: session %q does not exist", session)
	}
}

// LoseReportAnswers makes the next n load reports be served (counted, or
// found replayed) and then answered with code unavailable, as when the
// answer is lost on its way back: the reporter must retry the same seq.
func (s *Server) LoseReportAnswers(n int) {
	s.setFault(func(f *faults) { f.loseReports = n })
}

// SetPoolsUnavailable is SetUnavailable for the TenantPoolService alone:
// its calls fail with code unavailable and its open streams end, while
// the other services serve.
func (s *Server) SetPoolsUnavailable(down bool) {
	s.setFault(func(f *faults) { f.poolsDown = down })
}

// HoldPools holds every call of the TenantPoolService that arrives from
// now on at a new Gate, before the fake serves it, until the test lets it
// through (as HoldHotKeys does for hot keys). A stream, once through, is
// not held again.
func (s *Server) HoldPools() *Gate {
	g := newGate()
	s.setFault(func(f *faults) { f.poolsGate = g })
	return g
}

// --- TenantPoolService ---

type tenantPoolService struct{ s *Server }

func (h tenantPoolService) poolLocked(name string) (*tenantPool, error) {
	p := h.s.tpools[name]
	if p == nil {
		return nil, notFound("tenant pool %q does not exist", name)
	}
	return p, nil
}

func (h tenantPoolService) PutTenantPool(_ context.Context, r *connect.Request[keyshardv1.PutTenantPoolRequest]) (*connect.Response[keyshardv1.PutTenantPoolResponse], error) {
	cfg := r.Msg.GetPool()
	switch {
	case cfg.GetName() == "":
		return nil, invalidArg("pool.name: is empty")
	case cfg.GetPolicy().GetCapacityPerMember() <= 0:
		return nil, invalidArg("pool.policy.capacity_per_member: %v; want > 0", cfg.GetPolicy().GetCapacityPerMember())
	}
	cfg = proto.Clone(cfg).(*keyshardv1.TenantPool)
	if cfg.GetLeaseTtl().AsDuration() <= 0 {
		cfg.LeaseTtl = durationpb.New(defaultPoolLeaseTTL)
	}
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.putPoolLocked(cfg)
	s.notifyLocked()
	return connect.NewResponse(&keyshardv1.PutTenantPoolResponse{Pool: cfg}), nil
}

func (h tenantPoolService) DeleteTenantPool(_ context.Context, r *connect.Request[keyshardv1.DeleteTenantPoolRequest]) (*connect.Response[keyshardv1.DeleteTenantPoolResponse], error) {
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := h.poolLocked(r.Msg.GetName()); err != nil {
		return nil, err
	}
	delete(s.tpools, r.Msg.GetName())
	s.notifyLocked()
	return connect.NewResponse(&keyshardv1.DeleteTenantPoolResponse{}), nil
}

func (h tenantPoolService) ListTenantPools(context.Context, *connect.Request[keyshardv1.ListTenantPoolsRequest]) (*connect.Response[keyshardv1.ListTenantPoolsResponse], error) {
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &keyshardv1.ListTenantPoolsResponse{}
	for name, p := range s.tpools {
		n := 0
		for _, x := range s.psessions {
			if x.pool == name && !x.gone {
				n++
			}
		}
		resp.Pools = append(resp.Pools, &keyshardv1.TenantPoolStatus{Pool: p.cfg, Members: uint32(n), Tenants: uint32(len(p.snap.GetTenants())), Version: p.snap.GetVersion()})
	}
	sort.Slice(resp.Pools, func(i, j int) bool { return resp.Pools[i].Pool.GetName() < resp.Pools[j].Pool.GetName() })
	return connect.NewResponse(resp), nil
}

func (h tenantPoolService) JoinPool(_ context.Context, r *connect.Request[keyshardv1.JoinPoolRequest]) (*connect.Response[keyshardv1.JoinPoolResponse], error) {
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := h.poolLocked(r.Msg.GetPool())
	if err != nil {
		return nil, err
	}
	m := r.Msg.GetMember()
	if m.GetId() == "" {
		return nil, invalidArg("member.id: is empty")
	}
	for _, x := range s.psessions {
		if x.pool == p.cfg.GetName() && !x.gone && x.member.GetId() == m.GetId() {
			if !r.Msg.GetReplace() {
				return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("member %q of tenant pool %q has a live session; join with replace to take it over", m.GetId(), p.cfg.GetName()))
			}
			x.gone = true
		}
	}
	s.nextPoolSession++
	x := &poolSession{id: fmt.Sprintf("ps%d", s.nextPoolSession), pool: p.cfg.GetName(), member: proto.Clone(m).(*keyshardv1.Member)}
	s.psessions[x.id] = x
	s.notifyLocked()
	return connect.NewResponse(&keyshardv1.JoinPoolResponse{Session: x.id, LeaseTtl: p.cfg.GetLeaseTtl(), Pool: p.cfg}), nil
}

func (h tenantPoolService) liveLocked(session string) (*poolSession, error) {
	x := h.s.psessions[session]
	if x == nil || x.gone {
		return nil, notFound("pool session %q does not exist or has ended", session)
	}
	return x, nil
}

func (h tenantPoolService) PoolKeepAlive(_ context.Context, r *connect.Request[keyshardv1.PoolKeepAliveRequest]) (*connect.Response[keyshardv1.PoolKeepAliveResponse], error) {
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	x, err := h.liveLocked(r.Msg.GetSession())
	if err != nil {
		return nil, err
	}
	ttl := defaultPoolLeaseTTL
	if p := s.tpools[x.pool]; p != nil {
		ttl = p.cfg.GetLeaseTtl().AsDuration()
	}
	s.notifyLocked()
	return connect.NewResponse(&keyshardv1.PoolKeepAliveResponse{Ttl: durationpb.New(ttl)}), nil
}

func (h tenantPoolService) LeavePool(_ context.Context, r *connect.Request[keyshardv1.LeavePoolRequest]) (*connect.Response[keyshardv1.LeavePoolResponse], error) {
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	x, err := h.liveLocked(r.Msg.GetSession())
	if err != nil {
		if r.Msg.GetEndSession() && s.psessions[r.Msg.GetSession()] != nil {
			return connect.NewResponse(&keyshardv1.LeavePoolResponse{Done: true}), nil // ended already
		}
		return nil, err
	}
	resp := &keyshardv1.LeavePoolResponse{}
	id := x.member.GetId()
	var snap *keyshardv1.PoolSnapshot
	if p := s.tpools[x.pool]; p != nil {
		snap = p.snap
	}
	placed := false
	for _, m := range snap.GetMembers() {
		placed = placed || m.GetId() == id && m.GetWeight() > 0
	}
	for _, a := range snap.GetTenants() {
		if listsMember(a, id) {
			resp.Tenants++
		}
	}
	resp.Done = !placed && resp.Tenants == 0
	resp.Version = snap.GetVersion()
	if r.Msg.GetEndSession() {
		x.gone = true
	} else {
		x.leaving = true
	}
	s.notifyLocked()
	return connect.NewResponse(resp), nil
}

// listsMember reports whether a lists member in its subset, its removed
// members or its targets.
func listsMember(a *keyshardv1.TenantAssignment, member string) bool {
	for _, m := range a.GetMembers() {
		if m.GetMember() == member {
			return true
		}
	}
	for _, m := range a.GetRemoved() {
		if m.GetMember() == member {
			return true
		}
	}
	for _, sp := range a.GetTargets() {
		if slices.Contains(sp.GetMembers(), member) {
			return true
		}
	}
	return false
}

func (h tenantPoolService) MarkReady(_ context.Context, r *connect.Request[keyshardv1.MarkReadyRequest]) (*connect.Response[keyshardv1.MarkReadyResponse], error) {
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	x, err := h.liveLocked(r.Msg.GetSession())
	if err != nil {
		return nil, err
	}
	if n := len(r.Msg.GetTenants()); n > maxPoolBatch {
		return nil, invalidArg("tenants: %d; at most %d per call", n, maxPoolBatch)
	}
	placed := map[string]bool{}
	if p := s.tpools[x.pool]; p != nil {
		for _, a := range p.snap.GetTenants() {
			for _, pm := range a.GetMembers() {
				if pm.GetMember() == x.member.GetId() {
					placed[a.GetTenant()] = true
				}
			}
		}
	}
	resp := &keyshardv1.MarkReadyResponse{}
	for _, t := range r.Msg.GetTenants() {
		if placed[t] {
			resp.Marked++
			x.ready = append(x.ready, t)
		} else {
			resp.Ignored++
		}
	}
	s.notifyLocked()
	return connect.NewResponse(resp), nil
}

const maxPoolBatch = 10000

func (h tenantPoolService) ReportLoad(_ context.Context, r *connect.Request[keyshardv1.ReportLoadRequest]) (*connect.Response[keyshardv1.ReportLoadResponse], error) {
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := h.poolLocked(r.Msg.GetPool())
	if err != nil {
		return nil, err
	}
	m := r.Msg
	switch {
	case m.GetReporter() == "":
		return nil, invalidArg("reporter: is empty")
	case m.GetSeq() == 0:
		return nil, invalidArg("seq: is 0; seqs start at 1")
	case len(m.GetCounts()) > maxPoolBatch:
		return nil, invalidArg("counts: %d entries; at most %d per report", len(m.GetCounts()), maxPoolBatch)
	}
	for i, c := range m.GetCounts() {
		switch {
		case c.GetTenant() == "" || len(c.GetTenant()) > 256:
			return nil, invalidArg("counts[%d].tenant: %d bytes; want 1-256", i, len(c.GetTenant()))
		case c.GetCount() < 0:
			return nil, invalidArg("counts[%d].count: %d is negative", i, c.GetCount())
		}
	}
	outcome := keyshardv1.ReportOutcome_REPORT_OUTCOME_REPLAYED
	if m.GetSeq() > p.lastSeq[m.GetReporter()] {
		outcome = keyshardv1.ReportOutcome_REPORT_OUTCOME_COUNTED
		p.lastSeq[m.GetReporter()] = m.GetSeq()
		for _, c := range m.GetCounts() {
			p.load[c.GetTenant()] += c.GetCount()
		}
	}
	s.notifyLocked()
	if s.faults.loseReports > 0 {
		s.faults.loseReports--
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the answer was lost"))
	}
	return connect.NewResponse(&keyshardv1.ReportLoadResponse{Outcome: outcome, Version: p.snap.GetVersion()}), nil
}

func (h tenantPoolService) GetPoolSnapshot(ctx context.Context, r *connect.Request[keyshardv1.GetPoolSnapshotRequest]) (*connect.Response[keyshardv1.GetPoolSnapshotResponse], error) {
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return longPoll(ctx, s, r.Msg.GetWait().AsDuration(), tenantPools, func(timedOut bool) (*keyshardv1.GetPoolSnapshotResponse, bool, error) {
		p, err := h.poolLocked(r.Msg.GetPool())
		if err != nil {
			return nil, false, err
		}
		changed := p.snap.GetVersion() > r.Msg.GetSinceVersion()
		return &keyshardv1.GetPoolSnapshotResponse{Snapshot: p.snap, Changed: changed}, changed || timedOut, nil
	})
}

func (h tenantPoolService) WatchPoolSnapshot(ctx context.Context, r *connect.Request[keyshardv1.WatchPoolSnapshotRequest], st *connect.ServerStream[keyshardv1.PoolSnapshot]) error {
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	since := r.Msg.GetSinceVersion()
	var sent *keyshardv1.PoolSnapshot // the last version sent
	return follow(ctx, s, tenantPools, st, func() (*keyshardv1.PoolSnapshot, error) {
		p, err := h.poolLocked(r.Msg.GetPool())
		if err != nil {
			return nil, err
		}
		cur := p.snap
		switch {
		case sent == nil && (since == 0 || cur.GetVersion() > since):
			sent = cur
			return cur, nil
		case sent == nil || cur.GetVersion() <= sent.GetVersion():
			return nil, nil
		}
		d := poolDelta(sent, cur)
		sent = cur
		return d, nil
	})
}

// poolDelta returns the message that brings a stream from prev to cur:
// cur's tenants that are new or changed, and prev's that cur lacks.
func poolDelta(prev, cur *keyshardv1.PoolSnapshot) *keyshardv1.PoolSnapshot {
	d := &keyshardv1.PoolSnapshot{Pool: cur.GetPool(), Version: cur.GetVersion(), Policy: cur.GetPolicy(), Members: cur.GetMembers()}
	was := map[string]*keyshardv1.TenantAssignment{}
	for _, a := range prev.GetTenants() {
		was[a.GetTenant()] = a
	}
	now := map[string]bool{}
	for _, a := range cur.GetTenants() {
		now[a.GetTenant()] = true
		if old, ok := was[a.GetTenant()]; !ok || !proto.Equal(old, a) {
			d.Tenants = append(d.Tenants, a)
		}
	}
	for _, a := range prev.GetTenants() {
		if !now[a.GetTenant()] {
			d.RemovedTenants = append(d.RemovedTenants, a.GetTenant())
		}
	}
	return d
}

// GetTenants is not served: the fake measures no load.
func (h tenantPoolService) GetTenants(context.Context, *connect.Request[keyshardv1.GetTenantsRequest]) (*connect.Response[keyshardv1.GetTenantsResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("clienttest does not serve GetTenants; test it against keyshardtest.Start"))
}
