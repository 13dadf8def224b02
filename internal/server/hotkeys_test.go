package server_test

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/internal/server"
	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/keyshardtest"
)

// bearerToken sets the Authorization header on unary calls and on
// streams (connect.UnaryInterceptorFunc leaves streams alone).
type bearerToken string

func (b bearerToken) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", "Bearer "+string(b))
		return next(ctx, req)
	}
}

func (b bearerToken) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", "Bearer "+string(b))
		return conn
	}
}

func (b bearerToken) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

var hkT0 = time.Date(2026, 5, 6, 7, 0, 0, 0, time.UTC)

// hotEnv drives the hot-key tests: servers sharing one fake clock.
type hotEnv struct {
	t   *testing.T
	ctx context.Context
	clk *keyshardtest.FakeClock
}

func newHotEnv(t *testing.T) *hotEnv {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return &hotEnv{t: t, ctx: ctx, clk: keyshardtest.NewFakeClock(hkT0)}
}

func (e *hotEnv) start(mutate func(*server.Config)) *testServer {
	e.t.Helper()
	return startServerWith(e.t, mutate, e.clk)
}

// leader waits until one of servers leads with its aggregation armed.
func (e *hotEnv) leader(servers ...*testServer) *testServer {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	won := make(chan *testServer, len(servers))
	for _, ts := range servers {
		go func() { // exits when ts leads or ctx ends
			if ts.WaitLeading(ctx) == nil {
				won <- ts
			}
		}()
	}
	select {
	case ts := <-won:
		return ts
	case <-e.ctx.Done():
		e.t.Fatal("no replica leads")
	}
	panic("unreachable")
}

// step advances the clock by a second and waits for the leader's round.
func (e *hotEnv) step(leader *testServer) time.Time {
	e.t.Helper()
	e.clk.Advance(time.Second)
	now := e.clk.Now()
	if err := leader.WaitHotKeyRound(e.ctx, now); err != nil {
		e.t.Fatalf("no aggregation round at %v: %v", now.Sub(hkT0), err)
	}
	return now
}

func (e *hotEnv) putPool(ts *testServer, p *v1.HotKeyPool) *v1.HotKeyPool {
	e.t.Helper()
	r, err := ts.admin.PutHotKeyPool(e.ctx, connect.NewRequest(&v1.PutHotKeyPoolRequest{Pool: p}))
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Msg.Pool
}

// report sends one producer's report of keys (key → rate).
func (e *hotEnv) report(ts *testServer, pool, producer string, keys map[string]float64) *v1.ReportHotKeysResponse {
	e.t.Helper()
	req := &v1.ReportHotKeysRequest{Pool: pool, Producer: producer}
	for k, r := range keys {
		req.Keys = append(req.Keys, &v1.KeyRate{Key: k, Rate: r})
	}
	resp, err := ts.hot.ReportHotKeys(e.ctx, connect.NewRequest(req))
	if err != nil {
		e.t.Fatalf("report of %s: %v", producer, err)
	}
	return resp.Msg
}

// reportAll sends the same report from producers p00..p<n-1>, through
// the servers in turn.
func (e *hotEnv) reportAll(pool string, n int, keys map[string]float64, via ...*testServer) {
	e.t.Helper()
	for i := range n {
		e.report(via[i%len(via)], pool, fmt.Sprintf("p%02d", i), keys)
	}
}

// set reads a pool's overflow set at once.
func (e *hotEnv) set(ts *testServer, pool string) *v1.OverflowSet {
	e.t.Helper()
	r, err := ts.hot.GetOverflowSet(e.ctx, connect.NewRequest(&v1.GetOverflowSetRequest{Pool: pool}))
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Msg.Set
}

func keysOf(s *v1.OverflowSet) []string {
	var out []string
	for _, k := range s.GetKeys() {
		out = append(out, k.Key)
	}
	return out
}

