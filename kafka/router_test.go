package kafka

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keyshard/keyshard/hotkey"
)

// Kafka's UtilsTest.testMurmur2 vectors (Java ints), and the partitions the
// Java client's default partitioner derives from them:
// Utils.toPositive(hash) % n.
var javaMurmur2 = []struct {
	key  string
	hash int32
}{
	{"21", -973932308},
	{"foobar", -790332482},
	{"a-little-bit-long-string", -985981536},
	{"a-little-bit-longer-string", -1486304829},
	{"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971},
	{"abc", 479470107},
}

func TestKeyPartitionMatchesJava(t *testing.T) {
	for _, c := range javaMurmur2 {
		if got := int32(murmur2([]byte(c.key))); got != c.hash {
			t.Errorf("murmur2(%q) = %d, Java %d", c.key, got, c.hash)
		}
		for _, n := range []int32{1, 3, 4, 10, 128} {
			want := (c.hash & 0x7fffffff) % n // Utils.toPositive, then % n
			if got := KeyPartition([]byte(c.key), n); got != want {
				t.Errorf("KeyPartition(%q, %d) = %d, Java %d", c.key, n, got, want)
			}
		}
	}
	// Pinned outright, so that a change to the arithmetic above is caught.
	for _, c := range []struct {
		key  string
		n    int32
		want int32
	}{
		{"foobar", 4, 2}, {"21", 4, 0}, {"abc", 4, 3}, {"foobar", 10, 6}, {"abc", 10, 7},
	} {
		if got := KeyPartition([]byte(c.key), c.n); got != c.want {
			t.Errorf("KeyPartition(%q, %d) = %d, want %d", c.key, c.n, got, c.want)
		}
	}
}

func TestPartitionerCheck(t *testing.T) {
	for _, c := range []struct {
		name string
		p    kgo.Partitioner
		ok   bool
	}{
		{"default uniform bytes", kgo.UniformBytesPartitioner(64<<10, true, true, nil), true},
		{"sticky key", kgo.StickyKeyPartitioner(nil), true},
		{"sticky key murmur2", kgo.StickyKeyPartitioner(kgo.KafkaHasher(murmur2)), true},
		{"round robin", kgo.RoundRobinPartitioner(), false},
		{"uniform bytes ignoring keys", kgo.UniformBytesPartitioner(64<<10, true, false, nil), false},
		{"sarama fnv", kgo.StickyKeyPartitioner(kgo.SaramaCompatHasher(func(b []byte) uint32 { return uint32(len(b)) })), false},
		{"manual", kgo.ManualPartitioner(), false},
		{"nil", nil, false},
	} {
		err := checkPartitioner(c.p)
		if (err == nil) != c.ok {
			t.Errorf("%s: checkPartitioner = %v, want ok %v", c.name, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrBadConfig) {
			t.Errorf("%s: %v does not wrap ErrBadConfig", c.name, err)
		}
	}
}

// TestSetRulesChecksDeadLetter: a dead-letter rule needs a dead-letter
// topic. (NewRouter's checks: TestNewRouterErrors.)
func TestSetRulesChecksDeadLetter(t *testing.T) {
	e := newEnv(t)
	r := e.router(t, testConfig(e))
	if err := r.SetRules(mustRules(t, "dead-letter x")); err != nil {
		t.Errorf("SetRules: %v", err)
	}
	cfg := testConfig(e)
	cfg.DeadLetterTopic = ""
	r2 := e.router(t, cfg)
	if err := r2.SetRules(mustRules(t, "dead-letter x")); !errors.Is(err, ErrBadConfig) {
		t.Errorf("SetRules with a dead-letter rule and no topic: %v", err)
	}
}

func TestMissingKey(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	r := e.router(t, testConfig(e))

	// No KeyFunc: an error, before Produce returns; never a silent drop.
	called := 0
	r.Produce(ctx, rec("", "no key"), func(_ *kgo.Record, err error) {
		called++
		if !errors.Is(err, ErrMissingKey) {
			t.Errorf("err = %v, want ErrMissingKey", err)
		}
	})
	if called != 1 {
		t.Fatalf("promise called %d times before Produce returned, want 1", called)
	}
	if err := r.ProduceSync(ctx, &kgo.Record{Key: []byte{}, Value: []byte("empty key")}); !errors.Is(err, ErrMissingKey) {
		t.Errorf("empty key: %v", err)
	}
	if err := r.ProduceSync(ctx, nil); !errors.Is(err, ErrMissingKey) {
		t.Errorf("nil record: %v", err)
	}

	// A KeyFunc computes the key; its errors are wrapped.
	cfg := testConfig(e)
	cfg.KeyFunc = func(rec *kgo.Record) ([]byte, error) {
		if v, ok := strings.CutPrefix(string(rec.Value), "user="); ok {
			return []byte(v), nil
		}
		return nil, errors.New("no user in value")
	}
	r2 := e.router(t, cfg)
	got := rec("", "user=42")
	if err := r2.ProduceSync(ctx, got); err != nil {
		t.Fatal(err)
	}
	if string(got.Key) != "42" || got.Topic != mainTopic || got.Partition != KeyPartition([]byte("42"), numPartitions) {
		t.Errorf("computed key: key %q topic %q partition %d", got.Key, got.Topic, got.Partition)
	}
	err := r2.ProduceSync(ctx, rec("", "anonymous"))
	if !errors.Is(err, ErrMissingKey) || !strings.Contains(err.Error(), "no user in value") {
		t.Errorf("KeyFunc error: %v", err)
	}

	if s := r.Stats(); s.MissingKey != 3 || s.Resolved() != 3 {
		t.Errorf("stats: %+v", s)
	}
	if s := r2.Stats(); s.MissingKey != 1 || s.Main != 1 || s.Resolved() != 2 {
		t.Errorf("stats with KeyFunc: %+v", s)
	}
	if n := len(e.consumeAll(t, mainTopic, overflowTopic, dlqTopic)); n != 1 {
		t.Errorf("%d records in the topics, want 1", n)
	}
}

func TestBrokerError(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	r := e.router(t, testConfig(e))

	h := e.c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: mainTopic, Err: kerr.InvalidRecord, Count: -1})
	err := r.ProduceSync(ctx, rec("k1", "v"))
	if !errors.Is(err, kerr.InvalidRecord) {
		t.Fatalf("err = %v, want INVALID_RECORD", err)
	}
	h.Remove()
	if err := r.ProduceSync(ctx, rec("k1", "v2")); err != nil {
		t.Fatalf("after the fault: %v", err)
	}
	if s := r.Stats(); s.Failed != 1 || s.Main != 1 {
		t.Errorf("stats: %+v", s)
	}
}

