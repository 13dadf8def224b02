package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/keyshard/keyshard/client"
)

// WorkerConfig configures RunWorker.
type WorkerConfig struct {
	// Server is the Keyshard URL, Sink the fenced sink's URL, Keyspace
	// the keyspace to join and ID the member id (all required).
	Server, Sink, Keyspace, ID string
	// Interval is the time between two writes of one held bucket.
	Interval time.Duration
	// ReleaseDelay is how long a handoff's Release keeps finishing
	// in-flight work (writing) before it returns.
	ReleaseDelay time.Duration
	// BlockRelease makes a handoff's Release hang, still writing, until
	// the grant's context is cancelled (a stuck handler).
	BlockRelease bool
	// DrainTimeout bounds the graceful leave once ctx ends.
	DrainTimeout time.Duration
	// Replace takes over the member id from a session still alive (a
	// restarted process).
	Replace bool
}

// ErrDrainTimeout is returned by RunWorker when the graceful leave did
// not finish within DrainTimeout.
var ErrDrainTimeout = errors.New("chaos: the worker's drain did not finish in time")

// RunWorker runs a chaos worker: a client.Worker that joins a keyspace,
// reports every grant and release to the fenced sink, and writes to the
// sink for every bucket it holds, passing the grant's fencing token,
// until the bucket is released. A write the sink refuses (a newer owner
// exists) stops the work on that bucket, as an application that sees "0
// rows updated" must. When ctx ends, the worker leaves gracefully (Close,
// bounded by DrainTimeout) and RunWorker returns nil, or ErrDrainTimeout.
// It returns early with an error if the worker stops by itself.
func RunWorker(ctx context.Context, cfg WorkerConfig, log *slog.Logger) error {
	if cfg.Server == "" || cfg.Sink == "" || cfg.ID == "" || cfg.Keyspace == "" || cfg.Interval <= 0 {
		return errors.New("chaos worker: --server, --sink, --keyspace and --id are required and --interval must be positive")
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 30 * time.Second
	}
	rep := newReporter(cfg.Sink, cfg.ID, log)
	defer rep.flush()
	c, err := client.Dial(cfg.Server, client.Logger(log))
	if err != nil {
		return fmt.Errorf("chaos worker: %w", err)
	}
	defer c.Close()
	h := &handler{rep: rep, log: log, cfg: cfg, buckets: map[int]*bucketWork{}}
	w, err := client.NewWorker(c, cfg.Keyspace, client.Member{ID: cfg.ID, Address: fmt.Sprintf("pid-%d", os.Getpid())}, h,
		client.OnEvent(rep.workerEvent), client.Replace(cfg.Replace))
	if err != nil {
		return fmt.Errorf("chaos worker: %w", err)
	}
	ran := make(chan error, 1)
	go func() { ran <- w.Run(context.Background()) }() // exits after Close, or on a permanent error
	select {
	case err := <-ran:
		return fmt.Errorf("chaos worker: the worker stopped by itself: %w", err)
	case <-ctx.Done():
	}
	log.Info("stopping: draining")
	rep.post("/event", Record{Kind: KindDraining})
	dctx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
	err = w.Close(dctx)
	cancel()
	if rerr := <-ran; rerr != nil {
		log.Error("Run", "err", rerr)
	}
	if err != nil {
		return fmt.Errorf("%w: %v", ErrDrainTimeout, err)
	}
	log.Info("drained; exiting")
	return nil
}

// handler implements client.Handler: one writer goroutine per held bucket.
type handler struct {
	rep *reporter
	log *slog.Logger
	cfg WorkerConfig

	mu      sync.Mutex
	buckets map[int]*bucketWork
}

// bucketWork is one grant's work: its writer runs from Acquire until
// Release stops it (or the grant's context is cancelled).
type bucketWork struct {
	g    client.Grant
	gctx context.Context
	stop chan struct{} // closed by Release: write no more
	done chan struct{} // closed when the writer has exited: no write in flight
}

// Acquire first claims the bucket at the sink with the grant's token (as an
// application would raise the fence of the bucket's rows), then starts
// writing.
func (h *handler) Acquire(ctx context.Context, g client.Grant) error {
	if code := h.rep.post("/event", Record{Kind: KindAcquire, Bucket: g.Bucket, Token: g.Token}); code == http.StatusConflict {
		h.log.Error("the sink refused the claim of a new grant: it has seen a higher token", "bucket", g.Bucket, "token", g.Token)
	}
	bw := &bucketWork{g: g, gctx: ctx, stop: make(chan struct{}), done: make(chan struct{})}
	h.mu.Lock()
	h.buckets[g.Bucket] = bw
	h.mu.Unlock()
	go h.write(bw) // exits when Release closes bw.stop or the grant's context ends
	return nil
}

