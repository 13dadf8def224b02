package coordinator_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/keyshard/keyshard/internal/coordinator"
	"github.com/keyshard/keyshard/internal/shard"
)

// posFloor is what the next grant of a stream bucket must start at or
// above: pos, the highest effective position its holders committed, set
// by session (at the token it held the bucket by).
type posFloor struct {
	pos     uint64
	session shard.LeaseID
	token   uint64
}

// streamStats counts what a stream history exercised, so that a test
// can tell it checked something.
type streamStats struct {
	commits, folded, resumed int
	// crashFolds counts the folds of a commit record of a session that
	// held buckets when it ended, and lateFolds those of them that a
	// leader made that had not seen the session's grants.
	crashFolds, lateFolds int
}

// effective returns the effective positions of what member id's session
// holds, as the store and the machine compute them (shard.Positions).
func (w *world) effective(ks, id string) map[int]uint64 {
	g := w.grants[ks][id]
	out := map[int]uint64{}
	for i, p := range shard.Positions(g, w.commits[ks][id], w.bpos[ks]) {
		out[g.Buckets[i].Bucket] = p
	}
	return out
}

// finalPositions sets, in a stream keyspace, the final position a release
// hands over for each bucket: usually at or a little above the committed
// one, sometimes none (the committed one counts then; the store refuses a
// final position behind the committed one, so none is drawn). A
// bucket released again keeps the final position it was released at: the
// holder has stopped reading it.
func (w *world) finalPositions(ks, id string, rel []shard.BucketToken) []shard.BucketToken {
	rel = slices.Clone(rel)
	stream := w.keyspaces[ks].Mode == shard.ModeStream
	eff := map[int]uint64{}
	if stream {
		eff = w.effective(ks, id)
	}
	for i := range rel {
		rel[i].Position = 0
		if !stream || w.noFinal {
			continue
		}
		if w.released(ks, id, rel[i]) {
			for _, r := range w.releases[ks][id] {
				if r.Bucket == rel[i].Bucket {
					rel[i].Position = r.Position
				}
			}
			continue
		}
		switch b := rel[i].Bucket; b % 4 {
		case 3:
			rel[i].Position = 0 // none given: the committed one counts
		default:
			rel[i].Position = eff[b] + uint64(b%4)
		}
	}
	return rel
}

// commit writes member id's commit record as the store's CommitPositions
// would (shard.PinReleased pinning what it released): Default raised by bump, MaxToken the last token issued if all is
// set (else the previous one's), exceptions for the held buckets picked
// (by index) at their effective position + ahead, or behind Default. A
// commit the store would refuse is not made; commit reports whether it
// was.
func (w *world) commit(ks, id string, bump uint64, all bool, picks []int, ahead []int) bool {
	mem, ok := w.members[ks][id]
	if !ok || w.keyspaces[ks].Mode != shard.ModeStream {
		return false
	}
	prev, had := w.commits[ks][id]
	if had && prev.Session != mem.Session {
		return false // an earlier session's record is not folded yet
	}
	g := w.grants[ks][id]
	if g.Session != mem.Session {
		g = shard.Grants{Session: mem.Session}
	}
	next := shard.Commit{Session: mem.Session, MaxToken: prev.MaxToken, Default: prev.Default + bump}
	if all {
		next.MaxToken = w.tokens[ks]
	}
	was := shard.Positions(g, prev, shard.BucketPositions{})
	for j, i := range picks {
		if len(g.Buckets) == 0 {
			break
		}
		i %= len(g.Buckets)
		bt := g.Buckets[i]
		if _, dup := next.Exception(bt.Bucket); dup {
			continue
		}
		p := was[i] + uint64(ahead[j%len(ahead)])
		if ahead[j%len(ahead)] == 0 && next.Default > 3 {
			p = next.Default - 3 // behind: just gained, catching up
		}
		next.Exceptions = append(next.Exceptions, shard.BucketPosition{Bucket: bt.Bucket, Token: bt.Token, Position: p})
		slices.SortFunc(next.Exceptions, func(a, b shard.BucketPosition) int { return a.Bucket - b.Bucket })
	}
	// store.CommitPositions' checks (checkCommit).
	if next.MaxToken < prev.MaxToken || next.Default < prev.Default || next.MaxToken > w.tokens[ks] {
		return false
	}
	for i, p := range shard.Positions(g, next, shard.BucketPositions{}) {
		if p < was[i] {
			return false
		}
	}
	// Stored as the store stores it: the buckets released without a final
	// position and not handed over yet stay where the record had them.
	rel := slices.Clone(w.releases[ks][id])
	shard.SortPairs(rel) // as the store keeps a release record
	next = shard.PinReleased(g, shard.Releases{Buckets: rel}, prev, next)
	w.rev++
	w.stats.commits++
	w.commits[ks][id], w.commitRev[ks][id] = next, w.rev
	for i, p := range shard.Positions(g, next, w.bpos[ks]) {
		bt := g.Buckets[i]
		if w.releasedWithFinal(ks, id, bt) {
			continue // the holder stopped at its final position: the fold takes that
		}
		f := w.floor[ks][bt.Bucket]
		w.floor[ks][bt.Bucket] = posFloor{pos: max(f.pos, p), session: g.Session, token: bt.Token}
	}
	w.step(coordinator.CommitPut{Keyspace: ks, ID: id, Commit: next, Rev: w.rev})
	return true
}

