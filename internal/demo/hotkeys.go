package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyshard/keyshard/hotkey"
	"github.com/keyshard/keyshard/kafka"
)

// HotkeysOptions shape a `keyshard demo --mode hotkeys` run. Zero values
// take the defaults.
type HotkeysOptions struct {
	// Duration of the producing phase (default 20s, at least 8s); the
	// burst on the hot key runs from about 20% to 60% of it.
	Duration time.Duration
	// Rate of Zipf(1.1)-distributed keyed records per second, besides the
	// burst (default 800).
	Rate int
	// Out receives the running commentary (default: discard).
	Out io.Writer
	// Logger receives the router's logs (default: discard).
	Logger *slog.Logger
}

// HotkeysReport is the hot-key demo's own record, checked: the JSON object
// that `keyshard demo --mode hotkeys --json` prints last.
type HotkeysReport struct {
	Produced         uint64 `json:"produced"`
	Consumed         uint64 `json:"consumed"`
	ConsumedMain     uint64 `json:"consumed_main"`
	ConsumedOverflow uint64 `json:"consumed_overflow"`
	DroppedCounted   uint64 `json:"dropped_counted"`
	// Failed counts sends that failed or timed out (they show as lost).
	Failed uint64 `json:"failed"`
	// Lost is produced − consumed − dropped_counted; it must be 0.
	Lost   int64  `json:"lost"`
	HotKey string `json:"hot_key"`
	// HotKeyOverflowPartitions is how many overflow partitions the hot key
	// used (1: its key was kept); HotKeyPartitionIDs names them.
	HotKeyOverflowPartitions int     `json:"hot_key_overflow_partitions"`
	HotKeyPartitionIDs       []int32 `json:"hot_key_overflow_partition_ids"`
	// HotKeyLanes is the sequence of lanes that processed the hot key.
	HotKeyLanes      []string `json:"hot_key_lanes"`
	HotKeyOverflowed uint64   `json:"hot_key_overflow_records"`
	HotKeyEnteredS   float64  `json:"hot_key_entered_s"`
	HotKeyReturnedS  float64  `json:"hot_key_returned_s"`
	// LaneOverlaps counts times main and overflow processed one key at
	// once; OrderViolations records of a key processed out of order.
	LaneOverlaps    int `json:"lane_overlaps"`
	OrderViolations int `json:"order_violations"`
	// OverflowEntries and OverflowReleases count keys entering and leaving
	// overflow (any key, junk included, not only the hot one).
	OverflowEntries  uint64  `json:"overflow_entries"`
	OverflowReleases uint64  `json:"overflow_releases"`
	ThresholdPerS    float64 `json:"threshold_per_s"`
	BurstPerS        float64 `json:"burst_per_s"`
	DurationS        float64 `json:"duration_s"`
	// OK is true when every check passed.
	OK bool `json:"ok"`
}

const (
	hotKey           = "user:hot"
	junkDropKey      = "bot:junk" // matched by the drop rule
	hkMainTopic      = "events"
	hkOverflowTopic  = "events-overflow"
	hkDeadTopic      = "events-dead-letter"
	hkMainGroup      = "ingest"
	hkOverflowGroup  = "ingest-overflow"
	hkPartitions     = 8
	hkThreshold      = 200.0
	hkBurstFactor    = 6
	hkHotBaseline    = 10 // records per second on the hot key outside the burst
	hkHalfLife       = 500 * time.Millisecond
	hkCooldown       = time.Second
	hkDrainTimeout   = 30 * time.Second
	hkReturnMargin   = 5 * time.Second // the burst ends at least this long before producing stops
	hkRefreshPeriod  = 250 * time.Millisecond
	hkNarratePeriod  = 2 * time.Second
	hkWatchPeriod    = 50 * time.Millisecond
	hkMinDuration    = 8 * time.Second
	hkDefaultRuntime = 20 * time.Second
)

