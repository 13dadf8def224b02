package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/client/stream"
	"github.com/keyshard/keyshard/internal/streamcheck"
	"github.com/keyshard/keyshard/kafka"
	"github.com/keyshard/keyshard/placement"
)

// StreamOptions shape a `keyshard demo --mode stream` run. Zero values
// take the defaults.
type StreamOptions struct {
	// Duration bounds the schedule (default 30s, at least 10s).
	Duration time.Duration
	// Workers to start with (default 2).
	Workers int
	// Buckets of the demo's stream keyspace (default 256).
	Buckets int
	// Rate of keyed events a second appended to the stream (default 2000).
	Rate int
	// Out receives the running commentary (default: discard).
	Out io.Writer
	// Logger receives the server's and SDK's logs (default: discard).
	Logger *slog.Logger
}

// StreamReport is the stream demo's record, checked: the JSON object that
// `keyshard demo --mode stream --json` prints last. The embedded
// streamcheck.Report has the counts of the checks (events, missed,
// order_violations, duplicates_graceful, duplicates_crash,
// duplicates_crash_bound, ...).
type StreamReport struct {
	streamcheck.Report
	// EndPosition is the stream's end when the producer stopped: every
	// event below it was waited for.
	EndPosition uint64 `json:"end_position"`
	// Commits counts Commit calls the server answered, CommitWrites the
	// store writes it made for them; CommitWritesPerCall is their ratio
	// (1: one write per call; below 1: concurrent commits shared writes).
	Commits             int64   `json:"commits"`
	CommitWrites        int64   `json:"commit_writes"`
	CommitWritesPerCall float64 `json:"commit_writes_per_call"`
	Epoch               uint64  `json:"epoch"`
	DurationS           float64 `json:"duration_s"`
	// OK is true when every check passed.
	OK bool `json:"ok"`
}

const (
	streamKeyspace = "senders"
	streamTopic    = "events"
	streamKeys     = 2000
	commitInterval = 200 * time.Millisecond
)

// RunStream starts an embedded Keyshard server with a stream keyspace, a
// one-partition Kafka topic (franz-go's in-process kfake cluster; offset =
// position) that a producer appends keyed events to, and stream workers
// that read it through kafka.PartitionReader. On a schedule workers join,
// one leaves gracefully, one is killed, and one more joins; then the
// producer stops, the demo waits until every bucket's committed position
// reaches the end of the stream, stops the workers gracefully and checks
// its record with streamcheck. It returns an error only if the demo could
// not run; failed checks show in the report (OK false).
func RunStream(ctx context.Context, sopts StreamOptions) (StreamReport, error) {
	opts := Options(sopts)
	if err := opts.normalize(2); err != nil {
		return StreamReport{}, err
	}
	hasher, err := placement.NewHasher(placement.HashXXH64, opts.Buckets)
	if err != nil {
		return StreamReport{}, fmt.Errorf("--buckets: %w", err)
	}
	srv, err := startServer(ctx, client.KeyspaceConfig{Name: streamKeyspace, Buckets: opts.Buckets, Mode: "stream"}, opts.Logger)
	if err != nil {
		return StreamReport{}, err
	}
	defer srv.Close()

	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, streamTopic))
	if err != nil {
		return StreamReport{}, fmt.Errorf("start the in-process Kafka cluster: %w", err)
	}
	defer kc.Close()

	d := &streamDemo{opts: StreamOptions(opts), url: srv.URL(), brokers: kc.ListenAddrs(), hasher: hasher, rec: streamcheck.NewRecorder(), workers: map[string]*streamWorker{}, start: time.Now()}
	d.cl, err = client.Dial(d.url, client.Logger(opts.Logger))
	if err != nil {
		return StreamReport{}, err
	}
	defer d.cl.Close()
	fmt.Fprintf(opts.Out, "keyshard demo --mode stream: server on %s (embedded etcd), stream keyspace %q: %d buckets, lease TTL %v\n", d.url, streamKeyspace, opts.Buckets, leaseTTL)
	fmt.Fprintf(opts.Out, "stream: Kafka topic %q, one partition (kfake, in process); offset = position; %d keyed events/s over %d keys, for %v\n\n", streamTopic, opts.Rate, streamKeys, opts.Duration)
	return d.run(ctx)
}

type streamDemo struct {
	opts    StreamOptions
	url     string
	brokers []string
	hasher  placement.Hasher
	cl      *client.Client
	rec     *streamcheck.Recorder
	start   time.Time

	evMu   sync.Mutex
	events []streamcheck.Event

	mu      sync.Mutex
	workers map[string]*streamWorker
	order   []string // running workers, oldest first
	next    int
	wg      sync.WaitGroup // every worker's Run
	runErr  error          // the first unexpected end of a worker
}

