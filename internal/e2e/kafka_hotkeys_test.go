package e2e_test

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/twmb/franz-go/pkg/kgo"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/hotkey"
	"github.com/keyshard/keyshard/kafka"
	"github.com/keyshard/keyshard/keyshardtest"
)

// TestClusterHotKeysSixteenProducers runs 16 routers against a real
// `keyshard serve` and one Kafka (kfake). One key is spread evenly over
// them at 1.05× the pool's threshold, far below each router's own
// threshold: the leader's sum catches it and every router sends it to the
// same overflow partition. Another key at 0.9× the threshold stays on
// main. A restarted router picks the set up before its first record; with
// the control plane down, routers keep the set and no send fails; the set
// survives a restart of the control plane, and the key leaves it once it
// has cooled down.
func TestClusterHotKeysSixteenProducers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 16 routers against a real keyshard serve")
	}
	const (
		producers = 16
		threshold = 160.0 // the pool's, summed over producers
		hotKey    = "user:spread"
		warmKey   = "user:warm"
		step      = 200 * time.Millisecond
	)
	hotRate := 1.05 * threshold / producers  // 10.5/s per router
	warmRate := 0.90 * threshold / producers // 9/s per router
	ctx := testCtx(t)
	e := newEnv(t)
	clk := e.clk
	sp := keyshardtest.NewServer(t, keyshardtest.Options{Clock: clk})
	cl := sp.Client()
	pool, err := cl.Admin().PutHotKeyPool(ctx, client.HotKeyPool{
		Name: "ingest", Threshold: threshold, Cooldown: 5 * time.Second, ReportMaxAge: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if pool.ReportThreshold != threshold/64 {
		t.Fatalf("report threshold %v, want the default %v", pool.ReportThreshold, threshold/64)
	}

	newRouter := func(i int) *kafka.Router {
		cfg := testConfig(e)
		// Locally, nothing here is ever hot: only the sum can catch a key.
		cfg.Policy.Detector = hotkey.DetectorConfig{Threshold: 1000, HalfLife: 2 * time.Second, Capacity: 256}
		cfg.ClusterHotKeys = &kafka.ClusterHotKeysConfig{Client: cl, Pool: "ingest", Producer: fmt.Sprintf("ingest-%02d", i)}
		r, err := kafka.NewRouter(e.cl, e.adm, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(ctx); err != nil {
			r.Close()
			t.Fatal(err)
		}
		return r
	}
	routers := make([]*kafka.Router, producers)
	for i := range routers {
		routers[i] = newRouter(i)
	}
	defer func() {
		for _, r := range routers {
			r.Close()
		}
	}()

	// Each step every router sends its share of both keys (spread evenly
	// in time), and the step's records are acknowledged before the fake
	// clock moves on.
	var (
		steps       int
		sent        = map[string]int{}
		hotParts    = map[int32]bool{}
		hotOverflow int
	)
	due := func(rate float64) int { // this step's records at rate
		at := func(n int) int { return int(math.Floor(rate * (step * time.Duration(n)).Seconds())) }
		return at(steps+1) - at(steps)
	}
	sendStep := func(withHot bool) {
		t.Helper()
		nHot, nWarm := due(hotRate), due(warmRate)
		if !withHot {
			nHot = 0
		}
		var wg sync.WaitGroup
		errs := make(chan error, producers*(nHot+nWarm))
		recs := make([][]*kgo.Record, producers)
		for i, r := range routers {
			for range nHot {
				recs[i] = append(recs[i], rec(hotKey, "v"))
			}
			for range nWarm {
				recs[i] = append(recs[i], rec(warmKey, "v"))
			}
			for _, rc := range recs[i] {
				wg.Add(1)
				r.Produce(ctx, rc, func(_ *kgo.Record, err error) {
					if err != nil {
						errs <- err
					}
					wg.Done()
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("a send failed: %v", err)
		}
		for _, rs := range recs {
			for _, rc := range rs {
				key := string(rc.Key)
				sent[key]++
				switch {
				case key == warmKey && rc.Topic != mainTopic:
					t.Fatalf("step %d: the key at 0.9× the threshold went to %s", steps, rc.Topic)
				case key == hotKey && rc.Topic == overflowTopic:
					hotOverflow++
					hotParts[rc.Partition] = true
				}
			}
		}
		steps++
		clk.Advance(step)
	}
	versions := func() []uint64 {
		v := make([]uint64, len(routers))
		for i, r := range routers {
			v[i] = r.Stats().Cluster.Version
		}
		return v
	}
	allAt := func(v uint64) bool {
		return !slices.ContainsFunc(versions(), func(x uint64) bool { return x < v })
	}

	// 1. Both keys flow; the hot key's sum crosses the threshold once the
	// routers' decayed rates have converged (about 9 s of fake time with
	// a 2 s half-life). Every router then has set version 1.
	for !allAt(1) {
		if steps > 40*int(time.Second/step) {
			t.Fatalf("after %d steps the routers' set versions are %v; want 1 everywhere", steps, versions())
		}
		sendStep(true)
	}
	entered := time.Duration(steps) * step
	for _, r := range routers {
		if s := r.Stats().Cluster; s.Keys != 1 || s.Sync.ReportFailures != 0 {
			t.Fatalf("router cluster stats %+v; want 1 key and no failed report", s)
		}
	}
	// 2. Run on to a steady state well past convergence, then make sure a
	// round ran there: the key at 0.9× is still out, the version still 1.
	for steps < 40*int(time.Second/step) {
		sendStep(true)
	}
	until := clk.Now().Add(-time.Second) // a round is due: the fake clock passed its tick
	if err := sp.WaitHotKeyRound(ctx, until); err != nil {
		t.Fatalf("no aggregation round at or after %v: %v", until, err)
	}
	hot := keyshardv1connect.NewHotKeyServiceClient(http.DefaultClient, sp.URL())
	got, err := hot.GetOverflowSet(ctx, connect.NewRequest(&keyshardv1.GetOverflowSetRequest{Pool: "ingest"}))
	if err != nil {
		t.Fatal(err)
	}
	if set := got.Msg.GetSet(); set.GetVersion() != 1 || len(set.GetKeys()) != 1 || set.GetKeys()[0].GetKey() != hotKey {
		t.Fatalf("the overflow set at steady state: %v; want version 1 with %q only", set, hotKey)
	}
	if hotOverflow == 0 || len(hotParts) != 1 {
		t.Fatalf("the hot key sent %d records to overflow, on partitions %v; want some, on one partition", hotOverflow, hotParts)
	}
	t.Logf("caught after %v of fake time at 1.05× the threshold; summed rate %.1f/s", entered, got.Msg.GetSet().GetKeys()[0].GetRate())

	// 3. A router restarts: it has the set before its first record, so the
	// hot key goes straight to overflow, on the same partition.
	routers[0].Close()
	routers[0] = newRouter(0)
	if err := routers[0].WaitClusterVersion(ctx, 1); err != nil {
		t.Fatal(err)
	}
	r0 := rec(hotKey, "after restart")
	if err := routers[0].ProduceSync(ctx, r0); err != nil {
		t.Fatal(err)
	}
	if r0.Topic != overflowTopic || !hotParts[r0.Partition] {
		t.Fatalf("after a restart the hot key went to %s/%d; want %s/%v", r0.Topic, r0.Partition, overflowTopic, hotParts)
	}

	// 4. The control plane goes down: every router keeps its set (fail
	// open), reports fail and are counted, and no send fails or waits.
	sp.Stop()
	failing := func() bool {
		for _, r := range routers {
			if r.Stats().Cluster.Sync.ReportFailures == 0 {
				return false
			}
		}
		return true
	}
	before := hotOverflow
	for n := 0; !failing(); n++ {
		if n > 30*int(time.Second/step) {
			t.Fatal("routers do not count failed reports with the control plane down")
		}
		sendStep(true)
	}
	if hotOverflow == before || !allAt(1) {
		t.Fatalf("with the control plane down the hot key stopped going to overflow (%d → %d records) or versions changed: %v", before, hotOverflow, versions())
	}

	// 5. The control plane restarts on its data: the set is still version
	// 1. The hot key stops; once its sum has stayed below the low
	// threshold for the cooldown it leaves the set (version 2), while the
	// routers keep it in overflow until its overflow records are
	// processed (nothing consumes them here).
	sp.Restart()
	got, err = hot.GetOverflowSet(ctx, connect.NewRequest(&keyshardv1.GetOverflowSetRequest{Pool: "ingest"}))
	if err != nil {
		t.Fatal(err)
	}
	if got.Msg.GetSet().GetVersion() != 1 {
		t.Fatalf("after a restart of the control plane the set is %v; want version 1", got.Msg.GetSet())
	}
	for n := 0; !allAt(2); n++ {
		if n > 40*int(time.Second/step) {
			t.Fatalf("the cooled key did not leave the set: versions %v", versions())
		}
		sendStep(false)
	}
	r1 := rec(hotKey, "after leaving the set")
	if err := routers[1].ProduceSync(ctx, r1); err != nil {
		t.Fatal(err)
	}
	if r1.Topic != overflowTopic {
		t.Fatalf("a key that left the set went to %s before its overflow records were processed", r1.Topic)
	}
	t.Logf("%d steps; sent %v", steps, sent)
}
