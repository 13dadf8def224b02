package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/internal/server"
	"github.com/keyshard/keyshard/internal/store"
)

// publishEnv is two replicas whose publications take many transactions
// (an 8 KiB budget), a pool gw of 10 members and 2000 tenants of size 1
// published at version v1 by leader l; o is the other replica.
type publishEnv struct {
	*tpEnv
	l, o *tpReplica
	v1   uint64
}

const publishTenants = 2000

func newPublishEnv(t *testing.T) *publishEnv {
	e := &publishEnv{tpEnv: newTPEnvConfig(t, 2, func(c *server.Config) { c.TenantPoolTxnBytes = 8 << 10 })}
	e.l = e.leader()
	e.o = e.rs[0]
	if e.o == e.l {
		e.o = e.rs[1]
	}
	e.putPool(e.l, basicPool("gw"))
	for i := range 10 {
		e.join(e.l, "gw", fmt.Sprintf("m%d", i), "")
	}
	counts := map[string]int64{}
	for i := range publishTenants {
		counts[fmt.Sprintf("tenant-%04d", i)] = 1
	}
	e.step(e.l, 12*time.Second) // a window: the leader sizes nobody before it has measured one
	e.report(e.l, "gw", "c1", 1, counts)
	e.step(e.l, time.Second)
	w := e.l.srv.LastTenantPoolWrite("gw")
	if w.Tenants < publishTenants || w.Txns < 4 {
		t.Fatalf("first write %+v; want every tenant, in several transactions", w)
	}
	e.v1 = w.Version
	e.checkWhole(e.o, e.waitVersion(e.o, e.v1), e.v1, 1)
	return e
}

// waitVersion long-polls r until it serves version v or above, and
// returns its snapshot.
func (e *publishEnv) waitVersion(r *tpReplica, v uint64) *v1.PoolSnapshot {
	e.t.Helper()
	snap, err := e.snapshotAt(r, "gw", v)
	if err != nil || snap.GetVersion() < v {
		e.t.Fatalf("waiting for version %d: %v, %v", v, snap, err)
	}
	return snap
}

// snapshot is r's current full snapshot.
func (e *publishEnv) snapshot(r *tpReplica) *v1.PoolSnapshot {
	e.t.Helper()
	resp, err := r.member.GetPoolSnapshot(e.ctx, connect.NewRequest(&v1.GetPoolSnapshotRequest{Pool: "gw"}))
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.Msg.Snapshot
}

// checkWhole fails unless snap is version v with every tenant at size.
func (e *publishEnv) checkWhole(r *tpReplica, snap *v1.PoolSnapshot, v uint64, size uint32) {
	e.t.Helper()
	if snap.Version != v || len(snap.Tenants) != publishTenants {
		e.t.Fatalf("%s serves version %d with %d tenants; want version %d with %d", r.srv.Replica(), snap.Version, len(snap.Tenants), v, publishTenants)
	}
	for _, a := range snap.Tenants {
		if a.Size != size {
			e.t.Fatalf("%s serves version %d with tenant %s of size %d; want every tenant of size %d", r.srv.Replica(), v, a.Tenant, a.Size, size)
		}
	}
}

// ahead waits until r's view holds n chunks of gw ahead of the meta and
// returns them.
func (e *publishEnv) ahead(r *tpReplica, n int) map[int]bool {
	e.t.Helper()
	out := map[int]bool{}
	err := r.srv.WaitView(e.ctx, func(snap *store.Snapshot) bool {
		clear(out)
		if ps := snap.TenantPools["gw"]; ps != nil {
			for c := range store.TenantChunks {
				if ps.Ahead(c) {
					out[c] = true
				}
			}
		}
		return len(out) == n
	})
	if err != nil {
		e.t.Fatalf("%d chunks ahead of the meta in %s's view; want %d: %v", len(out), r.srv.Replica(), n, err)
	}
	return out
}

// resize makes the next round grow every tenant to 3 (min_size): every
// chunk is rewritten.
func (e *publishEnv) resize() {
	p := basicPool("gw")
	p.Policy.MinSize = 3
	e.putPool(e.l, p)
}