const hkRules = `
drop  ` + junkDropKey + `             # abusive client: discarded, counted
junk  anonymous,null,undefined # known junk ids: straight to overflow
`

// RunHotkeys starts an in-process Kafka (kfake) with main, overflow and
// dead-letter topics, a kafka.Router, a producer of Zipf-distributed keys
// with a burst on one key, and a consumer group per lane that honours the
// drain barriers; it narrates the hot key's trip to overflow and back, then
// checks its own record. It returns an error only if the demo could not
// run; failed checks show in the report (OK false).
func RunHotkeys(ctx context.Context, opts HotkeysOptions) (HotkeysReport, error) {
	if opts.Duration == 0 {
		opts.Duration = hkDefaultRuntime
	}
	if opts.Duration < hkMinDuration {
		return HotkeysReport{}, fmt.Errorf("--duration %v is too short: the hot-key demo needs at least %v", opts.Duration, hkMinDuration)
	}
	if opts.Rate <= 0 {
		opts.Rate = 800
	}
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	h := &hotkeysDemo{opts: opts, start: time.Now(), rec: newLaneRecorder()}
	h.rec.say, h.rec.start0 = h.say, h.start
	return h.run(ctx)
}

type hotkeysDemo struct {
	opts  HotkeysOptions
	start time.Time
	outMu sync.Mutex
	rec   *laneRecorder

	router   *kafka.Router
	produced atomic.Uint64
	report   HotkeysReport
}

func (h *hotkeysDemo) say(format string, args ...any) {
	h.outMu.Lock()
	defer h.outMu.Unlock()
	fmt.Fprintf(h.opts.Out, "[%5.1fs] %s\n", time.Since(h.start).Seconds(), fmt.Sprintf(format, args...))
}

