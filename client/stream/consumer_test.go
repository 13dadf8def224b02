package stream

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/keyshard/keyshard/client"
)

// headReader reads a memLog ten records at a time; at the head it
// reports on atHead and waits for poke (then returns nothing) or ctx.
type headReader struct {
	log    *memLog
	atHead chan struct{}
	poke   chan struct{}
}

func (r *headReader) Read(ctx context.Context, from uint64) ([]Record, uint64, error) {
	if from >= r.log.end {
		select {
		case r.atHead <- struct{}{}:
		case <-ctx.Done():
			return nil, from, ctx.Err()
		}
		select {
		case <-r.poke:
			return nil, from, nil
		case <-ctx.Done():
			return nil, from, ctx.Err()
		}
	}
	recs, next := r.log.read(from, 10)
	return recs, next, nil
}

// TestConsumer runs a Consumer on its goroutine and gains a bucket from
// another while it waits at the head: the bucket's records from its from
// are handled once each, in order, and the others' are not repeated.
func TestConsumer(t *testing.T) {
	log := genLog(rand.New(rand.NewPCG(1, 2)), 300, 20, 0)
	h := mustHasher(t, 4)
	mid := log.recs[150].Position
	f, err := NewFlow(h, mid)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Gain(BucketPosition{0, mid}, BucketPosition{1, mid}); err != nil {
		t.Fatal(err)
	}
	r := &headReader{log: log, atHead: make(chan struct{}), poke: make(chan struct{})}
	var got [4][]uint64 // written by Run's goroutine, read after it waits at the head
	c, err := NewConsumer(f, r, func(_ context.Context, rec Record) error {
		b := h.Bucket(rec.Key)
		got[b] = append(got[b], rec.Position)
		return nil
	}, ConsumerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.Run(t.Context()) }() // exits on Close
	<-r.atHead
	from := log.recs[40].Position
	if err := c.Gain(BucketPosition{2, from}); err != nil {
		t.Fatal(err)
	}
	if def, except := c.Progress(); def != log.end || !slices.Equal(except, []BucketPosition{{2, from}}) {
		t.Errorf("Progress = %d, %v; want %d and bucket 2 at %d", def, except, log.end, from)
	}
	r.poke <- struct{}{}
	<-r.atHead // caught up and merged: the main lane is at the head again
	want := func(b int, from uint64) []uint64 {
		var ps []uint64
		for _, rec := range log.recs {
			if h.Bucket(rec.Key) == b && rec.Position >= from {
				ps = append(ps, rec.Position)
			}
		}
		return ps
	}
	for b, from := range map[int]uint64{0: mid, 1: mid, 2: from, 3: none} {
		if !slices.Equal(got[b], want(b, from)) {
			t.Errorf("bucket %d: handled %v, want %v", b, got[b], want(b, from))
		}
	}
	if def, except := c.Progress(); def != log.end || except != nil {
		t.Errorf("Progress = %d, %v; want %d and no exception", def, except, log.end)
	}
	if err := c.Lose(0); err != nil {
		t.Error(err)
	}
	c.Close()
	if err := <-errc; !errors.Is(err, client.ErrClosed) {
		t.Errorf("Run = %v, want ErrClosed", err)
	}
	c.Close()
}

func TestNewConsumerArgs(t *testing.T) {
	f, _ := NewFlow(mustHasher(t, 4), 0)
	var ae *client.ArgError
	if _, err := NewConsumer(f, nil, func(context.Context, Record) error { return nil }, ConsumerOptions{}); !errors.As(err, &ae) || ae.Arg != "r" {
		t.Errorf("NewConsumer(nil reader) = %v, want an *ArgError naming r", err)
	}
}
