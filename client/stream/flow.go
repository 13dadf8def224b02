package stream

import (
	"errors"
	"fmt"
	"math"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/placement"
)

// Record is one record of the shared stream.
type Record struct {
	// Key decides the record's bucket, through the keyspace's hash.
	Key []byte
	// Position orders the stream: records come in strictly increasing
	// position. Record positions are below math.MaxUint64.
	Position uint64
	// Payload is the record's content; the package never reads it.
	Payload []byte
	// Bucket is the bucket of Key, set by the Flow on the records it
	// delivers; a Reader leaves it 0.
	Bucket int
	// Token is the fencing token the Worker holds Bucket at, set by a
	// stream Worker on the records it hands to its handle function (0
	// elsewhere): pass it to storage with the record's writes, so a write
	// made after the bucket moved on is refused.
	Token uint64
}

// BucketPosition is a bucket with a stream position: for a grant, the
// position its records are delivered from (the bucket's last committed
// position); in Progress, the position of the next record of the bucket
// to process, which is what a commit sends.
type BucketPosition struct {
	Bucket   int
	Position uint64
}

// ErrOrder: a reader returned records out of position order, below the
// position it was asked to read from, or a next position below one it
// returned. The batch is refused from the first bad record on.
var ErrOrder = errors.New("stream: records out of order")

// none marks a bucket a lane does not deliver.
const none = math.MaxUint64

// Flow decides which records of the shared stream a stream worker
// delivers, and tracks how far each of its buckets has got. It has two
// lanes over the same stream:
//
//   - the main lane, read from Position, delivers the records of the
//     buckets that are caught up (and of gained buckets whose from was at
//     or after Position, once the stream reaches their from);
//   - the catch-up lane, read from Catching while some gained bucket is
//     behind (its from was before Position), delivers the records of the
//     behind buckets at or after their from, up to Position. When it
//     reaches Position the behind buckets merge into the main lane.
//
// So each key's records are delivered in stream order, every record of a
// held bucket at or after its from exactly once, and none of a bucket
// after Lose. Positions are opaque and ordered; a Flow never reads the
// stream itself: the caller reads each lane (Consumer does it with a
// Reader) and passes the batches to Main and Catchup.
//
// A Flow does no IO and starts no goroutine. It is not safe for
// concurrent use: one goroutine, or a lock the caller holds, owns it.
// Progress describes the records passed to Main and Catchup whose
// deliver call returned nil, so a commit of it is safe once those
// records' effects are durable.
type Flow struct {
	hasher placement.Hasher
	// pos is the main lane's position: the next record it reads.
	pos uint64
	// mainFrom and catchFrom hold, per bucket, the least position the
	// lane delivers for it; none for buckets the lane does not deliver.
	// A bucket is in at most one lane.
	mainFrom, catchFrom []uint64
	// catching says a catch-up runs: behind > 0 buckets have a
	// catchFrom, and cursor is the catch-up lane's next position.
	catching bool
	behind   int
	cursor   uint64
	// memo remembers the buckets of recent keys when the hash is costly
	// (synapse-sha256: a SHA-256 per key); nil for xxh64, which is
	// cheaper than a map lookup. It holds at most memoKeys keys and is
	// emptied when full, so its memory is bounded.
	memo map[string]int32
}

// memoKeys bounds Flow.memo: a stream's keys (Synapse's destinations,
// say) repeat, so a few thousand cover most records.
const memoKeys = 16384

// NewFlow returns a Flow for a keyspace whose keys map to buckets with
// hasher (placement.NewHasher with the keyspace's hash and bucket count,
// as a Router uses), holding no bucket, with the main lane at position
// pos. It returns an *client.ArgError for the zero Hasher or pos
// math.MaxUint64.
func NewFlow(hasher placement.Hasher, pos uint64) (*Flow, error) {
	if hasher.Buckets() == 0 {
		return nil, &client.ArgError{Func: "NewFlow", Arg: "hasher", Reason: "is the zero Hasher; build one with placement.NewHasher"}
	}
	if pos == none {
		return nil, &client.ArgError{Func: "NewFlow", Arg: "pos", Reason: "is math.MaxUint64, which is no position"}
	}
	n := hasher.Buckets()
	f := &Flow{hasher: hasher, pos: pos, mainFrom: make([]uint64, n), catchFrom: make([]uint64, n)}
	if hasher.Mode() == placement.HashSynapse {
		f.memo = make(map[string]int32, memoKeys)
	}
	for b := range n {
		f.mainFrom[b], f.catchFrom[b] = none, none
	}
	return f, nil
}