func (h *hotkeysDemo) run(ctx context.Context) (HotkeysReport, error) {
	ctx, cancel := context.WithTimeout(ctx, h.opts.Duration+hkDrainTimeout+30*time.Second)
	defer cancel()

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1),
		kfake.SeedTopics(hkPartitions, hkMainTopic, hkOverflowTopic), kfake.SeedTopics(1, hkDeadTopic))
	if err != nil {
		return HotkeysReport{}, fmt.Errorf("start kfake: %w", err)
	}
	defer cluster.Close()
	addrs := cluster.ListenAddrs()
	newClient := func(opts ...kgo.Opt) (*kgo.Client, error) {
		return kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...)}, opts...)...)
	}
	prodCl, err := newClient(kgo.RecordDeliveryTimeout(10 * time.Second))
	if err != nil {
		return HotkeysReport{}, err
	}
	defer prodCl.Close()
	adm := kadm.NewClient(prodCl)
	rules, err := hotkey.ParseRules(hkRules)
	if err != nil {
		return HotkeysReport{}, err
	}
	h.say("kfake: 1 broker, topics %s and %s (%d partitions each), %s; threshold %.0f msg/s per key, half-life %v, cooldown %v",
		hkMainTopic, hkOverflowTopic, hkPartitions, hkDeadTopic, hkThreshold, hkHalfLife, hkCooldown)
	h.router, err = kafka.NewRouter(prodCl, adm, kafka.Config{
		MainTopic: hkMainTopic, OverflowTopic: hkOverflowTopic, DeadLetterTopic: hkDeadTopic, OverflowGroup: hkOverflowGroup,
		Policy: hotkey.PolicyConfig{
			Detector: hotkey.DetectorConfig{Threshold: hkThreshold, HalfLife: hkHalfLife, Capacity: 4096},
			Cooldown: hkCooldown,
			Rules:    rules,
		},
		RefreshInterval: hkRefreshPeriod,
		Logger:          h.opts.Logger,
	})
	if err != nil {
		return HotkeysReport{}, err
	}
	routerOpen := true
	defer func() {
		if routerOpen {
			h.router.Close()
		}
	}()
	if err := h.router.Start(ctx); err != nil {
		return HotkeysReport{}, err
	}

	// One consumer group per lane; each honours the other lane's barrier
	// and commits after processing.
	mainBar, err := kafka.NewBarrier(adm, kafka.BarrierConfig{Lane: kafka.Main, Topic: hkOverflowTopic, Group: hkOverflowGroup})
	if err != nil {
		return HotkeysReport{}, err
	}
	ovBar, err := kafka.NewBarrier(adm, kafka.BarrierConfig{Lane: kafka.Overflow, Topic: hkMainTopic, Group: hkMainGroup})
	if err != nil {
		return HotkeysReport{}, err
	}
	assigned := make(chan kafka.Lane, 2)
	consumer := func(lane kafka.Lane, group, topic string) (*kgo.Client, error) {
		var once sync.Once
		return newClient(kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.DisableAutoCommit(),
			kgo.FetchMaxWait(100*time.Millisecond),
			kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {
				once.Do(func() { assigned <- lane })
			}))
	}
	mainCl, err := consumer(kafka.Main, hkMainGroup, hkMainTopic)
	if err != nil {
		return HotkeysReport{}, err
	}
	defer mainCl.Close()
	ovCl, err := consumer(kafka.Overflow, hkOverflowGroup, hkOverflowTopic)
	if err != nil {
		return HotkeysReport{}, err
	}
	defer ovCl.Close()
	cctx, stopConsumers := context.WithCancel(ctx)
	var cwg sync.WaitGroup
	cwg.Go(func() { h.consume(cctx, mainCl, kafka.Main, mainBar, ovBar) })   // exits on stopConsumers
	cwg.Go(func() { h.consume(cctx, ovCl, kafka.Overflow, ovBar, mainBar) }) // exits on stopConsumers
	defer func() { stopConsumers(); cwg.Wait() }()                           // before the clients close
	for range 2 {
		select {
		case <-assigned:
		case <-time.After(20 * time.Second):
			return HotkeysReport{}, errors.New("the consumer groups were not assigned partitions within 20s")
		case <-ctx.Done():
			return HotkeysReport{}, ctx.Err()
		}
	}
	h.say("consumer groups %s (main lane) and %s (overflow lane) joined; producing %d msg/s of Zipf(1.1) keys for %v",
		hkMainGroup, hkOverflowGroup, h.opts.Rate, h.opts.Duration)

	// Produce, watch and narrate.
	pctx, stopWatch := context.WithCancel(ctx)
	var wwg sync.WaitGroup
	wwg.Go(func() { h.watch(pctx) }) // exits on stopWatch
	perr := h.produce(ctx)
	stopWatch()
	wwg.Wait()
	if perr != nil {
		return HotkeysReport{}, perr
	}

	// Drain: flush, then wait (bounded) until the consumers have committed
	// every acknowledged record.
	h.say("stopped producing: %d records; flushing and letting the consumers drain", h.produced.Load())
	fctx, fcancel := context.WithTimeout(ctx, hkDrainTimeout)
	defer fcancel()
	if err := h.router.Flush(fctx); err != nil {
		h.say("flush: %v", err)
	}
	s := h.router.Stats()
	if err := h.rec.waitConsumed(fctx, s.Main+s.Overflow); err != nil {
		h.say("drain: %v", err)
	}
	stopConsumers()
	cwg.Wait()
	h.router.Close() // every send has resolved: Close waits for them
	routerOpen = false
	h.finish(h.router.Stats())
	return h.report, nil
}

