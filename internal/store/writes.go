package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keyshard/keyshard/hotkey"
	"github.com/keyshard/keyshard/internal/shard"
)

// Reads that need a key's lease fetch the value too: etcd 3.7 answers
// WithKeysOnly ranges from its in-memory index, which has no lease, so
// KeyValue.Lease comes back 0.

// maxRetries bounds the read-check-write loops below, which retry only when
// a concurrent writer changed the key between the read and the write.
const maxRetries = 16

func checkNames(ks, id string) error {
	if err := ValidateName(KindKeyspace, ks); err != nil {
		return err
	}
	if id != "" {
		return ValidateName(KindMember, id)
	}
	return nil
}

// Join writes member m's record in keyspace ks, attached to lease (its
// session), and returns the revision of the write. m.Session is set to
// lease (it must be zero or equal to lease); m.Pending, m.Replaces and
// m.ReplacesFenced are set by Join. The caller's m.Replaces, if not 0,
// names a session the caller held and fenced itself on: if the record
// replaces exactly that session, ReplacesFenced is set, and the leader
// revokes it without quarantine.
//
// A new session's record is Pending until its first keep-alive
// (Activate). If the id is already held by a live session other than
// lease, Join fails with ErrExists, unless replace is set: then it takes
// the id over, records the old session in m.Replaces and returns it. The
// leader revokes the old session, after quarantining the buckets it
// holds; the caller must not revoke it (its view of what the old session
// holds may be stale). Joining again with the same lease just updates the
// record, keeping its Pending and Replaces.
//
// Errors: ErrNotFound (no such keyspace), ErrExists, ErrLeaseNotFound
// (lease expired or revoked), ErrInvalidName, ErrInvalid, ErrUnavailable.
func (s *Store) Join(ctx context.Context, ks string, m shard.Member, lease shard.LeaseID, replace bool) (old shard.LeaseID, rev int64, err error) {
	if s.closed() {
		return 0, 0, errClosed("join")
	}
	if err := checkNames(ks, m.ID); err != nil {
		return 0, 0, err
	}
	if m.Session != 0 && m.Session != lease {
		return 0, 0, invalidf("join %q: member session %v differs from the lease %v", m.ID, m.Session, lease)
	}
	m.Session = lease
	fenced := m.Replaces // the session the caller fenced, if any
	op := fmt.Sprintf("join %s/%s", ks, m.ID)
	ksKey, key := KeyspaceKey(ks), MemberKey(ks, m.ID)
	for range maxRetries {
		resp, err := s.client.Txn(ctx).Then(clientv3.OpGet(ksKey, clientv3.WithKeysOnly()), clientv3.OpGet(key)).Commit()
		if err != nil {
			return 0, 0, s.err(op, err)
		}
		ksKV := resp.Responses[0].GetResponseRange().Kvs
		if len(ksKV) == 0 {
			return 0, 0, fmt.Errorf("store: %s: keyspace %q: %w", op, ks, ErrNotFound)
		}
		var curRev int64
		old = 0
		m.Pending, m.Replaces, m.ReplacesFenced = true, 0, false
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
			curRev = kvs[0].ModRevision
			switch cur := shard.LeaseID(kvs[0].Lease); {
			case cur == lease:
				if prev, err := DecodeMember(key, kvs[0].Value); err == nil {
					m.Pending, m.Replaces, m.ReplacesFenced = prev.Pending, prev.Replaces, prev.ReplacesFenced
				}
			case !replace:
				return 0, 0, fmt.Errorf("store: %s: %w: member id %q is held by live session %v", op, ErrExists, m.ID, cur)
			default:
				old, m.Replaces, m.ReplacesFenced = cur, cur, fenced != 0 && cur == fenced
			}
		}
		val, err := EncodeMember(m)
		if err != nil {
			return 0, 0, err
		}
		tr, err := s.client.Txn(ctx).If(
			clientv3.Compare(clientv3.CreateRevision(ksKey), "=", ksKV[0].CreateRevision),
			clientv3.Compare(clientv3.ModRevision(key), "=", curRev),
		).Then(clientv3.OpPut(key, string(val), clientv3.WithLease(clientv3.LeaseID(lease)))).Commit()
		if err != nil {
			err = s.err(op, err)
			if errors.Is(err, ErrLeaseNotFound) {
				return 0, 0, fmt.Errorf("%w: session %v has expired or was revoked", err, lease)
			}
			return 0, 0, err
		}
		if tr.Succeeded {
			return old, tr.Header.Revision, nil
		}
	}
	return 0, 0, fmt.Errorf("store: %s: %w: the member key kept changing", op, ErrConflict)
}