// releasedWithFinal reports whether member id released bt at its token
// with a final position.
func (w *world) releasedWithFinal(ks, id string, bt shard.BucketToken) bool {
	for _, r := range w.releases[ks][id] {
		if r.Bucket == bt.Bucket && r.Token == bt.Token && r.Position > 0 {
			return true
		}
	}
	return false
}

// loadStream returns the events that load a stream keyspace's positions
// and copies of grants into a new leader.
func (w *world) loadStream(ks string) []coordinator.Event {
	var evs []coordinator.Event
	for id, c := range w.commits[ks] {
		evs = append(evs, coordinator.CommitPut{Keyspace: ks, ID: id, Commit: c, Rev: w.commitRev[ks][id]})
		if w.grants[ks][id].Session != c.Session && w.lastGrants[ks][id].Session == c.Session && len(w.lastGrants[ks][id].Buckets) > 0 {
			w.lateFolds[ks+"/"+id] = true // the new leader never sees these grants
		}
	}
	for id, h := range w.held[ks] {
		evs = append(evs, coordinator.HeldPut{Keyspace: ks, ID: id, Held: h, Rev: w.heldRev[ks][id]})
	}
	if w.bposRev[ks] != 0 {
		evs = append(evs, coordinator.BucketPosPut{Keyspace: ks, Chunk: 0, Positions: w.bpos[ks], Rev: w.bposRev[ks]})
	}
	return evs
}

// checkFrom checks a grant round against the position invariants, before
// it lands: an exclusive keyspace's has no positions; a stream
// keyspace's grants start at or above the bucket positions, the floor of
// committed positions, and the final position the previous holder's
// release handed over.
func (w *world) checkFrom(a coordinator.WriteGrants) {
	ks := a.Keyspace
	if w.keyspaces[ks].Mode != shard.ModeStream {
		if len(a.Positions.Runs) > 0 || len(a.WasPositions.Runs) > 0 || len(a.Folded) > 0 {
			w.violation = append(w.violation, fmt.Sprintf("exclusive keyspace %s: grant round carries positions %v, was %v, folded %v", ks, a.Positions, a.WasPositions, a.Folded))
		}
		for id, g := range a.Grants {
			for _, bt := range g.Buckets {
				if bt.Position != 0 {
					w.violation = append(w.violation, fmt.Sprintf("exclusive keyspace %s: bucket %d granted to %s from position %d", ks, bt.Bucket, id, bt.Position))
				}
			}
		}
		return
	}
	if !slices.Equal(a.WasPositions.Dense(w.keyspaces[ks].Buckets), w.bpos[ks].Dense(w.keyspaces[ks].Buckets)) {
		w.violation = append(w.violation, fmt.Sprintf("grant round read bucket positions %v, the store holds %v", a.WasPositions, w.bpos[ks]))
	}
	fresh := map[int]posFloor{}
	for id, g := range a.Grants {
		for _, bt := range g.Buckets {
			if w.heldAt(ks, id, bt) {
				continue
			}
			b := bt.Bucket
			fresh[b] = posFloor{pos: bt.Position, session: g.Session, token: bt.Token}
			if bt.Position > 0 {
				w.stats.resumed++
			}
			if base := w.bpos[ks].Position(b); bt.Position < base {
				w.violation = append(w.violation, fmt.Sprintf("bucket %d granted to %s from %d, below its bucket position %d", b, id, bt.Position, base))
			}
			if f := w.floor[ks][b]; bt.Position < f.pos {
				w.violation = append(w.violation, fmt.Sprintf("bucket %d granted to %s from %d, below %d committed by session %v", b, id, bt.Position, f.pos, f.session))
			}
			for hid, rel := range w.releases[ks] {
				for _, r := range rel {
					if r.Bucket == b && r.Token == w.lastToken[ks][b] && bt.Position < r.Position {
						w.violation = append(w.violation, fmt.Sprintf("bucket %d granted to %s from %d, below the final position %d %s released it at", b, id, bt.Position, r.Position, hid))
					}
				}
			}
		}
	}
	// A new grant starts the bucket's floor afresh at its From.
	for b, f := range fresh {
		w.floor[ks][b] = f
	}
}

