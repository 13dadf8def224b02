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
	"sort"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/internal/kitseam"
	"github.com/keyshard/keyshard/internal/server"
	"github.com/keyshard/keyshard/keyshardtest"
	"github.com/keyshard/keyshard/placement"
)

// Options shape a demo run. Zero values take the defaults.
type Options struct {
	// Duration bounds the run (default 30s, at least 10s): the schedule of
	// joins, a leave and a crash is spread over it.
	Duration time.Duration
	// Workers to start with (default 3).
	Workers int
	// Buckets of the demo keyspace (default 256).
	Buckets int
	// Rate of keyed events per second (default 2000).
	Rate int
	// Out receives the running commentary (default: discard).
	Out io.Writer
	// Logger receives the server's and SDK's logs (default: discard).
	Logger *slog.Logger
}

// Report is the demo's own record, checked: the JSON object that
// `keyshard demo --json` prints last.
type Report struct {
	OverlappingGrants int   `json:"overlapping_grants"`
	TokenRegressions  int   `json:"token_regressions"`
	EventsSent        int64 `json:"events_sent"`
	EventsProcessed   int64 `json:"events_processed"`
	EventsLost        int64 `json:"events_lost"`
	EventsByNonHolder int64 `json:"events_by_non_holder"`
	Moves             int   `json:"moves"`
	OptimalMoves      int   `json:"optimal_moves"`
	// Handoffs counts graceful handoffs (old owner released, new owner
	// acquired); the percentiles are of the time between the two.
	Handoffs       int     `json:"handoffs"`
	HandoffP50Ms   float64 `json:"handoff_p50_ms"`
	HandoffP99Ms   float64 `json:"handoff_p99_ms"`
	CrashTakeoverS float64 `json:"crash_takeover_s"`
	LeaseTTLS      float64 `json:"lease_ttl_s"`
	Epoch          uint64  `json:"epoch"`
	Steps          []Step  `json:"steps"`
	DurationS      float64 `json:"duration_s"`
	// OK is true when every check passed.
	OK bool `json:"ok"`
}

// Step is one scheduled change and what it cost.
type Step struct {
	At          float64 `json:"at_s"`
	Action      string  `json:"action"`
	Epoch       uint64  `json:"epoch"`
	Moved       int     `json:"moved"`
	Optimal     int     `json:"optimal"`
	ConvergedMs float64 `json:"converged_ms"`
}

const (
	keyspace = "rooms"
	leaseTTL = 2 * time.Second
	keys     = 10000
)

// Run starts an embedded Keyshard server, workers that join, leave and
// crash on a schedule, and a router sending keyed events to their owners;
// then checks its own record. It returns an error only if the demo could
// not run; failed checks show in the report (OK false).
func Run(ctx context.Context, opts Options) (Report, error) {
	if err := opts.normalize(3); err != nil {
		return Report{}, err
	}
	srv, err := startServer(ctx, client.KeyspaceConfig{Name: keyspace, Buckets: opts.Buckets}, opts.Logger)
	if err != nil {
		return Report{}, err
	}
	defer srv.Close()
	url := srv.URL()
	fmt.Fprintf(opts.Out, "keyshard demo: server on %s (embedded etcd), keyspace %q: %d buckets, lease TTL %v\n", url, keyspace, opts.Buckets, leaseTTL)
	fmt.Fprintf(opts.Out, "%d workers, %d keyed events/s, for %v\n\n", opts.Workers, opts.Rate, opts.Duration)

	d := &demo{opts: opts, url: url, rec: newRecorder(), workers: map[string]*worker{}, start: time.Now()}
	d.cl, err = client.Dial(url, client.Logger(opts.Logger))
	if err != nil {
		return Report{}, err
	}
	defer d.cl.Close()
	d.maps = keyshardv1connect.NewMapServiceClient(http.DefaultClient, url)
	d.admin = d.cl.Admin()
	return d.run(ctx)
}