type streamWorker struct {
	name    string
	sw      *stream.Worker
	kcl     *kgo.Client
	kill    context.CancelFunc
	crashed bool // (streamDemo.mu) set before kill
	done    chan struct{}
}

func (d *streamDemo) say(format string, args ...any) {
	fmt.Fprintf(d.opts.Out, "[%5.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

func (d *streamDemo) run(ctx context.Context) (StreamReport, error) {
	ctx, cancel := context.WithTimeout(ctx, d.opts.Duration+60*time.Second)
	defer cancel()
	workersCtx, stopWorkers := context.WithCancel(context.WithoutCancel(ctx))
	defer func() { stopWorkers(); d.wg.Wait() }()

	for range d.opts.Workers {
		if _, err := d.startWorker(workersCtx); err != nil {
			return StreamReport{}, err
		}
	}
	d.say("%d stream workers joined; each reads the partition and handles the events of its buckets", d.opts.Workers)

	prodCl, err := kgo.NewClient(kgo.SeedBrokers(d.brokers...), kgo.DefaultProduceTopic(streamTopic))
	if err != nil {
		return StreamReport{}, err
	}
	defer prodCl.Close()
	sendCtx, stopSending := context.WithCancel(ctx)
	sent := make(chan error, 1)
	go func() { sent <- d.produce(sendCtx, prodCl) }() // exits when stopSending is called

	at := func(frac float64) time.Time { return d.start.Add(time.Duration(frac * float64(d.opts.Duration))) }
	schedule := []struct {
		at  float64
		act func() (string, error)
	}{
		{0.15, func() (string, error) {
			n, err := d.startWorker(workersCtx)
			return n + " joins: buckets move to it with their positions", err
		}},
		{0.30, func() (string, error) { n, err := d.startWorker(workersCtx); return n + " joins", err }},
		{0.45, func() (string, error) { return d.leave(ctx) }},
		{0.60, d.crash},
		{0.75, func() (string, error) { n, err := d.startWorker(workersCtx); return n + " joins", err }},
	}
	fail := func(err error) (StreamReport, error) {
		stopSending()
		<-sent
		return StreamReport{}, err
	}
	for _, s := range schedule {
		if err := sleepUntil(ctx, at(s.at)); err != nil {
			return fail(err)
		}
		what, err := s.act()
		if err != nil {
			return fail(err)
		}
		d.say("%s", what)
	}
	if err := sleepUntil(ctx, at(0.9)); err != nil {
		return fail(err)
	}
	stopSending()
	if err := <-sent; err != nil {
		return StreamReport{}, fmt.Errorf("producer: %w", err)
	}
	d.evMu.Lock()
	end := uint64(len(d.events))
	d.evMu.Unlock()
	d.say("producer stopped at position %d; waiting until every bucket's committed position reaches it", end)
	if err := d.waitCaughtUp(ctx, end); err != nil {
		return StreamReport{}, err
	}

	// Stop the workers gracefully (each commits and releases with its
	// final positions), then check the record.
	d.mu.Lock()
	live := slices.Clone(d.order)
	d.mu.Unlock()
	for _, name := range live {
		if err := d.closeWorker(ctx, name); err != nil {
			return StreamReport{}, err
		}
	}
	stopWorkers()
	d.wg.Wait()
	d.mu.Lock()
	runErr := d.runErr
	d.mu.Unlock()
	if runErr != nil {
		return StreamReport{}, runErr
	}
	return d.finish(ctx, end)
}

// produce appends keyed events at the configured rate until ctx ends,
// recording each with the offset the broker gave it.
func (d *streamDemo) produce(ctx context.Context, cl *kgo.Client) error {
	const tick = 10 * time.Millisecond
	per := max(1, d.opts.Rate/int(time.Second/tick))
	rng := rand.New(rand.NewPCG(1, 2))
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		recs := make([]*kgo.Record, per)
		for i := range recs {
			recs[i] = &kgo.Record{Key: fmt.Appendf(nil, "room-%d", rng.IntN(streamKeys))}
		}
		// Not ctx: a batch begun is finished, so every event in the
		// topic is in the record.
		res := cl.ProduceSync(context.WithoutCancel(ctx), recs...)
		if err := res.FirstErr(); err != nil {
			return err
		}
		d.evMu.Lock()
		for _, r := range res {
			d.events = append(d.events, streamcheck.Event{Pos: uint64(r.Record.Offset), Key: string(r.Record.Key), Bucket: d.hasher.Bucket(r.Record.Key)})
		}
		d.evMu.Unlock()
	}
}

// startWorker starts one more stream worker and returns its name.
func (d *streamDemo) startWorker(ctx context.Context) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.next++
	name := fmt.Sprintf("s%d", d.next)
	kcl, err := kgo.NewClient(kgo.SeedBrokers(d.brokers...))
	if err != nil {
		return "", err
	}
	r, err := kafka.NewPartitionReader(kcl, streamTopic, 0, kafka.PartitionReaderConfig{MaxWait: 50 * time.Millisecond})
	if err != nil {
		kcl.Close()
		return "", err
	}
	w := &streamWorker{name: name, kcl: kcl, done: make(chan struct{})}
	handle := func(_ context.Context, rec stream.Record) error {
		d.rec.Handle(name, rec.Bucket, rec.Token, rec.Position, string(rec.Key))
		return nil
	}
	onEvent := func(ev client.Event) {
		switch ev.Kind {
		case client.EventAcquired:
			d.rec.Acquire(name, ev.Grant.Bucket, ev.Grant.Token, ev.Grant.From)
		case client.EventReleased:
			d.rec.Stop(name, ev.Grant.Bucket, ev.Grant.Token)
		case client.EventReleaseRecorded:
			// A release the server recorded is graceful; one that never
			// reached it (the session was lost first) ends as a crash.
			var final uint64
			if ev.Final != nil {
				final = *ev.Final
			}
			d.rec.Release(name, ev.Grant.Bucket, ev.Grant.Token, final)
		case client.EventCommitted:
			// The commit as applied, with the final positions of released
			// buckets the server may still hold.
			c := ev.Commit
			except := make([]streamcheck.BucketPosition, len(c.Exceptions))
			for i, e := range c.Exceptions {
				except[i] = streamcheck.BucketPosition{Bucket: e.Bucket, Token: e.Token, Position: e.Position}
			}
			d.rec.Commit(name, c.MaxToken, c.Position, except)
		case client.EventSessionLost:
			d.rec.Crash(name)
		}
	}
	w.sw, err = stream.NewWorker(d.cl, streamKeyspace, client.Member{ID: name, Address: "in-process/" + name}, r, handle, stream.WorkerOptions{
		CommitInterval: commitInterval,
		Worker:         []client.WorkerOption{client.OnEvent(onEvent), client.Logger(d.opts.Logger)},
	})
	if err != nil {
		kcl.Close()
		return "", err
	}
	runCtx, kill := context.WithCancel(ctx)
	w.kill = kill
	d.workers[name] = w
	d.order = append(d.order, name)
	d.wg.Add(1)
	go func() { // exits when the worker stops (Close, kill, or the demo's end)
		defer d.wg.Done()
		defer close(w.done)
		defer kcl.Close()
		err := w.sw.Run(runCtx)
		d.mu.Lock()
		defer d.mu.Unlock()
		if w.crashed {
			d.rec.Crash(name)
			return
		}
		if err != nil && runCtx.Err() == nil && d.runErr == nil {
			d.runErr = fmt.Errorf("stream worker %s: %w", name, err)
		}
	}()
	return name, nil
}

