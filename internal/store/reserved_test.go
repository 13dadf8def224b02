package store

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/placement"
)

func TestReservationCodec(t *testing.T) {
	until := time.Date(2026, 1, 1, 0, 10, 0, 0, time.UTC)
	r := shard.Reservation{Members: []string{"sender2", "sender1"}, Until: until}
	b, err := EncodeReservation(r)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"members":["sender2","sender1"],"until":"2026-01-01T00:10:00Z"}`; string(b) != want {
		t.Fatalf("encoded %s, want %s", b, want)
	}
	got, err := DecodeReservation(ReservedKey("fed"), b)
	if err != nil || !slices.Equal(got.Members, r.Members) || !got.Until.Equal(until) {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for _, tc := range []struct {
		r     shard.Reservation
		field string
	}{
		{shard.Reservation{Until: until}, `"members"`},
		{shard.Reservation{Members: []string{"a", "a"}, Until: until}, `"members[1]"`},
		{shard.Reservation{Members: []string{"a b"}, Until: until}, `"members[0]"`},
		{shard.Reservation{Members: []string{"a"}}, `"until"`},
	} {
		if _, err := EncodeReservation(tc.r); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("EncodeReservation(%+v) = %v; want ErrInvalid naming %s", tc.r, err, tc.field)
		}
	}
	for _, data := range []string{`{"members":[],"until":"2026-01-01T00:10:00Z"}`, `{"members":["a"]}`, `{"members":["a"],"until":"x"}`, `{"members":["a"],"until":"2026-01-01T00:10:00Z","extra":1}`} {
		if _, err := DecodeReservation(ReservedKey("fed"), []byte(data)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("DecodeReservation(%s) = %v; want ErrCorrupt", data, err)
		}
	}
	if kind, _, _, err := ParseKey(ReservedKey("fed")); err != nil || kind != KindReserved {
		t.Fatalf("ParseKey(%q) = %v, %v", ReservedKey("fed"), kind, err)
	}
}

// TestImportKeyspace: an import writes the keyspace, its first map, its
// bucket positions and its reservation in one revision, only if the
// keyspace does not exist; deleting the keyspace deletes them all.
func TestImportKeyspace(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	k := shard.Keyspace{Name: "import-fed", Buckets: 8192, Hash: placement.HashSynapse, Mode: shard.ModeStream, LeaseTTL: 10 * time.Second, DrainTimeout: 30 * time.Second}
	instances := []string{"s1", "s2", "s3", "s4"}
	a, err := placement.SynapseAssignment(k.Buckets, instances)
	if err != nil {
		t.Fatal(err)
	}
	pos := []uint64{100, 200, 300, 400}
	dense := make([]uint64, k.Buckets)
	for b := range dense {
		dense[b] = pos[b%4]
	}
	imp := Import{
		Keyspace:  k,
		Map:       shard.Map{Epoch: 1, Hash: k.Hash, Assignment: a},
		Positions: shard.NewBucketPositions(dense),
		Reserved:  shard.Reservation{Members: instances, Until: time.Now().Add(10 * time.Minute).Truncate(time.Millisecond)},
	}
	rev, err := s.ImportKeyspace(ctx, imp)
	if err != nil {
		t.Fatal(err)
	}
	snap, _, err := s.LoadKeyspace(ctx, k.Name)
	if err != nil {
		t.Fatal(err)
	}
	st := snap.Keyspaces[k.Name]
	if len(snap.Corrupt) > 0 {
		t.Fatalf("corrupt: %v", snap.Corrupt)
	}
	for key, r := range map[string]int64{"keyspace": st.Config.ModRevision, "map": st.Map.ModRevision, "reserved": st.Reserved.ModRevision, "bucketpos/1": st.BucketPos[1].ModRevision} {
		if r != rev {
			t.Errorf("%s at revision %d, want the import's %d", key, r, rev)
		}
	}
	if st.Map.Value.Epoch != 1 || !slices.Equal(st.Map.Value.Assignment.Owners, a.Owners) {
		t.Errorf("map %+v is not the import's", st.Map.Value.Epoch)
	}
	if got := st.Positions().Dense(k.Buckets); !slices.Equal(got, dense) {
		t.Errorf("bucket positions differ from the import's")
	}
	if !slices.Equal(st.Reserved.Value.Members, instances) || !st.Reserved.Value.Until.Equal(imp.Reserved.Until) {
		t.Errorf("reservation %+v, want %+v", st.Reserved.Value, imp.Reserved)
	}

	// A second import of the same name changes nothing.
	imp2 := imp
	imp2.Map.Assignment, _ = placement.SynapseAssignment(k.Buckets, []string{"x", "y"})
	imp2.Positions = shard.BucketPositions{}
	if _, err := s.ImportKeyspace(ctx, imp2); !errors.Is(err, ErrExists) {
		t.Fatalf("second import: %v, want ErrExists", err)
	}
	if _, err := s.CreateKeyspace(ctx, k); !errors.Is(err, ErrExists) {
		t.Fatalf("create over an import: %v, want ErrExists", err)
	}
	snap2, _, err := s.LoadKeyspace(ctx, k.Name)
	if err != nil {
		t.Fatal(err)
	}
	if st2 := snap2.Keyspaces[k.Name]; st2.Map.ModRevision != rev || st2.Reserved.ModRevision != rev {
		t.Fatalf("a refused import wrote: map at %d, reservation at %d", st2.Map.ModRevision, st2.Reserved.ModRevision)
	}

	// Positions in an exclusive keyspace, a map of another size: refused.
	bad := imp
	bad.Keyspace.Name, bad.Keyspace.Mode = "import-bad", shard.ModeExclusive
	if _, err := s.ImportKeyspace(ctx, bad); !errors.Is(err, ErrInvalid) {
		t.Fatalf("positions in an exclusive import: %v, want ErrInvalid", err)
	}
	bad = imp
	bad.Keyspace.Name, bad.Keyspace.Buckets = "import-bad", 4096
	if _, err := s.ImportKeyspace(ctx, bad); !errors.Is(err, ErrInvalid) {
		t.Fatalf("map of another size: %v, want ErrInvalid", err)
	}
	if _, _, err := s.GetKeyspace(ctx, "import-bad"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a refused import created its keyspace: %v", err)
	}

	if _, err := s.DeleteKeyspace(ctx, k.Name); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.LoadKeyspace(ctx, k.Name); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	all, err := s.LoadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st := all.Keyspaces[k.Name]; st != nil {
		t.Fatalf("keys left after delete: %+v", st)
	}
}
