package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keyshard/keyshard/internal/shard"
)

// renewer renews leases on request over one LeaseKeepAlive stream that
// every caller shares. clientv3's KeepAliveOnce opens a gRPC stream for
// each renewal, and at thousands of member keep-alives a second opening
// and closing those streams was most of what a keep-alive cost, in
// keyshard serve and in etcd alike.
//
// etcd answers a stream's requests one at a time, in the order they were
// sent (v3rpc's LeaseServer.leaseKeepAlive), so a stream's waiters form a
// queue: the first answer is the first waiter's. An answer for another
// lease than the queue's head breaks the stream, and a broken stream fails
// all its waiters, who retry on a new one.
type renewer struct {
	s      *Store
	remote pb.LeaseClient

	mu  sync.Mutex
	cur *renewStream // nil: none open

	opened atomic.Int64 // streams opened, for tests
}

// renewStream is one open LeaseKeepAlive stream. Its receive goroutine
// (started by open) owns the reading side and exits when the stream
// ends; the stream ends when it breaks, when the renewer drops it, or
// when the Store closes (its context derives from the client's).
type renewStream struct {
	stream pb.Lease_LeaseKeepAliveClient
	cancel context.CancelFunc

	mu      sync.Mutex // guards stream.Send, pending and err
	pending []renewWaiter
	err     error // set once the stream is broken; pending is empty then
}

type renewWaiter struct {
	id shard.LeaseID
	ch chan renewAnswer // buffered: the receiver never blocks on a waiter that left
}

type renewAnswer struct {
	ttl  int64  // etcd's TTL in seconds; <= 0: the lease is gone
	term uint64 // the raft term of the etcd member that answered
	err  error
}

// errRenewStream is the cause a waiter sees when its stream broke before
// its answer came; renew retries on a new stream.
var errRenewStream = errors.New("lease keep-alive stream ended")

func newRenewer(s *Store) *renewer {
	return &renewer{s: s, remote: clientv3.RetryLeaseClient(s.client)}
}

// renew renews lease id once and returns etcd's answer, retrying on a new
// stream when one breaks, until ctx ends or the Store closes: the way
// clientv3's KeepAliveOnce retries. The answer is not confirmed yet: see
// confirmTerm.
func (r *renewer) renew(ctx context.Context, id shard.LeaseID) (renewAnswer, error) {
	for failures := 0; ; failures++ {
		if failures > 0 && !sleepCtx(ctx, backoff(failures)) {
			return renewAnswer{}, ctx.Err()
		}
		if err := ctx.Err(); err != nil {
			return renewAnswer{}, err
		}
		if r.s.closed() {
			return renewAnswer{}, ErrClosed
		}
		rs, err := r.stream()
		if err != nil {
			if ctx.Err() != nil || r.s.closed() {
				return renewAnswer{}, err
			}
			continue
		}
		ch, err := rs.send(id)
		if err != nil {
			r.drop(rs)
			continue
		}
		select {
		case a := <-ch:
			if errors.Is(a.err, errRenewStream) {
				r.drop(rs)
				continue
			}
			return a, a.err
		case <-ctx.Done():
			// Our own deadline passed with no answer: the stream may hang
			// (a stuck connection), so the next caller starts a new one.
			// A caller that merely went away leaves it open.
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				r.drop(rs)
			}
			return renewAnswer{}, ctx.Err()
		}
	}
}

// stream returns the open stream, opening one if there is none.
func (r *renewer) stream() (*renewStream, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil {
		return r.cur, nil
	}
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(r.s.client.Ctx()))
	st, err := r.remote.LeaseKeepAlive(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	r.opened.Add(1)
	rs := &renewStream{stream: st, cancel: cancel}
	go rs.receive() // exits when the stream ends
	r.cur = rs
	return rs, nil
}

// drop forgets rs if it is the open stream and ends it; its waiters are
// failed with errRenewStream and retry on the next one.
func (r *renewer) drop(rs *renewStream) {
	r.mu.Lock()
	if r.cur == rs {
		r.cur = nil
	}
	r.mu.Unlock()
	rs.cancel()
}

