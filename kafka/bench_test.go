package kafka

import (
	"context"
	"math/rand"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyshard/keyshard/clock"
	"github.com/keyshard/keyshard/hotkey"
)

// The benchmarks measure the router without a broker: a producer that
// acknowledges at once stands in for the Kafka client, so what remains is
// the router's own work per record.

// ackProducer acknowledges every record at once, from the caller's
// goroutine, at the partition Kafka's Java client would choose.
type ackProducer struct{ offset atomic.Int64 }

func (p *ackProducer) Produce(_ context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	key := r.Key
	if key == nil {
		for _, h := range r.Headers {
			if h.Key == HeaderKey {
				key = h.Value
			}
		}
	}
	r.Partition = KeyPartition(key, numPartitions)
	r.Offset = p.offset.Add(1)
	promise(r, nil)
}

// fixedAdmin answers metadata for the bench topics and nothing else.
type fixedAdmin struct{}

func (fixedAdmin) ListTopics(_ context.Context, topics ...string) (kadm.TopicDetails, error) {
	td := kadm.TopicDetails{}
	for _, t := range topics {
		d := kadm.TopicDetail{Topic: t, Partitions: kadm.PartitionDetails{}}
		for p := range int32(numPartitions) {
			d.Partitions[p] = kadm.PartitionDetail{Topic: t, Partition: p}
		}
		td[t] = d
	}
	return td, nil
}

func (fixedAdmin) FetchOffsets(context.Context, string) (kadm.OffsetResponses, error) {
	return kadm.OffsetResponses{}, nil
}

func (fixedAdmin) ListStartOffsets(context.Context, ...string) (kadm.ListedOffsets, error) {
	return kadm.ListedOffsets{}, nil
}

func (fixedAdmin) ListEndOffsets(context.Context, ...string) (kadm.ListedOffsets, error) {
	return kadm.ListedOffsets{}, nil
}

func (fixedAdmin) DescribeTopicConfigs(context.Context, ...string) (kadm.ResourceConfigs, error) {
	return kadm.ResourceConfigs{}, nil
}

// stepClock advances 1µs at every Now (1M msg/s of simulated time, as in
// hotkey's BenchmarkDecide); its timers never fire and cost nothing.
type stepClock struct{ ns atomic.Int64 }

func (c *stepClock) Now() time.Time                  { return t0.Add(time.Duration(c.ns.Add(1000))) }
func (c *stepClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c *stepClock) NewTimer(time.Duration) clock.Timer {
	return nopTimer{}
}
func (c *stepClock) NewTicker(time.Duration) clock.Ticker        { return nopTicker{} }
func (c *stepClock) AfterFunc(time.Duration, func()) clock.Timer { return nopTimer{} }

type nopTimer struct{}

func (nopTimer) C() <-chan time.Time      { return nil }
func (nopTimer) Stop() bool               { return true }
func (nopTimer) Reset(time.Duration) bool { return true }

type nopTicker struct{}

func (nopTicker) C() <-chan time.Time { return nil }
func (nopTicker) Stop()               {}
func (nopTicker) Reset(time.Duration) {}

// zipfKeys pre-generates n Zipf(1.1) keys over a million ranks.
func zipfKeys(n int) [][]byte {
	z := rand.NewZipf(rand.New(rand.NewSource(7)), 1.1, 1, 1_000_000-1)
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = strconv.AppendUint([]byte("user:"), z.Uint64(), 10)
	}
	return keys
}

func benchPolicy() hotkey.PolicyConfig {
	return hotkey.PolicyConfig{Detector: hotkey.DetectorConfig{Threshold: 1000, Capacity: 10_000}}
}

