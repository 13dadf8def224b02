package coordinator_test

import (
	"fmt"
	"math"
	"sort"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/keyshard/keyshard/internal/coordinator"
	"github.com/keyshard/keyshard/internal/shard"
)

// failover replaces the machine with a fresh one that loads the store, as
// a newly elected replica does. The old leader's pending writes are lost
// (its fence no longer holds).
func (w *world) failover() {
	w.stepDown()
	w.m = coordinator.New()
	w.m.SetEpochGap(w.gap)
	var evs []coordinator.Event
	names := make([]string, 0, len(w.keyspaces))
	for name := range w.keyspaces {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, ks := range names {
		evs = append(evs, coordinator.KeyspacePut{Keyspace: w.keyspaces[ks]})
		for _, mem := range w.members[ks] {
			evs = append(evs, coordinator.MemberPut{Keyspace: ks, Member: mem})
		}
		if m, ok := w.maps[ks]; ok {
			evs = append(evs, coordinator.MapPut{Keyspace: ks, Map: m, Rev: w.mapRev[ks]})
		}
		for id, g := range w.grants[ks] {
			evs = append(evs, coordinator.GrantsPut{Keyspace: ks, ID: id, Grants: g, Rev: w.grantRev[ks][id]})
		}
		for id, r := range w.releases[ks] {
			evs = append(evs, coordinator.ReleasesPut{Keyspace: ks, ID: id, Releases: shard.Releases{Buckets: r}})
		}
		if w.tokenRev[ks] != 0 {
			evs = append(evs, coordinator.TokensPut{Keyspace: ks, Token: w.tokens[ks], Rev: w.tokenRev[ks]})
		}
		for id, q := range w.quar[ks] {
			evs = append(evs, coordinator.QuarantinePut{Keyspace: ks, ID: id, Quarantine: shard.Quarantine{Buckets: q}})
		}
		for _, d := range w.drains[ks] {
			evs = append(evs, d)
		}
		evs = append(evs, w.loadStream(ks)...)
		if r, ok := w.res[ks]; ok {
			evs = append(evs, coordinator.ReservationPut{Keyspace: ks, Reservation: r, Rev: w.resRev[ks]})
		}
	}
	w.step(evs...)
}

// stepDown ends the leader's term: its machine is gone, and so are the
// writes it had not made (its fence no longer holds).
func (w *world) stepDown() {
	w.m = nil
	w.pending = nil
}

// TestRandomHistories drives the machine through random joins, crashes,
// re-joins, drains, releases, lost writes, leader failovers and time, and
// checks after every step that no bucket is held twice, tokens only
// rise, a revoked session's unreleased buckets are quarantined and go to
// nobody before its holder's deadline, and no quarantine outlasts the old
// lease's remaining time + TTL; once the faults stop and members release, every bucket must be
// granted to its balanced target.
//
// An exclusive keyspace's grant rounds must carry no positions.
func TestRandomHistories(t *testing.T) {
	randomHistories(t, shard.ModeExclusive)
}

// TestRandomStreamHistories is TestRandomHistories on a stream keyspace,
// where members also commit positions and releases hand over final ones,
// and checks after every step that no bucket position moves back and that
// every grant starts at or above the bucket's position, the highest
// position its earlier holders committed and the final position its last
// holder released it at; that the fold of an ended session's commit
// record puts every bucket the session held at exactly its committed
// position, even when the leader that folds it never saw the session's
// grants (a failover, or a time without a leader, between the crash and
// the fold); that the copy of every member's grants names exactly their
// buckets and tokens; and, once settled, that no copy of grants or commit
// record of an ended session is left behind.
//
// It runs ten times rapid's checks (100 histories unless -rapid.checks
// says otherwise), once with -short.
func TestRandomStreamHistories(t *testing.T) {
	rounds := 10
	if testing.Short() {
		rounds = 1
	}
	for range rounds {
		randomHistories(t, shard.ModeStream)
	}
}

func randomHistories(t *testing.T, mode shard.Mode) {
	converged := 0
	var stats streamStats
	ops := 11
	if mode == shard.ModeStream {
		ops = 18 // 12 to 14: commits (14: right after a release); 15 to 17: more writes land; 18: as 11
	}
	rapid.Check(t, func(t *rapid.T) {
		w := newWorld()
		// Half the histories hold rebalances back for 0 to 3 s.
		if rapid.Bool().Draw(t, "gap") {
			w.gap = time.Duration(rapid.IntRange(0, 3000).Draw(t, "gap ms")) * time.Millisecond
		}
		// In a stream keyspace, a third of the histories release without
		// final positions: the committed ones count, and the store pins
		// them against later commits until the hand-over.
		if mode == shard.ModeStream {
			w.noFinal = rapid.IntRange(0, 2).Draw(t, "no final positions") == 0
		}
		buckets := rapid.IntRange(1, 64).Draw(t, "buckets")
		w.createKeyspace(shard.Keyspace{Name: "ks", Buckets: buckets, Hash: "xxh64", Mode: mode, LeaseTTL: 10 * time.Second, DrainTimeout: 30 * time.Second})
		w.failover()
		ids := []string{"a", "b", "c", "d", "e"}
		for i := range rapid.IntRange(5, 60).Draw(t, "steps") {
			id := rapid.SampledFrom(ids).Draw(t, "id")
			switch op := rapid.IntRange(0, ops).Draw(t, "op"); op {
			case 12, 13:
				picks := rapid.SliceOfN(rapid.IntRange(0, 63), 0, 3).Draw(t, "exceptions")
				ahead := rapid.SliceOfN(rapid.IntRange(0, 5), len(picks), len(picks)).Draw(t, "ahead")
				w.commit("ks", id, uint64(rapid.IntRange(0, 20).Draw(t, "bump")), rapid.Bool().Draw(t, "all"), picks, ahead)
			case 14:
				// A consumer that commits after every event: it releases
				// what moved and commits again before the leader's grant
				// round lands.
				w.release("ks", id)
				w.commit("ks", id, uint64(rapid.IntRange(1, 20).Draw(t, "bump")), true, nil, nil)
			case 0:
				w.join("ks", id, float64(rapid.IntRange(1, 3).Draw(t, "weight")), rapid.Bool().Draw(t, "pending"))
			case 1:
				// A process that fenced itself re-joins under its id.
				w.joinAs("ks", id, float64(rapid.IntRange(1, 3).Draw(t, "weight")), rapid.Bool().Draw(t, "pending"), true)
			case 9:
				w.keepAlive("ks", id)
			case 2:
				if mem, ok := w.members["ks"][id]; ok {
					w.expire("ks", id, mem.Session)
				}
			case 3:
				w.release("ks", id)
			case 4:
				w.drain("ks", id, shard.Drain{Leave: rapid.Bool().Draw(t, "leave")})
			case 5:
				w.now = w.now.Add(time.Duration(rapid.IntRange(1, 40).Draw(t, "secs")) * time.Second)
				w.step(coordinator.Tick{})
			case 6:
				w.expireQuarantines("ks")
			case 7:
				w.failover()
			case 11, 18:
				// The leader goes; a member that holds buckets may commit
				// and crash before the next one is elected, which never
				// sees its grants.
				w.stepDown()
				var holding []string
				for _, hid := range ids {
					if len(w.grants["ks"][hid].Buckets) > 0 {
						holding = append(holding, hid)
					}
				}
				if len(holding) > 0 {
					hid := rapid.SampledFrom(holding).Draw(t, "crashed")
					if rapid.Bool().Draw(t, "commit first") {
						w.commit("ks", hid, uint64(rapid.IntRange(1, 20).Draw(t, "bump")), rapid.Bool().Draw(t, "all"), []int{rapid.IntRange(0, 63).Draw(t, "exception")}, []int{rapid.IntRange(0, 5).Draw(t, "ahead")})
					}
					w.expire("ks", hid, w.grants["ks"][hid].Session)
				}
				w.failover()
			case 8:
				// A write is lost: the server reports it failed.
				if len(w.pending) > 0 {
					a := w.pending[0]
					w.pending = w.pending[1:]
					w.step(coordinator.WriteFailed{Action: a, Err: fmt.Errorf("unavailable")})
				}
			default:
				w.apply()
			}
			if len(w.violation) > 0 {
				t.Fatalf("step %d: %v", i, w.violation)
			}
		}
		// Faults stop: members release what moved, quarantines expire,
		// drains are withdrawn... and the map converges.
		// 45 s: a drain timeout (30 s) and a quarantine (TTL, 10 s) fit.
		for range 45 {
			for _, id := range ids {
				w.keepAlive("ks", id)
				w.release("ks", id)
				// A session that holds grants with no member record on it
				// (its successor crashed before the leader revoked it) is
				// kept alive by nobody: its lease expires a TTL after it
				// was replaced.
				if g, ok := w.grants["ks"][id]; ok {
					_, joined := w.members["ks"][id]
					if at, replaced := w.replacedAt[g.Session]; !joined && replaced && !w.now.Before(at.Add(10*time.Second)) {
						w.expire("ks", id, g.Session)
					}
				}
			}
			w.expireQuarantines("ks")
			w.now = w.now.Add(time.Second)
			w.step(coordinator.Tick{})
			w.settle()
		}
		if len(w.violation) > 0 {
			t.Fatalf("after quiescence: %v", w.violation)
		}
		if left := w.leftovers("ks"); len(left) > 0 {
			t.Fatalf("after quiescence: %v", left)
		}
		if len(w.members["ks"]) > 0 && !w.converged("ks") {
			t.Fatalf("did not converge:\n%s", w.state("ks"))
		}
		// The map is balanced over the members that are not draining, and
		// members that asked to leave are gone.
		counts := w.maps["ks"].Assignment.Counts()
		active, weights := 0, 0.0
		for id, mem := range w.members["ks"] {
			if d, draining := w.drains["ks"][id]; !draining || d.Session != mem.Session {
				active++
				weights += mem.Weight
			}
		}
		for id, mem := range w.members["ks"] {
			d, draining := w.drains["ks"][id]
			draining = draining && d.Session == mem.Session
			switch {
			case draining && d.Drain.Leave:
				t.Fatalf("member %s asked to leave but is still joined", id)
			case draining:
				// A drained member keeps its buckets only if nobody else can
				// take them.
				if active > 0 && counts[id] != 0 {
					t.Fatalf("draining member %s still targets %d buckets", id, counts[id])
				}
			default:
				share := float64(buckets) * mem.Weight / weights
				if c := float64(counts[id]); c < math.Floor(share+1e-9) || c > math.Ceil(share-1e-9) {
					t.Fatalf("member %s holds %d buckets, share %.2f", id, counts[id], share)
				}
			}
		}
		converged++
		stats.commits += w.stats.commits
		stats.folded += w.stats.folded
		stats.resumed += w.stats.resumed
		stats.crashFolds += w.stats.crashFolds
		stats.lateFolds += w.stats.lateFolds
	})
	if converged == 0 {
		t.Fatal("no history converged")
	}
	if mode == shard.ModeStream {
		t.Logf("%d commits, %d commit records of ended sessions folded (%d of sessions that held buckets, %d of them by a leader that never saw the grants), %d grants resumed from a position", stats.commits, stats.folded, stats.crashFolds, stats.lateFolds, stats.resumed)
		if stats.commits == 0 || stats.resumed == 0 {
			t.Fatal("no history committed positions and resumed from them")
		}
		if stats.lateFolds == 0 {
			t.Fatal("no history folded a crashed session's commit record from a leader that never saw its grants")
		}
	}
}
