package stream

import (
	"context"
	"fmt"
	"sync"

	"github.com/keyshard/keyshard/client"
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
	Read(ctx context.Context, from uint64) (recs []Record, next uint64, err error)
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
type Consumer struct {
	r      Reader
	handle func(context.Context, Record) error

	mu   sync.Mutex // guards flow, and is held while a batch is handled
	flow *Flow
	runner
}

// NewConsumer returns a Consumer of flow, which it then owns: call its
// methods only through the Consumer. It does no IO and starts no
// goroutine; nil arguments are a *client.ArgError.
func NewConsumer(flow *Flow, r Reader, handle func(context.Context, Record) error) (*Consumer, error) {
	for _, a := range []struct {
		name string
		nil  bool
	}{{"flow", flow == nil}, {"r", r == nil}, {"handle", handle == nil}} {
		if a.nil {
			return nil, &client.ArgError{Func: "NewConsumer", Arg: a.name, Reason: "is nil"}
		}
	}
	return &Consumer{r: r, handle: handle, flow: flow}, nil
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
// error; Progress is then before the record that failed). Run may be
// called once.
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
			return fmt.Errorf("stream: read from %d: %w", from, err)
		}
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

// Close stops Run and waits until it has returned; Run then returns
// client.ErrClosed. It is idempotent and may be called without Run.
func (c *Consumer) Close() error {
	c.close()
	return nil
}
