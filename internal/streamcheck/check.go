package streamcheck

import (
	"fmt"
	"slices"
	"sort"
	"sync"
)

// Event is one event of the stream, as produced.
type Event struct {
	Pos    uint64
	Key    string
	Bucket int
}

// BucketPosition is a commit's own position for one bucket held at Token.
type BucketPosition struct {
	Bucket   int
	Token    uint64
	Position uint64
}

// End is how a tenure ended.
type End int

const (
	// Held: the tenure had not ended when the record was taken.
	Held End = iota
	// Released: the holder released the bucket gracefully.
	Released
	// Crashed: the holder's process or session ended without a release.
	Crashed
)

func (e End) String() string {
	switch e {
	case Released:
		return "released"
	case Crashed:
		return "crashed"
	}
	return "held"
}

// Tenure is one grant of a bucket to a worker, from its acquire to its end.
type Tenure struct {
	Worker string
	Bucket int
	Token  uint64
	// From is the grant's from: where the holder starts the bucket.
	From uint64
	// Committed is the bucket's highest position among the holder's
	// acknowledged commits (at least From).
	Committed uint64
	End       End
	// Final is the final position a graceful release handed over.
	Final uint64

	handled []handling
	// unacquired: handled before its acquire was recorded (a worker may
	// hand records to its handler before its acquire callback returns).
	unacquired bool
	// stopped: the holder stopped handling the bucket (Stop); a commit's
	// default no longer covers it, only an exception of its own.
	stopped bool
}

type handling struct {
	pos uint64
	key string
}

type tenureKey struct {
	bucket int
	token  uint64
}

// Recorder collects a run's record. It is safe for concurrent use.
type Recorder struct {
	mu      sync.Mutex
	tenures map[tenureKey]*Tenure
	open    map[string]map[tenureKey]*Tenure // by worker
	errs    []string
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder {
	return &Recorder{tenures: map[tenureKey]*Tenure{}, open: map[string]map[tenureKey]*Tenure{}}
}

func (r *Recorder) errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// Acquire records that worker was granted bucket at token, starting at
// from. Recording the same grant again is a no-op, so a worker may record
// it both when its first record is handled and when its acquire event
// arrives, whichever comes first.
func (r *Recorder) Acquire(worker string, bucket int, token, from uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := tenureKey{bucket, token}
	if t, ok := r.tenures[k]; ok {
		if t.unacquired && t.Worker == worker {
			t.unacquired, t.From, t.Committed = false, from, max(t.Committed, from)
			return
		}
		if t.Worker != worker || t.From != from {
			r.errorf("bucket %d token %d acquired twice (by %s from %d, by %s from %d)", bucket, token, t.Worker, t.From, worker, from)
		}
		return
	}
	t := &Tenure{Worker: worker, Bucket: bucket, Token: token, From: from, Committed: from}
	r.tenures[k] = t
	if r.open[worker] == nil {
		r.open[worker] = map[tenureKey]*Tenure{}
	}
	r.open[worker][k] = t
}

// Handle records that worker handled the event at pos with key, as the
// holder of bucket at token.
func (r *Recorder) Handle(worker string, bucket int, token, pos uint64, key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := tenureKey{bucket, token}
	t, ok := r.open[worker][k]
	if !ok {
		if _, known := r.tenures[k]; known || token == 0 {
			r.errorf("%s handled position %d (key %q) of bucket %d at token %d without holding it", worker, pos, key, bucket, token)
			return
		}
		// The first record of a grant whose acquire is not recorded yet.
		t = &Tenure{Worker: worker, Bucket: bucket, Token: token, unacquired: true}
		r.tenures[k] = t
		if r.open[worker] == nil {
			r.open[worker] = map[tenureKey]*Tenure{}
		}
		r.open[worker][k] = t
	}
	t.handled = append(t.handled, handling{pos, key})
}

// Commit records an acknowledged commit of worker: every bucket it holds
// at a token <= maxToken that except does not list is at def; those
// except lists (at the token they are held) are at their own position.
func (r *Recorder) Commit(worker string, maxToken, def uint64, except []BucketPosition) {
	r.mu.Lock()
	defer r.mu.Unlock()
	own := make(map[tenureKey]uint64, len(except))
	for _, e := range except {
		own[tenureKey{e.Bucket, e.Token}] = e.Position
	}
	for k, t := range r.open[worker] {
		p, ok := own[k]
		if !ok {
			if k.token > maxToken || t.stopped {
				continue
			}
			p = def
		}
		t.Committed = max(t.Committed, p)
	}
}

// Stop records that worker stopped handling bucket at token (its handler
// let the bucket go): from then on only a commit's exception for the
// bucket counts, as the server pins a released bucket against a later
// commit's default. Release or Crash ends the tenure.
func (r *Recorder) Stop(worker string, bucket int, token uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.open[worker][tenureKey{bucket, token}]; ok {
		t.stopped = true
	}
}

// Release records worker's graceful release of bucket at token, handing
// over final.
func (r *Recorder) Release(worker string, bucket int, token, final uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := tenureKey{bucket, token}
	t, ok := r.open[worker][k]
	if !ok {
		if t, known := r.tenures[k]; known && t.Worker == worker && t.End == Crashed {
			// The server recorded the release, though its answer came
			// after the session was lost: the release is what counts.
			t.End, t.Final = Released, final
			return
		}
		if _, known := r.tenures[k]; !known {
			// A grant that ended before the worker started it (its
			// Acquire never ran): handed over where it began.
			r.tenures[k] = &Tenure{Worker: worker, Bucket: bucket, Token: token, From: final, Committed: final, End: Released, Final: final}
			return
		}
		r.errorf("%s released bucket %d at token %d without holding it", worker, bucket, token)
		return
	}
	t.End, t.Final = Released, final
	delete(r.open[worker], k)
}

// Crash records that every tenure worker still holds ended without a
// release (its process was killed, or its session was lost).
func (r *Recorder) Crash(worker string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, t := range r.open[worker] {
		t.End = Crashed
		delete(r.open[worker], k)
	}
}

// Tenures returns a copy of every tenure recorded, by bucket then token.
func (r *Recorder) Tenures() []Tenure {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Tenure, 0, len(r.tenures))
	for _, t := range r.tenures {
		c := *t
		c.handled = slices.Clone(t.handled)
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Bucket != out[j].Bucket {
			return out[i].Bucket < out[j].Bucket
		}
		return out[i].Token < out[j].Token
	})
	return out
}
