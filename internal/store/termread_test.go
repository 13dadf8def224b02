package store

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyshard/keyshard/internal/shard"
)

// fakeTermReads is a termReads whose reads are held until the test
// answers them: each read sent shows up on sent, and returns what is sent
// on its answer channel (or its context's error).
type fakeTermReads struct {
	*termReads
	sent chan fakeRead
	ctx  context.Context // bounds the test's waits
}

type fakeRead struct {
	ctx    context.Context
	answer chan uint64
}

func newFakeTermReads(t *testing.T) *fakeTermReads {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	f := &fakeTermReads{sent: make(chan fakeRead, 8), ctx: ctx}
	f.termReads = &termReads{base: t.Context(), read: func(ctx context.Context) (uint64, error) {
		r := fakeRead{ctx: ctx, answer: make(chan uint64, 1)}
		f.sent <- r
		select {
		case term := <-r.answer:
			return term, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}}
	return f
}

// next returns the next read sent.
func (f *fakeTermReads) next(t *testing.T) fakeRead {
	t.Helper()
	select {
	case r := <-f.sent:
		return r
	case <-f.ctx.Done():
		t.Fatal("no read was sent")
		return fakeRead{}
	}
}

// noRead checks that no read has been sent since the last next.
func (f *fakeTermReads) noRead(t *testing.T) {
	t.Helper()
	select {
	case <-f.sent:
		t.Fatal("a read was sent while one was in flight")
	default:
	}
}

// queuedWaiters is how many callers wait for the queued read.
func (f *fakeTermReads) queuedWaiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.queued == nil {
		return 0
	}
	return f.queued.waiters
}

type confirmed struct {
	term uint64
	err  error
}

// get waits for a caller's answer.
func (f *fakeTermReads) get(t *testing.T, ch <-chan confirmed) confirmed {
	t.Helper()
	select {
	case c := <-ch:
		return c
	case <-f.ctx.Done():
		t.Fatal("a caller got no answer")
		return confirmed{}
	}
}

func (f *fakeTermReads) confirmAsync(ctx context.Context) <-chan confirmed {
	ch := make(chan confirmed, 1)
	go func() {
		term, err := f.confirm(ctx)
		ch <- confirmed{term, err}
	}()
	return ch
}

// waitQueued waits until n callers wait for the queued read.
func (f *fakeTermReads) waitQueued(t *testing.T, n int) {
	t.Helper()
	for f.queuedWaiters() != n {
		select {
		case <-f.ctx.Done():
			t.Fatalf("%d callers queued; want %d", f.queuedWaiters(), n)
		case <-time.After(time.Millisecond):
		}
	}
}

// TestTermReadsShared: a caller never takes the answer of a read sent
// before it asked; the callers that ask while a read is in flight share
// the next one, sent once it ends.
func TestTermReadsShared(t *testing.T) {
	f := newFakeTermReads(t)
	first := f.confirmAsync(f.ctx)
	r1 := f.next(t)
	// Three renewals answered while r1 is in flight.
	late := []<-chan confirmed{f.confirmAsync(f.ctx), f.confirmAsync(f.ctx), f.confirmAsync(f.ctx)}
	f.waitQueued(t, 3)
	f.noRead(t)
	r1.answer <- 7
	if c := f.get(t, first); c.term != 7 || c.err != nil {
		t.Fatalf("first caller: %+v; want term 7", c)
	}
	r2 := f.next(t) // sent after r1 ended, for the three
	f.noRead(t)
	select {
	case c := <-late[0]:
		t.Fatalf("a caller that asked while the first read was in flight took its answer: %+v", c)
	default:
	}
	r2.answer <- 8
	for i, ch := range late {
		if c := f.get(t, ch); c.term != 8 || c.err != nil {
			t.Errorf("late caller %d: %+v; want term 8, the read sent after it asked", i, c)
		}
	}
}

// TestTermReadsLeave: a caller whose context ends leaves; the read goes on
// for the others, and is canceled once its last caller has left. A
// queued read that every caller left is never sent.
func TestTermReadsLeave(t *testing.T) {
	f := newFakeTermReads(t)
	ctxA, cancelA := context.WithCancel(f.ctx)
	a := f.confirmAsync(ctxA)
	r1 := f.next(t)
	b := f.confirmAsync(f.ctx) // queued behind r1
	ctxC, cancelC := context.WithCancel(f.ctx)
	c := f.confirmAsync(ctxC) // queued too
	f.waitQueued(t, 2)
	cancelC()
	if got := f.get(t, c); !errors.Is(got.err, context.Canceled) {
		t.Fatalf("caller whose context ended: %+v; want context.Canceled", got)
	}
	f.waitQueued(t, 1)
	cancelA() // r1's only caller leaves: r1 is canceled, the queued read goes
	if got := f.get(t, a); !errors.Is(got.err, context.Canceled) {
		t.Fatalf("caller whose context ended: %+v; want context.Canceled", got)
	}
	select {
	case <-r1.ctx.Done():
	case <-f.ctx.Done():
		t.Fatal("the read whose callers all left was not canceled")
	}
	r2 := f.next(t)
	r2.answer <- 4
	if got := f.get(t, b); got.term != 4 || got.err != nil {
		t.Fatalf("remaining caller: %+v; want term 4", got)
	}

	// A queued read every caller left is dropped.
	ctxD, cancelD := context.WithCancel(f.ctx)
	d := f.confirmAsync(ctxD)
	r3 := f.next(t)
	ctxE, cancelE := context.WithCancel(f.ctx)
	e := f.confirmAsync(ctxE)
	f.waitQueued(t, 1)
	cancelE()
	f.get(t, e)
	f.waitQueued(t, 0)
	r3.answer <- 5
	if got := f.get(t, d); got.term != 5 {
		t.Fatalf("caller: %+v; want term 5", got)
	}
	cancelD()
	// Once r3's goroutine has ended, nothing is in flight or queued.
	for {
		f.mu.Lock()
		sent, queued := f.termReads.sent, f.queued
		f.mu.Unlock()
		if sent == nil {
			if queued != nil {
				t.Errorf("a read is queued that nobody waits for")
			}
			break
		}
		select {
		case <-f.ctx.Done():
			t.Fatal("the read in flight never ended")
		case <-time.After(time.Millisecond):
		}
	}
	f.noRead(t)
}

// BenchmarkKeepAliveOnceParallel: 64 leases renewed with KeepAliveOnce
// from 64 goroutines at once, on embedded etcd (fsync on), as a tenant
// pool's members or a join storm's first keep-alives are. reads/op is how
// many confirming reads each renewal cost.
func BenchmarkKeepAliveOnceParallel(b *testing.B) {
	e := runEmbedded(b, EmbeddedConfig{})
	s := openStore(b, e.Endpoints())
	ctx := ctxFor(b, 10*time.Minute)
	var reads atomic.Int64
	read := s.terms.read
	s.terms.read = func(ctx context.Context) (uint64, error) {
		reads.Add(1)
		return read(ctx)
	}
	const leases = 64
	ids := make([]shard.LeaseID, leases)
	for i := range ids {
		id, _, err := s.Grant(ctx, time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		ids[i] = id
	}
	var next atomic.Int64
	b.SetParallelism(leases / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		id := ids[int(next.Add(1)-1)%leases]
		for pb.Next() {
			if _, err := s.KeepAliveOnce(ctx, id); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(reads.Load())/float64(b.N), "reads/op")
}
