package store

import (
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/placement"
)

// Stream positions (see internal/shard's Commit and BucketPositions) are
// stored in two kinds of key:
//
//   - positions/<ks>/<id>: member id's Commit, one record replaced whole by
//     every CommitPositions, without a lease, so that a crash loses no
//     committed position. The leader folds it into bucketpos and deletes it
//     once the session that wrote it has ended.
//     JSON: {"session":L,"max_token":T,"default":P,"exceptions":[[bucket,token,position],...]},
//     "exceptions" omitted when empty.
//   - bucketpos/<ks>/<chunk>: the positions of the PositionChunk buckets
//     from chunk*PositionChunk on that no holder covers, run-length
//     encoded: {"runs":[[first,count,position],...]}, runs sorted, inside
//     the chunk, neither overlapping nor adjacent at one position, each at
//     a position > 0 (a bucket no run covers is at 0). The leader writes
//     them (PutBucketPositions in a fenced Commit), and an admin's
//     ResetPositions for buckets nobody holds; a change rewrites
//     only the chunks it touches, and even 65,536 distinct positions keep
//     each value near 130 KB.

// PositionChunk is the number of buckets whose positions one bucketpos key
// holds; a keyspace has at most MaxPositionChunks of them.
const (
	PositionChunk     = shard.PositionChunk
	MaxPositionChunks = placement.MaxBuckets / PositionChunk
)

// ErrBackwards: a commit would move a bucket's committed position
// backwards. The error is a *BackwardsError.
var ErrBackwards = errors.New("store: position would go backwards")

// BackwardsError names the field of a commit that would move a position
// backwards, and the bucket (-1 for a field of the whole record: "default",
// "max_token").
type BackwardsError struct {
	Field     string
	Bucket    int
	Committed uint64 // what is committed now
	Given     uint64 // what the commit would make it
}

func (e *BackwardsError) Error() string {
	if e.Bucket < 0 {
		return fmt.Sprintf("field %q: %d is lower than the %d committed before", e.Field, e.Given, e.Committed)
	}
	return fmt.Sprintf("field %q: bucket %d would go back from position %d to %d", e.Field, e.Bucket, e.Committed, e.Given)
}

// Unwrap returns ErrBackwards.
func (e *BackwardsError) Unwrap() error { return ErrBackwards }

// parseChunk parses a bucketpos key's chunk: a canonical decimal in
// [0, MaxPositionChunks).
func parseChunk(s string) (int, error) {
	if s == "" || len(s) > 5 || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("%.24q is not a canonical decimal", s)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%.24q is not a canonical decimal", s)
	}
	if n >= MaxPositionChunks {
		return 0, fmt.Errorf("chunk %d is outside [0, %d)", n, MaxPositionChunks)
	}
	return n, nil
}

// validateCommit checks c: a session, and exceptions sorted by bucket,
// distinct, in [0, placement.MaxBuckets), each at a token >= 1.
func validateCommit(c shard.Commit) *fieldError {
	if c.Session <= 0 {
		return ferr("session", "%d is not a lease id", int64(c.Session))
	}
	for i, e := range c.Exceptions {
		if e.Bucket < 0 || e.Bucket >= placement.MaxBuckets {
			return ferr("exceptions", "entry %d: bucket %d is outside [0, %d)", i, e.Bucket, placement.MaxBuckets)
		}
		if e.Token == 0 {
			return ferr("exceptions", "entry %d: bucket %d has token 0; tokens start at 1", i, e.Bucket)
		}
		if i > 0 && c.Exceptions[i-1].Bucket >= e.Bucket {
			if c.Exceptions[i-1].Bucket == e.Bucket {
				return ferr("exceptions", "entry %d: bucket %d appears twice", i, e.Bucket)
			}
			return ferr("exceptions", "entry %d: bucket %d follows %d; want ascending order", i, e.Bucket, c.Exceptions[i-1].Bucket)
		}
	}
	return nil
}

// validateRuns checks runs as BucketPositions keeps them, all inside
// [lo, hi).
func validateRuns(runs []shard.PositionRun, lo, hi int) *fieldError {
	for i, r := range runs {
		if r.Count < 1 {
			return ferr("runs", "entry %d: count %d; a run has at least one bucket", i, r.Count)
		}
		if r.First < lo || r.First > hi-r.Count {
			return ferr("runs", "entry %d: buckets [%d, %d+%d) are outside [%d, %d)", i, r.First, r.First, r.Count, lo, hi)
		}
		if r.Position == 0 {
			return ferr("runs", "entry %d: position 0; leave buckets at 0 out", i)
		}
		if i > 0 {
			p := runs[i-1]
			if end := p.First + p.Count; end > r.First {
				return ferr("runs", "entry %d: starts at bucket %d, inside the previous run (which ends at %d)", i, r.First, end)
			} else if end == r.First && p.Position == r.Position {
				return ferr("runs", "entry %d: continues the previous run at the same position %d; merge them", i, r.Position)
			}
		}
	}
	return nil
}

