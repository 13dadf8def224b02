package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"google.golang.org/protobuf/types/known/durationpb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/clock"
)

type routerOptions struct {
	clock clock.Clock
	log   *slog.Logger
}

// Router answers "who owns this key" from a local copy of a keyspace's
// map, in tens of nanoseconds and without allocating, and keeps that copy
// current in the background. Its methods are safe for concurrent use.
//
// A Router follows the map with the WatchMap stream, reconnecting with
// capped exponential backoff and jitter, and falls back to GetMap long
// polls if the stream keeps failing. While it cannot reach the server it
// keeps answering from the last map it has.
type Router struct {
	c        *Client
	keyspace string
	clock    clock.Clock
	log      *slog.Logger

	cur atomic.Pointer[routing]

	cancel    context.CancelFunc
	done      chan struct{} // closed when the follow goroutine exits
	closeOnce sync.Once
}

// NewRouter fetches the current map of keyspace (GetMap) and returns a
// Router that keeps it current from one goroutine of its own, until Close
// (or the Client's Close). A keyspace that has no map yet (no member has
// joined) is fine: every key is unassigned until the first map arrives. ctx bounds only the first fetch. It returns an
// error wrapping ErrInvalid for a bad keyspace name, ErrNotFound if the
// keyspace does not exist, or another error of the first fetch.
func NewRouter(ctx context.Context, c *Client, keyspace string, opts ...RouterOption) (*Router, error) {
	if err := validName("NewRouter", "keyspace name", keyspace); err != nil {
		return nil, err
	}
	o := routerOptions{clock: c.opts.clock, log: c.opts.log}
	for _, opt := range opts {
		if opt != nil {
			opt.applyRouter(&o)
		}
	}
	resp, err := call(ctx, c, mapAPI.GetMap, &keyshardv1.GetMapRequest{Keyspace: keyspace, Wait: durationpb.New(0)})
	if err != nil {
		return nil, fmt.Errorf("router for keyspace %q: get map: %w", keyspace, err)
	}
	rt, err := routingFromProto(resp.GetMap())
	if err != nil {
		return nil, fmt.Errorf("router for keyspace %q: the server sent a bad map: %w", keyspace, err)
	}
	r := &Router{c: c, keyspace: keyspace, clock: o.clock, log: o.log.With("keyspace", keyspace), done: make(chan struct{})}
	r.cur.Store(rt)
	runCtx, cancel := context.WithCancel(c.ctx)
	r.cancel = cancel
	go func() { // exits when Close or the Client's Close cancels runCtx
		defer close(r.done)
		r.follow(runCtx)
	}()
	return r, nil
}

func (r *Router) follow(ctx context.Context) {
	f := follower[keyshardv1.Map]{
		clock: r.clock,
		log:   r.log,
		what:  "map",
		watch: func(ctx context.Context, yield func(*keyshardv1.Map)) error {
			req := &keyshardv1.WatchMapRequest{Keyspace: r.keyspace, SinceEpoch: r.cur.Load().epoch}
			return stream(ctx, r.c, mapAPI.WatchMap, req, yield)
		},
		poll: func(ctx context.Context) (*keyshardv1.Map, bool, error) {
			req := &keyshardv1.GetMapRequest{Keyspace: r.keyspace, SinceEpoch: r.cur.Load().epoch, Wait: durationpb.New(pollWait)}
			resp, err := callWithin(ctx, r.c, mapAPI.GetMap, req, budget{wait: pollWait})
			if err != nil {
				return nil, false, err
			}
			return resp.GetMap(), resp.GetChanged(), nil
		},
		apply: r.apply,
		fatal: func(err error) bool { return errors.Is(err, ErrClosed) },
	}
	_ = f.run(ctx) // only ErrClosed, when the Client closed: the Router stops following
}

// apply installs m if it is newer than the current map. Only the follow
// goroutine calls it.
func (r *Router) apply(m *keyshardv1.Map) {
	old := r.cur.Load()
	if m.GetEpoch() <= old.epoch {
		return
	}
	rt, err := routingFromProto(m)
	if err != nil {
		r.log.Error("keyshard: ignoring a bad map from the server", "epoch", m.GetEpoch(), "err", err)
		return
	}
	if old.buckets != 0 && (rt.buckets != old.buckets || rt.hash != old.hash) {
		r.log.Error("keyshard: ignoring a map whose bucket count or hash changed; they never change in a keyspace",
			"epoch", rt.epoch, "buckets", rt.buckets, "was_buckets", old.buckets, "hash", rt.hash, "was_hash", old.hash)
		return
	}
	r.cur.Store(rt)
	close(old.next)
}

// Owner returns the member that owns key under the current map and true,
// or "" and false if the key's bucket is unassigned. It does not allocate.
func (r *Router) Owner(key []byte) (member string, ok bool) {
	return r.cur.Load().table.Owner(key)
}

// OwnerString is Owner for a string key.
func (r *Router) OwnerString(key string) (member string, ok bool) {
	return r.cur.Load().table.OwnerString(key)
}

// Bucket returns the bucket of key, or -1 before the keyspace's first map
// (when the Router does not know the bucket count yet). The bucket of a
// key never changes.
func (r *Router) Bucket(key []byte) int {
	rt := r.cur.Load()
	if rt.buckets == 0 {
		return -1
	}
	return rt.hasher.Bucket(key)
}

// BucketOwner returns the member that owns bucket b under the current map
// and true, or "" and false if b is unassigned or out of range.
func (r *Router) BucketOwner(b int) (member string, ok bool) {
	return r.cur.Load().table.BucketOwner(b)
}

// Address returns the address member joined with, or "" if the current
// map does not list member.
func (r *Router) Address(member string) string {
	return r.cur.Load().addrs[member]
}

// Epoch returns the epoch of the current map (0 before the keyspace's
// first map, while every key is unassigned).
func (r *Router) Epoch() uint64 { return r.cur.Load().epoch }

// Keyspace returns the keyspace the Router follows.
func (r *Router) Keyspace() string { return r.keyspace }

// WaitEpoch blocks until the Router's map has reached epoch e (for
// example the epoch of a WrongOwnerError), ctx is done (returning
// ctx.Err()), or the Router is closed (returning ErrClosed).
func (r *Router) WaitEpoch(ctx context.Context, e uint64) error {
	for {
		rt := r.cur.Load()
		if rt.epoch >= e {
			return nil
		}
		select {
		case <-rt.next:
		case <-ctx.Done():
			return ctx.Err()
		case <-r.done:
			return ErrClosed
		}
	}
}

// Close stops following the map and waits for the Router's goroutine to
// exit. Lookups keep answering from the last map. Close is idempotent and
// returns nil.
func (r *Router) Close() error {
	r.closeOnce.Do(r.cancel)
	<-r.done
	return nil
}

// changed returns a channel closed when the map changes from the current
// one.
func (r *Router) changed() <-chan struct{} { return r.cur.Load().next }