// Activate marks member id's record, held by session lease, as no longer
// Pending: the session has kept alive once, so the leader may assign it
// buckets. It returns the revision of the write, or 0 if the record was
// already active (nothing written). The caller renews the lease first: a
// nil error then also says that the record was still on lease after the
// renewal, so a session that was replaced (Join with replace) or has
// ended cannot count a renewal made after that as its own.
// Errors: ErrNotFound (no member record), ErrFenced (the id is held by
// another session), ErrCorrupt, ErrConflict, ErrUnavailable.
func (s *Store) Activate(ctx context.Context, ks, id string, lease shard.LeaseID) (int64, error) {
	if s.closed() {
		return 0, errClosed("activate")
	}
	if err := checkNames(ks, id); err != nil {
		return 0, err
	}
	op := fmt.Sprintf("activate %s/%s", ks, id)
	key := MemberKey(ks, id)
	for range maxRetries {
		resp, err := s.client.Get(ctx, key)
		if err != nil {
			return 0, s.err(op, err)
		}
		if len(resp.Kvs) == 0 {
			return 0, fmt.Errorf("store: %s: member %q: %w", op, id, ErrNotFound)
		}
		kv := resp.Kvs[0]
		if shard.LeaseID(kv.Lease) != lease {
			return 0, fmt.Errorf("store: %s: %w: member id %q is now held by session %v, not %v", op, ErrFenced, id, shard.LeaseID(kv.Lease), lease)
		}
		m, err := DecodeMember(key, kv.Value)
		if err != nil {
			return 0, err
		}
		if !m.Pending {
			return 0, nil
		}
		m.Pending = false
		val, err := EncodeMember(m)
		if err != nil {
			return 0, err
		}
		tr, err := s.client.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).
			Then(clientv3.OpPut(key, string(val), clientv3.WithLease(clientv3.LeaseID(lease)))).
			Commit()
		if err != nil {
			return 0, s.err(op, err)
		}
		if tr.Succeeded {
			return tr.Header.Revision, nil
		}
	}
	return 0, fmt.Errorf("store: %s: %w: the member key kept changing", op, ErrConflict)
}

// memberFenced reports why a member write fenced on the member key's lease
// failed, from the Else branch's read of the member key.
func memberFenced(op string, resp *clientv3.TxnResponse, id string, lease shard.LeaseID) error {
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return fmt.Errorf("store: %s: member %q: %w", op, id, ErrNotFound)
	}
	return fmt.Errorf("store: %s: %w: member id %q is now held by session %v, not %v", op, ErrFenced, id, shard.LeaseID(kvs[0].Lease), lease)
}

// PutDrain asks member id to drain: it writes d at drain/<ks>/<id>,
// attached to the member's current session so that it vanishes with it.
// Errors: ErrNotFound (no such member), ErrInvalid, ErrUnavailable.
func (s *Store) PutDrain(ctx context.Context, ks, id string, d shard.Drain) (int64, error) {
	if s.closed() {
		return 0, errClosed("put drain")
	}
	if err := checkNames(ks, id); err != nil {
		return 0, err
	}
	val, err := EncodeDrain(d)
	if err != nil {
		return 0, err
	}
	op := fmt.Sprintf("put drain of %s/%s", ks, id)
	mk := MemberKey(ks, id)
	for range maxRetries {
		resp, err := s.client.Get(ctx, mk)
		if err != nil {
			return 0, s.err(op, err)
		}
		if len(resp.Kvs) == 0 {
			return 0, fmt.Errorf("store: %s: member %q: %w", op, id, ErrNotFound)
		}
		cur := resp.Kvs[0]
		tr, err := s.client.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(mk), "=", cur.ModRevision)).
			Then(clientv3.OpPut(DrainKey(ks, id), string(val), clientv3.WithLease(clientv3.LeaseID(cur.Lease)))).
			Commit()
		if err != nil {
			if err := s.err(op, err); !errors.Is(err, ErrLeaseNotFound) {
				return 0, err
			}
			continue // the session ended between the read and the write
		}
		if tr.Succeeded {
			return tr.Header.Revision, nil
		}
	}
	return 0, fmt.Errorf("store: %s: %w: the member key kept changing", op, ErrConflict)
}

