package stream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/clock"
	"github.com/keyshard/keyshard/placement"
)

// DefaultCommitInterval is how often a Worker whose
// WorkerOptions.CommitInterval is 0 commits its progress.
const DefaultCommitInterval = time.Second

// WorkerOptions configure a Worker. The zero value is usable.
type WorkerOptions struct {
	// CommitInterval is how often the worker commits its progress; 0
	// means DefaultCommitInterval. It also commits once when Close
	// begins, and hands each released bucket's final position over with
	// its release.
	CommitInterval time.Duration
	// StartPosition, if not nil, is where the main lane starts reading
	// the stream. nil (the usual choice) starts it at the least From of
	// the grants the worker holds when its first bucket is acquired, so
	// the buckets of its first grants are read from their own positions
	// with no catch-up; buckets gained later with an older From catch
	// up. Buckets whose From is after the main lane skip their records
	// below it either way.
	StartPosition *uint64
	// Wake, if not nil, wakes the work pending for keys of the buckets
	// the worker gains (see WakeOptions).
	Wake *WakeOptions
	// OnCommit, if not nil, is called after every commit the worker makes,
	// with the positions it computed and the answer (nil once applied; see
	// client.Worker.Commit for the errors). The client.Worker adds the
	// final positions of buckets it released and the server may still
	// hold: a client.OnEvent option's EventCommitted has the commit as
	// applied. Calls are serialized, come from the worker's goroutines and
	// must not block.
	OnCommit func(c client.Commit, err error)
	// Worker holds the options of the client.Worker the stream worker
	// runs (client.Replace, client.FenceMargin, client.OnEvent, ...).
	Worker []client.WorkerOption
	// ReadRetry paces the Reads after a transient Read error (one
	// wrapping ErrTransient), which the worker rides out instead of
	// stopping: see Consumer. Each is logged at warn level on the
	// Client's logger and counted in Stats.
	ReadRetry Retry
	// Clock paces the commits, the wakes and the Reads after a transient
	// error; nil means the Client's.
	Clock clock.Clock
}

// WakeOptions are a Worker's wake hook: after gaining buckets it pages
// through candidates with a Waker, from the start of the candidates, and
// calls Wake for those whose key is in the buckets just gained, at most
// Rate a second. Gains that arrive during a pass are woken by the next
// one. Next, Wake and Rate are required (see WakeConfig).
type WakeOptions struct {
	Next func(ctx context.Context, after uint64, limit int) ([]Candidate, error)
	Wake func(ctx context.Context, key []byte) error
	Rate float64
	// Page is WakeConfig.Page; 0 means DefaultWakePage.
	Page int
	// OnError, if not nil, is called with the error that ended a wake
	// pass (a failed Next or Wake); the pass is not retried.
	OnError func(error)
}

