package keyshardtest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/keyshardtest"
)

const (
	adminToken  = "admin-token-0123456789"
	memberToken = "member-token-0123456789"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// nopHandler holds whatever it is granted.
type nopHandler struct{}

func (nopHandler) Acquire(context.Context, client.Grant) error { return nil }
func (nopHandler) Release(context.Context, int) error          { return nil }

// events records a worker's events for a test to wait on.
type events struct {
	mu      sync.Mutex
	seen    map[client.EventKind]int
	changed chan struct{}
}

func newEvents() *events {
	return &events{seen: map[client.EventKind]int{}, changed: make(chan struct{})}
}

func (e *events) record(ev client.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seen[ev.Kind]++
	close(e.changed)
	e.changed = make(chan struct{})
}

// wait returns once the worker has had n events of kind.
func (e *events) wait(t *testing.T, ctx context.Context, kind client.EventKind, n int) {
	t.Helper()
	for {
		e.mu.Lock()
		got, changed := e.seen[kind], e.changed
		e.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("the worker had %d %v events, want %d: %v", got, kind, n, ctx.Err())
		}
	}
}

// startWorker runs a worker of "rooms" as member id until the test ends.
func startWorker(t *testing.T, ts *keyshardtest.Server, id string, ev *events) *client.Worker {
	t.Helper()
	w, err := client.NewWorker(ts.Client(client.Token(memberToken)), "rooms", client.Member{ID: id, Address: id + ":1"}, nopHandler{}, client.OnEvent(ev.record))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { // exits when the worker is closed or stop is called
		defer close(done)
		w.Run(ctx)
	}()
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		w.Close(cctx)
		stop()
		<-done
	})
	return w
}

// waitOwner follows the map of "rooms" until member id owns every bucket,
// and returns that map.
func waitOwner(t *testing.T, ctx context.Context, ts *keyshardtest.Server, id string) *keyshardv1.Map {
	t.Helper()
	for epoch := uint64(0); ; {
		m, err := ts.WaitEpoch(ctx, "rooms", epoch)
		if err != nil {
			t.Fatalf("waiting for %s to own rooms: %v", id, err)
		}
		if len(m.GetMembers()) == 1 && m.GetMembers()[0].GetId() == id && !slices.Contains(m.GetOwners(), 0) {
			return m
		}
		epoch = m.GetEpoch() + 1
	}
}

// TestRestartKeepsState: a keyspace created from Options survives a stop
// and a restart; a worker that lost its session while the server was
// down joins again and is granted every bucket.
func TestRestartKeepsState(t *testing.T) {
	ctx := testCtx(t)
	ts := keyshardtest.NewServer(t, keyshardtest.Options{
		Keyspaces:  []client.KeyspaceConfig{{Name: "rooms", Buckets: 16, LeaseTTL: 2 * time.Second}},
		AdminToken: adminToken, MemberToken: memberToken,
	})
	url := ts.URL()
	ev := newEvents()
	w := startWorker(t, ts, "w1", ev)
	before := waitOwner(t, ctx, ts, "w1")
	ev.wait(t, ctx, client.EventAcquired, 16)

	ts.Stop()
	ev.wait(t, ctx, client.EventFenced, 1) // its lease ran out with the server down
	ts.Restart()
	if ts.URL() != url {
		t.Fatalf("the restarted server is at %s, was at %s", ts.URL(), url)
	}
	k, err := ts.Client().Admin().GetKeyspace(ctx, "rooms")
	if err != nil || k.Buckets != 16 || k.LeaseTTL != 2*time.Second {
		t.Fatalf("keyspace after a restart: %+v, %v", k, err)
	}
	ev.wait(t, ctx, client.EventRejoined, 1)
	m := waitOwner(t, ctx, ts, "w1")
	if m.GetEpoch() < before.GetEpoch() {
		t.Fatalf("epoch %d after the restart, %d before", m.GetEpoch(), before.GetEpoch())
	}
	ev.wait(t, ctx, client.EventAcquired, 32) // every bucket once more
	if g, err := w.Owns([]byte("room-1")); err != nil {
		t.Fatalf("room-1 after the worker re-joined: %v %v", g, err)
	}
	if n := len(w.Held()); n != 16 {
		t.Errorf("the worker holds %d buckets, want 16", n)
	}
}

// TestWaitEpoch: WaitEpoch returns the map once it reaches the epoch, not
// before, and returns ctx's error when ctx ends first.
func TestWaitEpoch(t *testing.T) {
	ctx := testCtx(t)
	ts := keyshardtest.NewServer(t, keyshardtest.Options{
		Keyspaces:  []client.KeyspaceConfig{{Name: "rooms", Buckets: 8}},
		AdminToken: adminToken, MemberToken: memberToken,
	})
	created, err := ts.WaitEpoch(ctx, "rooms", 0)
	if err != nil || len(created.GetMembers()) != 0 {
		t.Fatalf("the map before anyone joined: %v, %v", created, err)
	}

	// The next epoch is the first with a member; WaitEpoch returns it,
	// not the current map, once w1 has joined.
	got := make(chan error, 1)
	var next *keyshardv1.Map
	go func() { // exits once the map passes the created one
		var err error
		next, err = ts.WaitEpoch(ctx, "rooms", created.GetEpoch()+1)
		got <- err
	}()
	startWorker(t, ts, "w1", newEvents())
	err = <-got
	t.Logf("created at epoch %d, w1 joined at epoch %d", created.GetEpoch(), next.GetEpoch())
	if err != nil || next.GetEpoch() <= created.GetEpoch() || len(next.GetMembers()) != 1 || next.GetMembers()[0].GetId() != "w1" {
		t.Fatalf("WaitEpoch(%d): %v, %v; want a later epoch naming w1", created.GetEpoch()+1, next, err)
	}

	cctx, cancel := context.WithCancel(ctx)
	go func() { // exits when cancel is called
		_, err := ts.WaitEpoch(cctx, "rooms", next.GetEpoch()+100)
		got <- err
	}()
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitEpoch with ctx cancelled: %v, want context.Canceled", err)
	}

	_, err = ts.WaitEpoch(ctx, "nope", 1)
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("WaitEpoch of a keyspace that does not exist: %v, want not_found", err)
	}
}

