package store

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keyshard/keyshard/hotkey"
	"github.com/keyshard/keyshard/internal/shard"
)

// Entry is one stored value with the metadata a fenced write needs.
// ModRevision is 0 when the key does not exist, so Expect{Key,
// e.ModRevision} states "unchanged since read" in both cases.
type Entry[T any] struct {
	Value       T
	ModRevision int64
	Lease       shard.LeaseID // 0 for keys without a lease
}

// Exists reports whether the key existed when read.
func (e Entry[T]) Exists() bool { return e.ModRevision != 0 }

// KeyspaceState is every key of one keyspace, as of one revision.
type KeyspaceState struct {
	Name     string
	Config   Entry[shard.Keyspace]
	Map      Entry[shard.Map]
	Tokens   Entry[uint64] // the last token issued; 0 if none
	Members  map[string]Entry[shard.Member]
	Drains   map[string]Entry[shard.Drain]
	Grants   map[string]Entry[shard.Grants]
	Releases map[string]Entry[shard.Releases]
	// Quarantines are on leases of their own (Entry.Lease), not the
	// member's.
	Quarantines map[string]Entry[shard.Quarantine]
	// Commits are the members' committed stream positions (positions/),
	// by member id, without leases: they outlive the session that wrote
	// them (Commit.Session) until the leader folds them.
	Commits map[string]Entry[shard.Commit]
	// BucketPos is the keyspace's bucket positions (bucketpos/), by chunk;
	// Positions joins them.
	BucketPos map[int]Entry[shard.BucketPositions]
	// Held are the copies of the members' grants (held/), by member id,
	// without leases: each outlives its session (Held.Session) until the
	// leader folds the session's commit record.
	Held map[string]Entry[shard.Held]
	// Reserved is what remains of an import: the imported instances the
	// leader still waits for (reserved/), absent once none remain.
	Reserved Entry[shard.Reservation]
}

// Positions returns the keyspace's bucket positions, joined from its
// chunks.
func (st *KeyspaceState) Positions() shard.BucketPositions {
	chunks := make([]shard.BucketPositions, MaxPositionChunks)
	for c, e := range st.BucketPos {
		chunks[c] = e.Value
	}
	return JoinPositions(chunks)
}

func newKeyspaceState(ks string) *KeyspaceState {
	return &KeyspaceState{
		Name:     ks,
		Members:  map[string]Entry[shard.Member]{},
		Drains:   map[string]Entry[shard.Drain]{},
		Grants:   map[string]Entry[shard.Grants]{},
		Releases: map[string]Entry[shard.Releases]{},

		Quarantines: map[string]Entry[shard.Quarantine]{},
		Commits:     map[string]Entry[shard.Commit]{},
		BucketPos:   map[int]Entry[shard.BucketPositions]{},
		Held:        map[string]Entry[shard.Held]{},
	}
}

func (st *KeyspaceState) empty() bool {
	return !st.Config.Exists() && !st.Map.Exists() && !st.Tokens.Exists() &&
		len(st.Members) == 0 && len(st.Drains) == 0 && len(st.Grants) == 0 && len(st.Releases) == 0 && len(st.Quarantines) == 0 &&
		len(st.Commits) == 0 && len(st.BucketPos) == 0 && len(st.Held) == 0 && !st.Reserved.Exists()
}

// PoolState is every key of one hot-key pool, as of one revision.
type PoolState struct {
	Name     string
	Config   Entry[HotPool]
	Reports  map[string]Entry[hotkey.Report] // by producer id
	Overflow Entry[hotkey.OverflowSet]
}

func newPoolState(pool string) *PoolState {
	return &PoolState{Name: pool, Reports: map[string]Entry[hotkey.Report]{}}
}

func (p *PoolState) empty() bool {
	return !p.Config.Exists() && !p.Overflow.Exists() && len(p.Reports) == 0
}

