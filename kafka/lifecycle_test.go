package kafka

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/clock/clocktest"
	"github.com/keyshard/keyshard/hotkey"
)

// countRequests counts every request that reaches e's cluster from now on.
func (e *testEnv) countRequests() *atomic.Int64 {
	var n atomic.Int64
	e.c.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
		e.c.KeepControl()
		n.Add(1)
		return nil, nil, false // the cluster answers as usual
	})
	return &n
}

// idleKeyshard returns a Keyshard client for a control plane that the
// test never reaches (Dial does no IO), closed when the test ends.
func idleKeyshard(t *testing.T) *client.Client {
	t.Helper()
	kc, err := client.Dial("http://127.0.0.1:7400")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kc.Close() })
	return kc
}

// TestNewRouterErrors: NewRouter refuses each bad argument with a
// *ConfigError (ErrBadConfig) whose Field names it, and sends nothing,
// good arguments or bad.
func TestNewRouterErrors(t *testing.T) {
	e := newEnv(t)
	reqs := e.countRequests()
	kc := idleKeyshard(t)
	withConfig := func(edit func(*Config)) func() (*Router, error) {
		return func() (*Router, error) {
			cfg := testConfig(e)
			edit(&cfg)
			return NewRouter(e.cl, e.adm, cfg)
		}
	}
	withHotKeys := func(hk ClusterHotKeysConfig) func() (*Router, error) {
		return withConfig(func(c *Config) { c.ClusterHotKeys = &hk })
	}
	for _, c := range []struct {
		arg  string // the error's Field
		call func() (*Router, error)
	}{
		{"cl", func() (*Router, error) { return NewRouter(nil, e.adm, testConfig(e)) }},
		{"adm", func() (*Router, error) { return NewRouter(e.cl, nil, testConfig(e)) }},
		{"kgo.RecordPartitioner", func() (*Router, error) {
			return NewRouter(e.client(t, kgo.RecordPartitioner(kgo.RoundRobinPartitioner())), e.adm, testConfig(e))
		}},
		{"Config.MainTopic", withConfig(func(c *Config) { c.MainTopic = "" })},
		{"Config.OverflowTopic", withConfig(func(c *Config) { c.OverflowTopic = "" })},
		{"Config.OverflowTopic", withConfig(func(c *Config) { c.OverflowTopic = c.MainTopic })},
		{"Config.DeadLetterTopic", withConfig(func(c *Config) { c.DeadLetterTopic = c.MainTopic })},
		{"Config.OverflowGroup", withConfig(func(c *Config) { c.OverflowGroup = "" })},
		{"Config.SendTimeout", withConfig(func(c *Config) { c.SendTimeout = -time.Second })},
		{"Config.RefreshInterval", withConfig(func(c *Config) { c.RefreshInterval = -time.Second })},
		{"Config.RetentionWarnFraction", withConfig(func(c *Config) { c.RetentionWarnFraction = 1.5 })},
		{"Config.Policy", withConfig(func(c *Config) { c.Policy.Detector.Threshold = 0 })},
		{"Config.DeadLetterTopic", withConfig(func(c *Config) {
			c.DeadLetterTopic = ""
			c.Policy.Rules = mustRules(t, "dead-letter k:*")
		})},
		{"Config.ClusterHotKeys.Client", withHotKeys(ClusterHotKeysConfig{Pool: "events", Producer: "p1"})},
		{"Config.ClusterHotKeys", withHotKeys(ClusterHotKeysConfig{Client: kc, Producer: "p1"})},
		{"Config.ClusterHotKeys", withHotKeys(ClusterHotKeysConfig{Client: kc, Pool: "events"})},
		{"Config.ClusterHotKeys", withHotKeys(ClusterHotKeysConfig{Client: kc, Pool: "events", Producer: "p1", Interval: -time.Second})},
	} {
		r, err := c.call()
		var ce *ConfigError
		if r != nil || !errors.Is(err, ErrBadConfig) || !errors.As(err, &ce) || ce.Field != c.arg ||
			ce.Func != "kafka.NewRouter" || !strings.Contains(err.Error(), c.arg) {
			t.Errorf("%s: NewRouter = %v, %v; want a *ConfigError (ErrBadConfig) of kafka.NewRouter naming %s", c.arg, r, err, c.arg)
		}
	}
	// The SDK's refusal of a ClusterHotKeys field is kept, naming it.
	for field, hk := range map[string]ClusterHotKeysConfig{
		"HotKeysConfig.Pool":     {Client: kc, Producer: "p1"},
		"HotKeysConfig.Producer": {Client: kc, Pool: "events"},
		"HotKeysConfig.Interval": {Client: kc, Pool: "events", Producer: "p1", Interval: -time.Second},
	} {
		_, err := withHotKeys(hk)()
		var ae *client.ArgError
		if !errors.As(err, &ae) || ae.Arg != field || !errors.Is(err, client.ErrInvalid) {
			t.Errorf("%s: NewRouter = %v; want it to wrap the SDK's *client.ArgError naming it", field, err)
		}
	}
	if _, err := withConfig(func(c *Config) { c.Policy.Detector.Threshold = 0 })(); !errors.Is(err, hotkey.ErrBadConfig) {
		t.Errorf("bad policy: %v does not wrap hotkey.ErrBadConfig", err)
	}
	r, err := withHotKeys(ClusterHotKeysConfig{Client: kc, Pool: "events", Producer: "p1"})()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if n := reqs.Load(); n != 0 {
		t.Fatalf("NewRouter sent %d requests to Kafka, want none", n)
	}
	// The counter sees requests: Start sends them.
	r, err = NewRouter(e.cl, e.adm, testConfig(e))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.Start(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if reqs.Load() == 0 {
		t.Error("no request counted after Start")
	}
}

// TestProduceBeforeStart: until Start returns nil, every send resolves
// with ErrNotStarted, once, and counts as failed; Refresh refuses too.
func TestProduceBeforeStart(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	r, err := NewRouter(e.cl, e.adm, testConfig(e))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	res := newResults()
	early := rec("k", "early")
	r.Produce(ctx, early, res.promise) // resolves before Produce returns
	res.check(t, []*kgo.Record{early})
	if err := res.errs[early]; !errors.Is(err, ErrNotStarted) {
		t.Errorf("Produce before Start: %v, want ErrNotStarted", err)
	}
	if err := r.ProduceSync(ctx, rec("k", "early too")); !errors.Is(err, ErrNotStarted) {
		t.Errorf("ProduceSync before Start: %v, want ErrNotStarted", err)
	}
	if err := r.Refresh(ctx); !errors.Is(err, ErrNotStarted) {
		t.Errorf("Refresh before Start: %v, want ErrNotStarted", err)
	}
	if err := r.Flush(ctx); err != nil {
		t.Errorf("Flush before Start: %v", err)
	}
	if s := r.Stats(); s.Failed != 2 || s.Resolved() != 2 || s.Pending != 0 {
		t.Errorf("stats before Start: %+v; want 2 failed", s)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.ProduceSync(ctx, rec("k", "v")); err != nil {
		t.Errorf("Produce after Start: %v", err)
	}
}

// TestCloseWithoutStart: Close needs no Start, is idempotent, and Start
// and Produce then fail with ErrClosed; nothing reached Kafka or the
// metrics registry.
func TestCloseWithoutStart(t *testing.T) {
	e := newEnv(t)
	reqs := e.countRequests()
	kc := idleKeyshard(t)
	reg := prometheus.NewRegistry()
	cfg := testConfig(e)
	cfg.Registerer = reg
	cfg.ClusterHotKeys = &ClusterHotKeysConfig{Client: kc, Pool: "events", Producer: "p1"}
	r, err := NewRouter(e.cl, e.adm, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	r.Close()
	ctx := testCtx(t)
	if err := r.Start(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Start after Close: %v, want ErrClosed", err)
	}
	if err := r.ProduceSync(ctx, rec("k", "v")); !errors.Is(err, ErrClosed) {
		t.Errorf("Produce after Close: %v, want ErrClosed", err)
	}
	if err := r.WaitClusterVersion(ctx, 1); !errors.Is(err, ErrClosed) {
		t.Errorf("WaitClusterVersion after Close: %v, want ErrClosed", err)
	}
	if mfs, _ := reg.Gather(); len(mfs) != 0 {
		t.Errorf("%d metric families registered without Start", len(mfs))
	}
	if n := reqs.Load(); n != 0 {
		t.Errorf("%d requests reached Kafka", n)
	}
	if n := e.clk.Waiters(); n != 0 {
		t.Errorf("%d timers waiting: a goroutine runs", n)
	}
}

// TestStartMissingTopic: Start fails at once for a topic that does not
// exist, naming the field and the topic, and starts nothing.
func TestStartMissingTopic(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	for _, c := range []struct {
		field string
		edit  func(*Config)
	}{
		{"Config.MainTopic", func(c *Config) { c.MainTopic = "no-such-main" }},
		{"Config.OverflowTopic", func(c *Config) { c.OverflowTopic = "no-such-overflow" }},
		{"Config.DeadLetterTopic", func(c *Config) { c.DeadLetterTopic = "no-such-dlq" }},
	} {
		cfg := testConfig(e)
		c.edit(&cfg)
		r, err := NewRouter(e.cl, e.adm, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		err = r.Start(ctx)
		topic := map[string]string{"Config.MainTopic": cfg.MainTopic, "Config.OverflowTopic": cfg.OverflowTopic,
			"Config.DeadLetterTopic": cfg.DeadLetterTopic}[c.field]
		var ce *ConfigError
		if !errors.Is(err, ErrBadConfig) || !errors.Is(err, kerr.UnknownTopicOrPartition) ||
			!errors.As(err, &ce) || ce.Func != "Router.Start" || ce.Field != c.field ||
			!strings.Contains(err.Error(), c.field+` "`+topic+`"`) || !strings.Contains(err.Error(), "create it") {
			t.Errorf("%s: Start = %v; want ErrBadConfig and UnknownTopicOrPartition naming %s %q and what to do", c.field, err, c.field, topic)
		}
		if err := r.ProduceSync(ctx, rec("k", "v")); !errors.Is(err, ErrNotStarted) {
			t.Errorf("%s: Produce after a failed Start: %v, want ErrNotStarted", c.field, err)
		}
		if n := e.clk.Waiters(); n != 0 {
			t.Errorf("%s: %d timers waiting after a failed Start: a goroutine runs", c.field, n)
		}
	}
}

// flakyAdmin answers ListTopics as fixedAdmin does, except that the next
// calls fail as fails says, one a call.
type flakyAdmin struct {
	fixedAdmin
	mu    sync.Mutex
	fails []topicsFailure
	calls int
}

type topicsFailure struct {
	request  error // the request fails with it
	overflow error // or the overflow topic's answer carries it
	absent   bool  // or the answer leaves the overflow topic out
}

func (a *flakyAdmin) ListTopics(ctx context.Context, topics ...string) (kadm.TopicDetails, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls++
	td, _ := a.fixedAdmin.ListTopics(ctx, topics...)
	if len(a.fails) == 0 {
		return td, nil
	}
	f := a.fails[0]
	a.fails = a.fails[1:]
	switch {
	case f.request != nil:
		return nil, f.request
	case f.absent:
		delete(td, overflowTopic)
	default:
		d := td[overflowTopic]
		d.Err = f.overflow
		td[overflowTopic] = d
	}
	return td, nil
}

func (a *flakyAdmin) callCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls
}

func (e *testEnv) flakyRouter(t *testing.T, fails ...topicsFailure) (*Router, *flakyAdmin) {
	t.Helper()
	adm := &flakyAdmin{fails: fails}
	r, err := newRouter(&ackProducer{}, adm, testConfig(e))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r, adm
}

// startAsync runs Start on a goroutine of its own; the channel gets what
// it returned.
func startAsync(ctx context.Context, r *Router) <-chan error {
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }() // exits when Start returns
	return done
}

var errRefused = errors.New("dial tcp 127.0.0.1:9092: connect: connection refused")

// TestStartTopicErrors: Start retries what may pass by waiting, and fails
// at once for the rest; a failed Start may be called again.
func TestStartTopicErrors(t *testing.T) {
	for _, c := range []struct {
		name  string
		fail  topicsFailure
		retry bool
		want  []error // wrapped by Start's error if it does not retry
	}{
		{"unreachable", topicsFailure{request: errRefused}, true, nil},
		{"leader not available", topicsFailure{overflow: kerr.LeaderNotAvailable}, true, nil},
		{"cluster authorization", topicsFailure{request: kerr.ClusterAuthorizationFailed}, false, []error{kerr.ClusterAuthorizationFailed}},
		{"unknown topic", topicsFailure{overflow: kerr.UnknownTopicOrPartition}, false, []error{ErrBadConfig, kerr.UnknownTopicOrPartition}},
		{"topic absent", topicsFailure{absent: true}, false, []error{ErrBadConfig, kerr.UnknownTopicOrPartition}},
		{"topic authorization", topicsFailure{overflow: kerr.TopicAuthorizationFailed}, false, []error{ErrBadConfig, kerr.TopicAuthorizationFailed}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := &testEnv{clk: clocktest.NewFake(t0)}
			r, adm := e.flakyRouter(t, c.fail)
			done := startAsync(testCtx(t), r)
			if c.retry {
				e.clk.MustBlockUntil(t, 1) // Start waits to retry
				e.clk.Advance(startBackoffMin)
			}
			err := <-done
			for _, w := range c.want {
				if !errors.Is(err, w) {
					t.Errorf("Start = %v, want it to wrap %v", err, w)
				}
			}
			if c.retry && err != nil {
				t.Errorf("Start = %v after a retry, want nil", err)
			}
			if want := map[bool]int{true: 2, false: 1}[c.retry]; adm.callCount() != want {
				t.Errorf("%d metadata requests, want %d", adm.callCount(), want)
			}
			if !c.retry {
				if err := r.Start(testCtx(t)); err != nil { // the failure has passed
					t.Errorf("Start again: %v", err)
				}
			}
		})
	}
}

// TestStartBacksOff: the wait between attempts doubles, up to
// startBackoffMax.
func TestStartBacksOff(t *testing.T) {
	e := &testEnv{clk: clocktest.NewFake(t0)}
	var fails []topicsFailure
	for range 8 {
		fails = append(fails, topicsFailure{request: errRefused})
	}
	r, adm := e.flakyRouter(t, fails...)
	done := startAsync(testCtx(t), r)
	wait := startBackoffMin
	for i := range len(fails) {
		e.clk.MustBlockUntil(t, 1)
		e.clk.Advance(wait - time.Nanosecond)
		if n := e.clk.Waiters(); n != 1 || adm.callCount() != i+1 {
			t.Fatalf("attempt %d: retried before %v", i+1, wait)
		}
		e.clk.Advance(time.Nanosecond)
		wait = min(2*wait, startBackoffMax)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if wait != startBackoffMax {
		t.Errorf("the backoff reached %v, want %v", wait, startBackoffMax)
	}
}

// TestStartEnds: Start gives up when its ctx ends, with ctx's error and
// the last failure, and when Close ends it, with ErrClosed; Close waits
// for it. Neither started anything.
func TestStartEnds(t *testing.T) {
	fails := []topicsFailure{{request: errRefused}, {request: errRefused}}

	e := &testEnv{clk: clocktest.NewFake(t0)}
	r, _ := e.flakyRouter(t, fails...)
	ctx, cancel := context.WithCancel(testCtx(t))
	done := startAsync(ctx, r)
	e.clk.MustBlockUntil(t, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) || !errors.Is(err, errRefused) {
		t.Errorf("Start when ctx ends = %v, want ctx's error and the last failure", err)
	}
	if n := e.clk.Waiters(); n != 0 {
		t.Errorf("%d timers waiting after Start gave up", n)
	}
	if err := r.ProduceSync(testCtx(t), rec("k", "v")); !errors.Is(err, ErrNotStarted) {
		t.Errorf("Produce: %v, want ErrNotStarted", err)
	}

	e = &testEnv{clk: clocktest.NewFake(t0)}
	r, _ = e.flakyRouter(t, fails...)
	done = startAsync(testCtx(t), r)
	e.clk.MustBlockUntil(t, 1)
	r.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Errorf("Start when Close ends it = %v, want ErrClosed", err)
	}
	if n := e.clk.Waiters(); n != 0 {
		t.Errorf("%d timers waiting after Close", n)
	}
}

// TestStartTwice: Start succeeds once; another call while it runs or
// after it succeeded fails and changes nothing.
func TestStartTwice(t *testing.T) {
	e := &testEnv{clk: clocktest.NewFake(t0)}
	r, adm := e.flakyRouter(t, topicsFailure{request: errRefused})
	ctx := testCtx(t)
	done := startAsync(ctx, r)
	e.clk.MustBlockUntil(t, 1)
	if err := r.Start(ctx); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("a second Start while the first runs: %v, want client.ErrInvalid", err)
	}
	e.clk.Advance(startBackoffMin)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); !errors.Is(err, client.ErrInvalid) || errors.Is(err, ErrBadConfig) {
		t.Errorf("Start after Start: %v, want client.ErrInvalid (as the SDK's Run called twice)", err)
	}
	if adm.callCount() != 2 {
		t.Errorf("%d metadata requests, want 2 (the first Start's)", adm.callCount())
	}
}