// writePositions lands a grant round's bucket positions and deletes the
// commit records it folded, checking that no bucket position moves back.
// It returns the events.
func (w *world) writePositions(a coordinator.WriteGrants) []coordinator.Event {
	ks := a.Keyspace
	if w.keyspaces[ks].Mode != shard.ModeStream {
		return nil
	}
	var evs []coordinator.Event
	n := w.keyspaces[ks].Buckets
	was, now := w.bpos[ks].Dense(n), a.Positions.Dense(n)
	for b := range n {
		if now[b] < was[b] {
			w.violation = append(w.violation, fmt.Sprintf("bucket %d's position moved back from %d to %d", b, was[b], now[b]))
		}
	}
	// A fold of an ended session's commit record puts each bucket the
	// session held when it ended at exactly its effective position under
	// that record (which the store computes from the grants the leader
	// may never have seen): no lower, or its next holder reprocesses
	// events from before the bucket's last commit.
	for _, id := range a.Folded {
		c, g := w.commits[ks][id], w.lastGrants[ks][id]
		if g.Session != c.Session || len(g.Buckets) == 0 {
			continue
		}
		w.stats.crashFolds++
		if w.lateFolds[ks+"/"+id] {
			w.stats.lateFolds++
		}
		for i, p := range shard.Positions(g, c, w.bpos[ks]) {
			if b := g.Buckets[i].Bucket; now[b] != p {
				w.violation = append(w.violation, fmt.Sprintf("fold of %s's commit %+v: bucket %d (token %d) at %d; want its committed position %d", id, c, b, g.Buckets[i].Token, now[b], p))
			}
		}
	}
	if !slices.Equal(was, now) {
		w.bpos[ks] = shard.NewBucketPositions(now)
		if len(w.bpos[ks].Runs) == 0 {
			w.bposRev[ks] = 0
			evs = append(evs, coordinator.BucketPosDeleted{Keyspace: ks, Chunk: 0})
		} else {
			w.bposRev[ks] = w.rev
			evs = append(evs, coordinator.BucketPosPut{Keyspace: ks, Chunk: 0, Positions: w.bpos[ks], Rev: w.rev})
		}
	}
	for _, id := range a.Folded {
		w.stats.folded++
		delete(w.commits[ks], id)
		delete(w.commitRev[ks], id)
		delete(w.lateFolds, ks+"/"+id)
		evs = append(evs, coordinator.CommitDeleted{Keyspace: ks, ID: id})
	}
	return evs
}

