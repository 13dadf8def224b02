package kafka

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keyshard/keyshard/client/stream"
	"github.com/keyshard/keyshard/clock/clocktest"
	"github.com/keyshard/keyshard/placement"
)

// faultEnv is a one-broker kfake cluster whose one-partition topic
// "events" holds n records (key k<i%10>, value i), one a batch, produced by a client
// closed since, and a reader client that sends no request of its own
// accord: every Metadata request naming the topic and every Fetch request
// the cluster sees comes from the PartitionReader under test.
type faultEnv struct {
	c  *kfake.Cluster
	cl *kgo.Client
	// broker is the cluster's one broker, as a Metadata answer lists it.
	broker kmsg.MetadataResponseBroker
}

func newFaultEnv(t *testing.T, n int) *faultEnv {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "events"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	prod, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("events"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range n { // one batch each, so that a Fetch returns a few
		err = prod.ProduceSync(testCtx(t), &kgo.Record{Key: fmt.Appendf(nil, "k%d", i%10), Value: fmt.Appendf(nil, "%d", i)}).FirstErr()
		if err != nil {
			t.Fatal(err)
		}
	}
	prod.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	host, port, err := net.SplitHostPort(c.ListenAddrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	return &faultEnv{c: c, cl: cl, broker: kmsg.MetadataResponseBroker{NodeID: 0, Host: host, Port: int32(p)}}
}

// metadataFault is how a Metadata answer for "events" fails.
type metadataFault int

const (
	metaOK                metadataFault = iota
	metaTopicNoLeader                   // topic-level LEADER_NOT_AVAILABLE (a topic being created)
	metaPartitionNoLeader               // partition-level LEADER_NOT_AVAILABLE (an election)
	metaLeaderless                      // partition leader -1, no error code
	metaTopicAuth                       // topic-level TOPIC_AUTHORIZATION_FAILED
	metaConnection                      // the broker drops the connection: no answer
)

// failMetadata answers the n-th Metadata request naming "events" (from 1)
// as plan(n) says, and counts the answers it failed in *failed; plan(n)
// == metaOK lets the cluster answer.
func (e *faultEnv) failMetadata(plan func(n int) metadataFault, failed *atomic.Int64) {
	n := 0
	e.c.ControlKey(int16(kmsg.Metadata), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		req := kr.(*kmsg.MetadataRequest)
		if len(req.Topics) != 1 || req.Topics[0].Topic == nil || *req.Topics[0].Topic != "events" {
			return nil, nil, false // kgo's own requests for brokers
		}
		n++
		f := plan(n)
		if f == metaOK {
			return nil, nil, false
		}
		e.c.KeepControl()
		failed.Add(1)
		if f == metaConnection {
			return nil, errors.New("injected: connection dropped"), true // kfake closes the connection
		}
		resp := req.ResponseKind().(*kmsg.MetadataResponse)
		resp.Brokers = []kmsg.MetadataResponseBroker{e.broker}
		resp.ControllerID = 0
		mt := kmsg.NewMetadataResponseTopic()
		mt.Topic = kmsg.StringPtr("events")
		mp := kmsg.NewMetadataResponseTopicPartition()
		mp.Partition, mp.Leader, mp.Replicas, mp.ISR = 0, 0, []int32{0}, []int32{0}
		switch f {
		case metaTopicNoLeader:
			mt.ErrorCode = kerr.LeaderNotAvailable.Code
		case metaPartitionNoLeader:
			mp.ErrorCode, mp.Leader = kerr.LeaderNotAvailable.Code, -1
		case metaLeaderless:
			mp.Leader = -1
		case metaTopicAuth:
			mt.ErrorCode = kerr.TopicAuthorizationFailed.Code
		}
		if mt.ErrorCode == 0 {
			mt.Partitions = append(mt.Partitions, mp)
		}
		resp.Topics = append(resp.Topics, mt)
		return resp, nil, true
	})
}

// fetchFault is how a Fetch fails.
type fetchFault int

const (
	fetchOK          fetchFault = iota
	fetchNotLeader              // partition-level NOT_LEADER_FOR_PARTITION (the leader moved)
	fetchFencedEpoch            // partition-level FENCED_LEADER_EPOCH
	fetchTopLevel               // top-level REQUEST_TIMED_OUT
	fetchConnection             // the broker drops the connection: no answer
	fetchTopicAuth              // partition-level TOPIC_AUTHORIZATION_FAILED
	fetchOffsetRange            // partition-level OFFSET_OUT_OF_RANGE
)

// failFetch answers the n-th Fetch request (from 1) as plan(n) says, and
// counts the requests it failed in *failed.
func (e *faultEnv) failFetch(plan func(n int) fetchFault, failed *atomic.Int64) {
	n := 0
	e.c.ControlKey(int16(kmsg.Fetch), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		req := kr.(*kmsg.FetchRequest)
		n++
		f := plan(n)
		if f == fetchOK {
			return nil, nil, false
		}
		e.c.KeepControl()
		failed.Add(1)
		if f == fetchConnection {
			return nil, errors.New("injected: connection dropped"), true // kfake closes the connection
		}
		resp := req.ResponseKind().(*kmsg.FetchResponse)
		if f == fetchTopLevel {
			resp.ErrorCode = kerr.RequestTimedOut.Code
			return resp, nil, true
		}
		for _, rt := range req.Topics {
			t := kmsg.NewFetchResponseTopic()
			t.Topic, t.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				p := kmsg.NewFetchResponseTopicPartition()
				p.Partition, p.HighWatermark, p.LastStableOffset, p.LogStartOffset = rp.Partition, -1, -1, -1
				p.ErrorCode = map[fetchFault]int16{
					fetchNotLeader:   kerr.NotLeaderForPartition.Code,
					fetchFencedEpoch: kerr.FencedLeaderEpoch.Code,
					fetchTopicAuth:   kerr.TopicAuthorizationFailed.Code,
					fetchOffsetRange: kerr.OffsetOutOfRange.Code,
				}[f]
				t.Partitions = append(t.Partitions, p)
			}
			resp.Topics = append(resp.Topics, t)
		}
		return resp, nil, true
	})
}

