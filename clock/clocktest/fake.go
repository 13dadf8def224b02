package clocktest

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/keyshard/keyshard/clock"
)

// Fake is a clock.Clock that moves only when Advance is called.
// Timers, tickers and AfterFunc callbacks fire, in deadline order, during
// Advance. It is safe for concurrent use.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	waiters []*fakeTimer
	changed chan struct{} // closed and replaced whenever a timer is added
}

var _ clock.Clock = (*Fake)(nil)

// NewFake returns a Fake at start.
func NewFake(start time.Time) *Fake {
	return &Fake{now: start, changed: make(chan struct{})}
}

// Now returns the fake time.
func (c *Fake) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Since returns the fake time elapsed since t.
func (c *Fake) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// NewTimer returns a timer that fires when the clock is advanced past d.
func (c *Fake) NewTimer(d time.Duration) clock.Timer {
	t := &fakeTimer{c: c, ch: make(chan time.Time, 1)}
	c.schedule(t, d)
	return t
}

// AfterFunc calls f, in its own goroutine, once the clock passes d.
func (c *Fake) AfterFunc(d time.Duration, f func()) clock.Timer {
	t := &fakeTimer{c: c, f: f}
	c.schedule(t, d)
	return t
}

// NewTicker returns a ticker that ticks every d of fake time.
func (c *Fake) NewTicker(d time.Duration) clock.Ticker {
	if d <= 0 {
		panic("clocktest: non-positive interval for NewTicker")
	}
	t := &fakeTimer{c: c, ch: make(chan time.Time, 1), period: d}
	c.schedule(t, d)
	return &fakeTicker{t}
}

// Advance moves the clock forward by d, firing every timer due on the way.
func (c *Fake) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	for {
		sort.SliceStable(c.waiters, func(i, j int) bool { return c.waiters[i].when.Before(c.waiters[j].when) })
		if len(c.waiters) == 0 || c.waiters[0].when.After(end) {
			break
		}
		t := c.waiters[0]
		c.waiters = c.waiters[1:]
		c.now = t.when
		t.active = false
		if t.period > 0 {
			t.when = t.when.Add(t.period)
			t.active = true
			c.waiters = append(c.waiters, t)
		}
		now := c.now
		if t.f != nil {
			go t.f() // exits when f returns; the test owns f
		} else {
			select {
			case t.ch <- now:
			default: // like time.Ticker, drop a tick nobody read
			}
		}
	}
	c.now = end
	c.mu.Unlock()
}

// Waiters returns the number of timers and tickers waiting to fire.
func (c *Fake) Waiters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}

// BlockUntil waits until at least n timers are waiting, so a test can
// advance the clock only once the code under test is asleep on it. It
// waits forever if that never happens; prefer BlockUntilContext.
func (c *Fake) BlockUntil(n int) { _ = c.BlockUntilContext(context.Background(), n) }

// BlockUntilContext is BlockUntil bounded by ctx: it returns ctx's error,
// with how many timers were waiting, if ctx ends first, so that a test
// whose code under test never sleeps fails instead of hanging.
func (c *Fake) BlockUntilContext(ctx context.Context, n int) error {
	return c.blockUntil(ctx, n, -1)
}

// BlockUntilDue is BlockUntilContext counting only the timers due within
// d of the fake now. A test uses it to tell the sleep it wants to end
// from a longer timer the code under test holds meanwhile (a call's
// deadline, say): waiting for any timer would advance the clock while
// the code has not gone to sleep yet.
func (c *Fake) BlockUntilDue(ctx context.Context, n int, d time.Duration) error {
	return c.blockUntil(ctx, n, d)
}

// blockUntil waits for n timers due within d (any, if d < 0).
func (c *Fake) blockUntil(ctx context.Context, n int, d time.Duration) error {
	for {
		c.mu.Lock()
		have := 0
		for _, w := range c.waiters {
			if d < 0 || !w.when.After(c.now.Add(d)) {
				have++
			}
		}
		if have >= n {
			c.mu.Unlock()
			return nil
		}
		ch := c.changed
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			if d >= 0 {
				return fmt.Errorf("clocktest: %d timers due within %v, want %d: %w", have, d, n, ctx.Err())
			}
			return fmt.Errorf("clocktest: %d timers waiting, want %d: %w", have, n, ctx.Err())
		}
	}
}

// stuckAfter is how long MustBlockUntil waits, in real time, before it
// declares the code under test stuck. It is a guard against a hang, not a
// timing assumption: a test never waits this long when it passes.
const stuckAfter = time.Minute

// MustBlockUntil is BlockUntilContext for a test's own goroutine: it
// fails tb, saying how many timers were waiting, if the code under test
// has not gone to sleep on n timers within a minute of real time, or when
// the test's context ends.
func (c *Fake) MustBlockUntil(tb testing.TB, n int) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), stuckAfter)
	defer cancel()
	if err := c.BlockUntilContext(ctx, n); err != nil {
		tb.Fatalf("the code under test never slept on the fake clock: %v", err)
	}
}

// MustBlockUntilDue is BlockUntilDue for a test's own goroutine, with
// MustBlockUntil's guard against a hang.
func (c *Fake) MustBlockUntilDue(tb testing.TB, n int, d time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), stuckAfter)
	defer cancel()
	if err := c.BlockUntilDue(ctx, n, d); err != nil {
		tb.Fatalf("the code under test never slept on the fake clock: %v", err)
	}
}

func (c *Fake) schedule(t *fakeTimer, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t.when = c.now.Add(d)
	t.active = true
	c.waiters = append(c.waiters, t)
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *Fake) remove(t *fakeTimer) bool {
	for i, w := range c.waiters {
		if w == t {
			c.waiters = append(c.waiters[:i], c.waiters[i+1:]...)
			return true
		}
	}
	return false
}

type fakeTimer struct {
	c      *Fake
	ch     chan time.Time
	f      func()
	when   time.Time
	period time.Duration
	active bool
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.active = false
	return t.c.remove(t)
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	was := t.c.remove(t)
	t.c.mu.Unlock()
	t.c.schedule(t, d)
	return was
}

type fakeTicker struct{ t *fakeTimer }

func (k *fakeTicker) C() <-chan time.Time { return k.t.ch }
func (k *fakeTicker) Stop()               { k.t.Stop() }
func (k *fakeTicker) Reset(d time.Duration) {
	k.t.c.mu.Lock()
	k.t.period = d
	k.t.c.mu.Unlock()
	k.t.Reset(d)
}
