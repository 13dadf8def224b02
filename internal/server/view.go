package server

import (
	"context"
	"log/slog"
	"sync"
	"time"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/placement"
)

// view is every replica's in-memory copy of the store, kept current by one
// watch. API reads (maps, grants, members, lookups, overflow sets) are
// answered from it, and long polls wait on it, so reads never touch etcd.
type view struct {
	log     *slog.Logger
	metrics *metrics

	mu      sync.RWMutex
	snap    *store.Snapshot
	maps    map[string]*mapView // keyspace → derived map, rebuilt when its map or members change
	sets    map[string]*setView // pool → served overflow set, rebuilt when the stored set changes
	tpools  map[string]*tpView  // tenant pool → served state, updated from the chunks that change
	synced  chan struct{}       // closed once the first full snapshot is loaded
	changed chan struct{}       // closed and replaced after every applied update
	// revCh is closed and replaced whenever snap.Rev advances, also by a
	// progress update (which changes nothing else, so leaves changed be).
	revCh chan struct{}
	// ksChanged: keyspace → a channel closed at the next update that
	// changes one of its keys (or resyncs), made on demand (keyspaceChanged).
	// A member's grants stream waits on its keyspace's alone: every update
	// woke every stream of the replica, whatever its keyspace.
	ksChanged map[string]chan struct{}
}

// setView is a pool's overflow set in the form the API serves.
type setView struct {
	version uint64
	proto   *v1.OverflowSet
}

// mapView is a keyspace's map in the forms the API serves.
type mapView struct {
	epoch uint64
	proto *v1.Map
	table *placement.Table
	addr  map[string]string
}

func newView(log *slog.Logger, m *metrics) *view {
	return &view{log: log, metrics: m, maps: map[string]*mapView{}, sets: map[string]*setView{}, tpools: map[string]*tpView{}, synced: make(chan struct{}), changed: make(chan struct{}), revCh: make(chan struct{}), ksChanged: map[string]chan struct{}{}, snap: store.NewSnapshot(0)}
}

// run follows the store until ctx ends. It owns no goroutine of its own:
// the caller runs it in one.
func (v *view) run(ctx context.Context, st *store.Store) error {
	for u := range st.Watch(ctx, 0) {
		v.apply(u)
	}
	return ctx.Err()
}

func (v *view) apply(u store.Update) {
	v.mu.Lock()
	if v.snap.Rev < u.Rev {
		close(v.revCh)
		v.revCh = make(chan struct{})
	}
	if u.Progress {
		v.snap.Rev = max(v.snap.Rev, u.Rev)
		v.mu.Unlock()
		return
	}
	touched := map[string]bool{}
	pools := map[string]bool{}
	tpools := map[string]*tpTouch{}
	tpFull := map[string]bool{}
	if u.Resync != nil {
		v.snap = u.Resync.Snapshot
		for name := range v.snap.Keyspaces {
			touched[name] = true
		}
		for name := range v.maps {
			touched[name] = true
		}
		for name := range v.snap.Pools {
			pools[name] = true
		}
		for name := range v.sets {
			pools[name] = true
		}
		for name := range v.snap.TenantPools {
			tpFull[name] = true
		}
		for name := range v.tpools {
			tpFull[name] = true
		}
		for key, err := range v.snap.Corrupt {
			v.log.Error("corrupt value in the store; ignoring it", "key", key, "err", err)
		}
		select {
		case <-v.synced:
		default:
			close(v.synced)
		}
	}
	if v.snap.Rev < u.Rev {
		v.snap.Rev = u.Rev // election-key changes the view does not keep
	}
	for _, c := range u.Changes {
		if c.Err != nil {
			v.log.Error("corrupt value in the store; ignoring it", "key", c.Key, "err", c.Err)
		}
		v.snap.Apply(c)
		switch c.Kind {
		case store.KindMap, store.KindMember, store.KindKeyspace:
			touched[c.Keyspace] = true
		case store.KindOverflow:
			pools[c.Keyspace] = true
		case store.KindTenantPool, store.KindTenantMember, store.KindTenantState:
			v.touchTenantPool(tpools, c)
		}
	}
	for name := range touched {
		v.rebuild(name)
	}
	for name := range pools {
		v.rebuildSet(name)
	}
	for name := range tpFull {
		v.rebuildTenantPool(name, nil)
	}
	for name, t := range tpools {
		if !tpFull[name] {
			v.rebuildTenantPool(name, t)
		}
	}
	close(v.changed)
	v.changed = make(chan struct{})
	if u.Resync != nil {
		for ks, ch := range v.ksChanged {
			close(ch)
			delete(v.ksChanged, ks)
		}
	}
	for _, c := range u.Changes {
		if ch, ok := v.ksChanged[c.Keyspace]; ok {
			close(ch)
			delete(v.ksChanged, c.Keyspace)
		}
	}
	v.mu.Unlock()
}

