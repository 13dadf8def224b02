package keyshardtest_test

import (
	"testing"
	"time"

	"github.com/keyshard/keyshard/keyshardtest"
)

func TestFakeClock(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := keyshardtest.NewFakeClock(start)
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