// bucket returns key's bucket, from the memo if the hash is costly.
func (f *Flow) bucket(key []byte) int {
	if f.memo == nil {
		return f.hasher.Bucket(key)
	}
	if b, ok := f.memo[string(key)]; ok {
		return int(b)
	}
	b := f.hasher.Bucket(key)
	if len(f.memo) >= memoKeys {
		clear(f.memo)
	}
	f.memo[string(key)] = int32(b)
	return b
}

// Position returns the main lane's position: where it reads next.
func (f *Flow) Position() uint64 { return f.pos }

// Catching returns where the catch-up lane reads next, and whether a
// catch-up runs (some gained bucket is behind Position).
func (f *Flow) Catching() (pos uint64, ok bool) { return f.cursor, f.catching }

// Gain adds buckets, each with the position its records are delivered
// from (the grant's from). A bucket whose from is at or after Position
// joins the main lane at once; its records before from are skipped. One
// whose from is before Position is behind: the catch-up lane delivers it
// from there, rewinding if that is before where it is (the buckets
// already catching up lose nothing and get nothing twice). A bucket held
// already is gained anew. Gain returns an *client.ArgError, and gains
// nothing, for a bucket out of range or a position math.MaxUint64.
func (f *Flow) Gain(gs ...BucketPosition) error {
	for i, g := range gs {
		if err := f.checkBucket("Gain", g.Bucket); err != nil {
			return err
		}
		if g.Position == none {
			return &client.ArgError{Func: "Gain", Arg: fmt.Sprintf("gs[%d].Position", i), Reason: "is math.MaxUint64, which is no position"}
		}
	}
	for _, g := range gs {
		f.drop(g.Bucket)
		if g.Position >= f.pos {
			f.mainFrom[g.Bucket] = g.Position
			continue
		}
		switch {
		case !f.catching:
			f.catching, f.cursor = true, g.Position
		case g.Position < f.cursor:
			// Rewind: what the behind buckets have had up to the cursor
			// stays theirs.
			for b, from := range f.catchFrom {
				if from != none && from < f.cursor {
					f.catchFrom[b] = f.cursor
				}
			}
			f.cursor = g.Position
		}
		f.catchFrom[g.Bucket] = g.Position
		f.behind++
	}
	return nil
}

// Lose removes buckets: no record of theirs is delivered after Lose
// returns. A catch-up with no bucket left behind ends. Buckets not held
// are ignored; Lose returns an *client.ArgError, and removes nothing, for
// a bucket out of range.
func (f *Flow) Lose(buckets ...int) error {
	for _, b := range buckets {
		if err := f.checkBucket("Lose", b); err != nil {
			return err
		}
	}
	for _, b := range buckets {
		f.drop(b)
	}
	return nil
}

func (f *Flow) drop(b int) {
	f.mainFrom[b] = none
	if f.catchFrom[b] != none {
		f.catchFrom[b] = none
		f.behind--
		if f.behind == 0 {
			f.catching = false
		}
	}
}

func (f *Flow) checkBucket(fn string, b int) error {
	if b < 0 || b >= len(f.mainFrom) {
		return &client.ArgError{Func: fn, Arg: "bucket", Reason: fmt.Sprintf("%d is out of range [0, %d)", b, len(f.mainFrom))}
	}
	return nil
}