// longPoll starts a GetOverflowSet long poll and returns its answer's
// channel.
func (e *hotEnv) longPoll(ts *testServer, pool string, since uint64) <-chan *v1.GetOverflowSetResponse {
	out := make(chan *v1.GetOverflowSetResponse, 1)
	go func() { // exits when the long poll answers or e.ctx ends
		r, err := ts.hot.GetOverflowSet(e.ctx, connect.NewRequest(&v1.GetOverflowSetRequest{Pool: pool, SinceVersion: since, Wait: durationpb.New(60 * time.Second)}))
		if err != nil {
			e.t.Errorf("long poll: %v", err)
			close(out)
			return
		}
		out <- r.Msg
	}()
	return out
}

func (e *hotEnv) await(ch <-chan *v1.GetOverflowSetResponse) *v1.GetOverflowSetResponse {
	e.t.Helper()
	select {
	case r, ok := <-ch:
		if !ok {
			e.t.Fatal("long poll failed")
		}
		return r
	case <-e.ctx.Done():
		e.t.Fatal("long poll did not answer")
	}
	panic("unreachable")
}

// watch opens a WatchOverflowSet stream; its sets arrive on the channel.
func (e *hotEnv) watch(ts *testServer, pool string, since uint64) <-chan *v1.OverflowSet {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.ctx)
	stream, err := ts.hot.WatchOverflowSet(ctx, connect.NewRequest(&v1.WatchOverflowSetRequest{Pool: pool, SinceVersion: since}))
	if err != nil {
		cancel()
		e.t.Fatal(err)
	}
	out := make(chan *v1.OverflowSet, 16)
	done := make(chan struct{})
	go func() { // exits when the stream ends (cancelled at cleanup)
		defer close(done)
		defer close(out)
		for stream.Receive() {
			out <- stream.Msg()
		}
	}()
	e.t.Cleanup(func() { cancel(); <-done; stream.Close() })
	return out
}

func (e *hotEnv) next(ch <-chan *v1.OverflowSet) *v1.OverflowSet {
	e.t.Helper()
	select {
	case s, ok := <-ch:
		if !ok {
			e.t.Fatal("watch ended")
		}
		return s
	case <-e.ctx.Done():
		e.t.Fatal("watch sent nothing")
	}
	panic("unreachable")
}

