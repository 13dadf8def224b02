package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/internal/chaos"
	"github.com/keyshard/keyshard/internal/kitseam"
	"github.com/keyshard/keyshard/internal/server"
	"github.com/keyshard/keyshard/keyshardtest"
)

// ClientsOptions selects what Clients measures.
type ClientsOptions struct {
	// Langs are the client languages to measure, in this order. Default
	// chaos.Langs (go, python, node).
	Langs []chaos.Lang
	// Runs is how many times each language is measured; the report gives
	// the median of the runs' percentiles. Default 3.
	Runs int
	// Cycles is how many times the third worker joins and leaves in a
	// run. Default 5, or 2 with Quick.
	Cycles int
	// Quick is a smoke test: fewer cycles. Its figures are noisier.
	Quick bool
	// Workers starts the worker processes: it needs the keyshard binary
	// for Go workers and the repository root for Python and Node workers.
	Workers chaos.Workers
	// Logs, if set, receives the worker processes' output, each line
	// prefixed with the worker's id.
	Logs io.Writer
	// Logger receives the server's and etcd's logs. Default: discard.
	Logger *slog.Logger
}

// ClientsReport is the output of `keyshard bench clients --json`: the
// latency of a graceful handoff between two worker processes of the same
// client language, for each language, measured at the fenced sink.
type ClientsReport struct {
	// Langs are the languages measured, in order; PerLang holds their
	// figures by language.
	Langs   []string                 `json:"langs"`
	PerLang map[string]*LangHandoffs `json:"per_lang"`
	// Each run of a language is a keyspace of Buckets buckets with a
	// lease of LeaseTTLS seconds, held by two workers while a third joins
	// and leaves gracefully Cycles times; every worker writes to the sink
	// for each bucket it holds every WriteIntervalMs.
	Buckets         int     `json:"buckets"`
	LeaseTTLS       float64 `json:"lease_ttl_s"`
	Cycles          int     `json:"cycles"`
	WriteIntervalMs float64 `json:"write_interval_ms"`
	Runs            int     `json:"runs"`
	Quick           bool    `json:"quick,omitempty"`
	DurationS       float64 `json:"duration_s"`
}

// LangHandoffs is one language's graceful handoffs. A handoff is timed at
// the sink, on its own clock, from the old owner's release record (sent
// when its Release handler is done, before the library tells the server)
// to the new owner's acquire record of the bucket's next token (sent from
// its Acquire handler): the client library's release call, the server's
// release record and grant, the grant's delivery to the new owner and
// its Acquire.
type LangHandoffs struct {
	// Handoffs counts the graceful handoffs timed, over all runs.
	Handoffs int `json:"handoffs"`
	// The median over runs of each run's 50th and 99th percentile and
	// maximum, in ms.
	HandoffP50Ms float64 `json:"handoff_p50_ms"`
	HandoffP99Ms float64 `json:"handoff_p99_ms"`
	HandoffMaxMs float64 `json:"handoff_max_ms"`
	// HandoffP99RunsMs is each run's 99th percentile.
	HandoffP99RunsMs []float64 `json:"handoff_p99_runs_ms"`
	// P99RatioVsGo is HandoffP99Ms over Go's (absent if Go was not
	// measured).
	P99RatioVsGo *float64 `json:"p99_ratio_vs_go,omitempty"`
	// The same handoffs timed on the machine's monotonic clock, which
	// every worker stamps its records with (chaos.Record.Mono): from the
	// moment the old owner's Release handler returned (Record.Released)
	// to the moment the new owner's Acquire handler was
	// called. This is the client library's and the server's part, without
	// the handlers' own reports to the sink (HTTP calls from the worker's
	// language, tens at once in a handoff of many buckets), though not
	// without the CPU those take beside the library.
	LibraryP50Ms        float64   `json:"library_handoff_p50_ms"`
	LibraryP99Ms        float64   `json:"library_handoff_p99_ms"`
	LibraryMaxMs        float64   `json:"library_handoff_max_ms"`
	LibraryP99RunsMs    []float64 `json:"library_handoff_p99_runs_ms"`
	LibraryP99RatioVsGo *float64  `json:"library_p99_ratio_vs_go,omitempty"`
	// JoinMs and LeaveMs are the medians of the time from starting the
	// third worker (sending it SIGTERM) until every bucket was held by
	// its owner under the new map, as the sink saw it.
	JoinMs  float64 `json:"join_ms"`
	LeaveMs float64 `json:"leave_ms"`
	// FencedReleases counts grants that ended fenced, not handed over:
	// none should, as nothing fails.
	FencedReleases int `json:"fenced_releases"`
	// Violations counts what chaos.Check found in the runs' records (the
	// first ones are in ViolationExamples): a correct client has none.
	Violations        int      `json:"violations"`
	ViolationExamples []string `json:"violation_examples,omitempty"`
}

