package server

import (
	"context"

	"github.com/keyshard/keyshard/internal/store"
)

// Hooks for the tests of package server_test: they wait for a condition
// instead of sleeping.

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
