package kafka

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/client/clienttest"
	"github.com/keyshard/keyshard/hotkey"
)

// fakeKeyshard returns a fake keyshard serve on the test's fake clock,
// with hot-key pool "events" of report threshold 10 (640/64), and a
// Keyshard client of it, closed after the test's router (cleanups run
// last first).
func (e *testEnv) fakeKeyshard(t *testing.T) (*clienttest.Server, *client.Client) {
	t.Helper()
	cp := clienttest.NewServer(t, clienttest.Options{Clock: e.clk})
	cp.AddHotKeyPool("events", 640)
	kc, err := client.Dial(cp.URL(), client.Clock(e.clk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kc.Close() })
	return cp, kc
}

func clusterSet(version uint64, keys ...string) hotkey.OverflowSet {
	s := hotkey.OverflowSet{Version: version}
	for _, k := range keys {
		s.Entries = append(s.Entries, hotkey.OverflowEntry{Key: k, Rate: 1000})
	}
	return s
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestClusterSetBarriers: a key of the cluster set goes to one overflow
// partition through the entry barrier (held behind its main record in
// flight, then carrying its position), honours the kill switch, and when
// it leaves the set returns to main only once the overflow group has
// committed past its last overflow record: released by Refresh's sweep
// if it was never hot here (no cooldown owed), or, if it was warm here,
// by a decision after the local cooldown, carrying that record's
// position.
func TestClusterSetBarriers(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	cfg := testConfig(e)
	cfg.RefreshInterval = time.Hour // the test calls Refresh itself
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	r := e.router(t, cfg)
	produce := func(key, value, topic string) *kgo.Record {
		t.Helper()
		rc := rec(key, value)
		if err := r.ProduceSync(ctx, rc); err != nil || rc.Topic != topic {
			t.Fatalf("%s/%s: err %v, topic %q, want %q", key, value, err, rc.Topic, topic)
		}
		return rc
	}
	produce("k", "m0", mainTopic)

	// The set names k while its main record m1 is in flight.
	release := make(chan struct{})
	var once sync.Once
	e.c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		once.Do(func() { e.c.SleepControl(func() { <-release }) })
		return nil, nil, false
	})
	res := newResults()
	m1 := rec("k", "m1")
	r.Produce(ctx, m1, res.promise)
	if !r.ApplyClusterSet(clusterSet(1, "k", "elsewhere")) {
		t.Fatal("ApplyClusterSet(version 1) refused")
	}
	if r.ApplyClusterSet(clusterSet(1, "other")) || r.ApplyClusterSet(clusterSet(0)) {
		t.Error("ApplyClusterSet installed a set that is not newer")
	}
	if err := r.WaitClusterVersion(ctx, 1); err != nil {
		t.Fatal(err)
	}
	o1, o2 := rec("k", "o1"), rec("k", "o2")
	r.Produce(ctx, o1, res.promise)
	r.Produce(ctx, o2, res.promise)
	if s := r.Stats(); s.Held != 2 || s.Barriers != 1 || s.Cluster.Version != 1 || s.Cluster.Keys != 2 {
		t.Fatalf("stats %+v: want 2 held behind the main record in flight, cluster set version 1 of 2 keys", s)
	}
	close(release)
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	res.check(t, []*kgo.Record{m1, o1, o2})
	want := fmt.Sprintf("%d:%d", m1.Partition, m1.Offset)
	part := KeyPartition([]byte("k"), numPartitions)
	for _, o := range []*kgo.Record{o1, o2} {
		if got, _ := header(o, HeaderWaitMain); got != want || o.Topic != overflowTopic || o.Partition != part {
			t.Errorf("%s: %s/%d, %s = %q; want %s/%d, %q", o.Value, o.Topic, o.Partition, HeaderWaitMain, got, overflowTopic, part, want)
		}
	}
	if o2.Offset != o1.Offset+1 {
		t.Errorf("held records out of order: offsets %d, %d", o1.Offset, o2.Offset)
	}

	// The kill switch sends the key to main at once, without a barrier;
	// back on, it passes an entry barrier again.
	r.SetEnabled(false)
	during := produce("k", "m2", mainTopic)
	if _, ok := header(during, HeaderWaitOverflow); ok {
		t.Error("the kill switch must not make main wait for overflow")
	}
	r.SetEnabled(true)
	o3 := produce("k", "o3", overflowTopic)
	if got, _ := header(o3, HeaderWaitMain); got != fmt.Sprintf("%d:%d", during.Partition, during.Offset) {
		t.Errorf("re-entry: %s = %q", HeaderWaitMain, got)
	}

	// The key leaves the set: sticky until its overflow records are
	// committed. It was never locally hot, so it owes no cooldown.
	if !r.ApplyClusterSet(clusterSet(2)) {
		t.Fatal("ApplyClusterSet(version 2) refused")
	}
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
	o4 := produce("k", "o4", overflowTopic)
	commit(o4.Partition, o4.Offset) // up to, not past, its last record
	o5 := produce("k", "o5", overflowTopic)
	if s := r.Stats().Policy; s.Released != 0 {
		t.Fatalf("released before its overflow records were committed: %+v", s)
	}
	commit(o5.Partition, o5.Offset+1) // Refresh's sweep releases it
	if s := r.Stats(); s.Policy.Released != 1 || s.TrackedKeys != 0 {
		t.Fatalf("not released once committed: %+v", s)
	}
	produce("k", "m3", mainTopic)

	// A key warm here (above LowThreshold, below the threshold) that
	// leaves the set stays until it has also cooled down for Cooldown;
	// then a decision releases it, carrying its last overflow position.
	r.ApplyClusterSet(clusterSet(3, "w"))
	for range 300 { // 70 msg/s for 3 s
		r.Produce(ctx, rec("w", "o"), nil)
		e.clk.Advance(time.Second / 70)
	}
	lastW := produce("w", "o-last", overflowTopic)
	r.ApplyClusterSet(clusterSet(4))
	commit(lastW.Partition, lastW.Offset+1)
	if s := r.Stats().Policy; s.Released != 1 || s.OverflowKeys != 1 {
		t.Fatalf("w released before its cooldown: %+v", s)
	}
	e.clk.Advance(5 * time.Second)
	backW := produce("w", "m", mainTopic)
	if got, _ := header(backW, HeaderWaitOverflow); got != fmt.Sprintf("%d:%d", lastW.Partition, lastW.Offset) {
		t.Errorf("hand-back: %s = %q, want %d:%d", HeaderWaitOverflow, got, lastW.Partition, lastW.Offset)
	}

	s := r.Stats()
	c := s.Policy
	if c.Count(hotkey.Overflow, hotkey.ClusterHot) != 3+301 || c.Count(hotkey.Overflow, hotkey.Sticky) != 2 ||
		c.Count(hotkey.Main, hotkey.KillSwitch) != 1 || c.Count(hotkey.Main, hotkey.Released) != 1 || c.Entered != 2 || c.Released != 2 {
		t.Errorf("policy counters: %+v", c)
	}
	if s.Cluster.Version != 4 || s.Cluster.Keys != 0 || s.TrackedKeys != 0 || s.Untracked != 0 || s.Failed+s.TimedOut != 0 {
		t.Errorf("stats %+v", s)
	}
	if v, k := gauge(t, reg, "keyshard_router_cluster_set_version"), gauge(t, reg, "keyshard_router_cluster_set_keys"); v != 4 || k != 0 {
		t.Errorf("metrics: cluster set version %v, keys %v", v, k)
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := r.WaitClusterVersion(cctx, 5); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitClusterVersion(cancelled) = %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- r.WaitClusterVersion(ctx, 5) }() // exits when the router closes
	r.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Errorf("WaitClusterVersion across Close = %v, want ErrClosed", err)
	}
}