const (
	clientsBuckets       = 64
	clientsLeaseTTL      = 10 * time.Second
	clientsDrainTimeout  = 10 * time.Second
	clientsWriteInterval = 200 * time.Millisecond
	// clientsSettle bounds the wait for one join or leave to be done; an
	// interpreter's start is part of a join.
	clientsSettle = 60 * time.Second
	// clientsExit bounds a worker's graceful exit after SIGTERM.
	clientsExit = 45 * time.Second
)

// Clients measures graceful handoffs between worker processes of each
// client language: one Keyshard server (embedded, on loopback) and, for
// each language and run, a fenced sink and a keyspace of 64 buckets held
// by two workers of that language, while a third joins and leaves
// gracefully. It writes progress lines to progress and returns an error
// naming what is missing (an interpreter, a worker script) before it
// starts anything.
func Clients(ctx context.Context, opts ClientsOptions, progress io.Writer) (ClientsReport, error) {
	if len(opts.Langs) == 0 {
		opts.Langs = chaos.Langs
	}
	if opts.Runs <= 0 {
		opts.Runs = 3
	}
	if opts.Cycles <= 0 {
		opts.Cycles = 5
		if opts.Quick {
			opts.Cycles = 2
		}
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rep := ClientsReport{PerLang: map[string]*LangHandoffs{}, Buckets: clientsBuckets, LeaseTTLS: clientsLeaseTTL.Seconds(), Cycles: opts.Cycles,
		WriteIntervalMs: float64(clientsWriteInterval.Milliseconds()), Runs: opts.Runs, Quick: opts.Quick}
	var missing []string
	for _, l := range opts.Langs {
		rep.Langs = append(rep.Langs, string(l))
		if err := opts.Workers.Check(l); err != nil {
			missing = append(missing, err.Error())
		}
	}
	if len(missing) > 0 {
		return rep, fmt.Errorf("bench clients cannot start its workers:\n  %s", strings.Join(missing, "\n  "))
	}
	say := func(format string, args ...any) { fmt.Fprintf(progress, "clients: "+format+"\n", args...) }

	began := time.Now()
	srv, err := keyshardtest.Start(ctx, keyshardtest.Options{
		Logger:   log,
		Internal: &kitseam.Options{Config: func(c *server.Config) { c.Replica = "bench" }},
	})
	if err != nil {
		return rep, fmt.Errorf("start the embedded server: %w", err)
	}
	defer func() {
		if err := srv.Close(); err != nil {
			log.Warn("bench: server stopped with an error", "err", err)
		}
	}()
	cl, err := client.Dial(srv.URL(), client.Logger(log))
	if err != nil {
		return rep, err
	}
	defer cl.Close()
	say("embedded server %s up in %v; %s: %d buckets, lease TTL %v, a third worker joins and leaves %d times, %d runs",
		srv.URL(), time.Since(began).Round(time.Millisecond), strings.Join(rep.Langs, ", "), clientsBuckets, clientsLeaseTTL, opts.Cycles, opts.Runs)

	type runResult struct {
		times         []time.Duration
		lib           []time.Duration // on the workers' clock
		joins, leaves []time.Duration
		fenced        int
		violations    []chaos.Violation
		p50, p99, max float64
	}
	results := map[chaos.Lang][]runResult{}
	// Languages take turns within each run, so that a slow spell of the
	// machine does not fall on one language only.
	for run := 1; run <= opts.Runs; run++ {
		for _, l := range opts.Langs {
			cr := &clientsRun{opts: opts, lang: l, run: run, cl: cl, url: srv.URL(), log: log,
				say: func(format string, args ...any) {
					say("%s run %d/%d: %s", l, run, opts.Runs, fmt.Sprintf(format, args...))
				}}
			hs, err := cr.measure(ctx)
			if err != nil {
				return rep, fmt.Errorf("%s workers, run %d: %w", l, run, err)
			}
			var times, lib []time.Duration
			for _, h := range hs {
				times = append(times, h.Took())
				if d, ok := h.InWorkers(); ok {
					lib = append(lib, d)
				}
			}
			r := runResult{times: times, lib: lib, joins: cr.joins, leaves: cr.leaves, fenced: cr.fenced, violations: cr.violations,
				p50: percentileMs(times, 50), p99: percentileMs(times, 99), max: percentileMs(times, 100)}
			results[l] = append(results[l], r)
			cr.say("%d handoffs: p50 %.1f ms, p99 %.1f ms, max %.1f ms at the sink; release handler → acquire handler: p50 %.1f ms, p99 %.1f ms; %d violations",
				len(times), r.p50, r.p99, r.max, percentileMs(lib, 50), percentileMs(lib, 99), len(cr.violations))
			for i, v := range cr.violations {
				if i == 5 {
					cr.say("... and %d more violations", len(cr.violations)-i)
					break
				}
				cr.say("violation: %s", v.Msg)
			}
		}
	}
	for _, l := range opts.Langs {
		lh := &LangHandoffs{}
		var p50s, p99s, maxs, lp50s, lp99s, lmaxs []float64
		var joins, leaves []time.Duration
		for _, r := range results[l] {
			lh.Handoffs += len(r.times)
			p50s, p99s, maxs = append(p50s, r.p50), append(p99s, r.p99), append(maxs, r.max)
			if len(r.lib) > 0 {
				lp50s, lp99s, lmaxs = append(lp50s, percentileMs(r.lib, 50)), append(lp99s, percentileMs(r.lib, 99)), append(lmaxs, percentileMs(r.lib, 100))
			}
			joins, leaves = append(joins, r.joins...), append(leaves, r.leaves...)
			lh.FencedReleases += r.fenced
			lh.Violations += len(r.violations)
			for _, v := range r.violations {
				if len(lh.ViolationExamples) < 10 {
					lh.ViolationExamples = append(lh.ViolationExamples, v.Msg)
				}
			}
		}
		lh.HandoffP50Ms, lh.HandoffP99Ms, lh.HandoffMaxMs = medianOf(p50s), medianOf(p99s), medianOf(maxs)
		lh.HandoffP99RunsMs = p99s
		if len(lp50s) > 0 {
			lh.LibraryP50Ms, lh.LibraryP99Ms, lh.LibraryMaxMs = medianOf(lp50s), medianOf(lp99s), medianOf(lmaxs)
			lh.LibraryP99RunsMs = lp99s
		}
		lh.JoinMs, lh.LeaveMs = percentileMs(joins, 50), percentileMs(leaves, 50)
		rep.PerLang[string(l)] = lh
	}
	if g := rep.PerLang[string(chaos.LangGo)]; g != nil && g.HandoffP99Ms > 0 {
		for _, lh := range rep.PerLang {
			ratio := lh.HandoffP99Ms / g.HandoffP99Ms
			lh.P99RatioVsGo = &ratio
			if g.LibraryP99Ms > 0 && lh.LibraryP99Ms > 0 {
				lr := lh.LibraryP99Ms / g.LibraryP99Ms
				lh.LibraryP99RatioVsGo = &lr
			}
		}
	}
	for _, l := range rep.Langs {
		lh := rep.PerLang[l]
		ratio := ""
		if lh.P99RatioVsGo != nil {
			ratio = fmt.Sprintf(", p99 %.2f× Go's", *lh.P99RatioVsGo)
		}
		if lh.LibraryP99RatioVsGo != nil {
			ratio += fmt.Sprintf("; release handler → acquire handler p50 %.1f ms, p99 %.1f ms, %.2f× Go's", lh.LibraryP50Ms, lh.LibraryP99Ms, *lh.LibraryP99RatioVsGo)
		}
		say("%s: %d handoffs over %d runs: p50 %.1f ms, p99 %.1f ms, max %.1f ms at the sink (medians of the runs)%s", l, lh.Handoffs, opts.Runs, lh.HandoffP50Ms, lh.HandoffP99Ms, lh.HandoffMaxMs, ratio)
	}
	rep.DurationS = time.Since(began).Seconds()
	return rep, nil
}

// Handoff is one graceful handoff of a bucket as the sink recorded it:
// From released the grant at token FromToken (its release record at
// Released), To acquired the bucket's next grant at token ToToken (its
// acquire record at Acquired).
type Handoff struct {
	Bucket             int
	From, To           string
	FromToken, ToToken uint64
	Released, Acquired time.Time
	// MonoReleased is when the old owner's Release handler returned and
	// its client library took over (Record.Released, carried on a later
	// record; else its release record's Mono), MonoAcquired when the new
	// owner's Acquire handler was called (its acquire record's Mono):
	// both on the machine's monotonic clock, 0 if unknown.
	MonoReleased, MonoAcquired int64
}

// Took is the time from the release record to the acquire record, on the
// sink's clock.
func (h Handoff) Took() time.Duration { return h.Acquired.Sub(h.Released) }

// InWorkers is the time from the old owner's release record to the new
// owner's acquire record on the workers' shared monotonic clock, and
// whether both records have one.
func (h Handoff) InWorkers() (time.Duration, bool) {
	if h.MonoReleased == 0 || h.MonoAcquired == 0 {
		return 0, false
	}
	return time.Duration(h.MonoAcquired - h.MonoReleased), true
}

// PairHandoffs finds the graceful handoffs in a sink's record (in arrival
// order): a release record of a bucket's newest grant, not fenced and
// without error, followed by the first acquire of the bucket at a higher
// token, whose claim the sink accepted. A grant superseded before its
// release (its holder was stopped or killed) and a fenced release start
// no handoff; only releases after record from count.
func PairHandoffs(recs []chaos.Record, from int) []Handoff {
	type grantOf struct {
		worker string
		bt     chaos.BucketToken
	}
	released := map[grantOf]int64{} // when each grant's Release handler returned (carried on a later record)
	for _, r := range recs {
		for _, x := range r.Released {
			released[grantOf{r.Worker, chaos.BucketToken{Bucket: x.Bucket, Token: x.Token}}] = x.Mono
		}
	}
	newest := map[int]uint64{}         // bucket → token of its newest acquire
	pending := map[int]*chaos.Record{} // bucket → the release of its newest grant, until the next acquire
	var out []Handoff
	for i := range recs {
		r := &recs[i]
		switch r.Kind {
		case chaos.KindAcquire:
			if r.Refused || r.Token <= newest[r.Bucket] {
				continue
			}
			newest[r.Bucket] = r.Token
			if p := pending[r.Bucket]; p != nil {
				h := Handoff{Bucket: r.Bucket, From: p.Worker, To: r.Worker, FromToken: p.Token, ToToken: r.Token, Released: p.At, Acquired: r.At, MonoReleased: p.Mono, MonoAcquired: r.Mono}
				if m, ok := released[grantOf{p.Worker, chaos.BucketToken{Bucket: r.Bucket, Token: p.Token}}]; ok {
					h.MonoReleased = m
				}
				out = append(out, h)
			}
			delete(pending, r.Bucket)
		case chaos.KindRelease:
			if r.Seq > from && !r.Fenced && r.Err == "" && r.Token == newest[r.Bucket] && r.Token != 0 {
				pending[r.Bucket] = r
			}
		}
	}
	return out
}

// clientsRun is one run of one language: its sink, keyspace, router and
// worker processes.
type clientsRun struct {
	opts ClientsOptions
	lang chaos.Lang
	run  int
	cl   *client.Client
	url  string
	log  *slog.Logger
	say  func(format string, args ...any)

	ks    string
	sink  *chaos.Sink
	rt    *client.Router
	procs map[string]*chaos.Proc // live workers by id

	joins, leaves []time.Duration
	fenced        int
	violations    []chaos.Violation
}

// measure runs the two workers, the join and leave cycles, and returns
// the graceful handoffs of the cycles. Every process is gone when it
// returns.
func (r *clientsRun) measure(ctx context.Context) (_ []Handoff, err error) {
	r.ks = fmt.Sprintf("bench-clients-%s-%d", r.lang, r.run)
	r.procs = map[string]*chaos.Proc{}
	if r.sink, err = chaos.NewSink("127.0.0.1:0"); err != nil {
		return nil, err
	}
	defer r.sink.Close()
	defer r.stopAll()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := r.cl.Admin().CreateKeyspace(cctx, client.KeyspaceConfig{Name: r.ks, Buckets: clientsBuckets, LeaseTTL: clientsLeaseTTL, DrainTimeout: clientsDrainTimeout}); err != nil {
		return nil, fmt.Errorf("create keyspace %q: %w", r.ks, err)
	}
	if r.rt, err = client.NewRouter(r.cl, r.ks, client.Logger(r.log)); err != nil {
		return nil, err
	}
	if err := r.rt.Start(cctx); err != nil { // closes the router
		return nil, fmt.Errorf("router of %q: %w", r.ks, err)
	}
	defer r.rt.Close()

	a, b := fmt.Sprintf("%s-a", r.lang), fmt.Sprintf("%s-b", r.lang)
	began := time.Now()
	for _, id := range []string{a, b} {
		if err := r.start(id); err != nil {
			return nil, err
		}
	}
	if _, err := r.settle(ctx, began, a, b); err != nil {
		return nil, err
	}
	r.say("%s and %s hold the %d buckets (%v)", a, b, clientsBuckets, time.Since(began).Round(time.Millisecond))
	from := r.sink.Seq()
	for i := 1; i <= r.opts.Cycles; i++ {
		c := fmt.Sprintf("%s-c%d", r.lang, i)
		began := time.Now()
		if err := r.start(c); err != nil {
			return nil, err
		}
		joined, err := r.settle(ctx, began, a, b, c)
		if err != nil {
			return nil, fmt.Errorf("%s joining: %w", c, err)
		}
		began = time.Now()
		if err := r.leave(ctx, c); err != nil {
			return nil, err
		}
		left, err := r.settle(ctx, began, a, b)
		if err != nil {
			return nil, fmt.Errorf("%s leaving: %w", c, err)
		}
		r.joins, r.leaves = append(r.joins, joined), append(r.leaves, left)
		r.say("cycle %d/%d: %s joined in %v and left in %v", i, r.opts.Cycles, c, joined.Round(time.Millisecond), left.Round(time.Millisecond))
	}
	// The handoffs of the cycles; the two workers' own leaves are not
	// measured.
	hs := PairHandoffs(r.sink.Records(), from)
	for _, id := range []string{a, b} {
		if err := r.leave(ctx, id); err != nil {
			return nil, err
		}
	}
	recs := r.sink.Records()
	r.violations = chaos.Check(recs)
	for _, rec := range recs {
		if rec.Kind == chaos.KindRelease && rec.Fenced {
			r.fenced++
		}
	}
	if len(hs) == 0 {
		return nil, errors.New("no graceful handoff was recorded")
	}
	return hs, nil
}

// start starts a worker of the run's language with member id id.
func (r *clientsRun) start(id string) error {
	args := chaos.WorkerArgs(r.url, r.sink.URL(), r.ks, id,
		"--interval", clientsWriteInterval.String(), "--drain-timeout", (clientsExit - 5*time.Second).String())
	p, err := r.opts.Workers.Start(id, r.opts.Logs, r.lang, args...)
	if err != nil {
		return err
	}
	r.procs[id] = p
	return nil
}

// leave sends SIGTERM to worker id and waits until it has exited (after
// its graceful leave) with status 0.
func (r *clientsRun) leave(ctx context.Context, id string) error {
	p := r.procs[id]
	delete(r.procs, id)
	defer p.Kill()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("%s: %w; its output ends:\n%s", id, err, chaos.Tail(p.Output(), 4<<10))
	}
	wctx, cancel := context.WithTimeout(ctx, clientsExit)
	defer cancel()
	if err := p.Wait(wctx); err != nil {
		return fmt.Errorf("%s worker %s after SIGTERM: %v (want exit status 0 once drained); its output ends:\n%s", r.lang, id, err, chaos.Tail(p.Output(), 4<<10))
	}
	return nil
}

