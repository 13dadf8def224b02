package store

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestMemberHeld(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	createKeyspace(t, s, "held")
	a, b := newSession(t, s, 10*time.Second), newSession(t, s, 10*time.Second)
	if _, _, err := s.Join(ctx, "held", member("w1"), a.LeaseID(), false); err != nil {
		t.Fatal(err)
	}
	if err := s.MemberHeld(ctx, "held", "w1", a.LeaseID()); err != nil {
		t.Fatalf("held by its session: %v", err)
	}
	if err := s.MemberHeld(ctx, "held", "w2", a.LeaseID()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("no such member: %v, want ErrNotFound", err)
	}
	if _, _, err := s.Join(ctx, "held", member("w1"), b.LeaseID(), true); err != nil {
		t.Fatal(err)
	}
	if err := s.MemberHeld(ctx, "held", "w1", a.LeaseID()); !errors.Is(err, ErrFenced) {
		t.Fatalf("replaced session: %v, want ErrFenced", err)
	}
	if err := s.MemberHeld(ctx, "held", "w1", b.LeaseID()); err != nil {
		t.Fatalf("the replacing session: %v", err)
	}
	if err := s.MemberHeld(ctx, "held", "bad/id", b.LeaseID()); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("bad id: %v, want ErrInvalidName", err)
	}
}

// Checks that queue while a read is in flight share the next read, and
// each gets its own member's answer.
func TestMemberHeldBatches(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	createKeyspace(t, s, "held-batch")
	a, b := newSession(t, s, 10*time.Second), newSession(t, s, 10*time.Second)
	const n = 40
	for i := range n {
		if _, _, err := s.Join(ctx, "held-batch", member(fmt.Sprintf("w%d", i)), a.LeaseID(), false); err != nil {
			t.Fatal(err)
		}
	}
	// Pretend a read is in flight, so that every check queues.
	s.held.mu.Lock()
	s.held.running = true
	s.held.mu.Unlock()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		lease := a.LeaseID()
		if i%2 == 1 {
			lease = b.LeaseID() // not the holder
		}
		wg.Go(func() { errs[i] = s.MemberHeld(ctx, "held-batch", fmt.Sprintf("w%d", i), lease) })
	}
	for queued := 0; queued < n; {
		s.held.mu.Lock()
		queued = len(s.held.queue)
		s.held.mu.Unlock()
		if ctx.Err() != nil {
			t.Fatalf("only %d of %d checks queued", queued, n)
		}
		time.Sleep(time.Millisecond) // polls a condition; the answer does not depend on it
	}
	go s.held.run(s) // the "in-flight read" ends: the queue is read at once
	wg.Wait()
	for i, err := range errs {
		if i%2 == 0 && err != nil {
			t.Errorf("w%d on its session: %v", i, err)
		}
		if i%2 == 1 && !errors.Is(err, ErrFenced) {
			t.Errorf("w%d on another session: %v, want ErrFenced", i, err)
		}
	}
	s.held.mu.Lock()
	reads := s.held.reads
	s.held.mu.Unlock()
	if reads != 1 {
		t.Errorf("%d reads for %d queued checks; want 1", reads, n)
	}
}
