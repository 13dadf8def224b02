package e2e_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/client/stream"
	"github.com/keyshard/keyshard/internal/streamcheck"
	"github.com/keyshard/keyshard/keyshardtest"
	"github.com/keyshard/keyshard/placement"
)

var (
	streamSeed  = flag.Uint64("stream.seed", 0, "TestStreamRandom: run this seed only (a failure prints its seed)")
	streamSeeds = flag.Int("stream.seeds", 0, "TestStreamRandom: how many random seeds to run (default 5; 1 with -short)")
)

const (
	srKeyspace       = "events"
	srBuckets        = 64
	srLeaseTTL       = 2 * time.Second // the least a keyspace may have
	srKeys           = 300
	srCommitInterval = 200 * time.Millisecond
	srMaxWorkers     = 5
	// srBound bounds every wait on a condition: a deadline for failing,
	// never a pace.
	srBound = 30 * time.Second
)

// TestStreamRandom runs stream workers against two `keyshard serve`
// replicas on a real (embedded) etcd, under a random schedule per seed,
// and checks the record of what they did with streamcheck: the
// properties `keyshard demo --mode stream` prints (every event handled by
// a holder of its bucket, each key in order within a tenure, no duplicate
// after a graceful move, duplicates after a crash only after its last
// commit, positions moving with their buckets, never back).
//
// A producer appends keyed events to an in-memory stream throughout. Each
// schedule has 6 to 10 steps: workers join, leave gracefully, are killed;
// once, the leading replica stops (and restarts at the next step); once, a
// worker is paused — every HTTP call of its client and its handler block —
// until its session has expired at the server, then resumed: it must lose
// its session, re-join, and a commit for its old session must be refused.
// Between steps the test waits until every bucket is granted to the
// workers that should hold them. Throughout, the committed positions
// (GetPositions) must never go backwards nor past the end of the stream.
//
// Seeds are random; a failure prints its seed: replay it with
// -stream.seed=N (timing differs between runs, the schedule does not).
func TestStreamRandom(t *testing.T) {
	var seeds []uint64
	switch {
	case *streamSeed != 0:
		seeds = []uint64{*streamSeed}
	default:
		n := 5
		if testing.Short() {
			n = 1
		}
		if *streamSeeds > 0 {
			n = *streamSeeds
		}
		for range n {
			seeds = append(seeds, rand.Uint64()|1)
		}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			start := time.Now()
			defer func() {
				if t.Failed() {
					t.Logf("replay: go test -race -count=1 -run 'TestStreamRandom' ./internal/e2e/ -stream.seed=%d", seed)
				}
				t.Logf("seed %d ran for %v", seed, time.Since(start).Round(time.Millisecond))
			}()
			runStreamSeed(t, seed)
		})
	}
}

// srOp is a step of a schedule.
type srOp int

const (
	srJoin srOp = iota
	srLeave
	srKill
	srFailover
	srPause
)

func (o srOp) String() string {
	return [...]string{"join", "leave", "kill", "failover", "pause"}[o]
}

// srSchedule is a seed's run: how many workers start, then the steps.
type srSchedule struct {
	initial int
	ops     []srOp
}

// newSchedule draws a schedule: 2 or 3 workers to start with, then 6 to
// 10 steps among which exactly one failover and one pause; the others are
// joins, graceful leaves and kills, keeping 2 to srMaxWorkers workers.
func newSchedule(rng *rand.Rand) srSchedule {
	s := srSchedule{initial: 2 + rng.IntN(2)}
	n := 6 + rng.IntN(5)
	failover := rng.IntN(n)
	pause := (failover + 1 + rng.IntN(n-1)) % n
	live := s.initial
	for i := range n {
		switch i {
		case failover:
			s.ops = append(s.ops, srFailover)
			continue
		case pause:
			s.ops = append(s.ops, srPause)
			continue
		}
		var can []srOp
		if live < srMaxWorkers {
			can = append(can, srJoin)
		}
		if live > 2 {
			can = append(can, srLeave, srKill)
		}
		op := can[rng.IntN(len(can))]
		switch op {
		case srJoin:
			live++
		default:
			live--
		}
		s.ops = append(s.ops, op)
	}
	return s
}

// memLog is an in-memory, append-only stream: the record at position i is
// the i-th appended. Read waits briefly at the head for an append.
type memLog struct {
	hasher placement.Hasher

	mu     sync.Mutex
	recs   []stream.Record
	events []streamcheck.Event
	grew   chan struct{} // closed (and replaced) by every append
}

// headWait is how long Read waits at the head of the stream before it
// returns no record, so that a bucket gained meanwhile starts catching up.
const headWait = 50 * time.Millisecond

// readBatch bounds the records one Read returns.
const readBatch = 256

