package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/keyshard/keyshard/internal/shard"
)

// ttlSeconds rounds ttl up to whole seconds, at least 1: etcd leases have
// second granularity (and etcd may grant more than asked, never less).
func ttlSeconds(ttl time.Duration) int64 {
	s := int64((ttl + time.Second - 1) / time.Second)
	return max(s, 1)
}

// Session is an etcd lease kept alive by clientv3 in the background until
// Close, expiry or the Store's Close. A member's session is its liveness:
// every key attached to the lease vanishes when etcd deletes the lease.
type Session struct {
	cs  *concurrency.Session
	ttl time.Duration
}

// NewSession grants a lease of ttl (rounded up to whole seconds) and starts
// keeping it alive. ctx bounds only the grant; the keep-alive goroutine
// (owned by clientv3) runs until Close, until the lease is lost, or until
// the Store is closed; Done is closed then.
func (s *Store) NewSession(ctx context.Context, ttl time.Duration) (*Session, error) {
	id, granted, err := s.Grant(ctx, ttl)
	if err != nil {
		return nil, err
	}
	cs, err := concurrency.NewSession(s.client, concurrency.WithLease(clientv3.LeaseID(id)), concurrency.WithTTL(int(ttlSeconds(granted))))
	if err != nil {
		s.client.Revoke(context.WithoutCancel(ctx), clientv3.LeaseID(id))
		return nil, s.err("new session", err)
	}
	return &Session{cs: cs, ttl: granted}, nil
}

// LeaseID returns the session's lease.
func (se *Session) LeaseID() shard.LeaseID { return shard.LeaseID(se.cs.Lease()) }

// TTL returns the TTL etcd granted.
func (se *Session) TTL() time.Duration { return se.ttl }

// Done is closed when the session ends: its lease expired or was revoked,
// keep-alives failed for longer than the TTL, Close or Orphan was called,
// or the Store was closed. After an expiry or revoke, the keys attached to
// the lease are gone; after a failure to renew they soon will be.
func (se *Session) Done() <-chan struct{} { return se.cs.Done() }

// Close stops the keep-alives and revokes the lease, deleting every key
// attached to it. A lease that is already gone is not an error.
func (se *Session) Close() error {
	err := se.cs.Close()
	if err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil
	}
	return etcdErr("store: close session", err)
}

// Orphan stops the keep-alives without revoking the lease: it expires
// after its TTL, as if the process had died. For tests of failure handling.
func (se *Session) Orphan() { se.cs.Orphan() }

// Grant creates a lease of ttl (rounded up to whole seconds) that nobody
// keeps alive yet: the API server grants leases on behalf of HTTP clients
// and renews them with KeepAliveOnce. It returns the TTL etcd granted,
// which may be longer than asked.
func (s *Store) Grant(ctx context.Context, ttl time.Duration) (shard.LeaseID, time.Duration, error) {
	if s.closed() {
		return 0, 0, errClosed("grant lease")
	}
	resp, err := s.client.Grant(ctx, ttlSeconds(ttl))
	if err != nil {
		return 0, 0, s.err("grant lease", err)
	}
	return shard.LeaseID(resp.ID), time.Duration(resp.TTL) * time.Second, nil
}

// KeepAliveOnce renews lease id once and returns its new TTL. It returns
// ErrLeaseNotFound if the lease has expired or was revoked. Renewals from
// every caller share one LeaseKeepAlive stream (see renewer); each is
// confirmed by a linearizable read at the same raft term (see
// confirmTerm), else it fails with ErrUnavailable. The reads are shared
// too: renewals answered while a read is in flight are confirmed together
// by the next one (see termReads).
func (s *Store) KeepAliveOnce(ctx context.Context, id shard.LeaseID) (time.Duration, error) {
	if s.closed() {
		return 0, errClosed("keep lease alive")
	}
	op := fmt.Sprintf("keep lease %v alive", id)
	a, err := s.renewer.renew(ctx, id)
	if err == nil && a.ttl <= 0 {
		err = rpctypes.ErrLeaseNotFound
	}
	if err != nil {
		return 0, s.err(op, err)
	}
	term, err := s.terms.confirm(ctx)
	if err != nil {
		return 0, s.err(op, err)
	}
	if err := confirmTerm(a.term, term); err != nil {
		return 0, fmt.Errorf("store: %s: %w", op, err)
	}
	return time.Duration(a.ttl) * time.Second, nil
}

// confirmingTerm reads etcd's raft term with a linearizable read of one
// key that is never written: a read the leader of that term confirms with
// a quorum before it answers.
func (s *Store) confirmingTerm(ctx context.Context) (uint64, error) {
	resp, err := s.client.Get(ctx, Prefix+"term", clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return resp.Header.GetRaftTerm(), nil
}

// LeaseInfo is what TimeToLive reports about a lease.
type LeaseInfo struct {
	TTL     time.Duration // remaining, rounded down to whole seconds
	Granted time.Duration // the TTL granted (and restored by each renewal)
}

// TimeToLive returns the remaining and granted TTL of lease id, or
// ErrLeaseNotFound if it has expired or was revoked.
func (s *Store) TimeToLive(ctx context.Context, id shard.LeaseID) (LeaseInfo, error) {
	if s.closed() {
		return LeaseInfo{}, errClosed("time to live")
	}
	resp, err := s.client.TimeToLive(ctx, clientv3.LeaseID(id))
	if err != nil {
		return LeaseInfo{}, s.err(fmt.Sprintf("time to live of lease %v", id), err)
	}
	if resp.TTL < 0 {
		return LeaseInfo{}, fmt.Errorf("store: time to live of lease %v: %w", id, ErrLeaseNotFound)
	}
	return LeaseInfo{TTL: time.Duration(resp.TTL) * time.Second, Granted: time.Duration(resp.GrantedTTL) * time.Second}, nil
}

// Revoke revokes lease id: etcd deletes every key attached to it in the
// same revision. It returns ErrLeaseNotFound if the lease was already gone.
func (s *Store) Revoke(ctx context.Context, id shard.LeaseID) error {
	if s.closed() {
		return errClosed("revoke lease")
	}
	_, err := s.client.Revoke(ctx, clientv3.LeaseID(id))
	return s.err(fmt.Sprintf("revoke lease %v", id), err)
}

// QuarantineInfo is where member id's quarantine lives and how long it
// has left.
type QuarantineInfo struct {
	Lease shard.LeaseID // 0: there is none
	Left  time.Duration // the lease's remaining TTL, rounded down to whole seconds
}

// QuarantineOf returns member id's quarantine in ks: its lease and how
// long it has left (zero if there is none).
func (s *Store) QuarantineOf(ctx context.Context, ks, id string) (QuarantineInfo, error) {
	if s.closed() {
		return QuarantineInfo{}, errClosed("read quarantine")
	}
	if err := checkNames(ks, id); err != nil {
		return QuarantineInfo{}, err
	}
	key := QuarantineKey(ks, id)
	resp, err := s.client.Get(ctx, key)
	if err != nil {
		return QuarantineInfo{}, s.err("read "+key, err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].Lease == 0 {
		return QuarantineInfo{}, nil
	}
	lease := shard.LeaseID(resp.Kvs[0].Lease)
	info, err := s.TimeToLive(ctx, lease)
	if errors.Is(err, ErrLeaseNotFound) {
		return QuarantineInfo{}, nil
	}
	return QuarantineInfo{Lease: lease, Left: info.TTL}, err
}
