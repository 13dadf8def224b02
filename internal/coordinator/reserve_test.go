package coordinator_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyshard/keyshard/internal/coordinator"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/placement"
)

// importKeyspace lands an import as the store's ImportKeyspace does, in
// one revision: the keyspace, its first map (the Synapse mapping over
// instances), a stream keyspace's bucket positions (each bucket at its
// instance's position) and the reservation, until now + wait.
func (w *world) importKeyspace(ks shard.Keyspace, instances []string, positions []uint64, wait time.Duration) []coordinator.Action {
	a, err := placement.SynapseAssignment(ks.Buckets, instances)
	if err != nil {
		w.violation = append(w.violation, err.Error())
		return nil
	}
	stop := w.m
	w.m = nil // one revision: the machine sees it all at once, below
	w.createKeyspace(ks)
	w.m = stop
	w.rev++
	m := shard.Map{Epoch: 1, Hash: ks.Hash, Assignment: a}
	w.maps[ks.Name], w.mapRev[ks.Name] = m, w.rev
	evs := []coordinator.Event{coordinator.KeyspacePut{Keyspace: ks}, coordinator.MapPut{Keyspace: ks.Name, Map: m, Rev: w.rev}}
	if ks.Mode == shard.ModeStream {
		dense := make([]uint64, ks.Buckets)
		for b := range dense {
			dense[b] = positions[b%len(instances)]
		}
		if p := shard.NewBucketPositions(dense); len(p.Runs) > 0 {
			w.bpos[ks.Name], w.bposRev[ks.Name] = p, w.rev
			evs = append(evs, coordinator.BucketPosPut{Keyspace: ks.Name, Chunk: 0, Positions: p, Rev: w.rev})
		}
	}
	r := shard.Reservation{Members: slices.Clone(instances), Until: w.now.Add(wait)}
	w.res[ks.Name], w.resRev[ks.Name] = r, w.rev
	evs = append(evs, coordinator.ReservationPut{Keyspace: ks.Name, Reservation: r, Rev: w.rev})
	return w.step(evs...)
}

// importCommand runs the script command
//
//	import ks=rooms buckets=12 instances=a,b,c [mode=stream positions=10,20,30] [wait=10m]
func importCommand(w *world, ks string, buckets int, mode shard.Mode, instances, positions string, wait time.Duration) string {
	ids := strings.Split(instances, ",")
	var pos []uint64
	if positions != "" {
		for _, p := range strings.Split(positions, ",") {
			var v uint64
			fmt.Sscan(p, &v)
			pos = append(pos, v)
		}
	}
	k := shard.Keyspace{Name: ks, Buckets: buckets, Hash: placement.HashSynapse, Mode: mode, LeaseTTL: 10 * time.Second, DrainTimeout: 30 * time.Second}
	return formatActions(w.importKeyspace(k, ids, pos, wait))
}

// imported checks that every bucket's target and holder is its imported
// instance (b mod N), and, in a stream keyspace, that each grant starts
// at its instance's position; it returns what differs.
func imported(w *world, ks string, instances []string, positions []uint64) []string {
	var bad []string
	m := w.maps[ks]
	if m.Epoch != 1 {
		bad = append(bad, fmt.Sprintf("map epoch %d, want the import's 1", m.Epoch))
	}
	n := len(instances)
	for b := range m.Assignment.Buckets() {
		if o := m.Assignment.Owner(b); o != instances[b%n] {
			bad = append(bad, fmt.Sprintf("bucket %d targets %q, want %q", b, o, instances[b%n]))
		}
	}
	for id, g := range w.grants[ks] {
		i := slices.Index(instances, id)
		for _, bt := range g.Buckets {
			if bt.Bucket%n != i {
				bad = append(bad, fmt.Sprintf("bucket %d granted to %s", bt.Bucket, id))
			}
			if positions != nil && bt.Position != positions[i] {
				bad = append(bad, fmt.Sprintf("bucket %d granted to %s from %d, want %d", bt.Bucket, id, bt.Position, positions[i]))
			}
		}
	}
	return bad
}