func newMemLog(h placement.Hasher) *memLog {
	return &memLog{hasher: h, grew: make(chan struct{})}
}

func (l *memLog) append(keys ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		pos := uint64(len(l.recs))
		l.recs = append(l.recs, stream.Record{Key: []byte(k), Position: pos})
		l.events = append(l.events, streamcheck.Event{Pos: pos, Key: k, Bucket: l.hasher.Bucket([]byte(k))})
	}
	close(l.grew)
	l.grew = make(chan struct{})
}

// end returns the position after the last record.
func (l *memLog) end() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return uint64(len(l.recs))
}

func (l *memLog) snapshot() []streamcheck.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

// Read returns copies of the records from position from on: the Flow sets
// fields of the records it delivers, and every worker reads the same log.
func (l *memLog) Read(ctx context.Context, from uint64) ([]stream.Record, uint64, error) {
	l.mu.Lock()
	if from >= uint64(len(l.recs)) {
		grew := l.grew
		l.mu.Unlock()
		t := time.NewTimer(headWait)
		defer t.Stop()
		select {
		case <-grew:
		case <-t.C:
			return nil, from, nil
		case <-ctx.Done():
			return nil, from, ctx.Err()
		}
		l.mu.Lock()
	}
	defer l.mu.Unlock()
	if from >= uint64(len(l.recs)) {
		return nil, from, nil
	}
	out := slices.Clone(l.recs[from:min(uint64(len(l.recs)), from+readBatch)])
	return out, from + uint64(len(out)), nil
}

// pauseGate pauses a worker: while paused, its client's HTTP calls (and
// reads of their answers) and its handler block.
type pauseGate struct {
	mu      sync.Mutex
	resumed chan struct{} // nil while running; closed by resume
}

func (g *pauseGate) pause() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.resumed == nil {
		g.resumed = make(chan struct{})
	}
}

func (g *pauseGate) resume() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.resumed != nil {
		close(g.resumed)
		g.resumed = nil
	}
}