// TestHotKeysSpreadOverProducers: 16 producers each see a key at 1/16 of
// the threshold; the sum catches it, a key at 0.95 of it stays out; long
// polls and watches get each new version; the key leaves only once its
// cooldown has run.
func TestHotKeysSpreadOverProducers(t *testing.T) {
	e := newHotEnv(t)
	ts := e.start(nil)
	leader := e.leader(ts)
	pool := e.putPool(ts, &v1.HotKeyPool{Name: "ingest", Threshold: 1600, Cooldown: durationpb.New(10 * time.Second), ReportMaxAge: durationpb.New(5 * time.Second)})
	if pool.LowThreshold != 800 || pool.ReportThreshold != 25 || pool.MaxKeys != 1024 {
		t.Fatalf("pool defaults: %v", pool)
	}
	if s := e.set(ts, "ingest"); s.Version != 0 || len(s.Keys) != 0 || s.Pool != "ingest" {
		t.Fatalf("set before any report: %v", s)
	}
	poll := e.longPoll(ts, "ingest", 0)
	watch := e.watch(ts, "ingest", 0)

	e.reportAll("ingest", 16, map[string]float64{"user:hot": 100, "user:warm": 95}, ts)
	entered := e.step(leader)
	r := e.await(poll)
	if !r.Changed || r.Set.Version != 1 || strings.Join(keysOf(r.Set), ",") != "user:hot" {
		t.Fatalf("long poll: %v", r)
	}
	k := r.Set.Keys[0]
	if k.Rate != 1600 || !k.Since.AsTime().Equal(entered) || k.CoolingSince != nil {
		t.Fatalf("key %v; want rate 1600 since %v", k, entered)
	}
	if s := e.next(watch); s.Version != 1 || strings.Join(keysOf(s), ",") != "user:hot" {
		t.Fatalf("watch: %v", s)
	}
	if rr := e.report(ts, "ingest", "p00", map[string]float64{"user:hot": 100}); rr.Version != 1 || rr.Pool.ReportThreshold != 25 {
		t.Fatalf("report answer: %v", rr)
	}

	// Between the thresholds: stays, without cooling down.
	e.reportAll("ingest", 16, map[string]float64{"user:hot": 60}, ts)
	e.step(leader)
	if s := e.set(ts, "ingest"); s.Version != 1 || len(s.Keys) != 1 || s.Keys[0].CoolingSince != nil {
		t.Fatalf("between the thresholds: %v", s)
	}
	// Below the low threshold: cooling starts, the version stays.
	poll = e.longPoll(ts, "ingest", 1)
	e.reportAll("ingest", 16, map[string]float64{"user:hot": 40}, ts)
	cooling := e.step(leader)
	s := e.set(ts, "ingest")
	if s.Version != 1 || len(s.Keys) != 1 || s.Keys[0].CoolingSince == nil || !s.Keys[0].CoolingSince.AsTime().Equal(cooling) {
		t.Fatalf("cooling down: %v; want cooling since %v", s, cooling)
	}
	for e.clk.Now().Before(cooling.Add(9 * time.Second)) {
		e.reportAll("ingest", 16, map[string]float64{"user:hot": 40}, ts)
		now := e.step(leader)
		if s := e.set(ts, "ingest"); s.Version != 1 || len(s.Keys) != 1 {
			t.Fatalf("%v into a 10s cooldown: %v", now.Sub(cooling), s)
		}
	}
	select {
	case r := <-poll:
		t.Fatalf("long poll answered during the cooldown: %v", r)
	default:
	}
	e.reportAll("ingest", 16, map[string]float64{"user:hot": 40}, ts)
	e.step(leader)
	r = e.await(poll)
	if !r.Changed || r.Set.Version != 2 || len(r.Set.Keys) != 0 {
		t.Fatalf("after the cooldown: %v", r)
	}
	if s := e.next(watch); s.Version != 2 || len(s.Keys) != 0 {
		t.Fatalf("watch after the cooldown: %v", s)
	}

	// Nothing newer: wait 0 answers at once, a long poll once its wait
	// has run out; both say nothing changed.
	short, err := ts.hot.GetOverflowSet(e.ctx, connect.NewRequest(&v1.GetOverflowSetRequest{Pool: "ingest", SinceVersion: 2}))
	if err != nil || short.Msg.Changed || short.Msg.Set.Version != 2 {
		t.Fatalf("wait 0: %v %v", short, err)
	}
	timers := e.clk.Waiters()
	poll = e.longPoll(ts, "ingest", 2)
	if err := e.clk.BlockUntilContext(e.ctx, timers+1); err != nil { // the long poll's timer
		t.Fatal(err)
	}
	e.clk.Advance(60 * time.Second)
	if r := e.await(poll); r.Changed || r.Set.Version != 2 {
		t.Fatalf("long poll after its wait: %v", r)
	}

	body := metricsOf(t, ts)
	for _, want := range []string{
		`keyshard_hotkey_overflow_version{pool="ingest"} 2`,
		`keyshard_hotkey_overflow_keys{pool="ingest"} 0`,
		`keyshard_hotkey_reports_total{pool="ingest"} `,
		`keyshard_hotkey_last_aggregation_timestamp_seconds `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func metricsOf(t *testing.T, ts *testServer) string {
	t.Helper()
	res, err := http.Get(ts.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// TestHotKeysProducerStops: a producer that stops reporting stops counting
// once its report is older than report_max_age, and its report is deleted
// at twice that age.
func TestHotKeysProducerStops(t *testing.T) {
	e := newHotEnv(t)
	ts := e.start(nil)
	leader := e.leader(ts)
	e.putPool(ts, &v1.HotKeyPool{Name: "stops", Threshold: 1000, LowThreshold: 700, ReportMaxAge: durationpb.New(5 * time.Second)})
	e.report(ts, "stops", "b", map[string]float64{"k": 600})
	stopped := e.clk.Now()
	e.report(ts, "stops", "a", map[string]float64{"k": 600})
	e.step(leader)
	if s := e.set(ts, "stops"); s.Version != 1 || len(s.Keys) != 1 || s.Keys[0].Rate != 1200 {
		t.Fatalf("both producers: %v", s)
	}
	hasB := func(snap *store.Snapshot) bool { _, ok := snap.Pools["stops"].Reports["b"]; return ok }
	for {
		e.report(ts, "stops", "a", map[string]float64{"k": 600})
		now := e.step(leader)
		age := now.Sub(stopped)
		s := e.set(ts, "stops")
		if len(s.Keys) != 1 {
			t.Fatalf("%v after b stopped: %v", age, s)
		}
		cooling := s.Keys[0].CoolingSince
		switch {
		case age <= 5*time.Second && cooling != nil:
			t.Fatalf("b's report, %v old, stopped counting before report_max_age 5s: %v", age, s)
		case age == 6*time.Second && (cooling == nil || !cooling.AsTime().Equal(now)):
			t.Fatalf("b's report, %v old, still counts: %v", age, s)
		}
		if age == 10*time.Second {
			var kept bool
			leader.srv.WaitView(e.ctx, func(snap *store.Snapshot) bool { kept = hasB(snap); return true })
			if !kept {
				t.Fatal("b's report was deleted before it was twice report_max_age old")
			}
		}
		if age == 11*time.Second {
			break
		}
	}
	if err := leader.srv.WaitView(e.ctx, func(snap *store.Snapshot) bool { return !hasB(snap) }); err != nil {
		t.Fatalf("b's stale report was not deleted: %v", err)
	}
	if body := metricsOf(t, ts); !strings.Contains(body, `keyshard_hotkey_reports_pruned_total{pool="stops"} 1`) {
		t.Error("the deleted report was not counted")
	}
}

// TestHotKeysFailover: reports go through two replicas; the leader stops;
// the other continues from the stored set: same version, same cooldown.
func TestHotKeysFailover(t *testing.T) {
	e := newHotEnv(t)
	cluster, err := store.StartEmbeddedCluster(e.ctx, t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close) // after the replicas stop: cleanups run last-in first-out
	eps := cluster.Endpoints()
	r1 := e.start(func(c *server.Config) { c.Etcd.Endpoints = eps; c.Replica = "r1" })
	r2 := e.start(func(c *server.Config) { c.Etcd.Endpoints = eps; c.Replica = "r2" })
	leader := e.leader(r1, r2)
	other := r1
	if leader == r1 {
		other = r2
	}
	e.putPool(other, &v1.HotKeyPool{Name: "fail", Threshold: 1600, Cooldown: durationpb.New(5 * time.Second), ReportMaxAge: durationpb.New(30 * time.Second)})

	// allReported waits until the leader's view holds every producer's
	// report made at at.
	allReported := func(ts *testServer, at time.Time) {
		t.Helper()
		err := ts.srv.WaitView(e.ctx, func(snap *store.Snapshot) bool {
			p := snap.Pools["fail"]
			if p == nil || len(p.Reports) != 16 {
				return false
			}
			for _, r := range p.Reports {
				if !r.Value.At.Equal(at) {
					return false
				}
			}
			return true
		})
		if err != nil {
			t.Fatalf("reports made at %v did not reach the leader: %v", at.Sub(hkT0), err)
		}
	}
	e.reportAll("fail", 16, map[string]float64{"k": 100}, r1, r2)
	allReported(leader, e.clk.Now())
	e.step(leader)
	r := e.await(e.longPoll(other, "fail", 0))
	if r.Set.Version != 1 || strings.Join(keysOf(r.Set), ",") != "k" {
		t.Fatalf("set through the other replica: %v", r)
	}
	// The key cools down; the other replica sees it.
	e.reportAll("fail", 16, map[string]float64{"k": 10}, r1, r2)
	allReported(leader, e.clk.Now())
	cooling := e.step(leader)
	err = other.srv.WaitView(e.ctx, func(snap *store.Snapshot) bool {
		es := snap.Pools["fail"].Overflow.Value.Entries
		return len(es) == 1 && es[0].BelowSince.Equal(cooling)
	})
	if err != nil {
		t.Fatalf("the cooldown did not reach the other replica: %v", err)
	}

	leader.Stop()
	if err := other.WaitLeading(e.ctx); err != nil {
		t.Fatalf("the other replica did not take over: %v", err)
	}
	if s := e.set(other, "fail"); s.Version != 1 || len(s.Keys) != 1 || !s.Keys[0].CoolingSince.AsTime().Equal(cooling) {
		t.Fatalf("set after failover: %v", s)
	}
	// The new leader keeps the cooldown that started under the old one:
	// the key leaves 5s after it, at version 2.
	for {
		e.reportAll("fail", 16, map[string]float64{"k": 10}, other)
		now := e.step(other)
		s := e.set(other, "fail")
		if now.Sub(cooling) < 5*time.Second {
			if s.Version != 1 || len(s.Keys) != 1 || !s.Keys[0].CoolingSince.AsTime().Equal(cooling) {
				t.Fatalf("%v into the cooldown, under the new leader: %v", now.Sub(cooling), s)
			}
			continue
		}
		if s.Version != 2 || len(s.Keys) != 0 {
			t.Fatalf("after the cooldown, under the new leader: %v; want version 2 and no key", s)
		}
		break
	}
	// And counts on from there.
	e.reportAll("fail", 16, map[string]float64{"j": 100}, other)
	e.step(other)
	if s := e.set(other, "fail"); s.Version != 3 || strings.Join(keysOf(s), ",") != "j" {
		t.Fatalf("next key under the new leader: %v", s)
	}
}

// TestHotKeyPoolAPI: defaults, replacing settings, listing, and every bad
// field.
func TestHotKeyPoolAPI(t *testing.T) {
	ts := startServer(t, nil)
	ctx := ctxT(t)
	put := func(p *v1.HotKeyPool) (*v1.HotKeyPool, error) {
		r, err := ts.admin.PutHotKeyPool(ctx, connect.NewRequest(&v1.PutHotKeyPoolRequest{Pool: p}))
		if err != nil {
			return nil, err
		}
		return r.Msg.Pool, nil
	}
	p, err := put(&v1.HotKeyPool{Name: "b-pool", Threshold: 640})
	if err != nil {
		t.Fatal(err)
	}
	if p.LowThreshold != 320 || p.Cooldown.AsDuration() != 30*time.Second || p.ReportThreshold != 10 || p.ReportMaxAge.AsDuration() != 30*time.Second || p.MaxKeys != 1024 {
		t.Fatalf("defaults not filled: %v", p)
	}
	want := &v1.HotKeyPool{Name: "a-pool", Threshold: 100, LowThreshold: 100, Cooldown: durationpb.New(time.Minute), ReportThreshold: 1, ReportMaxAge: durationpb.New(2 * time.Second), MaxKeys: 2048}
	if p, err = put(want); err != nil || p.LowThreshold != 100 || p.MaxKeys != 2048 || p.ReportMaxAge.AsDuration() != 2*time.Second {
		t.Fatalf("explicit settings: %v %v", p, err)
	}
	// Replacing: a new threshold, the other settings back to defaults.
	if p, err = put(&v1.HotKeyPool{Name: "b-pool", Threshold: 6400}); err != nil || p.LowThreshold != 3200 {
		t.Fatalf("replace: %v %v", p, err)
	}
	l, err := ts.admin.ListHotKeyPools(ctx, connect.NewRequest(&v1.ListHotKeyPoolsRequest{}))
	if err != nil || len(l.Msg.Pools) != 2 || l.Msg.Pools[0].Name != "a-pool" || l.Msg.Pools[1].Threshold != 6400 {
		t.Fatalf("list: %v %v", l, err)
	}
	for _, tc := range []struct {
		p    *v1.HotKeyPool
		want string
	}{
		{nil, "pool: missing"},
		{&v1.HotKeyPool{Threshold: 1}, "pool.name: empty"},
		{&v1.HotKeyPool{Name: "a b", Threshold: 1}, `pool.name: "a b" has ' '`},
		{&v1.HotKeyPool{Name: "x"}, "pool.threshold: 0; want a number > 0"},
		{&v1.HotKeyPool{Name: "x", Threshold: -5}, "pool.threshold: -5; want a number > 0"},
		{&v1.HotKeyPool{Name: "x", Threshold: math.Inf(1)}, "pool.threshold: +Inf; want a finite number > 0"},
		{&v1.HotKeyPool{Name: "x", Threshold: math.NaN()}, "pool.threshold: NaN"},
		{&v1.HotKeyPool{Name: "x", Threshold: 10, LowThreshold: 11}, "pool.low_threshold: 11 is above the threshold 10"},
		{&v1.HotKeyPool{Name: "x", Threshold: 10, LowThreshold: -1}, "pool.low_threshold: -1; want a number in (0, threshold]"},
		{&v1.HotKeyPool{Name: "x", Threshold: 10, ReportThreshold: 20}, "pool.report_threshold: 20 is above the threshold 10"},
		{&v1.HotKeyPool{Name: "x", Threshold: 10, ReportThreshold: math.NaN()}, "pool.report_threshold: NaN"},
		{&v1.HotKeyPool{Name: "x", Threshold: 10, Cooldown: durationpb.New(-time.Second)}, "pool.cooldown: -1s; want a positive duration"},
		{&v1.HotKeyPool{Name: "x", Threshold: 10, Cooldown: durationpb.New(25 * time.Hour)}, "pool.cooldown: 25h0m0s; want at most 24h0m0s"},
		{&v1.HotKeyPool{Name: "x", Threshold: 10, Cooldown: durationpb.New(1500 * time.Microsecond)}, "pool.cooldown: 1.5ms; want whole milliseconds"},
		{&v1.HotKeyPool{Name: "x", Threshold: 10, Cooldown: &durationpb.Duration{Seconds: 1, Nanos: -1}}, "pool.cooldown: "},
		{&v1.HotKeyPool{Name: "x", Threshold: 10, ReportMaxAge: durationpb.New(time.Second)}, "pool.report_max_age: 1s; want at least 2s"},
		{&v1.HotKeyPool{Name: "x", Threshold: 10, ReportMaxAge: durationpb.New(48 * time.Hour)}, "pool.report_max_age: 48h0m0s; want at most 24h0m0s"},
		{&v1.HotKeyPool{Name: "x", Threshold: 10, MaxKeys: 2049}, "pool.max_keys: 2049; want 1 to 2048"},
	} {
		_, err := put(tc.p)
		wantCode(t, err, connect.CodeInvalidArgument, tc.want)
	}
}

// TestHotKeyReportErrors: every bad field of a report or a read gets
// INVALID_ARGUMENT or NOT_FOUND naming it.
func TestHotKeyReportErrors(t *testing.T) {
	e := newHotEnv(t)
	ts := e.start(nil)
	e.putPool(ts, &v1.HotKeyPool{Name: "errs", Threshold: 100})
	rep := func(pool, producer string, keys ...*v1.KeyRate) error {
		_, err := ts.hot.ReportHotKeys(e.ctx, connect.NewRequest(&v1.ReportHotKeysRequest{Pool: pool, Producer: producer, Keys: keys}))
		return err
	}
	kr := func(k string, r float64) *v1.KeyRate { return &v1.KeyRate{Key: k, Rate: r} }
	many := make([]*v1.KeyRate, 1025)
	for i := range many {
		many[i] = kr(fmt.Sprint(i), 1)
	}
	wantCode(t, rep("nope", "p"), connect.CodeNotFound, "hot-key pool \"nope\" does not exist; create it with `keyshard hotkeys pool put nope --threshold N`")
	wantCode(t, rep("", "p"), connect.CodeInvalidArgument, "pool name is empty")
	wantCode(t, rep("a/b", "p"), connect.CodeInvalidArgument, `pool name "a/b" has '/'`)
	wantCode(t, rep("errs", ""), connect.CodeInvalidArgument, "producer id is empty")
	wantCode(t, rep("errs", "host 1"), connect.CodeInvalidArgument, `producer id "host 1" has ' '`)
	wantCode(t, rep("errs", strings.Repeat("p", 129)), connect.CodeInvalidArgument, "producer id")
	wantCode(t, rep("errs", "p", many...), connect.CodeInvalidArgument, "keys: 1025 keys in one report; send at most 1024")
	wantCode(t, rep("errs", "p", kr("a", 1), kr("", 1)), connect.CodeInvalidArgument, "keys[1].key: empty; want 1-512 bytes")
	wantCode(t, rep("errs", "p", kr(strings.Repeat("k", 513), 1)), connect.CodeInvalidArgument, "keys[0].key: ")
	wantCode(t, rep("errs", "p", kr(strings.Repeat("k", 513), 1)), connect.CodeInvalidArgument, "is 513 bytes; want at most 512")
	wantCode(t, rep("errs", "p", kr("a", -1)), connect.CodeInvalidArgument, `keys[0].rate: -1 (key "a"); want a finite number >= 0`)
	wantCode(t, rep("errs", "p", kr("a", math.NaN())), connect.CodeInvalidArgument, "keys[0].rate: NaN")
	wantCode(t, rep("errs", "p", kr("a", math.Inf(1))), connect.CodeInvalidArgument, "keys[0].rate: +Inf")
	wantCode(t, rep("errs", "p", kr("a", 1), kr("b", 1), kr("a", 2)), connect.CodeInvalidArgument, `keys[2].key: "a" appears twice (also keys[0])`)
	// Accepted: exactly 1024 keys, 512-byte keys, rates of 0, keys below
	// the pool's report_threshold, and an empty report.
	if err := rep("errs", "p", many[:1024]...); err != nil {
		t.Fatal(err)
	}
	if err := rep("errs", "p", kr(strings.Repeat("k", 512), 0), kr("low", 0.001)); err != nil {
		t.Fatal(err)
	}
	if err := rep("errs", "p"); err != nil {
		t.Fatal(err)
	}

	get := func(req *v1.GetOverflowSetRequest) error {
		_, err := ts.hot.GetOverflowSet(e.ctx, connect.NewRequest(req))
		return err
	}
	wantCode(t, get(&v1.GetOverflowSetRequest{Pool: "nope"}), connect.CodeNotFound, `hot-key pool "nope" does not exist`)
	wantCode(t, get(&v1.GetOverflowSetRequest{Pool: "bad pool"}), connect.CodeInvalidArgument, "pool name")
	wantCode(t, get(&v1.GetOverflowSetRequest{Pool: "errs", Wait: durationpb.New(-time.Second)}), connect.CodeInvalidArgument, "wait: -1s")
	stream, err := ts.hot.WatchOverflowSet(e.ctx, connect.NewRequest(&v1.WatchOverflowSetRequest{Pool: "nope"}))
	if err == nil {
		for stream.Receive() {
		}
		err = stream.Err()
		stream.Close()
	}
	wantCode(t, err, connect.CodeNotFound, `hot-key pool "nope" does not exist`)
}

// TestHotKeyRoles: member and admin tokens may report and read sets; only
// admin tokens manage pools; pools from the config are created at start
// and keep their stored settings afterwards.
func TestHotKeyRoles(t *testing.T) {
	ctx := ctxT(t)
	ts := startServer(t, func(c *server.Config) {
		c.HotKeyPools = []server.HotKeyPoolConfig{{Name: "from-config", Threshold: 500, Cooldown: time.Minute}}
	})
	hotAs := func(token string) keyshardv1connect.HotKeyServiceClient {
		return keyshardv1connect.NewHotKeyServiceClient(http.DefaultClient, ts.url, connect.WithInterceptors(bearerToken(token)))
	}
	adminAs := func(token string) keyshardv1connect.AdminServiceClient {
		return keyshardv1connect.NewAdminServiceClient(http.DefaultClient, ts.url, connect.WithInterceptors(bearerToken(token)))
	}
	l, err := ts.admin.ListHotKeyPools(ctx, connect.NewRequest(&v1.ListHotKeyPoolsRequest{}))
	if err != nil || len(l.Msg.Pools) != 1 || l.Msg.Pools[0].Name != "from-config" || l.Msg.Pools[0].LowThreshold != 250 || l.Msg.Pools[0].Cooldown.AsDuration() != time.Minute {
		t.Fatalf("pool from the config: %v %v", l, err)
	}
	for _, token := range []string{memberToken, adminToken} {
		hot := hotAs(token)
		if _, err := hot.ReportHotKeys(ctx, connect.NewRequest(&v1.ReportHotKeysRequest{Pool: "from-config", Producer: "p", Keys: []*v1.KeyRate{{Key: "k", Rate: 1}}})); err != nil {
			t.Fatalf("report with a %s token: %v", token[:5], err)
		}
		if _, err := hot.GetOverflowSet(ctx, connect.NewRequest(&v1.GetOverflowSetRequest{Pool: "from-config"})); err != nil {
			t.Fatalf("get with a %s token: %v", token[:5], err)
		}
		// The watch passes authentication: it gets to the pool check.
		stream, err := hot.WatchOverflowSet(ctx, connect.NewRequest(&v1.WatchOverflowSetRequest{Pool: "nope"}))
		if err == nil {
			for stream.Receive() {
			}
			err = stream.Err()
			stream.Close()
		}
		wantCode(t, err, connect.CodeNotFound, "does not exist")
	}
	_, err = adminAs(memberToken).PutHotKeyPool(ctx, connect.NewRequest(&v1.PutHotKeyPoolRequest{Pool: &v1.HotKeyPool{Name: "x", Threshold: 1}}))
	wantCode(t, err, connect.CodePermissionDenied, "needs an admin token")
	if _, err := adminAs(memberToken).ListHotKeyPools(ctx, connect.NewRequest(&v1.ListHotKeyPoolsRequest{})); err != nil {
		t.Fatalf("list hot-key pools as member (read-only): %v", err)
	}
	_, err = hotAs("not-a-real-token-at-all").ReportHotKeys(ctx, connect.NewRequest(&v1.ReportHotKeysRequest{Pool: "from-config", Producer: "p"}))
	wantCode(t, err, connect.CodeUnauthenticated, "unknown bearer token")
	_, err = keyshardv1connect.NewHotKeyServiceClient(http.DefaultClient, ts.url).GetOverflowSet(ctx, connect.NewRequest(&v1.GetOverflowSetRequest{Pool: "from-config"}))
	wantCode(t, err, connect.CodeUnauthenticated, "missing bearer token")

	// Settings changed through the API survive a restart with the same
	// config.
	if _, err := ts.admin.PutHotKeyPool(ctx, connect.NewRequest(&v1.PutHotKeyPoolRequest{Pool: &v1.HotKeyPool{Name: "from-config", Threshold: 900}})); err != nil {
		t.Fatal(err)
	}
	ts.Restart()
	l, err = ts.admin.ListHotKeyPools(ctx, connect.NewRequest(&v1.ListHotKeyPoolsRequest{}))
	if err != nil || len(l.Msg.Pools) != 1 || l.Msg.Pools[0].Threshold != 900 {
		t.Fatalf("pool after a restart: %v %v", l, err)
	}
}

// TestHotKeyCorruptSet: a stored set that does not decode is reported and
// counted once, left alone, and the pool works again once it is deleted.
func TestHotKeyCorruptSet(t *testing.T) {
	e := newHotEnv(t)
	cluster, err := store.StartEmbeddedCluster(e.ctx, t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	ts := e.start(func(c *server.Config) { c.Etcd.Endpoints = cluster.Endpoints() })
	leader := e.leader(ts)
	e.putPool(ts, &v1.HotKeyPool{Name: "broken", Threshold: 100})
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(e.ctx, store.OverflowKey("broken"), `{"version":"seven"}`); err != nil {
		t.Fatal(err)
	}
	e.report(ts, "broken", "p", map[string]float64{"k": 500})
	e.step(leader)
	e.report(ts, "broken", "p", map[string]float64{"k": 500})
	e.step(leader)
	if s := e.set(ts, "broken"); s.Version != 0 || len(s.Keys) != 0 {
		t.Fatalf("corrupt set served as %v", s)
	}
	if body := metricsOf(t, ts); !strings.Contains(body, `keyshard_hotkey_aggregation_failures_total{pool="broken"} 1`) {
		t.Errorf("the corrupt set was not counted once:\n%s", grepLines(body, "keyshard_hotkey"))
	}
	if _, err := cli.Delete(e.ctx, store.OverflowKey("broken")); err != nil {
		t.Fatal(err)
	}
	if err := leader.srv.WaitView(e.ctx, func(snap *store.Snapshot) bool { return snap.Corrupt[store.OverflowKey("broken")] == nil }); err != nil {
		t.Fatal(err)
	}
	e.report(ts, "broken", "p", map[string]float64{"k": 500})
	e.step(leader)
	if s := e.set(ts, "broken"); s.Version != 1 || strings.Join(keysOf(s), ",") != "k" {
		t.Fatalf("after deleting the corrupt set: %v", s)
	}
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