// driveClock advances clk past every backoff the code under test sleeps
// on, until ctx ends.
func driveClock(ctx context.Context, clk *clocktest.Fake, wg *sync.WaitGroup) {
	wg.Go(func() { // exits when ctx ends
		for clk.BlockUntilContext(ctx, 1) == nil {
			clk.Advance(stream.DefaultMaxRetryDelay)
		}
	})
}

// consumeAll runs a stream.Consumer of every bucket from position 0 on r
// until it has handled n records, or Run returns; it returns the values
// handled, in order, and Run's error (nil once n were handled).
func consumeAll(t *testing.T, r stream.Reader, n int, opts stream.ConsumerOptions) (*stream.Consumer, []string, error) {
	t.Helper()
	h, err := placement.NewHasher(placement.HashXXH64, 8)
	if err != nil {
		t.Fatal(err)
	}
	flow, err := stream.NewFlow(h, 0)
	if err != nil {
		t.Fatal(err)
	}
	for b := range 8 {
		if err := flow.Gain(stream.BucketPosition{Bucket: b, Position: 0}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	var got []string
	c, err := stream.NewConsumer(flow, r, func(_ context.Context, rec stream.Record) error {
		if rec.Position != uint64(len(got)) {
			return fmt.Errorf("record at %d after %d records", rec.Position, len(got))
		}
		if got = append(got, string(rec.Payload)); len(got) == n {
			cancel()
		}
		return nil
	}, opts)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	if clk, ok := opts.Clock.(*clocktest.Fake); ok {
		driveClock(ctx, clk, &wg)
	}
	err = c.Run(ctx)
	cancel()
	wg.Wait()
	if len(got) == n && errors.Is(err, context.Canceled) {
		err = nil
	}
	return c, got, err
}

// TestConsumerRidesOutBrokerFaults: a stream.Consumer on a PartitionReader
// goes on through a leader election (LEADER_NOT_AVAILABLE, no leader), a
// leader that moved (NOT_LEADER_FOR_PARTITION, FENCED_LEADER_EPOCH), a
// retriable top-level error and a dropped connection, some in a row, and
// handles every record once, in offset order; every fault is a retry,
// counted in Stats and logged at warn level.
func TestConsumerRidesOutBrokerFaults(t *testing.T) {
	const n = 600
	e := newFaultEnv(t, n)
	var metaFailed, fetchFailed atomic.Int64
	e.failMetadata(func(n int) metadataFault {
		return map[int]metadataFault{1: metaTopicNoLeader, 2: metaPartitionNoLeader, 3: metaLeaderless, 6: metaPartitionNoLeader}[n]
	}, &metaFailed)
	e.failFetch(func(n int) fetchFault {
		return map[int]fetchFault{
			2: fetchNotLeader, 3: fetchTopLevel, 4: fetchConnection, 5: fetchFencedEpoch, // in a row
			9: fetchConnection, 12: fetchNotLeader, 20: fetchTopLevel,
		}[n]
	}, &fetchFailed)
	r, err := NewPartitionReader(e.cl, "events", 0, PartitionReaderConfig{MaxWait: 10 * time.Millisecond, MaxBytes: 1024})
	if err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	c, got, err := consumeAll(t, r, n, stream.ConsumerOptions{Clock: clocktest.NewFake(t0), Logger: logs.logger()})
	if err != nil {
		t.Fatalf("Run = %v after %d records", err, len(got))
	}
	for i, v := range got {
		if v != strconv.Itoa(i) {
			t.Fatalf("record %d has value %s", i, v)
		}
	}
	injected := metaFailed.Load() + fetchFailed.Load()
	if metaFailed.Load() != 4 || fetchFailed.Load() != 7 {
		t.Errorf("injected %d Metadata and %d Fetch faults, want 4 and 7: the test did not run as planned", metaFailed.Load(), fetchFailed.Load())
	}
	// One retry per fault, and per Read that met the dead connection of
	// a dropped one before the client replaced it ("the broker connection
	// has died"): at most one more per drop. Each is logged.
	const drops = 2
	s := c.Stats()
	if s.ReadRetries < uint64(injected) || s.ReadRetries > uint64(injected+drops) || s.Streak != 0 || s.LastError == nil {
		t.Errorf("Stats = %+v, want %d to %d retries, no streak; log:\n%s", s, injected, injected+drops, logs.String())
	}
	if warned := strings.Count(logs.String(), "level=WARN"); uint64(warned) != s.ReadRetries {
		t.Errorf("%d retries logged at warn level, %d counted", warned, s.ReadRetries)
	}
	for _, want := range []string{"level=WARN", "LEADER_NOT_AVAILABLE", "NOT_LEADER_FOR_PARTITION", "FENCED_LEADER_EPOCH",
		"REQUEST_TIMED_OUT", "failures_in_a_row=4", "retry_in=", "stream read again after transient errors"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, logs.String())
		}
	}
}