// take removes the i-th oldest running worker from the running ones.
func (d *streamDemo) take(i int) *streamWorker {
	d.mu.Lock()
	defer d.mu.Unlock()
	if i >= len(d.order) {
		return nil
	}
	w := d.workers[d.order[i]]
	d.order = slices.Delete(d.order, i, i+1)
	return w
}

// leave closes the oldest worker gracefully: it hands each bucket over
// with its final position, so its next holder reprocesses nothing.
func (d *streamDemo) leave(ctx context.Context) (string, error) {
	w := d.take(0)
	if w == nil {
		return "", errors.New("no worker to stop")
	}
	go func() { // exits when the drain finishes (bounded by its timeout)
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_ = w.sw.Close(cctx)
	}()
	return w.name + " leaves gracefully: it releases each bucket with its final position", nil
}

// crash stops a worker as a killed process: no release, no last commit.
// Its buckets move once etcd expires its lease, from their last commit.
func (d *streamDemo) crash() (string, error) {
	w := d.take(1)
	if w == nil {
		return "", errors.New("no worker to crash")
	}
	d.mu.Lock()
	w.crashed = true
	d.mu.Unlock()
	w.kill()
	return fmt.Sprintf("%s is killed: its buckets move after its lease (%v), each from its last commit", w.name, leaseTTL), nil
}