// Worker is a stream worker: a client.Worker in a stream keyspace whose
// Handler runs a Consumer, so the user writes only a Reader and a
// function that handles one record. Each bucket granted to it is gained
// at its grant's From (read back or skipped to, then merged into the
// main lane); each bucket asked back is lost and released with its final
// position (the position after the last record handled for it), so a
// graceful move reprocesses nothing; its progress is committed every
// CommitInterval, so a crash reprocesses only what came after the last
// commit. Create it with NewWorker (no IO), run it with Run, stop it with
// Close. Its methods are safe for concurrent use.
//
// handle is called from one goroutine, in stream order for each key,
// with Run's context. A record is counted as processed once handle
// returned nil for it; an error stops the worker (see Run), and so does
// an error of the Reader, unless it wraps ErrTransient: the worker then
// keeps its buckets, waits and reads again (WorkerOptions.ReadRetry),
// counting the retries in Stats. The worker may lose a bucket between
// two records, never during one: each record carries its Bucket and the
// Token the worker holds it at, to pass to storage with the record's
// writes so that a write made after the bucket moved on is refused.
//
// # Commits
//
// A commit sends a default position (the main lane's) that covers every
// bucket held at a token <= MaxToken that its exceptions do not list. It
// is computed in one step, under the lock that gaining and losing a
// bucket take, from the client.Worker's grants (Granted) and the
// Consumer's Progress:
//
//   - MaxToken is the highest token among the session's grants (and never
//     lower than the session's previous commit's); every grant the
//     server holds for the session at a token up to it is among those
//     grants, or was released;
//   - a grant gained into the Consumer at its token and following the
//     main lane is covered by the default; one catching up, or gained
//     ahead of the main lane, is an exception at its own progress;
//   - a grant not gained yet (its Acquire has not run, or not finished)
//     is an exception at its From;
//   - a bucket lost but not yet handed to the client.Worker with its
//     final position is an exception at that final position; once
//     handed, the client.Worker lists it itself until the server has
//     handed the bucket over (see client.FinalPositioner).
//
// So no bucket is ever committed at a position past a record of it that
// was not handled.
type Worker struct {
	w        *client.Worker
	r        Reader
	handle   func(context.Context, Record) error
	opts     WorkerOptions
	retry    Retry
	clk      clock.Clock
	log      *slog.Logger
	interval time.Duration
	// granted and hasherOf are the client.Worker's Granted and Hasher.
	granted  func() (string, []client.Grant)
	hasherOf func() placement.Hasher

	commitMu sync.Mutex // one commit at a time, from computing it to its answer

	mu     sync.Mutex               // guards what follows; held while a bucket is gained or lost and while a commit is computed
	cons   *Consumer                // nil until the first Acquire
	consAt atomic.Pointer[Consumer] // cons, for Stats, which must not wait for mu
	hasher placement.Hasher
	ready  chan struct{}  // closed once cons is set
	gained map[int]uint64 // bucket → token it was gained at

	// tokens is gained's copy for handle: set before a bucket is gained
	// into the Consumer and cleared after it is lost, so every record
	// handed to handle finds its bucket's token. tokMu is taken last,
	// never while taking another lock: handle runs under the Consumer's.
	tokMu    sync.Mutex
	tokens   map[int]uint64
	lost     map[int]client.BucketPosition // lost buckets' final positions, until the client.Worker has them
	last     lastCommit
	wakeq    []int         // gained buckets not woken yet
	wakeKick chan struct{} // cap 1: wakeq is not empty

	lifeMu  sync.Mutex
	started bool
	closed  bool
	done    chan struct{} // closed when Run returns
}

type lastCommit struct {
	session  string
	maxToken uint64
}

// NewWorker returns a stream Worker that will join keyspace (a stream
// keyspace) as member m, read the stream with r and call handle for each
// record of its buckets. It does no IO and starts nothing: call Run. It
// returns a *client.ArgError for a nil Client, Reader or handle, a
// negative CommitInterval, a bad ReadRetry, bad WakeOptions, or whatever
// client.NewWorker refuses (a bad keyspace name, member, or option).
func NewWorker(c *client.Client, keyspace string, m client.Member, r Reader, handle func(context.Context, Record) error, opts WorkerOptions) (*Worker, error) {
	const fn = "stream.NewWorker"
	bad := func(arg, reason string) error { return &client.ArgError{Func: fn, Arg: arg, Reason: reason} }
	switch {
	case c == nil:
		return nil, bad("c", "is nil; create one with client.Dial")
	case r == nil:
		return nil, bad("r", "is nil")
	case handle == nil:
		return nil, bad("handle", "is nil")
	case opts.CommitInterval < 0:
		return nil, bad("WorkerOptions.CommitInterval", fmt.Sprintf("%v is negative", opts.CommitInterval))
	case opts.StartPosition != nil && *opts.StartPosition == none:
		return nil, bad("WorkerOptions.StartPosition", "is math.MaxUint64, which is no position")
	}
	retry, err := opts.ReadRetry.withDefaults(bad, "WorkerOptions.ReadRetry.")
	if err != nil {
		return nil, err
	}
	if o := opts.Wake; o != nil {
		_, err := NewWaker(WakeConfig{Next: o.Next, Keep: func([]byte) bool { return false }, Wake: o.Wake, Rate: o.Rate, Page: o.Page})
		var ae *client.ArgError
		if errors.As(err, &ae) {
			return nil, bad("WorkerOptions.Wake."+ae.Arg[len("WakeConfig."):], ae.Reason)
		}
	}
	sw := &Worker{
		r: r, handle: handle, opts: opts, retry: retry,
		clk:      clock.Or(opts.Clock),
		log:      c.Logger().With("keyspace", keyspace, "member", m.ID),
		interval: opts.CommitInterval,
		ready:    make(chan struct{}),
		gained:   map[int]uint64{},
		tokens:   map[int]uint64{},
		lost:     map[int]client.BucketPosition{},
		wakeKick: make(chan struct{}, 1),
		done:     make(chan struct{}),
	}
	if opts.Clock == nil {
		sw.clk = c.Clock()
	}
	if sw.interval == 0 {
		sw.interval = DefaultCommitInterval
	}
	w, err := client.NewWorker(c, keyspace, m, handler{sw}, opts.Worker...)
	if err != nil {
		return nil, err
	}
	sw.w, sw.granted, sw.hasherOf = w, w.Granted, w.Hasher
	return sw, nil
}