// normalize fills opts' zero values with the defaults (workers: the
// mode's number of workers to start with) and checks the duration.
func (opts *Options) normalize(workers int) error {
	if opts.Duration == 0 {
		opts.Duration = 30 * time.Second
	}
	if opts.Duration < 10*time.Second {
		return fmt.Errorf("--duration %v is too short: the schedule needs at least 10s", opts.Duration)
	}
	if opts.Workers <= 0 {
		opts.Workers = workers
	}
	if opts.Buckets <= 0 {
		opts.Buckets = 256
	}
	if opts.Rate <= 0 {
		opts.Rate = 2000
	}
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

// startServer starts the demo's embedded server with keyspace kc, at the
// demo's lease TTL and drain timeout.
func startServer(ctx context.Context, kc client.KeyspaceConfig, logger *slog.Logger) (*keyshardtest.Server, error) {
	kc.LeaseTTL, kc.DrainTimeout = leaseTTL, 10*time.Second
	srv, err := keyshardtest.Start(ctx, keyshardtest.Options{
		Keyspaces: []client.KeyspaceConfig{kc},
		Logger:    logger,
		Internal:  &kitseam.Options{Config: func(c *server.Config) { c.Replica = "demo" }},
	})
	if err != nil {
		return nil, fmt.Errorf("start the embedded server: %w", err)
	}
	return srv, nil
}

type demo struct {
	opts    Options
	url     string
	cl      *client.Client
	admin   *client.Admin
	maps    keyshardv1connect.MapServiceClient
	router  *client.Router
	rec     *recorder
	start   time.Time
	mu      sync.Mutex
	workers map[string]*worker
	next    int
	report  Report

	crashedAt time.Time
}

func (d *demo) say(format string, args ...any) {
	fmt.Fprintf(d.opts.Out, "[%5.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

func (d *demo) run(ctx context.Context) (Report, error) {
	ctx, cancel := context.WithTimeout(ctx, d.opts.Duration+30*time.Second)
	defer cancel()
	g, gctx := errgroup.WithContext(ctx)
	workersCtx, stopWorkers := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWorkers()

	prev, err := d.currentMap(gctx)
	if err != nil {
		return d.report, err
	}
	var names []string
	for range d.opts.Workers {
		name, err := d.startWorker(workersCtx, g)
		if err != nil {
			return d.report, err
		}
		names = append(names, name)
	}
	if err := d.step(gctx, fmt.Sprintf("%s joined", strings.Join(names, ", ")), &prev); err != nil {
		return d.report, err
	}
	if d.router, err = client.NewRouter(d.cl, keyspace); err != nil {
		return d.report, err
	}
	defer d.router.Close()
	if err := d.router.Start(gctx); err != nil {
		return d.report, err
	}

	// Keyed events flow for the whole schedule.
	sendCtx, stopSending := context.WithCancel(gctx)
	var sending sync.WaitGroup
	sending.Add(1)
	go func() { defer sending.Done(); d.send(sendCtx) }() // exits when stopSending is called

	at := func(frac float64) time.Time { return d.start.Add(time.Duration(frac * float64(d.opts.Duration))) }
	schedule := []struct {
		at  float64
		act func() (string, error)
	}{
		{0.15, func() (string, error) { return d.join(workersCtx, g) }},
		{0.30, func() (string, error) { return d.join(workersCtx, g) }},
		{0.45, func() (string, error) { return d.leave(gctx) }},
		{0.60, func() (string, error) { return d.crash() }},
		{0.75, func() (string, error) { return d.join(workersCtx, g) }},
	}
	for _, s := range schedule {
		if err := sleepUntil(gctx, at(s.at)); err != nil {
			stopSending()
			sending.Wait()
			return d.report, err
		}
		what, err := s.act()
		if err != nil {
			stopSending()
			sending.Wait()
			return d.report, err
		}
		if err := d.step(gctx, what, &prev); err != nil {
			stopSending()
			sending.Wait()
			return d.report, err
		}
	}
	if err := sleepUntil(gctx, at(0.95)); err != nil {
		stopSending()
		sending.Wait()
		return d.report, err
	}
	stopSending()
	sending.Wait()
	d.say("stopped sending: %d events sent, %d processed", d.rec.sent.Load(), d.rec.processed.Load())

	// Stop the workers gracefully, then check the record.
	d.mu.Lock()
	live := make([]*worker, 0, len(d.workers))
	for _, w := range d.workers {
		live = append(live, w)
	}
	d.mu.Unlock()
	for _, w := range live {
		cctx, ccancel := context.WithTimeout(ctx, 15*time.Second)
		_ = w.w.Close(cctx)
		ccancel()
	}
	stopWorkers()
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return d.report, err
	}
	d.finish()
	return d.report, nil
}

// startWorker starts one more worker and returns its name.
func (d *demo) startWorker(ctx context.Context, g *errgroup.Group) (string, error) {
	d.mu.Lock()
	d.next++
	name := fmt.Sprintf("w%d", d.next)
	w := &worker{name: name, rec: d.rec, held: map[int]uint64{}}
	cw, err := client.NewWorker(d.cl, keyspace, client.Member{ID: name, Address: "in-process/" + name}, w, client.Logger(d.opts.Logger))
	if err != nil {
		d.mu.Unlock()
		return "", err
	}
	runCtx, kill := context.WithCancel(ctx)
	w.w, w.kill = cw, kill
	d.workers[name] = w
	d.mu.Unlock()
	g.Go(func() error { // exits when the worker stops (Close, kill, or the demo's end)
		err := w.w.Run(runCtx)
		if err != nil && runCtx.Err() == nil {
			return fmt.Errorf("worker %s: %w", name, err)
		}
		return nil
	})
	return name, nil
}

// join starts one more worker and says so.
func (d *demo) join(ctx context.Context, g *errgroup.Group) (string, error) {
	name, err := d.startWorker(ctx, g)
	return name + " joins", err
}

// leave closes the second-oldest worker gracefully: drain, then leave.
func (d *demo) leave(ctx context.Context) (string, error) {
	w := d.pick(1)
	if w == nil {
		return "", errors.New("no worker to stop")
	}
	go func() { // exits when the drain finishes (bounded by its timeout)
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_ = w.w.Close(cctx)
	}()
	return w.name + " leaves gracefully (drain, then leave)", nil
}

// crash stops the third-oldest worker without leaving, as a killed
// process: its buckets move once etcd expires its lease.
func (d *demo) crash() (string, error) {
	w := d.pick(2)
	if w == nil {
		return "", errors.New("no worker to crash")
	}
	d.crashedAt = time.Now()
	w.crashed.Store(true)
	w.kill()
	return w.name + " crashes (stops without leaving)", nil
}

// pick removes and returns the i-th oldest running worker.
func (d *demo) pick(i int) *worker {
	d.mu.Lock()
	defer d.mu.Unlock()
	names := make([]string, 0, len(d.workers))
	for n := range d.workers {
		names = append(names, n)
	}
	sort.Slice(names, func(a, b int) bool {
		return len(names[a]) < len(names[b]) || len(names[a]) == len(names[b]) && names[a] < names[b]
	})
	if i >= len(names) {
		return nil
	}
	w := d.workers[names[i]]
	delete(d.workers, names[i])
	return w
}

// step waits until the change has converged (a new map, every bucket
// granted to its owner), then reports what moved against the optimum.
func (d *demo) step(ctx context.Context, what string, prev *mapState) error {
	began := time.Now()
	d.say("%s", what)
	want := d.liveNames()
	var cur mapState
	for {
		st, err := d.admin.Status(ctx)
		if err != nil {
			return fmt.Errorf("status: %w", err)
		}
		ks := st.Keyspaces[0]
		m, err := d.currentMap(ctx)
		if err != nil {
			return err
		}
		// A worker whose join the leader holds back (rebalance gap) is
		// counted in MembersWithoutBuckets, and not among the map's members.
		if ks.HandoffsInFlight == 0 && ks.UnassignedBuckets == 0 && ks.MembersWithoutBuckets == 0 && slices.Equal(m.members, want) {
			cur = m
			break
		}
		// Wait for the next epoch (a member expiring, a grant round) or
		// a moment, whichever first.
		if _, err := d.maps.GetMap(ctx, connect.NewRequest(&v1.GetMapRequest{Keyspace: keyspace, SinceEpoch: m.epoch, Wait: durationpb.New(100 * time.Millisecond)})); err != nil && ctx.Err() != nil {
			return ctx.Err()
		}
	}
	took := time.Since(began)
	moved, optimal := 0, 0
	if prev.assignment.Buckets() > 0 {
		for b := range cur.assignment.Owners {
			if prev.assignment.Owner(b) != cur.assignment.Owner(b) {
				moved++
			}
		}
		// The optimum from the previous map to the current members.
		var ms []placement.Member
		for _, id := range cur.members {
			ms = append(ms, placement.Member{ID: id, Weight: 1})
		}
		var err error
		if optimal, err = placement.MinMoves(prev.assignment, ms); err != nil {
			return err
		}
	}
	counts := cur.assignment.Counts()
	var parts []string
	for _, id := range cur.members {
		parts = append(parts, fmt.Sprintf("%s:%d", id, counts[id]))
	}
	d.say("  → epoch %d: %d buckets moved (optimal %d), all granted %v later; %s", cur.epoch, moved, optimal, took.Round(time.Millisecond), strings.Join(parts, " "))
	if strings.Contains(what, "crashes") {
		d.report.CrashTakeoverS = time.Since(d.crashedAt).Seconds()
	}
	d.report.Steps = append(d.report.Steps, Step{At: began.Sub(d.start).Seconds(), Action: what, Epoch: cur.epoch, Moved: moved, Optimal: optimal, ConvergedMs: float64(took.Microseconds()) / 1e3})
	d.report.Moves += moved
	d.report.OptimalMoves += optimal
	d.report.Epoch = cur.epoch
	*prev = cur
	return nil
}

func (d *demo) liveNames() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	names := make([]string, 0, len(d.workers))
	for n := range d.workers {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// mapState is a map as the demo audits it.
type mapState struct {
	epoch      uint64
	members    []string // sorted
	assignment placement.Assignment
}

func (d *demo) currentMap(ctx context.Context) (mapState, error) {
	r, err := d.maps.GetMap(ctx, connect.NewRequest(&v1.GetMapRequest{Keyspace: keyspace}))
	if err != nil {
		return mapState{}, fmt.Errorf("get map: %w", err)
	}
	m := r.Msg.GetMap()
	if m == nil {
		return mapState{}, nil
	}
	st := mapState{epoch: m.Epoch, assignment: placement.Assignment{Owners: make([]int32, len(m.Owners))}}
	counts := map[string]int{}
	for _, mem := range m.Members {
		st.assignment.Members = append(st.assignment.Members, mem.Id)
	}
	for b, o := range m.Owners {
		st.assignment.Owners[b] = int32(o) - 1
		if o > 0 {
			counts[m.Members[o-1].Id]++
		}
	}
	for id, n := range counts {
		if n > 0 {
			st.members = append(st.members, id)
		}
	}
	sort.Strings(st.members)
	return st, nil
}

// send routes keyed events to their owners at the configured rate, from a
// pool of senders, until ctx ends; each event is retried until its
// owner processed it.
func (d *demo) send(ctx context.Context) {
	events := make(chan event, 1024)
	var senders sync.WaitGroup
	for range 32 {
		senders.Add(1)
		go func() { // exits when events is closed and drained
			defer senders.Done()
			for ev := range events {
				d.deliver(ev)
			}
		}()
	}
	r := rand.New(rand.NewPCG(1, 2))
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	per := max(d.opts.Rate/100, 1)
	var id uint64
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
		}
		for range per {
			id++
			events <- event{id: id, key: fmt.Sprintf("room-%d", r.IntN(keys))}
			d.rec.sent.Add(1)
		}
	}
	close(events)
	senders.Wait()
}

type event struct {
	id  uint64
	key string
}

// deliver sends one event to its owner until it is processed, following
// wrong-owner answers to newer maps. It gives up only after 20 s.
func (d *demo) deliver(ev event) {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		owner, ok := d.router.OwnerString(ev.key)
		d.mu.Lock()
		w := d.workers[owner]
		d.mu.Unlock()
		if ok && w != nil {
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			err := w.process(ctx, ev)
			cancel()
			if err == nil {
				return
			}
			var wrong *client.WrongOwnerError
			if errors.As(err, &wrong) {
				wctx, wcancel := context.WithTimeout(context.Background(), time.Second)
				_ = d.router.WaitEpoch(wctx, wrong.Epoch)
				wcancel()
				continue
			}
		}
		// No owner yet, or the owner is gone: wait for the next map.
		wctx, wcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_ = d.router.WaitEpoch(wctx, d.router.Epoch()+1)
		wcancel()
	}
}

