package server

import (
	"context"

	"github.com/keyshard/keyshard/internal/shard"
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

// ExpirePoolSession ends the session of member id of tenant pool pool as
// etcd does when its lease expires (a crashed process): its lease is
// revoked and its record vanishes, with no LeavePool.
func (s *Server) ExpirePoolSession(ctx context.Context, pool, id string) error {
	var lease int64
	s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		if ps := snap.TenantPools[pool]; ps != nil {
			lease = int64(ps.Members[id].Value.Session)
		}
	})
	if lease == 0 {
		return store.ErrNotFound
	}
	if err := s.store.Revoke(ctx, shard.LeaseID(lease)); err != nil {
		return err
	}
	return s.WaitView(ctx, func(snap *store.Snapshot) bool {
		ps := snap.TenantPools[pool]
		return ps == nil || ps.Members[id].Value.Session != shard.LeaseID(lease)
	})
}

// Replica returns the replica's name.
func (s *Server) Replica() string { return s.cfg.Replica }

// HoldTenantPoolBatches makes the leader call f after each transaction of
// a publication's chunks but the last, with the term's context, the
// batches and the chunks written so far: a test blocks in f to hold a
// publication half written. nil removes it.
func (s *Server) HoldTenantPoolBatches(f func(ctx context.Context, pool string, batch, chunks int)) {
	if f == nil {
		s.tpBatchHook.Store(nil)
		return
	}
	s.tpBatchHook.Store(&f)
}