// produce sends Zipf keys at Rate, the hot key at a baseline rate, a burst
// on it between burstFrom and burstTo, and a little junk, each key with
// its own sequence numbers, until the duration has passed.
func (h *hotkeysDemo) produce(ctx context.Context) error {
	d := h.opts.Duration
	burstFrom := d / 5
	burstTo := min(d*3/5, d-hkReturnMargin)
	burstRate := hkThreshold * hkBurstFactor
	h.report.BurstPerS = burstRate
	h.report.ThresholdPerS = hkThreshold

	rng := rand.New(rand.NewPCG(1, 7))
	zipf := rand.NewZipf(rng, 1.1, 1, 1_000_000-1)
	seq := map[string]int{}
	send := func(key string) {
		v := key + "#" + strconv.Itoa(seq[key])
		seq[key]++
		h.produced.Add(1)
		h.router.Produce(ctx, &kgo.Record{Key: []byte(key), Value: []byte(v)}, func(*kgo.Record, error) {})
	}
	began := time.Now()
	var zipfSent, hotSent, junkSent float64
	bursting := false
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		el := time.Since(began)
		if el >= d {
			return nil
		}
		if b := el >= burstFrom && el < burstTo; b != bursting {
			bursting = b
			if b {
				h.say("burst: %s at %.0f msg/s (%d× the threshold) until %.1fs", hotKey, burstRate, hkBurstFactor, (burstTo + h.sinceStart(began)).Seconds())
			} else {
				h.say("burst over: %s back to %d msg/s", hotKey, hkHotBaseline)
			}
		}
		sec := el.Seconds()
		for ; zipfSent < sec*float64(h.opts.Rate); zipfSent++ {
			send("user:" + strconv.FormatUint(zipf.Uint64(), 10))
		}
		hotWant := sec * hkHotBaseline
		if el > burstFrom {
			hotWant += (min(el, burstTo) - burstFrom).Seconds() * burstRate
		}
		for ; hotSent < hotWant; hotSent++ {
			send(hotKey)
		}
		for ; junkSent < sec*5; junkSent++ { // 5/s of each junk kind
			send(junkDropKey)
			send([]string{"anonymous", "null", "undefined"}[int(junkSent)%3])
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// sinceStart is how long after the demo's start t was.
func (h *hotkeysDemo) sinceStart(t time.Time) time.Duration { return t.Sub(h.start) }

// watch narrates the router's side: the hot key entering and leaving
// overflow, and counts every few seconds.
func (h *hotkeysDemo) watch(ctx context.Context) {
	t := time.NewTicker(hkWatchPeriod)
	defer t.Stop()
	lastCount := time.Now()
	inOverflow := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		hot, others := false, 0
		for _, k := range h.router.OverflowKeys() {
			switch k.Key {
			case hotKey:
				hot = true
			case "anonymous", "null", "undefined":
			default:
				others++
			}
		}
		if hot != inOverflow {
			inOverflow = hot
			if hot {
				h.say("router: %s is hot → overflow, key kept: overflow partition %d (murmur2)",
					hotKey, kafka.KeyPartition([]byte(hotKey), hkPartitions))
			} else {
				h.say("router: %s cooled down and its overflow backlog is committed → back to main", hotKey)
			}
		}
		if time.Since(lastCount) >= hkNarratePeriod {
			lastCount = time.Now()
			s := h.router.Stats()
			cm, co := h.rec.counts()
			h.say("produced %d: main %d, overflow %d, dropped %d, pending %d; consumed main %d, overflow %d; other keys in overflow: %d",
				h.produced.Load(), s.Main, s.Overflow, s.Dropped, s.Pending, cm, co, others)
		}
	}
}

// consume is one lane's consumer: each record passes the lane's barrier,
// is processed (recorded), and the batch is committed after processing;
// then the other lane's barrier is told.
func (h *hotkeysDemo) consume(ctx context.Context, cl *kgo.Client, lane kafka.Lane, wait, other *kafka.Barrier) {
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
			h.rec.fail(err)
			return
		}
		recs := fs.Records()
		for _, r := range recs {
			if err := wait.Wait(ctx, r); err != nil {
				if ctx.Err() == nil {
					h.rec.fail(err)
				}
				return
			}
			h.rec.start(lane, r)
			time.Sleep(0) // let the other lane overlap, if it could
			h.rec.end(lane, r)
		}
		if len(recs) == 0 {
			continue
		}
		if err := cl.CommitRecords(ctx, recs...); err != nil {
			if ctx.Err() == nil {
				h.rec.fail(fmt.Errorf("%v consumer: commit: %w", lane, err))
			}
			return
		}
		other.Notify()
		h.rec.committed(lane, len(recs))
	}
}

