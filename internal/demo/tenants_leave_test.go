package demo

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/internal/kitseam"
	"github.com/keyshard/keyshard/internal/server"
	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/keyshardtest"
)

// TestTenantsGatewayAnswersUntilDrained: a gateway that leaves keeps
// answering reads of its tenants for as long as its Leave drains it, which
// is past the lookback after the call (the member leaves the subsets at
// the leader's next round, and is read for the lookback from then on), and
// answers nothing once Leave returned; no read the demo sends meanwhile
// goes to a gateway that does not serve its tenant. On a fake clock,
// stepped a second (one leader round) at a time.
func TestTenantsGatewayAnswersUntilDrained(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a deadline for failing, never a pace
	defer cancel()
	// An etcd of the test's own, so that it reads what the leader
	// published straight from the store.
	emb, err := store.StartEmbedded(ctx, store.EmbeddedConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Close) // after the server's cleanup, registered below
	st, err := store.Open(ctx, store.Config{Endpoints: emb.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := keyshardtest.NewFakeClock(time.Date(2026, 5, 6, 7, 0, 0, 0, time.UTC))
	srv := keyshardtest.NewServer(t, keyshardtest.Options{Clock: clk, ElectionTTL: 30 * time.Second,
		Internal: &kitseam.Options{Config: func(c *server.Config) { c.Etcd = server.EtcdConfig{Endpoints: emb.Endpoints()} }}})
	if err := srv.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	cl, err := client.Dial(srv.URL(), client.Clock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const w = 2 * time.Second // window, lookback and warm-up
	if _, err := cl.Admin().PutTenantPool(ctx, client.TenantPool{
		Name: tpPool, LeaseTTL: 5 * time.Minute, // etcd's lease, on the real clock
		Policy: client.TenantPoolPolicy{CapacityPerMember: tpCapacity, Headroom: 1, ShrinkCooldown: 2 * w, Window: w, Lookback: w, WarmUp: w},
	}); err != nil {
		t.Fatal(err)
	}
	d := &tenantsDemo{
		opts: TenantsOptions{Out: io.Discard}, clock: clk, start: time.Now(), window: w, cl: cl,
		gateways: map[string]*gateway{}, versions: map[uint64]*versionRecord{},
	}
	gctx, stopGateways := context.WithCancel(ctx)
	var gwg sync.WaitGroup
	defer func() { stopGateways(); gwg.Wait(); d.closeGateways() }()
	if err := d.join(ctx, gctx, &gwg, 0, 3); err != nil {
		t.Fatal(err)
	}
	f, err := cl.FollowPool(ctx, tpPool)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := cl.NewLoadReporter(tpPool, "client-0", client.ReportInterval(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	// step advances the clock by d and, on a whole second, waits for the
	// leader's round then.
	step := func(d time.Duration) {
		t.Helper()
		clk.Advance(d)
		if clk.Now().Truncate(time.Second).Equal(clk.Now()) {
			if err := srv.WaitTenantPoolRound(ctx, clk.Now()); err != nil {
				t.Fatalf("no round at %v: %v", clk.Now(), err)
			}
		}
	}
	// synced waits for the client's follower and every gateway's that
	// runs to hold the version the leader published.
	synced := func() uint64 {
		t.Helper()
		pub, _, _, err := st.LoadTenantState(ctx, tpPool)
		if err != nil {
			t.Fatal(err)
		}
		fs := []*client.PoolFollower{f}
		for i := range 3 {
			if g := d.gateway(memberID(i)); !g.isGone() {
				fs = append(fs, g.m.Follower())
			}
		}
		for _, f := range fs {
			// A follower closed meanwhile is the leaver's, at the end of
			// its Leave.
			if err := f.WaitVersion(ctx, pub.Version); err != nil && !errors.Is(err, client.ErrClosed) {
				t.Fatal(err)
			}
		}
		return pub.Version
	}
	const tenant = "tenant-000"
	known := false
	for range 20 {
		if err := r.Add(tenant, 5); err != nil {
			t.Fatal(err)
		}
		step(time.Second)
		synced()
		if known = f.Known(tenant) && len(f.Targets(tenant)) == 1; known {
			break
		}
	}
	if !known {
		t.Fatalf("%s not sized to 1 member after 20 rounds: targets %v", tenant, f.Targets(tenant))
	}
	leaver := d.gateway(f.Targets(tenant)[0])
	res := make(chan error, 1)
	go func() { res <- leaver.leave(ctx) }() // returns when drained, or at ctx's end
	leftAt := clk.Now()
	select { // the control plane took the Leave: the next round drains it
	case <-leaver.draining:
	case err := <-res:
		t.Fatalf("Leave returned %v before draining", err)
	}

	rng := rand.New(rand.NewPCG(1, 2))
	checkReads := func(v uint64) {
		t.Helper()
		for _, m := range f.Targets(tenant) {
			if !d.gateway(m).serves(tenant) {
				t.Fatalf("at %v after the Leave call, version %d: the client reads %s from %s (targets %v), which does not answer for it",
					clk.Now().Sub(leftAt), v, tenant, m, f.Targets(tenant))
			}
		}
		for range 20 {
			d.read(f, tenant, rng)
		}
		if n := d.nonServing.Load(); n != 0 {
			t.Fatalf("%d reads to non-serving members: %v", n, d.noted)
		}
	}
	var readPastLookback bool // the leaver was read later than the lookback after the Leave call
	// Half a second at a time, so that reads land between the lookback
	// after the Leave call and the lookback after the round that drained
	// the member.
drain:
	for i := 0; ; i++ {
		if i == 40 {
			t.Fatalf("Leave did not return after 20 rounds; %s still serves %v in the client's snapshot at version %d", leaver.id, f.Tenants(leaver.id), f.Version())
		}
		select {
		case err := <-res:
			if err != nil {
				t.Fatalf("Leave: %v", err)
			}
		default:
			if err := r.Add(tenant, 5); err != nil {
				t.Fatal(err)
			}
			step(time.Second / 2)
			v := synced()
			if clk.Since(leftAt) > w && slices.Contains(f.Targets(tenant), leaver.id) {
				readPastLookback = true
			}
			checkReads(v)
			if !slices.Contains(f.Tenants(leaver.id), tenant) {
				// Drained in the snapshot: Leave returns once it has ended
				// the session, on real time (the follower's notice and one
				// call), whatever the fake clock does.
				select {
				case err := <-res:
					if err != nil {
						t.Fatalf("Leave: %v", err)
					}
				case <-time.After(30 * time.Second):
					t.Fatal("Leave did not return 30 s after the snapshot drained the member")
				}
				break drain
			}
			continue
		}
		break
	}
	if !readPastLookback {
		t.Fatalf("the client never read %s later than the lookback after its Leave call: the test did not cover the drain", leaver.id)
	}
	v := synced()
	if slices.Contains(f.Targets(tenant), leaver.id) {
		t.Fatalf("after Leave returned, version %d: targets %v; want no %s", v, f.Targets(tenant), leaver.id)
	}
	checkReads(v)
	// Its process lingers for a client a version behind, then ends.
	if !leaver.serves(tenant) {
		t.Fatalf("%s stopped answering for %s at the end of its drain; want %v later", leaver.id, tenant, tpLinger)
	}
	clk.Advance(tpLinger)
	if leaver.serves(tenant) {
		t.Fatalf("%s answers for %s %v after its drain", leaver.id, tenant, tpLinger)
	}
}
