package server_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/internal/kitseam"
	"github.com/keyshard/keyshard/internal/server"
	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/keyshardtest"
)

var tpT0 = time.Date(2026, 5, 6, 7, 0, 0, 0, time.UTC)

// tpEnv drives tenant-pool tests: replicas sharing one fake clock.
type tpEnv struct {
	t   *testing.T
	ctx context.Context
	clk *keyshardtest.FakeClock
	rs  []*tpReplica
}

type tpReplica struct {
	*keyshardtest.Server
	srv    *server.Server
	admin  keyshardv1connect.TenantPoolServiceClient
	member keyshardv1connect.TenantPoolServiceClient
}

func newTPEnv(t *testing.T, replicas int) *tpEnv { return newTPEnvConfig(t, replicas, nil) }

// newTPEnvConfig is newTPEnv with cfg, if set, editing every replica's
// configuration.
func newTPEnvConfig(t *testing.T, replicas int, cfg func(*server.Config)) *tpEnv {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	e := &tpEnv{t: t, ctx: ctx, clk: keyshardtest.NewFakeClock(tpT0)}
	e.rs = make([]*tpReplica, replicas)
	for i := range e.rs {
		e.rs[i] = &tpReplica{}
	}
	// Every start (NewReplicas's, a Restart) reports its *server.Server
	// on the goroutine that started it; replica ri is e.rs[i-1].
	started := func(s *server.Server) {
		var i int
		if replicas == 1 {
			i = 1
		} else if _, err := fmt.Sscanf(s.Replica(), "r%d", &i); err != nil {
			t.Errorf("replica %q: %v", s.Replica(), err)
			return
		}
		e.rs[i-1].srv = s
	}
	opts := keyshardtest.Options{AdminToken: adminToken, MemberToken: memberToken, Clock: e.clk, ElectionTTL: time.Minute,
		Internal: &kitseam.Options{Config: cfg, Started: started}}
	if replicas == 1 {
		e.rs[0].Server = keyshardtest.NewServer(t, opts)
	} else {
		all := keyshardtest.NewReplicas(t, replicas, opts)
		for i, s := range all {
			e.rs[i].Server = s
		}
	}
	for _, r := range e.rs {
		r.admin = keyshardv1connect.NewTenantPoolServiceClient(http.DefaultClient, r.URL(), connect.WithInterceptors(bearerToken(adminToken)))
		r.member = keyshardv1connect.NewTenantPoolServiceClient(http.DefaultClient, r.URL(), connect.WithInterceptors(bearerToken(memberToken)))
	}
	return e
}

// leader returns the replica that leads, once its rounds are armed.
func (e *tpEnv) leader() *tpReplica {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	won := make(chan *tpReplica, len(e.rs))
	for _, r := range e.rs {
		go func() { // exits when r leads or ctx ends
			if r.WaitLeading(ctx) == nil {
				won <- r
			}
		}()
	}
	select {
	case r := <-won:
		return r
	case <-e.ctx.Done():
		e.t.Fatal("no replica leads")
	}
	panic("unreachable")
}

// step advances the clock by d (whole seconds) a second at a time,
// waiting for the leader's round after each.
func (e *tpEnv) step(l *tpReplica, d time.Duration) {
	e.t.Helper()
	for range int(d / time.Second) {
		e.clk.Advance(time.Second)
		if err := l.WaitTenantPoolRound(e.ctx, e.clk.Now()); err != nil {
			e.t.Fatalf("no tenant-pool round at %v: %v", e.clk.Now().Sub(tpT0), err)
		}
	}
}

func (e *tpEnv) putPool(r *tpReplica, p *v1.TenantPool) *v1.TenantPool {
	e.t.Helper()
	resp, err := r.admin.PutTenantPool(e.ctx, connect.NewRequest(&v1.PutTenantPoolRequest{Pool: p}))
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.Msg.Pool
}

// join joins member id and keeps it alive once (activating it).
func (e *tpEnv) join(r *tpReplica, pool, id, zone string) string {
	e.t.Helper()
	resp, err := r.member.JoinPool(e.ctx, connect.NewRequest(&v1.JoinPoolRequest{Pool: pool, Member: &v1.Member{Id: id, Address: id + ":80", Zone: zone}}))
	if err != nil {
		e.t.Fatalf("join %s: %v", id, err)
	}
	if _, err := r.member.PoolKeepAlive(e.ctx, connect.NewRequest(&v1.PoolKeepAliveRequest{Session: resp.Msg.Session})); err != nil {
		e.t.Fatalf("keep-alive %s: %v", id, err)
	}
	return resp.Msg.Session
}