// hangProduce makes the broker never answer a produce request.
func hangProduce(c *kfake.Cluster) {
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		return nil, nil, true // handled, no response: the request hangs
	})
}

func TestNeverAnsweredFakeClock(t *testing.T) {
	e := newEnv(t)
	r := e.router(t, testConfig(e))
	hangProduce(e.c)

	done := make(chan error, 1)
	r.Produce(testCtx(t), rec("k", "v"), func(_ *kgo.Record, err error) { done <- err })
	e.clk.MustBlockUntil(t, 2) // the refresh ticker and the timeout of the oldest send
	e.clk.Advance(DefaultSendTimeout - time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("resolved before the timeout: %v", err)
	default:
	}
	e.clk.Advance(time.Millisecond)
	if err := <-done; !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if s := r.Stats(); s.TimedOut != 1 || s.Pending != 0 {
		t.Errorf("stats: %+v", s)
	}
}

func TestNeverAnsweredRealClock(t *testing.T) {
	e := newEnv(t)
	cfg := testConfig(e)
	cfg.Clock = nil
	cfg.SendTimeout = 300 * time.Millisecond
	r := e.router(t, cfg)
	hangProduce(e.c)
	start := time.Now()
	err := r.ProduceSync(context.Background(), rec("k", "v"))
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if d := time.Since(start); d < cfg.SendTimeout || d > cfg.SendTimeout+5*time.Second {
		t.Errorf("resolved after %v, want about %v", d, cfg.SendTimeout)
	}
	r.Close() // returns: nothing is pending
}