// wait returns once the gate is not paused, or ctx's error.
func (g *pauseGate) wait(ctx context.Context) error {
	g.mu.Lock()
	ch := g.resumed
	g.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// gatedTransport is a worker's http.RoundTripper: calls wait at the gate,
// and so do reads of their answers (a grants stream freezes too). It
// also passes every Release call the server accepted to released: a
// release with a final position is a graceful handover only once the
// server has it (the worker's EventReleased comes before the call, which
// a kill or a lost session may stop).
type gatedTransport struct {
	gate     *pauseGate
	base     http.RoundTripper
	released func(*keyshardv1.ReleaseRequest)
}

// releasePath ends the URL path of MemberService.Release.
const releasePath = "/" + keyshardv1connect.MemberServiceName + "/Release"

func (t gatedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := t.gate.wait(req.Context()); err != nil {
		return nil, err
	}
	var rel *keyshardv1.ReleaseRequest
	if strings.HasSuffix(req.URL.Path, releasePath) && req.Body != nil {
		body, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		rel = &keyshardv1.ReleaseRequest{}
		if err := proto.Unmarshal(body, rel); err != nil {
			return nil, fmt.Errorf("decode a Release call (%s): %w", req.Header.Get("Content-Type"), err)
		}
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		req.ContentLength = int64(len(body))
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if rel != nil && resp.StatusCode == http.StatusOK {
		t.released(rel)
	}
	resp.Body = gatedBody{ReadCloser: resp.Body, gate: t.gate, ctx: req.Context()}
	return resp, nil
}

type gatedBody struct {
	io.ReadCloser
	gate *pauseGate
	ctx  context.Context
}

func (b gatedBody) Read(p []byte) (int, error) {
	if err := b.gate.wait(b.ctx); err != nil {
		return 0, err
	}
	return b.ReadCloser.Read(p)
}

// srWorker is one stream worker of a run.
type srWorker struct {
	name    string
	sw      *stream.Worker
	cl      *client.Client
	tr      *http.Transport
	gate    *pauseGate
	kill    context.CancelFunc
	crashed atomic.Bool // set before kill
	done    chan struct{}

	mu       sync.Mutex
	session  string          // the current session, once joined
	lost     map[string]bool // sessions lost
	lostKick chan struct{}   // closed (and replaced) at every session lost
	// pending are the final positions of the buckets released
	// (EventReleased) whose handover is not known to be done, by bucket.
	pending map[int]client.BucketPosition
	// stale counts commits of a lost session answered, by outcome.
	staleRefused, staleAcked int
}

// srRun is one seed's world.
type srRun struct {
	t      *testing.T
	ctx    context.Context
	rng    *rand.Rand
	rs     []*keyshardtest.Server
	urls   string
	admin  *client.Admin
	log    *memLog
	rec    *streamcheck.Recorder
	logger *slog.Logger
	start  time.Time

	workersCtx context.Context
	wg         sync.WaitGroup // every worker's Run

	mu      sync.Mutex
	workers map[string]*srWorker
	live    []string // the workers that should hold buckets, oldest first
	next    int
	runErrs []error

	stopped int // the replica a failover stopped, or -1

	traceMu sync.Mutex
	trace   []traceLine

	// handedAnswered and handedOther count graceful handovers known from
	// a Release call's answer, and from a leave or a release without its
	// final position.
	handedAnswered, handedOther atomic.Int64

	// Figures of the run, for the log and the assertions.
	kills, leaves, joins, pauses, failovers int
}

func (h *srRun) logf(format string, args ...any) {
	h.t.Helper()
	h.t.Logf("[%5.2fs] %s", time.Since(h.start).Seconds(), fmt.Sprintf(format, args...))
}

func runStreamSeed(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed5eed))
	sched := newSchedule(rng)
	t.Logf("seed %d: %d workers, then %v", seed, sched.initial, sched.ops)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("KEYSHARD_TEST_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	rs := keyshardtest.NewReplicas(t, 2, keyshardtest.Options{
		Keyspaces: []client.KeyspaceConfig{{Name: srKeyspace, Buckets: srBuckets, Mode: "stream", LeaseTTL: srLeaseTTL, DrainTimeout: 10 * time.Second}},
	})
	urls := rs[0].URL() + "," + rs[1].URL()
	adminCl, err := client.Dial(urls, client.Logger(logger))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { adminCl.Close() })
	hasher, err := placement.NewHasher(placement.HashXXH64, srBuckets)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("replicas ready at %s", urls)
	workersCtx, stopWorkers := context.WithCancel(ctx)
	h := &srRun{
		t: t, ctx: ctx, rng: rng, rs: rs, urls: urls, admin: adminCl.Admin(),
		log: newMemLog(hasher), rec: streamcheck.NewRecorder(), logger: logger, start: time.Now(),
		workersCtx: workersCtx, workers: map[string]*srWorker{}, stopped: -1,
	}
	t.Cleanup(func() { // after a failure: stop every worker at once
		h.mu.Lock()
		ws := slices.Collect(maps.Values(h.workers))
		h.mu.Unlock()
		for _, w := range ws {
			w.gate.resume()
		}
		stopWorkers()
		h.wg.Wait()
		for _, w := range ws {
			w.cl.Close()
			w.tr.CloseIdleConnections()
		}
	})

	// The producer: about 1,000 keyed events a second, over srKeys keys.
	prodCtx, stopProducing := context.WithCancel(ctx)
	produced := make(chan struct{})
	go func() { // exits when stopProducing is called
		defer close(produced)
		prng := rand.New(rand.NewPCG(seed, 1))
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-prodCtx.Done():
				return
			case <-tick.C:
			}
			keys := make([]string, 5)
			for i := range keys {
				keys[i] = fmt.Sprintf("room-%d", prng.IntN(srKeys))
			}
			h.log.append(keys...)
		}
	}()
	defer func() { stopProducing(); <-produced }()

	// The monitor: committed positions never go backwards, nor past the
	// end of the stream.
	mon := newPositionMonitor(h)
	monCtx, stopMonitor := context.WithCancel(ctx)
	monitored := make(chan struct{})
	go func() { defer close(monitored); mon.run(monCtx) }() // exits when stopMonitor is called
	defer func() { stopMonitor(); <-monitored }()

	for range sched.initial {
		h.startWorker()
	}
	h.waitSettled("start")
	h.logf("%d workers hold every bucket", sched.initial)
	h.flow()

	for i, op := range sched.ops {
		if h.stopped >= 0 {
			r := h.rs[h.stopped]
			h.stopped = -1
			if err := r.Restart(); err != nil {
				t.Fatal(err)
			}
			h.logf("the stopped replica restarted")
		}
		h.logf("step %d: %v", i+1, op)
		switch op {
		case srJoin:
			h.joins++
			w := h.startWorker()
			h.waitSettled(w.name + " joins")
		case srLeave:
			h.leaves++
			h.leave()
		case srKill:
			h.kills++
			h.killOne()
		case srFailover:
			h.failovers++
			h.failover()
		case srPause:
			h.pauses++
			h.pauseOne()
		}
		h.flow()
	}
	if h.stopped >= 0 {
		if err := h.rs[h.stopped].Restart(); err != nil {
			t.Fatal(err)
		}
		h.stopped = -1
	}

	// The end: the producer stops, every bucket's committed position
	// reaches the end, the workers leave gracefully.
	stopProducing()
	<-produced
	end := h.log.end()
	h.logf("producer stopped at %d; waiting for every bucket to commit it", end)
	h.waitPositions(end)
	h.mu.Lock()
	live := slices.Clone(h.live)
	h.mu.Unlock()
	h.logf("every bucket committed at %d or later", end)
	// Every worker leaves at once: the buckets of each have nowhere to go
	// but unassigned, each handed over at its final position.
	var closing sync.WaitGroup
	for _, name := range live {
		closing.Go(func() { h.closeWorker(name) })
	}
	closing.Wait()
	stopWorkers()
	h.wg.Wait()
	h.logf("every worker left")
	h.mu.Lock()
	runErrs := slices.Clone(h.runErrs)
	h.mu.Unlock()
	for _, err := range runErrs {
		t.Error(err)
	}
	if p, err := h.admin.Positions(ctx, srKeyspace, 1); err != nil || p.Min < end {
		t.Errorf("after every worker left: positions %+v, %v; want every bucket at %d or later", p, err, end)
	}
	stopMonitor()
	<-monitored
	mon.check(t)

	rep := streamcheck.Check(h.log.snapshot(), h.rec, end)
	t.Logf("checked: %d events, %d handlings over %d tenures (%d released, %d crashed); missed %d, order violations %d, strays %d, "+
		"duplicates graceful %d, crash %d (bound %d, over it %d), position regressions %d; positions sampled %d times",
		rep.Events, rep.Handled, rep.Tenures, rep.Releases, rep.Crashes, rep.Missed, rep.OrderViolations, rep.Strays,
		rep.DuplicatesGraceful, rep.DuplicatesCrash, rep.DuplicatesCrashBound, rep.DuplicatesOverBound, rep.PositionRegressions, mon.samples)
	t.Logf("graceful handovers: %d known from a Release answer, %d from a leave; %d kills, %d pauses, %d leaves, %d joins, %d failovers",
		h.handedAnswered.Load(), h.handedOther.Load(), h.kills, h.pauses, h.leaves, h.joins, h.failovers)
	if !rep.OK() {
		t.Errorf("the record breaks stream mode's guarantees:\n  %s", strings.Join(rep.Violations, "\n  "))
		h.dumpTrace(rep.Violations)
	}
	if rep.Events < 2000 || rep.Handled < rep.Events || rep.Releases == 0 || rep.Tenures <= srBuckets {
		t.Errorf("the run did too little: %+v", rep)
	}
	if h.pauses > 0 || h.kills > 0 {
		if rep.Crashes == 0 {
			t.Errorf("%d kills and %d pauses, but no tenure ended in a crash", h.kills, h.pauses)
		}
	}
	if mon.samples < 10 {
		t.Errorf("positions sampled %d times only", mon.samples)
	}
}