// finish computes the report and prints the checks.
func (h *hotkeysDemo) finish(s kafka.Stats) {
	r := &h.report
	rec := h.rec
	rec.mu.Lock()
	r.Produced = h.produced.Load()
	r.ConsumedMain, r.ConsumedOverflow = rec.consumed[kafka.Main], rec.consumed[kafka.Overflow]
	r.Consumed = r.ConsumedMain + r.ConsumedOverflow
	r.DroppedCounted = s.Dropped
	r.Failed = s.Failed + s.TimedOut + s.MissingKey
	r.Lost = int64(r.Produced) - int64(r.Consumed) - int64(r.DroppedCounted)
	r.HotKey = hotKey
	for p := range rec.hotParts {
		r.HotKeyPartitionIDs = append(r.HotKeyPartitionIDs, p)
	}
	slices.Sort(r.HotKeyPartitionIDs)
	r.HotKeyOverflowPartitions = len(r.HotKeyPartitionIDs)
	r.HotKeyLanes = []string{}
	for _, l := range rec.hotLanes {
		r.HotKeyLanes = append(r.HotKeyLanes, l.String())
	}
	r.HotKeyOverflowed = rec.hotOverflow
	r.HotKeyEnteredS = rec.hotEntered.Seconds()
	r.HotKeyReturnedS = rec.hotReturned.Seconds()
	r.LaneOverlaps = rec.overlaps
	r.OrderViolations = rec.violations
	failed := rec.failed
	rec.mu.Unlock()
	r.OverflowEntries, r.OverflowReleases = s.Policy.Entered, s.Policy.Released
	r.DurationS = time.Since(h.start).Seconds()
	returned := slices.Equal(r.HotKeyLanes, []string{"main", "overflow", "main"})
	r.OK = failed == nil && r.Lost == 0 && r.Failed == 0 && r.LaneOverlaps == 0 && r.OrderViolations == 0 &&
		r.HotKeyOverflowPartitions == 1 && r.DroppedCounted > 0 && returned

	out := h.opts.Out
	h.outMu.Lock()
	defer h.outMu.Unlock()
	fmt.Fprintf(out, "\nchecks:\n")
	check := func(ok bool, format string, args ...any) {
		mark := "ok  "
		if !ok {
			mark = "FAIL"
		}
		fmt.Fprintf(out, "  %s %s\n", mark, fmt.Sprintf(format, args...))
	}
	if failed != nil {
		check(false, "consumers ran without error: %v", failed)
	}
	check(r.Lost == 0 && r.Failed == 0, "nothing lost: %d produced = %d consumed (main %d, overflow %d) + %d dropped by rule; %d lost, %d failed",
		r.Produced, r.Consumed, r.ConsumedMain, r.ConsumedOverflow, r.DroppedCounted, r.Lost, r.Failed)
	check(r.DroppedCounted > 0, "drops are counted, never silent: %d records of %s dropped by rule", r.DroppedCounted, junkDropKey)
	check(r.LaneOverlaps == 0, "main and overflow never processed one key at once (%d overlaps)", r.LaneOverlaps)
	check(r.OrderViolations == 0, "per-key order held across lanes (%d violations)", r.OrderViolations)
	check(r.HotKeyOverflowPartitions == 1, "%s used one overflow partition: %v (%d records)", hotKey, r.HotKeyPartitionIDs, r.HotKeyOverflowed)
	check(returned, "%s went main → overflow → main: %s", hotKey, strings.Join(r.HotKeyLanes, " → "))
	fmt.Fprintf(out, "policy: %d entries into overflow, %d releases (all keys, junk included); threshold %.0f msg/s, burst %.0f msg/s\n",
		r.OverflowEntries, r.OverflowReleases, r.ThresholdPerS, r.BurstPerS)
}