// Snapshot is the stored state of some or all keyspaces and hot-key pools
// at revision Rev. Keys whose value did not decode are absent from
// Keyspaces and Pools and listed in Corrupt (key -> error wrapping
// ErrCorrupt): a reader decides whether to stop or to report and go on. A
// keyspace whose configuration key is missing but which still has other
// keys (left over by hand edits) appears with Config.ModRevision == 0, and
// so does such a pool.
type Snapshot struct {
	Rev       int64
	Keyspaces map[string]*KeyspaceState
	// Pools holds the hot-key kinds (Kind.HotKey), by pool name; they never
	// appear in Keyspaces.
	Pools map[string]*PoolState
	// TenantPools holds the tenant-pool kinds (Kind.TenantPool), by pool
	// name.
	TenantPools map[string]*TenantPoolState
	// Replicas are the replicas' advertised API URLs, by replica id.
	Replicas map[string]Entry[string]
	Corrupt  map[string]error
}

// NewSnapshot returns an empty snapshot at rev, ready for Apply.
func NewSnapshot(rev int64) *Snapshot {
	return &Snapshot{Rev: rev, Keyspaces: map[string]*KeyspaceState{}, Pools: map[string]*PoolState{}, TenantPools: map[string]*TenantPoolState{}, Replicas: map[string]Entry[string]{}, Corrupt: map[string]error{}}
}

// Apply updates s with one change from Watch and raises s.Rev to the
// change's revision. Leader keys are ignored. A Resync is applied by
// replacing s with Resync.Snapshot instead.
func (s *Snapshot) Apply(c Change) {
	s.Rev = max(s.Rev, c.ModRevision)
	if c.Kind == KindLeader {
		return
	}
	delete(s.Corrupt, c.Key)
	if c.Err != nil {
		s.Corrupt[c.Key] = c.Err
		// The key no longer holds the last good value: forget it.
		if c.Kind != KindUnknown {
			s.apply(Change{Kind: c.Kind, Keyspace: c.Keyspace, ID: c.ID, Key: c.Key, Deleted: true})
		}
		return
	}
	s.apply(c)
}

func (s *Snapshot) apply(c Change) {
	switch {
	case c.Kind.HotKey():
		s.applyPool(c)
		return
	case c.Kind.TenantPool():
		s.applyTenantPool(c)
		return
	case c.Kind == KindReplica:
		s.applyReplica(c)
		return
	}
	st := s.Keyspaces[c.Keyspace]
	if st == nil {
		if c.Deleted {
			return
		}
		st = newKeyspaceState(c.Keyspace)
		s.Keyspaces[c.Keyspace] = st
	}
	lease := c.Lease
	switch c.Kind {
	case KindKeyspace:
		st.Config = entry[shard.Keyspace](c)
	case KindMap:
		st.Map = entry[shard.Map](c)
	case KindTokens:
		st.Tokens = entry[uint64](c)
	case KindReserved:
		st.Reserved = entry[shard.Reservation](c)
	case KindMember:
		setEntry(st.Members, c, lease)
	case KindDrain:
		setEntry(st.Drains, c, lease)
	case KindGrants:
		setEntry(st.Grants, c, lease)
	case KindReleases:
		setEntry(st.Releases, c, lease)
	case KindQuarantine:
		setEntry(st.Quarantines, c, lease)
	case KindPositions:
		setEntry(st.Commits, c, lease)
	case KindHeld:
		setEntry(st.Held, c, lease)
	case KindBucketPos:
		chunk, _ := parseChunk(c.ID) // ParseKey checked it
		if c.Deleted {
			delete(st.BucketPos, chunk)
		} else {
			st.BucketPos[chunk] = entry[shard.BucketPositions](c)
		}
	}
	if c.Deleted && st.empty() {
		delete(s.Keyspaces, c.Keyspace)
	}
}

// applyPool applies a change of a hot-key kind; c.Keyspace is the pool.
func (s *Snapshot) applyPool(c Change) {
	p := s.Pools[c.Keyspace]
	if p == nil {
		if c.Deleted {
			return
		}
		p = newPoolState(c.Keyspace)
		s.Pools[c.Keyspace] = p
	}
	switch c.Kind {
	case KindHotPool:
		p.Config = entry[HotPool](c)
	case KindHotReport:
		setEntry(p.Reports, c, c.Lease)
	case KindOverflow:
		p.Overflow = entry[hotkey.OverflowSet](c)
	}
	if c.Deleted && p.empty() {
		delete(s.Pools, c.Keyspace)
	}
}