// flow lets events flow for a while: a pace of the schedule, not a
// synchronisation.
func (h *srRun) flow() {
	d := 300*time.Millisecond + time.Duration(h.rng.IntN(400))*time.Millisecond
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-h.ctx.Done():
		h.t.Fatal(h.ctx.Err())
	}
}

// startWorker starts one more stream worker, wired to the recorder as
// the stream demo's are.
func (h *srRun) startWorker() *srWorker {
	h.t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.next++
	name := fmt.Sprintf("w%d", h.next)
	w := &srWorker{name: name, gate: &pauseGate{}, done: make(chan struct{}), lost: map[string]bool{}, lostKick: make(chan struct{}), pending: map[int]client.BucketPosition{}}
	w.tr = http.DefaultTransport.(*http.Transport).Clone()
	// A release with a final position is a graceful handover once the
	// server has it: when a Release call carrying it is answered, or when
	// the session ends by a graceful leave (the server ends a leaving
	// session once it holds nothing, so it had every release). An answer
	// may be lost (the call is then sent again, and refused since the
	// bucket is no longer held): the leave confirms it. If the session is
	// lost or the worker killed first, the tenure counts as crashed —
	// the weaker claim, true either way.
	handed := func(b int, token uint64, how string) {
		f, ok := w.pending[b]
		if !ok || f.Token != token {
			return // handed already (a commit's probe sends it again)
		}
		delete(w.pending, b)
		if how == "release answered" {
			h.handedAnswered.Add(1)
		} else {
			h.handedOther.Add(1)
		}
		h.tracef(b, "%s handed bucket %d token %d over at %d (%s)", name, b, token, f.Position, how)
		h.rec.Release(name, b, token, f.Position)
	}
	released := func(r *keyshardv1.ReleaseRequest) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.crashed.Load() || w.lost[r.GetSession()] {
			return // its tenures are crashed
		}
		for _, p := range r.GetPositions() {
			if f, ok := w.pending[int(p.GetBucket())]; ok && f.Token == p.GetToken() && f.Position != p.GetPosition() {
				h.tracef(int(p.GetBucket()), "%s released bucket %d token %d at %d, but its final was %d", name, p.GetBucket(), p.GetToken(), p.GetPosition(), f.Position)
			}
			handed(int(p.GetBucket()), p.GetToken(), "release answered")
		}
		for _, g := range r.GetBuckets() {
			// Released without its final position (the server refused
			// it): the checker sees whether the next holder starts there.
			handed(int(g.GetBucket()), g.GetToken(), "released without its final position")
		}
	}
	cl, err := client.Dial(h.urls, client.HTTPClient(&http.Client{Transport: gatedTransport{gate: w.gate, base: w.tr, released: released}}), client.Logger(h.logger))
	if err != nil {
		h.t.Fatal(err)
	}
	w.cl = cl
	handle := func(ctx context.Context, r stream.Record) error {
		if err := w.gate.wait(ctx); err != nil {
			return err
		}
		h.rec.Handle(name, r.Bucket, r.Token, r.Position, string(r.Key))
		return nil
	}
	onEvent := func(ev client.Event) {
		h.traceEvent(name, ev)
		switch ev.Kind {
		case client.EventJoined, client.EventRejoined:
			w.mu.Lock()
			w.session = ev.Session
			w.mu.Unlock()
		case client.EventAcquired:
			h.rec.Acquire(name, ev.Grant.Bucket, ev.Grant.Token, ev.Grant.From)
		case client.EventReleased:
			// The handler let the bucket go: from now on only a commit's
			// exception moves this tenure's position, as the server pins
			// a released bucket against a later commit's default. (Its
			// release may be answered unseen — the bucket comes back at a
			// higher token — and the tenure then stays open: a later
			// commit's default must not count for it.)
			h.rec.Stop(name, ev.Grant.Bucket, ev.Grant.Token)
			w.mu.Lock()
			if ev.Final != nil && !w.crashed.Load() && !w.lost[ev.Session] {
				w.pending[ev.Grant.Bucket] = client.BucketPosition{Bucket: ev.Grant.Bucket, Token: ev.Grant.Token, Position: *ev.Final}
			}
			w.mu.Unlock()
		case client.EventLeft:
			w.mu.Lock()
			for b, f := range w.pending {
				handed(b, f.Token, "the session left")
			}
			w.mu.Unlock()
		case client.EventFenced:
			h.logf("%s fenced session %s: %v", name, ev.Session, ev.Err)
		case client.EventSessionLost:
			w.mu.Lock() // no release of the session is recorded after its crash
			h.rec.Crash(name)
			clear(w.pending)
			w.lost[ev.Session] = true
			close(w.lostKick)
			w.lostKick = make(chan struct{})
			w.mu.Unlock()
		}
	}
	onCommit := func(c client.Commit, err error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.lost[c.Session] {
			if err != nil {
				w.staleRefused++
			} else {
				w.staleAcked++
			}
			return // its tenures are crashed
		}
		if err != nil {
			h.tracef(-1, "%s commit of session %s (max token %d, position %d, %d exceptions) failed: %v", name, c.Session, c.MaxToken, c.Position, len(c.Exceptions), err)
			return
		}
		// What was sent: c, and the final positions of the buckets the
		// client.Worker released and the server may still hold, which
		// it adds as exceptions (see client.Worker.Commit).
		except := make([]streamcheck.BucketPosition, 0, len(c.Exceptions)+len(w.pending))
		listed := map[int]bool{}
		for _, e := range c.Exceptions {
			except = append(except, streamcheck.BucketPosition{Bucket: e.Bucket, Token: e.Token, Position: e.Position})
			listed[e.Bucket] = true
		}
		for _, f := range w.pending {
			if !listed[f.Bucket] {
				except = append(except, streamcheck.BucketPosition{Bucket: f.Bucket, Token: f.Token, Position: f.Position})
			}
		}
		h.rec.Commit(name, c.MaxToken, c.Position, except)
	}
	w.sw, err = stream.NewWorker(cl, srKeyspace, client.Member{ID: name, Address: "in-process/" + name}, h.log, handle, stream.WorkerOptions{
		CommitInterval: srCommitInterval,
		OnCommit:       onCommit,
		Worker:         []client.WorkerOption{client.OnEvent(onEvent)},
	})
	if err != nil {
		h.t.Fatal(err)
	}
	runCtx, kill := context.WithCancel(h.workersCtx)
	w.kill = kill
	h.workers[name] = w
	h.live = append(h.live, name)
	h.wg.Add(1)
	go func() { // exits when the worker stops: Close, kill, or the run's end
		defer h.wg.Done()
		defer close(w.done)
		err := w.sw.Run(runCtx)
		if w.crashed.Load() {
			h.rec.Crash(name)
			return
		}
		if err != nil && runCtx.Err() == nil {
			h.mu.Lock()
			h.runErrs = append(h.runErrs, fmt.Errorf("stream worker %s: %w", name, err))
			h.mu.Unlock()
		}
	}()
	return w
}

