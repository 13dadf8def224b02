package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/internal/kitseam"
	"github.com/keyshard/keyshard/internal/server"
	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/internal/tenantpool"
	"github.com/keyshard/keyshard/keyshardtest"
)

var tpT0 = time.Date(2026, 5, 6, 7, 0, 0, 0, time.UTC)

// tpEnv runs keyshard serve replicas on one etcd of the test's own, so
// that the test reads what the leader published straight from the
// store, and one fake clock shared by the servers and the SDK: leader
// rounds, report times, long-poll waits, followers' backoffs and
// members' keep-alive intervals move only when the test advances it.
// Sessions are etcd leases, on the real clock: pools get a lease TTL far
// longer than a test runs. The leader renews its election lease on the
// fake clock, though, and stops leading if no renewal was acknowledged
// (by the real etcd) within the TTL on that clock: a test that steps
// fast on a loaded machine could outrun the renewals, and the next step
// would wait for a round forever. The longest TTL, a minute, leaves each
// renewal 20 steps to be answered.
type tpEnv struct {
	t   *testing.T
	ctx context.Context
	clk *keyshardtest.FakeClock
	rs  []*keyshardtest.Server
	st  *store.Store

	mu   sync.Mutex
	srvs map[string]*server.Server // each replica's current run, by URL
}