// TestLateAck: a send that timed out may still be written; it is counted.
func TestLateAck(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	r := e.router(t, testConfig(e))
	release := make(chan struct{})
	var once sync.Once
	e.c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		once.Do(func() { e.c.SleepControl(func() { <-release }) })
		return nil, nil, false
	})
	done := make(chan error, 1)
	r.Produce(ctx, rec("k", "late"), func(_ *kgo.Record, err error) { done <- err })
	e.clk.MustBlockUntil(t, 2) // the refresh ticker and the timeout of the oldest send
	e.clk.Advance(DefaultSendTimeout)
	if err := <-done; !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	close(release)
	if err := e.cl.Flush(ctx); err != nil { // the client's promise has run
		t.Fatal(err)
	}
	if s := r.Stats(); s.TimedOut != 1 || s.LateAcks != 1 || s.Main != 0 {
		t.Errorf("stats: %+v", s)
	}
	if got := e.consumeAll(t, mainTopic); len(got) != 1 {
		t.Errorf("%d records written, want the late one", len(got))
	}
}

// TestEverySendResolves: produced = consumed + counted drops, through
// missing keys, drop and dead-letter rules, a broker error and a broker
// that never answers. Every promise is called exactly once.
func TestEverySendResolves(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	cfg := testConfig(e)
	cfg.Policy.Rules = mustRules(t, "drop loud\ndead-letter bad:*\noverflow hot:*")
	r := e.router(t, cfg)
	res := newResults()
	var sent []*kgo.Record
	send := func(key, value string) {
		rc := rec(key, value)
		sent = append(sent, rc)
		r.Produce(ctx, rc, res.promise)
	}
	batch := func(phase string) {
		for i := range 20 {
			keys := []string{fmt.Sprintf("k%d", i%5), "loud", "bad:1", fmt.Sprintf("hot:%d", i%3), ""}
			send(keys[i%len(keys)], fmt.Sprintf("%s-%d", phase, i))
		}
	}

	batch("ok")
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	h := e.c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.InvalidRecord, Count: -1})
	batch("broker-error")
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	h.Remove()
	batch("ok2")
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	hangProduce(e.c)
	batch("hang")
	e.clk.MustBlockUntil(t, 2) // the refresh ticker and the timeout of the oldest send
	e.clk.Advance(DefaultSendTimeout)
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	res.check(t, sent)

	s := r.Stats()
	if s.Resolved() != uint64(len(sent)) || s.Pending != 0 {
		t.Fatalf("%d sends, %d resolved, %d pending: %+v", len(sent), s.Resolved(), s.Pending, s)
	}
	if s.Dropped == 0 || s.MissingKey == 0 || s.Failed == 0 || s.TimedOut == 0 || s.DeadLetter == 0 || s.Overflow == 0 || s.Main == 0 {
		t.Errorf("some outcome never happened: %+v", s)
	}
	for _, rc := range sent {
		res.mu.Lock()
		err := res.errs[rc]
		res.mu.Unlock()
		phase, _, _ := strings.Cut(string(rc.Value), "-")
		switch {
		case len(rc.Key) == 0:
			if !errors.Is(err, ErrMissingKey) {
				t.Errorf("%s: %v, want ErrMissingKey", rc.Value, err)
			}
		case string(rc.Key) == "loud":
			if !errors.Is(err, ErrDropped) {
				t.Errorf("%s: %v, want ErrDropped", rc.Value, err)
			}
		case phase == "broker":
			if !errors.Is(err, kerr.InvalidRecord) {
				t.Errorf("%s: %v, want INVALID_RECORD", rc.Value, err)
			}
		case phase == "hang":
			if !errors.Is(err, ErrTimeout) {
				t.Errorf("%s: %v, want ErrTimeout", rc.Value, err)
			}
		case err != nil:
			t.Errorf("%s: %v", rc.Value, err)
		}
	}

	// Nothing lost: the topics hold exactly the acknowledged records.
	got := e.consumeAll(t, mainTopic, overflowTopic, dlqTopic)
	acked := map[string]bool{}
	for _, rc := range sent {
		res.mu.Lock()
		err := res.errs[rc]
		res.mu.Unlock()
		if err == nil {
			acked[string(rc.Value)] = true
		}
	}
	if uint64(len(got)) != s.Main+s.Overflow+s.DeadLetter || len(got) != len(acked) {
		t.Errorf("consumed %d, acknowledged %d (stats %d)", len(got), len(acked), s.Main+s.Overflow+s.DeadLetter)
	}
	for _, g := range got {
		if !acked[string(g.Value)] {
			t.Errorf("consumed %q, which was not acknowledged", g.Value)
		}
	}
	if uint64(len(sent)) != uint64(len(got))+s.Dropped+s.MissingKey+s.Failed+s.TimedOut {
		t.Errorf("produced %d != consumed %d + dropped %d + missing key %d + failed %d + timed out %d",
			len(sent), len(got), s.Dropped, s.MissingKey, s.Failed, s.TimedOut)
	}
}