// take removes a random live worker from the live ones and returns it.
func (h *srRun) take() *srWorker {
	h.mu.Lock()
	defer h.mu.Unlock()
	i := h.rng.IntN(len(h.live))
	w := h.workers[h.live[i]]
	h.live = slices.Delete(h.live, i, i+1)
	return w
}

// leave closes a random worker gracefully.
func (h *srRun) leave() {
	h.t.Helper()
	w := h.take()
	h.logf("%s leaves gracefully", w.name)
	h.closeWorkerOf(w)
	h.waitSettled(w.name + " left")
}

func (h *srRun) closeWorker(name string) {
	h.mu.Lock()
	w := h.workers[name]
	h.live = slices.DeleteFunc(h.live, func(n string) bool { return n == name })
	h.mu.Unlock()
	h.closeWorkerOf(w)
}

// closeWorkerOf closes w gracefully. It may run on any goroutine.
func (h *srRun) closeWorkerOf(w *srWorker) {
	cctx, cancel := context.WithTimeout(h.ctx, srBound)
	defer cancel()
	if err := w.sw.Close(cctx); err != nil {
		h.t.Errorf("close %s: %v", w.name, err)
	}
	<-w.done
}

// killOne kills a random worker: no last commit, no release. Its buckets
// move once its lease expires, each from its last commit.
func (h *srRun) killOne() {
	h.t.Helper()
	w := h.take()
	h.logf("%s is killed", w.name)
	w.mu.Lock() // no release is recorded once the kill begins
	w.crashed.Store(true)
	w.mu.Unlock()
	w.kill()
	<-w.done
	h.waitSettled(w.name + " killed")
}

