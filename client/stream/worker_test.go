package stream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/client/clienttest"
	"github.com/keyshard/keyshard/clock/clocktest"
	"github.com/keyshard/keyshard/placement"
)

const ks = "events"

// streamFake is a fake server with a 4-bucket stream keyspace, and a
// Client of it on its clock.
func streamFake(t *testing.T) (*clienttest.Server, *client.Client) {
	t.Helper()
	f := clienttest.NewServer(t, clienttest.Options{})
	f.PutKeyspace(&keyshardv1.Keyspace{Name: ks, Buckets: 4, LeaseTtl: durationpb.New(9 * time.Second), Mode: keyshardv1.KeyspaceMode_KEYSPACE_MODE_STREAM})
	c, err := client.Dial(f.URL(), client.Clock(f.Clock()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return f, c
}

// handled records the positions handled per bucket.
type handled struct {
	h      placement.Hasher
	mu     sync.Mutex
	got    map[int][]uint64
	tokens map[int]uint64 // the token of each bucket's last record
}

func (r *handled) handle(_ context.Context, rec Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.h.Bucket(rec.Key)
	if rec.Bucket != b || rec.Token == 0 {
		return fmt.Errorf("record at %d of bucket %d carries bucket %d, token %d", rec.Position, b, rec.Bucket, rec.Token)
	}
	r.got[b] = append(r.got[b], rec.Position)
	if r.tokens == nil {
		r.tokens = map[int]uint64{}
	}
	r.tokens[b] = rec.Token
	return nil
}

func (r *handled) token(b int) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tokens[b]
}

func (r *handled) of(b int) []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got[b])
}

// want returns the positions of bucket b's records at or after from.
func want(log *memLog, h placement.Hasher, b int, from uint64) []uint64 {
	var ps []uint64
	for _, rec := range log.recs {
		if h.Bucket(rec.Key) == b && rec.Position >= from {
			ps = append(ps, rec.Position)
		}
	}
	return ps
}

// acquired records the buckets a client.Worker acquired (its OnEvent).
type acquired struct {
	mu   sync.Mutex
	got  map[int]bool
	kick chan struct{} // cap 1: got changed
}

func newAcquired() *acquired { return &acquired{got: map[int]bool{}, kick: make(chan struct{}, 1)} }