// TestWaitHotKeyRound: on a fake clock, the leader's hot-key round runs
// when the test advances the clock a second, and WaitHotKeyRound returns
// once it has; a round that has not run leaves it waiting until ctx ends.
func TestWaitHotKeyRound(t *testing.T) {
	ctx := testCtx(t)
	clk := keyshardtest.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	ts := keyshardtest.NewServer(t, keyshardtest.Options{Clock: clk, HotKeyPools: []client.HotKeyPool{{Name: "ingest", Threshold: 100}}})
	if err := ts.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	if err := ts.WaitHotKeyRound(ctx, clk.Now()); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := ts.WaitHotKeyRound(cctx, clk.Now().Add(time.Second)); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitHotKeyRound of a round not run yet: %v, want context.Canceled", err)
	}
}

// TestReplicas: two replicas share an etcd; one leads, and when it stops
// the other takes over.
func TestReplicas(t *testing.T) {
	ctx := testCtx(t)
	rs := keyshardtest.NewReplicas(t, 2, keyshardtest.Options{Keyspaces: []client.KeyspaceConfig{{Name: "rooms", Buckets: 8}}})
	won := make(chan int, len(rs))
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i, r := range rs {
		go func() { // exits when r leads or wctx ends
			if r.WaitLeading(wctx) == nil {
				won <- i
			}
		}()
	}
	leader := <-won
	other := rs[1-leader]
	st, err := other.Client().Admin().Status(ctx)
	if want := fmt.Sprintf("r%d", leader+1); err != nil || st.Leader != want || st.Replica == want {
		t.Fatalf("status of the other replica: %+v, %v; want %s leading", st, err, want)
	}
	rs[leader].Stop()
	if err := other.WaitLeading(ctx); err != nil {
		t.Fatalf("the other replica did not take over: %v", err)
	}
	if _, err := other.WaitEpoch(ctx, "rooms", 0); err != nil {
		t.Fatal(err)
	}
}

// TestStartAndClose: a Server from Start closes once, and cannot restart
// afterwards.
func TestStartAndClose(t *testing.T) {
	ctx := testCtx(t)
	s, err := keyshardtest.Start(ctx, keyshardtest.Options{HotKeyPools: []client.HotKeyPool{{Name: "ingest", Threshold: 100}}})
	if err != nil {
		t.Fatal(err)
	}
	pools, err := s.Client().Admin().ListHotKeyPools(ctx)
	if err != nil || len(pools) != 1 || pools[0].Name != "ingest" || pools[0].LowThreshold != 50 {
		t.Fatalf("pools: %+v, %v", pools, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
	if err := s.Restart(); !errors.Is(err, keyshardtest.ErrClosed) {
		t.Fatalf("Restart after Close: %v, want ErrClosed", err)
	}
}

// TestBadOptions: every bad option is refused, naming its field.
func TestBadOptions(t *testing.T) {
	ks := func(k client.KeyspaceConfig) []client.KeyspaceConfig {
		return []client.KeyspaceConfig{{Name: "ok"}, k}
	}
	for _, tc := range []struct {
		opts keyshardtest.Options
		want string
	}{
		{keyshardtest.Options{Keyspaces: ks(client.KeyspaceConfig{Name: "x", Buckets: 70000})}, "Options.Keyspaces[1].Buckets: 70000 is out of range"},
		{keyshardtest.Options{Keyspaces: ks(client.KeyspaceConfig{Name: "x", LeaseTTL: 500 * time.Millisecond})}, "Options.Keyspaces[1].LeaseTTL: 500ms"},
		{keyshardtest.Options{Keyspaces: ks(client.KeyspaceConfig{Name: "bad name"})}, "Options.Keyspaces[1].Name:"},
		{keyshardtest.Options{Keyspaces: ks(client.KeyspaceConfig{Name: "ok"})}, `Options.Keyspaces[1].Name: "ok" is there twice`},
		{keyshardtest.Options{Keyspaces: ks(client.KeyspaceConfig{Name: "x", Mode: "nope"})}, `Options.Keyspaces[1].Mode: "nope" is unknown; use "exclusive" or "stream"`},
		{keyshardtest.Options{HotKeyPools: []client.HotKeyPool{{Name: "ingest"}}}, "Options.HotKeyPools[0].Threshold: 0; want a number > 0"},
		{keyshardtest.Options{HotKeyPools: []client.HotKeyPool{{Name: "ingest", Threshold: 10, MaxKeys: -1}}}, "Options.HotKeyPools[0].MaxKeys: -1"},
		{keyshardtest.Options{AdminToken: "short"}, "Options.AdminToken: 5 characters; use at least 16"},
		{keyshardtest.Options{MemberToken: "short"}, "Options.MemberToken: 5 characters"},
		{keyshardtest.Options{ElectionTTL: 1500 * time.Millisecond}, "Options.ElectionTTL: 1.5s; want whole seconds from 2s to 1m0s"},
	} {
		s, err := keyshardtest.Start(context.Background(), tc.opts)
		if err == nil {
			s.Close()
			t.Errorf("%+v started; want %q", tc.opts, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "keyshardtest: ") {
			t.Errorf("error %q; want it to contain %q", err, tc.want)
		}
	}
}
