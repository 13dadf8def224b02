package placement_test

import (
	"fmt"
	"testing"

	"github.com/keyshard/keyshard/placement"
)

func TestTableOwner(t *testing.T) {
	members := []placement.Member{{ID: "a", Weight: 1}, {ID: "b", Weight: 1}, {ID: "c", Weight: 2}}
	p, err := placement.Balance(placement.NewAssignment(1024), members)
	if err != nil {
		t.Fatal(err)
	}
	table, err := placement.NewTable(placement.HashXXH64, p.Assignment)
	if err != nil {
		t.Fatal(err)
	}
	h := table.Hasher()
	counts := map[string]int{}
	for i := range 10000 {
		key := fmt.Sprintf("room-%d", i)
		got, ok := table.OwnerString(key)
		if !ok || got != p.Assignment.Owner(h.BucketString(key)) {
			t.Fatalf("OwnerString(%q) = %q, %v", key, got, ok)
		}
		if b, _ := table.Owner([]byte(key)); b != got {
			t.Fatalf("Owner and OwnerString disagree for %q", key)
		}
		counts[got]++
	}
	if counts["c"] < counts["a"]+counts["b"]-600 {
		t.Errorf("weight 2 member got %d keys, others %d and %d", counts["c"], counts["a"], counts["b"])
	}
	// The table keeps its own copy.
	p.Assignment.Owners[0] = placement.Unassigned
	if o, ok := table.BucketOwner(0); !ok || o == "" {
		t.Fatal("table changed when the caller's assignment did")
	}
	if _, ok := table.BucketOwner(1024); ok {
		t.Fatal("out-of-range bucket has an owner")
	}
}

func TestTableUnassigned(t *testing.T) {
	table, err := placement.NewTable(placement.HashXXH64, placement.NewAssignment(8))
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := table.OwnerString("x"); ok || o != "" {
		t.Fatalf("unassigned bucket: %q, %v", o, ok)
	}
	if _, err := placement.NewTable("crc", placement.NewAssignment(8)); err == nil {
		t.Fatal("unknown mode accepted")
	}
	if _, err := placement.NewTable(placement.HashXXH64, placement.Assignment{}); err == nil {
		t.Fatal("empty assignment accepted")
	}
}

func TestTableOwnerDoesNotAllocate(t *testing.T) {
	p, _ := placement.Balance(placement.NewAssignment(4096), []placement.Member{{ID: "a", Weight: 1}, {ID: "b", Weight: 1}})
	table, _ := placement.NewTable(placement.HashXXH64, p.Assignment)
	key := []byte("0123456789abcdef")
	if n := testing.AllocsPerRun(1000, func() { _, _ = table.Owner(key); _, _ = table.OwnerString("0123456789abcdef") }); n != 0 {
		t.Fatalf("%v allocations per lookup", n)
	}
}

// TestTableEveryBucketOwnedByAnother covers the largest table: 65536
// buckets, each owned by its own member.
func TestTableEveryBucketOwnedByAnother(t *testing.T) {
	a := placement.Assignment{Members: make([]string, 65536), Owners: make([]int32, 65536)}
	for i := range a.Owners {
		a.Members[i] = fmt.Sprintf("m%d", i)
		a.Owners[i] = int32(i)
	}
	table, err := placement.NewTable(placement.HashXXH64, a)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []int{0, 1, 65535} {
		if o, ok := table.BucketOwner(b); !ok || o != fmt.Sprintf("m%d", b) {
			t.Fatalf("bucket %d: %q", b, o)
		}
	}
	a.Owners[7] = placement.Unassigned
	table, _ = placement.NewTable(placement.HashXXH64, a)
	if o, ok := table.BucketOwner(7); ok {
		t.Fatalf("unassigned bucket 7 owned by %q", o)
	}
	if o, _ := table.BucketOwner(65535); o != "m65535" {
		t.Fatalf("bucket 65535: %q", o)
	}
}