// failover stops the leading replica; the other takes over. The stopped
// one restarts at the next step.
func (h *srRun) failover() {
	h.t.Helper()
	leader := h.leader()
	h.logf("the leading replica r%d stops", leader+1)
	if err := h.rs[leader].Stop(); err != nil {
		h.t.Fatal(err)
	}
	h.stopped = leader
	ctx, cancel := context.WithTimeout(h.ctx, srBound)
	defer cancel()
	if err := h.rs[1-leader].WaitLeading(ctx); err != nil {
		h.t.Fatalf("r%d did not take over: %v", 2-leader, err)
	}
	h.waitSettled("failover")
}

// leader returns the index of the leading replica.
func (h *srRun) leader() int {
	h.t.Helper()
	h.waitFor("a replica leads", func() (bool, string) {
		st, err := h.admin.Status(h.ctx)
		if err != nil {
			return false, err.Error()
		}
		return st.Leader != "", fmt.Sprintf("status %+v", st)
	})
	st, err := h.admin.Status(h.ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	for i := range h.rs {
		if st.Leader == fmt.Sprintf("r%d", i+1) {
			return i
		}
	}
	h.t.Fatalf("unknown leader %q", st.Leader)
	return 0
}

// pauseOne pauses a random worker until the server has expired its
// session and its buckets are granted to the others, then resumes it. It
// must lose its session and re-join; a commit for the old session must
// be refused, and no committed position may have gone backwards.
func (h *srRun) pauseOne() {
	h.t.Helper()
	h.mu.Lock()
	name := h.live[h.rng.IntN(len(h.live))]
	w := h.workers[name]
	others := slices.DeleteFunc(slices.Clone(h.live), func(n string) bool { return n == name })
	h.mu.Unlock()

	var session string
	var grants []client.Grant
	h.waitFor(name+" holds buckets", func() (bool, string) {
		session, grants = w.sw.ClientWorker().Granted()
		return session != "" && len(grants) > 0, fmt.Sprintf("session %q, %d grants", session, len(grants))
	})
	before := h.positions()
	w.gate.pause()
	paused := time.Now()
	h.logf("%s pauses (session %s, %d buckets)", name, session, len(grants))
	h.waitSettledAs(name+" paused", others)
	// The server expired the session (it is no member any more); the
	// pause lasts more than a lease TTL in all, as a stop-the-world pause
	// that long would.
	if d := srLeaseTTL + srLeaseTTL/4 - time.Since(paused); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-h.ctx.Done():
			h.t.Fatal(h.ctx.Err())
		}
	}
	w.mu.Lock()
	kick := w.lostKick
	w.mu.Unlock()
	w.gate.resume()
	h.logf("%s resumes after %v", name, time.Since(paused).Round(time.Millisecond))

	// It notices its session is lost.
	for {
		w.mu.Lock()
		lost := w.lost[session]
		w.mu.Unlock()
		if lost {
			break
		}
		t := time.NewTimer(srBound)
		select {
		case <-kick:
		case <-t.C:
			h.t.Fatalf("%s resumed but never lost session %s", name, session)
		}
		t.Stop()
		w.mu.Lock()
		kick = w.lostKick
		w.mu.Unlock()
	}

	// A commit for its old session is refused, whatever it claims.
	maxToken := uint64(0)
	var exc []*keyshardv1.BucketPosition
	for _, g := range grants {
		maxToken = max(maxToken, g.Token)
	}
	far := h.log.end() + 1_000_000
	exc = append(exc, &keyshardv1.BucketPosition{Bucket: uint32(grants[0].Bucket), Token: grants[0].Token, Position: far})
	for _, req := range []*keyshardv1.CommitRequest{
		{Session: session, MaxToken: maxToken, Position: far},
		{Session: session, MaxToken: maxToken, Position: far, Exceptions: exc},
	} {
		_, err := h.member().Commit(h.ctx, connect.NewRequest(req))
		if code := connect.CodeOf(err); err == nil || (code != connect.CodeNotFound && code != connect.CodeFailedPrecondition) {
			h.t.Fatalf("a commit for %s's lost session %s: %v; want it refused (not found or failed precondition)", name, session, err)
		} else {
			h.logf("a commit for the lost session is refused: %v", err)
		}
	}

	h.mu.Lock()
	live := slices.Clone(h.live)
	h.mu.Unlock()
	h.waitSettledAs(name+" resumed", live)
	after := h.positions()
	end := h.log.end()
	for b := range after {
		if after[b] < before[b] {
			h.t.Errorf("bucket %d: committed position %d after %s's pause, %d before it", b, after[b], name, before[b])
		}
		if after[b] > end {
			h.t.Errorf("bucket %d: committed position %d, past the end of the stream %d", b, after[b], end)
		}
	}
	w.mu.Lock()
	h.logf("%s re-joined as session %s; its commits of the lost session: %d refused, %d acknowledged", name, w.session, w.staleRefused, w.staleAcked)
	w.mu.Unlock()
}