// TestClusterHotKeysThroughControlPlane: the router's own sync reports the
// detector's keys at or above the pool's report threshold (named keys
// only), installs the sets the control plane publishes, and fails open
// while the control plane is down: sends neither block nor fail, and the
// set in force stays. The router, its sync and the control plane share the
// fake clock: the sync reports once as it starts, then each time the test
// advances the clock past its next report.
func TestClusterHotKeysThroughControlPlane(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	cp, kc := e.fakeKeyshard(t)
	const interval = 20 * time.Millisecond
	// backoffCap bounds the sync's waits after a failure (the client's
	// backoff cap); the test advances past it, and past every send's
	// deadline, so that no send's timer stays armed.
	const backoffCap = 10 * time.Second
	cfg := testConfig(e)
	cfg.RefreshInterval = time.Hour // the test calls Refresh itself
	cfg.SendTimeout = backoffCap
	cfg.Policy.Detector.MaxKeyLen = 16
	cfg.ClusterHotKeys = &ClusterHotKeysConfig{Client: kc, Pool: "events", Producer: "p1", Interval: interval}
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	r := e.router(t, cfg)
	if req := cp.Reports().Next(t); req.GetPool() != "events" || req.GetProducer() != "p1" || len(req.GetKeys()) != 0 {
		t.Errorf("first report %v, want pool events, producer p1, no keys", req)
	}

	// 1. A key named by the set goes to overflow, after its main record.
	m0 := rec("spread", "m0")
	if err := r.ProduceSync(ctx, m0); err != nil || m0.Topic != mainTopic {
		t.Fatalf("before the set: %v, %s", err, m0.Topic)
	}
	cp.SetOverflow("events", "spread")
	if err := r.WaitClusterVersion(ctx, 1); err != nil {
		t.Fatal(err)
	}
	var last *kgo.Record
	for i := range 3 {
		last = rec("spread", fmt.Sprint("o", i))
		if err := r.ProduceSync(ctx, last); err != nil || last.Topic != overflowTopic || last.Partition != KeyPartition([]byte("spread"), numPartitions) {
			t.Fatalf("%s: %v, %s/%d", last.Value, err, last.Topic, last.Partition)
		}
		if got, ok := header(last, HeaderWaitMain); (i == 0) != ok || ok && got != fmt.Sprintf("%d:%d", m0.Partition, m0.Offset) {
			t.Errorf("%s: %s = %q (present %v)", last.Value, HeaderWaitMain, got, ok)
		}
	}

	// 2. Reports: a hot key, by name and rate; a hot key longer than
	// MaxKeyLen cannot be named, and is counted instead.
	long := strings.Repeat("L", 40)
	for i := range 300 {
		r.Produce(ctx, rec("hot", fmt.Sprint(i)), nil)
		r.Produce(ctx, rec(long, fmt.Sprint(i)), nil)
	}
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(interval)
	req := cp.Reports().Next(t) // the first since the flush: the clock stood still until now
	if req.GetPool() != "events" || req.GetProducer() != "p1" {
		t.Errorf("report %v", req)
	}
	var hot *keyshardv1.KeyRate
	for _, k := range req.GetKeys() {
		if k.GetRate() < 10 || strings.HasPrefix(k.GetKey(), "LLLL") {
			t.Errorf("reported %v: below the report threshold 10, or truncated", k)
		}
		if k.GetKey() == "hot" {
			hot = k
		}
	}
	if hot == nil {
		t.Fatalf("the hot key is not reported: %v", req.GetKeys())
	}
	if s := r.Stats().Cluster; s.TruncatedKeys == 0 || s.Sync.Reports == 0 || s.Sync.ReportThreshold != 10 {
		t.Errorf("cluster stats %+v", s)
	}

	// 3. The control plane goes down: sends neither wait nor fail, and the
	// set in force stays.
	cp.SetHotKeysUnavailable(true)
	e.clk.Advance(interval)
	cp.Reports().Next(t) // a report while down
	for i := range 50 {
		key := fmt.Sprint("cold", i%5)
		if i%10 == 0 {
			key = "spread"
		}
		rc := rec(key, fmt.Sprint(i))
		if err := r.ProduceSync(ctx, rc); err != nil {
			t.Fatalf("send while the control plane is down: %v", err)
		}
		if want := map[bool]string{true: overflowTopic, false: mainTopic}[key == "spread"]; rc.Topic != want {
			t.Errorf("%s while down: topic %s, want %s", key, rc.Topic, want)
		}
		if key == "spread" {
			last = rc
		}
	}
	e.clk.Advance(backoffCap)
	cp.Reports().Next(t) // the second report while down: the first one's failure is counted by now
	if s := r.Stats(); s.Cluster.Version != 1 || s.Cluster.Sync.ReportFailures == 0 || s.Failed+s.TimedOut != 0 {
		t.Errorf("stats while down: %+v", s)
	}
	if f := gauge(t, reg, "keyshard_router_cluster_report_failures_total"); f == 0 {
		t.Error("keyshard_router_cluster_report_failures_total is 0")
	}

	// 4. Back up: the newer set arrives once the sync's watch retries.
	// "spread" left it: it stays in overflow until its overflow records
	// are committed, then Refresh's sweep releases it (it owes no local
	// cooldown, and needs no header).
	e.clk.MustBlockUntil(t, 3) // the refresh ticker; the sync's report and watch, asleep after failing
	cp.SetHotKeysUnavailable(false)
	cp.SetOverflow("events")
	e.clk.Advance(backoffCap)
	if err := r.WaitClusterVersion(ctx, 2); err != nil {
		t.Fatal(err)
	}
	last = rec("spread", "sticky")
	if err := r.ProduceSync(ctx, last); err != nil || last.Topic != overflowTopic {
		t.Fatalf("just after leaving the set: %v, %s", err, last.Topic)
	}
	os := kadm.Offsets{}
	os.Add(kadm.Offset{Topic: overflowTopic, Partition: last.Partition, At: last.Offset + 1, LeaderEpoch: -1})
	if _, err := e.adm.CommitOffsets(ctx, overflowGroup, os); err != nil {
		t.Fatal(err)
	}
	if err := r.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	back := rec("spread", "back")
	if err := r.ProduceSync(ctx, back); err != nil || back.Topic != mainTopic {
		t.Fatalf("after its overflow records were committed: %v, %s", err, back.Topic)
	}
	if v := gauge(t, reg, "keyshard_router_cluster_set_version"); v != 2 {
		t.Errorf("keyshard_router_cluster_set_version = %v", v)
	}
}