// laneRecorder records what the two consumer groups process: overlaps of
// the lanes on one key, per-key order, and the hot key's trip.
type laneRecorder struct {
	mu       sync.Mutex
	say      func(format string, args ...any)
	start0   time.Time
	active   map[string]kafka.Lane
	last     map[string]int // last sequence number processed per key
	consumed map[kafka.Lane]uint64
	failed   error
	changed  chan struct{}

	overlaps, violations    int
	hotLanes                []kafka.Lane
	hotParts                map[int32]bool
	hotOverflow             uint64
	hotEntered, hotReturned time.Duration
}

func newLaneRecorder() *laneRecorder {
	return &laneRecorder{
		start0: time.Now(), active: map[string]kafka.Lane{}, last: map[string]int{},
		consumed: map[kafka.Lane]uint64{}, changed: make(chan struct{}), hotParts: map[int32]bool{},
	}
}

func (lr *laneRecorder) start(lane kafka.Lane, r *kgo.Record) {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	key := string(r.Key)
	if other, ok := lr.active[key]; ok && other != lane {
		lr.overlaps++
	}
	lr.active[key] = lane
	_, s, _ := strings.Cut(string(r.Value), "#")
	seq, err := strconv.Atoi(s)
	if prev, ok := lr.last[key]; err != nil || (ok && seq <= prev) {
		lr.violations++
	}
	lr.last[key] = seq
	if key != hotKey {
		return
	}
	if lane == kafka.Overflow {
		lr.hotOverflow++
		lr.hotParts[r.Partition] = true
	}
	if n := len(lr.hotLanes); n == 0 || lr.hotLanes[n-1] != lane {
		lr.hotLanes = append(lr.hotLanes, lane)
		if n == 0 {
			return
		}
		barrier := ""
		for _, hd := range r.Headers {
			if hd.Key == kafka.HeaderWaitMain || hd.Key == kafka.HeaderWaitOverflow {
				barrier = fmt.Sprintf(", after the barrier %s=%s", hd.Key, hd.Value)
			}
		}
		if lane == kafka.Overflow {
			if lr.hotEntered == 0 {
				lr.hotEntered = time.Since(lr.start0)
			}
			lr.say("overflow consumer: first %s record (#%d) on overflow partition %d%s", hotKey, seq, r.Partition, barrier)
		} else {
			lr.hotReturned = time.Since(lr.start0)
			lr.say("main consumer: %s back on main partition %d (#%d)%s", hotKey, r.Partition, seq, barrier)
		}
	}
}

func (lr *laneRecorder) end(lane kafka.Lane, r *kgo.Record) {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	if lr.active[string(r.Key)] == lane {
		delete(lr.active, string(r.Key))
	}
}

func (lr *laneRecorder) committed(lane kafka.Lane, n int) {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	lr.consumed[lane] += uint64(n)
	close(lr.changed)
	lr.changed = make(chan struct{})
}

func (lr *laneRecorder) fail(err error) {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	if lr.failed == nil {
		lr.failed = err
		lr.say("consumer error: %v", err)
	}
	close(lr.changed)
	lr.changed = make(chan struct{})
}

func (lr *laneRecorder) counts() (main, overflow uint64) {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	return lr.consumed[kafka.Main], lr.consumed[kafka.Overflow]
}

// waitConsumed waits until n records have been processed and committed.
func (lr *laneRecorder) waitConsumed(ctx context.Context, n uint64) error {
	for {
		lr.mu.Lock()
		got, failed, ch := lr.consumed[kafka.Main]+lr.consumed[kafka.Overflow], lr.failed, lr.changed
		lr.mu.Unlock()
		switch {
		case failed != nil:
			return failed
		case got >= n:
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("consumed %d of %d: %w", got, n, ctx.Err())
		}
	}
}