// TestTenantPoolPublicationAtomic: a round rewriting all 256 chunks under
// a small budget takes many transactions; held between two of them,
// every reader (the other replica's view, one restarted part way, the
// leader's own, a watch) still serves the previous version whole, and
// once released the new version whole.
func TestTenantPoolPublicationAtomic(t *testing.T) {
	e := newPublishEnv(t)
	watch, err := e.l.member.WatchPoolSnapshot(e.ctx, connect.NewRequest(&v1.WatchPoolSnapshotRequest{Pool: "gw"}))
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	if !watch.Receive() {
		t.Fatalf("watch: %v", watch.Err())
	}
	e.checkWhole(e.l, watch.Msg(), e.v1, 1)

	held, release := make(chan int, 1), make(chan struct{})
	e.l.srv.HoldTenantPoolBatches(func(ctx context.Context, pool string, batch, chunks int) {
		if batch == 2 {
			held <- chunks
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
	})
	defer e.l.srv.HoldTenantPoolBatches(nil)
	e.resize()
	e.clk.Advance(time.Second)
	var n int
	select {
	case n = <-held:
	case <-e.ctx.Done():
		t.Fatal("the round never reached its second transaction")
	}
	e.ahead(e.o, n)
	e.checkWhole(e.o, e.snapshot(e.o), e.v1, 1)
	e.ahead(e.l, n)
	e.checkWhole(e.l, e.snapshot(e.l), e.v1, 1)
	// A replica starting now reads the chunks ahead of the meta.
	if err := e.o.Restart(); err != nil {
		t.Fatal(err)
	}
	e.ahead(e.o, n)
	e.checkWhole(e.o, e.snapshot(e.o), e.v1, 1)

	close(release)
	if err := e.l.WaitTenantPoolRound(e.ctx, e.clk.Now()); err != nil {
		t.Fatal(err)
	}
	w := e.l.srv.LastTenantPoolWrite("gw")
	if w.Version <= e.v1 || w.Txns < 4 || w.Tenants < publishTenants {
		t.Fatalf("resize write %+v; want every tenant at a new version, in several transactions", w)
	}
	e.checkWhole(e.o, e.waitVersion(e.o, w.Version), w.Version, 3)
	e.checkWhole(e.l, e.waitVersion(e.l, w.Version), w.Version, 3)
	if !watch.Receive() {
		t.Fatalf("watch: %v", watch.Err())
	}
	msg := watch.Msg()
	if msg.Version != w.Version || len(msg.Tenants) != publishTenants {
		t.Fatalf("watch's next message: version %d, %d tenants; want version %d with all %d", msg.Version, len(msg.Tenants), w.Version, publishTenants)
	}
	for _, a := range msg.Tenants {
		if a.Size != 3 {
			t.Fatalf("watch's version %d has tenant %s of size %d; want 3", msg.Version, a.Tenant, a.Size)
		}
	}
}

// TestTenantPoolPublicationLeaderStops: a leader stopped between two
// transactions of a publication leaves chunks ahead of the meta; the
// other replica serves the previous version whole meanwhile, and, once it
// leads, publishes a version above it that includes them, consistent
// with the stored chunks.
func TestTenantPoolPublicationLeaderStops(t *testing.T) {
	e := newPublishEnv(t)
	held := make(chan int, 1)
	e.l.srv.HoldTenantPoolBatches(func(ctx context.Context, pool string, batch, chunks int) {
		if batch == 2 {
			held <- chunks
			<-ctx.Done() // the leader stops here
		}
	})
	e.resize()
	e.clk.Advance(time.Second)
	var n int
	select {
	case n = <-held:
	case <-e.ctx.Done():
		t.Fatal("the round never reached its second transaction")
	}
	ahead := e.ahead(e.o, n)
	e.checkWhole(e.o, e.snapshot(e.o), e.v1, 1)
	if err := e.l.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := e.o.WaitLeading(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.ahead(e.o, n) // and no more: the stopped leader wrote nothing after
	e.step(e.o, time.Second)
	w := e.o.srv.LastTenantPoolWrite("gw")
	if w.Version <= e.v1 {
		t.Fatalf("new leader's first write %+v; want a version above %d", w, e.v1)
	}
	var stored map[string]int
	err := e.o.srv.WaitView(e.ctx, func(snap *store.Snapshot) bool {
		ps := snap.TenantPools["gw"]
		if ps == nil || ps.Meta.Value.Version < w.Version {
			return false
		}
		for c := range store.TenantChunks {
			if ps.Ahead(c) {
				return false
			}
		}
		stored = map[string]int{}
		for id, ts := range ps.State().Tenants {
			stored[id] = ts.Size.Size
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	snap := e.waitVersion(e.o, w.Version)
	if len(snap.Tenants) != publishTenants || len(stored) != publishTenants {
		t.Fatalf("version %d: %d tenants served, %d stored; want %d", snap.Version, len(snap.Tenants), len(stored), publishTenants)
	}
	grown := 0
	for _, a := range snap.Tenants {
		if int(a.Size) != stored[a.Tenant] {
			t.Fatalf("version %d serves tenant %s at size %d; stored %d", snap.Version, a.Tenant, a.Size, stored[a.Tenant])
		}
		if ahead[store.TenantChunkOf(a.Tenant)] && a.Size != 3 {
			t.Fatalf("tenant %s of a chunk written before the leader stopped is of size %d; want 3", a.Tenant, a.Size)
		}
		if a.Size == 3 {
			grown++
		}
	}
	t.Logf("new leader published version %d (%+v): %d of %d tenants grown, %d chunks were ahead", snap.Version, w, grown, publishTenants, len(ahead))
}