// WorkerStats are a stream Worker's counters.
type WorkerStats struct {
	// ConsumerStats are those of the Consumer the worker runs: the
	// transient Read errors it rode out (zero before the worker acquired
	// its first bucket).
	ConsumerStats
}

// Stats returns the worker's counters. It does not wait for a record
// being handled.
func (sw *Worker) Stats() WorkerStats {
	cons := sw.consAt.Load()
	if cons == nil {
		return WorkerStats{}
	}
	return WorkerStats{ConsumerStats: cons.Stats()}
}

// ClientWorker returns the client.Worker the stream worker runs: for
// Owns, WaitGrant, Held and Granted. Run and Close it only through the
// stream worker.
func (sw *Worker) ClientWorker() *client.Worker { return sw.w }

// Run joins the keyspace and consumes the stream for the buckets granted
// to the worker, committing its progress, until Close, ctx ending, or a
// failure. It returns what client.Worker.Run returns (nil after Close,
// ctx.Err(), a permanent error such as client.ErrNotFound for a keyspace
// that does not exist), or the error of the Reader or of handle that
// stopped the Consumer: the worker then commits, hands every bucket over
// at the position after the last record it handled (a graceful leave),
// and returns that error. A Reader error wrapping ErrTransient stops
// nothing: the worker waits and reads again (WorkerOptions.ReadRetry).
// Run may be called once; after Close it returns client.ErrClosed.
func (sw *Worker) Run(ctx context.Context) error {
	sw.lifeMu.Lock()
	if sw.started {
		sw.lifeMu.Unlock()
		return fmt.Errorf("%w: stream.Worker.Run called twice", client.ErrInvalid)
	}
	sw.started = true
	closed := sw.closed
	sw.lifeMu.Unlock()
	defer close(sw.done)
	if closed {
		return client.ErrClosed
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // runs before wg.Wait
	consumed := make(chan error, 1)
	ran := make(chan error, 1)
	wg.Go(func() { consumed <- sw.consume(ctx) }) // exits when ctx ends or the Consumer fails
	tick := sw.clk.NewTicker(sw.interval)         // before the session: the first commit comes one interval after it
	defer tick.Stop()
	wg.Go(func() { sw.commitLoop(ctx, tick) }) // exits when ctx ends
	if sw.opts.Wake != nil {
		wg.Go(func() { sw.wakeLoop(ctx) }) // exits when ctx ends
	}
	wg.Go(func() { ran <- sw.w.Run(ctx) }) // exits on Close, ctx, or a permanent error
	select {
	case err := <-ran:
		return err
	case err := <-consumed:
		if err == nil || ctx.Err() != nil {
			return <-ran
		}
		sw.log.Error("keyshard: stream consumer failed; handing every bucket over", "err", err)
		sw.Commit(ctx)
		sw.w.Close(ctx)
		<-ran
		return err
	}
}

// consume runs the Consumer once the first bucket is acquired. It
// returns nil when ctx ends, or the error that stopped the Consumer.
func (sw *Worker) consume(ctx context.Context) error {
	select {
	case <-sw.ready:
	case <-ctx.Done():
		return nil
	}
	sw.mu.Lock()
	cons := sw.cons
	sw.mu.Unlock()
	err := cons.Run(ctx)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func (sw *Worker) commitLoop(ctx context.Context, t clock.Ticker) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			sw.Commit(ctx)
		}
	}
}