// DeleteDrain withdraws a drain request. It returns ErrNotFound if there
// was none.
func (s *Store) DeleteDrain(ctx context.Context, ks, id string) (int64, error) {
	if s.closed() {
		return 0, errClosed("delete drain")
	}
	if err := checkNames(ks, id); err != nil {
		return 0, err
	}
	op := fmt.Sprintf("delete drain of %s/%s", ks, id)
	resp, err := s.client.Delete(ctx, DrainKey(ks, id))
	if err != nil {
		return 0, s.err(op, err)
	}
	if resp.Deleted == 0 {
		return 0, fmt.Errorf("store: %s: %w", op, ErrNotFound)
	}
	return resp.Header.Revision, nil
}

// DeleteMember deletes member id's record, drain request and releases
// (the keys the member and the API write), if the record is held by lease;
// lease 0 deletes whoever holds it. Grants stay until the leader removes
// them or the session's lease is deleted: to make a member leave at once,
// revoke its session instead. Errors: ErrNotFound, ErrFenced (held by
// another session), ErrUnavailable.
func (s *Store) DeleteMember(ctx context.Context, ks, id string, lease shard.LeaseID) (int64, error) {
	if s.closed() {
		return 0, errClosed("delete member")
	}
	if err := checkNames(ks, id); err != nil {
		return 0, err
	}
	op := fmt.Sprintf("delete member %s/%s", ks, id)
	mk := MemberKey(ks, id)
	cmp := clientv3.Compare(clientv3.CreateRevision(mk), ">", 0)
	if lease != 0 {
		cmp = clientv3.Compare(clientv3.LeaseValue(mk), "=", clientv3.LeaseID(lease))
	}
	resp, err := s.client.Txn(ctx).
		If(cmp).
		Then(clientv3.OpDelete(mk), clientv3.OpDelete(DrainKey(ks, id)), clientv3.OpDelete(ReleasesKey(ks, id))).
		Else(clientv3.OpGet(mk)).
		Commit()
	if err != nil {
		return 0, s.err(op, err)
	}
	if !resp.Succeeded {
		return 0, memberFenced(op, resp, id, lease)
	}
	return resp.Header.Revision, nil
}

// CreateKeyspace stores a new keyspace's configuration. Errors: ErrExists,
// ErrInvalid, ErrInvalidName, ErrUnavailable.
func (s *Store) CreateKeyspace(ctx context.Context, k shard.Keyspace) (int64, error) {
	if s.closed() {
		return 0, errClosed("create keyspace")
	}
	if err := ValidateName(KindKeyspace, k.Name); err != nil {
		return 0, err
	}
	val, err := EncodeKeyspace(k)
	if err != nil {
		return 0, err
	}
	return s.create(ctx, fmt.Sprintf("create keyspace %q", k.Name), KeyspaceKey(k.Name), val)
}

// create puts val at key only if key does not exist (ErrExists).
func (s *Store) create(ctx context.Context, op, key string, val []byte) (int64, error) {
	resp, err := s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(val))).
		Commit()
	if err != nil {
		return 0, s.err(op, err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("store: %s: %w", op, ErrExists)
	}
	return resp.Header.Revision, nil
}

// UpdateKeyspace replaces a keyspace's configuration. Buckets, Hash and
// Mode cannot change: a different value fails with ErrImmutable naming the
// field. Errors: ErrNotFound, ErrImmutable, ErrInvalid, ErrCorrupt (the
// stored value does not decode), ErrUnavailable.
func (s *Store) UpdateKeyspace(ctx context.Context, k shard.Keyspace) (int64, error) {
	if err := ValidateName(KindKeyspace, k.Name); err != nil {
		return 0, err
	}
	val, err := EncodeKeyspace(k)
	if err != nil {
		return 0, err
	}
	key := KeyspaceKey(k.Name)
	op := fmt.Sprintf("update keyspace %q", k.Name)
	for range maxRetries {
		cur, modRev, err := s.GetKeyspace(ctx, k.Name)
		if err != nil {
			return 0, err
		}
		switch {
		case cur.Buckets != k.Buckets:
			return 0, fmt.Errorf("store: %s: %w: buckets is %d and cannot change to %d", op, ErrImmutable, cur.Buckets, k.Buckets)
		case cur.Hash != k.Hash:
			return 0, fmt.Errorf("store: %s: %w: hash is %q and cannot change to %q", op, ErrImmutable, cur.Hash, k.Hash)
		case cur.Mode != k.Mode:
			return 0, fmt.Errorf("store: %s: %w: mode is %q and cannot change to %q", op, ErrImmutable, cur.Mode, k.Mode)
		}
		resp, err := s.client.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", modRev)).
			Then(clientv3.OpPut(key, string(val))).
			Commit()
		if err != nil {
			return 0, s.err(op, err)
		}
		if resp.Succeeded {
			return resp.Header.Revision, nil
		}
	}
	return 0, fmt.Errorf("store: %s: %w: the keyspace kept changing", op, ErrConflict)
}