// send queues a waiter for id and sends the request, in that order under
// one lock, so the queue's order is the order etcd receives them in.
func (rs *renewStream) send(id shard.LeaseID) (<-chan renewAnswer, error) {
	ch := make(chan renewAnswer, 1)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.err != nil {
		return nil, rs.err
	}
	rs.pending = append(rs.pending, renewWaiter{id: id, ch: ch})
	if err := rs.stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(id)}); err != nil {
		rs.failLocked(fmt.Errorf("%w: send: %w", errRenewStream, err))
		return nil, rs.err
	}
	return ch, nil
}

// receive hands each answer to the waiter at the head of the queue, until
// the stream ends; then it fails whoever still waits.
func (rs *renewStream) receive() {
	defer rs.cancel()
	for {
		resp, err := rs.stream.Recv()
		rs.mu.Lock()
		if err != nil {
			rs.failLocked(fmt.Errorf("%w: %w", errRenewStream, err))
			rs.mu.Unlock()
			return
		}
		if len(rs.pending) == 0 || int64(rs.pending[0].id) != resp.ID {
			rs.failLocked(fmt.Errorf("%w: an answer for lease %x out of order", errRenewStream, resp.ID))
			rs.mu.Unlock()
			return
		}
		w := rs.pending[0]
		rs.pending[0] = renewWaiter{}
		rs.pending = rs.pending[1:]
		rs.mu.Unlock()
		w.ch <- renewAnswer{ttl: resp.TTL, term: resp.GetHeader().GetRaftTerm()}
	}
}

func (rs *renewStream) failLocked(err error) {
	if rs.err == nil {
		rs.err = err
	}
	for _, w := range rs.pending {
		w.ch <- renewAnswer{err: rs.err}
	}
	rs.pending = nil
}

// renewMany renews each of ids, sending them back to back on the shared
// stream before waiting for any answer, and returns etcd's answer for each
// (ttl <= 0: the lease is gone) or why it has none. A renewal whose stream
// broke is retried on its own, the way renew does. The answers are not
// confirmed yet: see confirmTerm.
func (r *renewer) renewMany(ctx context.Context, ids []shard.LeaseID) ([]renewAnswer, []error) {
	answers, errs := make([]renewAnswer, len(ids)), make([]error, len(ids))
	chs := make([]<-chan renewAnswer, len(ids))
	rs, err := r.stream()
	if err == nil {
		for i, id := range ids {
			if chs[i], err = rs.send(id); err != nil {
				r.drop(rs)
				break
			}
		}
	}
	for i, id := range ids {
		if chs[i] != nil {
			select {
			case a := <-chs[i]:
				if !errors.Is(a.err, errRenewStream) {
					answers[i], errs[i] = a, a.err
					continue
				}
				r.drop(rs)
			case <-ctx.Done():
				if errors.Is(ctx.Err(), context.DeadlineExceeded) {
					r.drop(rs)
				}
				errs[i] = ctx.Err()
				continue
			}
		}
		answers[i], errs[i] = r.renew(ctx, id)
	}
	return answers, errs
}

// confirmTerm says whether a renewal that etcd answered at raft term
// renewed stands, given confirmed: the term of a linearizable request
// answered after it. It stands when the terms are equal: the term's one
// leader was still confirmed by a quorum after it renewed the lease.
//
// Without this, an etcd leader that was paused (SIGSTOP, a VM stall) and
// resumes answers the keep-alives queued for it from its own lessor, for
// a moment, before it learns that the others elected a new leader: it
// sees itself active (a raft tick came just now), so it does not check
// its leadership first. The lease it renewed is not renewed on the new
// leader, which may expire it while the member believes it has a TTL
// left, and hand its buckets on while it still acts on them. A renewal
// that fails this check is answered ErrUnavailable, and the member
// renews again.
func confirmTerm(renewed, confirmed uint64) error {
	if renewed == confirmed {
		return nil
	}
	return fmt.Errorf("%w: etcd's leader changed while it renewed the lease (renewed at raft term %d, confirmed at %d), so the renewal may not have reached the new leader; renew again", ErrUnavailable, renewed, confirmed)
}