func (d *streamDemo) closeWorker(ctx context.Context, name string) error {
	d.mu.Lock()
	w := d.workers[name]
	if i := slices.Index(d.order, name); i >= 0 {
		d.order = slices.Delete(d.order, i, i+1)
	}
	d.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := w.sw.Close(cctx); err != nil {
		return fmt.Errorf("close stream worker %s: %w", name, err)
	}
	return nil
}

// waitCaughtUp waits until every bucket's committed position is at least
// end, printing progress every second.
func (d *streamDemo) waitCaughtUp(ctx context.Context, end uint64) error {
	deadline := time.Now().Add(30 * time.Second)
	lastSaid := time.Now()
	for {
		p, err := d.cl.Admin().Positions(ctx, streamKeyspace, 1)
		if err != nil {
			return fmt.Errorf("read the committed positions: %w", err)
		}
		if p.Min >= end {
			d.say("every bucket committed at or past %d (min %d, max %d)", end, p.Min, p.Max)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the buckets did not reach position %d within 30s: the furthest behind is at %d (%+v)", end, p.Min, p.Behind)
		}
		if time.Since(lastSaid) >= time.Second {
			d.say("waiting: the furthest bucket behind is at %d of %d", p.Min, end)
			lastSaid = time.Now()
		}
		if err := sleepUntil(ctx, time.Now().Add(commitInterval)); err != nil {
			return err
		}
	}
}

func (d *streamDemo) finish(ctx context.Context, end uint64) (StreamReport, error) {
	d.evMu.Lock()
	events := slices.Clone(d.events)
	d.evMu.Unlock()
	rep := StreamReport{Report: streamcheck.Check(events, d.rec, end), EndPosition: end, DurationS: time.Since(d.start).Seconds()}
	commits, writes, err := commitCounts(ctx, d.url)
	if err != nil {
		return rep, err
	}
	rep.Commits, rep.CommitWrites = commits, writes
	if commits > 0 {
		rep.CommitWritesPerCall = float64(writes) / float64(commits)
	}
	if m, err := d.cl.Admin().Positions(ctx, streamKeyspace, 0); err == nil {
		rep.Epoch = m.Epoch
	}
	rep.OK = rep.Report.OK() && rep.Commits > 0 && rep.CommitWritesPerCall <= 1
	d.printStream(rep)
	return rep, nil
}

func (d *streamDemo) printStream(rep StreamReport) {
	out := d.opts.Out
	mark := func(ok bool) string {
		if ok {
			return "ok  "
		}
		return "FAIL"
	}
	fmt.Fprintf(out, "\nchecks (%d events, %d handlings over %d tenures: %d graceful releases, %d crashed):\n", rep.Events, rep.Handled, rep.Tenures, rep.Releases, rep.Crashes)
	fmt.Fprintf(out, "  %s every event handled at least once by a holder of its bucket: %d missed\n", mark(rep.Missed == 0 && rep.Strays == 0), rep.Missed)
	fmt.Fprintf(out, "  %s each key in stream order within each holder's tenure: %d violations\n", mark(rep.OrderViolations == 0), rep.OrderViolations)
	fmt.Fprintf(out, "  %s no duplicates after a graceful move: %d\n", mark(rep.DuplicatesGraceful == 0), rep.DuplicatesGraceful)
	fmt.Fprintf(out, "  %s duplicates after a crash only after its last commit: %d (bound %d, %d before the commit)\n", mark(rep.DuplicatesOverBound == 0 && rep.DuplicatesCrash <= rep.DuplicatesCrashBound), rep.DuplicatesCrash, rep.DuplicatesCrashBound, rep.DuplicatesOverBound)
	fmt.Fprintf(out, "  %s positions moved with their buckets, never back: %d regressions\n", mark(rep.PositionRegressions == 0), rep.PositionRegressions)
	fmt.Fprintf(out, "  %s store writes per Commit call: %.3f (%d writes for %d calls)\n", mark(rep.Commits > 0 && rep.CommitWritesPerCall <= 1), rep.CommitWritesPerCall, rep.CommitWrites, rep.Commits)
	for _, v := range rep.Violations {
		fmt.Fprintf(out, "    %s\n", v)
	}
	if rep.OK {
		fmt.Fprintln(out, "all checks passed")
	}
}

// commitCounts reads the server's Commit counters from its /metrics.
func commitCounts(ctx context.Context, url string) (commits, writes int64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("read the server's metrics: %w", err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, 0, fmt.Errorf("parse the server's metrics: %w", err)
	}
	sum := func(name string) int64 {
		var n float64
		if f, ok := fams[name]; ok {
			for _, m := range f.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
		return int64(n)
	}
	return sum("keyshard_commits_total"), sum("keyshard_commit_writes_total"), nil
}
