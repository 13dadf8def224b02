package server_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/internal/store"
)

// leaveEnv is a pool of six members with one tenant "t" of size 3,
// loaded every second of the test.
type leaveEnv struct {
	*tpEnv
	r, l     *tpReplica
	sessions map[string]string
	seq      uint64
}

func newLeaveEnv(t *testing.T, lookback time.Duration) *leaveEnv {
	e := &leaveEnv{tpEnv: newTPEnv(t, 1), sessions: map[string]string{}}
	e.r = e.rs[0]
	e.l = e.leader()
	p := basicPool("gw")
	p.Policy.Lookback = durationpb.New(lookback)
	e.putPool(e.r, p)
	for i := range 6 {
		id := fmt.Sprintf("m%d", i)
		e.sessions[id] = e.join(e.r, "gw", id, "")
	}
	e.load(12 * time.Second)
	e.waitTenant(e.r, "gw", "t", func(s *v1.TenantStatus) bool { return s.Assignment.Size == 3 })
	return e
}

// load reports 30 requests/s of "t" for d, a round per second.
func (e *leaveEnv) load(d time.Duration) {
	e.t.Helper()
	for range int(d / time.Second) {
		e.seq++
		e.report(e.r, "gw", "c1", e.seq, map[string]int64{"t": 30})
		e.step(e.l, time.Second)
	}
}

func (e *leaveEnv) leave(id string, end bool) *v1.LeavePoolResponse {
	e.t.Helper()
	resp, err := e.r.member.LeavePool(e.ctx, connect.NewRequest(&v1.LeavePoolRequest{Session: e.sessions[id], EndSession: end}))
	if err != nil {
		e.t.Fatalf("leave %s (end_session %v): %v", id, end, err)
	}
	// The leader's rounds read the members from its view: the next round
	// (load) must see the leave, not run before the view has it.
	if err := e.l.srv.WaitView(e.ctx, func(snap *store.Snapshot) bool {
		ps := snap.TenantPools["gw"]
		if ps == nil {
			return true
		}
		m, ok := ps.Members[id]
		return !ok || (!end && m.Value.Leaving)
	}); err != nil {
		e.t.Fatalf("the leader's view never showed %s leaving (end_session %v): %v", id, end, err)
	}
	return resp.Msg
}

func subset(a *v1.TenantAssignment) []string {
	var out []string
	for _, m := range a.Members {
		if !slices.ContainsFunc(a.Removed, func(r *v1.TenantRemoval) bool { return r.Member == m.Member }) {
			out = append(out, m.Member)
		}
	}
	return out
}

func targetsAt(a *v1.TenantAssignment, at time.Time) []string {
	var cur []string
	for _, sp := range a.Targets {
		if sp.From == nil || !sp.From.AsTime().After(at) {
			cur = sp.Members
		}
	}
	return cur
}

