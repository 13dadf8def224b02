package shard

import (
	"slices"
	"sort"
)

// Stream positions. In a stream keyspace every bucket has a committed
// position: an opaque, ordered 64-bit number, the position of the next
// event of the stream to read for that bucket (as a Kafka consumer's
// committed offset is). 0 is the start of the stream. A bucket's committed
// position never goes backwards.
//
// Where a bucket's position lives depends on who holds it:
//
//   - a held bucket's position is its holder's: the grant's Position (where
//     the holder starts), raised by the holder's Commit;
//   - every other bucket's position is the keyspace's BucketPositions,
//     which the leader folds a holder's positions into when the bucket
//     leaves it.
//
// Positions gives the effective position of each held bucket from the
// three.

// BucketPosition is one bucket's position in a Commit: the bucket, the
// fencing token its holder holds it at, and the position of the next event
// to read for it.
type BucketPosition struct {
	Bucket   int
	Token    uint64
	Position uint64
}

// Commit is one member session's committed positions, the whole of them:
// one record per member, replaced by every commit, whatever the number of
// buckets it holds.
//
// Default is the position of every bucket the session holds at a grant
// token <= MaxToken and that Exceptions do not list. MaxToken is the
// highest grant token the worker had seen when it computed the commit:
// tokens strictly increase within a keyspace, so a bucket granted after
// that has a higher token and Default does not cover it (its position stays
// the grant's until the worker commits again). Exceptions carry their own
// position, for buckets that are behind (just gained, catching up) or
// ahead; they are sorted by bucket, without duplicates, each with the
// token the session holds the bucket at.
type Commit struct {
	Session    LeaseID
	MaxToken   uint64
	Default    uint64
	Exceptions []BucketPosition
}

// Exception returns the exception for bucket b, if c lists one.
func (c Commit) Exception(b int) (BucketPosition, bool) {
	i := sort.Search(len(c.Exceptions), func(i int) bool { return c.Exceptions[i].Bucket >= b })
	if i < len(c.Exceptions) && c.Exceptions[i].Bucket == b {
		return c.Exceptions[i], true
	}
	return BucketPosition{}, false
}

// Held is the copy of a stream member session's grants that the leader
// keeps without a lease: the buckets the session holds and the tokens it
// holds them at, sorted by bucket, without duplicates (Position is not
// kept: a grant's From is never above the bucket positions). The leader
// writes it in the transaction that writes the grants, so the two never
// differ while the session lives, and it outlives the session, as the
// commit record does, so that the leader can fold the commit record into
// the bucket positions exactly once the grants have vanished with the
// session's lease: the commit's Default covers buckets by their tokens,
// which only the grants name.
type Held Grants

// PositionRun says that the Count buckets from First on are all at
// Position.
type PositionRun struct {
	First    int
	Count    int
	Position uint64
}

// PositionChunk is how many buckets' positions one stored piece of a
// keyspace's BucketPositions holds: piece c has the buckets
// [c*PositionChunk, (c+1)*PositionChunk).
const PositionChunk = 4096

// BucketPositions is the committed position of the buckets of a keyspace
// that no holder's positions cover, run-length encoded: runs of buckets at
// one position, sorted by First, neither overlapping nor adjacent at an
// equal position, each at a position > 0. A bucket no run covers is at 0,
// the start of the stream. The leader writes it (and an admin's reset, of
// buckets nobody holds).
type BucketPositions struct {
	Runs []PositionRun
}

// Position returns bucket b's position in p.
func (p BucketPositions) Position(b int) uint64 {
	i := sort.Search(len(p.Runs), func(i int) bool { return p.Runs[i].First+p.Runs[i].Count > b })
	if i < len(p.Runs) && p.Runs[i].First <= b {
		return p.Runs[i].Position
	}
	return 0
}

