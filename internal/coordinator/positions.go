package coordinator

import (
	"maps"
	"slices"

	"github.com/keyshard/keyshard/internal/shard"
)

// Stream positions in a grant round. A bucket's position belongs to its
// holder while it holds it (the grant's From, raised by the holder's
// commit record) and to the keyspace's bucket positions otherwise. So the
// round that takes a bucket from its holder folds the bucket's position
// into the bucket positions, and a grant starts at the bucket positions
// after that. The fold of an ended session expects its commit record, and
// every fold the pieces of the bucket positions, at the revisions it read
// them: a write that lands meanwhile makes the round conflict, and the
// machine plans it again from the newer values, so no committed position
// is lost or moves back. A live holder's release needs no expectation on
// its commit record: once released, a bucket's position no longer moves
// with its holder's commits (see release).
//
// A commit record whose session has ended (its member record is gone or on
// another session, and no grants of that session remain) is folded for
// every bucket the session held, and deleted in the same round: until
// then the member's new session is granted nothing, and the store refuses
// its commits. The buckets the session held, and their tokens, which the
// commit's Default covers by token, come from the copy of its grants (the
// member's Held), not from the grants: those vanished with the session's
// lease, possibly before this machine (a new leader, or one whose watch
// resynced) ever saw them. The copy has no lease; every round that writes
// a member's grants writes it too, in the same transaction and with an
// expectation on both, so it names exactly what the session held when it
// ended. The round that folds the commit record deletes the copy; so does
// the first round after the session ended without a commit record, or
// the round that leaves a session that never committed holding nothing.
// A commit record with no copy of its session folds nothing: the session
// held nothing the leader granted.

// fold is one grant round's changes to a stream keyspace's bucket
// positions. A nil *fold (exclusive keyspaces) changes nothing.
type fold struct {
	k      *keyspace
	was    shard.BucketPositions
	pos    []uint64 // per bucket, as folded so far
	eff    map[string]map[int]uint64
	read   map[string]bool // ended sessions whose commit records the round expects as read
	chunks map[int]bool    // pieces of the bucket positions the round read
	folded []string        // ended commit records folded, to delete
	unheld []string        // copies of grants of ended sessions, to delete
}

// newFold starts a round's fold: for a stream keyspace, it folds every
// commit record of an ended session first.
func (k *keyspace) newFold() *fold {
	if k.cfg.Mode != shard.ModeStream {
		return nil
	}
	f := &fold{k: k, eff: map[string]map[int]uint64{}, read: map[string]bool{}, chunks: map[int]bool{}}
	for _, c := range slices.Sorted(maps.Keys(k.chunks)) {
		f.was.Runs = append(f.was.Runs, k.chunks[c].Runs...)
	}
	f.was = shard.NewBucketPositions(f.was.Dense(k.cfg.Buckets)) // joined, canonical
	f.pos = f.was.Dense(k.cfg.Buckets)

	for _, id := range slices.Sorted(maps.Keys(k.commits)) {
		c := k.commits[id]
		if !k.ended(id, c.Session) {
			continue // live, or a superseded session that still holds its grants: folded once it is revoked
		}
		if h, ok := k.held[id]; ok && h.Session == c.Session {
			g := shard.Grants(h)
			for i, p := range shard.Positions(g, c, f.was) {
				f.raise(g.Buckets[i].Bucket, p)
			}
		}
		f.read[id] = true
		f.folded = append(f.folded, id)
	}
	// The copies of ended sessions go, with their commit records or, if
	// the session never committed, alone: its positions are its grants'
	// From, never above the bucket positions. The round expects the
	// member's commit record as read (absent, or of another session), so
	// it is folded first should one land.
	for _, id := range slices.Sorted(maps.Keys(k.held)) {
		if k.ended(id, k.held[id].Session) {
			f.read[id] = true
			f.unheld = append(f.unheld, id)
		}
	}
	return f
}

// ended reports whether member id's session s has ended as far as the
// machine knows: the member record is not on it and no grants of it
// remain.
func (k *keyspace) ended(id string, s shard.LeaseID) bool {
	if mem, ok := k.members[id]; ok && mem.Session == s {
		return false
	}
	return k.grants[id].Session != s
}