func TestPolicyPriorities(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	cfg := testConfig(e)
	cfg.Policy.Rules = mustRules(t, `
drop          x:1
dead-letter   x:1,x:2
skip-stateful x:1,x:2,x:3
overflow      x:*
junk          null
overflow      batch:* spread
`)
	r := e.router(t, cfg)
	for _, c := range []struct {
		key, topic string
		err        error
		header     string
	}{
		{"x:1", "", ErrDropped, ""},
		{"x:2", dlqTopic, nil, ""},
		{"x:3", mainTopic, nil, HeaderSkipStateful},
		{"x:4", overflowTopic, nil, ""},
		{"NULL", overflowTopic, nil, ""},
		{"y", mainTopic, nil, ""},
		{"batch:7", overflowTopic, nil, HeaderKey},
	} {
		rc := rec(c.key, "v")
		err := r.ProduceSync(ctx, rc)
		if !errors.Is(err, c.err) || (c.err == nil && err != nil) {
			t.Errorf("%s: err %v, want %v", c.key, err, c.err)
			continue
		}
		if c.err != nil {
			continue
		}
		if rc.Topic != c.topic {
			t.Errorf("%s: topic %q, want %q", c.key, rc.Topic, c.topic)
		}
		if c.header != "" {
			if _, ok := header(rc, c.header); !ok {
				t.Errorf("%s: no %s header: %v", c.key, c.header, rc.Headers)
			}
		}
	}
	s := r.Stats()
	if s.Policy.Count(hotkey.Drop, hotkey.DropRule) != 1 || s.Policy.Count(hotkey.DeadLetter, hotkey.DeadLetterRule) != 1 ||
		s.Policy.Count(hotkey.SkipStateful, hotkey.SkipStatefulRule) != 1 || s.Policy.Count(hotkey.Overflow, hotkey.JunkKey) != 1 {
		t.Errorf("policy counters: %+v", s.Policy)
	}
	if s.Dropped != 1 || s.DeadLetter != 1 || s.Main != 2 || s.Overflow != 3 {
		t.Errorf("stats: %+v", s)
	}
}

func TestKillSwitch(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	cfg := testConfig(e)
	cfg.Policy.Rules = mustRules(t, "overflow x:*\ndrop x:loud")
	r := e.router(t, cfg)

	first := rec("x:1", "1")
	if err := r.ProduceSync(ctx, first); err != nil || first.Topic != overflowTopic {
		t.Fatalf("forced key: %v, topic %q", err, first.Topic)
	}
	r.SetEnabled(false)
	if r.Enabled() {
		t.Fatal("still enabled")
	}
	during := rec("x:1", "2")
	if err := r.ProduceSync(ctx, during); err != nil || during.Topic != mainTopic {
		t.Fatalf("kill switch: %v, topic %q", err, during.Topic)
	}
	if _, ok := header(during, HeaderWaitOverflow); ok {
		t.Error("the kill switch must not make main wait for overflow")
	}
	if err := r.ProduceSync(ctx, rec("x:loud", "3")); !errors.Is(err, ErrDropped) {
		t.Errorf("drop rules apply with the kill switch: %v", err)
	}
	r.SetEnabled(true)
	after := rec("x:1", "4")
	if err := r.ProduceSync(ctx, after); err != nil || after.Topic != overflowTopic {
		t.Fatalf("re-enabled: %v, topic %q", err, after.Topic)
	}
	// Back in overflow: the record waits for the main record sent meanwhile.
	want := fmt.Sprintf("%d:%d", during.Partition, during.Offset)
	if got, _ := header(after, HeaderWaitMain); got != want {
		t.Errorf("%s = %q, want %q", HeaderWaitMain, got, want)
	}
	if c := r.Stats().Policy; c.Count(hotkey.Main, hotkey.KillSwitch) != 1 {
		t.Errorf("kill switch decisions: %+v", c)
	}
}