func newTPEnv(t *testing.T, replicas int) *tpEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a deadline for failing, never a pace
	t.Cleanup(cancel)
	emb, err := store.StartEmbedded(ctx, store.EmbeddedConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Close) // after the replicas' cleanups, registered below
	st, err := store.Open(ctx, store.Config{Endpoints: emb.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &tpEnv{t: t, ctx: ctx, clk: keyshardtest.NewFakeClock(tpT0), st: st, srvs: map[string]*server.Server{}}
	opts := keyshardtest.Options{Clock: e.clk, ElectionTTL: server.MaxElectionTTL,
		Internal: &kitseam.Options{
			Config: func(c *server.Config) { c.Etcd = server.EtcdConfig{Endpoints: emb.Endpoints()} },
			Started: func(srv *server.Server) {
				e.mu.Lock()
				e.srvs["http://"+srv.Addr()] = srv
				e.mu.Unlock()
			},
		}}
	if replicas == 1 {
		e.rs = []*keyshardtest.Server{keyshardtest.NewServer(t, opts)}
	} else {
		// NewReplicas starts an etcd of its own too; the replicas use the
		// test's, which it can read.
		e.rs = keyshardtest.NewReplicas(t, replicas, opts)
	}
	return e
}

// leader returns the replica that leads, once its rounds are armed.
func (e *tpEnv) leader() *keyshardtest.Server {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	won := make(chan *keyshardtest.Server, len(e.rs))
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

// api returns a raw TenantPoolService client of replica r.
func (e *tpEnv) api(r *keyshardtest.Server) keyshardv1connect.TenantPoolServiceClient {
	return keyshardv1connect.NewTenantPoolServiceClient(http.DefaultClient, r.URL())
}

// sdk dials replicas rs with the env's clock.
func (e *tpEnv) sdk(rs ...*keyshardtest.Server) *client.Client {
	e.t.Helper()
	var urls []string
	for _, r := range rs {
		urls = append(urls, r.URL())
	}
	c, err := client.Dial(strings.Join(urls, ","), client.Clock(e.clk))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

// putPool creates the pool through r, the leader, and steps the clock
// through the pool's first window.
func (e *tpEnv) putPool(r *keyshardtest.Server, p *keyshardv1.TenantPool) {
	e.t.Helper()
	if p.LeaseTtl == nil {
		p.LeaseTtl = durationpb.New(5 * time.Minute) // etcd's lease, on the real clock
	}
	if _, err := e.api(r).PutTenantPool(e.ctx, connect.NewRequest(&keyshardv1.PutTenantPoolRequest{Pool: p})); err != nil {
		e.t.Fatal(err)
	}
	// The leader sizes nobody before it has measured the pool for a
	// window (tenantpool.Planner.Hold): let a window pass, so that the
	// tests' reports are sized at the next round.
	window := time.Minute
	if w := p.GetPolicy().GetWindow(); w != nil {
		window = w.AsDuration()
	}
	for range int(window / time.Second) {
		e.step(r)
	}
}

// step advances the clock by a second and waits for the leader's round
// at the new time: what the leader publishes then is in etcd. The round
// reads every write made before step (a member's keep-alive, say): the
// leader's view has applied them before the clock moves.
func (e *tpEnv) step(l *keyshardtest.Server) {
	e.t.Helper()
	e.sync(l)
	e.clk.Advance(time.Second)
	if err := l.WaitTenantPoolRound(e.ctx, e.clk.Now()); err != nil {
		e.t.Fatalf("no tenant-pool round at %v: %v", e.clk.Now().Sub(tpT0), err)
	}
}

// pastHold steps through window, the pool's: a new pool, as a new
// leader, sizes nobody until it has measured a whole window (see
// tenantpool.Planner.Hold).
func (e *tpEnv) pastHold(l *keyshardtest.Server, window time.Duration) {
	e.t.Helper()
	for range window / time.Second {
		e.step(l)
	}
}

// sync waits until replica r's view holds every write in etcd so far.
func (e *tpEnv) sync(r *keyshardtest.Server) {
	e.t.Helper()
	rev, err := e.st.Rev(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	e.mu.Lock()
	srv := e.srvs[r.URL()]
	e.mu.Unlock()
	if srv == nil {
		e.t.Fatalf("no run of replica %s", r.URL())
	}
	if err := srv.WaitViewRev(e.ctx, rev); err != nil {
		e.t.Fatalf("replica %s: view not at etcd revision %d: %v", r.URL(), rev, err)
	}
}

// stepUntil steps until cond holds, at most max times: it waits for
// something the SDK does on its own (a keep-alive, a report) to reach
// the leader, and returns the number of steps.
func (e *tpEnv) stepUntil(l *keyshardtest.Server, what string, max int, cond func() bool) int {
	e.t.Helper()
	for i := range max {
		e.step(l)
		if cond() {
			return i + 1
		}
	}
	e.t.Fatalf("%s: not after %d rounds", what, max)
	panic("unreachable")
}

// stepUntilState steps until cond holds of the state published.
func (e *tpEnv) stepUntilState(l *keyshardtest.Server, pool, what string, max int, cond func(tenantpool.State) bool) tenantpool.State {
	e.t.Helper()
	var st tenantpool.State
	e.stepUntil(l, what, max, func() bool { st = e.state(pool); return cond(st) })
	return st
}

// state returns what the leader has published for pool, read from etcd.
func (e *tpEnv) state(pool string) tenantpool.State {
	e.t.Helper()
	st, _, _, err := e.st.LoadTenantState(e.ctx, pool)
	if err != nil {
		e.t.Fatal(err)
	}
	return st
}

// compareFollower checks that f, at the version of st, gives the answers
// of the core's Snapshot of st, at each of times: Targets of every tenant
// (and of unknown), Serves of every member and Tenants of every member.
func compareFollower(t *testing.T, name string, f *client.PoolFollower, st tenantpool.State, unknown []string, times ...time.Time) {
	t.Helper()
	compareFollowerCore(t, name, f, st, tenantpool.NewSnapshot(st), unknown, times...)
}

// compareFollowerCore is compareFollower with the core's Snapshot of st
// given.
func compareFollowerCore(t *testing.T, name string, f *client.PoolFollower, st tenantpool.State, core *tenantpool.Snapshot, unknown []string, times ...time.Time) {
	t.Helper()
	if f.Version() != st.Version {
		t.Fatalf("%s holds version %d; want %d", name, f.Version(), st.Version)
	}
	var members []string
	for _, m := range st.Members {
		members = append(members, m.ID)
	}
	tenants := append(slices.Sorted(mapKeys(st.Tenants)), unknown...)
	bad := 0
	fail := func(format string, args ...any) {
		bad++
		if bad <= 10 {
			t.Errorf("%s at version %d: %s", name, st.Version, fmt.Sprintf(format, args...))
		}
	}
	for _, tn := range tenants {
		if got, want := f.Known(tn), core.Known(tn); got != want {
			fail("Known(%s) = %v; the core says %v", tn, got, want)
		}
		for _, at := range times {
			if got, want := f.TargetsAt(tn, at), core.Targets(tn, at); !slices.Equal(got, want) {
				fail("TargetsAt(%s, %v) = %v; the core says %v", tn, at.Sub(tpT0), got, want)
			}
		}
		for _, m := range members {
			if got, want := f.Serves(m, tn), core.Serves(m, tn); got != want {
				fail("Serves(%s, %s) = %v; the core says %v", m, tn, got, want)
			}
		}
	}
	for _, m := range members {
		if got, want := f.Tenants(m), core.Tenants(m); !slices.Equal(got, want) {
			fail("Tenants(%s): %d tenants; the core says %d", m, len(got), len(want))
		}
	}
	if bad > 10 {
		t.Errorf("%s: %d differences in all", name, bad)
	}
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
