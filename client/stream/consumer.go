package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/clock"
)

// Reader reads the shared stream; the package never knows what it is (a
// Kafka partition, a Postgres table). It is called from Consumer.Run's
// goroutine, one call at a time.
type Reader interface {
	// Read returns records at or after from, in strictly increasing
	// position, and next: where to read next, after every record
	// returned. At the head of the stream it may wait for new records,
	// but should then return (no records, next == from) after a short
	// while, so that a bucket gained meanwhile starts catching up.
	//
	// An error that reading again may fix (a broker or database that is
	// failing over, a broken connection, a timeout) should wrap
	// ErrTransient (see Transient): the Consumer then backs off and reads
	// again. Any other error stops the Consumer.
	Read(ctx context.Context, from uint64) (recs []Record, next uint64, err error)
}

// ConsumerOptions configure a Consumer. The zero value is usable.
type ConsumerOptions struct {
	// Retry paces the Reads after a transient Read error.
	Retry Retry
	// Clock times the waits between those Reads; nil means the real
	// clock.
	Clock clock.Clock
	// Logger receives a warning for every transient Read error, and a
	// message when Reads succeed again; nil discards them.
	Logger *slog.Logger
}

// Consumer runs a Flow with a Reader: it reads the lane the Flow needs
// and calls handle for the records it delivers. While a catch-up runs the
// main lane waits: the catch-up lane reads records already in the stream
// up to the fixed main position, so it never waits for new ones and the
// wait is as short as the catch-up.
//
// Run owns the Flow. Gain, Lose and Progress are safe to call from other
// goroutines (the worker's grant handling and its committer); they wait
// while a batch is being handled, so that Lose returns only once no
// record of the lost buckets is being handled or will be, and Progress
// never counts a record whose handle has not returned. handle must not
// call them.
//
// A Read error wrapping ErrTransient does not stop Run: the Consumer
// waits (ConsumerOptions.Retry, on ConsumerOptions.Clock) and reads again
// at the position it needs then, for as long as the errors last, counting
// them (Stats) and logging each at warn level with the streak so far and
// the error. Nothing is skipped or repeated: a failed Read delivered
// nothing.
type Consumer struct {
	r      Reader
	handle func(context.Context, Record) error
	retry  Retry
	clk    clock.Clock
	log    *slog.Logger

	statsMu sync.Mutex
	stats   ConsumerStats

	mu   sync.Mutex // guards flow, and is held while a batch is handled
	flow *Flow
	runner
}

// NewConsumer returns a Consumer of flow, which it then owns: call its
// methods only through the Consumer. It does no IO and starts no
// goroutine; nil arguments and a bad ConsumerOptions.Retry are a
// *client.ArgError naming the argument or field.
func NewConsumer(flow *Flow, r Reader, handle func(context.Context, Record) error, opts ConsumerOptions) (*Consumer, error) {
	bad := func(arg, reason string) error { return &client.ArgError{Func: "NewConsumer", Arg: arg, Reason: reason} }
	for _, a := range []struct {
		name string
		nil  bool
	}{{"flow", flow == nil}, {"r", r == nil}, {"handle", handle == nil}} {
		if a.nil {
			return nil, bad(a.name, "is nil")
		}
	}
	retry, err := opts.Retry.withDefaults(bad, "ConsumerOptions.Retry.")
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Consumer{r: r, handle: handle, flow: flow, retry: retry, clk: clock.Or(opts.Clock), log: log}, nil
}

// Stats returns the counters of transient Read errors. It does not wait
// for a batch being handled.
func (c *Consumer) Stats() ConsumerStats {
	c.statsMu.Lock()
	defer c.statsMu.Unlock()
	return c.stats
}

// Gain is Flow.Gain.
func (c *Consumer) Gain(gs ...BucketPosition) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.flow.Gain(gs...)
}

// Lose is Flow.Lose; it returns once no record of buckets is being
// handled, and none will be.
func (c *Consumer) Lose(buckets ...int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.flow.Lose(buckets...)
}

// LoseFinal loses one bucket, as Lose does, and returns its final
// position: the position after the last record of it whose handle
// returned nil (Flow.BucketProgress just before it was lost), which a
// release hands over. held is false if the bucket was not held.
func (c *Consumer) LoseFinal(bucket int) (final uint64, held bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	final, held = c.flow.BucketProgress(bucket)
	if err := c.flow.Lose(bucket); err != nil {
		return 0, false, err
	}
	return final, held, nil
}

// Progress is Flow.Progress: what a commit sends, counting only records
// whose handle returned nil.
func (c *Consumer) Progress() (def uint64, except []BucketPosition) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.flow.Progress()
}

// Run reads and handles records until ctx ends (returning ctx.Err()),
// Close (client.ErrClosed), or Read or handle fails (returning its
// error; Progress is then before the record that failed). A Read error
// wrapping ErrTransient is not a failure: Run backs off and reads again
// (see Consumer), until ctx ends or Close, which end a wait at once. Run
// may be called once.
func (c *Consumer) Run(ctx context.Context) error {
	return c.run(ctx, "Consumer", c.loop)
}

func (c *Consumer) loop(ctx context.Context) error {
	deliver := func(r Record) error { return c.handle(ctx, r) }
	for {
		c.mu.Lock()
		from, catching := c.flow.Catching()
		if !catching {
			from = c.flow.Position()
		}
		c.mu.Unlock()
		recs, next, err := c.r.Read(ctx, from)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if !errors.Is(err, ErrTransient) {
				return fmt.Errorf("stream: read from %d: %w", from, err)
			}
			if !clock.Sleep(ctx, c.clk, c.failed(from, catching, err)) {
				return ctx.Err()
			}
			continue
		}
		c.succeeded()
		c.mu.Lock()
		if catching {
			_, err = c.flow.Catchup(from, recs, next, deliver)
		} else {
			err = c.flow.Main(from, recs, next, deliver)
		}
		c.mu.Unlock()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
	}
}

// failed counts a transient Read error, logs it and returns how long to
// wait before reading again.
func (c *Consumer) failed(from uint64, catching bool, err error) time.Duration {
	now := c.clk.Now()
	c.statsMu.Lock()
	c.stats.ReadRetries++
	c.stats.Streak++
	if c.stats.Streak == 1 {
		c.stats.FailingSince = now
	}
	c.stats.LastError = err
	s := c.stats
	c.statsMu.Unlock()
	wait := c.retry.wait(s.Streak)
	c.log.Warn("keyshard: stream read failed with a transient error; reading again after a pause",
		"lane", laneName(catching), "from", from, "failures_in_a_row", s.Streak,
		"failing_for", now.Sub(s.FailingSince), "retry_in", wait, "err", err)
	return wait
}

// succeeded ends a streak of transient Read errors, if there is one.
func (c *Consumer) succeeded() {
	c.statsMu.Lock()
	s := c.stats
	c.stats.Streak, c.stats.FailingSince = 0, time.Time{}
	c.statsMu.Unlock()
	if s.Streak > 0 {
		c.log.Info("keyshard: stream read again after transient errors",
			"failures_in_a_row", s.Streak, "failing_for", c.clk.Since(s.FailingSince), "last_err", s.LastError)
	}
}

func laneName(catching bool) string {
	if catching {
		return "catch-up"
	}
	return "main"
}

// Close stops Run and waits until it has returned; Run then returns
// client.ErrClosed. It is idempotent and may be called without Run.
func (c *Consumer) Close() error {
	c.close()
	return nil
}
