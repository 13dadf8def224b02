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

// TestEpochGap: with an epoch gap, joins that follow a map within the gap
// wait for it and come as one epoch; a crash is mapped at once, joins
// waiting or not.
func TestEpochGap(t *testing.T) {
	m := coordinator.New()
	m.SetEpochGap(time.Second)
	t0 := time.Unix(100, 0)
	var rev int64
	ks := shard.Keyspace{Name: "k", Buckets: 12, Hash: placement.HashXXH64, LeaseTTL: 10 * time.Second}
	mem := func(id string, s shard.LeaseID) coordinator.Event {
		return coordinator.MemberPut{Keyspace: "k", Member: shard.Member{ID: id, Weight: 1, Session: s}}
	}
	maps := func(as []coordinator.Action) (out []coordinator.WriteMap) {
		for _, a := range as {
			if w, ok := a.(coordinator.WriteMap); ok {
				out = append(out, w)
			}
		}
		return out
	}
	// The first map, and its grants to a, land: nothing is moving.
	acts := m.StepAll([]coordinator.Event{coordinator.Reset{}, coordinator.KeyspacePut{Keyspace: ks}, mem("a", 1)}, t0)
	for len(acts) > 0 {
		acts = m.StepAll(echoWrites(acts, &rev), t0)
	}
	if _, ok := m.Wake(); ok {
		t.Fatal("Wake with nothing held back")
	}
	// b and c join within the gap: no map, and a wake at its end.
	for i, id := range []string{"b", "c"} {
		now := t0.Add(time.Duration(300*(i+1)) * time.Millisecond)
		if ws := maps(m.Step(mem(id, shard.LeaseID(2+i)), now)); len(ws) != 0 {
			t.Fatalf("%s joined %v after the first map: map %+v written within the gap", id, now.Sub(t0), ws)
		}
		if at, ok := m.Wake(); !ok || !at.Equal(t0.Add(time.Second)) {
			t.Fatalf("Wake = %v %v; want %v", at, ok, t0.Add(time.Second))
		}
	}
	if ws := maps(m.Step(coordinator.Tick{}, t0.Add(999*time.Millisecond))); len(ws) != 0 {
		t.Fatalf("map before the gap's end: %+v", ws)
	}
	w := writeMap(t, m, &rev, t0.Add(time.Second), coordinator.Tick{})
	if w.Reason != coordinator.ReasonJoin || !slices.Equal(w.Members, []string{"b", "c"}) || w.Moves != 8 {
		t.Fatalf("the gathered joins: %+v", w)
	}
	if _, ok := m.Wake(); ok {
		t.Fatal("Wake after the held-back map was written")
	}
	// d joins while a's 8 buckets are still on their way to b and c: its
	// map waits for them, at most holdFactor (8) gaps after the last map.
	t1 := t0.Add(1100 * time.Millisecond)
	if ws := maps(m.Step(mem("d", 5), t1)); len(ws) != 0 {
		t.Fatalf("d's join within the gap mapped: %+v", ws)
	}
	if at, ok := m.Wake(); !ok || !at.Equal(t0.Add(9*time.Second)) {
		t.Fatalf("Wake = %v %v while handoffs go on; want %v", at, ok, t0.Add(9*time.Second))
	}
	if ws := maps(m.Step(coordinator.Tick{}, t0.Add(3*time.Second))); len(ws) != 0 {
		t.Fatalf("map past the gap while handoffs go on: %+v", ws)
	}
	// Within that, a crashes: one map, written at once.
	w = writeMap(t, m, &rev, t1, coordinator.MemberDeleted{Keyspace: "k", ID: "a"})
	if w.Reason != coordinator.ReasonCrash || w.Moves != 4 || !strings.Contains(w.Detail, "d joined") {
		t.Fatalf("a's crash with d's join: %+v", w)
	}
	// A drain within the gap is mapped at once too.
	w = writeMap(t, m, &rev, t1.Add(time.Millisecond), coordinator.DrainPut{Keyspace: "k", ID: "b", Session: 2})
	if w.Reason != coordinator.ReasonDrain || !slices.Equal(w.Members, []string{"b"}) {
		t.Fatalf("b's drain: %+v", w)
	}
}
