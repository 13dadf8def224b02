package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/internal/tenantpool"
)

// Tenant pools: settings and members' sessions are written to etcd by any
// replica; load reports, readiness marks and live rates go to the leader
// (pools_forward.go), which plans every second (pools_leader.go); every
// replica serves the published state from its view (pools_view.go).

// Limits of one call.
const (
	maxReportCounts  = 10_000 // counts in one ReportLoad
	maxReadyTenants  = 10_000 // tenants in one MarkReady
	maxTenantsListed = 10_000 // tenants in one GetTenants
	defaultTenants   = 100    // GetTenants' default limit
)

// tenantPoolService serves TenantPoolService.
type tenantPoolService struct{ s *Server }

func tenantPoolNotFound(name string) error {
	return notFound("tenant pool %q does not exist; create it with PutTenantPool (POST /keyshard.v1.TenantPoolService/PutTenantPool {\"pool\": {\"name\": %q, \"policy\": {\"capacity_per_member\": N}}}) or in the config file's tenant_pools, or list them with ListTenantPools", name, name)
}

// tenantPool returns a pool's settings from the view, or from etcd if the
// view does not know it yet, or NOT_FOUND saying how to create it.
func (s *Server) tenantPool(ctx context.Context, name string) (store.TenantPool, error) {
	if err := store.ValidateName(store.KindTenantPool, name); err != nil {
		return store.TenantPool{}, invalid("pool: %v", err)
	}
	var p store.TenantPool
	ok := false
	s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		if ps := snap.TenantPools[name]; ps != nil && ps.Config.Exists() {
			p, ok = ps.Config.Value, true
		}
	})
	if ok {
		return p, nil
	}
	p, _, err := s.store.GetTenantPool(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return p, tenantPoolNotFound(name)
	}
	return p, apiError(err)
}

func (h *tenantPoolService) PutTenantPool(ctx context.Context, req *connect.Request[v1.PutTenantPoolRequest]) (*connect.Response[v1.PutTenantPoolResponse], error) {
	p, err := tenantPoolFromProto(req.Msg.GetPool())
	if err != nil {
		return nil, err
	}
	rev, err := h.s.store.PutTenantPool(ctx, p)
	if err != nil {
		return nil, apiError(err)
	}
	h.s.view.waitRev(ctx, rev)
	h.s.log.Info("tenant pool set", "pool", p.Name, "capacity_per_member", p.Policy.CapacityPerMember, "min_size", p.Policy.MinSize, "max_size", p.Policy.MaxSize,
		"window", p.Window, "shrink_cooldown", p.Policy.ShrinkCooldown, "lease_ttl", p.LeaseTTL)
	return connect.NewResponse(&v1.PutTenantPoolResponse{Pool: tenantPoolProto(p)}), nil
}

func (h *tenantPoolService) DeleteTenantPool(ctx context.Context, req *connect.Request[v1.DeleteTenantPoolRequest]) (*connect.Response[v1.DeleteTenantPoolResponse], error) {
	name := req.Msg.GetName()
	if err := store.ValidateName(store.KindTenantPool, name); err != nil {
		return nil, invalid("name: %v", err)
	}
	rev, err := h.s.store.DeleteTenantPool(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, tenantPoolNotFound(name)
	}
	if err != nil {
		return nil, apiError(err)
	}
	h.s.view.waitRev(ctx, rev)
	h.s.log.Info("tenant pool deleted, with its members and state", "pool", name)
	return connect.NewResponse(&v1.DeleteTenantPoolResponse{}), nil
}

func (h *tenantPoolService) ListTenantPools(ctx context.Context, _ *connect.Request[v1.ListTenantPoolsRequest]) (*connect.Response[v1.ListTenantPoolsResponse], error) {
	resp := &v1.ListTenantPoolsResponse{}
	for _, tv := range h.s.view.tenantPools() {
		p := tv.pub
		resp.Pools = append(resp.Pools, &v1.TenantPoolStatus{Pool: tenantPoolProto(tv.cfg), Members: uint32(p.live), Tenants: uint32(p.snap.Len()), Version: p.version, Updated: tsProto(p.published)})
	}
	sortedPools(resp.Pools)
	return connect.NewResponse(resp), nil
}