// TestTenantPoolGracefulLeave: a member that leaves without ending its
// session drains: at the next round it leaves the subset, its place taken
// by one other member, and stays a read target for the lookback, its
// keep-alives still answered; then LeavePool says done, and end_session
// ends the session.
func TestTenantPoolGracefulLeave(t *testing.T) {
	e := newLeaveEnv(t, 20*time.Second)
	before := e.tenant(e.r, "gw", "t").Assignment
	gone := subset(before)[0]

	first := e.leave(gone, false)
	if first.Done || first.Tenants != 1 || first.ReadUntil != nil {
		t.Fatalf("first LeavePool = %v; want not done, 1 tenant, no read_until while in the subset", first)
	}
	e.load(time.Second)
	after := e.waitTenant(e.r, "gw", "t", func(s *v1.TenantStatus) bool { return len(s.Assignment.Removed) > 0 }).Assignment
	now := e.clk.Now()
	sub := subset(after)
	if after.Size != 3 || len(sub) != 3 || slices.Contains(sub, gone) || after.Removed[0].Member != gone {
		t.Fatalf("after the leave: size %d, subset %v, removed %v; want 3 members without %s, which is removed", after.Size, sub, after.Removed, gone)
	}
	kept := 0
	for _, m := range subset(before) {
		if slices.Contains(sub, m) {
			kept++
		}
	}
	if kept != 2 {
		t.Fatalf("subset %v -> %v: kept %d; want 2 (one replaced, one for one)", subset(before), sub, kept)
	}
	removedAt := after.Removed[0].At.AsTime()
	if !slices.Contains(targetsAt(after, now), gone) || slices.Contains(targetsAt(after, removedAt.Add(20*time.Second)), gone) {
		t.Fatalf("targets %v now, %v after the lookback; want %s read for the lookback only", targetsAt(after, now), targetsAt(after, removedAt.Add(20*time.Second)), gone)
	}
	snap, err := e.r.member.GetPoolSnapshot(e.ctx, connect.NewRequest(&v1.GetPoolSnapshotRequest{Pool: "gw"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range snap.Msg.Snapshot.Members {
		if (m.Id == gone) != (m.Weight == 0) {
			t.Fatalf("snapshot member %s has weight %v; want 0 for the leaving %s only", m.Id, m.Weight, gone)
		}
	}
	mid := e.leave(gone, false)
	if mid.Done || mid.Tenants != 1 || mid.ReadUntil == nil || !mid.ReadUntil.AsTime().Equal(removedAt.Add(20*time.Second)) {
		t.Fatalf("LeavePool while draining = %v; want not done, 1 tenant, read_until %v", mid, removedAt.Add(20*time.Second))
	}

	// The lookback passes; the leaving member's keep-alives work.
	for range 4 {
		if _, err := e.r.member.PoolKeepAlive(e.ctx, connect.NewRequest(&v1.PoolKeepAliveRequest{Session: e.sessions[gone]})); err != nil {
			t.Fatalf("keep-alive of the leaving member: %v", err)
		}
		e.load(5 * time.Second)
	}
	e.waitTenant(e.r, "gw", "t", func(s *v1.TenantStatus) bool { return len(s.Assignment.Removed) == 0 })
	if done := e.leave(gone, false); !done.Done || done.Tenants != 0 || done.ReadUntil != nil || done.Version != e.tenantVersion(e.r) {
		t.Fatalf("LeavePool after the lookback = %v; want done at version %d", done, e.tenantVersion(e.r))
	}
	if end := e.leave(gone, true); !end.Done {
		t.Fatalf("end_session after the drain = %v; want done", end)
	}
	_, err = e.r.member.PoolKeepAlive(e.ctx, connect.NewRequest(&v1.PoolKeepAliveRequest{Session: e.sessions[gone]}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("keep-alive after end_session: %v; want not_found", err)
	}
	if again := e.leave(gone, true); !again.Done {
		t.Fatalf("end_session again = %v; want done, no error", again)
	}
	_, err = e.r.member.LeavePool(e.ctx, connect.NewRequest(&v1.LeavePoolRequest{Session: e.sessions[gone]}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("drain of an ended session: %v; want not_found", err)
	}
}

// TestTenantPoolLeaveAtOnce: end_session without a drain ends the session
// at once, and the member is dropped from the targets at the next round,
// as after a crash.
func TestTenantPoolLeaveAtOnce(t *testing.T) {
	e := newLeaveEnv(t, 20*time.Second)
	gone := subset(e.tenant(e.r, "gw", "t").Assignment)[0]
	if end := e.leave(gone, true); end.Done || end.Tenants != 1 {
		t.Fatalf("end_session in a subset = %v; want not done, 1 tenant", end)
	}
	_, err := e.r.member.PoolKeepAlive(e.ctx, connect.NewRequest(&v1.PoolKeepAliveRequest{Session: e.sessions[gone]}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("keep-alive after end_session: %v; want not_found", err)
	}
	e.load(time.Second)
	a := e.waitTenant(e.r, "gw", "t", func(s *v1.TenantStatus) bool { return !slices.Contains(memberIDs(s.Assignment), gone) }).Assignment
	if len(a.Removed) != 0 || slices.Contains(targetsAt(a, e.clk.Now()), gone) || len(subset(a)) != 3 {
		t.Fatalf("after end_session: %v; want %s dropped at once, 3 others", a, gone)
	}
}

// TestTenantPoolLeavingCrash: a leaving member whose session expires is
// dropped at the next round, lookback or not.
func TestTenantPoolLeavingCrash(t *testing.T) {
	e := newLeaveEnv(t, time.Minute)
	gone := subset(e.tenant(e.r, "gw", "t").Assignment)[0]
	e.leave(gone, false)
	e.load(time.Second)
	e.waitTenant(e.r, "gw", "t", func(s *v1.TenantStatus) bool { return len(s.Assignment.Removed) > 0 })
	if err := e.r.srv.ExpirePoolSession(e.ctx, "gw", gone); err != nil {
		t.Fatal(err)
	}
	e.load(time.Second)
	a := e.waitTenant(e.r, "gw", "t", func(s *v1.TenantStatus) bool { return len(s.Assignment.Removed) == 0 }).Assignment
	if slices.Contains(memberIDs(a), gone) || slices.Contains(targetsAt(a, e.clk.Now()), gone) {
		t.Fatalf("after the crash: %v; want %s dropped", a, gone)
	}
	_, err := e.r.member.LeavePool(e.ctx, connect.NewRequest(&v1.LeavePoolRequest{Session: e.sessions[gone]}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("LeavePool of the expired session: %v; want not_found", err)
	}
}

// TestTenantPoolSDKLeave: the Go SDK's Leave against a real server: the
// member drains (a removed read target for the lookback, keep-alives
// going), then Leave ends the session.
func TestTenantPoolSDKLeave(t *testing.T) {
	e := newTPEnv(t, 1)
	r := e.rs[0]
	l := e.leader()
	p := basicPool("gw")
	p.Policy.Lookback = durationpb.New(10 * time.Second)
	p.Policy.MinSize = 4 // every member serves "t"
	// The SDK member keeps its session alive on the fake clock, which the
	// test moves faster than the member's goroutine may answer: a TTL far
	// above the steps keeps a keep-alive late by a few steps harmless.
	p.LeaseTtl = durationpb.New(5 * time.Minute)
	e.putPool(r, p)
	for i := 1; i < 4; i++ {
		e.join(r, "gw", fmt.Sprintf("m%d", i), "")
	}
	c := r.Client(client.Token(memberToken), client.Clock(e.clk))
	events := make(chan client.PoolEvent, 64)
	m, err := c.JoinPool(e.ctx, "gw", client.Member{ID: "m0", Address: "m0:80"}, client.OnPoolEvent(func(ev client.PoolEvent) {
		if ev.Kind == client.PoolDraining || ev.Kind == client.PoolLeft {
			events <- ev
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	seq := uint64(0)
	load := func(d time.Duration) {
		for range int(d / time.Second) {
			seq++
			e.report(r, "gw", "c1", seq, map[string]int64{"t": 1})
			e.step(l, time.Second)
		}
	}
	// m0 is placed once its first keep-alive made it active.
	// The leader sizes "t" once it has measured a window.
	for s := e.tenant(r, "gw", "t"); !s.Known || !slices.Contains(subset(s.Assignment), "m0"); s = e.tenant(r, "gw", "t") {
		if e.clk.Now().Sub(tpT0) > time.Minute {
			t.Fatal("m0 is not placed after a minute")
		}
		load(time.Second)
	}
	if err := m.Follower().WaitVersion(e.ctx, e.tenantVersion(r)); err != nil {
		t.Fatal(err)
	}

	res := make(chan error, 1)
	go func() { res <- m.Leave(e.ctx) }()
	if ev := <-events; ev.Kind != client.PoolDraining || ev.Tenants != 1 {
		t.Fatalf("event %+v; want draining, 1 tenant", ev)
	}
	load(time.Second)
	a := e.waitTenant(r, "gw", "t", func(s *v1.TenantStatus) bool { return len(s.Assignment.Removed) > 0 }).Assignment
	if a.Removed[0].Member != "m0" || !slices.Contains(targetsAt(a, e.clk.Now()), "m0") {
		t.Fatalf("after Leave began: %v; want m0 removed, still a target", a)
	}
	// The lookback passes, the member's keep-alives going (two thirds of
	// the TTL at a time would have lost it otherwise).
	for {
		load(time.Second)
		select {
		case err := <-res:
			if err != nil {
				t.Fatalf("Leave: %v", err)
			}
			if ev := lastEvent(events); ev.Kind != client.PoolLeft || ev.Err != nil {
				t.Fatalf("last event %+v; want left", ev)
			}
			if e.clk.Now().Sub(a.Removed[0].At.AsTime()) < 10*time.Second {
				t.Fatalf("Leave returned %v after the removal; want the lookback of 10s", e.clk.Now().Sub(a.Removed[0].At.AsTime()))
			}
			if err := r.srv.WaitView(e.ctx, func(snap *store.Snapshot) bool { _, ok := snap.TenantPools["gw"].Members["m0"]; return !ok }); err != nil {
				t.Fatal(err)
			}
			return
		default:
		}
		if e.clk.Now().Sub(a.Removed[0].At.AsTime()) > time.Minute {
			t.Fatal("Leave has not returned a minute after the removal")
		}
	}
}

// tenantVersion returns r's current snapshot version of pool gw.
func (e *tpEnv) tenantVersion(r *tpReplica) uint64 {
	e.t.Helper()
	resp, err := r.member.GetPoolSnapshot(e.ctx, connect.NewRequest(&v1.GetPoolSnapshotRequest{Pool: "gw"}))
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.Msg.Snapshot.Version
}

// lastEvent drains events and returns the last one.
func lastEvent(events chan client.PoolEvent) client.PoolEvent {
	var ev client.PoolEvent
	for {
		select {
		case ev = <-events:
		default:
			return ev
		}
	}
}