// Close leaves the keyspace gracefully and stops the worker: it commits
// once, then closes the client.Worker, which releases every bucket with
// its final position as the server asks for them and waits until the
// server ended the session (or ctx ends: it then stops at once), and
// waits until Run returned. It returns what client.Worker.Close returns:
// nil after a complete drain, or an error wrapping ctx.Err(). Close is
// idempotent; Close before Run makes Run return client.ErrClosed.
func (sw *Worker) Close(ctx context.Context) error {
	sw.lifeMu.Lock()
	sw.closed = true
	started := sw.started
	sw.lifeMu.Unlock()
	if !started {
		return sw.w.Close(ctx)
	}
	sw.Commit(ctx)
	err := sw.w.Close(ctx)
	<-sw.done
	return err
}

// Commit commits the worker's progress now, as the commit loop does every
// CommitInterval (see "Commits" in the type's documentation), and returns
// client.Worker.Commit's answer. It does nothing and returns nil before
// the first bucket is acquired.
func (sw *Worker) Commit(ctx context.Context) error {
	sw.commitMu.Lock()
	defer sw.commitMu.Unlock()
	sw.mu.Lock()
	if sw.cons == nil {
		sw.mu.Unlock()
		return nil
	}
	c, ok := sw.commitLocked()
	sw.mu.Unlock()
	var err error
	if !ok {
		err = fmt.Errorf("keyshard: commit: the worker has no live session: %w", client.ErrSessionLost)
	} else {
		err = sw.w.Commit(ctx, c)
	}
	if err != nil && ctx.Err() == nil {
		sw.log.Warn("keyshard: stream commit failed; the next one retries", "err", err)
	}
	if sw.opts.OnCommit != nil {
		sw.opts.OnCommit(c, err)
	}
	return err
}

// commitLocked computes the commit of the worker's progress (see
// "Commits" in the type's documentation); ok is false if the worker has
// no live session.
func (sw *Worker) commitLocked() (c client.Commit, ok bool) {
	session, grants := sw.granted()
	if session == "" {
		return client.Commit{}, false
	}
	def, except := sw.cons.Progress()
	own := make(map[int]uint64, len(except))
	for _, e := range except {
		own[e.Bucket] = e.Position
	}
	c = client.Commit{Session: session, Position: def}
	if sw.last.session == session {
		c.MaxToken = sw.last.maxToken
	}
	held := make(map[int]uint64, len(grants))
	for _, g := range grants {
		held[g.Bucket] = g.Token
		c.MaxToken = max(c.MaxToken, g.Token)
		if l, ok := sw.lost[g.Bucket]; ok && l.Token == g.Token {
			c.Exceptions = append(c.Exceptions, l) // lost; its final position is not with the client.Worker yet
			continue
		}
		if tok, ok := sw.gained[g.Bucket]; ok && tok == g.Token {
			if p, behind := own[g.Bucket]; behind {
				c.Exceptions = append(c.Exceptions, client.BucketPosition{Bucket: g.Bucket, Token: g.Token, Position: p})
			}
			continue // follows the main lane: the default covers it
		}
		// Granted, not gained yet: nothing of it was handled.
		c.Exceptions = append(c.Exceptions, client.BucketPosition{Bucket: g.Bucket, Token: g.Token, Position: g.From})
	}
	// A lost bucket no longer among the grants is with the client.Worker
	// (which took it out of Granted and recorded its final position in
	// one step), or was taken back, or its session ended.
	for b, l := range sw.lost {
		if held[b] != l.Token {
			delete(sw.lost, b)
		}
	}
	slices.SortFunc(c.Exceptions, func(a, b client.BucketPosition) int { return cmp.Compare(a.Bucket, b.Bucket) })
	sw.last = lastCommit{session: session, maxToken: c.MaxToken}
	return c, true
}

