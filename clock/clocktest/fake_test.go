package clocktest_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/keyshard/keyshard/clock/clocktest"
)

func TestFakeClock(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := clocktest.NewFake(start)
	timer := c.NewTimer(10 * time.Second)
	ticker := c.NewTicker(3 * time.Second)
	fired := make(chan time.Time, 1)
	c.AfterFunc(5*time.Second, func() { fired <- c.Now() })
	if c.Waiters() != 3 {
		t.Fatalf("waiters = %d", c.Waiters())
	}
	c.Advance(4 * time.Second)
	select {
	case got := <-ticker.C():
		if got != start.Add(3*time.Second) {
			t.Fatalf("tick at %v", got)
		}
	default:
		t.Fatal("ticker did not tick")
	}
	select {
	case <-timer.C():
		t.Fatal("timer fired early")
	default:
	}
	c.Advance(6 * time.Second)
	if got := <-timer.C(); got != start.Add(10*time.Second) {
		t.Fatalf("timer fired at %v", got)
	}
	if got := <-fired; got.Before(start.Add(5 * time.Second)) {
		t.Fatalf("AfterFunc ran at %v", got)
	}
	if timer.Reset(time.Second) {
		t.Fatal("Reset of a fired timer returned true")
	}
	if c.Waiters() != 2 {
		t.Fatalf("waiters after reset = %d, want the timer and the ticker", c.Waiters())
	}
	if !timer.Stop() {
		t.Fatal("Stop of a pending timer returned false")
	}
	ticker.Stop()
	if c.Waiters() != 0 {
		t.Fatalf("waiters = %d after stopping everything", c.Waiters())
	}
	done := make(chan struct{})
	go func() { c.BlockUntil(1); close(done) }() // exits once a timer is added below
	c.NewTimer(time.Second)
	<-done
	if c.Since(start) != 10*time.Second {
		t.Fatalf("Since = %v", c.Since(start))
	}
}

// TestBlockUntilContext: the wait ends with an error when ctx does, and
// returns nil once enough timers wait.
func TestBlockUntilContext(t *testing.T) {
	c := clocktest.NewFake(time.Unix(0, 0))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.BlockUntilContext(ctx, 1); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "0 timers waiting, want 1") {
		t.Fatalf("BlockUntilContext with no timers and a cancelled ctx = %v", err)
	}
	c.NewTimer(time.Second)
	if err := c.BlockUntilContext(ctx, 1); err != nil {
		t.Fatalf("BlockUntilContext with a timer waiting = %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- c.BlockUntilContext(context.Background(), 2) }() // exits once the ticker below is added
	c.NewTicker(time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestBlockUntilDue: only timers due within d count; a longer one does
// not end the wait, a shorter one added later does.
func TestBlockUntilDue(t *testing.T) {
	c := clocktest.NewFake(time.Unix(0, 0))
	long := c.NewTimer(9 * time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.BlockUntilDue(ctx, 1, 3*time.Second); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "0 timers due within 3s, want 1") {
		t.Fatalf("BlockUntilDue with only a 9s timer = %v", err)
	}
	c.Advance(6 * time.Second) // the 9s timer is now due within 3s
	if err := c.BlockUntilDue(ctx, 1, 3*time.Second); err != nil {
		t.Fatalf("BlockUntilDue with the timer 3s away = %v", err)
	}
	long.Stop()
	done := make(chan error, 1)
	go func() { done <- c.BlockUntilDue(context.Background(), 1, 3*time.Second) }() // exits once the short timer below is added
	c.NewTimer(10 * time.Second)
	c.NewTimer(2 * time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