// TestImportJoinsMoveNothing: whatever order the imported instances join
// in, and with leader failovers between the joins, the map stays the
// import's (epoch 1, no bucket moves), each instance is granted exactly
// its imported buckets from its position, and the reservation ends once
// all have joined.
func TestImportJoinsMoveNothing(t *testing.T) {
	instances := []string{"sender1", "sender2", "sender3", "sender4"}
	positions := []uint64{1000, 1200, 900, 1500}
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 1))
		for _, mode := range []shard.Mode{shard.ModeStream, shard.ModeExclusive} {
			w := newWorld()
			w.failover()
			ks := shard.Keyspace{Name: "fed", Buckets: 64, Hash: placement.HashSynapse, Mode: mode, LeaseTTL: 10 * time.Second, DrainTimeout: 30 * time.Second}
			pos := positions
			if mode != shard.ModeStream {
				pos = nil
			}
			w.importKeyspace(ks, instances, pos, 10*time.Minute)
			w.settle()
			if len(w.grants["fed"]) != 0 {
				t.Fatalf("seed %d: granted before anyone joined: %v", seed, w.grants["fed"])
			}
			order := slices.Clone(instances)
			rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			for _, id := range order {
				pending := rng.IntN(2) == 0
				w.join("fed", id, 1, pending)
				w.settle()
				if rng.IntN(3) == 0 {
					w.failover()
					w.settle()
				}
				w.now = w.now.Add(time.Duration(rng.IntN(60)) * time.Second)
				w.step(coordinator.Tick{})
				w.settle()
				if pending {
					w.keepAlive("fed", id)
					w.settle()
				}
				if bad := imported(w, "fed", instances, pos); len(bad) > 0 {
					bad = bad[:min(len(bad), 5)]
					t.Fatalf("seed %d %s: after %s joined: %s", seed, mode, id, strings.Join(bad, "; "))
				}
			}
			if !w.converged("fed") {
				t.Fatalf("seed %d %s: not every bucket granted after all joined", seed, mode)
			}
			if _, ok := w.res["fed"]; ok {
				t.Fatalf("seed %d %s: reservation %v still stored after all joined", seed, mode, w.res["fed"])
			}
			if len(w.violation) > 0 {
				t.Fatalf("seed %d %s: %s", seed, mode, strings.Join(w.violation, "; "))
			}
		}
	}
}

// TestImportThenFifthMovesMinimum: once the imported instances have
// joined, a fifth member takes the minimum: about buckets/5, each from an
// imported instance, and no bucket moves between the imported ones.
func TestImportThenFifthMovesMinimum(t *testing.T) {
	instances := []string{"s1", "s2", "s3", "s4"}
	w := newWorld()
	w.failover()
	ks := shard.Keyspace{Name: "fed", Buckets: 4096, Hash: placement.HashSynapse, Mode: shard.ModeStream, LeaseTTL: 10 * time.Second, DrainTimeout: 30 * time.Second}
	w.importKeyspace(ks, instances, []uint64{5, 6, 7, 8}, 10*time.Minute)
	for _, id := range instances {
		w.join("fed", id, 1, false)
		w.settle()
	}
	before := w.maps["fed"].Assignment
	w.join("fed", "s5", 1, false)
	w.settle()
	after := w.maps["fed"].Assignment
	moved := 0
	for b := range after.Buckets() {
		if o := after.Owner(b); o != before.Owner(b) {
			moved++
			if o != "s5" {
				t.Fatalf("bucket %d moved from %s to %s, not to the new member", b, before.Owner(b), o)
			}
		}
	}
	if want := 4096 / 5; moved < want || moved > want+1 {
		t.Fatalf("%d buckets moved; want the minimum, %d or %d", moved, want, want+1)
	}
	if w.maps["fed"].Epoch != 2 {
		t.Fatalf("epoch %d; want one new map", w.maps["fed"].Epoch)
	}
	if len(w.violation) > 0 {
		t.Fatal(strings.Join(w.violation, "; "))
	}
}

// formatFrom prints the positions grants start from, as runs of buckets
// at one position: 0,3,6@100 1,4@200.
func formatFrom(bts []shard.BucketToken) string {
	if len(bts) == 0 {
		return "-"
	}
	var order []uint64
	at := map[uint64][]string{}
	for _, bt := range bts {
		if _, ok := at[bt.Position]; !ok {
			order = append(order, bt.Position)
		}
		at[bt.Position] = append(at[bt.Position], fmt.Sprint(bt.Bucket))
	}
	var parts []string
	for _, p := range order {
		parts = append(parts, strings.Join(at[p], ",")+fmt.Sprintf("@%d", p))
	}
	return strings.Join(parts, " ")
}