// writeHeld lands a grant round's copies of grants, each covered by an
// expectation, and checks that the copy of every member's grants names
// exactly the buckets and tokens they do. It returns the events.
func (w *world) writeHeld(a coordinator.WriteGrants) []coordinator.Event {
	ks := a.Keyspace
	if w.keyspaces[ks].Mode != shard.ModeStream {
		if len(a.Held) > 0 || len(a.Unheld) > 0 {
			w.violation = append(w.violation, fmt.Sprintf("exclusive keyspace %s: grant round writes copies %v, deletes %v", ks, a.Held, a.Unheld))
		}
		return nil
	}
	expected := map[string]bool{}
	for _, e := range a.Expects {
		if e.Kind == coordinator.KeyHeld {
			expected[e.ID] = true
		}
	}
	var evs []coordinator.Event
	for id, h := range a.Held {
		if !expected[id] {
			w.violation = append(w.violation, fmt.Sprintf("copy of %s's grants written without an expectation", id))
		}
		w.held[ks][id], w.heldRev[ks][id] = h, w.rev
		evs = append(evs, coordinator.HeldPut{Keyspace: ks, ID: id, Held: h, Rev: w.rev})
	}
	for _, id := range a.Unheld {
		if !expected[id] {
			w.violation = append(w.violation, fmt.Sprintf("copy of %s's grants deleted without an expectation", id))
		}
		if _, ok := a.Held[id]; ok {
			w.violation = append(w.violation, fmt.Sprintf("copy of %s's grants both written and deleted", id))
		}
		delete(w.held[ks], id)
		delete(w.heldRev[ks], id)
		evs = append(evs, coordinator.HeldDeleted{Keyspace: ks, ID: id})
	}
	for id, g := range w.grants[ks] {
		h, ok := w.held[ks][id]
		if len(g.Buckets) == 0 && !ok {
			continue // holds nothing: no copy needed
		}
		same := ok && h.Session == g.Session && len(h.Buckets) == len(g.Buckets)
		for i := 0; same && i < len(g.Buckets); i++ {
			same = h.Buckets[i].Bucket == g.Buckets[i].Bucket && h.Buckets[i].Token == g.Buckets[i].Token
		}
		if !same {
			w.violation = append(w.violation, fmt.Sprintf("%s's grants %v (session %v) and their copy %v (present %v) differ", id, g.Buckets, g.Session, h, ok))
		}
	}
	return evs
}

// leftovers lists the copies of grants and the commit records of sessions
// that have ended: once the machine has settled there are none.
func (w *world) leftovers(ks string) []string {
	var out []string
	live := func(id string, s shard.LeaseID) bool {
		return w.members[ks][id].Session == s || w.grants[ks][id].Session == s
	}
	for id, h := range w.held[ks] {
		if !live(id, h.Session) {
			out = append(out, fmt.Sprintf("copy of %s's grants of ended session %v", id, h.Session))
		}
	}
	for id, c := range w.commits[ks] {
		if !live(id, c.Session) {
			out = append(out, fmt.Sprintf("commit record of %s's ended session %v", id, c.Session))
		}
	}
	return out
}

// TestHandoffThroughCommits: a holder that commits between every grant
// round's planning and its write (a consumer committing after each event)
// does not hold its own hand-over back. The round that hands over the
// buckets it released without final positions does not expect its commit
// record: the store pins those buckets (shard.PinReleased), so the
// commits landing meanwhile do not move them, and the new holder starts
// them where the commit before the release put them.
func TestHandoffThroughCommits(t *testing.T) {
	w := newWorld()
	w.noFinal = true
	w.createKeyspace(shard.Keyspace{Name: "ks", Buckets: 4, Hash: "xxh64", Mode: shard.ModeStream, LeaseTTL: 10 * time.Second, DrainTimeout: 30 * time.Second})
	w.failover()
	w.join("ks", "a", 1, false)
	w.settle()
	if !w.commit("ks", "a", 70, true, nil, nil) {
		t.Fatal("a's first commit was refused")
	}
	w.join("ks", "b", 1, false)
	w.settle() // the map moves two buckets to b; a is asked to release them
	if len(w.release("ks", "a")) == 0 && len(w.pending) == 0 {
		t.Fatal("a's release planned no grant round")
	}
	// a commits before each of the leader's writes lands.
	rounds := 0
	for len(w.grants["ks"]["b"].Buckets) < 2 && rounds < 3 {
		rounds++
		if !w.commit("ks", "a", 50, true, nil, nil) {
			t.Fatalf("round %d: a's commit was refused", rounds)
		}
		w.apply()
	}
	if len(w.violation) > 0 {
		t.Fatal(w.violation)
	}
	g := w.grants["ks"]["b"]
	if len(g.Buckets) != 2 || rounds != 1 {
		t.Fatalf("b holds %v after %d grant rounds, each behind one of a's commits; want a's two released buckets after the first", g.Buckets, rounds)
	}
	for _, bt := range g.Buckets {
		if bt.Position != 70 {
			t.Errorf("b's grant of bucket %d starts at %d; want 70, a's commit before its release", bt.Bucket, bt.Position)
		}
	}
	for i, p := range shard.Positions(w.grants["ks"]["a"], w.commits["ks"]["a"], w.bpos["ks"]) {
		if p != 120 {
			t.Errorf("a holds bucket %d at %d; want 120, its last commit", w.grants["ks"]["a"].Buckets[i].Bucket, p)
		}
	}
}