// stopAll ends every worker still running: SIGTERM, then SIGKILL if it
// has not exited within clientsExit.
func (r *clientsRun) stopAll() {
	for _, id := range slices.Sorted(maps.Keys(r.procs)) {
		p := r.procs[id]
		_ = p.Signal(syscall.SIGTERM)
		ctx, cancel := context.WithTimeout(context.Background(), clientsExit)
		_ = p.Wait(ctx)
		cancel()
		p.Kill()
	}
	r.procs = map[string]*chaos.Proc{}
}

// settle waits until the router's map assigns the buckets to exactly the
// workers want and the sink shows every bucket held by its owner (its
// newest grant acquired, not released), and returns how long after began
// the last of those acquires was recorded. A worker that exits meanwhile
// is an error.
func (r *clientsRun) settle(ctx context.Context, began time.Time, want ...string) (time.Duration, error) {
	wctx, cancel := context.WithTimeout(ctx, clientsSettle)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		for id, p := range r.procs {
			if p.Exited() {
				err := p.Wait(wctx)
				return 0, fmt.Errorf("%s worker %s exited (%v); its output ends:\n%s", r.lang, id, err, chaos.Tail(p.Output(), 4<<10))
			}
		}
		var why string
		var last time.Time
		r.sink.View(func(h *chaos.History) { why, last = settled(h, r.rt, want) })
		if why == "" {
			return max(last.Sub(began), 0), nil
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			return 0, fmt.Errorf("keyspace %q not settled after %v: %s", r.ks, clientsSettle, why)
		case <-tick.C:
		}
	}
}