// TestConsumerStopsOnFinalBrokerErrors: errors that reading again cannot
// fix stop Run at once, after the transient ones before them were ridden
// out: a topic the client may not read (from Metadata or from Fetch) and
// a topic that does not exist are a *ConfigError naming the field, an
// offset the partition does not have is ErrOffsetOutOfRange.
func TestConsumerStopsOnFinalBrokerErrors(t *testing.T) {
	t.Run("metadata authorization", func(t *testing.T) {
		e := newFaultEnv(t, 10)
		var failed atomic.Int64
		e.failMetadata(func(n int) metadataFault {
			return map[int]metadataFault{1: metaPartitionNoLeader, 2: metaTopicAuth}[n]
		}, &failed)
		r, _ := NewPartitionReader(e.cl, "events", 0, PartitionReaderConfig{MaxWait: 10 * time.Millisecond})
		c, got, err := consumeAll(t, r, 10, stream.ConsumerOptions{Clock: clocktest.NewFake(t0)})
		asConfigError(t, "Run", err, "PartitionReader.Read", "topic")
		if !errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, stream.ErrTransient) || len(got) != 0 {
			t.Errorf("Run = %v after %d records, want TOPIC_AUTHORIZATION_FAILED, not transient, none", err, len(got))
		}
		if s := c.Stats(); s.ReadRetries != 1 {
			t.Errorf("Stats = %+v, want the one election ridden out", s)
		}
	})
	t.Run("fetch authorization", func(t *testing.T) {
		e := newFaultEnv(t, 10)
		var failed atomic.Int64
		e.failFetch(func(n int) fetchFault { return map[int]fetchFault{1: fetchFencedEpoch, 2: fetchTopicAuth}[n] }, &failed)
		r, _ := NewPartitionReader(e.cl, "events", 0, PartitionReaderConfig{MaxWait: 10 * time.Millisecond})
		c, _, err := consumeAll(t, r, 10, stream.ConsumerOptions{Clock: clocktest.NewFake(t0)})
		asConfigError(t, "Run", err, "PartitionReader.Read", "topic")
		if !errors.Is(err, kerr.TopicAuthorizationFailed) {
			t.Errorf("Run = %v, want TOPIC_AUTHORIZATION_FAILED", err)
		}
		if s := c.Stats(); s.ReadRetries != 1 {
			t.Errorf("Stats = %+v, want the fenced epoch ridden out", s)
		}
	})
	t.Run("unknown topic", func(t *testing.T) {
		e := newFaultEnv(t, 1)
		r, _ := NewPartitionReader(e.cl, "no-such-topic", 0, PartitionReaderConfig{})
		c, _, err := consumeAll(t, r, 1, stream.ConsumerOptions{Clock: clocktest.NewFake(t0)})
		asConfigError(t, "Run", err, "PartitionReader.Read", "topic")
		if !errors.Is(err, kerr.UnknownTopicOrPartition) || c.Stats().ReadRetries != 0 {
			t.Errorf("Run = %v, %d retries; want UNKNOWN_TOPIC_OR_PARTITION at once", err, c.Stats().ReadRetries)
		}
	})
	t.Run("offset out of range", func(t *testing.T) {
		e := newFaultEnv(t, 10)
		var failed atomic.Int64
		e.failFetch(func(n int) fetchFault { return map[int]fetchFault{1: fetchNotLeader, 2: fetchOffsetRange}[n] }, &failed)
		r, _ := NewPartitionReader(e.cl, "events", 0, PartitionReaderConfig{MaxWait: 10 * time.Millisecond})
		c, _, err := consumeAll(t, r, 10, stream.ConsumerOptions{Clock: clocktest.NewFake(t0)})
		if !errors.Is(err, ErrOffsetOutOfRange) || errors.Is(err, stream.ErrTransient) || c.Stats().ReadRetries != 1 {
			t.Errorf("Run = %v after %d retries, want ErrOffsetOutOfRange after 1", err, c.Stats().ReadRetries)
		}
	})
}