func (a *acquired) event(ev client.Event) {
	if ev.Kind != client.EventAcquired {
		return
	}
	a.mu.Lock()
	a.got[ev.Grant.Bucket] = true
	a.mu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// wait returns once every bucket of bs was acquired (Acquire returned).
func (a *acquired) wait(t *testing.T, bs ...int) {
	t.Helper()
	for {
		a.mu.Lock()
		all := true
		for _, b := range bs {
			all = all && a.got[b]
		}
		a.mu.Unlock()
		if all {
			return
		}
		select {
		case <-a.kick:
		case <-time.After(time.Minute): // a guard against a hang, never a pace
			t.Fatalf("buckets %v never acquired", bs)
		}
	}
}

// untilHead waits for the reader at the head of the stream until cond
// holds, poking it on (a gain made while it waited is read then).
func untilHead(t *testing.T, r *headReader, what string, cond func() bool) {
	t.Helper()
	for range 1000 {
		select {
		case <-r.atHead:
		case <-time.After(time.Minute): // a guard against a hang, never a pace
			t.Fatalf("waiting for %s: the reader never reached the head", what)
		}
		if cond() {
			return
		}
		r.poke <- struct{}{}
	}
	t.Fatalf("waiting for %s: never", what)
}

// TestWorkerStreams runs a stream Worker on the fake: the buckets of its
// first grants are read from their from, a bucket granted later with an
// older from catches up and merges, the commit loop commits Progress, a
// handoff's Release carries the final position, and Close commits once
// more and hands every bucket over at its final position.
func TestWorkerStreams(t *testing.T) {
	f, c := streamFake(t)
	log := genLog(rand.New(rand.NewPCG(3, 4)), 300, 20, 0)
	h := mustHasher(t, 4)
	mid, early := log.recs[150].Position, log.recs[40].Position
	f.SetBucketPosition(ks, 0, mid)
	f.SetBucketPosition(ks, 1, mid+5)
	r := &headReader{log: log, atHead: make(chan struct{}), poke: make(chan struct{})}
	rec := &handled{h: h, got: map[int][]uint64{}}
	acq := newAcquired()
	sw, err := NewWorker(c, ks, client.Member{ID: "w1"}, r, rec.handle, WorkerOptions{Worker: []client.WorkerOption{client.OnEvent(acq.event)}})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- sw.Run(t.Context()) }() // exits on Close
	f.WaitSession(t, ks, "w1")
	f.Assign(ks, func(b int) string { return map[bool]string{true: "w1"}[b < 2] })
	sid := f.Session(ks, "w1")
	// Pokes make the reader read what was gained while it waited at the
	// head, so they are counted only once the buckets are gained.
	acq.wait(t, 0, 1)
	untilHead(t, r, "buckets 0 and 1", func() bool {
		return slices.Equal(rec.of(0), want(log, h, 0, mid)) && slices.Equal(rec.of(1), want(log, h, 1, mid+5))
	})
	if sw.cons.flow.Position() != log.end {
		t.Errorf("main lane at %d, want the head %d", sw.cons.flow.Position(), log.end)
	}

	// Bucket 2 comes with an older from: it catches up, then merges.
	tok2 := f.GrantFrom(sid, 2, early)
	acq.wait(t, 2)
	r.poke <- struct{}{} // the reader waits at the head
	untilHead(t, r, "bucket 2's catch-up", func() bool { return slices.Equal(rec.of(2), want(log, h, 2, early)) })
	if got := rec.token(2); got != tok2 {
		t.Errorf("bucket 2's records carry token %d, want its grant's %d", got, tok2)
	}
	if got := rec.of(3); len(got) != 0 {
		t.Errorf("bucket 3, not held, handled at %v", got)
	}
	if got := rec.of(0); !slices.Equal(got, want(log, h, 0, mid)) {
		t.Errorf("bucket 0 handled %v after the catch-up, want %v (once each)", got, want(log, h, 0, mid))
	}

	// The commit loop: one CommitInterval later, Progress is committed.
	f.Clock().Advance(DefaultCommitInterval)
	cr := f.Commits().Next(t)
	if cr.GetPosition() != log.end || cr.GetMaxToken() != tok2 || len(cr.GetExceptions()) != 0 {
		t.Errorf("commit = %v, want position %d, max_token %d, no exception", cr, log.end, tok2)
	}
	f.WaitFor(t, "the commit applied", func() bool { return f.LastCommit(sid) != nil })
	for b, p := range f.Positions(sid) {
		if p != log.end {
			t.Errorf("bucket %d committed at %d, want %d", b, p, log.end)
		}
	}

	// A handoff: the Release carries the position after the last record
	// handled for the bucket.
	f.AskRelease(sid, 0)
	rel := f.Releases().Next(t)
	if ps := rel.GetPositions(); len(ps) != 1 || ps[0].GetBucket() != 0 || ps[0].GetPosition() != log.end {
		t.Errorf("Release positions = %v, want bucket 0 at %d", ps, log.end)
	}
	f.WaitFor(t, "bucket 0 handed over", func() bool { return f.BucketPosition(ks, 0) == log.end })

	// Close: one more commit, then every bucket is handed over.
	if err := sw.Close(t.Context()); err != nil {
		t.Errorf("Close = %v", err)
	}
	if err := <-errc; err != nil {
		t.Errorf("Run = %v", err)
	}
	for b := range 3 {
		if got := f.BucketPosition(ks, b); got != log.end {
			t.Errorf("bucket %d's position after Close = %d, want %d", b, got, log.end)
		}
	}
	if got := f.BucketPosition(ks, 3); got != 0 {
		t.Errorf("bucket 3, never held, at %d", got)
	}
	if f.Commits().Len() == 0 {
		t.Error("Close committed nothing")
	}
}

// grantsSource plays the client.Worker's Granted for unit tests.
type grantsSource struct {
	mu      sync.Mutex
	session string
	grants  []client.Grant
}

func (g *grantsSource) granted() (string, []client.Grant) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.session, slices.Clone(g.grants)
}

func (g *grantsSource) set(session string, gs ...client.Grant) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.session, g.grants = session, gs
}

// unitWorker is a stream Worker without a client.Worker: its grants come
// from src, and nothing reads the stream (the test feeds the Flow).
func unitWorker(t *testing.T, src *grantsSource, start uint64) *Worker {
	h := mustHasher(t, 8)
	return &Worker{
		r: &headReader{}, handle: func(context.Context, Record) error { return nil },
		opts:     WorkerOptions{StartPosition: &start},
		clk:      clocktest.NewFake(time.Unix(0, 0)),
		log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		granted:  src.granted,
		hasherOf: func() placement.Hasher { return h },
		ready:    make(chan struct{}),
		gained:   map[int]uint64{},
		tokens:   map[int]uint64{},
		lost:     map[int]client.BucketPosition{},
		wakeKick: make(chan struct{}, 1),
	}
}