type commitOut struct {
	Session    int64       `json:"session"`
	MaxToken   uint64      `json:"max_token"`
	Default    uint64      `json:"default"`
	Exceptions [][3]uint64 `json:"exceptions,omitempty"`
}

type commitIn struct {
	Session    int64    `json:"session"`
	MaxToken   uint64   `json:"max_token"`
	Default    uint64   `json:"default"`
	Exceptions uintRows `json:"exceptions"`
}

var commitFields = []string{"session", "max_token", "default", "exceptions"}

type bucketPosOut struct {
	Runs [][3]uint64 `json:"runs"`
}

type bucketPosIn struct {
	Runs uintRows `json:"runs"`
}

var bucketPosFields = []string{"runs"}

// triplesIn parses [[a, b, c], ...] strictly: three plain non-negative
// integers per entry, named by names in errors.
func triplesIn(key, field string, in uintRows, names [3]string) ([][3]uint64, error) {
	out := make([][3]uint64, in.Len())
	for i := range in.Len() {
		e := in.Row(i)
		if len(e) != 3 {
			return nil, corruptf(key, field, "entry %d has %d elements; want [%s, %s, %s]", i, len(e), names[0], names[1], names[2])
		}
		for j := range 3 {
			if err := in.Err(i, j); err != nil {
				return nil, corruptf(key, field, "entry %d: %s: %v", i, names[j], err)
			}
			out[i][j] = e[j]
		}
	}
	return out, nil
}

// EncodeCommit returns the stored form of c, stored at positions/<ks>/<id>
// without a lease. It returns an error wrapping ErrInvalid, naming the
// field, if c does not validate.
func EncodeCommit(c shard.Commit) ([]byte, error) {
	if e := validateCommit(c); e != nil {
		return nil, e.invalid("commit")
	}
	w := commitOut{Session: int64(c.Session), MaxToken: c.MaxToken, Default: c.Default}
	for _, e := range c.Exceptions {
		w.Exceptions = append(w.Exceptions, [3]uint64{uint64(e.Bucket), e.Token, e.Position})
	}
	return marshal(w)
}

// DecodeCommit decodes the value stored at key. Errors wrap ErrCorrupt and
// name key and field.
func DecodeCommit(key string, data []byte) (shard.Commit, error) {
	var w commitIn
	if err := decodeStrict(key, data, commitFields, &w); err != nil {
		return shard.Commit{}, err
	}
	ts, err := triplesIn(key, "exceptions", w.Exceptions, [3]string{"bucket", "token", "position"})
	if err != nil {
		return shard.Commit{}, err
	}
	c := shard.Commit{Session: shard.LeaseID(w.Session), MaxToken: w.MaxToken, Default: w.Default}
	for i, t := range ts {
		if t[0] >= placement.MaxBuckets {
			return shard.Commit{}, corruptf(key, "exceptions", "entry %d: bucket %d is outside [0, %d)", i, t[0], placement.MaxBuckets)
		}
		c.Exceptions = append(c.Exceptions, shard.BucketPosition{Bucket: int(t[0]), Token: t[1], Position: t[2]})
	}
	if e := validateCommit(c); e != nil {
		return shard.Commit{}, e.corrupt(key)
	}
	return c, nil
}

// EncodeBucketPositions returns the stored form of chunk chunk of a
// keyspace's bucket positions, p, stored at bucketpos/<ks>/<chunk>. It
// returns an error wrapping ErrInvalid if chunk is out of range or p's runs
// are not canonical (see shard.BucketPositions) or lie outside the chunk.
func EncodeBucketPositions(chunk int, p shard.BucketPositions) ([]byte, error) {
	if chunk < 0 || chunk >= MaxPositionChunks {
		return nil, invalidf("bucket positions: chunk %d is outside [0, %d)", chunk, MaxPositionChunks)
	}
	if e := validateRuns(p.Runs, chunk*PositionChunk, (chunk+1)*PositionChunk); e != nil {
		return nil, e.invalid(fmt.Sprintf("bucket positions chunk %d", chunk))
	}
	w := bucketPosOut{Runs: make([][3]uint64, len(p.Runs))}
	for i, r := range p.Runs {
		w.Runs[i] = [3]uint64{uint64(r.First), uint64(r.Count), r.Position}
	}
	return marshal(w)
}

