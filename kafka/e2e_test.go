package kafka

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyshard/keyshard/clock/clocktest"
	"github.com/keyshard/keyshard/hotkey"
)

// processing records what the two consumer groups do, and checks as it
// goes that no key is processed by both lanes at once and that every key's
// records are processed exactly once, in order.
type processing struct {
	mu       sync.Mutex
	active   map[string]Lane // the lane processing the key now
	next     map[string]int  // next expected sequence number per key
	lanes    map[string][]Lane
	ovParts  map[string]map[int32]bool
	headers  map[string][]string // barrier headers seen, per key, in order
	consumed int
	problems []string
	failed   error
	changed  chan struct{}
	overflow chan struct{} // closed when the overflow lane starts its first record
}

func newProcessing() *processing {
	return &processing{
		active: map[string]Lane{}, next: map[string]int{}, lanes: map[string][]Lane{},
		ovParts: map[string]map[int32]bool{}, headers: map[string][]string{}, changed: make(chan struct{}),
		overflow: make(chan struct{}),
	}
}

func (pr *processing) problem(format string, args ...any) {
	pr.problems = append(pr.problems, fmt.Sprintf(format, args...))
}

func (pr *processing) start(lane Lane, r *kgo.Record) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	key := string(r.Key)
	if other, ok := pr.active[key]; ok && other != lane {
		pr.problem("key %q processed by %v and %v at once", key, other, lane)
	}
	pr.active[key] = lane
	k, s, _ := strings.Cut(string(r.Value), "#")
	seq, err := strconv.Atoi(s)
	if k != key || err != nil {
		pr.problem("bad record %q/%q", r.Key, r.Value)
	}
	if want := pr.next[key]; seq != want {
		pr.problem("key %q: processed #%d, want #%d (lane %v)", key, seq, want, lane)
	}
	pr.next[key] = seq + 1
	if ls := pr.lanes[key]; len(ls) == 0 || ls[len(ls)-1] != lane {
		pr.lanes[key] = append(ls, lane)
	}
	if lane == Overflow {
		if len(pr.ovParts) == 0 {
			close(pr.overflow)
		}
		if pr.ovParts[key] == nil {
			pr.ovParts[key] = map[int32]bool{}
		}
		pr.ovParts[key][r.Partition] = true
	}
	for _, h := range r.Headers {
		if h.Key == HeaderWaitMain || h.Key == HeaderWaitOverflow {
			pr.headers[key] = append(pr.headers[key], fmt.Sprintf("#%d %s=%s", seq, h.Key, h.Value))
		}
	}
}

func (pr *processing) end(lane Lane, r *kgo.Record) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.active[string(r.Key)] != lane {
		pr.problem("key %q: end of processing by %v, which was not processing it", r.Key, lane)
	}
	delete(pr.active, string(r.Key))
}

func (pr *processing) committed(n int, err error) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pr.consumed += n
	if err != nil && pr.failed == nil {
		pr.failed = err
	}
	close(pr.changed)
	pr.changed = make(chan struct{})
}

// waitConsumed waits until n records have been processed and committed.
func (pr *processing) waitConsumed(ctx context.Context, n uint64) error {
	for {
		pr.mu.Lock()
		got, failed, ch := pr.consumed, pr.failed, pr.changed
		pr.mu.Unlock()
		switch {
		case failed != nil:
			return failed
		case uint64(got) >= n:
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("consumed %d of %d: %w", got, n, ctx.Err())
		}
	}
}

// gate lets the test hold a consumer before it processes its next record.
type gate struct {
	mu sync.Mutex
	ch chan struct{} // nil: open
}

func (g *gate) pass(ctx context.Context) {
	g.mu.Lock()
	ch := g.ch
	g.mu.Unlock()
	if ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
}

func (g *gate) close() { g.mu.Lock(); g.ch = make(chan struct{}); g.mu.Unlock() }
func (g *gate) open()  { g.mu.Lock(); close(g.ch); g.ch = nil; g.mu.Unlock() }

