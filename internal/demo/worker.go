package demo

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyshard/keyshard/client"
)

// worker is an in-process event writer: a client.Worker whose handler
// keeps the set of buckets it may act on, and processes an event only
// while it holds the event's bucket. Release takes the same lock as
// processing, so it returns only after in-flight work for the bucket is
// done: the old owner has finished before the new one starts.
type worker struct {
	name string
	rec  *recorder
	w    *client.Worker
	kill context.CancelFunc
	// crashed is set before kill: the SDK then fences the worker's buckets
	// (calls Release) as a dying process stops acting; those are not
	// graceful handoffs.
	crashed atomic.Bool

	mu   sync.Mutex
	held map[int]uint64 // bucket → token
}

// Acquire implements client.Handler.
func (w *worker) Acquire(_ context.Context, g client.Grant) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.held[g.Bucket] = g.Token
	w.rec.acquire(w.name, g.Bucket, g.Token)
	return nil
}

// Release implements client.Handler.
func (w *worker) Release(_ context.Context, bucket int) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.held, bucket)
	w.rec.release(w.name, bucket, !w.crashed.Load())
	return nil
}

// process handles one event: at once if the worker holds its bucket; if
// the map names this worker but the grant has not arrived, it holds the
// event until it does; otherwise it answers with the wrong-owner error.
func (w *worker) process(ctx context.Context, ev event) error {
	g, err := w.w.OwnsString(ev.key)
	if errors.Is(err, client.ErrNotGranted) {
		g, err = w.w.WaitGrant(ctx, []byte(ev.key))
	}
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if tok, ok := w.held[g.Bucket]; !ok || tok != g.Token {
		return errNotHeld // released between the check and now: route again
	}
	w.rec.process(w.name, g.Bucket, g.Token, ev.id)
	return nil
}

var errNotHeld = errors.New("demo: bucket released meanwhile")

// recorder is the demo's record of grants and processing, checked at the
// end: no bucket held by two workers at once, tokens rising per bucket,
// every event processed once by the bucket's holder.
type recorder struct {
	sent, processed atomic.Int64

	mu          sync.Mutex
	holder      map[int]holding
	lastToken   map[int]uint64
	releasedAt  map[int]time.Time
	handoffs    []time.Duration
	seen        map[uint64]bool
	overlaps    int
	regressions int
	nonHolder   int64
}

type holding struct {
	worker string
	token  uint64
}

func newRecorder() *recorder {
	return &recorder{holder: map[int]holding{}, lastToken: map[int]uint64{}, releasedAt: map[int]time.Time{}, seen: map[uint64]bool{}}
}

func (r *recorder) acquire(worker string, b int, token uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if h, ok := r.holder[b]; ok && h.worker != worker {
		r.overlaps++
	}
	if token <= r.lastToken[b] {
		r.regressions++
	}
	r.holder[b] = holding{worker, token}
	r.lastToken[b] = token
	if t, ok := r.releasedAt[b]; ok {
		r.handoffs = append(r.handoffs, time.Since(t))
		delete(r.releasedAt, b)
	}
}

// release ends worker's holding of b; graceful releases start the clock
// of a handoff, which the next acquire of b stops.
func (r *recorder) release(worker string, b int, graceful bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if h, ok := r.holder[b]; ok && h.worker == worker {
		delete(r.holder, b)
		if graceful {
			r.releasedAt[b] = time.Now()
		}
	}
}

func (r *recorder) process(worker string, b int, token uint64, id uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if h := r.holder[b]; h.worker != worker || h.token != token {
		r.nonHolder++
	}
	if !r.seen[id] {
		r.seen[id] = true
		r.processed.Add(1)
	}
}