// DecodeBucketPositions decodes the value stored at key: when key is a
// bucketpos key, its runs must lie inside the key's chunk. Errors wrap
// ErrCorrupt.
func DecodeBucketPositions(key string, data []byte) (shard.BucketPositions, error) {
	var w bucketPosIn
	if err := decodeStrict(key, data, bucketPosFields, &w); err != nil {
		return shard.BucketPositions{}, err
	}
	ts, err := triplesIn(key, "runs", w.Runs, [3]string{"first", "count", "position"})
	if err != nil {
		return shard.BucketPositions{}, err
	}
	var p shard.BucketPositions
	for i, t := range ts {
		if t[0] >= placement.MaxBuckets || t[1] > placement.MaxBuckets {
			return shard.BucketPositions{}, corruptf(key, "runs", "entry %d: buckets [%d, %d+%d) are outside [0, %d)", i, t[0], t[0], t[1], placement.MaxBuckets)
		}
		p.Runs = append(p.Runs, shard.PositionRun{First: int(t[0]), Count: int(t[1]), Position: t[2]})
	}
	lo, hi := 0, placement.MaxBuckets
	if kind, _, id, err := ParseKey(key); err == nil && kind == KindBucketPos {
		c, _ := parseChunk(id)
		lo, hi = c*PositionChunk, (c+1)*PositionChunk
	}
	if e := validateRuns(p.Runs, lo, hi); e != nil {
		return shard.BucketPositions{}, e.corrupt(key)
	}
	return p, nil
}

// SplitPositions splits p into the chunks it is stored in: element c holds
// the runs of buckets [c*PositionChunk, (c+1)*PositionChunk), a run that
// crosses a chunk's end split in two. There are MaxPositionChunks elements;
// those of empty chunks have no runs.
func SplitPositions(p shard.BucketPositions) []shard.BucketPositions {
	out := make([]shard.BucketPositions, MaxPositionChunks)
	for _, r := range p.Runs {
		for r.Count > 0 {
			c := r.First / PositionChunk
			if c < 0 || c >= MaxPositionChunks {
				break
			}
			n := min(r.Count, (c+1)*PositionChunk-r.First)
			out[c].Runs = append(out[c].Runs, shard.PositionRun{First: r.First, Count: n, Position: r.Position})
			r.First, r.Count = r.First+n, r.Count-n
		}
	}
	return out
}

// JoinPositions joins chunks, as SplitPositions makes them, into one
// canonical BucketPositions: runs that meet at a chunk's end at one
// position are merged.
func JoinPositions(chunks []shard.BucketPositions) shard.BucketPositions {
	var p shard.BucketPositions
	for _, c := range chunks {
		for _, r := range c.Runs {
			if n := len(p.Runs); n > 0 && p.Runs[n-1].Position == r.Position && p.Runs[n-1].First+p.Runs[n-1].Count == r.First {
				p.Runs[n-1].Count += r.Count
				continue
			}
			p.Runs = append(p.Runs, r)
		}
	}
	return p
}

// PutBucketPositions returns the writes that change keyspace ks's bucket
// positions from old (as read) to next: a put for each chunk whose runs
// differ, a delete for each chunk that becomes empty, nothing for the
// others. Only the leader writes them, in a fenced Commit with an
// expectation on each chunk it read (ExpectEntry(BucketPosKey(ks, c), ...)),
// so that a deposed leader cannot overwrite newer positions. A Write
// carries ErrInvalid if next is not canonical.
func PutBucketPositions(ks string, old, next shard.BucketPositions) []Write {
	if e := validateRuns(next.Runs, 0, placement.MaxBuckets); e != nil {
		return []Write{{key: BucketPosKey(ks, 0), err: e.invalid("bucket positions")}}
	}
	was, now := SplitPositions(old), SplitPositions(next)
	var out []Write
	for c := range now {
		if slices.Equal(was[c].Runs, now[c].Runs) {
			continue
		}
		key := BucketPosKey(ks, c)
		if len(now[c].Runs) == 0 {
			w := Delete(key)
			w.err = nameErr(w.err, ks, "")
			out = append(out, w)
			continue
		}
		b, err := EncodeBucketPositions(c, now[c])
		out = append(out, Write{key: key, val: b, err: nameErr(err, ks, "")})
	}
	return out
}
