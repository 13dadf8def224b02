package coordinator_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyshard/keyshard/internal/coordinator"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/placement"
)

// writeMap steps m and returns the map write it plans, echoing it back
// so the next step starts from it.
func writeMap(t *testing.T, m *coordinator.Machine, rev *int64, now time.Time, evs ...coordinator.Event) coordinator.WriteMap {
	t.Helper()
	for _, a := range m.StepAll(evs, now) {
		if w, ok := a.(coordinator.WriteMap); ok {
			*rev++
			m.Step(coordinator.MapPut{Keyspace: w.Keyspace, Map: w.Map, Rev: *rev}, now)
			return w
		}
	}
	t.Fatalf("no map written after %v", evs)
	return coordinator.WriteMap{}
}

// TestMapReasons: the map writes say why: create, join, and when one epoch
// folds a join and a crash, the one that moved more buckets, with the
// other named in the detail as a best guess.
func TestMapReasons(t *testing.T) {
	m := coordinator.New()
	now := time.Unix(100, 0)
	var rev int64
	ks := shard.Keyspace{Name: "k", Buckets: 12, Hash: placement.HashXXH64, LeaseTTL: 10 * time.Second}
	mem := func(id string, s shard.LeaseID) coordinator.Event {
		return coordinator.MemberPut{Keyspace: "k", Member: shard.Member{ID: id, Weight: 1, Session: s}}
	}
	w := writeMap(t, m, &rev, now, coordinator.Reset{}, coordinator.KeyspacePut{Keyspace: ks})
	if w.Reason != coordinator.ReasonCreate || w.Moves != 0 {
		t.Fatalf("first map: %+v", w)
	}
	w = writeMap(t, m, &rev, now, mem("a", 1), mem("b", 2))
	if w.Reason != coordinator.ReasonJoin || !slices.Equal(w.Members, []string{"a", "b"}) || w.Moves != 12 {
		t.Fatalf("join: %+v", w)
	}
	if len(w.Pairs) != 2 || w.Pairs[0].From != "" || w.Pairs[0].Buckets+w.Pairs[1].Buckets != 12 {
		t.Fatalf("pairs: %+v", w.Pairs)
	}
	// a crashes (its record goes with its lease) while c joins: a's 6
	// buckets move, 4 of them to c; the crash moved more.
	w = writeMap(t, m, &rev, now, coordinator.MemberDeleted{Keyspace: "k", ID: "a"}, mem("c", 3))
	if w.Reason != coordinator.ReasonCrash || !slices.Equal(w.Members, []string{"a"}) || !strings.Contains(w.Detail, "best guess") || !strings.Contains(w.Detail, "c joined") {
		t.Fatalf("crash and join: %+v", w)
	}
	// b drains: its buckets move to c.
	w = writeMap(t, m, &rev, now, coordinator.DrainPut{Keyspace: "k", ID: "b", Drain: shard.Drain{}, Session: 2})
	if w.Reason != coordinator.ReasonDrain || !slices.Equal(w.Members, []string{"b"}) || w.Moves != 6 {
		t.Fatalf("drain: %+v", w)
	}
	if len(w.Pairs) != 1 || w.Pairs[0] != (coordinator.MovePair{From: "b", To: "c", Buckets: 6}) {
		t.Fatalf("drain pairs: %+v", w.Pairs)
	}
}

// TestMapReasonCreateNamesMembers: members already joined when the first
// map is written get no join record, so the create names them.
func TestMapReasonCreateNamesMembers(t *testing.T) {
	m := coordinator.New()
	now := time.Unix(100, 0)
	var rev int64
	ks := shard.Keyspace{Name: "k", Buckets: 8, Hash: placement.HashXXH64, LeaseTTL: 10 * time.Second}
	w := writeMap(t, m, &rev, now, coordinator.Reset{}, coordinator.KeyspacePut{Keyspace: ks},
		coordinator.MemberPut{Keyspace: "k", Member: shard.Member{ID: "b", Weight: 1, Session: 2}},
		coordinator.MemberPut{Keyspace: "k", Member: shard.Member{ID: "a", Weight: 1, Session: 1}})
	if w.Reason != coordinator.ReasonCreate || !slices.Equal(w.Members, []string{"a", "b"}) || w.Moves != 8 || !strings.Contains(w.Detail, "over 2 members") {
		t.Fatalf("first map over a and b: %+v", w)
	}
}
