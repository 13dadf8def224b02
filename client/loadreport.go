package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/clock"
)

// DefaultReportInterval is the default time between two load reports.
const DefaultReportInterval = 5 * time.Second

// LoadReporter counts requests per tenant where they enter (Add) and
// reports the counts to the control plane every interval
// (TenantPoolService.ReportLoad), which sizes each tenant's subset from
// them. Count each request once across the pool: where it enters, not at
// every member that serves it.
//
// Reports are numbered from 1 up and sent one at a time; a report carries
// at most MaxPoolBatch counts, more make several reports. A report that
// fails is retried, at the next interval, with the same number and the
// same counts, so that one whose answer was lost is recognized by the
// leader and not counted twice; counts added meanwhile go into the next
// report. A report the control plane refuses as invalid or too old, and
// the counts still unsent when Close cannot reach it, are dropped: they
// are counted (Stats), logged and reported (a PoolReportDropped event),
// never lost silently.
//
// Add is safe for concurrent use and cheap: it takes one of several
// locks, picked at random, so that goroutines adding at once rarely wait
// for each other.
type LoadReporter struct {
	c        *Client
	pool, id string
	clock    clock.Clock
	log      *slog.Logger
	ev       *emitter
	interval time.Duration

	shards []loadShard
	closed atomic.Bool

	loopCtx context.Context // ends at Close (or the Client's)
	cancel  context.CancelFunc
	done    chan struct{}
	once    sync.Once

	flushMu sync.Mutex // one report at a time
	seq     uint64     // the last seq given to a report; under flushMu
	taken   time.Time  // when counts were last taken into reports (or the reporter began); under flushMu
	pending []*loadReport

	mu    sync.Mutex
	stats LoadReporterStats
}

type loadShard struct {
	mu sync.Mutex
	m  map[string]int64
	_  [48]byte // keep shards on their own cache lines
}

// loadReport is a report given its seq, sent or waiting to be.
type loadReport struct {
	seq    uint64
	time   time.Time
	period time.Duration // the time its counts were counted over
	counts []*keyshardv1.TenantCount
	total  int64
}

// LoadReporterStats are a LoadReporter's counters.
type LoadReporterStats struct {
	// Reports counts the reports the control plane accepted (counted, or
	// recognized as a replay of one it counted: Replayed).
	Reports, Replayed uint64
	// Failures counts the calls that failed and are retried.
	Failures uint64
	// DroppedReports counts the reports given up, and DroppedCounts the
	// sum of their counts: requests the control plane did not count.
	DroppedReports uint64
	DroppedCounts  int64
	// Pending counts the reports waiting to be sent again.
	Pending int
	// Seq is the number of the newest report.
	Seq uint64
	// LastErr is the newest failure, nil if the newest call succeeded.
	LastErr error
}