// GetKeyspace returns keyspace ks's configuration and the ModRevision of
// its key. Errors: ErrNotFound, ErrCorrupt, ErrInvalidName, ErrUnavailable.
func (s *Store) GetKeyspace(ctx context.Context, ks string) (shard.Keyspace, int64, error) {
	if s.closed() {
		return shard.Keyspace{}, 0, errClosed("get keyspace")
	}
	if err := ValidateName(KindKeyspace, ks); err != nil {
		return shard.Keyspace{}, 0, err
	}
	key := KeyspaceKey(ks)
	resp, err := s.client.Get(ctx, key)
	if err != nil {
		return shard.Keyspace{}, 0, s.err(fmt.Sprintf("get keyspace %q", ks), err)
	}
	if len(resp.Kvs) == 0 {
		return shard.Keyspace{}, 0, fmt.Errorf("store: get keyspace %q: %w", ks, ErrNotFound)
	}
	k, err := DecodeKeyspace(key, resp.Kvs[0].Value)
	if err != nil {
		return shard.Keyspace{}, 0, err
	}
	return k, resp.Kvs[0].ModRevision, nil
}

// ListKeyspaces returns every keyspace's configuration, sorted by name, and
// the revision read. Keyspaces whose value does not decode are left out;
// then err wraps ErrCorrupt and names them, and the list is still
// returned.
func (s *Store) ListKeyspaces(ctx context.Context) ([]shard.Keyspace, int64, error) {
	if s.closed() {
		return nil, 0, errClosed("list keyspaces")
	}
	resp, err := s.client.Get(ctx, Prefix+"keyspaces/", clientv3.WithPrefix())
	if err != nil {
		return nil, 0, s.err("list keyspaces", err)
	}
	var out []shard.Keyspace
	var errs []error
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		kind, _, _, err := ParseKey(key)
		if err == nil && kind != KindKeyspace {
			err = corruptf(key, "", "not a keyspace key")
		}
		if err == nil {
			var k shard.Keyspace
			if k, err = DecodeKeyspace(key, kv.Value); err == nil {
				out = append(out, k)
				continue
			}
		}
		errs = append(errs, err)
	}
	slices.SortFunc(out, func(a, b shard.Keyspace) int { return strings.Compare(a.Name, b.Name) })
	return out, resp.Header.Revision, errors.Join(errs...)
}

// DeleteKeyspace deletes keyspace ks and every key under it (map, tokens,
// members, drains, grants, releases, quarantines, stream positions, an
// import's reservation) in one
// transaction. Members' sessions
// are not revoked; their keys simply vanish. Errors: ErrNotFound,
// ErrInvalidName, ErrUnavailable.
func (s *Store) DeleteKeyspace(ctx context.Context, ks string) (int64, error) {
	if s.closed() {
		return 0, errClosed("delete keyspace")
	}
	if err := ValidateName(KindKeyspace, ks); err != nil {
		return 0, err
	}
	op := fmt.Sprintf("delete keyspace %q", ks)
	dels := []clientv3.Op{
		clientv3.OpDelete(KeyspaceKey(ks)),
		clientv3.OpDelete(MapKey(ks)),
		clientv3.OpDelete(TokensKey(ks)),
		clientv3.OpDelete(ReservedKey(ks)),
		clientv3.OpDelete(historyPrefix(ks), clientv3.WithPrefix()),
	}
	for _, k := range keyspaceKinds {
		dels = append(dels, clientv3.OpDelete(kindPrefix(k, ks), clientv3.WithPrefix()))
	}
	resp, err := s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(KeyspaceKey(ks)), ">", 0)).
		Then(dels...).
		Commit()
	if err != nil {
		return 0, s.err(op, err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("store: %s: %w", op, ErrNotFound)
	}
	return resp.Header.Revision, nil
}