func (h *tenantPoolService) JoinPool(ctx context.Context, req *connect.Request[v1.JoinPoolRequest]) (*connect.Response[v1.JoinPoolResponse], error) {
	s := h.s
	pool, err := s.tenantPool(ctx, req.Msg.GetPool())
	if err != nil {
		return nil, err
	}
	in := req.Msg.GetMember()
	if in == nil {
		return nil, invalid("member: missing; send {\"member\": {\"id\": ..., \"address\": ...}}")
	}
	if err := store.ValidateName(store.KindTenantMember, in.GetId()); err != nil {
		return nil, invalid("member.id: %v", err)
	}
	w := in.GetWeight()
	switch {
	case math.IsNaN(w) || math.IsInf(w, 0) || w < 0:
		return nil, invalid("member.weight: %v; want a finite number >= 0 (0 means 1)", w)
	case w == 0:
		w = 1
	}
	rec := store.TenantMember{ID: in.GetId(), Address: in.GetAddress(), Zone: in.GetZone(), Weight: w, Metadata: in.GetMetadata(), JoinedAt: s.clock.Now()}
	lease, ttl, err := s.store.Grant(ctx, pool.LeaseTTL)
	if err != nil {
		return nil, apiError(err)
	}
	old, rev, err := s.store.JoinTenantPool(ctx, pool.Name, rec, lease, req.Msg.GetReplace())
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), maxWriteDeadline)
		_ = s.store.Revoke(rctx, lease) // best effort: it expires unused otherwise
		cancel()
		switch {
		case errors.Is(err, store.ErrExists):
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("member %q is already in tenant pool %q with a live session; a restarted process passes replace=true to take over, another process needs another id", rec.ID, pool.Name))
		case errors.Is(err, store.ErrNotFound):
			return nil, tenantPoolNotFound(pool.Name)
		}
		return nil, apiError(err)
	}
	if old != 0 {
		if err := s.store.Revoke(ctx, old); err != nil && !errors.Is(err, store.ErrLeaseNotFound) {
			s.log.Warn("could not end the replaced session; it expires on its own", "pool", pool.Name, "member", rec.ID, "session", old, "err", err)
		}
		s.log.Info("tenant pool member re-joined, replacing its old session", "pool", pool.Name, "member", rec.ID, "old_session", old, "session", lease)
	} else {
		s.log.Info("tenant pool member joined", "pool", pool.Name, "member", rec.ID, "address", rec.Address, "zone", rec.Zone, "weight", w)
	}
	s.view.waitRev(ctx, rev)
	return connect.NewResponse(&v1.JoinPoolResponse{Session: s.sessions.poolToken(pool.Name, rec.ID, lease), LeaseTtl: durationpb.New(ttl), Pool: tenantPoolProto(pool)}), nil
}

func poolSessionEnded(sess poolSession) error {
	return notFound("session of member %q in tenant pool %q has ended (expired, left, replaced, or the pool was deleted); join again", sess.member, sess.pool)
}

func (h *tenantPoolService) PoolKeepAlive(ctx context.Context, req *connect.Request[v1.PoolKeepAliveRequest]) (*connect.Response[v1.PoolKeepAliveResponse], error) {
	s := h.s
	sess, err := s.sessions.parsePool(req.Msg.GetSession())
	if err != nil {
		return nil, err
	}
	ttl, err := s.store.KeepAliveOnce(ctx, sess.lease)
	if err == nil {
		var rev int64
		rev, err = s.store.ActivateTenantMember(ctx, sess.pool, sess.member, sess.lease)
		if err == nil && rev != 0 {
			s.log.Info("tenant pool member active", "pool", sess.pool, "member", sess.member)
			s.view.waitRev(ctx, rev)
		}
	}
	switch {
	case errors.Is(err, store.ErrLeaseNotFound), errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrFenced):
		return nil, poolSessionEnded(sess)
	case err != nil:
		return nil, apiError(err)
	}
	return connect.NewResponse(&v1.PoolKeepAliveResponse{Ttl: durationpb.New(ttl)}), nil
}

