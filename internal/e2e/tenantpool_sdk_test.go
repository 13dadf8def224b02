package e2e_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/internal/tenantpool"
)

// TestTenantPoolSDKMatchesCore runs the Go SDK against a real keyshard
// serve: nine PoolMembers in three zones, three LoadReporters reporting
// heavy-tailed counts for 10,000 tenants, a client's PoolFollower and each
// member's. Once the leader has sized every tenant, every follower holds
// the published version, and for each of the 10,000 tenants, and for
// tenants never reported (the stateless fallback, overrides included),
// its Targets, Serves and Tenants are those of tenantpool.NewSnapshot of
// the state the leader stored.
func TestTenantPoolSDKMatchesCore(t *testing.T) {
	if testing.Short() {
		t.Skip("sizes 10,000 tenants on a real keyshard serve")
	}
	const (
		tenants   = 10_000
		reporters = 3
	)
	start := time.Now()
	e := newTPEnv(t, 1)
	l := e.leader()
	e.putPool(l, &keyshardv1.TenantPool{Name: "gw", Policy: &keyshardv1.TenantPoolPolicy{
		CapacityPerMember: 10, Window: durationpb.New(10 * time.Second), ShrinkCooldown: durationpb.New(10 * time.Minute),
		ZoneAware: true, Lookback: durationpb.New(time.Minute),
		Overrides: map[string]*keyshardv1.TenantOverride{
			"t00042": {Size: 2}, "t00001": {MaxSize: 6}, "u7": {MinSize: 4}, "u8": {Size: 5},
		},
	}})

	var members []*client.PoolMember
	for i := range 9 {
		m, err := e.sdk(l).JoinPool(e.ctx, "gw", client.Member{ID: fmt.Sprintf("m%d", i), Address: fmt.Sprintf("m%d:80", i), Zone: fmt.Sprintf("z%d", i%3)})
		if err != nil {
			t.Fatal(err)
		}
		members = append(members, m)
	}
	e.stepUntilState(l, "gw", "all nine members placed", 20, func(st tenantpool.State) bool { return len(st.Members) == 9 })
	e.pastHold(l, 10*time.Second)

	var reps []*client.LoadReporter
	for j := range reporters {
		// Reports go at Flush: the interval never passes on the clock.
		r, err := e.sdk(l).NewLoadReporter("gw", fmt.Sprintf("c%d", j), client.ReportInterval(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		reps = append(reps, r)
	}
	// Heavy-tailed: tenant i gets about 4000/(i+1) requests; the 30
	// heaviest are spread over every reporter (the leader sums them),
	// the others come from one.
	for i := range tenants {
		tn := fmt.Sprintf("t%05d", i)
		n := max(int64(4000/(i+1)), 1)
		if i < 30 {
			for _, r := range reps {
				mustAdd(t, r, tn, n/reporters+1)
			}
			continue
		}
		mustAdd(t, reps[i%reporters], tn, n)
	}
	// Flush sends what was added and returns once the leader has counted
	// it: the next round sizes every tenant.
	for _, r := range reps {
		if err := r.Flush(e.ctx); err != nil {
			t.Fatal(err)
		}
		if s := r.Stats(); s.Reports == 0 || s.Pending != 0 || s.DroppedReports != 0 || s.Replayed != 0 {
			t.Fatalf("reporter stats %+v; want every count reported once", s)
		}
	}
	e.step(l)
	st := e.state("gw")
	if len(st.Tenants) != tenants {
		t.Fatalf("%d tenants sized after every count was reported; want %d", len(st.Tenants), tenants)
	}
	t.Logf("sized after %v", time.Since(start))
	sizes := map[int]int{}
	for _, ts := range st.Tenants {
		sizes[ts.Size.Size]++
	}
	t.Logf("version %d: tenants by size %v", st.Version, sizes)
	if sizes[3] == 0 || sizes[6] == 0 || sizes[9] == 0 || sizes[2] != 1 || sizes[5] != 0 {
		t.Fatalf("sizes %v; want tenants of 3, 6 and 9 members, and the fixed size 2 of one", sizes)
	}
	if got := st.Tenants["t00001"].Size.Size; got != 6 {
		t.Fatalf("t00001 (max_size 6) has size %d", got)
	}

	// The clock stands still: no more rounds, st is the last version.
	cf, err := e.sdk(l).FollowPool(e.ctx, "gw")
	if err != nil {
		t.Fatal(err)
	}
	defer cf.Close()
	followers := map[string]*client.PoolFollower{"client": cf}
	for i, m := range members {
		followers[fmt.Sprintf("member m%d", i)] = m.Follower()
	}
	var unknown []string
	for i := range 500 {
		unknown = append(unknown, fmt.Sprintf("u%d", i))
	}
	now := e.clk.Now()
	core := tenantpool.NewSnapshot(st)
	for name, f := range followers {
		if err := f.WaitVersion(e.ctx, st.Version); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		compareFollowerCore(t, name, f, st, core, unknown, now, now.Add(2*time.Minute))
		t.Logf("%s compared after %v", name, time.Since(start))
	}
	for i, m := range members {
		id := fmt.Sprintf("m%d", i)
		if got, want := m.Tenants(), cf.Tenants(id); !slices.Equal(got, want) || len(got) == 0 {
			t.Errorf("member %s serves %d tenants; the client's follower says %d", id, len(got), len(want))
		}
	}
}

func mustAdd(t *testing.T, r *client.LoadReporter, tenant string, n int64) {
	t.Helper()
	if err := r.Add(tenant, n); err != nil {
		t.Fatal(err)
	}
}

// TestTenantPoolMarkReadySDK: a member added to a tenant's subset is not
// a read target during the warm-up, until it reports ready through
// PoolMember.MarkReady; it serves (prefetches) the tenant all along.
func TestTenantPoolMarkReadySDK(t *testing.T) {
	e := newTPEnv(t, 1)
	l := e.leader()
	e.putPool(l, &keyshardv1.TenantPool{Name: "gw", Policy: &keyshardv1.TenantPoolPolicy{
		CapacityPerMember: 10, Window: durationpb.New(10 * time.Second), ShrinkCooldown: durationpb.New(10 * time.Minute),
		WarmUp: durationpb.New(time.Hour),
	}})
	members := map[string]*client.PoolMember{}
	for i := range 5 {
		id := fmt.Sprintf("m%d", i)
		m, err := e.sdk(l).JoinPool(e.ctx, "gw", client.Member{ID: id, Address: id + ":80"})
		if err != nil {
			t.Fatal(err)
		}
		members[id] = m
	}
	e.stepUntilState(l, "gw", "all five members placed", 20, func(st tenantpool.State) bool { return len(st.Members) == 5 })
	e.pastHold(l, 10*time.Second)
	cf, err := e.sdk(l).FollowPool(e.ctx, "gw")
	if err != nil {
		t.Fatal(err)
	}
	defer cf.Close()

	r, err := e.sdk(l).NewLoadReporter("gw", "c1", client.ReportInterval(time.Hour)) // Flush sends
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	report := func(n int64) {
		mustAdd(t, r, "t", n)
		if err := r.Flush(e.ctx); err != nil {
			t.Fatal(err)
		}
		e.step(l)
	}
	report(5)
	first := e.state("gw")
	if len(first.Tenants["t"].Members) != 1 {
		t.Fatalf("t at 5 requests: %+v; want one member", first.Tenants["t"])
	}
	report(300)
	// The report covers the second before it; the leader reads a window
	// less the buckets such a report may not have covered yet (about a
	// report's period): one more step and the 300 are in.
	e.step(l)
	grown := e.state("gw")
	if len(grown.Tenants["t"].Members) < 3 {
		t.Fatalf("t at 300 requests more: %+v; want at least 3 members", grown.Tenants["t"])
	}
	var added []string
	for _, p := range grown.Tenants["t"].Members {
		if p.ID != first.Tenants["t"].Members[0].ID {
			added = append(added, p.ID)
		}
	}
	if err := cf.WaitVersion(e.ctx, grown.Version); err != nil {
		t.Fatal(err)
	}
	now := e.clk.Now()
	if tg := cf.TargetsAt("t", now); !slices.Equal(tg, []string{first.Tenants["t"].Members[0].ID}) {
		t.Fatalf("targets %v before MarkReady; want only the first member", tg)
	}
	for _, id := range added {
		if err := members[id].Follower().WaitVersion(e.ctx, grown.Version); err != nil {
			t.Fatal(err)
		}
		if !members[id].Serves("t") || !slices.Contains(members[id].Tenants(), "t") {
			t.Fatalf("new member %s does not serve t before it is read: it would have nothing to prefetch", id)
		}
	}

	ready, err := members[added[0]].MarkReady(e.ctx, "t", "not-mine")
	if err != nil || ready.Marked != 1 || ready.Ignored != 1 {
		t.Fatalf("MarkReady = %+v, %v; want 1 marked, 1 ignored", ready, err)
	}
	e.step(l)
	st := e.state("gw")
	if st.Version <= grown.Version {
		t.Fatalf("version %d after MarkReady and a round; want above %d", st.Version, grown.Version)
	}
	if err := cf.WaitVersion(e.ctx, st.Version); err != nil {
		t.Fatal(err)
	}
	now = e.clk.Now()
	tg := cf.TargetsAt("t", now)
	if !slices.Contains(tg, added[0]) || slices.Contains(tg, added[1]) {
		t.Fatalf("targets %v %v into a warm-up of 1h; want %s (ready) and not %s", tg, now.Sub(tpT0), added[0], added[1])
	}
	if tg := cf.TargetsAt("t", now.Add(time.Hour)); !slices.Contains(tg, added[1]) {
		t.Fatalf("targets %v after the warm-up lack %s", tg, added[1])
	}
	compareFollower(t, "client", cf, st, nil, now, now.Add(time.Hour))
}
