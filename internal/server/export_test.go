package server

import (
	"context"
	"time"

	"github.com/keyshard/keyshard/internal/store"
)

// Hooks for the tests of package server_test, which drive a fake clock:
// they wait for a condition instead of sleeping.

// WaitHotKeyTerms waits until s's hot-key aggregation has started in n
// terms: the leader's ticker is then set, so advancing the clock by a
// second runs a round.
func (s *Server) WaitHotKeyTerms(ctx context.Context, n int) error {
	return s.rounds.wait(ctx, func(terms int, _ time.Time) bool { return terms >= n })
}

// WaitHotKeyRound waits until s, as leader, has finished an aggregation
// round that started at or after at (by s's clock).
func (s *Server) WaitHotKeyRound(ctx context.Context, at time.Time) error {
	return s.rounds.wait(ctx, func(_ int, last time.Time) bool { return !last.Before(at) })
}

// WaitView waits until cond holds on s's view of the store; cond runs
// under the view's lock and must not keep the snapshot.
func (s *Server) WaitView(ctx context.Context, cond func(*store.Snapshot) bool) error {
	for {
		var ok bool
		changed := s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) { ok = cond(snap) })
		if ok {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