// Dense returns the position of each of buckets buckets, [0, buckets).
func (p BucketPositions) Dense(buckets int) []uint64 {
	out := make([]uint64, buckets)
	for _, r := range p.Runs {
		for b := r.First; b < r.First+r.Count && b < buckets; b++ {
			out[b] = r.Position
		}
	}
	return out
}

// NewBucketPositions returns the canonical run-length form of pos, where
// pos[b] is bucket b's position.
func NewBucketPositions(pos []uint64) BucketPositions {
	var p BucketPositions
	for b, v := range pos {
		if v == 0 {
			continue
		}
		if n := len(p.Runs); n > 0 && p.Runs[n-1].Position == v && p.Runs[n-1].First+p.Runs[n-1].Count == b {
			p.Runs[n-1].Count++
			continue
		}
		p.Runs = append(p.Runs, PositionRun{First: b, Count: 1, Position: v})
	}
	return p
}

// Positions returns the effective committed position of each bucket that
// grants holds, in the order of grants.Buckets: the exception of c for the
// bucket if c lists one at the grant's token, else c.Default if the grant's
// token is <= c.MaxToken, else the grant's Position (where the holder
// started); and never below the grant's Position nor below base, the
// keyspace's position of the bucket. c counts only if it is the grants'
// session's; otherwise (no commit yet, or a commit of an earlier session)
// every bucket is at its grant's Position, or base.
//
// Taking the maximum with the grant's Position keeps a commit from moving
// a bucket that the holder was granted ahead of its own position behind
// it: the holder starts such a bucket at the grant's Position, so it has
// not skipped anything there.
func Positions(g Grants, c Commit, base BucketPositions) []uint64 {
	out := make([]uint64, len(g.Buckets))
	mine := c.Session != 0 && c.Session == g.Session
	for i, bt := range g.Buckets {
		p := bt.Position
		if mine {
			if e, ok := c.Exception(bt.Bucket); ok && e.Token == bt.Token {
				p = max(p, e.Position)
			} else if bt.Token <= c.MaxToken {
				p = max(p, c.Default)
			}
		}
		out[i] = max(p, base.Position(bt.Bucket))
	}
	return out
}

// PinReleased returns the commit record to store for c, a commit of the
// session of grants g that replaces record prev, given the session's
// release record r (sorted by bucket, as Releases keeps it): c, with every
// bucket that the session released without a final position, and that g
// still holds at the token it released it at, pinned where prev puts it. Such a bucket waits for the leader to
// hand it over, and the leader then takes its position from the commit
// record (the release names no other); the holder handles nothing of it
// after the release, so a commit made after it must not move it. For each
// such bucket that c would move (its default covers it, or its exception
// is ahead of prev), the result has an exception at the bucket's
// effective position under prev (Positions; its grant's Position if the
// session has committed nothing). Any other commit is returned as given.
//
// So, once a release without final positions is recorded, no later
// commit changes the released buckets' effective positions: the leader
// may hand them over from the record as it read it, whatever commits land
// before its grant write (the store checks the release record in every
// commit's transaction).
//
// The pins are as many as the buckets released and not handed over yet:
// the next commit after the hand-over is stored as given again.
func PinReleased(g Grants, r Releases, prev, c Commit) Commit {
	if g.Session != c.Session || len(r.Buckets) == 0 {
		return c
	}
	if prev.Session != c.Session {
		prev = Commit{} // an earlier session's record counts for nothing
	}
	var pins []BucketPosition
	for _, rb := range r.Buckets {
		if rb.Position > 0 {
			continue // the leader folds the final position the release gives
		}
		i, ok := slices.BinarySearchFunc(g.Buckets, rb.Bucket, func(bt BucketToken, b int) int { return bt.Bucket - b })
		if !ok || g.Buckets[i].Token != rb.Token {
			continue // handed over already, or a release of another grant
		}
		one := Grants{Session: g.Session, Buckets: g.Buckets[i : i+1]}
		was, now := Positions(one, prev, BucketPositions{})[0], Positions(one, c, BucketPositions{})[0]
		if now > was {
			pins = append(pins, BucketPosition{Bucket: rb.Bucket, Token: rb.Token, Position: was})
		}
	}
	if len(pins) == 0 {
		return c
	}
	out := c
	out.Exceptions = make([]BucketPosition, 0, len(c.Exceptions)+len(pins))
	i, j := 0, 0
	for i < len(c.Exceptions) || j < len(pins) {
		switch {
		case j == len(pins) || (i < len(c.Exceptions) && c.Exceptions[i].Bucket < pins[j].Bucket):
			out.Exceptions = append(out.Exceptions, c.Exceptions[i])
			i++
		case i < len(c.Exceptions) && c.Exceptions[i].Bucket == pins[j].Bucket:
			out.Exceptions = append(out.Exceptions, pins[j]) // the pin replaces c's exception
			i, j = i+1, j+1
		default:
			out.Exceptions = append(out.Exceptions, pins[j])
			j++
		}
	}
	return out
}