// NewLoadReporter returns a LoadReporter for tenant pool pool, as
// reporter reporterID (1-128 characters of [A-Za-z0-9._:@-], unique among
// the pool's reporters; a restarted process should use a new one, or its
// first reports may be taken for replays), and starts its goroutine; stop
// it with Close. It takes the options Clock, Logger, OnPoolEvent and
// ReportInterval. It does no IO itself and returns an *ArgError for a bad
// pool name, reporter id or interval.
func (c *Client) NewLoadReporter(pool, reporterID string, opts ...PoolOption) (*LoadReporter, error) {
	const fn = "Client.NewLoadReporter"
	if err := validName(fn, "pool name", pool); err != nil {
		return nil, err
	}
	if err := validName(fn, "reporter id", reporterID); err != nil {
		return nil, err
	}
	o := newPoolOptions(c, opts)
	switch {
	case o.interval < 0:
		return nil, argError(fn, "ReportInterval", "%v is negative (0 means the default, %v)", o.interval, DefaultReportInterval)
	case o.interval == 0:
		o.interval = DefaultReportInterval
	}
	if c.closed() {
		return nil, ErrClosed
	}
	n := 1
	for n < 4*runtime.GOMAXPROCS(0) {
		n <<= 1
	}
	r := &LoadReporter{
		c: c, pool: pool, id: reporterID, clock: o.clock, interval: o.interval,
		log: o.log.With("tenant_pool", pool, "reporter", reporterID), ev: &emitter{f: o.onEvent},
		shards: make([]loadShard, n),
		done:   make(chan struct{}),
		taken:  o.clock.Now(),
	}
	for i := range r.shards {
		r.shards[i].m = map[string]int64{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(c.ctx, cancel)
	r.loopCtx, r.cancel = ctx, func() { stop(); cancel() }
	go func() {
		defer close(r.done)
		r.loop(ctx)
	}()
	return r, nil
}

// Add counts n requests of tenant. It returns an *ArgError for an empty or
// too long tenant or a negative n, and ErrClosed after Close; n == 0 is a
// no-op.
func (r *LoadReporter) Add(tenant string, n int64) error {
	switch {
	case tenant == "" || len(tenant) > MaxTenantLen:
		return validTenant("LoadReporter.Add", "tenant", tenant)
	case n < 0:
		return argError("LoadReporter.Add", "n", "%d is negative", n)
	case n == 0:
		return nil
	}
	sh := &r.shards[rand.Uint32()&uint32(len(r.shards)-1)]
	sh.mu.Lock()
	if r.closed.Load() { // checked under the lock: Close swaps every shard after setting it
		sh.mu.Unlock()
		return ErrClosed
	}
	sh.m[tenant] += n
	sh.mu.Unlock()
	return nil
}

// Stats returns the reporter's counters.
func (r *LoadReporter) Stats() LoadReporterStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// Close stops the reporter: it sends the counts not reported yet (the
// reports pending first), each call bounded by the larger of the interval
// and 10s, and returns nil, or an error saying how many counts were
// dropped because the control plane could not be reached. Later Adds
// return ErrClosed. Close is idempotent (later calls return nil).
func (r *LoadReporter) Close() error {
	var err error
	r.once.Do(func() {
		r.closed.Store(true)
		r.cancel()
		<-r.done
		ctx := context.Background()
		if r.c.closed() {
			err = r.dropAll(ErrClosed)
			return
		}
		if ferr := r.flush(ctx, nil); ferr != nil {
			err = r.dropAll(ferr)
		}
	})
	return err
}

// Flush sends now the counts added so far, after the reports pending,
// one report at a time with the numbering and retry rules of the
// interval's reports, and returns once the control plane has answered
// every one: nil if it took them all (counted, or recognized as
// replays). A call that fails with an error that may pass is retried with
// the same seq and counts, after a backoff on the reporter's clock, until
// ctx ends; then Flush returns ctx's error (with the last failure) and
// the reports not answered stay pending, sent again at the next
// interval, Flush or Close. A failure retrying cannot fix (ErrNotFound,
// ErrUnauthenticated, ErrPermissionDenied) is returned at once, the
// report kept pending. A report the control plane refuses as
// invalid or too old is dropped as at any interval, and Flush returns an
// error saying how many requests were dropped (wrapping ErrInvalid for an
// invalid one). Counts added while Flush runs may go in its reports too.
// Flush returns ErrClosed once Close (or the Client's Close) has begun;
// Close sends what is left.
func (r *LoadReporter) Flush(ctx context.Context) error {
	if r.closed.Load() || r.c.closed() {
		return ErrClosed
	}
	// Close cancels the loop's context: stop too, leaving it the rest.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(r.loopCtx, cancel)
	defer stop()
	var (
		b       backoff
		dropped []error
	)
	for {
		err := r.flush(ctx, &dropped)
		switch {
		case err == nil:
			return errors.Join(dropped...)
		case r.closed.Load() || r.c.closed():
			return ErrClosed
		case ctx.Err() != nil:
			return fmt.Errorf("load reporter %q of tenant pool %q: flush: %w (last attempt: %w)", r.id, r.pool, ctx.Err(), err)
		case permanent(err, false):
			// Retrying will not help (the pool is gone, the token refused):
			// the report stays pending, as at an interval.
			return fmt.Errorf("load reporter %q of tenant pool %q: flush: %w", r.id, r.pool, err)
		}
		if !clock.Sleep(ctx, r.clock, b.next()) {
			if r.closed.Load() || r.c.closed() {
				return ErrClosed
			}
			return fmt.Errorf("load reporter %q of tenant pool %q: flush: %w (last attempt: %w)", r.id, r.pool, ctx.Err(), err)
		}
	}
}

// dropAll gives up the reports pending and the counts not taken yet,
// after the final flush failed with cause.
func (r *LoadReporter) dropAll(cause error) error {
	r.flushMu.Lock()
	defer r.flushMu.Unlock()
	r.take()
	var total int64
	for _, rep := range r.pending {
		r.drop(rep, cause, nil)
		total += rep.total
	}
	r.pending = nil
	r.setPending()
	if total == 0 {
		return nil
	}
	return fmt.Errorf("load reporter %q of tenant pool %q closed: %d requests not reported: %w", r.id, r.pool, total, cause)
}

func (r *LoadReporter) loop(ctx context.Context) {
	for {
		if !clock.Sleep(ctx, r.clock, r.interval) {
			return
		}
		_ = r.flush(ctx, nil)
	}
}

// flush sends the reports pending, in order, then, if all went through,
// the counts added since as new reports. It stops at the first failure,
// which it returns (that report and those after it stay pending). The
// errors of the reports it drops are appended to dropped, if not nil.
func (r *LoadReporter) flush(ctx context.Context, dropped *[]error) error {
	r.flushMu.Lock()
	defer r.flushMu.Unlock()
	defer r.setPending()
	if err := r.sendPending(ctx, dropped); err != nil {
		return err
	}
	r.take()
	return r.sendPending(ctx, dropped)
}

// take moves the counts added so far into new reports. flushMu is held.
func (r *LoadReporter) take() {
	var acc map[string]int64
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		m := sh.m
		if len(m) == 0 {
			sh.mu.Unlock()
			continue
		}
		sh.m = make(map[string]int64, len(m))
		sh.mu.Unlock()
		if acc == nil {
			acc = m
			continue
		}
		for t, n := range m {
			acc[t] += n
		}
	}
	now := r.clock.Now()
	period := now.Sub(r.taken)
	r.taken = now
	if len(acc) == 0 {
		return
	}
	var cur *loadReport
	for t, n := range acc {
		if cur == nil || len(cur.counts) == MaxPoolBatch {
			r.seq++
			cur = &loadReport{seq: r.seq, time: now, period: period, counts: make([]*keyshardv1.TenantCount, 0, min(len(acc), MaxPoolBatch))}
			r.pending = append(r.pending, cur)
		}
		cur.counts = append(cur.counts, &keyshardv1.TenantCount{Tenant: t, Count: n})
		cur.total += n
	}
}

// sendPending sends the pending reports one at a time. flushMu is held.
func (r *LoadReporter) sendPending(ctx context.Context, dropped *[]error) error {
	for len(r.pending) > 0 {
		rep := r.pending[0]
		req := &keyshardv1.ReportLoadRequest{Pool: r.pool, Reporter: r.id, Seq: rep.seq, Time: timestamppb.New(rep.time), Period: durationpb.New(rep.period), Counts: rep.counts}
		resp, err := callWithin(ctx, r.c, poolAPI.ReportLoad, req, budget{within: max(r.interval, reportTimeout)})
		if err != nil && ctx.Err() != nil {
			return err // stopping: Close sends it again
		}
		retry := false
		switch {
		case err == nil && resp.GetOutcome() == keyshardv1.ReportOutcome_REPORT_OUTCOME_STALE:
			r.drop(rep, fmt.Errorf("report %d is older than the pool's window", rep.seq), dropped)
		case err == nil:
			r.mu.Lock()
			r.stats.Reports++
			if resp.GetOutcome() == keyshardv1.ReportOutcome_REPORT_OUTCOME_REPLAYED {
				r.stats.Replayed++
			}
			r.stats.LastErr = nil
			r.mu.Unlock()
		case errors.Is(err, ErrInvalid):
			r.drop(rep, err, dropped)
		default:
			retry = true
			r.mu.Lock()
			r.stats.Failures++
			r.stats.LastErr = err
			r.mu.Unlock()
			r.log.Warn("keyshard: load report failed; retrying it at the next interval", "seq", rep.seq, "err", err)
		}
		if !retry {
			r.pending = r.pending[1:]
		}
		r.setPending()
		r.ev.emit(PoolEvent{Kind: PoolReported, Pool: r.pool, Seq: rep.seq, Err: err})
		if retry {
			return err
		}
	}
	return nil
}

// drop gives up rep, counting and reporting it, and appends the error to
// dropped if not nil.
func (r *LoadReporter) drop(rep *loadReport, cause error, dropped *[]error) {
	r.mu.Lock()
	r.stats.DroppedReports++
	r.stats.DroppedCounts += rep.total
	r.stats.LastErr = cause
	r.mu.Unlock()
	err := fmt.Errorf("load report %d of tenant pool %q dropped, %d requests not counted: %w", rep.seq, r.pool, rep.total, cause)
	r.log.Error("keyshard: load report dropped", "seq", rep.seq, "dropped", rep.total, "err", cause)
	r.ev.emit(PoolEvent{Kind: PoolReportDropped, Pool: r.pool, Err: err, Dropped: rep.total, Seq: rep.seq})
	if dropped != nil {
		*dropped = append(*dropped, err)
	}
}

func (r *LoadReporter) setPending() {
	r.mu.Lock()
	r.stats.Pending, r.stats.Seq = len(r.pending), r.seq
	r.mu.Unlock()
}