// Main passes the main lane a batch read from Position: recs in strictly
// increasing position, all at or after from, and next, where the lane
// reads next (after every record of recs). Main calls deliver, in order,
// for the records of the buckets it delivers, and moves Position to
// next. If deliver returns an error Main stops there and returns it;
// Position is then that record's, so it is read and delivered again.
// Main returns an error wrapping ErrOrder, having taken the records
// before the bad one, for records out of order, and an error if from is
// not Position (a batch read for another position).
func (f *Flow) Main(from uint64, recs []Record, next uint64, deliver func(Record) error) error {
	if from != f.pos {
		return fmt.Errorf("stream: main lane batch read from %d, but the lane is at %d", from, f.pos)
	}
	mainFrom := f.mainFrom
	for i := range recs {
		r := &recs[i]
		if r.Position < f.pos || r.Position == none {
			return fmt.Errorf("%w: main lane record at %d after position %d", ErrOrder, r.Position, f.pos)
		}
		if b := f.bucket(r.Key); r.Position >= mainFrom[b] {
			rec := *r // the Reader's record is left as it is
			rec.Bucket = b
			if err := deliver(rec); err != nil {
				f.pos = r.Position
				return err
			}
		}
		f.pos = r.Position + 1
	}
	if next < f.pos {
		return fmt.Errorf("%w: main lane next position %d is before %d", ErrOrder, next, f.pos)
	}
	f.pos = next
	return nil
}

// Catchup passes the catch-up lane a batch read from where Catching said:
// recs in strictly increasing position, all at or after from, and next,
// where the lane reads next. Catchup calls deliver, in order, for the
// records of the behind buckets at or after their from and before
// Position. Once the lane reaches Position the behind buckets join the
// main lane (merged is true) and the rest of the batch is left to it.
//
// A batch read from a position that is no longer the lane's (Gain
// rewound it, or every behind bucket was lost) is ignored: Catchup
// delivers nothing and returns false, nil; read again from Catching.
// Errors are those of Main.
func (f *Flow) Catchup(from uint64, recs []Record, next uint64, deliver func(Record) error) (merged bool, err error) {
	if !f.catching || from != f.cursor {
		return false, nil
	}
	catchFrom := f.catchFrom
	for i := range recs {
		r := &recs[i]
		if r.Position < f.cursor || r.Position == none {
			return false, fmt.Errorf("%w: catch-up record at %d after position %d", ErrOrder, r.Position, f.cursor)
		}
		if r.Position >= f.pos {
			f.merge()
			return true, nil
		}
		if b := f.bucket(r.Key); r.Position >= catchFrom[b] {
			rec := *r // the Reader's record is left as it is
			rec.Bucket = b
			if err := deliver(rec); err != nil {
				f.cursor = r.Position
				return false, err
			}
		}
		f.cursor = r.Position + 1
	}
	if next < f.cursor {
		return false, fmt.Errorf("%w: catch-up next position %d is before %d", ErrOrder, next, f.cursor)
	}
	f.cursor = next
	if f.cursor >= f.pos {
		f.merge()
		return true, nil
	}
	return false, nil
}

// merge moves the behind buckets, caught up to Position, into the main
// lane.
func (f *Flow) merge() {
	for b, from := range f.catchFrom {
		if from != none {
			f.catchFrom[b] = none
			f.mainFrom[b] = 0
		}
	}
	f.catching, f.behind, f.cursor = false, 0, 0
}

// Progress returns what a commit sends for the held buckets: def, the
// position of every bucket that follows the main lane (Position), and
// except, in bucket order, the buckets elsewhere: behind ones (at the
// catch-up lane's progress for them) and ones gained with a from after
// Position that the lane has not reached. It allocates only for except.
func (f *Flow) Progress() (def uint64, except []BucketPosition) {
	for b, from := range f.catchFrom {
		switch {
		case from != none:
			except = append(except, BucketPosition{b, max(from, f.cursor)})
		case f.mainFrom[b] != none && f.mainFrom[b] > f.pos:
			except = append(except, BucketPosition{b, f.mainFrom[b]})
		}
	}
	return f.pos, except
}

// BucketProgress returns held bucket b's position as Progress counts it
// (Position for a bucket that follows the main lane, its own otherwise):
// the position of its next record to process. ok is false if b is not
// held.
func (f *Flow) BucketProgress(b int) (pos uint64, ok bool) {
	switch {
	case !f.Held(b):
		return 0, false
	case f.catchFrom[b] != none:
		return max(f.catchFrom[b], f.cursor), true
	case f.mainFrom[b] > f.pos:
		return f.mainFrom[b], true
	}
	return f.pos, true
}

// Held reports whether bucket b is held (gained and not lost).
func (f *Flow) Held(b int) bool {
	return b >= 0 && b < len(f.mainFrom) && (f.mainFrom[b] != none || f.catchFrom[b] != none)
}
