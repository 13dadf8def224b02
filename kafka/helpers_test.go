package kafka

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyshard/keyshard/clock/clocktest"
	"github.com/keyshard/keyshard/hotkey"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

const (
	mainTopic     = "main"
	overflowTopic = "overflow"
	dlqTopic      = "dlq"
	overflowGroup = "overflow-g"
	mainGroup     = "main-g"
	numPartitions = 4
)

// testCtx bounds a test's waiting on the broker; it is a deadline for
// failure, never a way to pace the test.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	t.Cleanup(cancel)
	return ctx
}

type testEnv struct {
	c     *kfake.Cluster
	addrs []string
	cl    *kgo.Client
	adm   *kadm.Client
	clk   *clocktest.Fake
}

// newEnv starts a one-broker kfake cluster with the main and overflow
// topics (4 partitions each) and a dead-letter topic, and a producing
// client with opts.
func newEnv(t *testing.T, opts ...kgo.Opt) *testEnv {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1),
		kfake.SeedTopics(numPartitions, mainTopic, overflowTopic), kfake.SeedTopics(1, dlqTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	e := &testEnv{c: c, addrs: c.ListenAddrs(), clk: clocktest.NewFake(t0)}
	e.cl = e.client(t, opts...)
	e.adm = kadm.NewClient(e.cl)
	return e
}

func (e *testEnv) client(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(e.addrs...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// testConfig: hot at 100 msg/s with a 1 s half-life, 2 s cooldown.
func testConfig(e *testEnv) Config {
	return Config{
		MainTopic:       mainTopic,
		OverflowTopic:   overflowTopic,
		DeadLetterTopic: dlqTopic,
		OverflowGroup:   overflowGroup,
		Policy: hotkey.PolicyConfig{
			Detector: hotkey.DetectorConfig{Threshold: 100, HalfLife: time.Second, Capacity: 256},
			Cooldown: 2 * time.Second,
		},
		Clock: e.clk,
	}
}

// router returns a started router, closed when the test ends.
func (e *testEnv) router(t *testing.T, cfg Config) *Router {
	t.Helper()
	r, err := NewRouter(e.cl, e.adm, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	if err := r.Start(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	return r
}

func mustRules(t *testing.T, text string) *hotkey.Rules {
	t.Helper()
	rs, err := hotkey.ParseRules(text)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func rec(key, value string) *kgo.Record {
	r := &kgo.Record{Value: []byte(value)}
	if key != "" {
		r.Key = []byte(key)
	}
	return r
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// results collects promise calls and fails the test on a second call for
// one record.
type results struct {
	mu   sync.Mutex
	errs map[*kgo.Record]error
	n    map[*kgo.Record]int
}

func newResults() *results {
	return &results{errs: map[*kgo.Record]error{}, n: map[*kgo.Record]int{}}
}

func (rs *results) promise(r *kgo.Record, err error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.n[r]++
	rs.errs[r] = err
}

func (rs *results) check(t *testing.T, sent []*kgo.Record) {
	t.Helper()
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, r := range sent {
		if n := rs.n[r]; n != 1 {
			t.Errorf("record %q/%q: promise called %d times, want exactly 1", r.Key, r.Value, n)
		}
	}
}

// consumeAll reads every record of topics from the start, until the end
// offsets as of the call.
func (e *testEnv) consumeAll(t *testing.T, topics ...string) []*kgo.Record {
	t.Helper()
	ctx := testCtx(t)
	ends, err := e.adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	ends.Each(func(o kadm.ListedOffset) { want += int(o.Offset) })
	if want == 0 {
		return nil
	}
	cl := e.client(t, kgo.ConsumeTopics(topics...), kgo.FetchMaxWait(100*time.Millisecond))
	var got []*kgo.Record
	for len(got) < want {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d records: %v", len(got), want, err)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		got = append(got, fs.Records()...)
	}
	return got
}

// logBuffer is a slog handler target safe for concurrent writes.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelInfo}))
}