// rebuild derives the served map of one keyspace. v.mu is held.
func (v *view) rebuild(name string) {
	ks := v.snap.Keyspaces[name]
	if ks == nil || !ks.Map.Exists() || !ks.Config.Exists() {
		delete(v.maps, name)
		return
	}
	m := ks.Map.Value
	a := m.Assignment
	mv := &mapView{epoch: m.Epoch, addr: map[string]string{}}
	mv.proto = &v1.Map{Keyspace: name, Epoch: m.Epoch, Buckets: uint32(a.Buckets()), Hash: string(m.Hash), Owners: make([]uint32, len(a.Owners))}
	for _, id := range a.Members {
		mem := &v1.Member{Id: id}
		if e, ok := ks.Members[id]; ok {
			mem = memberProto(e.Value)
			mv.addr[id] = e.Value.Address
		}
		mv.proto.Members = append(mv.proto.Members, mem)
	}
	for b, o := range a.Owners {
		mv.proto.Owners[b] = uint32(o + 1) // 0: unassigned, i: Members[i-1]
	}
	table, err := placement.NewTable(m.Hash, a)
	if err != nil {
		v.log.Error("stored map does not make a lookup table", "keyspace", name, "err", err)
		delete(v.maps, name)
		return
	}
	mv.table = table
	v.maps[name] = mv
}

// rebuildSet derives the served overflow set of one pool and exports its
// size and version. v.mu is held.
func (v *view) rebuildSet(name string) {
	ps := v.snap.Pools[name]
	if ps == nil || !ps.Overflow.Exists() {
		delete(v.sets, name)
		v.metrics.overflowKeys.DeleteLabelValues(name)
		v.metrics.overflowVersion.DeleteLabelValues(name)
		return
	}
	set := ps.Overflow.Value
	v.sets[name] = &setView{version: set.Version, proto: overflowProto(name, set)}
	v.metrics.overflowKeys.WithLabelValues(name).Set(float64(len(set.Entries)))
	v.metrics.overflowVersion.WithLabelValues(name).Set(float64(set.Version))
}

// overflowSet returns the served overflow set of a pool (version 0 and no
// keys if the leader has written none yet) and the channel that closes at
// the next change, for long polls.
func (v *view) overflowSet(pool string) (*setView, <-chan struct{}) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	sv := v.sets[pool]
	if sv == nil {
		sv = &setView{proto: &v1.OverflowSet{Pool: pool}}
	}
	return sv, v.changed
}

// read calls f with the snapshot under the read lock and returns the
// channel that closes at the next change, for long polls.
func (v *view) read(f func(s *store.Snapshot, maps map[string]*mapView)) <-chan struct{} {
	v.mu.RLock()
	defer v.mu.RUnlock()
	f(v.snap, v.maps)
	return v.changed
}

// keyspaceChanged returns a channel that closes at the next update that
// changes a key of keyspace ks (or resyncs). Call it before reading the
// state it guards, as with read's channel.
func (v *view) keyspaceChanged(ks string) <-chan struct{} {
	v.mu.Lock()
	defer v.mu.Unlock()
	ch, ok := v.ksChanged[ks]
	if !ok {
		ch = make(chan struct{})
		v.ksChanged[ks] = ch
	}
	return ch
}

// waitRev waits until the view has applied revision rev (a write this
// replica just made), so that the caller's next read through this replica
// sees it: read-your-writes. It gives up quietly after a few seconds or
// when ctx ends; the write has succeeded either way.
func (v *view) waitRev(ctx context.Context, rev int64) {
	v.reach(ctx, nil, rev, 5*time.Second)
}

// reach waits until the view has applied revision rev, for at most wait,
// and reports whether it did. With st, it asks st's watch for its
// progress while it waits, which comes even when the view's keys did not
// change up to rev (other applications' writes to the same etcd).
func (v *view) reach(ctx context.Context, st progressRequester, rev int64, wait time.Duration) bool {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		v.mu.RLock()
		at, ch := v.snap.Rev, v.revCh
		v.mu.RUnlock()
		if at >= rev {
			return true
		}
		if st != nil {
			if err := st.RequestWatchProgress(ctx); err != nil {
				return false
			}
		}
		select {
		case <-ch:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// progressRequester is the store's RequestWatchProgress (reach's).
type progressRequester interface {
	RequestWatchProgress(ctx context.Context) error
}

func (v *view) ready() bool {
	select {
	case <-v.synced:
		return true
	default:
		return false
	}
}