// write writes to the sink every interval with the grant's token. A write
// in flight is always finished (it is not bound to the grant's context), so
// that once done is closed the sink has answered every write of the grant.
// A refused write (409: a newer owner exists) makes it stop.
func (h *handler) write(bw *bucketWork) {
	defer close(bw.done)
	t := time.NewTicker(h.cfg.Interval)
	defer t.Stop()
	for n := uint64(1); ; n++ {
		select {
		case <-bw.gctx.Done():
			return
		case <-bw.stop:
			return
		case <-t.C:
		}
		select { // a stop that raced with the tick wins
		case <-bw.gctx.Done():
			return
		case <-bw.stop:
			return
		default:
		}
		if !bw.g.Valid() { // checked right before each write, as an application should
			return
		}
		if code := h.rep.post("/write", Record{Kind: KindWrite, Bucket: bw.g.Bucket, Token: bw.g.Token, N: n}); code == http.StatusConflict {
			h.log.Warn("write refused: a newer owner exists; stopping work on the bucket", "bucket", bw.g.Bucket, "token", bw.g.Token)
			return
		}
	}
}

// Release finishes the bucket's in-flight work and returns once no write
// of the grant can still reach the sink. On a handoff it first keeps
// working for ReleaseDelay, or with BlockRelease until the grant's
// context is cancelled; after a self-fence (the grant's context is
// already cancelled) it stops at once.
func (h *handler) Release(ctx context.Context, bucket int) error {
	h.mu.Lock()
	bw := h.buckets[bucket]
	delete(h.buckets, bucket)
	h.mu.Unlock()
	if bw == nil {
		h.rep.post("/event", Record{Kind: KindRelease, Bucket: bucket, Err: "Release without a preceding Acquire"})
		return nil
	}
	fenced := bw.gctx.Err() != nil
	h.rep.post("/event", Record{Kind: KindReleasing, Bucket: bucket, Token: bw.g.Token, Fenced: fenced})
	if !fenced && h.cfg.BlockRelease {
		h.log.Warn("Release is stuck until the grant's context ends", "bucket", bucket, "token", bw.g.Token)
		select {
		case <-bw.gctx.Done():
		case <-ctx.Done():
		}
	}
	if !fenced && h.cfg.ReleaseDelay > 0 {
		t := time.NewTimer(h.cfg.ReleaseDelay)
		select {
		case <-t.C:
		case <-bw.gctx.Done():
		case <-ctx.Done():
		}
		t.Stop()
	}
	close(bw.stop)
	<-bw.done
	h.rep.post("/event", Record{Kind: KindRelease, Bucket: bucket, Token: bw.g.Token, Fenced: fenced || bw.gctx.Err() != nil})
	return nil
}

// reporter posts records to the sink: a write (POST /write) or an event
// (POST /event); Mono is the machine's monotonic clock (MonoNow) when the
// record was made. Handler reports are synchronous, so
// that the sink sees a grant's release before the next owner's acquire;
// SDK events (OnEvent must not block) go through a queue, in order.
type reporter struct {
	url    string
	worker string
	pid    int
	hc     *http.Client
	log    *slog.Logger

	queue chan Record
	done  chan struct{} // closed when the queue's goroutine exits
	once  sync.Once

	mu       sync.Mutex
	released []ReleasedAt // to carry on the next post
}

func newReporter(url, worker string, log *slog.Logger) *reporter {
	r := &reporter{
		url: url, worker: worker, pid: os.Getpid(), log: log,
		hc:    &http.Client{Timeout: 5 * time.Second},
		queue: make(chan Record, 1024),
		done:  make(chan struct{}),
	}
	go func() { // exits when flush closes the queue
		defer close(r.done)
		for rep := range r.queue {
			r.post("/event", rep)
		}
	}()
	return r
}

// post sends one report and returns the sink's status code (0 if it could
// not be reached).
func (r *reporter) post(path string, rep Record) int {
	rep.Worker, rep.Pid = r.worker, r.pid
	r.mu.Lock()
	rep.Released, r.released = r.released, nil
	r.mu.Unlock()
	if rep.Mono == 0 {
		rep.Mono = MonoNow()
	}
	body, _ := json.Marshal(rep)
	resp, err := r.hc.Post(r.url+path, "application/json", bytes.NewReader(body))
	if err != nil {
		r.log.Warn("report to the sink failed", "kind", rep.Kind, "err", err)
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// workerEvent is the Worker's OnEvent callback: it queues lifecycle
// events (Acquire and Release report themselves).
func (r *reporter) workerEvent(ev client.Event) {
	var kind string
	switch ev.Kind {
	case client.EventJoined:
		kind = KindJoined
	case client.EventFenced:
		kind = KindFenced
	case client.EventSessionLost:
		kind = KindSessionLost
	case client.EventRejoined:
		kind = KindRejoined
	case client.EventLeft:
		kind = KindLeft
	case client.EventReleased: // carried on the next post
		r.mu.Lock()
		r.released = append(r.released, ReleasedAt{Bucket: ev.Grant.Bucket, Token: ev.Grant.Token, Mono: MonoNow()})
		r.mu.Unlock()
		return
	default:
		return
	}
	rep := Record{Kind: kind, Session: ev.Session}
	if ev.Err != nil {
		rep.Err = ev.Err.Error()
	}
	rep.Mono = MonoNow() // when it happened, not when it is sent
	select {
	case r.queue <- rep:
	default:
		r.log.Warn("event queue full; dropping", "kind", kind)
	}
}

// flush sends what is queued and stops the queue.
func (r *reporter) flush() {
	r.once.Do(func() { close(r.queue) })
	<-r.done
}
