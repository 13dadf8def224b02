package e2e_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/internal/tenantpool"
	"github.com/keyshard/keyshard/keyshardtest"
)

// TestTenantPoolTwoReplicas runs two keyshard serve replicas, with the
// SDK dialed to the one that does not lead:
//   - its PoolFollower holds every version the leader publishes;
//   - load reports sent to it are forwarded to the leader and counted
//     once: a report retried with its seq is REPLAYED, and its tenant's
//     rate, through either replica, is that of a report sent once;
//   - the leader stops: the other takes over and keeps every size and
//     subset (it holds them for its first window, then measures the same
//     load), and the follower keeps answering, never stale;
//   - no replica answers: the follower answers from its last snapshot and
//     Stale says since when; a replica back, it recovers (PoolRecovered).
func TestTenantPoolTwoReplicas(t *testing.T) {
	e := newTPEnv(t, 2)
	l := e.leader()
	o := e.rs[0]
	if o == l {
		o = e.rs[1]
	}
	e.putPool(l, &keyshardv1.TenantPool{Name: "gw", Policy: &keyshardv1.TenantPoolPolicy{
		CapacityPerMember: 10, Window: durationpb.New(2 * time.Second), ShrinkCooldown: durationpb.New(10 * time.Minute),
	}})
	for i := range 6 {
		e.rawMember(o, "gw", fmt.Sprintf("m%d", i), "")
	}
	e.stepUntilState(l, "gw", "six members placed", 20, func(st tenantpool.State) bool { return len(st.Members) == 6 })

	events := make(chan client.PoolEvent, 100)
	c := e.sdk(o)
	f, err := c.FollowPool(e.ctx, "gw", client.OnPoolEvent(func(ev client.PoolEvent) {
		if ev.Kind != client.PoolUpdated {
			events <- ev
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := c.NewLoadReporter("gw", "c1", client.ReportInterval(time.Hour)) // Flush sends
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// Tenant tK gets 20·(K+1) requests a second: sizes 2 to 6; from the
	// fourth second on t0 gets twice as many (size 4), so that a second
	// version follows the first. Each Flush reports the second before it
	// (its period), so the clock moves a second before the first.
	e.step(l)
	load := func(i int) {
		t.Helper()
		for k := range 5 {
			n := int64(20 * (k + 1))
			if k == 0 && i >= 3 {
				n *= 2
			}
			mustAdd(t, r, fmt.Sprintf("t%d", k), n)
		}
		if err := r.Flush(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Every version reaches the follower of the replica that does not
	// lead, and it answers as the core's snapshot of it.
	var st tenantpool.State
	versions := 0
	for i := range 6 {
		load(i)
		e.step(l)
		if cur := e.state("gw"); cur.Version != st.Version {
			st = cur
			versions++
			if err := f.WaitVersion(e.ctx, st.Version); err != nil {
				t.Fatal(err)
			}
			compareFollower(t, "follower of the other replica", f, st, []string{"u1", "u2"}, e.clk.Now())
		}
	}
	sizes := tenantSizes(st)
	if versions < 2 || !slices.Equal(sizes, []int{4, 4, 6, 6, 6}) {
		t.Fatalf("%d versions; sizes %v; want t0..t4 at 4, 4, 6, 6, 6 members", versions, sizes)
	}
	if s := r.Stats(); s.Reports != 6 || s.Replayed != 0 || s.Failures != 0 {
		t.Fatalf("reporter stats %+v; want 6 reports taken, none failed", s)
	}

	// A report retried with its seq, through the replica that does not
	// lead: REPLAYED, counted once.
	report := func(seq uint64, tenant string) keyshardv1.ReportOutcome {
		t.Helper()
		resp, err := e.api(o).ReportLoad(e.ctx, connect.NewRequest(&keyshardv1.ReportLoadRequest{Pool: "gw", Reporter: "raw", Seq: seq,
			Counts: []*keyshardv1.TenantCount{{Tenant: tenant, Count: 40}}}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.GetOutcome()
	}
	if got := report(1, "x"); got != keyshardv1.ReportOutcome_REPORT_OUTCOME_COUNTED {
		t.Fatalf("report 1: %v", got)
	}
	if got := report(1, "x"); got != keyshardv1.ReportOutcome_REPORT_OUTCOME_REPLAYED {
		t.Fatalf("report 1 again: %v; want REPLAYED", got)
	}
	if got := report(2, "y"); got != keyshardv1.ReportOutcome_REPORT_OUTCOME_COUNTED {
		t.Fatalf("report 2: %v", got)
	}
	// The bucket of the reports is complete, and past the buckets the
	// leader leaves out for reporters that give a period (c1's, 1 s).
	e.step(l)
	e.step(l)
	for _, rep := range []*keyshardtest.Server{o, l} {
		rates := e.rates(rep, "x", "y")
		if rates["x"] <= 0 || rates["x"] != rates["y"] {
			t.Fatalf("rates %v through %s; want x (reported twice with one seq) at the rate of y (reported once)", rates, rep.URL())
		}
	}

	// The leader stops: the other takes over, holds every size for its
	// first window, then measures the same load and keeps them.
	before := st
	if err := l.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := o.WaitLeading(e.ctx); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		load(5) // the same load as before the takeover
		e.step(o)
	}
	st = e.state("gw")
	if !slices.Equal(tenantSizes(st), sizes) {
		t.Fatalf("sizes %v after the takeover; want %v", tenantSizes(st), sizes)
	}
	for tn, ts := range before.Tenants {
		if got := st.Tenants[tn]; !slices.Equal(got.Members, ts.Members) || len(got.Removed) != 0 {
			t.Fatalf("%s after the takeover: %+v; want the subset %+v unchanged", tn, got, ts.Members)
		}
	}
	if err := f.WaitVersion(e.ctx, st.Version); err != nil {
		t.Fatal(err)
	}
	compareFollower(t, "follower after the takeover", f, st, []string{"u1"}, e.clk.Now())
	if since, err := f.Stale(); !since.IsZero() {
		t.Fatalf("follower stale since %v (%v) though its replica never stopped", since, err)
	}
	select {
	case ev := <-events:
		t.Fatalf("event %+v; the follower's replica never stopped", ev)
	default:
	}

	// No replica answers: the follower answers from its last snapshot
	// and says since when.
	if err := o.Stop(); err != nil {
		t.Fatal(err)
	}
	lost := e.clk.Now()
	if ev := recvEvent(t, e.ctx, events); ev.Kind != client.PoolStale || ev.Version != st.Version || ev.Err == nil {
		t.Fatalf("event %+v; want PoolStale at version %d", ev, st.Version)
	}
	since, serr := f.Stale()
	if !since.Equal(lost) || serr == nil {
		t.Fatalf("Stale() = %v, %v; want since %v with the failure", since, serr, lost)
	}
	compareFollower(t, "stale follower", f, st, []string{"u1"}, e.clk.Now())

	// Its replica back (and leading): the follower reconnects (after its
	// backoff, on the clock) and is not stale any more.
	if err := o.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := o.WaitLeading(e.ctx); err != nil {
		t.Fatal(err)
	}
	var ev client.PoolEvent
	e.stepUntil(o, "the follower recovered", 60, func() bool {
		select {
		case ev = <-events:
			return true
		default:
			return false
		}
	})
	if ev.Kind != client.PoolRecovered {
		t.Fatalf("event %+v; want PoolRecovered", ev)
	}
	if since, err := f.Stale(); !since.IsZero() {
		t.Fatalf("Stale() = %v, %v after recovering; want zero", since, err)
	}
	if got := e.state("gw"); !slices.Equal(tenantSizes(got), sizes) {
		t.Fatalf("sizes %v after the restart; want %v", tenantSizes(got), sizes)
	}
}

// tenantSizes returns the sizes of tenants t0..t4.
func tenantSizes(st tenantpool.State) []int {
	var out []int
	for k := range 5 {
		out = append(out, st.Tenants[fmt.Sprintf("t%d", k)].Size.Size)
	}
	return out
}

// rates returns the leader's rates of tenants, asked through replica r.
func (e *tpEnv) rates(r *keyshardtest.Server, tenants ...string) map[string]float64 {
	e.t.Helper()
	resp, err := e.api(r).GetTenants(e.ctx, connect.NewRequest(&keyshardv1.GetTenantsRequest{Pool: "gw", Tenants: tenants}))
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]float64{}
	for _, s := range resp.Msg.GetTenants() {
		if !s.GetRateKnown() {
			e.t.Fatalf("the rate of %s is not known through %s", s.GetAssignment().GetTenant(), r.URL())
		}
		out[s.GetAssignment().GetTenant()] = s.GetRate()
	}
	return out
}

func recvEvent(t *testing.T, ctx context.Context, events <-chan client.PoolEvent) client.PoolEvent {
	t.Helper()
	select {
	case ev := <-events:
		return ev
	case <-ctx.Done():
		t.Fatal("no event")
	}
	panic("unreachable")
}