// consume is one lane's consumer: each record passes the lane's barrier,
// is processed, and the batch is committed after processing; then the
// other lane's barrier is told. It returns when ctx is done.
func consume(ctx context.Context, cl *kgo.Client, lane Lane, wait, other *Barrier, hold *gate, pr *processing) {
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return
		}
		var err error
		fs.EachError(func(topic string, p int32, e error) {
			err = fmt.Errorf("%v consumer: fetch %s/%d: %w", lane, topic, p, e)
		})
		if err != nil {
			pr.committed(0, err)
			return
		}
		recs := fs.Records()
		for _, r := range recs {
			if err := wait.Wait(ctx, r); err != nil {
				if ctx.Err() == nil {
					pr.committed(0, err)
				}
				return
			}
			hold.pass(ctx)
			pr.start(lane, r)
			runtime.Gosched() // give the other lane a chance to overlap, if it could
			pr.end(lane, r)
		}
		if len(recs) == 0 {
			continue
		}
		if err := cl.CommitRecords(ctx, recs...); err != nil {
			if ctx.Err() == nil {
				pr.committed(0, fmt.Errorf("%v consumer: commit: %w", lane, err))
			}
			return
		}
		other.Notify()
		pr.committed(len(recs), nil)
	}
}

// lanes is a consumer group per lane, each honouring its lane's barrier
// and committing after processing (see consume), recording into pr.
type lanes struct {
	pr               *processing
	mainHold, ovHold gate
	barrierClock     *clocktest.Fake
	stop             func() // stops the consumers and waits for them; idempotent
}

// startLanes starts the two consumers and waits until both have their
// partitions. The barriers poll on a clock nobody advances: they progress
// by Notify, which each consumer calls after it commits.
func startLanes(t *testing.T, e *testEnv, ctx context.Context) *lanes {
	t.Helper()
	l := &lanes{pr: newProcessing(), barrierClock: clocktest.NewFake(t0)}
	mainBar, err := NewBarrier(e.adm, BarrierConfig{Lane: Main, Topic: overflowTopic, Group: overflowGroup, Clock: l.barrierClock})
	if err != nil {
		t.Fatal(err)
	}
	ovBar, err := NewBarrier(e.adm, BarrierConfig{Lane: Overflow, Topic: mainTopic, Group: mainGroup, Clock: l.barrierClock})
	if err != nil {
		t.Fatal(err)
	}
	assigned := make(chan Lane, 2)
	consumer := func(lane Lane, group, topic string) *kgo.Client {
		var once sync.Once
		return e.client(t, kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.DisableAutoCommit(),
			kgo.FetchMaxWait(100*time.Millisecond),
			kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {
				once.Do(func() { assigned <- lane })
			}))
	}
	mainCl := consumer(Main, mainGroup, mainTopic)
	ovCl := consumer(Overflow, overflowGroup, overflowTopic)
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { consume(cctx, mainCl, Main, mainBar, ovBar, &l.mainHold, l.pr) }) // exits on stop
	wg.Go(func() { consume(cctx, ovCl, Overflow, ovBar, mainBar, &l.ovHold, l.pr) }) // exits on stop
	var once sync.Once
	l.stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(l.stop) // before the clients close
	for range 2 {
		select {
		case <-assigned:
		case <-ctx.Done():
			t.Fatal("consumers were not assigned partitions")
		}
	}
	return l
}

