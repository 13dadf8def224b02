package client

import (
	"cmp"
	"context"
	"log/slog"
	"math/rand/v2"
	"time"

	"connectrpc.com/connect"

	"github.com/keyshard/keyshard/clock"
)

// Reconnect and polling policy of Routers and Workers.
const (
	backoffBase = 100 * time.Millisecond
	backoffCap  = 10 * time.Second
	// After this many streams in a row that end without delivering a
	// message, a follower switches to long polls.
	streamFailuresBeforePoll = 3
	// In long-poll mode, a follower tries the stream again after this many
	// successful polls (about five minutes of quiet polls).
	pollsBeforeStream = 10
	// A stream that lived this long counts as healthy even if it
	// delivered nothing (a proxy may cut idle streams).
	healthyStream = 30 * time.Second
	// pollWait is the wait of GetMap and GetGrants long polls.
	pollWait = 30 * time.Second
	// pollFloor is the least time between two long polls that returned
	// nothing new, in case a server answers them at once.
	pollFloor = time.Second
)

// backoff is capped exponential backoff with equal jitter: the n-th delay
// is uniform in [d/2, d) with d = min(cap, base·2ⁿ), where base and cap
// are backoffBase and backoffCap unless set.
type backoff struct {
	n     int
	base  time.Duration // 0: backoffBase
	limit time.Duration // the cap; 0: backoffCap
}

func (b *backoff) next() time.Duration {
	base, limit := cmp.Or(b.base, backoffBase), cmp.Or(b.limit, backoffCap)
	d := limit
	if b.n < 20 && base<<b.n < limit {
		d = base << b.n
	}
	b.n++
	if d < 2 {
		return d
	}
	return d/2 + rand.N(d/2)
}

func (b *backoff) reset() { b.n = 0 }

// follower keeps apply fed with the newest state of something the server
// both streams (watch) and serves as a long poll (poll): it reconnects the
// stream with backoff, and falls back to long polls when the stream fails
// repeatedly or is not implemented. Messages may repeat; apply must be
// idempotent and ignore stale ones.
type follower[T any] struct {
	clock clock.Clock
	log   *slog.Logger
	what  string
	// watch opens the stream and calls yield for every message; it
	// returns when the stream ends.
	watch func(ctx context.Context, yield func(*T)) error
	// poll makes one long poll; changed is false if it returned only
	// because its wait ran out.
	poll  func(ctx context.Context) (msg *T, changed bool, err error)
	apply func(*T)
	// fatal reports errors that end the follower.
	fatal func(error) bool
}

// run returns nil once ctx is done, or the first error fatal accepts.
func (f *follower[T]) run(ctx context.Context) error {
	var b backoff
	failures := 0
	pollOnly := false
	for {
		if !pollOnly && failures < streamFailuresBeforePoll {
			got := false
			start := f.clock.Now()
			err := f.watch(ctx, func(m *T) { got = true; f.apply(m) })
			if ctx.Err() != nil {
				return nil
			}
			if err != nil && f.fatal(err) {
				return err
			}
			if connect.CodeOf(err) == connect.CodeUnimplemented {
				pollOnly = true
			}
			if got || f.clock.Since(start) >= healthyStream {
				failures = 0
				b.reset()
			} else {
				failures++
			}
			if err != nil {
				f.log.Warn("keyshard: watch failed; reconnecting", "watch", f.what, "err", err, "failures", failures)
			}
			if !clock.Sleep(ctx, f.clock, b.next()) {
				return nil
			}
			continue
		}
		f.log.Warn("keyshard: watch keeps failing; falling back to long polls", "watch", f.what)
		for polls := 0; pollOnly || polls < pollsBeforeStream; {
			start := f.clock.Now()
			m, changed, err := f.poll(ctx)
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				if f.fatal(err) {
					return err
				}
				f.log.Warn("keyshard: long poll failed", "watch", f.what, "err", err)
				if !clock.Sleep(ctx, f.clock, b.next()) {
					return nil
				}
				continue
			}
			polls++
			b.reset()
			f.apply(m)
			if elapsed := f.clock.Since(start); !changed && elapsed < pollFloor {
				if !clock.Sleep(ctx, f.clock, pollFloor-elapsed) {
					return nil
				}
			}
		}
		failures = 0
	}
}
