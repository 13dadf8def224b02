package store

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keyshard/keyshard/internal/shard"
)

// MemberHeld checks that member id's record in keyspace ks is held by
// session lease: what a keep-alive of an active member confirms after its
// renewal, so that a session that was replaced or has ended never counts
// a later renewal as its own (see Activate, which does the same for a
// pending member and also activates it).
//
// Concurrent checks are read together: while one read is in flight the
// checks that arrive wait, and the next read takes all of them (up to
// the Store's operations per transaction) in one linearizable
// transaction, which compares each record's lease without decoding it. A check is never answered by a read
// that started before it was asked. Under load this makes one etcd read
// serve many keep-alives without a timer; alone, a check costs one read.
//
// Errors: ErrNotFound (no member record), ErrFenced (the id is held by
// another session), ErrInvalidName, ErrUnavailable, ctx's error.
func (s *Store) MemberHeld(ctx context.Context, ks, id string, lease shard.LeaseID) error {
	if s.closed() {
		return errClosed("check member")
	}
	if err := checkNames(ks, id); err != nil {
		return err
	}
	c := &heldCheck{key: MemberKey(ks, id), ks: ks, id: id, lease: lease, done: make(chan error, 1)}
	s.held.add(s, c)
	select {
	case err := <-c.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// heldChecks is MemberHeld's queue. Its reader goroutine runs while the
// queue is not empty and exits when it is.
type heldChecks struct {
	mu      sync.Mutex
	queue   []*heldCheck
	running bool

	reads int64 // transactions made, for tests (under mu)
}

type heldCheck struct {
	key, ks, id string
	lease       shard.LeaseID
	done        chan error // buffered: answered once, read or not
}

// heldReadTimeout bounds one batched read; a caller with a shorter
// deadline stops waiting on its own.
const heldReadTimeout = 10 * time.Second

func (h *heldChecks) add(s *Store, c *heldCheck) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.queue = append(h.queue, c)
	if !h.running {
		h.running = true
		go h.run(s) // exits when the queue is empty
	}
}

func (h *heldChecks) run(s *Store) {
	for {
		h.mu.Lock()
		n := min(len(h.queue), s.maxOps)
		if n == 0 {
			h.running = false
			h.mu.Unlock()
			return
		}
		batch := h.queue[:n:n]
		h.queue = h.queue[n:]
		if len(h.queue) == 0 {
			h.queue = nil
		}
		h.reads++
		h.mu.Unlock()
		h.read(s, batch)
	}
}

func (h *heldChecks) read(s *Store, batch []*heldCheck) {
	ops := make([]clientv3.Op, len(batch))
	for i, c := range batch {
		ops[i] = clientv3.OpGet(c.key) // not WithKeysOnly: etcd then leaves the lease out
	}
	ctx, cancel := context.WithTimeout(s.client.Ctx(), heldReadTimeout)
	defer cancel()
	resp, err := s.client.Txn(ctx).Then(ops...).Commit()
	for i, c := range batch {
		op := fmt.Sprintf("check member %s/%s", c.ks, c.id)
		switch {
		case err != nil:
			c.done <- s.err(op, err)
		case len(resp.Responses[i].GetResponseRange().Kvs) == 0:
			c.done <- fmt.Errorf("store: %s: member %q: %w", op, c.id, ErrNotFound)
		default:
			if held := shard.LeaseID(resp.Responses[i].GetResponseRange().Kvs[0].Lease); held != c.lease {
				c.done <- fmt.Errorf("store: %s: %w: member id %q is now held by session %v, not %v", op, ErrFenced, c.id, held, c.lease)
			} else {
				c.done <- nil
			}
		}
	}
}