// TestEntryBarrierHolds: a key entering overflow while its main records are
// in flight is held until they are acknowledged, then carries their
// position.
func TestEntryBarrierHolds(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	r := e.router(t, testConfig(e))

	if err := r.ProduceSync(ctx, rec("k", "m0")); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var once sync.Once
	e.c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		once.Do(func() { e.c.SleepControl(func() { <-release }) })
		return nil, nil, false // then handle it normally
	})
	res := newResults()
	m1 := rec("k", "m1")
	r.Produce(ctx, m1, res.promise)
	if err := r.SetRules(mustRules(t, "overflow k")); err != nil {
		t.Fatal(err)
	}
	o1, o2 := rec("k", "o1"), rec("k", "o2")
	r.Produce(ctx, o1, res.promise)
	r.Produce(ctx, o2, res.promise)
	if s := r.Stats(); s.Held != 2 || s.Barriers != 1 {
		t.Fatalf("held %d, barriers %d; want 2 held behind the in-flight main record", s.Held, s.Barriers)
	}
	close(release)
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	res.check(t, []*kgo.Record{m1, o1, o2})
	want := fmt.Sprintf("%d:%d", m1.Partition, m1.Offset)
	for _, o := range []*kgo.Record{o1, o2} {
		if got, _ := header(o, HeaderWaitMain); got != want {
			t.Errorf("%s: %s = %q, want %q", o.Value, HeaderWaitMain, got, want)
		}
		if o.Topic != overflowTopic || o.Partition != KeyPartition([]byte("k"), numPartitions) {
			t.Errorf("%s: %s/%d", o.Value, o.Topic, o.Partition)
		}
	}
	if o2.Offset != o1.Offset+1 {
		t.Errorf("held records out of order: offsets %d, %d", o1.Offset, o2.Offset)
	}
	// Acknowledged: later overflow records need no header.
	o3 := rec("k", "o3")
	if err := r.ProduceSync(ctx, o3); err != nil {
		t.Fatal(err)
	}
	if _, ok := header(o3, HeaderWaitMain); ok {
		t.Error("o3 carries the barrier though an earlier record is in the topic")
	}
}

// TestHeldRecordTimesOut: a held record resolves within SendTimeout even
// if its barrier never opens, and is never produced.
func TestHeldRecordTimesOut(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	r := e.router(t, testConfig(e))
	hangProduce(e.c)
	res := newResults()
	m := rec("hot", "m")
	r.Produce(ctx, m, res.promise)
	if err := r.SetRules(mustRules(t, "overflow hot")); err != nil {
		t.Fatal(err)
	}
	o := rec("hot", "o")
	r.Produce(ctx, o, res.promise)
	if s := r.Stats(); s.Held != 1 {
		t.Fatalf("held %d, want 1", s.Held)
	}
	e.clk.MustBlockUntil(t, 2) // the refresh ticker and the timeout of the oldest send
	e.clk.Advance(DefaultSendTimeout)
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	res.check(t, []*kgo.Record{m, o})
	if s := r.Stats(); s.TimedOut != 2 || s.Pending != 0 {
		t.Errorf("stats: %+v", s)
	}
}