// PutHotPool creates hot-key pool p or replaces its settings, and returns
// the revision of the write. The leader's next aggregation uses the new
// settings. Errors: ErrInvalid, ErrInvalidName, ErrUnavailable.
func (s *Store) PutHotPool(ctx context.Context, p HotPool) (int64, error) {
	if s.closed() {
		return 0, errClosed("put hot-key pool")
	}
	if err := ValidateName(KindHotPool, p.Name); err != nil {
		return 0, err
	}
	val, err := EncodeHotPool(p)
	if err != nil {
		return 0, err
	}
	resp, err := s.client.Put(ctx, HotPoolKey(p.Name), string(val))
	if err != nil {
		return 0, s.err(fmt.Sprintf("put hot-key pool %q", p.Name), err)
	}
	return resp.Header.Revision, nil
}

// CreateHotPool stores hot-key pool p only if no pool of that name
// exists. Errors: ErrExists, ErrInvalid, ErrInvalidName, ErrUnavailable.
func (s *Store) CreateHotPool(ctx context.Context, p HotPool) (int64, error) {
	if s.closed() {
		return 0, errClosed("create hot-key pool")
	}
	if err := ValidateName(KindHotPool, p.Name); err != nil {
		return 0, err
	}
	val, err := EncodeHotPool(p)
	if err != nil {
		return 0, err
	}
	return s.create(ctx, fmt.Sprintf("create hot-key pool %q", p.Name), HotPoolKey(p.Name), val)
}

// GetHotPool returns hot-key pool's settings and the ModRevision of its
// key. Errors: ErrNotFound, ErrCorrupt, ErrInvalidName, ErrUnavailable.
func (s *Store) GetHotPool(ctx context.Context, pool string) (HotPool, int64, error) {
	if s.closed() {
		return HotPool{}, 0, errClosed("get hot-key pool")
	}
	if err := ValidateName(KindHotPool, pool); err != nil {
		return HotPool{}, 0, err
	}
	return getRecord(ctx, s, fmt.Sprintf("get hot-key pool %q", pool), HotPoolKey(pool), DecodeHotPool)
}

// getRecord reads the record at key and decodes it, with its ModRevision.
// what names the operation in errors. Errors: ErrNotFound, ErrCorrupt (from
// decode), ErrUnavailable.
func getRecord[T any](ctx context.Context, s *Store, what, key string, decode func(key string, val []byte) (T, error)) (T, int64, error) {
	var zero T
	resp, err := s.client.Get(ctx, key)
	if err != nil {
		return zero, 0, s.err(what, err)
	}
	if len(resp.Kvs) == 0 {
		return zero, 0, fmt.Errorf("store: %s: %w", what, ErrNotFound)
	}
	v, err := decode(key, resp.Kvs[0].Value)
	if err != nil {
		return zero, 0, err
	}
	return v, resp.Kvs[0].ModRevision, nil
}

// PutHotReport stores r as its producer's latest report to pool, replacing
// the previous one, without a lease, and returns the revision of the
// write. It writes only if the pool exists, in the same transaction.
// Errors: ErrNotFound (no such pool), ErrInvalid, ErrInvalidName,
// ErrUnavailable.
func (s *Store) PutHotReport(ctx context.Context, pool string, r hotkey.Report) (int64, error) {
	if s.closed() {
		return 0, errClosed("put hot-key report")
	}
	if err := ValidateName(KindHotPool, pool); err != nil {
		return 0, err
	}
	val, err := EncodeHotReport(r)
	if err != nil {
		return 0, err
	}
	op := fmt.Sprintf("put hot-key report of %s/%s", pool, r.Producer)
	resp, err := s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(HotPoolKey(pool)), ">", 0)).
		Then(clientv3.OpPut(HotReportKey(pool, r.Producer), string(val))).
		Commit()
	if err != nil {
		return 0, s.err(op, err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("store: %s: hot-key pool %q: %w", op, pool, ErrNotFound)
	}
	return resp.Header.Revision, nil
}
