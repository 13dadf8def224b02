package store

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/keyshard/keyshard/internal/tenantpool"
	"github.com/keyshard/keyshard/placement"
)

var tpAt = time.Date(2026, 5, 6, 7, 0, 0, 0, time.UTC)

func tpState(n int) tenantpool.State {
	st := tenantpool.State{Version: 7, Members: []placement.Member{{ID: "m1", Weight: 1, Zone: "a"}, {ID: "m2", Weight: 2}},
		Policy:  tenantpool.Policy{CapacityPerMember: 10, Lookback: time.Minute, Overrides: map[string]tenantpool.Override{"t1": {Size: 3}}},
		Tenants: map[string]tenantpool.TenantState{}}
	for i := range n {
		st.Tenants[fmt.Sprintf("tenant-%05d", i)] = tenantpool.TenantState{
			Size:    placement.SizeState{Size: 2, Wanted: 1, BelowSince: tpAt},
			Members: []tenantpool.Placement{{ID: "m1"}, {ID: "m2", Added: tpAt, Ready: true}},
			Removed: []tenantpool.Removal{{ID: "m3", At: tpAt.Add(time.Second), ReadUntil: tpAt.Add(time.Minute)}, {ID: "m4", At: tpAt, ServeOnly: true}},
			Why:     "rate 12/s", When: tpAt,
		}
	}
	return st
}

// TestTenantStateRoundTrip: the state written by StateWrites decodes to
// the same state, chunk by chunk.
func TestTenantStateRoundTrip(t *testing.T) {
	st := tpState(1000)
	var all []string
	for id := range st.Tenants {
		all = append(all, id)
	}
	pub, err := StateWrites("gw", st, tpAt, nil, all, NewChunkIndex(st), StateBudget{})
	if err != nil {
		t.Fatal(err)
	}
	writes, bytes := pub.all(), pub.Bytes
	if bytes == 0 || len(writes) < 200 || pub.Writes != len(writes) {
		t.Fatalf("%d writes of %d bytes for 1000 tenants; want meta and most of the 256 chunks", len(writes), bytes)
	}
	snap := NewSnapshot(0)
	for i, w := range writes {
		c, err := w.Change(int64(i + 1))
		if err != nil || c.Err != nil {
			t.Fatalf("write %s: %v %v", w.Key(), err, c.Err)
		}
		snap.Apply(c)
	}
	got := snap.TenantPools["gw"].State()
	if !reflect.DeepEqual(got, st) {
		t.Fatalf("decoded state differs:\n got %+v\nwant %+v", got.Tenants["tenant-00001"], st.Tenants["tenant-00001"])
	}
	// One tenant's change rewrites its chunk, and the meta only if it
	// changed.
	meta := snap.TenantPools["gw"].Meta.Value
	onePub, err := StateWrites("gw", st, tpAt.Add(time.Second), &meta, []string{"tenant-00042"}, NewChunkIndex(st), StateBudget{})
	if err != nil {
		t.Fatal(err)
	}
	one := onePub.all()
	if len(one) != 1 || one[0].Key() != TenantChunkKey("gw", TenantChunkOf("tenant-00042")) {
		t.Fatalf("writes for one tenant: %d, first %s; want its chunk only", len(one), one[0].Key())
	}
}

// TestTenantChunkTooLarge: a chunk past MaxTenantChunkBytes is refused
// with ErrTooLarge, saying what to do.
func TestTenantChunkTooLarge(t *testing.T) {
	c := TenantChunk{Tenants: map[string]tenantpool.TenantState{}}
	ts := tpState(1).Tenants["tenant-00000"]
	ts.Why = strings.Repeat("x", 2000)
	for i := range 600 {
		c.Tenants[fmt.Sprintf("t%d", i)] = ts
	}
	_, err := EncodeTenantChunk(c)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "forget_after") {
		t.Fatalf("err = %v; want ErrTooLarge naming forget_after", err)
	}
}

// TestTenantKeys: the tenant-pool keys parse back to their kind, pool and
// id, and bad ones are refused.
func TestTenantKeys(t *testing.T) {
	for _, c := range []struct {
		key      string
		kind     Kind
		pool, id string
	}{
		{TenantPoolKey("gw"), KindTenantPool, "gw", ""},
		{TenantMemberKey("gw", "m1"), KindTenantMember, "gw", "m1"},
		{TenantMetaKey("gw"), KindTenantState, "gw", "meta"},
		{TenantChunkKey("gw", 255), KindTenantState, "gw", "t/255"},
		{ReplicaKey("r1"), KindReplica, "r1", ""},
	} {
		kind, pool, id, err := ParseKey(c.key)
		if err != nil || kind != c.kind || pool != c.pool || id != c.id {
			t.Errorf("ParseKey(%s) = %v %q %q %v", c.key, kind, pool, id, err)
		}
	}
	for _, bad := range []string{Prefix + "tpstate/gw/t/256", Prefix + "tpstate/gw/t/01", Prefix + "tpstate/gw/x", Prefix + "tpmembers/gw/bad id"} {
		if _, _, _, err := ParseKey(bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("ParseKey(%s) = %v; want ErrCorrupt", bad, err)
		}
	}
}
