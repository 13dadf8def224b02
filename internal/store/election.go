package store

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/keyshard/keyshard/internal/shard"
)

// Fence is what every leader write is guarded by: the leader's election key
// and its CreateRevision. It stays valid while that key exists unchanged;
// it is gone once the leader resigns or its session's lease is deleted.
type Fence struct {
	LeaderKey string
	LeaderRev int64
}

// Election is the serve replicas' leader election on ElectionPrefix, one
// per replica, bound to the replica's Session. It is not safe for
// concurrent Campaign and Resign calls.
type Election struct {
	s    *Store
	sess *Session
	e    *concurrency.Election
}

// NewElection returns an election for sess. It does no IO.
func (s *Store) NewElection(sess *Session) *Election {
	return &Election{s: s, sess: sess, e: concurrency.NewElection(sess.cs, ElectionPrefix)}
}

// Campaign blocks until this replica is leader, ctx is done, or the
// session ends, and returns the fence for its writes. id is published as
// the leader's id (Leader, Observe). A replica whose session ends loses
// leadership: watch Session.Done.
func (el *Election) Campaign(ctx context.Context, id string) (Fence, error) {
	if el.s.closed() {
		return Fence{}, errClosed("campaign")
	}
	// concurrency.Election.Campaign waits on a watch that does not end
	// when the session does; bound it by the session too.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(el.s.client.Ctx(), cancel)
	defer stop()
	go func() { // exits when Campaign returns or the session ends
		select {
		case <-el.sess.Done():
			cancel()
		case <-cctx.Done():
		}
	}()
	if err := el.e.Campaign(cctx, id); err != nil {
		select {
		case <-el.sess.Done():
			return Fence{}, fmt.Errorf("store: campaign: session ended: %w", ErrLeaseNotFound)
		default:
		}
		if ctx.Err() != nil {
			return Fence{}, fmt.Errorf("store: campaign: %w", ctx.Err())
		}
		return Fence{}, el.s.err("campaign", err)
	}
	return Fence{LeaderKey: el.e.Key(), LeaderRev: el.e.Rev()}, nil
}

// Resign gives up leadership if held, so another campaigner can win at
// once. Fenced writes made with the old Fence fail with ErrFenced after.
func (el *Election) Resign(ctx context.Context) error {
	return el.s.err("resign", el.e.Resign(ctx))
}

// Leader returns the current leader's id, or ErrNotFound if nobody leads.
func (s *Store) Leader(ctx context.Context) (string, error) {
	if s.closed() {
		return "", errClosed("get leader")
	}
	resp, err := s.client.Get(ctx, ElectionPrefix+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return "", s.err("get leader", err)
	}
	if len(resp.Kvs) == 0 {
		return "", fmt.Errorf("store: get leader: %w", ErrNotFound)
	}
	return string(resp.Kvs[0].Value), nil
}

// Observe reports the current leader's id ("" while nobody leads) now and
// after every change, so that replicas that do not lead can tell clients
// who does. Values are deduplicated; a slow reader sees only the latest.
// Observe starts one goroutine that owns the channel: it exits and closes
// the channel when ctx is done or the Store is closed.
func (s *Store) Observe(ctx context.Context) <-chan string {
	out := make(chan string, 1)
	go s.observe(ctx, out) // exits when ctx is done or the Store is closed
	return out
}

func (s *Store) observe(ctx context.Context, out chan string) {
	defer close(out)
	last, sent := "", false
	publish := func(id string) {
		if sent && id == last {
			return
		}
		select { // keep only the newest value in the buffer
		case <-out:
		default:
		}
		out <- id
		last, sent = id, true
	}
	failures := 0
	for {
		if ctx.Err() != nil || s.closed() {
			return
		}
		if !sleepCtx(ctx, backoff(failures)) {
			return
		}
		resp, err := s.client.Get(ctx, ElectionPrefix+"/", clientv3.WithFirstCreate()...)
		if err != nil {
			failures++
			continue
		}
		id := ""
		if len(resp.Kvs) > 0 {
			id = string(resp.Kvs[0].Value)
		}
		publish(id)
		// Wait for any change under the prefix, then read again.
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := s.client.Watch(wctx, ElectionPrefix+"/", clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		changed := false
		for wr := range wch {
			if wr.Err() != nil {
				break
			}
			if len(wr.Events) > 0 {
				changed = true
				break
			}
		}
		cancel()
		if changed {
			failures = 0
		} else {
			failures++
		}
	}
}

// ClearElection revokes the lease of every campaigner's key, ending any
// leadership. For a replica that starts on an embedded etcd, which no
// other replica can share: a key left by its own previous, killed run
// would otherwise hold the election until that lease expires. It returns
// how many sessions it ended.
func (s *Store) ClearElection(ctx context.Context) (int, error) {
	if s.closed() {
		return 0, errClosed("clear election")
	}
	resp, err := s.client.Get(ctx, ElectionPrefix+"/", clientv3.WithPrefix())
	if err != nil {
		return 0, s.err("clear election", err)
	}
	n := 0
	for _, kv := range resp.Kvs {
		if kv.Lease == 0 {
			continue
		}
		if err := s.Revoke(ctx, shard.LeaseID(kv.Lease)); err != nil && !errors.Is(err, ErrLeaseNotFound) {
			return n, err
		}
		n++
	}
	return n, nil
}