// member returns a MemberService client of a running replica, for raw
// calls.
func (h *srRun) member() keyshardv1connect.MemberServiceClient {
	r := h.rs[0]
	if h.stopped == 0 {
		r = h.rs[1]
	}
	return keyshardv1connect.NewMemberServiceClient(http.DefaultClient, r.URL())
}

// positions returns every bucket's committed position.
func (h *srRun) positions() []uint64 {
	h.t.Helper()
	p, err := h.admin.Positions(h.ctx, srKeyspace, 0)
	if err != nil {
		h.t.Fatal(err)
	}
	return expandRuns(p)
}

func expandRuns(p client.Positions) []uint64 {
	out := make([]uint64, srBuckets)
	for _, r := range p.Runs {
		for b := r.First; b < r.First+r.Count && b < len(out); b++ {
			out[b] = r.Position
		}
	}
	return out
}

// waitPositions waits until every bucket's committed position is at
// least end.
func (h *srRun) waitPositions(end uint64) {
	h.t.Helper()
	h.waitFor(fmt.Sprintf("every bucket committed at %d", end), func() (bool, string) {
		p, err := h.admin.Positions(h.ctx, srKeyspace, 3)
		if err != nil {
			return false, err.Error()
		}
		return p.Min >= end, fmt.Sprintf("min %d, furthest behind %+v", p.Min, p.Behind)
	})
}

// waitSettled waits until the live workers, and only they, are members,
// the map assigns buckets to each of them (a member that just joined has
// none until the leader's next map), and every bucket is granted to the
// member the map assigns it to: no handoff is in flight.
func (h *srRun) waitSettled(what string) {
	h.t.Helper()
	h.mu.Lock()
	live := slices.Clone(h.live)
	h.mu.Unlock()
	h.waitSettledAs(what, live)
}

func (h *srRun) waitSettledAs(what string, live []string) {
	h.t.Helper()
	want := slices.Sorted(slices.Values(live))
	h.waitFor(what+": every bucket granted to "+strings.Join(want, ","), func() (bool, string) {
		ms, err := h.admin.ListMembers(h.ctx, srKeyspace)
		if err != nil {
			return false, err.Error()
		}
		var ids []string
		target, ok := 0, true
		var desc []string
		for _, m := range ms.Members {
			ids = append(ids, m.ID)
			target += m.TargetBuckets
			if m.TargetBuckets == 0 || m.GrantedBuckets != m.TargetBuckets || m.ReleasingBuckets != 0 {
				ok = false
			}
			desc = append(desc, fmt.Sprintf("%s: target %d granted %d releasing %d", m.ID, m.TargetBuckets, m.GrantedBuckets, m.ReleasingBuckets))
		}
		slices.Sort(ids)
		return ok && target == srBuckets && slices.Equal(ids, want), fmt.Sprintf("epoch %d, members %s", ms.Epoch, strings.Join(desc, "; "))
	})
	h.logf("%s: settled", what)
}

