package stream

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/clock"
	"github.com/keyshard/keyshard/placement"
)

// Candidate is a piece of pending work a Waker may wake: in Synapse, a
// destination with outbound data waiting, at its cursor in the table that
// lists them.
type Candidate struct {
	Key []byte
	// Cursor orders the candidates; a source returns them in strictly
	// increasing cursor.
	Cursor uint64
}

// DefaultWakePage is the page size of a Waker whose WakeConfig.Page is 0.
const DefaultWakePage = 100

// WakeConfig configures a Waker. Next, Keep, Wake and Rate are required.
type WakeConfig struct {
	// Next returns up to limit candidates with a cursor after after, in
	// increasing cursor; none when there are no more. It is called from
	// Run's goroutine, one call at a time.
	Next func(ctx context.Context, after uint64, limit int) ([]Candidate, error)
	// Keep reports whether a candidate's key is of a gained bucket
	// (KeepBuckets builds one). It is called from Run's goroutine.
	Keep func(key []byte) bool
	// Wake wakes the work pending for key. It is called from Run's
	// goroutine, at most Rate times a second; ctx ends on Close.
	Wake func(ctx context.Context, key []byte) error
	// Rate is how many Wake calls a second at most, > 0. Candidates that
	// Keep drops are not paced: they cost no wake.
	Rate float64
	// Page is the limit passed to Next; 0 means DefaultWakePage.
	Page int
	// After is the cursor to start after.
	After uint64
	// Clock paces the wakes; nil means the real clock.
	Clock clock.Clock
}

// Waker pages through candidates after gaining buckets and wakes those of
// the gained buckets, paced. Its cursor moves past every candidate read,
// whether Keep kept it or not: a page filtered out whole is never read
// again, so a Waker cannot spin on it.
type Waker struct {
	cfg      WakeConfig
	clk      clock.Clock
	interval time.Duration
	cursor   atomic.Uint64
	runner
}

// NewWaker checks cfg and returns a Waker; it does no IO and starts no
// goroutine. It returns a *client.ArgError naming the field for a missing
// function, a Rate that is not > 0 or a negative Page.
func NewWaker(cfg WakeConfig) (*Waker, error) {
	bad := func(arg, reason string) error {
		return &client.ArgError{Func: "NewWaker", Arg: "WakeConfig." + arg, Reason: reason}
	}
	switch {
	case cfg.Next == nil:
		return nil, bad("Next", "is nil")
	case cfg.Keep == nil:
		return nil, bad("Keep", "is nil")
	case cfg.Wake == nil:
		return nil, bad("Wake", "is nil")
	case !(cfg.Rate > 0) || math.IsInf(cfg.Rate, 1):
		return nil, bad("Rate", fmt.Sprintf("%v is not a positive number of wakes a second", cfg.Rate))
	case cfg.Page < 0:
		return nil, bad("Page", fmt.Sprintf("%d is negative", cfg.Page))
	}
	if cfg.Page == 0 {
		cfg.Page = DefaultWakePage
	}
	w := &Waker{cfg: cfg, clk: clock.Or(cfg.Clock), interval: time.Duration(float64(time.Second) / cfg.Rate)}
	w.cursor.Store(cfg.After)
	return w, nil
}

// Cursor returns the cursor of the last candidate dealt with: every
// candidate up to it was woken or dropped by Keep. A Waker started again
// after it (WakeConfig.After) misses nothing.
func (w *Waker) Cursor() uint64 { return w.cursor.Load() }

// Run reads candidates from After on, calls Wake for those Keep keeps, at
// most Rate a second (the first at once), and returns nil once Next
// returns none. It returns ctx.Err() when ctx ends, client.ErrClosed on
// Close, or the error of Next or Wake (Cursor is then before the
// candidate that failed). Next returning a candidate whose cursor is not
// after the one before is an error wrapping ErrOrder. Run may be called
// once.
func (w *Waker) Run(ctx context.Context) error {
	return w.runner.run(ctx, "Waker", w.wake)
}

func (w *Waker) wake(ctx context.Context) error {
	var due time.Time // when the next wake may happen; zero: at once
	for {
		after := w.cursor.Load()
		page, err := w.cfg.Next(ctx, after, w.cfg.Page)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("stream: waker: next candidates after %d: %w", after, err)
		}
		if len(page) == 0 {
			return nil
		}
		for _, c := range page {
			if c.Cursor <= after {
				return fmt.Errorf("%w: waker: candidate cursor %d is not after %d", ErrOrder, c.Cursor, after)
			}
			after = c.Cursor
			if w.cfg.Keep(c.Key) {
				if err := w.pace(ctx, due); err != nil {
					return err
				}
				if err := w.cfg.Wake(ctx, c.Key); err != nil {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					return fmt.Errorf("stream: waker: wake %q: %w", c.Key, err)
				}
				due = w.clk.Now().Add(w.interval)
			}
			w.cursor.Store(after)
		}
	}
}

// pace waits until due, or returns ctx's error.
func (w *Waker) pace(ctx context.Context, due time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d := due.Sub(w.clk.Now())
	if due.IsZero() || d <= 0 {
		return nil
	}
	t := w.clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops Run and waits until it has returned; Run then returns
// client.ErrClosed. It is idempotent and may be called without Run.
func (w *Waker) Close() error {
	w.close()
	return nil
}

// KeepBuckets returns a WakeConfig.Keep that keeps the keys whose bucket
// under hasher is one of buckets, with a table lookup; buckets out of
// range are ignored.
func KeepBuckets(hasher placement.Hasher, buckets ...int) func(key []byte) bool {
	in := make([]bool, hasher.Buckets())
	for _, b := range buckets {
		if b >= 0 && b < len(in) {
			in[b] = true
		}
	}
	return func(key []byte) bool { return len(in) > 0 && in[hasher.Bucket(key)] }
}