// TestHandBackWaitsForCommit: a key leaves overflow only once the overflow
// group has committed past its last overflow record; the first main record
// then carries that record's position.
func TestHandBackWaitsForCommit(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	cfg := testConfig(e)
	cfg.RefreshInterval = time.Hour // this test calls Refresh itself
	r := e.router(t, cfg)
	commit := func(p int32, off int64) {
		t.Helper()
		os := kadm.Offsets{}
		os.Add(kadm.Offset{Topic: overflowTopic, Partition: p, At: off, LeaderEpoch: -1})
		if _, err := e.adm.CommitOffsets(ctx, overflowGroup, os); err != nil {
			t.Fatal(err)
		}
		if err := r.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	produce := func(key, value, topic string) *kgo.Record {
		t.Helper()
		rc := rec(key, value)
		if err := r.ProduceSync(ctx, rc); err != nil || rc.Topic != topic {
			t.Fatalf("%s/%s: err %v, topic %q, want %q", key, value, err, rc.Topic, topic)
		}
		return rc
	}
	if KeyPartition([]byte("a"), numPartitions) == KeyPartition([]byte("d"), numPartitions) {
		t.Fatal("a and d must be on different overflow partitions")
	}
	if err := r.SetRules(mustRules(t, "overflow a,d")); err != nil {
		t.Fatal(err)
	}
	var lastA, lastB *kgo.Record
	for i := range 3 {
		lastA = produce("a", fmt.Sprint("o", i), overflowTopic)
		lastB = produce("d", fmt.Sprint("o", i), overflowTopic)
	}
	if err := r.SetRules(nil); err != nil { // no longer forced: sticky until drained
		t.Fatal(err)
	}

	// a: committed up to, not past, its last record; cooled down: stays.
	commit(lastA.Partition, lastA.Offset)
	// d: committed past its last record, not yet cooled down.
	commit(lastB.Partition, lastB.Offset+1)
	e.clk.Advance(time.Minute)
	lastA = produce("a", "o3", overflowTopic)

	// d leaves with its next record, which waits for its last overflow one.
	back := produce("d", "m", mainTopic)
	want := fmt.Sprintf("%d:%d", lastB.Partition, lastB.Offset)
	if got, _ := header(back, HeaderWaitOverflow); got != want {
		t.Errorf("%s = %q, want %q", HeaderWaitOverflow, got, want)
	}

	// a drains: Refresh releases it (Sweep) without waiting for a record.
	commit(lastA.Partition, lastA.Offset+1)
	produce("a", "m", mainTopic)
	c := r.Stats().Policy
	if c.Count(hotkey.Main, hotkey.Released) != 1 || c.Released != 2 || c.Count(hotkey.Overflow, hotkey.Sticky) != 1 {
		t.Errorf("policy: %+v", c)
	}
	if s := r.Stats(); s.TrackedKeys != 0 {
		t.Errorf("%d keys still tracked after the release", s.TrackedKeys)
	}
}

func TestBarrier(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	b, err := NewBarrier(e.adm, BarrierConfig{Lane: Overflow, Topic: mainTopic, Group: mainGroup, Clock: e.clk})
	if err != nil {
		t.Fatal(err)
	}
	commit := func(p int32, off int64) {
		t.Helper()
		os := kadm.Offsets{}
		os.Add(kadm.Offset{Topic: mainTopic, Partition: p, At: off, LeaderEpoch: -1})
		if _, err := e.adm.CommitOffsets(ctx, mainGroup, os); err != nil {
			t.Fatal(err)
		}
	}
	withHeader := func(k, v string) *kgo.Record {
		return &kgo.Record{Key: []byte("k"), Headers: []kgo.RecordHeader{{Key: k, Value: []byte(v)}}}
	}

	if err := b.Wait(ctx, rec("k", "plain")); err != nil {
		t.Errorf("no header: %v", err)
	}
	if err := b.Wait(ctx, withHeader(HeaderWaitOverflow, "1:1000")); err != nil {
		t.Errorf("the other lane's header: %v", err)
	}
	for _, bad := range []string{"", "1", "a:1", "1:b", "-1:3", "1:-3"} {
		if err := b.Wait(ctx, withHeader(HeaderWaitMain, bad)); !errors.Is(err, ErrBadHeader) {
			t.Errorf("header %q: %v, want ErrBadHeader", bad, err)
		}
	}

	commit(2, 5)
	if err := b.Wait(ctx, withHeader(HeaderWaitMain, "2:4")); err != nil {
		t.Errorf("already committed past: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Wait(ctx, withHeader(HeaderWaitMain, "2:5")) }() // exits when Wait returns
	e.clk.MustBlockUntil(t, 1)                                             // Wait is asleep until its next poll
	select {
	case err := <-done:
		t.Fatalf("returned before the commit: %v", err)
	default:
	}
	commit(2, 6)
	b.Notify()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Polling, without Notify: the clock drives it.
	go func() { done <- b.Wait(ctx, withHeader(HeaderWaitMain, "3:0")) }() // exits when Wait returns
	e.clk.MustBlockUntil(t, 1)
	commit(3, 1)
	e.clk.Advance(DefaultPollInterval) // the next poll sees the commit
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	go func() { done <- b.Wait(cctx, withHeader(HeaderWaitMain, "0:99")) }() // exits when Wait returns
	e.clk.MustBlockUntil(t, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}

	if _, err := NewBarrier(e.adm, BarrierConfig{Lane: DeadLetter, Topic: "t", Group: "g"}); !errors.Is(err, ErrBadConfig) {
		t.Errorf("bad lane: %v", err)
	}
	if _, err := NewBarrier(e.adm, BarrierConfig{Lane: Main, Group: "g"}); !errors.Is(err, ErrBadConfig) {
		t.Errorf("no topic: %v", err)
	}
}

func TestBacklogMetric(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	var logs logBuffer
	reg := prometheus.NewRegistry()
	cfg := testConfig(e)
	cfg.Policy.Rules = mustRules(t, "overflow hot")
	cfg.Logger = logs.logger()
	cfg.Registerer = reg
	r := e.router(t, cfg)

	value := strings.Repeat("x", 100)
	var last *kgo.Record
	for range 20 {
		last = rec("hot", value)
		if err := r.ProduceSync(ctx, last); err != nil {
			t.Fatal(err)
		}
	}
	p := last.Partition
	os := kadm.Offsets{}
	os.Add(kadm.Offset{Topic: overflowTopic, Partition: p, At: 5, LeaderEpoch: -1})
	if _, err := e.adm.CommitOffsets(ctx, overflowGroup, os); err != nil {
		t.Fatal(err)
	}
	if err := r.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	s := r.Stats()
	if len(s.Backlog) != numPartitions {
		t.Fatalf("backlog: %+v", s.Backlog)
	}
	for _, b := range s.Backlog {
		want := int64(0)
		if b.Partition == p {
			want = 15
		}
		if b.Messages != want || b.NearRetention {
			t.Errorf("partition %d: %+v, want %d messages", b.Partition, b, want)
		}
	}
	if s.RetentionWarnings != 0 {
		t.Errorf("warned with unlimited retention")
	}

	// 15 records of ~103 bytes against retention.bytes 1800: 1545 ≥ 0.8·1800.
	if _, err := e.adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "retention.bytes", Value: kadm.StringPtr("1800")}}, overflowTopic); err != nil {
		t.Fatal(err)
	}
	for range 2 { // warns once per crossing
		if err := r.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	s = r.Stats()
	if s.RetentionWarnings != 1 {
		t.Errorf("retention warnings %d, want 1", s.RetentionWarnings)
	}
	if !strings.Contains(logs.String(), "approaches retention.bytes") {
		t.Errorf("no warning logged: %s", logs.String())
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() != "keyshard_overflow_backlog_messages" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "partition" && l.GetValue() == fmt.Sprint(p) {
					found = m.GetGauge().GetValue() == 15
				}
			}
		}
	}
	if !found {
		t.Errorf("keyshard_overflow_backlog_messages{partition=%q} is not 15", fmt.Sprint(p))
	}
	r.Close()
	if mfs, _ := reg.Gather(); len(mfs) != 0 {
		t.Errorf("metrics still registered after Close: %d families", len(mfs))
	}
}

// TestClose: Close is idempotent, safe to call concurrently, and returns
// once the router's goroutines have exited; Produce and Start then fail.
func TestClose(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	r := e.router(t, testConfig(e))
	if err := r.ProduceSync(ctx, rec("k", "v")); err != nil {
		t.Fatal(err)
	}
	e.clk.MustBlockUntil(t, 1) // the refresh loop's ticker
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(r.Close)
	}
	wg.Wait()
	r.Close()
	if n := e.clk.Waiters(); n != 0 {
		t.Errorf("%d timers waiting after Close: a goroutine still runs", n)
	}
	if err := r.ProduceSync(ctx, rec("k", "v")); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
	if err := r.Start(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Start after Close: %v, want ErrClosed", err)
	}
	if s := r.Stats(); s.Main != 1 || s.Failed != 1 {
		t.Errorf("stats: %+v", s)
	}
}