func entry[T any](c Change) Entry[T] {
	if c.Deleted {
		return Entry[T]{}
	}
	return Entry[T]{Value: c.Value.(T), ModRevision: c.ModRevision, Lease: c.Lease}
}

func setEntry[T any](m map[string]Entry[T], c Change, lease shard.LeaseID) {
	if c.Deleted {
		delete(m, c.ID)
		return
	}
	m[c.ID] = Entry[T]{Value: c.Value.(T), ModRevision: c.ModRevision, Lease: lease}
}

// decodeKV turns a stored key-value into a Change, checking the value
// against the key: names match, and a member record or grants list names
// the lease it is attached to.
func decodeKV(kv *mvccpb.KeyValue) Change {
	c := Change{Key: string(kv.Key), ModRevision: kv.ModRevision, Lease: shard.LeaseID(kv.Lease)}
	kind, ks, id, err := ParseKey(c.Key)
	c.Kind, c.Keyspace, c.ID = kind, ks, id
	if err != nil {
		c.Err = err
		return c
	}
	_, v, err := Decode(c.Key, kv.Value)
	if err != nil {
		c.Err = err
		return c
	}
	switch v := v.(type) {
	case shard.Member:
		if v.Session != c.Lease {
			c.Err = corruptf(c.Key, "session", "%v, but the key is attached to lease %v", v.Session, c.Lease)
			return c
		}
	case TenantMember:
		if v.Session != c.Lease {
			c.Err = corruptf(c.Key, "session", "%v, but the key is attached to lease %v", v.Session, c.Lease)
			return c
		}
	case shard.Grants:
		if v.Session != c.Lease {
			c.Err = corruptf(c.Key, "session", "%v, but the key is attached to lease %v", v.Session, c.Lease)
			return c
		}
	}
	c.Value = v
	return c
}

// crossCheck drops values that disagree with their keyspace's
// configuration (bucket count, hash mode) and records them as corrupt.
func (s *Snapshot) crossCheck() {
	for ks, st := range s.Keyspaces {
		if !st.Config.Exists() {
			continue
		}
		cfg := st.Config.Value
		if st.Map.Exists() {
			m := st.Map.Value
			switch {
			case m.Assignment.Buckets() != cfg.Buckets:
				s.Corrupt[MapKey(ks)] = corruptf(MapKey(ks), "buckets", "%d, but keyspace %q has %d", m.Assignment.Buckets(), ks, cfg.Buckets)
				st.Map = Entry[shard.Map]{}
			case m.Hash != cfg.Hash:
				s.Corrupt[MapKey(ks)] = corruptf(MapKey(ks), "hash", "%q, but keyspace %q uses %q", m.Hash, ks, cfg.Hash)
				st.Map = Entry[shard.Map]{}
			}
		}
		for id, g := range st.Grants {
			if e := checkPairsIn("buckets", g.Value.Buckets, cfg.Buckets); e != nil {
				s.Corrupt[GrantsKey(ks, id)] = e.corrupt(GrantsKey(ks, id))
				delete(st.Grants, id)
			}
		}
		for id, r := range st.Releases {
			if e := checkPairsIn("buckets", r.Value.Buckets, cfg.Buckets); e != nil {
				s.Corrupt[ReleasesKey(ks, id)] = e.corrupt(ReleasesKey(ks, id))
				delete(st.Releases, id)
			}
		}
		for id, q := range st.Quarantines {
			for _, b := range q.Value.Buckets {
				if b >= cfg.Buckets {
					s.Corrupt[QuarantineKey(ks, id)] = corruptf(QuarantineKey(ks, id), "buckets", "bucket %d is outside the keyspace's %d buckets", b, cfg.Buckets)
					delete(st.Quarantines, id)
					break
				}
			}
		}
		for id, c := range st.Commits {
			for _, e := range c.Value.Exceptions {
				if e.Bucket >= cfg.Buckets {
					s.Corrupt[PositionsKey(ks, id)] = corruptf(PositionsKey(ks, id), "exceptions", "bucket %d is outside the keyspace's %d buckets", e.Bucket, cfg.Buckets)
					delete(st.Commits, id)
					break
				}
			}
		}
		for id, h := range st.Held {
			if e := checkPairsIn("held", h.Value.Buckets, cfg.Buckets); e != nil {
				s.Corrupt[HeldKey(ks, id)] = e.corrupt(HeldKey(ks, id))
				delete(st.Held, id)
			}
		}
		for chunk, p := range st.BucketPos {
			if n := len(p.Value.Runs); n > 0 && p.Value.Runs[n-1].First+p.Value.Runs[n-1].Count > cfg.Buckets {
				s.Corrupt[BucketPosKey(ks, chunk)] = corruptf(BucketPosKey(ks, chunk), "runs", "run up to bucket %d is outside the keyspace's %d buckets", p.Value.Runs[n-1].First+p.Value.Runs[n-1].Count-1, cfg.Buckets)
				delete(st.BucketPos, chunk)
			}
		}
		if st.empty() {
			delete(s.Keyspaces, ks)
		}
	}
}

