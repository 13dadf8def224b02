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
// Create it with NewRouter, which does no IO. Start it with Start, which
// returns once the Router has the keyspace's map and keeps it current from
// a goroutine of its own until Close; or call Run, which blocks, and wait
// for the map with WaitReady. Close it when done: Close stops following
// and waits for the Router's goroutines.
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

	cur   atomic.Pointer[routing]
	ready chan struct{} // closed once the first map is loaded
	life  *lifecycle
	own   sync.WaitGroup // Start's goroutine

	mu      sync.Mutex
	lastErr error // why the newest fetch failed, before the first map
	runErr  error // what Run returned, set before life.done closes
}

// NewRouter returns a Router for keyspace. It does no IO and starts
// nothing: call Start, or Run. It returns an *ArgError (wrapping
// ErrInvalid) for a nil Client or a bad keyspace name; a keyspace that
// does not exist is found out by Start and Run.
func NewRouter(c *Client, keyspace string, opts ...RouterOption) (*Router, error) {
	if c == nil {
		return nil, argError("NewRouter", "client", "is nil; create one with Dial")
	}
	if err := validName("NewRouter", "keyspace name", keyspace); err != nil {
		return nil, err
	}
	o := routerOptions{clock: c.opts.clock, log: c.opts.log}
	for _, opt := range opts {
		if opt != nil {
			opt.applyRouter(&o)
		}
	}
	r := &Router{
		c: c, keyspace: keyspace, clock: o.clock, log: o.log.With("keyspace", keyspace),
		ready: make(chan struct{}),
		life:  newLifecycle("Router"),
	}
	r.cur.Store(emptyRouting())
	return r, nil
}

// Start runs the Router on a goroutine of its own and returns once it has
// the keyspace's map (see WaitReady). The goroutine keeps the map current
// until Close or the Client's Close; ctx bounds only the wait for the
// first map. A keyspace that has no map yet (no member has joined) is
// fine: every key is unassigned until the first map arrives.
//
// If ctx ends first, or the first fetch fails for good, Start closes the
// Router and returns the error: wrapping ErrNotFound if the keyspace does
// not exist, ErrUnauthenticated or ErrPermissionDenied if the token is
// refused, or ctx's error (and the last failed fetch's) if the server
// could not be reached in time. Start or Run may be called once.
func (r *Router) Start(ctx context.Context) error {
	runCtx, end, err := r.life.begin(context.Background(), r.c)
	if err != nil {
		return err
	}
	r.own.Go(func() { // exits when Close or the Client's Close cancels runCtx, or the first fetch fails for good
		_ = r.run(context.Background(), runCtx, end)
	})
	if err := r.WaitReady(ctx); err != nil {
		r.Close()
		return err
	}
	return nil
}

// Run fetches the keyspace's map and keeps it current until ctx ends
// (returning ctx.Err()), Close (returning nil) or the Client's Close
// (returning ErrClosed). Failed fetches are retried with backoff; Run
// returns early only with an error that retrying cannot fix, wrapping
// ErrNotFound (no such keyspace), ErrUnauthenticated or
// ErrPermissionDenied. Use WaitReady to wait for the first map. Run or
// Start may be called once (again: an error wrapping ErrInvalid).
func (r *Router) Run(ctx context.Context) error {
	runCtx, end, err := r.life.begin(ctx, r.c)
	if err != nil {
		return err
	}
	return r.run(ctx, runCtx, end)
}

// run is the body of Run and Start: parent is the caller's context,
// runCtx Run's own.
func (r *Router) run(parent, runCtx context.Context, end func()) error {
	defer end()
	err := r.load(runCtx)
	if err == nil {
		err = r.follow(runCtx)
	}
	err = r.life.result(parent, r.c, err)
	r.mu.Lock()
	r.runErr = err
	r.mu.Unlock()
	return err
}

// WaitReady blocks until the Router has loaded the keyspace's map (an
// empty one if no member has joined yet) and returns nil. It returns
// early with what Run returned if Run ended without a map, ErrClosed if
// the Router was closed first, or, if ctx ends first, an error wrapping
// ctx.Err() and the last failed fetch's error.
func (r *Router) WaitReady(ctx context.Context) error {
	select {
	case <-r.ready:
		return nil
	case <-r.life.done:
	case <-ctx.Done():
	}
	select {
	case <-r.ready:
		return nil
	default:
	}
	select {
	case <-r.life.done:
		r.mu.Lock()
		runErr := r.runErr // set before done closed
		r.mu.Unlock()
		if runErr == nil {
			runErr = ErrClosed
		}
		return fmt.Errorf("router for keyspace %q stopped before it had a map: %w", r.keyspace, runErr)
	default:
	}
	r.mu.Lock()
	lastErr := r.lastErr
	r.mu.Unlock()
	if lastErr != nil {
		return fmt.Errorf("router for keyspace %q has no map yet: %w (last attempt: %w)", r.keyspace, ctx.Err(), lastErr)
	}
	return fmt.Errorf("router for keyspace %q has no map yet: %w", r.keyspace, ctx.Err())
}

// load fetches the keyspace's current map (GetMap) and installs it,
// retrying failures that may pass. It returns nil once the map is loaded
// or ctx ends, or the error that ends Run.
func (r *Router) load(ctx context.Context) error {
	var b backoff
	for {
		resp, err := call(ctx, r.c, mapAPI.GetMap, &keyshardv1.GetMapRequest{Keyspace: r.keyspace, Wait: durationpb.New(0)})
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil:
			rt, err := routingFromProto(resp.GetMap())
			if err != nil {
				return fmt.Errorf("router for keyspace %q: the server sent a bad map: %w", r.keyspace, err)
			}
			old := r.cur.Load()
			r.cur.Store(rt)
			close(old.next)
			r.mu.Lock()
			r.lastErr = nil
			r.mu.Unlock()
			close(r.ready)
			return nil
		case permanent(err, false):
			return fmt.Errorf("router for keyspace %q: get map: %w", r.keyspace, err)
		}
		r.mu.Lock()
		r.lastErr = err
		r.mu.Unlock()
		r.log.Warn("keyshard: cannot read the map; retrying", "err", err)
		if !clock.Sleep(ctx, r.clock, b.next()) {
			return nil
		}
	}
}

// follow keeps the map current until ctx ends (returning nil) or the
// Client is closed (returning ErrClosed).
func (r *Router) follow(ctx context.Context) error {
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
	return f.run(ctx)
}

// apply installs m if it is newer than the current map. Only Run's
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
// ctx.Err()), or the Router stopped (Run returned, or Close; returning
// ErrClosed).
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
		case <-r.life.done:
			return ErrClosed
		}
	}
}

// Close stops following the map and waits for the Router's goroutines to
// exit (and for Run to return, if it runs). Lookups keep answering from
// the last map. Close is idempotent, may be called without Start or Run
// (which then return ErrClosed), and returns nil.
func (r *Router) Close() error {
	if r.life.close() {
		r.life.stop()
	}
	r.own.Wait()
	return nil
}

// changed returns a channel closed when the map changes from the current
// one.
func (r *Router) changed() <-chan struct{} { return r.cur.Load().next }