// folds reports whether the round folds member id's commit record.
func (f *fold) folds(id string) bool { return f != nil && slices.Contains(f.folded, id) }

// changes reports whether the round must be written for the fold alone:
// it folds a commit record of an ended session or deletes a copy of
// grants.
func (f *fold) changes() bool { return f != nil && (len(f.folded) > 0 || len(f.unheld) > 0) }

// raise folds position p of bucket b.
func (f *fold) raise(b int, p uint64) {
	if b < 0 || b >= len(f.pos) {
		return
	}
	f.pos[b] = max(f.pos[b], p)
	f.chunks[b/shard.PositionChunk] = true
}

// release folds the position of bucket b, which holder h gives up: the
// final position its release carries, if it carries one, else the
// committed one. The final position is where the holder stopped handling
// the bucket (the store refused it below the committed position), so a
// commit the holder made after the release, whose default still covers the
// bucket until it is handed over, does not move it past events the holder
// never handled. Without a final position the store keeps such a commit
// from moving the bucket (shard.PinReleased pins it in the record).
//
// So the round does not expect h's commit record: the machine saw the
// release, hence every commit before it, and a commit landing after it
// moves neither a final position nor a pinned bucket. Expecting the record
// would let a holder that commits faster than the leader plans and writes
// (a consumer committing after every event) hold its own hand-over back
// indefinitely: every grant round would conflict with its next commit.
func (f *fold) release(h string, b int) {
	if f == nil {
		return
	}
	eff, ok := f.eff[h]
	if !ok {
		g := f.k.grants[h]
		eff = make(map[int]uint64, len(g.Buckets))
		for i, p := range shard.Positions(g, f.k.commits[h], f.was) {
			eff[g.Buckets[i].Bucket] = p
		}
		f.eff[h] = eff
	}
	if final, ok := f.k.relPos[h][b]; ok {
		f.raise(b, final)
		return
	}
	f.raise(b, eff[b])
}

// from is where a grant of bucket b starts: its position after the fold.
func (f *fold) from(b int) uint64 {
	if f == nil || b < 0 || b >= len(f.pos) {
		return 0
	}
	f.chunks[b/shard.PositionChunk] = true
	return f.pos[b]
}

// finish sets a's positions, deletions and the expectations on what the
// fold read.
func (f *fold) finish(a *WriteGrants) {
	if f == nil {
		return
	}
	a.WasPositions, a.Positions = f.was, shard.NewBucketPositions(f.pos)
	a.Folded = f.folded
	// The copies of the grants the round writes, and of ended sessions.
	copies := map[string]bool{}
	for id, g := range a.Grants {
		copies[id] = true
		if len(g.Buckets) == 0 && f.k.commits[id].Session != g.Session {
			continue // holds nothing and never committed: nothing to fold, no copy
		}
		h := shard.Held{Session: g.Session, Buckets: make([]shard.BucketToken, len(g.Buckets))}
		for i, bt := range g.Buckets {
			h.Buckets[i] = shard.BucketToken{Bucket: bt.Bucket, Token: bt.Token}
		}
		if a.Held == nil {
			a.Held = map[string]shard.Held{}
		}
		a.Held[id] = h
	}
	for _, id := range f.unheld {
		copies[id] = true
	}
	for _, id := range slices.Sorted(maps.Keys(copies)) {
		if _, put := a.Held[id]; put {
			continue
		}
		if _, ok := f.k.held[id]; ok {
			a.Unheld = append(a.Unheld, id)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(copies)) {
		a.Expects = append(a.Expects, Expect{Kind: KeyHeld, ID: id, Rev: f.k.heldRev[id]})
	}
	for _, id := range slices.Sorted(maps.Keys(f.read)) {
		a.Expects = append(a.Expects, Expect{Kind: KeyCommit, ID: id, Rev: f.k.commitRev[id]})
	}
	for _, c := range slices.Sorted(maps.Keys(f.chunks)) {
		a.Expects = append(a.Expects, Expect{Kind: KeyBucketPos, Chunk: c, Rev: f.k.chunkRev[c]})
	}
}