// wakeLoop runs a wake pass after buckets were gained.
func (sw *Worker) wakeLoop(ctx context.Context) {
	o := sw.opts.Wake
	for {
		select {
		case <-ctx.Done():
			return
		case <-sw.wakeKick:
		}
		sw.mu.Lock()
		batch, h := sw.wakeq, sw.hasher
		sw.wakeq = nil
		sw.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		wk, err := NewWaker(WakeConfig{Next: o.Next, Keep: KeepBuckets(h, batch...), Wake: o.Wake, Rate: o.Rate, Page: o.Page, Clock: sw.clk})
		if err == nil {
			err = wk.Run(ctx)
		}
		if err != nil && ctx.Err() == nil {
			sw.log.Warn("keyshard: wake pass failed", "buckets", len(batch), "err", err)
			if o.OnError != nil {
				o.OnError(err)
			}
		}
	}
}

// handler is the client.Handler (and client.FinalPositioner) of a
// stream Worker.
type handler struct{ sw *Worker }

// Acquire gains the bucket into the Consumer at the grant's From,
// making the Consumer on the first call.
func (h handler) Acquire(_ context.Context, g client.Grant) error {
	sw := h.sw
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if sw.cons == nil {
		if err := sw.startLocked(g); err != nil {
			return err
		}
	}
	sw.setToken(g.Bucket, g.Token)
	if err := sw.cons.Gain(BucketPosition{Bucket: g.Bucket, Position: g.From}); err != nil {
		sw.setToken(g.Bucket, 0)
		return err
	}
	sw.gained[g.Bucket] = g.Token
	delete(sw.lost, g.Bucket)
	if sw.opts.Wake != nil {
		sw.wakeq = append(sw.wakeq, g.Bucket)
		select {
		case sw.wakeKick <- struct{}{}:
		default:
		}
	}
	return nil
}

// startLocked makes the Consumer, with the main lane at StartPosition or
// at the least From of the session's grants.
func (sw *Worker) startLocked(g client.Grant) error {
	start := g.From
	if p := sw.opts.StartPosition; p != nil {
		start = *p
	} else {
		_, grants := sw.granted()
		for _, x := range grants {
			start = min(start, x.From)
		}
	}
	if start == math.MaxUint64 {
		return fmt.Errorf("stream: bucket %d granted from %d, which is no position", g.Bucket, start)
	}
	hasher := sw.hasherOf()
	flow, err := NewFlow(hasher, start)
	if err != nil {
		return err
	}
	cons, err := NewConsumer(flow, sw.r, func(ctx context.Context, rec Record) error {
		sw.tokMu.Lock()
		rec.Token = sw.tokens[rec.Bucket]
		sw.tokMu.Unlock()
		return sw.handle(ctx, rec)
	}, ConsumerOptions{Retry: sw.retry, Clock: sw.clk, Logger: sw.log})
	if err != nil {
		return err
	}
	sw.cons, sw.hasher = cons, hasher
	sw.consAt.Store(cons)
	close(sw.ready)
	return nil
}

// Release loses the bucket (waiting for the record being handled, if
// any) and keeps its final position for FinalPosition and the commits.
func (h handler) Release(_ context.Context, bucket int) error {
	sw := h.sw
	sw.mu.Lock()
	defer sw.mu.Unlock()
	tok, ok := sw.gained[bucket]
	if !ok {
		return nil // its Acquire failed: nothing was gained
	}
	delete(sw.gained, bucket)
	final, held, err := sw.cons.LoseFinal(bucket)
	if err != nil {
		return err
	}
	sw.setToken(bucket, 0)
	if held {
		sw.lost[bucket] = client.BucketPosition{Bucket: bucket, Token: tok, Position: final}
	}
	return nil
}

// setToken sets (or, with 0, clears) the token handle's records of bucket
// b carry.
func (sw *Worker) setToken(b int, token uint64) {
	sw.tokMu.Lock()
	defer sw.tokMu.Unlock()
	if token == 0 {
		delete(sw.tokens, b)
		return
	}
	sw.tokens[b] = token
}

// FinalPosition returns the final position Release kept.
func (h handler) FinalPosition(bucket int) (uint64, bool) {
	sw := h.sw
	sw.mu.Lock()
	defer sw.mu.Unlock()
	l, ok := sw.lost[bucket]
	return l.Position, ok
}