// covered returns the position c gives each grant, as the server
// computes it.
func covered(c client.Commit, gs []client.Grant) map[int]uint64 {
	out := map[int]uint64{}
	for _, g := range gs {
		p := g.From
		if i := slices.IndexFunc(c.Exceptions, func(e client.BucketPosition) bool { return e.Bucket == g.Bucket }); i >= 0 && c.Exceptions[i].Token == g.Token {
			p = max(p, c.Exceptions[i].Position)
		} else if g.Token <= c.MaxToken {
			p = max(p, c.Position)
		}
		out[g.Bucket] = p
	}
	return out
}

// TestWorkerCommitMaxToken: a commit never covers a held bucket at a
// position past what was handled for it: not a bucket granted but not
// gained yet (its Acquire has not run: a slow Acquire, or a grant that
// arrived after the last Progress), whatever its token, nor one lost
// before the client.Worker has its final position; and MaxToken never
// goes back within a session.
func TestWorkerCommitMaxToken(t *testing.T) {
	src := &grantsSource{}
	sw := unitWorker(t, src, 100)
	hd := handler{sw}
	ctx := t.Context()
	commit := func() client.Commit {
		t.Helper()
		sw.mu.Lock()
		defer sw.mu.Unlock()
		c, ok := sw.commitLocked()
		if !ok {
			t.Fatal("no session")
		}
		return c
	}
	// safe checks that every grant is covered at or below bound[bucket],
	// the position of its first record not handled.
	safe := func(c client.Commit, bound map[int]uint64) {
		t.Helper()
		_, gs := src.granted()
		for b, p := range covered(c, gs) {
			if p > bound[b] {
				t.Errorf("commit %+v covers bucket %d at %d, past %d, its first record not handled", c, b, p, bound[b])
			}
		}
	}

	g0 := client.Grant{Bucket: 0, Token: 5, From: 100}
	src.set("s1", g0)
	if err := hd.Acquire(ctx, g0); err != nil {
		t.Fatal(err)
	}
	// The main lane handles up to 200.
	feed := func(to uint64) {
		t.Helper()
		sw.cons.mu.Lock()
		defer sw.cons.mu.Unlock()
		if err := sw.cons.flow.Main(sw.cons.flow.Position(), nil, to, func(Record) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	feed(200)
	c := commit()
	if c.MaxToken != 5 || c.Position != 200 || len(c.Exceptions) != 0 {
		t.Errorf("commit = %+v, want max token 5 at 200, no exception", c)
	}

	// Grants at tokens 6 (bucket 2) and 7 (bucket 1) arrive; the Acquire
	// of bucket 1 runs first, that of bucket 2 has not run yet.
	g1 := client.Grant{Bucket: 1, Token: 7, From: 10}
	g2 := client.Grant{Bucket: 2, Token: 6, From: 30}
	src.set("s1", g0, g1, g2)
	if err := hd.Acquire(ctx, g1); err != nil {
		t.Fatal(err)
	}
	c = commit()
	safe(c, map[int]uint64{0: 200, 1: 10, 2: 30})
	if c.MaxToken != 7 {
		t.Errorf("MaxToken = %d, want 7", c.MaxToken)
	}
	wantExc := []client.BucketPosition{{Bucket: 1, Token: 7, Position: 10}, {Bucket: 2, Token: 6, Position: 30}}
	if !slices.Equal(c.Exceptions, wantExc) {
		t.Errorf("exceptions = %v, want %v", c.Exceptions, wantExc)
	}

	// A grant the Worker knows of, at a token above every gained one,
	// whose Acquire has not run: listed at its from too.
	g3 := client.Grant{Bucket: 3, Token: 9, From: 150}
	src.set("s1", g0, g1, g2, g3)
	c = commit()
	safe(c, map[int]uint64{0: 200, 1: 10, 2: 30, 3: 150})

	// Bucket 2's Acquire: it is behind the main lane, so it catches up.
	if err := hd.Acquire(ctx, g2); err != nil {
		t.Fatal(err)
	}
	if err := hd.Acquire(ctx, g3); err != nil {
		t.Fatal(err)
	}
	c = commit()
	safe(c, map[int]uint64{0: 200, 1: 10, 2: 30, 3: 150})

	// Bucket 0 is lost at 200; the main lane goes on to 300 while the
	// client.Worker still lists the grant (its FinalPosition not taken).
	if err := hd.Release(ctx, 0); err != nil {
		t.Fatal(err)
	}
	feed(300)
	c = commit()
	safe(c, map[int]uint64{0: 200, 1: 10, 2: 30, 3: 150})
	if p, ok := hd.FinalPosition(0); !ok || p != 200 {
		t.Errorf("FinalPosition(0) = %d, %v; want 200", p, ok)
	}
	// Once the grant has left Granted, the client.Worker lists it.
	src.set("s1", g1, g2, g3)
	c = commit()
	if c.MaxToken != 9 {
		t.Errorf("MaxToken = %d after bucket 0 left, want 9 (never back)", c.MaxToken)
	}
	if _, ok := sw.lost[0]; ok {
		t.Error("bucket 0's final position is still kept after its grant left")
	}
	// Fewer grants: MaxToken stays.
	src.set("s1", g1)
	if c = commit(); c.MaxToken != 9 {
		t.Errorf("MaxToken = %d, want 9", c.MaxToken)
	}
	// A new session starts over.
	g1b := client.Grant{Bucket: 1, Token: 12, From: 40}
	src.set("s2", g1b)
	c = commit()
	if c.MaxToken != 12 || c.Session != "s2" {
		t.Errorf("commit = %+v, want session s2 at max token 12", c)
	}
	safe(c, map[int]uint64{1: 40})
}

// TestWorkerWakes: after gaining a bucket the worker wakes the
// candidates of that bucket only.
func TestWorkerWakes(t *testing.T) {
	f, c := streamFake(t)
	h := mustHasher(t, 4)
	keys := make([][]byte, 4) // keys[b] is of bucket b
	for i, n := 0, 0; n < 4; i++ {
		k := fmt.Appendf(nil, "dest-%d", i)
		if b := h.Bucket(k); keys[b] == nil {
			keys[b], n = k, n+1
		}
	}
	next := func(_ context.Context, after uint64, limit int) ([]Candidate, error) {
		var page []Candidate
		for i := after; i < uint64(len(keys)) && len(page) < limit; i++ {
			page = append(page, Candidate{Key: keys[i], Cursor: i + 1})
		}
		return page, nil
	}
	woken := make(chan string, 8)
	log := &memLog{end: 1}
	r := &headReader{log: log, atHead: make(chan struct{}, 1000), poke: make(chan struct{})}
	sw, err := NewWorker(c, ks, client.Member{ID: "w1"}, r, func(context.Context, Record) error { return nil }, WorkerOptions{
		Wake: &WakeOptions{Next: next, Wake: func(_ context.Context, k []byte) error { woken <- string(k); return nil }, Rate: 10},
	})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- sw.Run(t.Context()) }() // exits on Close
	sid := f.WaitSession(t, ks, "w1")
	f.Grant(sid, 2)
	select {
	case k := <-woken:
		if k != string(keys[2]) {
			t.Errorf("woke %q, want %q (bucket 2's)", k, keys[2])
		}
	case <-time.After(time.Minute): // a guard against a hang, never a pace
		t.Fatal("nothing woken")
	}
	if err := sw.Close(t.Context()); err != nil {
		t.Errorf("Close = %v", err)
	}
	if err := <-errc; err != nil {
		t.Errorf("Run = %v", err)
	}
	if len(woken) != 0 {
		t.Errorf("woke %q as well", <-woken)
	}
}

func TestNewWorkerArgs(t *testing.T) {
	_, c := streamFake(t)
	r := &headReader{}
	hd := func(context.Context, Record) error { return nil }
	var ae *client.ArgError
	for _, tc := range []struct {
		arg  string
		opts WorkerOptions
		r    Reader
	}{
		{"r", WorkerOptions{}, nil},
		{"WorkerOptions.CommitInterval", WorkerOptions{CommitInterval: -time.Second}, r},
		{"WorkerOptions.Wake.Rate", WorkerOptions{Wake: &WakeOptions{Next: (&candidates{}).next, Wake: func(context.Context, []byte) error { return nil }}}, r},
	} {
		if _, err := NewWorker(c, ks, client.Member{ID: "w1"}, tc.r, hd, tc.opts); !errors.As(err, &ae) || ae.Arg != tc.arg {
			t.Errorf("NewWorker = %v, want an *ArgError naming %s", err, tc.arg)
		}
	}
}
