package stream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/clock/clocktest"
)

var errBroker = errors.New("broker: leader not available")

// flakyReader is a headReader whose Reads fail as fail says: fail(n) for
// the n-th Read (from 1) is the error it returns instead of reading.
type flakyReader struct {
	*headReader
	reads atomic.Int64
	fail  func(n int) error
}

func (r *flakyReader) Read(ctx context.Context, from uint64) ([]Record, uint64, error) {
	if err := r.fail(int(r.reads.Add(1))); err != nil {
		return nil, from, err
	}
	return r.headReader.Read(ctx, from)
}

// syncBuffer is an io.Writer for a slog handler, safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestConsumerRidesOutTransientErrors: Reads that fail with a transient
// error are tried again with capped exponential backoff on the clock, for
// a streak longer than it takes to reach the cap, and every record of the
// held buckets is then handled once, in order; the retries are counted
// and logged.
func TestConsumerRidesOutTransientErrors(t *testing.T) {
	log := genLog(rand.New(rand.NewPCG(5, 6)), 300, 20, 0)
	h := mustHasher(t, 4)
	f, err := NewFlow(h, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Gain(BucketPosition{0, 0}, BucketPosition{1, 0}); err != nil {
		t.Fatal(err)
	}
	// Reads 3 to 12 fail (10 in a row), then read 16, then reads 20 and 21
	// with an error marked the other way.
	streak := func(n int) bool { return n >= 3 && n <= 12 }
	r := &flakyReader{
		headReader: &headReader{log: log, atHead: make(chan struct{}), poke: make(chan struct{})},
		fail: func(n int) error {
			switch {
			case streak(n), n == 16:
				return Transient(fmt.Errorf("read %d: %w", n, errBroker))
			case n == 20, n == 21:
				return fmt.Errorf("read %d: %w: %w", n, ErrTransient, io.ErrUnexpectedEOF)
			}
			return nil
		},
	}
	clk := clocktest.NewFake(time.Unix(0, 0))
	var logs syncBuffer
	retry := Retry{Delay: 100 * time.Millisecond, Max: 2 * time.Second}
	var got [4][]uint64 // written by Run's goroutine, read after it waits at the head
	c, err := NewConsumer(f, r, func(_ context.Context, rec Record) error {
		b := h.Bucket(rec.Key)
		got[b] = append(got[b], rec.Position)
		return nil
	}, ConsumerOptions{Retry: retry, Clock: clk, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.Run(t.Context()) }() // exits on Close

	// Each failure waits in [d/2, d), d = min(Max, Delay·2ⁿ⁻¹), on the
	// fake clock: the timer is due within d, and has not fired at d/2.
	failures := 0
	for n := 1; failures < 13; n++ {
		if r.fail(n) == nil {
			continue
		}
		failures++
		inRow := failures
		if failures > 10 {
			inRow = 1 // a success came before each of the later ones
			if failures == 13 {
				inRow = 2
			}
		}
		d := min(retry.Max, retry.Delay<<(inRow-1))
		clk.MustBlockUntilDue(t, 1, d)
		reads := r.reads.Load()
		clk.Advance(d/2 - 1)
		if clk.Waiters() != 1 || r.reads.Load() != reads {
			t.Fatalf("failure %d (%d in a row): read again before %v", failures, inRow, d/2)
		}
		if s := c.Stats(); s.ReadRetries != uint64(failures) || s.Streak != inRow || s.FailingSince.IsZero() {
			t.Fatalf("after failure %d: Stats = %+v, want %d retries, a streak of %d", failures, s, failures, inRow)
		}
		clk.Advance(d - (d/2 - 1))
	}
	<-r.atHead
	for b, from := range map[int]uint64{0: 0, 1: 0, 2: none, 3: none} {
		if !slices.Equal(got[b], want(log, h, b, from)) {
			t.Errorf("bucket %d: handled %v, want %v", b, got[b], want(log, h, b, from))
		}
	}
	s := c.Stats()
	if s.ReadRetries != 13 || s.Streak != 0 || !s.FailingSince.IsZero() || !errors.Is(s.LastError, io.ErrUnexpectedEOF) {
		t.Errorf("Stats = %+v, want 13 retries, no streak, the last error kept", s)
	}
	for _, want := range []string{
		"level=WARN", "failures_in_a_row=10", "read 12: broker: leader not available", "retry_in=",
		"level=INFO", "stream read again after transient errors",
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, logs.String())
		}
	}
	if strings.Contains(logs.String(), "failures_in_a_row=11") {
		t.Errorf("the streak was not reset by a successful read:\n%s", logs.String())
	}
	c.Close()
	if err := <-errc; !errors.Is(err, client.ErrClosed) {
		t.Errorf("Run = %v, want ErrClosed", err)
	}
}