// TestClusterControlPlaneUnreachable: a control plane that refuses
// connections, or accepts them and never answers, neither blocks nor fails
// a send, and Close does not wait for it.
func TestClusterControlPlaneUnreachable(t *testing.T) {
	for _, mode := range []string{"refused", "hanging"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			ctx := testCtx(t)
			var kc *client.Client
			var cp *clienttest.Server
			switch mode {
			case "refused":
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				addr := l.Addr().String()
				l.Close() // nothing listens there now
				if kc, err = client.Dial("http://" + addr); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { kc.Close() })
			case "hanging":
				cp, kc = e.fakeKeyshard(t)
				cp.HoldHotKeys() // shut for good: no hot-key call is ever answered
			}
			cfg := testConfig(e)
			cfg.ClusterHotKeys = &ClusterHotKeysConfig{Client: kc, Pool: "events", Producer: "p1"}
			r := e.router(t, cfg)
			if cp != nil {
				cp.Reports().Next(t) // the sync's first report hangs from now on
			}
			r.ApplyClusterSet(clusterSet(1, "k")) // sets from elsewhere still apply
			res := newResults()
			var sent []*kgo.Record
			for i := range 40 {
				rc := rec(fmt.Sprint("key", i%4), fmt.Sprint(i))
				if i%8 == 0 {
					rc = rec("k", fmt.Sprint(i))
				}
				sent = append(sent, rc)
				r.Produce(ctx, rc, res.promise)
			}
			if err := r.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			res.check(t, sent)
			res.mu.Lock()
			defer res.mu.Unlock()
			for _, rc := range sent {
				if err := res.errs[rc]; err != nil {
					t.Errorf("%s/%s: %v", rc.Key, rc.Value, err)
				}
				if want := map[bool]string{true: overflowTopic, false: mainTopic}[string(rc.Key) == "k"]; rc.Topic != want {
					t.Errorf("%s: topic %s, want %s", rc.Key, rc.Topic, want)
				}
			}
			if s := r.Stats(); s.Main != 35 || s.Overflow != 5 || s.Cluster.Sync.Reports != 0 {
				t.Errorf("stats %+v", s)
			}
			r.Close() // does not wait for the control plane
		})
	}
}

