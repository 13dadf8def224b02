package bench

import (
	"path/filepath"
	"testing"

	"github.com/keyshard/keyshard/internal/store"
)

// TestFloorQuick runs the floor measurement of `bench control` on an
// embedded etcd and checks its structure and consistency, not its
// timings: every measured pair is split into its two writes, the bucket
// moved once per pair with a new token each time, the last grant in etcd
// names the member the rig thinks holds it, and nothing was written
// under Keyshard's own prefix (a server on the same etcd never sees it).
func TestFloorQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd; skipped with -short")
	}
	ctx := t.Context()
	emb, err := store.StartEmbedded(ctx, store.EmbeddedConfig{Dir: filepath.Join(t.TempDir(), "etcd"), Name: "floor"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emb.Close() })
	f, err := startFloor(ctx, emb.Endpoints(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	const n = 20
	if err := f.run(ctx, n/2); err != nil {
		t.Fatal(err)
	}
	if err := f.run(ctx, n-n/2); err != nil {
		t.Fatal(err)
	}

	total, release, grant := f.pairs()
	if len(total) != n || len(release) != n || len(grant) != n {
		t.Fatalf("%d pairs (%d release, %d grant stages), want %d of each", len(total), len(release), len(grant), n)
	}
	for i := range total {
		if release[i] <= 0 || grant[i] <= 0 || total[i] != release[i]+grant[i] {
			t.Errorf("pair %d: total %v, release %v, grant %v: want both stages > 0, summing to the total", i, total[i], release[i], grant[i])
		}
	}
	if p50, p99 := percentileMs(total, 50), percentileMs(total, 99); !(0 < p50 && p50 <= p99) {
		t.Errorf("floor p50 %v, p99 %v ms: want 0 < p50 <= p99", p50, p99)
	}
	if want := uint64(1 + floorWarmup + n); f.token != want {
		t.Errorf("token %d after %d warm-up and %d measured pairs, want %d", f.token, floorWarmup, n, want)
	}

	snap, err := f.st.LoadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ks := snap.Keyspaces[floorKeyspace]
	if ks == nil {
		t.Fatalf("no keyspace %q under the floor's namespace", floorKeyspace)
	}
	if ks.Tokens.Value != f.token {
		t.Errorf("tokens key %d, want %d", ks.Tokens.Value, f.token)
	}
	holder := f.ids[f.holder]
	for _, id := range f.ids {
		bs := ks.Grants[id].Value.Buckets
		switch {
		case id == holder && (len(bs) != 1 || bs[0].Bucket != 0 || bs[0].Token != f.token):
			t.Errorf("%s holds the bucket, but its grants in etcd are %+v, want bucket 0 at token %d", id, bs, f.token)
		case id != holder && len(bs) != 0:
			t.Errorf("%s does not hold the bucket, but its grants in etcd are %+v", id, bs)
		}
	}

	plain, err := store.Open(ctx, store.Config{Endpoints: emb.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	all, err := plain.LoadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Keyspaces) != 0 {
		t.Errorf("the floor wrote under Keyshard's own prefix: keyspaces %v", all.Keyspaces)
	}
}