// TestPartitionReaderMarksTransient: what Read returns, error by error.
func TestPartitionReaderMarksTransient(t *testing.T) {
	ctx := testCtx(t)

	// No broker listening: a connection refused is transient.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	down, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.RequestRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	r, _ := NewPartitionReader(down, "events", 0, PartitionReaderConfig{})
	if _, _, err := r.Read(ctx, 0); !errors.Is(err, stream.ErrTransient) {
		t.Errorf("Read with no broker: %v, want it transient", err)
	}

	// A connection closed at once by a cluster that never answered the
	// reader is kgo's guess of a SASL or TLS problem: not transient. Once
	// it has answered, it is.
	e := newFaultEnv(t, 5)
	var failed atomic.Int64
	e.failMetadata(func(n int) metadataFault { return map[int]metadataFault{1: metaConnection}[n] }, &failed)
	r, _ = NewPartitionReader(e.cl, "events", 0, PartitionReaderConfig{MaxWait: 10 * time.Millisecond})
	_, _, err = r.Read(ctx, 0)
	if fe, ok := errors.AsType[*kgo.ErrFirstReadEOF](err); !ok || errors.Is(err, stream.ErrTransient) {
		t.Errorf("Read with the connection closed at once: %v (%v), want a kgo.ErrFirstReadEOF, not transient", err, fe)
	}

	// Fetch faults, each wrapping its kerr error, and transient.
	e.failFetch(func(n int) fetchFault {
		return map[int]fetchFault{1: fetchNotLeader, 2: fetchFencedEpoch, 3: fetchTopLevel, 4: fetchConnection}[n]
	}, &failed)
	r, _ = NewPartitionReader(e.cl, "events", 0, PartitionReaderConfig{MaxWait: 10 * time.Millisecond})
	for _, want := range []error{kerr.NotLeaderForPartition, kerr.FencedLeaderEpoch, kerr.RequestTimedOut, nil} {
		_, next, err := r.Read(ctx, 2)
		if !errors.Is(err, stream.ErrTransient) || (want != nil && !errors.Is(err, want)) || next != 2 {
			t.Errorf("Read = next %d, %v; want 2 and a transient error wrapping %v", next, err, want)
		}
	}
	recs, next, err := r.Read(ctx, 2)
	if errors.Is(err, stream.ErrTransient) {
		// The dropped connection's, met once more before the client
		// replaced it ("the broker connection has died").
		recs, next, err = r.Read(ctx, 2)
	}
	if err != nil || len(recs) != 3 || next != 5 {
		t.Errorf("Read after the faults = %d records, next %d, %v; want 3, 5", len(recs), next, err)
	}

	// A closed client is not transient: reading again cannot pass.
	e.cl.Close()
	if _, _, err := r.Read(ctx, 0); err == nil || errors.Is(err, stream.ErrTransient) {
		t.Errorf("Read with a closed client: %v, want an error that is not transient", err)
	}
}
