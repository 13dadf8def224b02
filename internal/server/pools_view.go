package server

import (
	"maps"
	"reflect"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/internal/tenantpool"
)

// Every replica keeps each tenant pool's published state in its view, so
// that snapshots, long polls, watches and GetTenants answer from any
// replica. The leader rewrites only the chunks that hold changed tenants;
// the view compares each rewritten chunk with the one it had, and
// rebuilds only the tenants that differ: their tenantpool.Snapshot views
// (Snapshot.Update) and their API assignments.
//
// A round's chunks may take several transactions, with the meta last
// (store.StateWrites). A chunk written for a version above the meta's
// (store.TenantPoolState.Ahead) is kept aside, unapplied, until a meta of
// its version or above arrives: the watch delivers changes in revision
// order, so by then every chunk of that version has arrived, and the
// version is published whole. A replica that starts part way through a
// publication reads the chunks ahead the same way, with their published
// value read at the meta's revision (store.TenantPoolState.Published).

// maxPoolDeltas is how many versions' changed tenants a pool keeps, so a
// watch that fell behind by fewer versions gets only what changed.
const maxPoolDeltas = 64

// tpView is one tenant pool as this replica serves it. Guarded by view.mu.
type tpView struct {
	cfg     store.TenantPool
	state   tenantpool.State              // the published state, joined from the chunks
	chunks  map[int]store.TenantChunk     // the chunks as last applied
	ahead   map[int]bool                  // chunks stored ahead of the meta, not applied yet
	records map[string]store.TenantMember // live member records
	dirty   map[string]bool               // tenants changed since pub's version
	deltas  []poolDelta                   // the latest versions' changed tenants, oldest first
	pub     *poolPub
}

// poolDelta lists the tenants changed (or removed) from version from to
// version to.
type poolDelta struct {
	from, to uint64
	tenants  []string
}

// poolPub is a pool's published snapshot at one version, in the forms the
// API serves. Immutable once built, except full, built once on demand.
type poolPub struct {
	pool      string
	version   uint64
	published time.Time
	policy    *v1.TenantPoolPolicy
	members   []*v1.Member
	live      int // active member records
	snap      *tenantpool.Snapshot
	assign    map[string]*v1.TenantAssignment

	// full is every assignment sorted by tenant, built once on demand
	// (fullOnce) or taken from the previous pub of the same version;
	// atomic because a rebuild reads the previous pub's while a call may
	// be building it.
	fullOnce sync.Once
	full     atomic.Pointer[[]*v1.TenantAssignment]
}

// tpTouch says what of a pool an update changed.
type tpTouch struct {
	chunks map[int]bool
	meta   bool
}

func (v *view) touchTenantPool(touched map[string]*tpTouch, c store.Change) {
	t := touched[c.Keyspace]
	if t == nil {
		t = &tpTouch{chunks: map[int]bool{}}
		touched[c.Keyspace] = t
	}
	if c.Kind != store.KindTenantState {
		return
	}
	if c.ID == "meta" {
		t.meta = true
		return
	}
	var chunk int
	for _, r := range c.ID[2:] { // "t/<chunk>", checked by store.ParseKey
		chunk = chunk*10 + int(r-'0')
	}
	t.chunks[chunk] = true
}

