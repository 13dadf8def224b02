package server

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
)

// memStore is a leaderStore in memory: the keys of the layout at one
// revision counter, leases that never expire on their own, the fence of
// the elected leader, and a watch that delivers only when the test says
// so (flush, resync), so that a test decides how far behind it is. Commits
// apply as etcd's do (one revision per commit, the fence and the
// expectations checked first, a put on a lease that is gone refused), or
// fail on cue (failCommit). It is safe for concurrent use.
type memStore struct {
	mu        sync.Mutex
	rev       int64
	kvs       map[string]store.Change // the current value of each key, as put
	leases    map[shard.LeaseID]time.Duration
	nextLease shard.LeaseID
	fence     store.Fence    // the elected leader's; any other is fenced
	history   []store.Update // every revision's changes, in order
	faults    []memFault     // what matching commits do instead
	commits   []memCommit    // every Commit call, in order
	watchAt   int64          // the watch has delivered up to here
	queue     []store.Update // flushed, not yet received by the watcher
	wake      chan struct{}  // closed and replaced when queue grows
}

// memFault makes the first commit that writes key fail with err; if apply,
// the commit applies all the same (its answer was lost).
type memFault struct {
	key   string
	err   error
	apply bool
	race  *store.Change // applied first, at a revision of its own; then the commit goes on
}

// memCommit is one Commit call: the keys it wrote, and its outcome.
type memCommit struct {
	keys []string
	rev  int64 // 0 unless it applied
	err  error
}

func newMemStore() *memStore {
	return &memStore{
		kvs:       map[string]store.Change{},
		leases:    map[shard.LeaseID]time.Duration{},
		nextLease: 0x100,
		fence:     store.Fence{LeaderKey: store.ElectionPrefix + "/1", LeaderRev: 1},
		wake:      make(chan struct{}),
	}
}

// apply applies changes at the next revision and records them. m.mu is
// held.
func (m *memStore) apply(changes []store.Change) int64 {
	m.rev++
	for i := range changes {
		c := &changes[i]
		c.ModRevision = m.rev
		if c.Deleted {
			delete(m.kvs, c.Key)
		} else {
			m.kvs[c.Key] = *c
		}
	}
	m.history = append(m.history, store.Update{Changes: changes, Rev: m.rev})
	return m.rev
}

// put stores value at key of kind (for keyspace ks, member id), on lease,
// as a member or the API would: at a revision of its own.
func (m *memStore) put(kind store.Kind, ks, id string, value any, lease shard.LeaseID) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.apply([]store.Change{{Kind: kind, Keyspace: ks, ID: id, Key: store.Key(kind, ks, id), Value: value, Lease: lease}})
}

// join grants a session and joins member id to ks on it, active.
func (m *memStore) join(ks, id string, ttl time.Duration) shard.LeaseID {
	lease, _, _ := m.Grant(context.Background(), ttl)
	m.put(store.KindMember, ks, id, shard.Member{ID: id, Weight: 1, Session: lease, JoinedAt: time.Unix(1_700_000_000, 0)}, lease)
	return lease
}

// leader returns the elected leader's fence.
func (m *memStore) leader() store.Fence {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.fence
}

// depose elects another replica: the current fence no longer holds.
func (m *memStore) depose() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fence = store.Fence{LeaderKey: store.ElectionPrefix + "/2", LeaderRev: m.rev + 1}
}

// failCommit makes the next commit that writes key fail with err, after
// applying it if apply is set.
func (m *memStore) failCommit(key string, err error, apply bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.faults = append(m.faults, memFault{key: key, err: err, apply: apply})
}

// raceCommit makes the next commit that writes key find c applied just
// before it, at a revision of its own, as a member's write that lands
// while the leader's commit is on its way.
func (m *memStore) raceCommit(key string, c store.Change) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c.Key = store.Key(c.Kind, c.Keyspace, c.ID)
	m.faults = append(m.faults, memFault{key: key, race: &c})
}

// snapshot returns the state now.
func (m *memStore) snapshot() *store.Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := store.NewSnapshot(m.rev)
	keys := make([]string, 0, len(m.kvs))
	for k := range m.kvs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		s.Apply(m.kvs[k])
	}
	return s
}

// calls returns every Commit call so far.
func (m *memStore) calls() []memCommit {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.commits)
}

// flush queues, for the watch, every change it has not delivered yet.
func (m *memStore) flush() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, u := range m.history {
		if u.Rev > m.watchAt {
			m.queue = append(m.queue, u)
		}
	}
	m.watchAt = m.rev
	m.notify()
}

// resync queues snap as a Resync for the watch, which then goes on from
// snap's revision: a watch whose stream broke and that re-read the store,
// perhaps before the leader's latest commits.
func (m *memStore) resync(snap *store.Snapshot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.queue = append(m.queue, store.Update{Resync: &store.Resync{Snapshot: snap, Rev: snap.Rev}, Rev: snap.Rev})
	m.watchAt = snap.Rev
	m.notify()
}

// notify wakes the watch. m.mu is held.
func (m *memStore) notify() {
	close(m.wake)
	m.wake = make(chan struct{})
}

// LoadAll returns the state now.
func (m *memStore) LoadAll(ctx context.Context) (*store.Snapshot, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return m.snapshot(), nil
}