// LeavePool marks the member leaving (a drain: the leader plans it with
// weight 0 while its session lives) and answers the drain's progress, or
// with end_session ends the session at once.
func (h *tenantPoolService) LeavePool(ctx context.Context, req *connect.Request[v1.LeavePoolRequest]) (*connect.Response[v1.LeavePoolResponse], error) {
	s := h.s
	sess, err := s.sessions.parsePool(req.Msg.GetSession())
	if err != nil {
		return nil, err
	}
	if req.Msg.GetEndSession() {
		resp := s.leaveProgress(sess)
		err = s.store.Revoke(ctx, sess.lease)
		switch {
		case errors.Is(err, store.ErrLeaseNotFound):
			// Already ended: leaving twice is not an error.
			return connect.NewResponse(&v1.LeavePoolResponse{Done: true}), nil
		case err != nil:
			return nil, apiError(err)
		case resp.Done:
			s.log.Info("tenant pool member left", "pool", sess.pool, "member", sess.member)
		default:
			s.log.Warn("tenant pool member ended its session before its drain finished: it is dropped at the next round, and reads of data only it held may miss",
				"pool", sess.pool, "member", sess.member, "tenants", resp.Tenants)
		}
		return connect.NewResponse(resp), nil
	}
	rev, err := s.store.MarkTenantMemberLeaving(ctx, sess.pool, sess.member, sess.lease)
	switch {
	case errors.Is(err, store.ErrLeaseNotFound), errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrFenced):
		return nil, poolSessionEnded(sess)
	case err != nil:
		return nil, apiError(err)
	}
	if rev != 0 {
		s.view.waitRev(ctx, rev)
	}
	resp := s.leaveProgress(sess)
	if rev != 0 {
		s.log.Info("tenant pool member leaving: draining, in no subset from the leader's next round, read while the lookback keeps it",
			"pool", sess.pool, "member", sess.member, "tenants", resp.Tenants)
	}
	return connect.NewResponse(resp), nil
}

// leaveProgress is a leaving member's progress by this replica's view:
// done once the published state plans it with weight 0 (or not at all)
// and no tenant lists it. A session that has ended is done.
func (s *Server) leaveProgress(sess poolSession) *v1.LeavePoolResponse {
	s.view.mu.RLock()
	defer s.view.mu.RUnlock()
	tv := s.view.tpools[sess.pool]
	if tv == nil {
		return &v1.LeavePoolResponse{Done: true}
	}
	if r, ok := tv.records[sess.member]; !ok || r.Session != sess.lease {
		return &v1.LeavePoolResponse{Done: true}
	}
	placed := false
	for _, m := range tv.state.Members {
		if m.ID == sess.member && m.Weight > 0 {
			placed = true
		}
	}
	snap := tv.pub.snap
	resp := &v1.LeavePoolResponse{Tenants: uint32(len(snap.Tenants(sess.member))), Version: tv.pub.version}
	resp.Done = !placed && resp.Tenants == 0
	if until, ok := snap.ReadUntil(sess.member); ok && !placed && !resp.Done {
		resp.ReadUntil = tsProto(until)
	}
	return resp
}

// checkTenant checks one tenant id: 1 to store.MaxTenantLen bytes.
func checkTenant(field, t string) error {
	switch {
	case t == "":
		return invalid("%s: empty; want 1-%d bytes", field, store.MaxTenantLen)
	case len(t) > store.MaxTenantLen:
		return invalid("%s: %.40q... is %d bytes; want at most %d", field, t, len(t), store.MaxTenantLen)
	}
	return nil
}

func (h *tenantPoolService) MarkReady(ctx context.Context, req *connect.Request[v1.MarkReadyRequest]) (*connect.Response[v1.MarkReadyResponse], error) {
	s := h.s
	sess, err := s.sessions.parsePool(req.Msg.GetSession())
	if err != nil {
		return nil, err
	}
	tenants := req.Msg.GetTenants()
	if len(tenants) > maxReadyTenants {
		return nil, invalid("tenants: %d tenants; send at most %d per call", len(tenants), maxReadyTenants)
	}
	for i, t := range tenants {
		if err := checkTenant(fmt.Sprintf("tenants[%d]", i), t); err != nil {
			return nil, err
		}
	}
	var held shard.LeaseID
	s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		if ps := snap.TenantPools[sess.pool]; ps != nil {
			if m, ok := ps.Members[sess.member]; ok {
				held = m.Lease
			}
		}
	})
	if held != sess.lease {
		return nil, poolSessionEnded(sess)
	}
	local, remote, err := s.toLeader(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	if remote != nil {
		resp, err := remote.MarkReady(ctx, forwardRequest(s, req.Msg, req.Header()))
		s.countForward("MarkReady", err)
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(resp.Msg), nil
	}
	marks := make([]tenantpool.Ready, len(tenants))
	for i, t := range tenants {
		marks[i] = tenantpool.Ready{Member: sess.member, Tenant: t}
	}
	rep, err := local.ask(ctx, tpReq{pool: sess.pool, ready: marks})
	if err != nil {
		return nil, leaderErr(err)
	}
	return connect.NewResponse(&v1.MarkReadyResponse{Marked: uint32(rep.marked), Ignored: uint32(rep.ignored)}), nil
}

