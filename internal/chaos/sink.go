package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// Record kinds. Workers send write, acquire, releasing, release, draining
// and the SDK's lifecycle events (joined, fenced, session-lost, rejoined,
// left); the runner adds fault markers.
const (
	KindWrite       = "write"
	KindAcquire     = "acquire"
	KindReleasing   = "releasing"
	KindRelease     = "release"
	KindDraining    = "draining"
	KindJoined      = "joined"
	KindFenced      = "fenced"
	KindSessionLost = "session-lost"
	KindRejoined    = "rejoined"
	KindLeft        = "left"

	// FaultStop and FaultCont bracket a SIGSTOP of Worker; FaultKill
	// marks its SIGKILL. A grant of a worker that is stopped or dead may
	// be superseded before it is released: that is what fencing tokens
	// are for.
	FaultStop = "fault:stop"
	FaultCont = "fault:cont"
	FaultKill = "fault:kill"
	// FaultBegin marks the injection of a fault (Err is its kind, Worker
	// its target), FaultEnd its healing, and FaultSettled the moment
	// every bucket was served again after it. The unserved time of a
	// fault is measured from FaultBegin to FaultSettled (or to the next
	// FaultBegin).
	FaultBegin   = "fault:begin"
	FaultEnd     = "fault:end"
	FaultSettled = "fault:settled"
	// FaultProven marks that the fault took effect (Err says how).
	FaultProven = "fault:proven"
	// Note is a free-form marker (Err says what happened).
	Note = "note"
)

// Record is one thing the sink saw, in arrival order (Seq), stamped with
// the sink's own clock (At).
type Record struct {
	Seq     int       `json:"seq,omitempty"`
	At      time.Time `json:"at,omitzero"`
	Kind    string    `json:"kind"`
	Worker  string    `json:"worker"`
	Pid     int       `json:"pid,omitempty"`
	Session string    `json:"session,omitempty"`
	Bucket  int       `json:"bucket"`
	Token   uint64    `json:"token,string"`
	N       uint64    `json:"n,omitempty"`
	Fenced  bool      `json:"fenced,omitempty"`
	Err     string    `json:"err,omitempty"`
	// Mono is when the worker made the record, on the machine's
	// monotonic clock (CLOCK_MONOTONIC, in ns: MonoNow, Python's
	// time.monotonic_ns, Node.js's process.hrtime.bigint), so that two
	// workers' records compare without the sink's HTTP in between.
	Mono int64 `json:"mono,omitempty"`
	// Released lists grants whose Release handler returned since the
	// worker's previous record, each with when the client library took
	// over (its Mono): carried on whatever record the worker sends next,
	// so that timing a handoff from there costs no request of its own.
	Released []ReleasedAt `json:"released,omitempty"`
	// Refused: a write or an acquire claim the sink answered with 409
	// because it had seen a higher token for the bucket.
	Refused bool `json:"refused,omitempty"`
}

func (r Record) String() string {
	s := fmt.Sprintf("#%d %s %s", r.Seq, r.Worker, r.Kind)
	switch r.Kind {
	case KindWrite, KindAcquire, KindReleasing, KindRelease:
		s += fmt.Sprintf(" b%d@%d", r.Bucket, r.Token)
	}
	if r.Fenced {
		s += " fenced"
	}
	if r.Refused {
		s += " REFUSED"
	}
	if r.Err != "" {
		s += " (" + r.Err + ")"
	}
	return s
}

// ReleasedAt is when a worker's Release handler of a grant returned, on
// the machine's monotonic clock.
type ReleasedAt struct {
	Bucket int    `json:"bucket"`
	Token  uint64 `json:"token,string"`
	Mono   int64  `json:"mono"`
}

// BucketToken names one grant.
type BucketToken struct {
	Bucket int
	Token  uint64
}

// Grant is one grant as the sink has seen it.
type Grant struct {
	Worker    string
	Token     uint64
	Acquired  int // Seq of the acquire
	Released  int // Seq of the release, 0 while held
	Fenced    bool
	LastWrite int // Seq of its newest accepted write
}

// History is the sink's record and its index. The sink fences with it:
// per bucket it keeps the highest token seen (from a new owner's claim at
// acquire, or from a write) and refuses anything older. It is not safe
// for concurrent use; a Sink guards its own.
type History struct {
	Recs    []Record
	Highest map[int]uint64 // the fence of each bucket
	Grants  map[BucketToken]*Grant
	Cur     map[int]*Grant // highest-token grant per bucket
}

// NewHistory returns an empty History.
func NewHistory() *History {
	return &History{Highest: map[int]uint64{}, Grants: map[BucketToken]*Grant{}, Cur: map[int]*Grant{}}
}