// Holder is who holds a bucket: a member and the token of its grant; the
// zero Holder means nobody does.
type Holder struct {
	Member string
	Token  uint64
}

// HeldPositions is the input of KeyspacePositions: what a stream keyspace
// stores, by member id. Releases of a member count only if they belong
// to the session of its grants (the caller checks the leases).
type HeldPositions struct {
	Buckets  int
	Grants   map[string]Grants
	Commits  map[string]Commit
	Releases map[string]Releases
	// Copies are the leader's copies of the members' grants (held/): a
	// commit record of an ended session counts through its copy.
	Copies map[string]Held
	Base   BucketPositions
}

// KeyspacePositions returns every bucket's committed position, [0,
// in.Buckets), and its holder, as the leader would fold them if every
// holder gave its buckets up now:
//
//   - a held bucket is at Positions(grants, the holder's commit, base),
//     or, if the holder released it at the grant's token with a final
//     position (a release the leader has not processed yet), at that final
//     position (never below base): the leader's fold takes it over any
//     later commit;
//   - a bucket nobody holds that the copy of an ended session names is at
//     Positions(the copy, that session's commit, base), as the leader's
//     next round folds it;
//   - any other bucket is at base.
//
// A bucket that two members' grants name (which the leader never writes)
// counts as held by the grant with the higher token. Buckets outside the
// keyspace are ignored.
func KeyspacePositions(in HeldPositions) ([]uint64, []Holder) {
	pos := in.Base.Dense(in.Buckets)
	holders := make([]Holder, in.Buckets)
	ids := make([]string, 0, len(in.Grants))
	for id := range in.Grants {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		g := in.Grants[id]
		rel := map[int]BucketToken{}
		for _, bt := range in.Releases[id].Buckets {
			rel[bt.Bucket] = bt
		}
		eff := Positions(g, in.Commits[id], in.Base)
		for i, bt := range g.Buckets {
			b := bt.Bucket
			if b < 0 || b >= in.Buckets || holders[b].Token > bt.Token {
				continue
			}
			p := eff[i]
			if r, ok := rel[b]; ok && r.Token == bt.Token && r.Position > 0 {
				p = max(r.Position, in.Base.Position(b)) // where the holder stopped: the fold takes it
			}
			pos[b], holders[b] = p, Holder{Member: id, Token: bt.Token}
		}
	}
	for _, id := range sortedKeys(in.Commits) {
		c, cp := in.Commits[id], in.Copies[id]
		if c.Session == 0 || cp.Session != c.Session || in.Grants[id].Session == c.Session {
			continue // no copy of the commit's session, or the session still holds its grants
		}
		g := Grants(cp)
		for i, p := range Positions(g, c, in.Base) {
			if b := g.Buckets[i].Bucket; b >= 0 && b < in.Buckets && holders[b].Member == "" {
				pos[b] = max(pos[b], p)
			}
		}
	}
	return pos, holders
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