func (e *tpEnv) report(r *tpReplica, pool, reporter string, seq uint64, counts map[string]int64) v1.ReportOutcome {
	e.t.Helper()
	req := &v1.ReportLoadRequest{Pool: pool, Reporter: reporter, Seq: seq}
	for _, t := range slices.Sorted(mapsKeys(counts)) {
		req.Counts = append(req.Counts, &v1.TenantCount{Tenant: t, Count: counts[t]})
	}
	resp, err := r.member.ReportLoad(e.ctx, connect.NewRequest(req))
	if err != nil {
		e.t.Fatalf("report %s#%d: %v", reporter, seq, err)
	}
	return resp.Msg.Outcome
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// tenant returns one tenant's status as r serves it.
func (e *tpEnv) tenant(r *tpReplica, pool, tenant string) *v1.TenantStatus {
	e.t.Helper()
	e.caughtUp(r, pool)
	resp, err := r.member.GetTenants(e.ctx, connect.NewRequest(&v1.GetTenantsRequest{Pool: pool, Tenants: []string{tenant}}))
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.Msg.Tenants[0]
}

// caughtUp waits until r's view, and the view of the replica that wrote
// pool's state last (the leader, which answers GetTenants), have the
// version of that write: a round's write reaches a view through etcd's
// watch, in real time, while the test's clock moves on at once.
func (e *tpEnv) caughtUp(r *tpReplica, pool string) {
	e.t.Helper()
	var v uint64
	var writer *tpReplica
	for _, x := range e.rs {
		if x.srv == nil {
			continue
		}
		if w := x.srv.LastTenantPoolWrite(pool); w.Version > v {
			v, writer = w.Version, x
		}
	}
	if v == 0 {
		return
	}
	if snap, err := e.snapshotAt(r, pool, v); err != nil || snap.GetVersion() < v {
		e.t.Fatalf("pool %s never reached version %d, the leader's last write: %v", pool, v, err)
	}
	if writer != r {
		_, _ = e.snapshotAt(writer, pool, v) // a writer that stopped since fails: r's view is what is read
	}
}

// snapshotAt long-polls r until it serves pool at version v or above and
// returns its snapshot (the fake clock never ends the wait; ctx does).
func (e *tpEnv) snapshotAt(r *tpReplica, pool string, v uint64) (*v1.PoolSnapshot, error) {
	resp, err := r.member.GetPoolSnapshot(e.ctx, connect.NewRequest(&v1.GetPoolSnapshotRequest{Pool: pool, SinceVersion: v - 1, Wait: durationpb.New(time.Minute)}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.Snapshot, nil
}

// waitTenant waits until r serves tenant as cond wants: the leader's
// round has written it, and r's view follows. It long-polls for each new
// version (the fake clock never ends the wait; ctx does).
func (e *tpEnv) waitTenant(r *tpReplica, pool, tenant string, cond func(*v1.TenantStatus) bool) *v1.TenantStatus {
	e.t.Helper()
	for {
		resp, err := r.member.GetTenants(e.ctx, connect.NewRequest(&v1.GetTenantsRequest{Pool: pool, Tenants: []string{tenant}}))
		if err != nil {
			e.t.Fatal(err)
		}
		last := resp.Msg.Tenants[0]
		if cond(last) {
			return last
		}
		_, err = r.member.GetPoolSnapshot(e.ctx, connect.NewRequest(&v1.GetPoolSnapshotRequest{Pool: pool, SinceVersion: resp.Msg.Version, Wait: durationpb.New(time.Minute)}))
		if err != nil {
			e.t.Fatalf("tenant %s never met the condition at version %d; last %v (%v)", tenant, resp.Msg.Version, last, err)
		}
	}
}

func memberIDs(a *v1.TenantAssignment) []string {
	var out []string
	for _, m := range a.Members {
		out = append(out, m.Member)
	}
	return out
}

// basicPool has a window of 12 s: 12 buckets of a whole second, so
// rates are exact.
func basicPool(name string) *v1.TenantPool {
	return &v1.TenantPool{Name: name, Policy: &v1.TenantPoolPolicy{
		CapacityPerMember: 10, Window: durationpb.New(12 * time.Second), ShrinkCooldown: durationpb.New(30 * time.Second),
	}}
}

func TestTenantPoolAPI(t *testing.T) {
	e := newTPEnv(t, 1)
	r := e.rs[0]
	e.leader()

	// Defaults are filled in.
	got := e.putPool(r, &v1.TenantPool{Name: "gw", Policy: &v1.TenantPoolPolicy{CapacityPerMember: 10}})
	p := got.Policy
	if p.Headroom != 1 || p.MinSize != 1 || p.ShrinkCooldown.AsDuration() != 10*time.Minute || p.Window.AsDuration() != time.Minute ||
		p.Tolerance != 0.1 || got.LeaseTtl.AsDuration() != 10*time.Second {
		t.Fatalf("defaults not filled in: %v", got)
	}

	// Bad input names the field, and stores nothing.
	for _, c := range []struct {
		pool *v1.TenantPool
		want string
	}{
		{&v1.TenantPool{Name: "bad pool", Policy: &v1.TenantPoolPolicy{CapacityPerMember: 1}}, "pool.name"},
		{&v1.TenantPool{Name: "b1", Policy: &v1.TenantPoolPolicy{}}, "pool.policy.capacity_per_member"},
		{&v1.TenantPool{Name: "b1", Policy: &v1.TenantPoolPolicy{CapacityPerMember: 1, Window: durationpb.New(time.Second)}}, "pool.policy.window"},
		{&v1.TenantPool{Name: "b1", Policy: &v1.TenantPoolPolicy{CapacityPerMember: 1, Window: durationpb.New(time.Minute), ShrinkCooldown: durationpb.New(time.Second)}}, "pool.policy.shrink_cooldown"},
		{&v1.TenantPool{Name: "b1", Policy: &v1.TenantPoolPolicy{CapacityPerMember: 1, MinSize: 5, MaxSize: 2}}, "pool.policy.max_size"},
		{&v1.TenantPool{Name: "b1", Policy: &v1.TenantPoolPolicy{CapacityPerMember: 1, Overrides: map[string]*v1.TenantOverride{"t1": {Size: 2, MinSize: 1}}}}, `pool.policy.overrides["t1"].size`},
		{&v1.TenantPool{Name: "b1", Policy: &v1.TenantPoolPolicy{CapacityPerMember: 1}, LeaseTtl: durationpb.New(time.Second)}, "pool.lease_ttl"},
		{&v1.TenantPool{Name: "b1", Policy: &v1.TenantPoolPolicy{CapacityPerMember: 1, Lookback: durationpb.New(-time.Second)}}, "pool.policy.lookback"},
	} {
		_, err := r.admin.PutTenantPool(e.ctx, connect.NewRequest(&v1.PutTenantPoolRequest{Pool: c.pool}))
		wantCode(t, err, connect.CodeInvalidArgument, c.want)
	}
	list, err := r.member.ListTenantPools(e.ctx, connect.NewRequest(&v1.ListTenantPoolsRequest{}))
	if err != nil || len(list.Msg.Pools) != 1 || list.Msg.Pools[0].Pool.Name != "gw" {
		t.Fatalf("list = %v, %v; want only gw", list, err)
	}

	// Admin calls need the admin token.
	_, err = r.member.PutTenantPool(e.ctx, connect.NewRequest(&v1.PutTenantPoolRequest{Pool: basicPool("x")}))
	wantCode(t, err, connect.CodePermissionDenied, "admin")

	// Unknown pool: NOT_FOUND saying how to create it.
	_, err = r.member.ReportLoad(e.ctx, connect.NewRequest(&v1.ReportLoadRequest{Pool: "nope", Reporter: "c1", Seq: 1}))
	wantCode(t, err, connect.CodeNotFound, "PutTenantPool")
	_, err = r.member.JoinPool(e.ctx, connect.NewRequest(&v1.JoinPoolRequest{Pool: "nope", Member: &v1.Member{Id: "m1"}}))
	wantCode(t, err, connect.CodeNotFound, "PutTenantPool")

	// Sessions: join, keep-alive, a second join of the id is refused,
	// replace ends the old session, leave ends the new.
	s1 := e.join(r, "gw", "m1", "")
	_, err = r.member.JoinPool(e.ctx, connect.NewRequest(&v1.JoinPoolRequest{Pool: "gw", Member: &v1.Member{Id: "m1"}}))
	wantCode(t, err, connect.CodeAlreadyExists, "replace")
	rj, err := r.member.JoinPool(e.ctx, connect.NewRequest(&v1.JoinPoolRequest{Pool: "gw", Member: &v1.Member{Id: "m1"}, Replace: true}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.member.PoolKeepAlive(e.ctx, connect.NewRequest(&v1.PoolKeepAliveRequest{Session: s1}))
	wantCode(t, err, connect.CodeNotFound, "join again")
	s2 := rj.Msg.Session
	if _, err := r.member.PoolKeepAlive(e.ctx, connect.NewRequest(&v1.PoolKeepAliveRequest{Session: s2})); err != nil {
		t.Fatal(err)
	}
	// A pool session is not a keyspace session, and the other way round.
	mc := keyshardv1connect.NewMemberServiceClient(http.DefaultClient, r.URL(), connect.WithInterceptors(bearerToken(memberToken)))
	_, err = mc.KeepAlive(e.ctx, connect.NewRequest(&v1.KeepAliveRequest{Session: s2}))
	wantCode(t, err, connect.CodeInvalidArgument, "malformed")
	_, err = r.member.PoolKeepAlive(e.ctx, connect.NewRequest(&v1.PoolKeepAliveRequest{Session: "ks/m1/1a/00112233445566778899aabbccddeeff"}))
	wantCode(t, err, connect.CodeInvalidArgument, "not a tenant-pool session")
	// A drain keeps the session (a member of no tenant is done at once);
	// end_session ends it.
	if lv, err := r.member.LeavePool(e.ctx, connect.NewRequest(&v1.LeavePoolRequest{Session: s2})); err != nil || !lv.Msg.Done {
		t.Fatalf("LeavePool = %v, %v; want done", lv, err)
	}
	if _, err := r.member.PoolKeepAlive(e.ctx, connect.NewRequest(&v1.PoolKeepAliveRequest{Session: s2})); err != nil {
		t.Fatalf("keep-alive of a leaving member: %v", err)
	}
	if err := r.srv.WaitView(e.ctx, func(snap *store.Snapshot) bool { return snap.TenantPools["gw"].Members["m1"].Value.Leaving }); err != nil {
		t.Fatal(err)
	}
	// A re-join with replace starts a session that is not leaving.
	rj, err = r.member.JoinPool(e.ctx, connect.NewRequest(&v1.JoinPoolRequest{Pool: "gw", Member: &v1.Member{Id: "m1"}, Replace: true}))
	if err != nil {
		t.Fatal(err)
	}
	s2 = rj.Msg.Session
	if err := r.srv.WaitView(e.ctx, func(snap *store.Snapshot) bool {
		m := snap.TenantPools["gw"].Members["m1"].Value
		return m.Session != 0 && !m.Leaving
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.member.LeavePool(e.ctx, connect.NewRequest(&v1.LeavePoolRequest{Session: s2, EndSession: true})); err != nil {
		t.Fatal(err)
	}
	_, err = r.member.PoolKeepAlive(e.ctx, connect.NewRequest(&v1.PoolKeepAliveRequest{Session: s2}))
	wantCode(t, err, connect.CodeNotFound, "join again")

	// Reports: counted, the same seq replayed, an old one stale.
	if o := e.report(r, "gw", "c1", 1, map[string]int64{"t1": 5}); o != v1.ReportOutcome_REPORT_OUTCOME_COUNTED {
		t.Fatalf("first report: %v", o)
	}
	if o := e.report(r, "gw", "c1", 1, map[string]int64{"t1": 5}); o != v1.ReportOutcome_REPORT_OUTCOME_REPLAYED {
		t.Fatalf("replay: %v", o)
	}
	old, err := r.member.ReportLoad(e.ctx, connect.NewRequest(&v1.ReportLoadRequest{Pool: "gw", Reporter: "c2", Seq: 1,
		Time: timestamppb.New(e.clk.Now().Add(-2 * time.Minute)), Counts: []*v1.TenantCount{{Tenant: "t1", Count: 1}}}))
	if err != nil || old.Msg.Outcome != v1.ReportOutcome_REPORT_OUTCOME_STALE {
		t.Fatalf("old report: %v, %v; want STALE", old, err)
	}
	many := make([]*v1.TenantCount, 10_001)
	for i := range many {
		many[i] = &v1.TenantCount{Tenant: fmt.Sprint("t", i), Count: 1}
	}
	for _, c := range []struct {
		req  *v1.ReportLoadRequest
		want string
	}{
		{&v1.ReportLoadRequest{Pool: "gw", Reporter: "c3", Seq: 1, Counts: []*v1.TenantCount{{Tenant: "t1", Count: 1}, {Tenant: "t2", Count: -1}}}, "counts[1].count"},
		{&v1.ReportLoadRequest{Pool: "gw", Reporter: "c3", Seq: 1, Counts: []*v1.TenantCount{{Tenant: "", Count: 1}}}, "counts[0].tenant"},
		{&v1.ReportLoadRequest{Pool: "gw", Reporter: "c3", Seq: 1, Counts: many}, "counts"},
		{&v1.ReportLoadRequest{Pool: "gw", Reporter: "", Seq: 1}, "reporter"},
		{&v1.ReportLoadRequest{Pool: "gw", Reporter: "c3", Seq: 0}, "seq"},
		{&v1.ReportLoadRequest{Pool: "gw", Reporter: "c3", Seq: 1, Period: durationpb.New(-time.Second)}, "period: -1s; want >= 0"},
	} {
		_, err := r.member.ReportLoad(e.ctx, connect.NewRequest(c.req))
		wantCode(t, err, connect.CodeInvalidArgument, c.want)
	}
	// Nothing of the refused reports was counted: c3's first good report
	// counts.
	if o := e.report(r, "gw", "c3", 1, map[string]int64{"t1": 1}); o != v1.ReportOutcome_REPORT_OUTCOME_COUNTED {
		t.Fatalf("c3 after refusals: %v", o)
	}

	// gRPC and HTTP/JSON answer the same.
	grpc := keyshardv1connect.NewTenantPoolServiceClient(http.DefaultClient, r.URL(), connect.WithGRPC(), connect.WithInterceptors(bearerToken(memberToken)))
	if l, err := grpc.ListTenantPools(e.ctx, connect.NewRequest(&v1.ListTenantPoolsRequest{})); err != nil || len(l.Msg.Pools) != 1 {
		t.Fatalf("gRPC list: %v, %v", l, err)
	}
	body := `{"pool":"gw","reporter":"curl","seq":1,"counts":[{"tenant":"t9","count":"3"}]}`
	req, _ := http.NewRequestWithContext(e.ctx, http.MethodPost, r.URL()+"/keyshard.v1.TenantPoolService/ReportLoad", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+memberToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !bytes.Contains(out, []byte("REPORT_OUTCOME_COUNTED")) {
		t.Fatalf("JSON report: %d %s", res.StatusCode, out)
	}

	// Delete removes the pool and everything of it.
	if _, err := r.admin.DeleteTenantPool(e.ctx, connect.NewRequest(&v1.DeleteTenantPoolRequest{Name: "gw"})); err != nil {
		t.Fatal(err)
	}
	_, err = r.admin.DeleteTenantPool(e.ctx, connect.NewRequest(&v1.DeleteTenantPoolRequest{Name: "gw"}))
	wantCode(t, err, connect.CodeNotFound, "does not exist")
}

// TestTenantPoolSizesFromLoad: capacity 10, a tenant at 50 req/s gets 5
// members whatever the pool's size; growing the pool to 100 members and
// back to 10 keeps its size and most of its members.
func TestTenantPoolSizesFromLoad(t *testing.T) {
	e := newTPEnv(t, 1)
	r := e.rs[0]
	l := e.leader()
	e.putPool(r, basicPool("gw"))
	for i := range 10 {
		e.join(r, "gw", fmt.Sprintf("m%03d", i), "")
	}
	seq := uint64(0)
	load := func(d time.Duration, counts map[string]int64) {
		for range int(d / time.Second) {
			seq++
			e.report(r, "gw", "c1", seq, counts)
			e.step(l, time.Second)
		}
	}
	load(12*time.Second, map[string]int64{"big": 50, "small": 1})
	big := e.waitTenant(r, "gw", "big", func(s *v1.TenantStatus) bool { return s.Assignment.Size == 5 })
	if !big.Known || !big.RateKnown || big.Rate < 45 || big.Rate > 55 {
		t.Fatalf("big = %v; want known, rate about 50", big)
	}
	if s := e.tenant(r, "gw", "small"); s.Assignment.Size != 1 {
		t.Fatalf("small size = %d; want 1", s.Assignment.Size)
	}
	before := memberIDs(big.Assignment)

	// An unknown tenant gets the stateless subset, known false.
	if s := e.tenant(r, "gw", "never"); s.Known || len(s.Assignment.Targets) != 1 || len(s.Assignment.Targets[0].Members) != 1 {
		t.Fatalf("unknown tenant = %v; want the stateless subset of 1", s)
	}

	sessions := map[string]string{}
	for i := 10; i < 100; i++ {
		id := fmt.Sprintf("m%03d", i)
		sessions[id] = e.join(r, "gw", id, "")
	}
	load(3*time.Second, map[string]int64{"big": 50, "small": 1})
	grown := e.tenant(r, "gw", "big")
	if grown.Assignment.Size != 5 {
		t.Fatalf("size with 100 members = %d; want 5", grown.Assignment.Size)
	}
	for id, s := range sessions {
		if _, err := r.member.LeavePool(e.ctx, connect.NewRequest(&v1.LeavePoolRequest{Session: s})); err != nil {
			t.Fatalf("leave %s: %v", id, err)
		}
	}
	load(3*time.Second, map[string]int64{"big": 50, "small": 1})
	back := e.waitTenant(r, "gw", "big", func(s *v1.TenantStatus) bool {
		for _, m := range s.Assignment.Members {
			if m.Member >= "m010" && !slices.ContainsFunc(s.Assignment.Removed, func(x *v1.TenantRemoval) bool { return x.Member == m.Member }) {
				return false
			}
		}
		return true
	})
	if back.Assignment.Size != 5 {
		t.Fatalf("size back at 10 members = %d; want 5", back.Assignment.Size)
	}
	kept := 0
	for _, m := range back.Assignment.Members {
		if slices.Contains(before, m.Member) {
			kept++
		}
	}
	if kept < 3 {
		t.Fatalf("kept %d of the 5 members %v (now %v); want most", kept, before, memberIDs(back.Assignment))
	}
}

// TestTenantPoolGrowShrinkOverride: a 2x step grows within one window, a
// drop shrinks only after the cooldown, an override wins, and a reporter
// that stops stops counting after the window.
func TestTenantPoolGrowShrinkOverride(t *testing.T) {
	e := newTPEnv(t, 1)
	r := e.rs[0]
	l := e.leader()
	e.putPool(r, basicPool("gw"))
	for i := range 20 {
		e.join(r, "gw", fmt.Sprintf("m%02d", i), "")
	}
	seq := uint64(0)
	load := func(d time.Duration, n int64) {
		for range int(d / time.Second) {
			seq++
			e.report(r, "gw", "c1", seq, map[string]int64{"t": n})
			e.step(l, time.Second)
		}
	}
	size := func() uint32 { return e.tenant(r, "gw", "t").Assignment.Size }
	load(12*time.Second, 40)
	e.waitTenant(r, "gw", "t", func(s *v1.TenantStatus) bool { return s.Assignment.Size == 4 })
	load(12*time.Second, 80) // one window
	e.waitTenant(r, "gw", "t", func(s *v1.TenantStatus) bool { return s.Assignment.Size == 8 })
	load(20*time.Second, 20) // less than the 30 s cooldown
	if got := size(); got != 8 {
		t.Fatalf("size before the cooldown = %d; want 8", got)
	}
	load(20*time.Second, 20)
	e.waitTenant(r, "gw", "t", func(s *v1.TenantStatus) bool { return s.Assignment.Size < 8 })

	p := basicPool("gw")
	p.Policy.Overrides = map[string]*v1.TenantOverride{"t": {Size: 3}}
	e.putPool(r, p)
	load(2*time.Second, 20)
	e.waitTenant(r, "gw", "t", func(s *v1.TenantStatus) bool { return s.Assignment.Size == 3 })

	// The reporter stops: after the window its load no longer counts.
	e.step(l, 14*time.Second)
	if s := e.tenant(r, "gw", "t"); !s.RateKnown || s.Rate != 0 {
		t.Fatalf("rate after the reporter stopped = %v; want 0", s)
	}
}

// TestTenantPoolLookbackAndReadiness: a member removed by a shrink stays
// a read target for the lookback; a new member is not a target before
// MarkReady or the warm-up.
func TestTenantPoolLookbackAndReadiness(t *testing.T) {
	e := newTPEnv(t, 1)
	r := e.rs[0]
	l := e.leader()
	p := basicPool("gw")
	p.Policy.Lookback = durationpb.New(20 * time.Second)
	p.Policy.WarmUp = durationpb.New(30 * time.Second)
	e.putPool(r, p)
	sessions := map[string]string{}
	for i := range 6 {
		id := fmt.Sprintf("m%d", i)
		sessions[id] = e.join(r, "gw", id, "")
	}
	seq := uint64(0)
	load := func(d time.Duration, n int64) {
		for range int(d / time.Second) {
			seq++
			e.report(r, "gw", "c1", seq, map[string]int64{"t": n})
			e.step(l, time.Second)
		}
	}
	e.step(l, 12*time.Second) // a window: the leader sizes nobody before it has measured one
	load(2*time.Second, 5)
	first := e.waitTenant(r, "gw", "t", func(s *v1.TenantStatus) bool { return s.Known })
	load(10*time.Second, 30)
	grown := e.waitTenant(r, "gw", "t", func(s *v1.TenantStatus) bool { return s.Assignment.Size == 3 })
	targets := func(s *v1.TenantStatus, at time.Time) []string {
		var cur []string
		for _, sp := range s.Assignment.Targets {
			if sp.From == nil || !sp.From.AsTime().After(at) {
				cur = sp.Members
			}
		}
		return cur
	}
	var added []string
	for _, m := range grown.Assignment.Members {
		if !slices.Contains(memberIDs(first.Assignment), m.Member) {
			added = append(added, m.Member)
		}
	}
	if len(added) != 2 {
		t.Fatalf("added %v; want 2 new members", added)
	}
	now := e.clk.Now()
	if tg := targets(grown, now); slices.Contains(tg, added[0]) || slices.Contains(tg, added[1]) {
		t.Fatalf("targets %v include a new member before MarkReady or the warm-up", tg)
	}
	mr, err := r.member.MarkReady(e.ctx, connect.NewRequest(&v1.MarkReadyRequest{Session: sessions[added[0]], Tenants: []string{"t", "other"}}))
	if err != nil || mr.Msg.Marked != 1 || mr.Msg.Ignored != 1 {
		t.Fatalf("MarkReady = %v, %v; want 1 marked, 1 ignored", mr, err)
	}
	load(time.Second, 30)
	ready := e.waitTenant(r, "gw", "t", func(s *v1.TenantStatus) bool { return slices.Contains(targets(s, e.clk.Now()), added[0]) })
	if slices.Contains(targets(ready, e.clk.Now()), added[1]) {
		t.Fatalf("targets %v include %s, neither ready nor warm", targets(ready, e.clk.Now()), added[1])
	}
	if tg := targets(ready, e.clk.Now().Add(31*time.Second)); !slices.Contains(tg, added[1]) {
		t.Fatalf("targets after the warm-up %v lack %s", tg, added[1])
	}

	// The load drops: after the cooldown a shrink step removes one
	// member, which stays a read target for the lookback.
	load(45*time.Second, 5)
	after := e.waitTenant(r, "gw", "t", func(s *v1.TenantStatus) bool { return len(s.Assignment.Removed) > 0 })
	if after.Assignment.Size != 2 {
		t.Fatalf("size after one shrink step = %d; want 2", after.Assignment.Size)
	}
	gone := after.Assignment.Removed[0].Member
	if !slices.Contains(targets(after, e.clk.Now()), gone) {
		t.Fatalf("targets %v lack %s within the lookback", targets(after, e.clk.Now()), gone)
	}
	if slices.Contains(targets(after, e.clk.Now().Add(21*time.Second)), gone) {
		t.Fatalf("targets after the lookback still hold %s", gone)
	}
}

// TestTenantPoolLeaderFailover: reports sent to the replica that does not
// lead are forwarded; after the leader stops, the other continues with
// the same sizes and subsets.
func TestTenantPoolLeaderFailover(t *testing.T) {
	e := newTPEnv(t, 2)
	l := e.leader()
	other := e.rs[0]
	if other == l {
		other = e.rs[1]
	}
	e.putPool(other, basicPool("gw"))
	for i := range 10 {
		e.join(other, "gw", fmt.Sprintf("m%d", i), "")
	}
	for seq := uint64(1); seq <= 12; seq++ {
		if o := e.report(other, "gw", "c1", seq, map[string]int64{"big": 50}); o != v1.ReportOutcome_REPORT_OUTCOME_COUNTED {
			t.Fatalf("forwarded report: %v", o)
		}
		e.step(l, time.Second)
	}
	before := e.waitTenant(other, "gw", "big", func(s *v1.TenantStatus) bool { return s.Assignment.Size == 5 })
	if !before.RateKnown {
		t.Fatalf("rate not known through the replica that does not lead: %v", before)
	}
	if err := l.Stop(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 60*time.Second)
	defer cancel()
	for other.WaitLeading(ctx) != nil {
		t.Fatal("the other replica does not lead")
	}
	// The new leader measures from scratch: fewer seconds of load than a
	// window must not shrink anyone (the cooldown covers it), and sizes
	// and subsets are those of the old leader.
	for seq := uint64(13); seq <= 20; seq++ {
		e.report(other, "gw", "c1", seq, map[string]int64{"big": 50})
		e.step(other, time.Second)
	}
	after := e.tenant(other, "gw", "big")
	if after.Assignment.Size != 5 || !slices.Equal(memberIDs(after.Assignment), memberIDs(before.Assignment)) {
		t.Fatalf("after failover %v; want %v", memberIDs(after.Assignment), memberIDs(before.Assignment))
	}
}

// TestTenantPoolChunkWrites: one tenant's change rewrites one chunk.
func TestTenantPoolChunkWrites(t *testing.T) {
	e := newTPEnv(t, 1)
	r := e.rs[0]
	l := e.leader()
	e.putPool(r, basicPool("gw"))
	for i := range 10 {
		e.join(r, "gw", fmt.Sprintf("m%d", i), "")
	}
	counts := map[string]int64{}
	for i := range 2000 {
		counts[fmt.Sprintf("tenant-%04d", i)] = 1
	}
	e.step(l, 12*time.Second) // a window: the leader sizes nobody before it has measured one
	e.report(r, "gw", "c1", 1, counts)
	e.step(l, time.Second)
	full := l.srv.LastTenantPoolWrite("gw")
	seq := uint64(1)
	for range 2 {
		seq++
		e.report(r, "gw", "c1", seq, counts)
		e.step(l, time.Second)
	}
	if full.Tenants < 2000 || full.Writes < 200 {
		t.Fatalf("first write %+v; want every tenant in most chunks", full)
	}
	counts["tenant-0007"] = 500
	seq++
	e.report(r, "gw", "c1", seq, counts)
	e.step(l, time.Second)
	one := l.srv.LastTenantPoolWrite("gw")
	if one.Tenants != 1 || one.Writes > 2 || one.Version <= full.Version {
		t.Fatalf("write after one tenant's change %+v; want 1 tenant, one chunk and the meta", one)
	}
	t.Logf("bytes written: all %d tenants %d; one tenant's change %d (%d keys)", full.Tenants, full.Bytes, one.Bytes, one.Writes)
}

// TestTenantPoolsFromConfig: the config file declares pools: created at
// start, and set back to the config's settings at the next start after a
// change through the API.
func TestTenantPoolsFromConfig(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := keyshardtest.NewServer(t, keyshardtest.Options{AdminToken: adminToken, MemberToken: memberToken,
		Internal: &kitseam.Options{Config: func(c *server.Config) {
			c.TenantPools = []server.TenantPoolConfig{{Name: "gw", Policy: server.TenantPoolPolicyConfig{CapacityPerMember: 10, MaxSize: 8}}}
		}}})
	admin := keyshardv1connect.NewTenantPoolServiceClient(http.DefaultClient, srv.URL(), connect.WithInterceptors(bearerToken(adminToken)))
	policy := func() *v1.TenantPoolPolicy {
		t.Helper()
		l, err := admin.ListTenantPools(ctx, connect.NewRequest(&v1.ListTenantPoolsRequest{}))
		if err != nil || len(l.Msg.Pools) != 1 || l.Msg.Pools[0].Pool.Name != "gw" {
			t.Fatalf("pools %v, %v; want gw", l, err)
		}
		return l.Msg.Pools[0].Pool.Policy
	}
	if p := policy(); p.CapacityPerMember != 10 || p.MaxSize != 8 {
		t.Fatalf("created from config: %v; want capacity 10, max 8", p)
	}
	if _, err := admin.PutTenantPool(ctx, connect.NewRequest(&v1.PutTenantPoolRequest{Pool: &v1.TenantPool{Name: "gw", Policy: &v1.TenantPoolPolicy{CapacityPerMember: 20}}})); err != nil {
		t.Fatal(err)
	}
	if p := policy(); p.CapacityPerMember != 20 || p.MaxSize != 0 {
		t.Fatalf("after PutTenantPool: %v; want capacity 20, no max", p)
	}
	srv.Restart()
	if p := policy(); p.CapacityPerMember != 10 || p.MaxSize != 8 {
		t.Fatalf("after a restart: %v; want the config's capacity 10, max 8 again", p)
	}
}

// TestTenantPoolBookkeepingDeferred: a change a reader cannot see (a
// shrink's cooldown starting) is not written at once, but within
// tenantPoolBookkeepingFlush (10 s), and the cooldown then runs as stored.
func TestTenantPoolBookkeepingDeferred(t *testing.T) {
	e, _, l, _, load := sizedTenantAt50(t)
	// Load drops: the wanted size falls (the cooldown starts), a change
	// only of bookkeeping. Rounds without a visible change write nothing
	// for a while, then the bookkeeping at most 10 s later.
	before := l.srv.LastTenantPoolWrite("gw")
	var wrote []time.Duration
	start := e.clk.Now()
	for range 20 {
		load(10)
		if w := l.srv.LastTenantPoolWrite("gw"); w.Round.After(before.Round) {
			if w.Version != before.Version {
				t.Fatalf("write %+v changed the version %d: the drop is not visible before the cooldown", w, before.Version)
			}
			wrote = append(wrote, w.Round.Sub(start))
			before = w
		}
	}
	// The rate falls below 40/s (wanted 4) about 3 s into the 12 s
	// window, so the first write comes 10 s after that.
	if len(wrote) == 0 || len(wrote) > 2 || wrote[0] < 10*time.Second || wrote[0] > 15*time.Second {
		t.Fatalf("bookkeeping writes at %v after the drop; want one or two, the first 10 s after the cooldown started, not one at every round", wrote)
	}
}

// TestTenantPoolDeferredThenVisible: a tenant whose bookkeeping waits to
// be stored and then changes visibly is written at once, bookkeeping and
// all: readers see the change with its version.
func TestTenantPoolDeferredThenVisible(t *testing.T) {
	e, r, _, p, load := sizedTenantAt50(t)
	for range 5 { // the rate falls below 40/s: the cooldown starts, deferred
		load(10)
	}
	p.Policy.Overrides = map[string]*v1.TenantOverride{"t": {Size: 2}}
	e.putPool(r, p)
	// The leader's round takes the new policy once its view has it; the
	// bookkeeping flush is 8 s away, so 5 rounds tell the fix apart.
	var s *v1.TenantStatus
	for range 5 {
		load(10)
		if s = e.tenant(r, "gw", "t"); s.Assignment.Size == 2 {
			break
		}
	}
	if s.Assignment.Size != 2 || len(subset(s.Assignment)) != 2 {
		t.Fatalf("after the override: %v; want size 2 with 2 members, as published", s.Assignment)
	}
}

// sizedTenantAt50 starts a pool of 8 members (shrink cooldown 1 m) whose
// tenant "t" has reported 50 requests/s past the leader's first window,
// sized 5; load reports n requests for "t" and steps a round.
func sizedTenantAt50(t *testing.T) (e *tpEnv, r, l *tpReplica, p *v1.TenantPool, load func(n int64)) {
	t.Helper()
	e = newTPEnv(t, 1)
	r = e.rs[0]
	l = e.leader()
	p = basicPool("gw")
	p.Policy.ShrinkCooldown = durationpb.New(time.Minute)
	e.putPool(r, p)
	for i := range 8 {
		e.join(r, "gw", fmt.Sprintf("m%d", i), "")
	}
	e.step(l, 12*time.Second) // the leader's first window
	seq := uint64(0)
	load = func(n int64) {
		seq++
		e.report(r, "gw", "c1", seq, map[string]int64{"t": n})
		e.step(l, time.Second)
	}
	for range 14 {
		load(50)
	}
	if s := e.tenant(r, "gw", "t"); s.Assignment.Size != 5 {
		t.Fatalf("size %d; want 5", s.Assignment.Size)
	}
	return e, r, l, p, load
}