// Watch delivers, from fromRev on, what flush and resync queue. It serves
// one watch at a time, as one term's loop opens one. Its goroutine closes
// the channel and exits when ctx ends.
func (m *memStore) Watch(ctx context.Context, fromRev int64) <-chan store.Update {
	m.mu.Lock()
	m.watchAt, m.queue = fromRev-1, nil
	m.mu.Unlock()
	out := make(chan store.Update)
	go func() { // exits when ctx ends
		defer close(out)
		for {
			m.mu.Lock()
			wake := m.wake
			var u store.Update
			ok := len(m.queue) > 0
			if ok {
				u, m.queue = m.queue[0], m.queue[1:]
			}
			m.mu.Unlock()
			if !ok {
				select {
				case <-wake:
					continue
				case <-ctx.Done():
					return
				}
			}
			select {
			case out <- u:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// Commit applies writes as one revision if f is the elected leader's and
// every expectation holds, as store.Commit does, unless a fault matches.
func (m *memStore) Commit(ctx context.Context, f store.Fence, writes []store.Write, expects []store.Expect) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	call := memCommit{}
	for _, w := range writes {
		call.keys = append(call.keys, w.Key())
	}
	call.rev, call.err = m.commit(f, writes, expects)
	m.commits = append(m.commits, call)
	if call.err != nil {
		return 0, call.err
	}
	return call.rev, nil
}

// commit is Commit's work. m.mu is held.
func (m *memStore) commit(f store.Fence, writes []store.Write, expects []store.Expect) (int64, error) {
	if f != m.fence {
		return 0, fmt.Errorf("store: commit: %w: leader key %q created at revision %d is gone", store.ErrFenced, f.LeaderKey, f.LeaderRev)
	}
	for i, fault := range m.faults {
		if slices.ContainsFunc(writes, func(w store.Write) bool { return w.Key() == fault.key }) {
			m.faults = slices.Delete(m.faults, i, i+1)
			if fault.race != nil {
				m.apply([]store.Change{*fault.race})
				return m.commit(f, writes, expects)
			}
			if !fault.apply {
				return 0, fault.err
			}
			rev, err := m.commit(f, writes, expects)
			if err != nil {
				return 0, err
			}
			return rev, fault.err // applied at rev, but the answer is lost
		}
	}
	for _, e := range expects {
		if now := m.kvs[e.Key].ModRevision; now != e.ModRevision {
			return 0, fmt.Errorf("store: commit: %w: %q was read at revision %d and is now at %d", store.ErrConflict, e.Key, e.ModRevision, now)
		}
	}
	changes := make([]store.Change, 0, len(writes))
	for _, w := range writes {
		if w.History() {
			continue // outside the layout the watch delivers
		}
		c, err := w.Change(m.rev + 1)
		if err != nil {
			return 0, err
		}
		if _, live := m.leases[c.Lease]; c.Lease != 0 && !live {
			return 0, fmt.Errorf("store: commit: %w: lease %v", store.ErrLeaseNotFound, c.Lease)
		}
		changes = append(changes, c)
	}
	return m.apply(changes), nil
}

// Rev returns the store's current revision.
func (m *memStore) Rev(ctx context.Context) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rev, nil
}

// QuarantineOf returns the lease of member id's quarantine and its TTL.
func (m *memStore) QuarantineOf(ctx context.Context, ks, id string) (store.QuarantineInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.kvs[store.QuarantineKey(ks, id)]
	if !ok || c.Lease == 0 {
		return store.QuarantineInfo{}, nil
	}
	return store.QuarantineInfo{Lease: c.Lease, Left: m.leases[c.Lease]}, nil
}

// TimeToLive returns a live lease's TTL (leases here never run down).
func (m *memStore) TimeToLive(ctx context.Context, id shard.LeaseID) (store.LeaseInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ttl, ok := m.leases[id]
	if !ok {
		return store.LeaseInfo{}, fmt.Errorf("store: time to live of lease %v: %w", id, store.ErrLeaseNotFound)
	}
	return store.LeaseInfo{TTL: ttl, Granted: ttl}, nil
}

// Grant grants a lease of ttl.
func (m *memStore) Grant(ctx context.Context, ttl time.Duration) (shard.LeaseID, time.Duration, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nextLease++
	m.leases[m.nextLease] = ttl
	return m.nextLease, ttl, nil
}

// Revoke ends lease id and deletes every key on it, in one revision.
func (m *memStore) Revoke(ctx context.Context, id shard.LeaseID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.leases[id]; !ok {
		return fmt.Errorf("store: revoke lease %v: %w", id, store.ErrLeaseNotFound)
	}
	delete(m.leases, id)
	var gone []store.Change
	for _, c := range m.kvs {
		if c.Lease == id {
			gone = append(gone, store.Change{Kind: c.Kind, Keyspace: c.Keyspace, ID: c.ID, Key: c.Key, Deleted: true})
		}
	}
	slices.SortFunc(gone, func(a, b store.Change) int { return strings.Compare(a.Key, b.Key) })
	if len(gone) > 0 {
		m.apply(gone)
	}
	return nil
}

var _ leaderStore = (*memStore)(nil)