// TestEndToEndClusterKey: a key that is cold here but in the cluster set
// moves to overflow while its main records are unprocessed, and back once
// it leaves the set, with a consumer group per lane honouring the
// barriers: nothing lost, one overflow partition, order kept across the
// lanes, and the lanes never process it at once.
func TestEndToEndClusterKey(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	cfg := testConfig(e)
	cfg.RefreshInterval = time.Hour // the test calls Refresh itself
	r := e.router(t, cfg)
	l := startLanes(t, e, ctx)
	pr := l.pr

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
	cold := []string{"c0", "c1", "c2"}

	// 1. "c" at 10 msg/s, far below the local threshold: main.
	for i := range 20 {
		send("c")
		send(cold[i%len(cold)])
		e.clk.Advance(100 * time.Millisecond)
	}
	settle()

	// 2. The cluster set names "c" while the main consumer holds its
	// records: the overflow consumer waits at the entry barrier.
	l.mainHold.close()
	for i := range 10 {
		send("c")
		send(cold[i%len(cold)])
		e.clk.Advance(100 * time.Millisecond)
	}
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	r.ApplyClusterSet(clusterSet(1, "c"))
	for range 20 {
		if h := send("c"); h.Topic != overflowTopic {
			t.Fatalf("a key of the cluster set went to %s", h.Topic)
		}
		e.clk.Advance(100 * time.Millisecond)
	}
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	asleep := make(chan struct{})
	go func() { // exits once a Wait sleeps, or with ctx
		if l.barrierClock.BlockUntilContext(ctx, 1) == nil {
			close(asleep)
		}
	}()
	select {
	case <-asleep:
	case <-pr.overflow:
		t.Error("the overflow consumer processed a record while the main consumer held the key's earlier ones")
		l.barrierClock.NewTimer(time.Hour) // let the goroutine above return
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	l.mainHold.open()
	settle()

	// 3. "c" leaves the set: it returns once the overflow group has
	// committed its overflow records. It owes no local cooldown, so
	// Refresh's sweep releases it as soon as they are committed, and its
	// first main record needs no HeaderWaitOverflow.
	r.ApplyClusterSet(clusterSet(2))
	released := false
	for i := 0; i < 20 && !released; i++ {
		settle()
		if err := r.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		e.clk.Advance(100 * time.Millisecond)
		h := send("c")
		send(cold[i%len(cold)])
		settle()
		released = h.Topic == mainTopic
	}
	if !released {
		t.Fatalf("the key never came back to main: %+v", r.Stats())
	}
	for i := range 10 {
		send("c")
		send(cold[i%len(cold)])
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
	if s.Failed != 0 || s.TimedOut != 0 || s.Pending != 0 || uint64(len(sent)) != uint64(pr.consumed) {
		t.Errorf("produced %d, consumed %d: %+v", len(sent), pr.consumed, s)
	}
	for key, n := range seq {
		if pr.next[key] != n {
			t.Errorf("key %q: processed %d of %d", key, pr.next[key], n)
		}
	}
	if got := pr.lanes["c"]; !slices.Equal(got, []Lane{Main, Overflow, Main}) {
		t.Errorf("cluster key lanes %v, want main, overflow, main", got)
	}
	if ps := pr.ovParts["c"]; len(ps) != 1 || !ps[KeyPartition([]byte("c"), numPartitions)] {
		t.Errorf("cluster key on overflow partitions %v", ps)
	}
	if hs := pr.headers["c"]; len(hs) == 0 || !strings.Contains(hs[0], HeaderWaitMain) {
		t.Errorf("cluster key barrier headers %v: want %s on entry", hs, HeaderWaitMain)
	}
	if c := s.Policy; c.Entered != 1 || c.Released != 1 || c.Count(hotkey.Overflow, hotkey.ClusterHot) != 20 {
		t.Errorf("policy: %+v", c)
	}
}