// Add fences, records and indexes rec, numbering it and, unless it has
// one, stamping it with the current time; it returns rec as recorded.
func (h *History) Add(rec Record) Record {
	rec.Seq = len(h.Recs) + 1
	if rec.At.IsZero() {
		rec.At = time.Now()
	}
	switch rec.Kind {
	case KindWrite, KindAcquire:
		if rec.Token < h.Highest[rec.Bucket] {
			rec.Refused = true
		} else {
			h.Highest[rec.Bucket] = rec.Token
		}
	}
	key := BucketToken{rec.Bucket, rec.Token}
	switch g := h.Grants[key]; {
	case rec.Kind == KindAcquire && g == nil:
		g = &Grant{Worker: rec.Worker, Token: rec.Token, Acquired: rec.Seq}
		h.Grants[key] = g
		if c := h.Cur[rec.Bucket]; c == nil || c.Token < rec.Token {
			h.Cur[rec.Bucket] = g
		}
	case rec.Kind == KindRelease && g != nil && g.Worker == rec.Worker && g.Released == 0:
		g.Released, g.Fenced = rec.Seq, rec.Fenced
	case rec.Kind == KindWrite && !rec.Refused && g != nil && g.Worker == rec.Worker:
		g.LastWrite = rec.Seq
	}
	h.Recs = append(h.Recs, rec)
	return rec
}

// Held returns the grants worker holds now (acquired, not released), by
// bucket.
func (h *History) Held(worker string) map[int]uint64 {
	out := map[int]uint64{}
	for b, g := range h.Cur {
		if g.Worker == worker && g.Released == 0 {
			out[b] = g.Token
		}
	}
	return out
}

// Sink is the fenced sink: an HTTP server that workers report to. POST
// /write {bucket, token, worker, n} is accepted (204) if token is at least
// the highest token seen for the bucket, and refused (409) otherwise,
// exactly as `UPDATE ... WHERE fence <= $token` would be. POST /event
// records an event; an acquire is the new owner's claim and raises the
// bucket's fence like a write. Everything is recorded, in arrival order,
// with the sink's clock. Its methods are safe for concurrent use.
type Sink struct {
	srv  *http.Server
	ln   net.Listener
	done chan struct{} // closed when Serve has returned

	mu      sync.Mutex
	h       *History
	changed chan struct{} // closed and replaced on every record
}

// NewSink starts a sink listening on addr (such as "127.0.0.1:0"). Close
// stops it.
func NewSink(addr string) (*Sink, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("chaos: start the sink: %w", err)
	}
	s := &Sink{ln: ln, h: NewHistory(), changed: make(chan struct{}), done: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /write", s.serve)
	mux.HandleFunc("POST /event", s.serve)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { // exits when Close closes the server
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

// URL is where workers report.
func (s *Sink) URL() string { return "http://" + s.ln.Addr().String() }

// Close stops the sink and waits until its server has returned. It is
// idempotent.
func (s *Sink) Close() error {
	err := s.srv.Close()
	<-s.done
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

func (s *Sink) serve(w http.ResponseWriter, r *http.Request) {
	var rec Record
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&rec); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if (r.URL.Path == "/write") != (rec.Kind == KindWrite) || rec.Worker == "" {
		http.Error(w, "writes go to /write, events to /event, and both name their worker", http.StatusBadRequest)
		return
	}
	rec.Seq, rec.At, rec.Refused = 0, time.Time{}, false // the sink's to set
	if s.Add(rec).Refused {
		http.Error(w, "a newer owner exists", http.StatusConflict)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// Add fences, records and indexes rec, and returns it as recorded.
func (s *Sink) Add(rec Record) Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec = s.h.Add(rec)
	close(s.changed)
	s.changed = make(chan struct{})
	return rec
}

// Mark records a marker (a fault, or a note) and returns its Seq.
func (s *Sink) Mark(kind, worker, what string) int {
	return s.Add(Record{Kind: kind, Worker: worker, Err: what}).Seq
}

// Seq returns the Seq of the newest record.
func (s *Sink) Seq() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.h.Recs)
}

// View calls f with the history, the sink locked. f must be quick and
// must not keep h.
func (s *Sink) View(f func(h *History)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s.h)
}

// Await calls cond with the history (the sink locked), now and after
// every new record, until it returns "" (the condition holds) or ctx
// ends; then it returns an error with cond's last explanation. cond must
// be quick.
func (s *Sink) Await(ctx context.Context, what string, cond func(h *History) string) error {
	for {
		s.mu.Lock()
		why := cond(s.h)
		ch := s.changed
		s.mu.Unlock()
		if why == "" {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w; last: %s", what, ctx.Err(), why)
		}
	}
}

// Held returns the grants worker holds now, by bucket.
func (s *Sink) Held(worker string) map[int]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.h.Held(worker)
}

// Records returns a copy of every record so far.
func (s *Sink) Records() []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Record(nil), s.h.Recs...)
}
