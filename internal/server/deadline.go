package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/keyshard/keyshard/internal/store"
)

// errStoreDeadline: a member call's store operation took longer than its
// deadline and was abandoned.
var errStoreDeadline = errors.New("etcd did not answer in time (its leader may have just changed)")

// within runs f with a context that is also cancelled, with cause, after d
// by s's clock. It reports whether that deadline ended f (and not ctx or f
// itself).
func (s *Server) within(ctx context.Context, d time.Duration, cause error, f func(context.Context) error) (timedOut bool, err error) {
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	t := s.clock.AfterFunc(d, func() { cancel(cause) })
	defer t.Stop()
	err = f(wctx)
	return err != nil && ctx.Err() == nil && errors.Is(context.Cause(wctx), cause), err
}

// memberStore runs f, the store operations of a member call (Join,
// KeepAlive, Release, Leave) in keyspace ks, bounded by the same deadline
// as the leader's writes (writeDeadline of the keyspace's lease TTL). A
// write sent to etcd while its leader dies otherwise waits for etcd's
// whole request timeout (7 s): a release stuck that long leaves its
// buckets unserved, and a keep-alive stuck that long fences its worker.
// Within the deadline, f is tried in three attempts of a third of it: the etcd
// client sends each request over one of its connections, and one to a
// paused etcd member hangs while the others answer, so a stuck attempt is
// abandoned for another. (Every member call's store operations are safe
// to repeat: they are idempotent or compare-and-set.) Past the deadline
// the call answers Unavailable, and the member retries, through another
// replica if it has several.
func (s *Server) memberStore(ctx context.Context, ks string, f func(context.Context) error) error {
	var d time.Duration
	s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		d = memberDeadline(snap.Keyspaces[ks])
	})
	return s.memberAttempts(ctx, d, func(share time.Duration) (bool, error) {
		return s.within(ctx, share, errStoreDeadline, f)
	})
}

// memberDeadline is the deadline of a member call's store operations in
// keyspace k (nil: unknown).
func memberDeadline(k *store.KeyspaceState) time.Duration {
	if k != nil && k.Config.Exists() && k.Config.Value.LeaseTTL > 0 {
		return writeDeadline(k.Config.Value.LeaseTTL)
	}
	return maxWriteDeadline
}

// memberStoreWithin is memberStore for an f that bounds its own wait: it
// answers within the time it is given, with an error that wraps
// context.DeadlineExceeded if the store has not answered by then (as
// store.RenewMember does), so that no context and timer are made per
// attempt. The keep-alive of an active member, thousands a second at
// scale, goes this way. d is the whole deadline (memberDeadline).
func (s *Server) memberStoreWithin(ctx context.Context, d time.Duration, f func(within time.Duration) error) error {
	return s.memberAttempts(ctx, d, func(share time.Duration) (bool, error) {
		err := f(share)
		return err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded), err
	})
}

// memberAttempts runs the attempts of memberStore's operation within d:
// attempt is given its share of it and reports whether that ended it.
func (s *Server) memberAttempts(ctx context.Context, d time.Duration, attempt func(share time.Duration) (timedOut bool, err error)) error {
	start := s.clock.Now()
	for n := memberAttempts; n > 0; n-- {
		left := d - s.clock.Since(start)
		if left <= 0 {
			break
		}
		// This attempt gets an equal share of what is left.
		timedOut, err := attempt(left / time.Duration(n))
		if !timedOut {
			return err
		}
	}
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%w: no answer within %v; retry, through another replica if you have one", errStoreDeadline, d))
}

// memberAttempts is how many attempts a member call's store operation
// gets within its deadline.
const memberAttempts = 3