// rebuildTenantPool brings pool name up to date; t nil rebuilds it whole.
// v.mu is held.
func (v *view) rebuildTenantPool(name string, t *tpTouch) {
	ps := v.snap.TenantPools[name]
	if ps == nil || !ps.Config.Exists() {
		delete(v.tpools, name)
		v.metrics.tpTenants.DeleteLabelValues(name)
		v.metrics.tpVersion.DeleteLabelValues(name)
		return
	}
	tv := v.tpools[name]
	records := map[string]store.TenantMember{}
	for id, e := range ps.Members {
		records[id] = e.Value
	}
	if tv == nil || t == nil {
		tv = &tpView{cfg: ps.Config.Value, state: ps.State(), chunks: map[int]store.TenantChunk{}, ahead: map[int]bool{}, records: records, dirty: map[string]bool{}}
		for c := range ps.Chunks {
			if ps.Ahead(c) {
				tv.ahead[c] = true
			}
			if pc, ok := ps.Published(c); ok {
				tv.chunks[c] = pc
			}
		}
		snap := tenantpool.NewSnapshot(tv.state)
		tv.pub = tv.newPub(name, ps, snap, nil, nil)
		v.tpools[name] = tv
		v.exportPool(name, tv.pub)
		return
	}
	tv.cfg, tv.records = ps.Config.Value, records
	apply := map[int]bool{}
	for c := range t.chunks {
		if ps.Ahead(c) {
			tv.ahead[c] = true
		} else {
			apply[c] = true
		}
	}
	for c := range tv.ahead {
		if !ps.Ahead(c) { // the meta of its version arrived
			delete(tv.ahead, c)
			apply[c] = true
		}
	}
	for c := range apply {
		old := tv.chunks[c].Tenants
		e, ok := ps.Chunks[c]
		cur := e.Value.Tenants
		for id, ts := range old {
			if nts, ok := cur[id]; !ok {
				delete(tv.state.Tenants, id)
				tv.dirty[id] = true
			} else if !reflect.DeepEqual(ts, nts) {
				tv.dirty[id] = true
			}
		}
		for id, nts := range cur {
			if _, ok := old[id]; !ok {
				tv.dirty[id] = true
			}
			tv.state.Tenants[id] = nts
		}
		if ok {
			tv.chunks[c] = e.Value
		} else {
			delete(tv.chunks, c)
		}
	}
	m := ps.Meta.Value
	tv.state.Version, tv.state.Members, tv.state.Policy = m.Version, m.Members, m.Policy
	prev := tv.pub
	if m.Version == prev.version {
		// Cooldown bookkeeping, a member's record or the settings: the
		// tenants' published form is unchanged.
		tv.pub = tv.newPub(name, ps, prev.snap, prev.assign, prev)
		v.exportPool(name, tv.pub)
		return
	}
	changed := slices.Sorted(maps.Keys(tv.dirty))
	clear(tv.dirty)
	snap := prev.snap.Update(tv.state, changed)
	assign := maps.Clone(prev.assign)
	if !reflect.DeepEqual(prev.snap.Policy(), snap.Policy()) {
		assign = nil // every tenant's targets may have moved
	} else {
		for _, id := range changed {
			if ts, ok := tv.state.Tenants[id]; ok {
				assign[id] = assignmentProto(id, ts, snap)
			} else {
				delete(assign, id)
			}
		}
	}
	tv.deltas = append(tv.deltas, poolDelta{from: prev.version, to: m.Version, tenants: changed})
	if len(tv.deltas) > maxPoolDeltas {
		tv.deltas = slices.Delete(tv.deltas, 0, len(tv.deltas)-maxPoolDeltas)
	}
	if assign == nil {
		tv.deltas = nil
	}
	tv.pub = tv.newPub(name, ps, snap, assign, nil)
	v.exportPool(name, tv.pub)
}

// newPub builds the published form of tv's state with snap; assign nil
// builds every tenant's assignment. keep, if set, is the previous pub of
// the same version, whose full list stays valid.
func (tv *tpView) newPub(name string, ps *store.TenantPoolState, snap *tenantpool.Snapshot, assign map[string]*v1.TenantAssignment, keep *poolPub) *poolPub {
	if assign == nil {
		assign = make(map[string]*v1.TenantAssignment, len(tv.state.Tenants))
		for id, ts := range tv.state.Tenants {
			assign[id] = assignmentProto(id, ts, snap)
		}
	}
	p := &poolPub{pool: name, version: tv.state.Version, published: ps.Meta.Value.Published, snap: snap, assign: assign,
		policy: tenantPolicyProto(tv.state.Policy, tv.cfg.Window)}
	if !ps.Meta.Exists() {
		p.policy = tenantPolicyProto(tv.cfg.Policy, tv.cfg.Window)
	}
	for _, r := range tv.records {
		if r.Active {
			p.live++
		}
	}
	for _, m := range tv.state.Members {
		mem := &v1.Member{Id: m.ID, Weight: m.Weight, Zone: m.Zone}
		if r, ok := tv.records[m.ID]; ok {
			mem.Address, mem.Metadata = r.Address, r.Metadata
		}
		p.members = append(p.members, mem)
	}
	if keep != nil {
		if full := keep.full.Load(); full != nil {
			p.full.Store(full)
		}
	}
	return p
}