func benchRouter(b *testing.B, clk clock.Clock) *Router {
	r, err := newRouter(&ackProducer{}, fixedAdmin{}, Config{
		MainTopic: mainTopic, OverflowTopic: overflowTopic, OverflowGroup: overflowGroup,
		Policy: benchPolicy(), Clock: clk,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(r.Close)
	if err := r.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	return r
}

// runProduce warms the router up (hot keys enter overflow), then times
// Produce on the Zipf stream. Records are preallocated and reused after
// their promise, as a pooling caller would.
func runProduce(b *testing.B, r *Router) {
	keys := zipfKeys(1 << 16)
	recs := make([]kgo.Record, 1<<16)
	ctx := context.Background()
	promise := func(*kgo.Record, error) {}
	produce := func(i int) {
		rc := &recs[i&(1<<16-1)]
		*rc = kgo.Record{Key: keys[i&(1<<16-1)], Value: rc.Value, Headers: rc.Headers[:0]}
		r.Produce(ctx, rc, promise)
	}
	for i := range 1 << 20 {
		produce(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		produce(i)
	}
	b.StopTimer()
	s := r.Stats()
	if s.Overflow == 0 || s.Main == 0 || s.Failed+s.TimedOut != 0 {
		b.Fatalf("no mix of lanes, or failures: %+v", s)
	}
	b.ReportMetric(float64(s.Overflow)/float64(s.Resolved()), "overflow-share")
}

// BenchmarkDecide is the policy alone (hotkey.Policy.Decide) on the same
// stream: the floor under the router's decision.
func BenchmarkDecide(b *testing.B) {
	p, err := hotkey.NewPolicy(benchPolicy())
	if err != nil {
		b.Fatal(err)
	}
	keys := zipfKeys(1 << 16)
	for i := range 1 << 20 {
		p.Decide(keys[i&(1<<16-1)], t0.Add(time.Duration(i)*time.Microsecond))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 1 << 20; b.Loop(); i++ {
		p.Decide(keys[i&(1<<16-1)], t0.Add(time.Duration(i)*time.Microsecond))
	}
}

// BenchmarkDecision is the router's decision per record, excluding the
// produce: the clock read, and what Produce does under the router's lock
// (Router.accept: policy decision, topic, main generation, overflow key
// state and entry barrier, the pending list), and the lock. Sends are preallocated,
// and acknowledged outside the timed region every 4096 records.
func BenchmarkDecision(b *testing.B) {
	r := benchRouter(b, &stepClock{})
	keys := zipfKeys(1 << 16)
	const batch = 4096
	sends := make([]send, batch)
	recs := make([]kgo.Record, batch)
	acts := make([]action, batch)
	prod := &ackProducer{}
	noop := func(*kgo.Record, error) {}
	i := 0
	prepare := func() {
		for j := range batch {
			recs[j] = kgo.Record{Key: keys[(i+j)&(1<<16-1)]}
			sends[j] = send{r: r, ctx: context.Background(), rec: &recs[j], promise: noop}
		}
	}
	run := func(n int) {
		for j := range n {
			s := &sends[j]
			now := r.clk.Now()
			r.mu.Lock()
			acts[j], _ = r.accept(s, now)
			r.mu.Unlock()
		}
		i += n
	}
	ack := func(n int) {
		for j := range n {
			if acts[j] == actProduce {
				prod.Produce(context.Background(), &recs[j], sends[j].produced)
			}
		}
		if err := r.Flush(context.Background()); err != nil { // held ones are released by now
			b.Fatal(err)
		}
		prepare()
	}
	prepare()
	for range (1 << 20) / batch { // warm up: hot keys enter overflow
		run(batch)
		ack(batch)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; done += batch {
		n := min(batch, b.N-done)
		run(n)
		b.StopTimer()
		ack(n)
		b.StartTimer()
	}
	b.StopTimer()
	if s := r.Stats(); s.Overflow == 0 || s.Main == 0 || s.Failed+s.TimedOut != 0 {
		b.Fatalf("no mix of lanes, or failures: %+v", s)
	}
}

// BenchmarkProduce is the router's whole per-record cost except the
// client's produce: the decision, the send's state (two allocations), the
// acknowledgement's bookkeeping, the promise and the counters.
func BenchmarkProduce(b *testing.B) {
	runProduce(b, benchRouter(b, &stepClock{}))
}

// BenchmarkProduceRealClock is BenchmarkProduce reading time.Now per
// decision (which then serves as the record's timestamp, sparing the
// client its own read).
func BenchmarkProduceRealClock(b *testing.B) {
	runProduce(b, benchRouter(b, clock.Real{}))
}