// leaderErr turns an error of the leader's loop into an API error.
func leaderErr(err error) error {
	switch {
	case errors.Is(err, errLeadershipMoving):
		return leadershipMoving("this replica stopped leading")
	case errors.Is(err, tenantpool.ErrFull):
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%w: the leader tracks as many tenants or reporters as it may; reports from new ones are refused until old ones age out of the window", err))
	case errors.Is(err, tenantpool.ErrInvalid):
		return invalid("%v", err)
	}
	return apiError(err)
}

func (h *tenantPoolService) ReportLoad(ctx context.Context, req *connect.Request[v1.ReportLoadRequest]) (*connect.Response[v1.ReportLoadResponse], error) {
	s := h.s
	arrived := s.clock.Now() // counted at this time, however long the leader's loop takes to take it in
	m := req.Msg
	pool, err := s.tenantPool(ctx, m.GetPool())
	if err != nil {
		return nil, err
	}
	if err := store.ValidateName(store.KindTenantMember, m.GetReporter()); err != nil {
		return nil, invalid("reporter: %v", err)
	}
	if m.GetSeq() == 0 {
		return nil, invalid("seq: 0; number reports from 1 up, one per report")
	}
	at := s.clock.Now()
	if t := m.GetTime(); t != nil {
		if err := t.CheckValid(); err != nil {
			return nil, invalid("time: %v", err)
		}
		at = t.AsTime()
	}
	if len(m.GetCounts()) > maxReportCounts {
		return nil, invalid("counts: %d entries; send at most %d per report (split it)", len(m.GetCounts()), maxReportCounts)
	}
	var period time.Duration
	if p := m.GetPeriod(); p != nil {
		if err := p.CheckValid(); err != nil {
			return nil, invalid("period: %v", err)
		}
		if period = p.AsDuration(); period < 0 {
			return nil, invalid("period: %v; want >= 0, the time since the previous report (unset or 0: place the counts at their arrival)", period)
		}
	}
	counts := make([]tenantpool.Count, len(m.GetCounts()))
	for i, c := range m.GetCounts() {
		if err := checkTenant(fmt.Sprintf("counts[%d].tenant", i), c.GetTenant()); err != nil {
			return nil, err
		}
		if c.GetCount() < 0 {
			return nil, invalid("counts[%d].count: %d (tenant %.40q); want >= 0, the requests since the previous report", i, c.GetCount(), c.GetTenant())
		}
		counts[i] = tenantpool.Count{Tenant: c.GetTenant(), N: c.GetCount()}
	}
	local, remote, err := s.toLeader(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	if remote != nil {
		resp, err := remote.ReportLoad(ctx, forwardRequest(s, m, req.Header()))
		s.countForward("ReportLoad", err)
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(resp.Msg), nil
	}
	rep, err := local.ask(ctx, tpReq{pool: pool.Name, at: arrived, report: &tenantpool.Report{Reporter: m.GetReporter(), Seq: m.GetSeq(), Time: at, Counts: counts, Period: period}})
	if err != nil {
		return nil, leaderErr(err)
	}
	var version uint64
	if pub, _, _, _, _ := s.view.tenantPool(pool.Name, 0); pub != nil {
		version = pub.version
	}
	outcome := map[tenantpool.Outcome]v1.ReportOutcome{
		tenantpool.Counted:  v1.ReportOutcome_REPORT_OUTCOME_COUNTED,
		tenantpool.Replayed: v1.ReportOutcome_REPORT_OUTCOME_REPLAYED,
		tenantpool.Stale:    v1.ReportOutcome_REPORT_OUTCOME_STALE,
	}[rep.outcome]
	return connect.NewResponse(&v1.ReportLoadResponse{Outcome: outcome, Version: version}), nil
}

func (h *tenantPoolService) GetPoolSnapshot(ctx context.Context, req *connect.Request[v1.GetPoolSnapshotRequest]) (*connect.Response[v1.GetPoolSnapshotResponse], error) {
	s := h.s
	pool, err := s.tenantPool(ctx, req.Msg.GetPool())
	if err != nil {
		return nil, err
	}
	wait, err := waitOf(req.Msg.GetWait())
	if err != nil {
		return nil, err
	}
	release, err := s.polls.holdIf(wait > 0)
	if err != nil {
		return nil, err
	}
	defer release()
	since := req.Msg.GetSinceVersion()
	timer := s.clock.NewTimer(wait)
	defer timer.Stop()
	for {
		pub, _, _, _, changed := s.view.tenantPool(pool.Name, since)
		if pub == nil {
			if err := s.viewCatchUp(ctx, pool.Name); err != nil {
				return nil, err
			}
			continue
		}
		if pub.version > since || wait == 0 {
			return connect.NewResponse(&v1.GetPoolSnapshotResponse{Snapshot: pub.snapshotProto(), Changed: pub.version > since}), nil
		}
		select {
		case <-changed:
		case <-timer.C():
			return connect.NewResponse(&v1.GetPoolSnapshotResponse{Snapshot: pub.snapshotProto()}), nil
		case <-ctx.Done():
			return nil, apiError(ctx.Err())
		}
	}
}

// viewCatchUp waits for this replica's view to hold a pool that etcd
// holds (it was created through another replica a moment ago).
func (s *Server) viewCatchUp(ctx context.Context, pool string) error {
	rev, err := s.store.Rev(ctx)
	if err != nil {
		return apiError(err)
	}
	s.view.waitRev(ctx, rev)
	if pub, _, _, _, _ := s.view.tenantPool(pool, 0); pub == nil {
		return tenantPoolNotFound(pool)
	}
	return nil
}

func (h *tenantPoolService) WatchPoolSnapshot(ctx context.Context, req *connect.Request[v1.WatchPoolSnapshotRequest], stream *connect.ServerStream[v1.PoolSnapshot]) error {
	s := h.s
	pool, err := s.tenantPool(ctx, req.Msg.GetPool())
	if err != nil {
		return err
	}
	release, err := s.polls.hold()
	if err != nil {
		return err
	}
	defer release()
	sent := req.Msg.GetSinceVersion()
	full := true // the first message is the full snapshot
	for first := true; ; first = false {
		pub, _, changedIDs, deltaOK, changed := s.view.tenantPool(pool.Name, sent)
		if pub == nil {
			if err := s.viewCatchUp(ctx, pool.Name); err != nil {
				return err
			}
			continue
		}
		switch {
		case pub.version > sent && (full || !deltaOK):
			if err := stream.Send(pub.snapshotProto()); err != nil {
				return err
			}
			sent, full = pub.version, false
		case pub.version > sent:
			msg := &v1.PoolSnapshot{Pool: pub.pool, Version: pub.version, Policy: pub.policy, Members: pub.members}
			for _, id := range changedIDs {
				if a, ok := pub.assign[id]; ok {
					msg.Tenants = append(msg.Tenants, a)
				} else {
					msg.RemovedTenants = append(msg.RemovedTenants, id)
				}
			}
			if err := stream.Send(msg); err != nil {
				return err
			}
			sent = pub.version
		case first:
			// Nothing newer than the client's version: send the headers,
			// so that the client's call returns now.
			if err := stream.Send(nil); err != nil {
				return err
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil
		}
	}
}

func (h *tenantPoolService) GetTenants(ctx context.Context, req *connect.Request[v1.GetTenantsRequest]) (*connect.Response[v1.GetTenantsResponse], error) {
	s := h.s
	m := req.Msg
	pool, err := s.tenantPool(ctx, m.GetPool())
	if err != nil {
		return nil, err
	}
	if len(m.GetTenants()) > maxTenantsListed {
		return nil, invalid("tenants: %d tenants; ask for at most %d per call", len(m.GetTenants()), maxTenantsListed)
	}
	for i, t := range m.GetTenants() {
		if err := checkTenant(fmt.Sprintf("tenants[%d]", i), t); err != nil {
			return nil, err
		}
	}
	limit := int(m.GetLimit())
	switch {
	case limit == 0:
		limit = defaultTenants
	case limit > maxTenantsListed:
		return nil, invalid("limit: %d; want at most %d (0 means %d)", limit, maxTenantsListed, defaultTenants)
	}
	// Rates live in the leader's memory: ask it, or forward the whole
	// call to it; answer here without rates if it cannot be asked.
	var rates map[string]float64
	local, remote, lerr := s.toLeader(ctx, req.Header())
	switch {
	case lerr != nil:
	case remote != nil:
		fctx, cancel := context.WithTimeout(ctx, forwardTimeout)
		resp, err := remote.GetTenants(fctx, forwardRequest(s, m, req.Header()))
		cancel()
		s.countForward("GetTenants", err)
		if err == nil {
			return connect.NewResponse(resp.Msg), nil
		}
		s.log.Debug("could not ask the leader for tenants' rates; answering without them", "pool", pool.Name, "err", err)
	default:
		rep, err := local.ask(ctx, tpReq{pool: pool.Name, rates: m.GetTenants(), all: len(m.GetTenants()) == 0})
		if err == nil {
			rates = rep.rates
		}
	}
	pub, _, _, _, _ := s.view.tenantPool(pool.Name, 0)
	if pub == nil {
		if err := s.viewCatchUp(ctx, pool.Name); err != nil {
			return nil, err
		}
		pub, _, _, _, _ = s.view.tenantPool(pool.Name, 0)
	}
	resp := &v1.GetTenantsResponse{Version: pub.version, Total: uint32(pub.snap.Len())}
	status := func(id string) *v1.TenantStatus {
		st := &v1.TenantStatus{}
		if a, ok := pub.assign[id]; ok {
			st.Assignment, st.Known = a, true
		} else {
			st.Assignment = statelessAssignment(id, pub.snap, s.clock.Now())
		}
		if rates != nil {
			st.Rate, st.RateKnown = rates[id], true
		}
		return st
	}
	if len(m.GetTenants()) > 0 {
		for _, id := range m.GetTenants() {
			resp.Tenants = append(resp.Tenants, status(id))
		}
		return connect.NewResponse(resp), nil
	}
	ids := make([]string, 0, len(pub.assign))
	for id := range pub.assign {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool {
		ri, rj := rates[ids[i]], rates[ids[j]]
		if ri != rj {
			return ri > rj
		}
		si, sj := pub.assign[ids[i]].Size, pub.assign[ids[j]].Size
		if si != sj {
			return si > sj
		}
		return ids[i] < ids[j]
	})
	for _, id := range ids[:min(len(ids), limit)] {
		resp.Tenants = append(resp.Tenants, status(id))
	}
	return connect.NewResponse(resp), nil
}

// createTenantPools creates the config file's pools that do not exist
// yet; an existing pool keeps its stored settings (a difference is
// logged).
func (s *Server) createTenantPools(ctx context.Context) error {
	for i, c := range s.cfg.TenantPools {
		p, err := c.Normalize()
		if err != nil {
			return fmt.Errorf("%w: tenant_pools[%d].%v", ErrConfig, i, err)
		}
		_, err = s.store.CreateTenantPool(ctx, p)
		switch {
		case err == nil:
			s.log.Info("created tenant pool from config", "pool", p.Name, "capacity_per_member", p.Policy.CapacityPerMember)
		case errors.Is(err, store.ErrExists):
			have, _, gerr := s.store.GetTenantPool(ctx, p.Name)
			if gerr != nil {
				return fmt.Errorf("read tenant pool %q: %w", p.Name, gerr)
			}
			if fmt.Sprintf("%+v", have) == fmt.Sprintf("%+v", p) {
				continue
			}
			// The config file declares the pool: its settings win at start
			// over changes made through the API since.
			if _, err := s.store.PutTenantPool(ctx, p); err != nil {
				return fmt.Errorf("update tenant pool %q from the config: %w", p.Name, err)
			}
			s.log.Info("updated tenant pool from config (it had other settings, perhaps changed through the API since)",
				"pool", p.Name, "was", fmt.Sprintf("%+v", have), "now", fmt.Sprintf("%+v", p))
		default:
			return fmt.Errorf("create tenant pool %q: %w", p.Name, err)
		}
	}
	return nil
}
