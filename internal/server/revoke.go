package server

import (
	"context"
	"errors"
	"time"

	"github.com/keyshard/keyshard/internal/coordinator"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
)

// revoke ends session a.Session of member a.ID for the leader, after
// quarantining a.Quarantine: the buckets it holds and has not released,
// which go to nobody until the session's holder must have stopped.
//
// A superseded session (the member re-joined with replace) holding
// buckets, of a member with no other quarantine, is not revoked: its
// quarantine is put on the session's own lease, and its grants deleted, in
// one fenced transaction, so that the buckets come free exactly when etcd
// expires that lease. Nothing renews it any more: KeepAlive acknowledges
// no renewal of a replaced session, and no longer renews one that this
// replica knows was replaced. A quarantine on a lease of its own would be
// sized from etcd's TimeToLive, in whole seconds rounded down, so it
// would end up to a second late.
//
// Any other session is revoked, its quarantine on a lease of its own for
// quarantineTTL.
func (s *Server) revoke(ctx context.Context, st leaderStore, fence store.Fence, a coordinator.RevokeSession) error {
	prev, err := st.QuarantineOf(ctx, a.Keyspace, a.ID)
	if err != nil {
		return err
	}
	if a.Superseded && len(a.Quarantine) > 0 && prev.Lease == 0 {
		return s.quarantineOnLease(ctx, st, fence, a)
	}
	lease := a.Session
	qttl, err := quarantineTTL(ctx, st, a)
	if err != nil {
		return err
	}
	if len(a.Quarantine) > 0 && qttl > 0 {
		// The quarantine replaces the member's earlier one, if any
		// (a.Quarantine includes its buckets): keep its expiry if later.
		if prev.Lease != 0 {
			qttl = max(qttl, prev.Left+time.Second)
		}
		qlease, _, err := st.Grant(ctx, qttl)
		if err != nil {
			return err
		}
		q := shard.Quarantine{Session: lease, Buckets: a.Quarantine}
		if _, err := st.Commit(ctx, fence, []store.Write{store.PutQuarantine(a.Keyspace, a.ID, q, qlease)}, nil); err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), maxWriteDeadline)
			if rerr := st.Revoke(rctx, qlease); rerr != nil && !errors.Is(rerr, store.ErrLeaseNotFound) {
				s.log.Warn("could not revoke the lease of an unwritten quarantine; it expires on its own", "keyspace", a.Keyspace, "member", a.ID, "lease", qlease, "ttl", qttl, "err", rerr)
			}
			cancel()
			return err
		}
	}
	if prev.Lease == lease && qttl == 0 {
		// The member's quarantine lives on this session's lease (see
		// above): revoking it would end the quarantine early. The session
		// holds nothing else, and ends when the lease expires.
		s.log.Info("left a replaced member session to expire with its quarantine", "keyspace", a.Keyspace, "member", a.ID, "session", lease, "reason", a.Reason)
		return nil
	}
	if err := st.Revoke(ctx, lease); err != nil && !errors.Is(err, store.ErrLeaseNotFound) {
		return err
	}
	s.log.Warn("revoked a member session", "keyspace", a.Keyspace, "member", a.ID, "session", lease, "reason", a.Reason, "quarantined_buckets", len(a.Quarantine), "quarantine", qttl)
	return nil
}

// quarantineOnLease quarantines superseded session a.Session's buckets on
// its own lease and deletes its grants (see revoke).
func (s *Server) quarantineOnLease(ctx context.Context, st leaderStore, fence store.Fence, a coordinator.RevokeSession) error {
	lease := a.Session
	q := shard.Quarantine{Session: lease, Buckets: a.Quarantine}
	writes := []store.Write{store.PutQuarantine(a.Keyspace, a.ID, q, lease), store.Delete(store.GrantsKey(a.Keyspace, a.ID))}
	_, err := st.Commit(ctx, fence, writes, nil)
	switch {
	case errors.Is(err, store.ErrLeaseNotFound):
		// The lease is gone, and with it the grants: nothing to quarantine.
		s.log.Warn("replaced member session already ended", "keyspace", a.Keyspace, "member", a.ID, "session", lease, "reason", a.Reason)
		return nil
	case err != nil:
		return err
	}
	s.log.Warn("ended a replaced member session; its buckets stay quarantined until its lease expires", "keyspace", a.Keyspace, "member", a.ID, "session", lease, "reason", a.Reason, "quarantined_buckets", len(a.Quarantine))
	return nil
}