func snapshotFrom(rev int64, kvs ...[]*mvccpb.KeyValue) *Snapshot {
	s := NewSnapshot(rev)
	for _, list := range kvs {
		for _, kv := range list {
			c := decodeKV(kv)
			if c.Kind == KindLeader {
				continue
			}
			if c.Err != nil {
				s.Corrupt[c.Key] = c.Err
				continue
			}
			s.apply(c)
		}
	}
	s.crossCheck()
	return s
}

// LoadKeyspace reads every key of keyspace ks at one revision, in one
// round trip, and returns it as a snapshot holding that one keyspace, and
// the revision. It returns ErrNotFound if the keyspace's configuration key
// does not exist, and ErrInvalidName for a bad name. Values that do not
// decode are in Snapshot.Corrupt.
func (s *Store) LoadKeyspace(ctx context.Context, ks string) (*Snapshot, int64, error) {
	if s.closed() {
		return nil, 0, errClosed("load keyspace")
	}
	if err := ValidateName(KindKeyspace, ks); err != nil {
		return nil, 0, err
	}
	ops := []clientv3.Op{
		clientv3.OpGet(KeyspaceKey(ks)),
		clientv3.OpGet(MapKey(ks)),
		clientv3.OpGet(TokensKey(ks)),
		clientv3.OpGet(ReservedKey(ks)),
	}
	for _, k := range keyspaceKinds {
		ops = append(ops, clientv3.OpGet(kindPrefix(k, ks), clientv3.WithPrefix()))
	}
	resp, err := s.client.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, 0, s.err(fmt.Sprintf("load keyspace %q", ks), err)
	}
	var kvs [][]*mvccpb.KeyValue
	for _, r := range resp.Responses {
		kvs = append(kvs, r.GetResponseRange().Kvs)
	}
	if len(kvs[0]) == 0 {
		return nil, 0, fmt.Errorf("store: load keyspace %q: %w", ks, ErrNotFound)
	}
	snap := snapshotFrom(resp.Header.Revision, kvs...)
	return snap, snap.Rev, nil
}

// LoadAll reads every key under Prefix (except the election's) at one
// revision: keyspaces, hot-key pools and tenant pools (with the published
// value of chunks ahead of their meta: TenantPoolState.Prev).
func (s *Store) LoadAll(ctx context.Context) (*Snapshot, error) {
	if s.closed() {
		return nil, errClosed("load all")
	}
	resp, err := s.client.Get(ctx, Prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, s.err("load all", err)
	}
	snap := snapshotFrom(resp.Header.Revision, resp.Kvs)
	if err := s.loadPublished(ctx, snap); err != nil {
		return nil, err
	}
	return snap, nil
}