// waitFor polls cond until it holds; past srBound it fails the test with
// cond's last description.
func (h *srRun) waitFor(what string, cond func() (bool, string)) {
	h.t.Helper()
	deadline := time.Now().Add(srBound)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, desc := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s: not within %v; last seen: %s", what, srBound, desc)
		}
		select {
		case <-tick.C:
		case <-h.ctx.Done():
			h.t.Fatalf("%s: %v; last seen: %s", what, h.ctx.Err(), desc)
		}
	}
}

// positionMonitor samples the committed positions throughout a run: a
// bucket's never goes backwards (between answers at increasing store
// revisions) nor past the end of the stream.
type positionMonitor struct {
	h       *srRun
	last    []uint64
	lastRev uint64
	samples int
	errs    []string
}

func newPositionMonitor(h *srRun) *positionMonitor { return &positionMonitor{h: h} }

func (m *positionMonitor) run(ctx context.Context) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		p, err := m.h.admin.Positions(ctx, srKeyspace, 0)
		if err != nil {
			continue // a replica stopping, or the end
		}
		end := m.h.log.end()
		m.samples++
		cur := expandRuns(p)
		for b, pos := range cur {
			if pos > end {
				m.errorf("bucket %d at position %d (revision %d), past the end of the stream %d", b, pos, p.Revision, end)
			}
		}
		if p.Revision < m.lastRev {
			continue // an answer from a replica behind the last one
		}
		if m.last != nil {
			for b, pos := range cur {
				if pos < m.last[b] {
					m.errorf("bucket %d went back from %d (revision %d) to %d (revision %d)", b, m.last[b], m.lastRev, pos, p.Revision)
				}
			}
		}
		m.last, m.lastRev = cur, p.Revision
	}
}

func (m *positionMonitor) errorf(format string, args ...any) {
	if len(m.errs) < 20 {
		m.errs = append(m.errs, fmt.Sprintf(format, args...))
	}
}

// check reports what the monitor found; call it after run returned.
func (m *positionMonitor) check(t *testing.T) {
	t.Helper()
	if len(m.errs) > 0 {
		t.Errorf("committed positions moved wrongly:\n  %s", strings.Join(m.errs, "\n  "))
	}
}

// traceLine is one line of a run's trace: what the workers saw, printed
// for the buckets a failed check names.
type traceLine struct {
	at     time.Duration
	bucket int // -1: not about one bucket
	text   string
}

func (h *srRun) tracef(bucket int, format string, args ...any) {
	h.traceMu.Lock()
	defer h.traceMu.Unlock()
	h.trace = append(h.trace, traceLine{at: time.Since(h.start), bucket: bucket, text: fmt.Sprintf(format, args...)})
}

func (h *srRun) traceEvent(name string, ev client.Event) {
	switch ev.Kind {
	case client.EventRenewed:
	case client.EventAcquired:
		h.tracef(ev.Grant.Bucket, "%s acquired bucket %d token %d from %d (err %v)", name, ev.Grant.Bucket, ev.Grant.Token, ev.Grant.From, ev.Err)
	case client.EventReleased:
		final := "none"
		if ev.Final != nil {
			final = fmt.Sprint(*ev.Final)
		}
		h.tracef(ev.Grant.Bucket, "%s released bucket %d token %d, final %s (err %v)", name, ev.Grant.Bucket, ev.Grant.Token, final, ev.Err)
	default:
		h.tracef(-1, "%s %v session %s (err %v)", name, ev.Kind, ev.Session, ev.Err)
	}
}

var bucketRe = regexp.MustCompile(`bucket (\d+)`)

// dumpTrace logs the trace lines about the buckets violations name, and
// those about no bucket.
func (h *srRun) dumpTrace(violations []string) {
	want := map[int]bool{}
	for _, v := range violations {
		for _, m := range bucketRe.FindAllStringSubmatch(v, -1) {
			b, _ := strconv.Atoi(m[1])
			want[b] = true
		}
	}
	h.traceMu.Lock()
	defer h.traceMu.Unlock()
	var out []string
	for _, l := range h.trace {
		if l.bucket < 0 || want[l.bucket] {
			out = append(out, fmt.Sprintf("[%5.2fs] %s", l.at.Seconds(), l.text))
		}
	}
	h.t.Logf("trace:\n  %s", strings.Join(out, "\n  "))
}