// settled returns "" and the newest acquire of the current grants if the
// router's map assigns the buckets to exactly want and each bucket's
// newest grant in h is its owner's, not released; otherwise what
// differs.
func settled(h *chaos.History, rt *client.Router, want []string) (string, time.Time) {
	owners := map[string]bool{}
	var last time.Time
	for b := range clientsBuckets {
		o, ok := rt.BucketOwner(b)
		if !ok {
			return fmt.Sprintf("map epoch %d: bucket %d has no owner", rt.Epoch(), b), last
		}
		owners[o] = true
		g := h.Cur[b]
		switch {
		case g == nil:
			return fmt.Sprintf("bucket %d (owner %s) never acquired", b, o), last
		case g.Worker != o || g.Released != 0:
			return fmt.Sprintf("map epoch %d: bucket %d owned by %s, newest grant %s@%d (released: %v)", rt.Epoch(), b, o, g.Worker, g.Token, g.Released != 0), last
		}
		if at := h.Recs[g.Acquired-1].At; at.After(last) {
			last = at
		}
	}
	if len(owners) != len(want) || !allIn(want, owners) {
		return fmt.Sprintf("map epoch %d assigns buckets to %v, want %v", rt.Epoch(), slices.Sorted(maps.Keys(owners)), want), last
	}
	return "", last
}

func allIn(ws []string, set map[string]bool) bool {
	for _, w := range ws {
		if !set[w] {
			return false
		}
	}
	return true
}
