package server

import (
	"context"

	"github.com/keyshard/keyshard/internal/store"
)

// WaitViewRev returns once this replica's view of the store has applied
// etcd revision rev: what it serves from then on, and what its leader's
// next rounds read, include every write up to rev. It returns ctx's error
// if ctx ends first. For tests that write through one path (etcd, another
// replica) and read through this replica.
func (s *Server) WaitViewRev(ctx context.Context, rev int64) error {
	for {
		var at int64
		changed := s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) { at = snap.Rev })
		if at >= rev {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