func (v *view) exportPool(name string, p *poolPub) {
	v.metrics.tpTenants.WithLabelValues(name).Set(float64(p.snap.Len()))
	v.metrics.tpVersion.WithLabelValues(name).Set(float64(p.version))
}

// assignmentProto is one tenant's published assignment.
func assignmentProto(id string, ts tenantpool.TenantState, snap *tenantpool.Snapshot) *v1.TenantAssignment {
	a := &v1.TenantAssignment{Tenant: id, Size: uint32(ts.Size.Size), Why: ts.Why, When: tsProto(ts.When)}
	for _, m := range ts.Members {
		a.Members = append(a.Members, &v1.TenantPlacement{Member: m.ID, Added: tsProto(m.Added), Ready: m.Ready})
	}
	for _, r := range ts.Removed {
		a.Removed = append(a.Removed, &v1.TenantRemoval{Member: r.ID, At: tsProto(r.At)})
		// Members lists the removed members still served for the lookback
		// too, as the contract has it; Removed says which they are.
		a.Members = append(a.Members, &v1.TenantPlacement{Member: r.ID})
	}
	sort.Slice(a.Members, func(i, j int) bool { return a.Members[i].Member < a.Members[j].Member })
	for _, sp := range snap.Spans(id) {
		a.Targets = append(a.Targets, &v1.TargetSpan{From: tsProto(sp.From), Members: sp.Members})
	}
	return a
}

// statelessAssignment is the answer for a tenant the snapshot does not
// know: the stateless subset, read since ever.
func statelessAssignment(tenant string, snap *tenantpool.Snapshot, now time.Time) *v1.TenantAssignment {
	targets := snap.Targets(tenant, now)
	a := &v1.TenantAssignment{Tenant: tenant, Size: uint32(len(targets)), Targets: []*v1.TargetSpan{{Members: targets}}}
	for _, m := range targets {
		a.Members = append(a.Members, &v1.TenantPlacement{Member: m, Ready: true})
	}
	return a
}

func tsProto(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// fullList returns every tenant's assignment, sorted by tenant.
func (p *poolPub) fullList() []*v1.TenantAssignment {
	if full := p.full.Load(); full != nil {
		return *full
	}
	p.fullOnce.Do(func() {
		if p.full.Load() != nil {
			return
		}
		ids := slices.Sorted(maps.Keys(p.assign))
		full := make([]*v1.TenantAssignment, len(ids))
		for i, id := range ids {
			full[i] = p.assign[id]
		}
		p.full.Store(&full)
	})
	return *p.full.Load()
}

// snapshotProto is the full snapshot.
func (p *poolPub) snapshotProto() *v1.PoolSnapshot {
	return &v1.PoolSnapshot{Pool: p.pool, Version: p.version, Policy: p.policy, Members: p.members, Full: true, Tenants: p.fullList()}
}

// tenantPool returns the published form of a pool, its settings, the
// tenants changed since version since (ok false if the view cannot tell:
// send the full snapshot), and the channel that closes at the next
// change.
func (v *view) tenantPool(name string, since uint64) (pub *poolPub, cfg store.TenantPool, changed []string, deltaOK bool, next <-chan struct{}) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	tv := v.tpools[name]
	if tv == nil {
		return nil, cfg, nil, false, v.changed
	}
	pub, cfg = tv.pub, tv.cfg
	if since >= pub.version {
		return pub, cfg, nil, since == pub.version, v.changed
	}
	seen := map[string]bool{}
	at := since
	for _, d := range tv.deltas {
		if d.to <= at {
			continue
		}
		if d.from != at {
			return pub, cfg, nil, false, v.changed
		}
		for _, id := range d.tenants {
			if !seen[id] {
				seen[id] = true
				changed = append(changed, id)
			}
		}
		at = d.to
	}
	if at != pub.version {
		return pub, cfg, nil, false, v.changed
	}
	sort.Strings(changed)
	return pub, cfg, changed, true, v.changed
}

// tenantPools returns every pool's settings and published form, sorted by
// name.
func (v *view) tenantPools() []*tpView {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make([]*tpView, 0, len(v.tpools))
	for _, name := range slices.Sorted(maps.Keys(v.tpools)) {
		tv := v.tpools[name]
		out = append(out, &tpView{cfg: tv.cfg, pub: tv.pub})
	}
	return out
}
