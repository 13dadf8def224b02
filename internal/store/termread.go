package store

import (
	"context"
	"sync"
)

// termReads shares the linearizable reads that confirm KeepAliveOnce's
// renewals (confirmingTerm) among the calls waiting for one at the same
// time: a tenant pool's members, a join storm's first keep-alives and the
// leader's term lease each made one read per renewal, as many reads as
// renewals.
//
// A read confirms a renewal only if it was sent after the renewal was
// answered: an etcd leader confirms a linearizable read with a quorum
// when the read arrives, so a read sent earlier may have been confirmed
// before the leader was deposed and answered after it renewed from its
// stale lessor (see confirmTerm). So a caller never joins a read already
// sent: it waits for the next one, which starts once the read in flight
// has ended. At most one read is in flight and one waits, however many
// renewals there are; a caller waits at most for the read in flight and
// its own.
//
// A read runs on a context of its own, canceled once every caller
// waiting for it has left (its context ended), so an unreachable etcd
// holds no read past its last caller. The read's goroutine is owned by
// termReads: it exits when the read ends, after starting the next read if
// callers wait for one.
type termReads struct {
	read func(ctx context.Context) (uint64, error)
	base context.Context // the Store's: closing it ends every read

	mu     sync.Mutex
	sent   *termRead // the read in flight; nil: none
	queued *termRead // the read callers join, sent once sent ends; nil: none
}

// termRead is one shared read and the callers waiting for it.
type termRead struct {
	done    chan struct{} // closed once term and err are set
	term    uint64
	err     error
	waiters int
	cancel  context.CancelFunc // set once sent
}

// confirm returns the raft term of a linearizable read sent after confirm
// was called, shared with the other callers waiting at the same time.
func (t *termReads) confirm(ctx context.Context) (uint64, error) {
	t.mu.Lock()
	r := t.queued
	if r == nil {
		r = &termRead{done: make(chan struct{})}
		t.queued = r
	}
	r.waiters++
	if t.sent == nil {
		t.sendLocked()
	}
	t.mu.Unlock()
	select {
	case <-r.done:
		return r.term, r.err
	case <-ctx.Done():
		t.mu.Lock()
		r.waiters--
		if r.waiters == 0 {
			if r == t.queued {
				t.queued = nil // never sent: nobody wants it any more
			} else if r.cancel != nil {
				r.cancel()
			}
		}
		t.mu.Unlock()
		return 0, ctx.Err()
	}
}

// sendLocked sends the queued read; t.mu is held, t.sent is nil and
// t.queued is not.
func (t *termReads) sendLocked() {
	r := t.queued
	t.queued, t.sent = nil, r
	ctx, cancel := context.WithCancel(t.base)
	r.cancel = cancel
	go func() { // exits when the read ends
		r.term, r.err = t.read(ctx)
		cancel()
		close(r.done)
		t.mu.Lock()
		t.sent = nil
		if t.queued != nil {
			t.sendLocked()
		}
		t.mu.Unlock()
	}()
}