// finish computes the checks.
func (d *demo) finish() {
	r := &d.report
	rec := d.rec
	rec.mu.Lock()
	defer rec.mu.Unlock()
	r.OverlappingGrants = rec.overlaps
	r.TokenRegressions = rec.regressions
	r.EventsSent = rec.sent.Load()
	r.EventsProcessed = rec.processed.Load()
	r.EventsLost = r.EventsSent - r.EventsProcessed
	r.EventsByNonHolder = rec.nonHolder
	r.Handoffs = len(rec.handoffs)
	if n := len(rec.handoffs); n > 0 {
		slices.Sort(rec.handoffs)
		r.HandoffP50Ms = float64(rec.handoffs[n/2].Microseconds()) / 1e3
		r.HandoffP99Ms = float64(rec.handoffs[min(n-1, n*99/100)].Microseconds()) / 1e3
	}
	r.LeaseTTLS = leaseTTL.Seconds()
	r.DurationS = time.Since(d.start).Seconds()
	r.OK = r.OverlappingGrants == 0 && r.TokenRegressions == 0 && r.EventsLost == 0 && r.EventsByNonHolder == 0 && r.Moves == r.OptimalMoves
	fmt.Fprintf(d.opts.Out, "\nchecks:\n")
	check := func(ok bool, format string, args ...any) {
		mark := "ok  "
		if !ok {
			mark = "FAIL"
		}
		fmt.Fprintf(d.opts.Out, "  %s %s\n", mark, fmt.Sprintf(format, args...))
	}
	check(r.OverlappingGrants == 0, "no two grants of one bucket overlapped (%d overlaps)", r.OverlappingGrants)
	check(r.TokenRegressions == 0, "fencing tokens strictly increased per bucket (%d regressions)", r.TokenRegressions)
	check(r.EventsLost == 0, "every event was processed: %d sent, %d processed, %d lost", r.EventsSent, r.EventsProcessed, r.EventsLost)
	check(r.EventsByNonHolder == 0, "every event was processed by its bucket's holder (%d by a non-holder)", r.EventsByNonHolder)
	check(r.Moves == r.OptimalMoves, "buckets moved = optimum: %d = %d", r.Moves, r.OptimalMoves)
	fmt.Fprintf(d.opts.Out, "graceful handoffs: %d, release → acquire p50 %.1f ms, p99 %.1f ms; crash takeover %.1f s (lease TTL %v)\n",
		r.Handoffs, r.HandoffP50Ms, r.HandoffP99Ms, r.CrashTakeoverS, leaseTTL)
}

func sleepUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}