// TestEndToEnd: one key goes hot, moves to overflow, cools down and comes
// back, with a consumer group per lane honouring the barriers. Nothing is
// lost, the hot key uses one overflow partition, every key's order holds
// across main → overflow → main, and the lanes never process one key at
// once.
func TestEndToEnd(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	cfg := testConfig(e)
	cfg.Policy.Rules = mustRules(t, "drop loud")
	cfg.RefreshInterval = time.Hour // the test calls Refresh itself
	r := e.router(t, cfg)

	l := startLanes(t, e, ctx)
	pr, barrierClock := l.pr, l.barrierClock

	res := newResults()
	var sent []*kgo.Record
	seq := map[string]int{}
	send := func(key string) *kgo.Record {
		rc := rec(key, fmt.Sprintf("%s#%d", key, seq[key]))
		seq[key]++
		sent = append(sent, rc)
		r.Produce(ctx, rc, res.promise)
		return rc
	}
	cold := []string{"c0", "c1", "c2", "c3", "c4", "c5"}
	settle := func() {
		t.Helper()
		if err := r.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		s := r.Stats()
		if err := pr.waitConsumed(ctx, s.Main+s.Overflow); err != nil {
			t.Fatal(err)
		}
	}

	// 1. Everything cool: 10 msg/s per key, all on main.
	for i := range 40 {
		send("hot")
		send(cold[i%len(cold)])
		if i%10 == 0 {
			send("loud")
			send("") // no key
		}
		e.clk.Advance(100 * time.Millisecond)
	}
	settle()
	if s := r.Stats(); s.Overflow != 0 || s.Main == 0 {
		t.Fatalf("phase 1: %+v", s)
	}

	// 2. "hot" at 500 msg/s: detected, it moves to overflow while its main
	// records are in flight. The main consumer is held before its next
	// record, so the overflow consumer must stop at the entry barrier
	// (asleep on the barrier clock) without processing anything.
	l.mainHold.close()
	for i := range 400 {
		send("hot")
		if i%10 == 0 {
			send(cold[i%len(cold)])
		}
		e.clk.Advance(2 * time.Millisecond)
	}
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if s := r.Stats(); s.Overflow == 0 {
		t.Fatalf("the hot key never went to overflow: %+v", s)
	}
	asleep := make(chan struct{})
	go func() { // exits once a Wait sleeps, or with ctx
		if barrierClock.BlockUntilContext(ctx, 1) == nil {
			close(asleep)
		}
	}()
	select {
	case <-asleep:
	case <-pr.overflow:
		t.Error("the overflow consumer processed a record while the main consumer held the key's earlier ones")
		barrierClock.NewTimer(time.Hour) // let the goroutine above return
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	l.mainHold.open()
	settle()

	// 3. Cooling down at 2 msg/s: "hot" comes back once it is below the
	// low threshold for the cooldown and the overflow group has committed
	// its overflow records. Refresh comes before the clock moves, so the
	// key is released by a decision (which carries the barrier header)
	// rather than by Refresh's sweep.
	released := false
	for i := 0; i < 100 && !released; i++ {
		settle()
		if err := r.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		e.clk.Advance(500 * time.Millisecond)
		h := send("hot")
		send(cold[i%len(cold)])
		settle()
		released = h.Topic == mainTopic
	}
	if !released {
		t.Fatalf("the hot key never came back to main: %+v", r.Stats())
	}

	// 4. Cool traffic again.
	for i := range 30 {
		send("hot")
		send(cold[i%len(cold)])
		e.clk.Advance(100 * time.Millisecond)
	}
	settle()
	l.stop()

	res.check(t, sent)
	s := r.Stats()
	pr.mu.Lock()
	defer pr.mu.Unlock()
	for _, p := range pr.problems {
		t.Error(p)
	}
	if s.Failed != 0 || s.TimedOut != 0 || s.Pending != 0 {
		t.Errorf("failures: %+v", s)
	}
	if uint64(len(sent)) != uint64(pr.consumed)+s.Dropped+s.MissingKey || s.Dropped == 0 || s.MissingKey == 0 {
		t.Errorf("produced %d != consumed %d + dropped %d + missing key %d", len(sent), pr.consumed, s.Dropped, s.MissingKey)
	}
	for key, n := range seq {
		if key == "loud" || key == "" {
			continue
		}
		if pr.next[key] != n {
			t.Errorf("key %q: processed %d of %d", key, pr.next[key], n)
		}
	}
	if got, want := pr.lanes["hot"], []Lane{Main, Overflow, Main}; !slices.Equal(got, want) {
		t.Errorf("hot key lanes %v, want %v", got, want)
	}
	for _, c := range cold {
		if got := pr.lanes[c]; !slices.Equal(got, []Lane{Main}) {
			t.Errorf("cold key %s lanes %v", c, got)
		}
	}
	wantPart := KeyPartition([]byte("hot"), numPartitions)
	if ps := pr.ovParts["hot"]; len(ps) != 1 || !ps[wantPart] {
		t.Errorf("hot key on overflow partitions %v, want only %d", ps, wantPart)
	}
	hs := pr.headers["hot"]
	if len(hs) < 2 {
		t.Fatalf("hot key barrier headers %v", hs)
	}
	if !strings.Contains(hs[0], HeaderWaitMain) || !strings.Contains(hs[len(hs)-1], HeaderWaitOverflow) {
		t.Errorf("hot key barrier headers %v: want %s on entry and %s on return", hs, HeaderWaitMain, HeaderWaitOverflow)
	}
	if c := s.Policy; c.Entered != 1 || c.Released != 1 || c.Outcome(hotkey.Overflow) != s.Overflow {
		t.Errorf("policy: entered %d released %d, overflow decisions %d vs %d produced", c.Entered, c.Released, c.Outcome(hotkey.Overflow), s.Overflow)
	}
	t.Logf("sent %d: main %d, overflow %d, dropped %d, missing key %d; %d barrier headers, first %q, last %q; entries held: %d",
		len(sent), s.Main, s.Overflow, s.Dropped, s.MissingKey, len(hs), hs[0], hs[len(hs)-1], s.Barriers-s.BarriersImmediate)
}
