package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keyshard/keyshard/internal/tenantpool"
)

// all is every write of p in commit order.
func (p Publication) all() []Write {
	var out []Write
	for _, b := range p.Batches {
		out = append(out, b...)
	}
	return append(out, p.Last...)
}

// applyWrites applies ws to snap as a watch would deliver them.
func applyWrites(t *testing.T, snap *Snapshot, ws []Write, rev int64) {
	t.Helper()
	for _, w := range ws {
		c, err := w.Change(rev)
		if err != nil || c.Err != nil {
			t.Fatalf("write %s: %v %v", w.Key(), err, c.Err)
		}
		snap.Apply(c)
	}
}

// TestStateWritesBatches: a round touching every chunk is split into
// chunk batches under the budget (bytes and writes), each chunk carrying
// the round's version, with the meta last; a chunk above the budget on
// its own goes alone; a reader's State shows the previous version whole
// until the meta arrives, then the new one whole.
func TestStateWritesBatches(t *testing.T) {
	st := tpState(3000)
	var all []string
	for id := range st.Tenants {
		all = append(all, id)
	}
	ix := NewChunkIndex(st)
	const budget = 16 << 10
	pub, err := StateWrites("gw", st, tpAt, nil, all, ix, StateBudget{Bytes: budget, Writes: 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(pub.Batches) < 4 {
		t.Fatalf("%d batches for %d bytes under a %d-byte budget; want several", len(pub.Batches), pub.Bytes, budget)
	}
	if len(pub.Last) != 1 || pub.Last[0].Key() != TenantMetaKey("gw") {
		t.Fatalf("last transaction %v; want the meta alone", pub.Last)
	}
	chunks := 0
	for i, b := range pub.Batches {
		n := 0
		for _, w := range b {
			n += len(w.key) + len(w.val)
			if strings.HasSuffix(w.key, "/meta") || w.del {
				t.Fatalf("batch %d holds %s (delete %v); want chunk puts only", i, w.key, w.del)
			}
		}
		if (n > budget && len(b) > 1) || len(b) > 20 {
			t.Fatalf("batch %d: %d writes of %d bytes; budget %d bytes, 20 writes", i, len(b), n, budget)
		}
		chunks += len(b)
	}
	if chunks != TenantChunks {
		t.Fatalf("%d chunks written; want all %d", chunks, TenantChunks)
	}

	// A reader at version 7 sees nothing of version 8 until its meta.
	snap := NewSnapshot(0)
	applyWrites(t, snap, pub.all(), 1)
	before := snap.TenantPools["gw"].State()
	next := tenantpool.Clone(st)
	next.Version = 8
	for id, ts := range next.Tenants {
		ts.Size.Size = 3
		next.Tenants[id] = ts
	}
	meta := snap.TenantPools["gw"].Meta.Value
	pub8, err := StateWrites("gw", next, tpAt.Add(time.Second), &meta, all, ix, StateBudget{Bytes: budget})
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range pub8.Batches {
		applyWrites(t, snap, b, int64(2+i))
		checkPublished(t, snap.TenantPools["gw"], before)
	}
	applyWrites(t, snap, pub8.Last, 100)
	if got := snap.TenantPools["gw"].State(); !reflect.DeepEqual(got, next) {
		t.Fatalf("after the meta: version %d, %d tenants; want version 8 whole", got.Version, len(got.Tenants))
	}

	// One chunk above the budget goes alone.
	big, err := StateWrites("gw", st, tpAt, nil, all, ix, StateBudget{Bytes: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(big.Batches) != TenantChunks {
		t.Fatalf("%d batches under a 10-byte budget; want one per chunk", len(big.Batches))
	}
}

// checkPublished fails unless ps publishes prev, but for the chunks
// ahead of the meta, which State leaves out (a reader keeps what it had
// applied of them).
func checkPublished(t *testing.T, ps *TenantPoolState, prev tenantpool.State) {
	t.Helper()
	got := ps.State()
	if got.Version != prev.Version || !reflect.DeepEqual(got.Members, prev.Members) {
		t.Fatalf("published version %d; want %d", got.Version, prev.Version)
	}
	for id, ts := range prev.Tenants {
		if ps.Ahead(TenantChunkOf(id)) {
			if _, ok := got.Tenants[id]; ok {
				t.Fatalf("tenant %s of a chunk ahead of the meta is published", id)
			}
		} else if !reflect.DeepEqual(got.Tenants[id], ts) {
			t.Fatalf("tenant %s moved before its version was published", id)
		}
	}
}

// TestTenantChunkVersionless: a chunk stored before chunks carried their
// version (the bare map of tenants) decodes as version 0, and a tenant
// named "v" is not mistaken for the version.
func TestTenantChunkVersionless(t *testing.T) {
	ts := tpState(1).Tenants["tenant-00000"]
	var key string
	for c := 0; c < TenantChunks; c++ {
		if TenantChunkOf("v") == c {
			key = TenantChunkKey("gw", c)
		}
	}
	bare, err := json.Marshal(map[string]tenantStateWire{"v": tenantToWire(ts)})
	if err != nil {
		t.Fatal(err)
	}
	c, err := DecodeTenantChunk(key, bare)
	if err != nil || c.Version != 0 || !reflect.DeepEqual(c.Tenants["v"], ts) {
		t.Fatalf("bare chunk: %+v, %v; want version 0 holding tenant v", c, err)
	}
	b, err := EncodeTenantChunk(TenantChunk{Version: 12, Tenants: map[string]tenantpool.TenantState{"v": ts}})
	if err != nil {
		t.Fatal(err)
	}
	c, err = DecodeTenantChunk(key, b)
	if err != nil || c.Version != 12 || !reflect.DeepEqual(c.Tenants["v"], ts) {
		t.Fatalf("versioned chunk: %+v, %v; want version 12 holding tenant v", c, err)
	}
	if _, err := DecodeTenantChunk(key, []byte(`{"v":"x","t":{}}`)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("bad version: %v; want ErrCorrupt", err)
	}
}

// TestTenantPublicationEtcd: a publication committed transaction by
// transaction on etcd, stopped before its meta, leaves chunks ahead of the
// meta; LoadTenantState takes them, at their version, so that the next
// leader's meta publishes them.
func TestTenantPublicationEtcd(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 30*time.Second)
	_, f := campaign(t, s, "tp-publish")
	const pool = "tp-publish"
	st := tpState(2000)
	var all []string
	for id := range st.Tenants {
		all = append(all, id)
	}
	ix := NewChunkIndex(st)
	pub, err := StateWrites(pool, st, tpAt, nil, all, ix, StateBudget{Bytes: 8 << 10, Writes: s.MaxTxnWrites()})
	if err != nil {
		t.Fatal(err)
	}
	commit := func(ws []Write) int64 {
		t.Helper()
		rev, err := s.Commit(ctx, f, ws, nil)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	for _, b := range pub.Batches {
		commit(b)
	}
	commit(pub.Last)
	got, meta, ok, err := s.LoadTenantState(ctx, pool)
	if err != nil || !ok || meta.Version != 7 || !reflect.DeepEqual(got, st) {
		t.Fatalf("load: version %d (meta %d, ok %v), %d tenants, %v; want version 7 whole", got.Version, meta.Version, ok, len(got.Tenants), err)
	}

	// Version 8 rewrites every chunk; the leader stops after half the
	// batches.
	next := tenantpool.Clone(st)
	next.Version = 8
	for id, ts := range next.Tenants {
		ts.Why = "rate 13/s"
		next.Tenants[id] = ts
	}
	pub8, err := StateWrites(pool, next, tpAt.Add(time.Second), &meta, all, ix, StateBudget{Bytes: 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
	half := len(pub8.Batches) / 2
	var written []int
	for _, b := range pub8.Batches[:half] {
		commit(b)
		for _, w := range b {
			var c int
			fmt.Sscanf(w.Key()[strings.LastIndex(w.Key(), "/")+1:], "%d", &c)
			written = append(written, c)
		}
	}
	resp, err := s.client.Get(ctx, Prefix+"tpstate/"+pool+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	ps := newTenantPoolState(pool)
	for _, kv := range resp.Kvs {
		(&Snapshot{TenantPools: map[string]*TenantPoolState{pool: ps}}).applyTenantPool(decodeKV(kv))
	}
	for c := range TenantChunks {
		if want := slices.Contains(written, c); ps.Ahead(c) != want {
			t.Fatalf("chunk %d ahead %v; want %v", c, ps.Ahead(c), want)
		}
	}
	checkPublished(t, ps, st)

	got, meta, _, err = s.LoadTenantState(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != 8 || meta.Version != 7 {
		t.Fatalf("load mid-publication: state version %d, meta %d; want 8 over meta 7", got.Version, meta.Version)
	}
	for id, ts := range got.Tenants {
		want := st.Tenants[id]
		if slices.Contains(written, TenantChunkOf(id)) {
			want = next.Tenants[id]
		}
		if !reflect.DeepEqual(ts, want) {
			t.Fatalf("tenant %s: %+v; want %+v", id, ts, want)
		}
	}
	// The next leader's round changes nothing more: its meta alone
	// publishes the chunks ahead.
	fin, err := StateWrites(pool, got, tpAt.Add(2*time.Second), &meta, nil, ix, StateBudget{})
	if err != nil {
		t.Fatal(err)
	}
	if len(fin.Batches) != 0 || len(fin.Last) != 1 {
		t.Fatalf("publication of a loaded state: %d batches, %d last writes; want the meta alone", len(fin.Batches), len(fin.Last))
	}
	commit(fin.Last)
	resp, err = s.client.Get(ctx, Prefix+"tpstate/"+pool+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	ps = newTenantPoolState(pool)
	for _, kv := range resp.Kvs {
		(&Snapshot{TenantPools: map[string]*TenantPoolState{pool: ps}}).applyTenantPool(decodeKV(kv))
	}
	if pubd := ps.State(); !reflect.DeepEqual(pubd, got) {
		t.Fatalf("published after the meta: version %d, %d tenants; want the loaded state at version 8", pubd.Version, len(pubd.Tenants))
	}
}