// TestConsumerStopsOnOtherErrors: a Read error not marked transient stops
// Run at once, wrapped, and counts no retry.
func TestConsumerStopsOnOtherErrors(t *testing.T) {
	f, _ := NewFlow(mustHasher(t, 4), 0)
	errBad := errors.New("no such table")
	r := &flakyReader{headReader: &headReader{log: &memLog{}}, fail: func(int) error { return errBad }}
	clk := clocktest.NewFake(time.Unix(0, 0))
	c, err := NewConsumer(f, r, func(context.Context, Record) error { return nil }, ConsumerOptions{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(t.Context()); !errors.Is(err, errBad) || errors.Is(err, ErrTransient) {
		t.Errorf("Run = %v, want it to wrap the Reader's error", err)
	}
	if s := c.Stats(); s != (ConsumerStats{}) || r.reads.Load() != 1 {
		t.Errorf("Stats = %+v after %d reads, want none and one read", s, r.reads.Load())
	}
}

// TestConsumerCloseDuringBackoff: Close and ctx end a wait at once.
func TestConsumerCloseDuringBackoff(t *testing.T) {
	for _, how := range []string{"Close", "ctx"} {
		f, _ := NewFlow(mustHasher(t, 4), 0)
		r := &flakyReader{headReader: &headReader{log: &memLog{}}, fail: func(int) error { return Transient(errBroker) }}
		clk := clocktest.NewFake(time.Unix(0, 0))
		c, err := NewConsumer(f, r, func(context.Context, Record) error { return nil }, ConsumerOptions{Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error, 1)
		go func() { errc <- c.Run(ctx) }() // exits on Close or cancel
		clk.MustBlockUntil(t, 1)
		want := client.ErrClosed
		if how == "Close" {
			c.Close()
		} else {
			cancel()
			want = context.Canceled
		}
		if err := <-errc; !errors.Is(err, want) {
			t.Errorf("%s during a backoff: Run = %v, want %v", how, err, want)
		}
		cancel()
		if s := c.Stats(); s.ReadRetries != 1 || s.Streak != 1 || !errors.Is(s.LastError, errBroker) {
			t.Errorf("%s: Stats = %+v, want one retry", how, s)
		}
	}
}

// TestRetryWaitIsCapped: a streak of any length waits at most Max.
func TestRetryWaitIsCapped(t *testing.T) {
	r, err := Retry{Delay: time.Millisecond, Max: 30 * time.Second}.withDefaults(func(a, r string) error { return errors.New(a) }, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 2, 10, 15, 16, 64, 65, 1000, 1 << 40} {
		d := min(r.Max, r.Delay<<min(n-1, 20))
		if w := r.wait(n); w < d/2 || w >= d {
			t.Errorf("wait(%d) = %v, want in [%v, %v)", n, w, d/2, d)
		}
	}
}

func TestTransient(t *testing.T) {
	if Transient(nil) != nil {
		t.Error("Transient(nil) is not nil")
	}
	base := &client.ArgError{Func: "f", Arg: "a", Reason: "bad"}
	err := Transient(fmt.Errorf("reading: %w", base))
	var ae *client.ArgError
	if !errors.Is(err, ErrTransient) || !errors.As(err, &ae) || ae != base || err.Error() != "reading: "+base.Error() {
		t.Errorf("Transient = %v", err)
	}
	if errors.Is(errBroker, ErrTransient) {
		t.Error("an unmarked error is transient")
	}
}

func TestRetryArgs(t *testing.T) {
	f, _ := NewFlow(mustHasher(t, 4), 0)
	_, c := streamFake(t)
	hd := func(context.Context, Record) error { return nil }
	r := &headReader{}
	for _, tc := range []struct {
		retry Retry
		field string
	}{
		{Retry{Delay: -1}, "Retry.Delay"},
		{Retry{Max: -time.Second}, "Retry.Max"},
		{Retry{Delay: time.Minute, Max: time.Second}, "Retry.Max"},
	} {
		var ae *client.ArgError
		if _, err := NewConsumer(f, r, hd, ConsumerOptions{Retry: tc.retry}); !errors.As(err, &ae) || ae.Arg != "ConsumerOptions."+tc.field {
			t.Errorf("NewConsumer(%+v) = %v, want an *ArgError naming ConsumerOptions.%s", tc.retry, err, tc.field)
		}
		if _, err := NewWorker(c, ks, client.Member{ID: "w1"}, r, hd, WorkerOptions{ReadRetry: tc.retry}); !errors.As(err, &ae) || ae.Arg != "WorkerOptions.Read"+tc.field {
			t.Errorf("NewWorker(%+v) = %v, want an *ArgError naming WorkerOptions.Read%s", tc.retry, err, tc.field)
		}
	}
	for _, tc := range []struct{ in, want Retry }{
		{Retry{}, Retry{DefaultRetryDelay, DefaultMaxRetryDelay}},
		{Retry{Max: time.Millisecond}, Retry{time.Millisecond, time.Millisecond}},
		{Retry{Delay: time.Minute}, Retry{time.Minute, time.Minute}},
		{Retry{Delay: time.Second, Max: time.Minute}, Retry{time.Second, time.Minute}},
	} {
		got, err := tc.in.withDefaults(func(a, r string) error { return errors.New(a) }, "")
		if err != nil || got != tc.want {
			t.Errorf("%+v with defaults = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

// TestWorkerRidesOutTransientErrors: a stream Worker whose Reader fails
// transiently keeps its buckets, handles every record once it reads
// again, and counts the retries in Stats.
func TestWorkerRidesOutTransientErrors(t *testing.T) {
	f, c := streamFake(t)
	log := genLog(rand.New(rand.NewPCG(7, 8)), 200, 20, 0)
	h := mustHasher(t, 4)
	r := &flakyReader{
		headReader: &headReader{log: log, atHead: make(chan struct{}), poke: make(chan struct{})},
		fail: func(n int) error {
			if n >= 2 && n <= 6 {
				return Transient(errBroker)
			}
			return nil
		},
	}
	rec := &handled{h: h, got: map[int][]uint64{}}
	acq := newAcquired()
	clk := clocktest.NewFake(time.Unix(0, 0)) // the retries' and commits' clock, not the session's
	sw, err := NewWorker(c, ks, client.Member{ID: "w1"}, r, rec.handle, WorkerOptions{
		Clock:          clk,
		CommitInterval: time.Hour, // never due while the test advances clk
		ReadRetry:      Retry{Delay: time.Second, Max: 4 * time.Second},
		Worker:         []client.WorkerOption{client.OnEvent(acq.event)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if s := sw.Stats(); s != (WorkerStats{}) {
		t.Errorf("Stats before Run = %+v", s)
	}
	errc := make(chan error, 1)
	go func() { errc <- sw.Run(t.Context()) }() // exits on Close
	sid := f.WaitSession(t, ks, "w1")
	for b := range 4 {
		f.Grant(sid, b)
	}
	acq.wait(t, 0, 1, 2, 3)
	for range 5 {
		clk.MustBlockUntilDue(t, 1, 4*time.Second) // a backoff, not the commit ticker
		clk.Advance(4 * time.Second)
	}
	untilHead(t, r.headReader, "every bucket", func() bool {
		for b := range 4 {
			if !slices.Equal(rec.of(b), want(log, h, b, 0)) {
				return false
			}
		}
		return true
	})
	if s := sw.Stats(); s.ReadRetries != 5 || s.Streak != 0 || !errors.Is(s.LastError, errBroker) {
		t.Errorf("Stats = %+v, want 5 retries and no streak", s)
	}
	if held := sw.ClientWorker().Held(); len(held) != 4 {
		t.Errorf("holds %v after the errors, want every bucket", held)
	}
	if err := sw.Close(t.Context()); err != nil {
		t.Errorf("Close = %v", err)
	}
	if err := <-errc; err != nil {
		t.Errorf("Run = %v", err)
	}
}
