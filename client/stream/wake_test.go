package stream

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/clock/clocktest"
)

// candidates is a source of n candidates at cursors 1..n that records the
// cursors it is asked to read after.
type candidates struct {
	n      uint64
	afters []uint64
}

func (s *candidates) next(_ context.Context, after uint64, limit int) ([]Candidate, error) {
	s.afters = append(s.afters, after)
	var page []Candidate
	for c := after + 1; c <= s.n && len(page) < limit; c++ {
		page = append(page, Candidate{Key: fmt.Appendf(nil, "dest-%d", c), Cursor: c})
	}
	return page, nil
}

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// TestWakerFilteredOutPages is the spin regression: a sender re-read the
// same page forever when its filter dropped every candidate of it. The
// cursor must move past every candidate read, and Run must end.
func TestWakerFilteredOutPages(t *testing.T) {
	src := &candidates{n: 1000}
	fake := clocktest.NewFake(t0)
	w, err := NewWaker(WakeConfig{
		Next: src.next,
		Keep: func([]byte) bool { return false },
		Wake: func(context.Context, []byte) error { t.Error("Wake called for a dropped candidate"); return nil },
		Rate: 1, Page: 7, Clock: fake,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(t.Context()); err != nil {
		t.Fatalf("Run = %v, want nil once the source is exhausted", err)
	}
	if got := w.Cursor(); got != 1000 {
		t.Errorf("Cursor = %d, want 1000", got)
	}
	if want := 1000/7 + 2; len(src.afters) != want { // 143 pages of 7, one of 6, one empty
		t.Errorf("Next called %d times, want %d", len(src.afters), want)
	}
	for i := 1; i < len(src.afters); i++ {
		if src.afters[i] <= src.afters[i-1] {
			t.Fatalf("Next called after %d, then after %d: the cursor did not advance", src.afters[i-1], src.afters[i])
		}
	}
	if fake.Since(t0) != 0 {
		t.Errorf("dropped candidates took %v of fake time, want none", fake.Since(t0))
	}
}

// TestWakerStuckSource: a source that returns candidates not after the
// cursor is an error, not a loop.
func TestWakerStuckSource(t *testing.T) {
	w, err := NewWaker(WakeConfig{
		Next: func(context.Context, uint64, int) ([]Candidate, error) {
			return []Candidate{{Key: []byte("a"), Cursor: 5}}, nil
		},
		Keep: func([]byte) bool { return false },
		Wake: func(context.Context, []byte) error { return nil },
		Rate: 1, After: 5,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(t.Context()); !errors.Is(err, ErrOrder) {
		t.Errorf("Run = %v, want ErrOrder", err)
	}
}

// TestWakerPace: with the fake clock, the wakes of kept candidates come
// 1/Rate apart, the first at once, so N wakes take (N-1)/Rate of fake
// time, however the dropped candidates fall between them.
func TestWakerPace(t *testing.T) {
	const rate = 4 // wakes a second
	interval := time.Second / rate
	src := &candidates{n: 30}
	h := mustHasher(t, 8)
	keep := KeepBuckets(h, 1, 2, 5)
	var want []string
	for c := uint64(1); c <= src.n; c++ {
		if k := fmt.Appendf(nil, "dest-%d", c); keep(k) {
			want = append(want, string(k))
		}
	}
	if len(want) < 3 || len(want) == int(src.n) {
		t.Fatalf("%d of %d candidates kept; pick other buckets", len(want), src.n)
	}
	fake := clocktest.NewFake(t0)
	woke := make(chan string)
	w, err := NewWaker(WakeConfig{
		Next: src.next, Keep: keep,
		Wake: func(_ context.Context, key []byte) error { woke <- string(key); return nil },
		Rate: rate, Page: 4, Clock: fake,
	})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- w.Run(t.Context()) }() // exits when the source is exhausted
	for i, key := range want {
		if got := <-woke; got != key {
			t.Fatalf("wake %d of %q, want %q", i, got, key)
		}
		if got, wantT := fake.Since(t0), time.Duration(i)*interval; got != wantT {
			t.Fatalf("wake %d at %v, want %v", i, got, wantT)
		}
		if i == len(want)-1 {
			break
		}
		fake.MustBlockUntil(t, 1)
		fake.Advance(interval - time.Nanosecond)
		if fake.Waiters() != 1 {
			t.Fatalf("the pace timer fired %v before its interval", time.Nanosecond)
		}
		fake.Advance(time.Nanosecond)
	}
	if err := <-errc; err != nil {
		t.Fatalf("Run = %v", err)
	}
	if got := w.Cursor(); got != src.n {
		t.Errorf("Cursor = %d, want %d", got, src.n)
	}
}

func TestWakerStop(t *testing.T) {
	endless := func(_ context.Context, after uint64, _ int) ([]Candidate, error) {
		return []Candidate{{Key: []byte("k"), Cursor: after + 1}}, nil
	}
	start := func(t *testing.T, ctx context.Context) (*Waker, *clocktest.Fake, chan error) {
		fake := clocktest.NewFake(t0)
		w, err := NewWaker(WakeConfig{
			Next: endless, Keep: func([]byte) bool { return true },
			Wake: func(context.Context, []byte) error { return nil },
			Rate: 1, Clock: fake,
		})
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- w.Run(ctx) }() // exits on Close or ctx's end
		fake.MustBlockUntil(t, 1)          // asleep before its second wake
		return w, fake, errc
	}
	t.Run("Close", func(t *testing.T) {
		w, _, errc := start(t, t.Context())
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; !errors.Is(err, client.ErrClosed) {
			t.Errorf("Run = %v, want ErrClosed", err)
		}
		if err := w.Close(); err != nil {
			t.Errorf("second Close = %v", err)
		}
	})
	t.Run("ctx", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		w, _, errc := start(t, ctx)
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("Run = %v, want context.Canceled", err)
		}
		if got := w.Cursor(); got != 1 {
			t.Errorf("Cursor = %d, want 1: the second candidate was not woken", got)
		}
		w.Close()
	})
	t.Run("Close before Run", func(t *testing.T) {
		w, err := NewWaker(WakeConfig{Next: endless, Keep: func([]byte) bool { return true },
			Wake: func(context.Context, []byte) error { return nil }, Rate: 1})
		if err != nil {
			t.Fatal(err)
		}
		w.Close()
		if err := w.Run(t.Context()); !errors.Is(err, client.ErrClosed) {
			t.Errorf("Run after Close = %v, want ErrClosed", err)
		}
	})
}

func TestNewWakerArgs(t *testing.T) {
	ok := WakeConfig{
		Next: func(context.Context, uint64, int) ([]Candidate, error) { return nil, nil },
		Keep: func([]byte) bool { return true },
		Wake: func(context.Context, []byte) error { return nil },
		Rate: 1,
	}
	for _, tc := range []struct {
		arg string
		mod func(*WakeConfig)
	}{
		{"WakeConfig.Next", func(c *WakeConfig) { c.Next = nil }},
		{"WakeConfig.Keep", func(c *WakeConfig) { c.Keep = nil }},
		{"WakeConfig.Wake", func(c *WakeConfig) { c.Wake = nil }},
		{"WakeConfig.Rate", func(c *WakeConfig) { c.Rate = 0 }},
		{"WakeConfig.Page", func(c *WakeConfig) { c.Page = -1 }},
	} {
		cfg := ok
		tc.mod(&cfg)
		var ae *client.ArgError
		if _, err := NewWaker(cfg); !errors.As(err, &ae) || ae.Arg != tc.arg || !errors.Is(err, client.ErrInvalid) {
			t.Errorf("NewWaker with bad %s = %v, want an *ArgError naming it", tc.arg, err)
		}
	}
}
