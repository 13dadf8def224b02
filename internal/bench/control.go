package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/internal/kitseam"
	"github.com/keyshard/keyshard/internal/server"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/keyshardtest"
)

// ControlOptions selects what Control measures.
type ControlOptions struct {
	// Runs is how many times the router cost, the scale-out and the crash
	// takeover are measured; the median is reported. Default 3.
	Runs int
	// Quick shrinks every case (smaller keyspaces, fewer handoffs, epochs
	// and routers) so that tests can run the whole suite; its figures are
	// not comparable with the targets.
	Quick bool
	// Logger receives the logs of the server, of etcd and of the SDK.
	// Default: discard.
	Logger *slog.Logger
}

// ControlReport is the output of `keyshard bench control --json`: the
// control plane measured end to end, against an embedded server on
// loopback (real etcd, real HTTP, the Go SDK). Targets:
// router_owner_ns ≤ 50 with router_owner_allocs 0; handoff_p99_ms ≤ 50,
// handoff_p99_over_floor_p99 ≤ 2 and handoff_p50_ms ≤ 5 (issue 14);
// scaleout_16384_s ≤ 2 with scaleout_etcd_writes growing with members, not
// with scaleout_moved_buckets; crash_takeover_s ≤ lease_ttl_s + 1;
// watch_fanout_100_p99_ms ≤ 200.
type ControlReport struct {
	// RouterOwnerNs is the median cost of Router.OwnerString for 16-byte
	// keys, RouterOwnerBytesNs that of Router.Owner, with a map of
	// RouterBuckets buckets over RouterMembers members; RouterOwnerAllocs is
	// the most allocations per lookup of either.
	RouterBuckets      int     `json:"router_buckets"`
	RouterMembers      int     `json:"router_members"`
	RouterOwnerNs      float64 `json:"router_owner_ns"`
	RouterOwnerBytesNs float64 `json:"router_owner_bytes_ns"`
	RouterOwnerAllocs  int64   `json:"router_owner_allocs"`

	// Handoffs counts graceful handoffs of one bucket in a keyspace of
	// HandoffBuckets buckets with two workers, while a third joins and
	// leaves HandoffCycles times; the percentiles are of the time from the
	// old owner's Handler.Release returning to the new owner's
	// Handler.Acquire being called.
	HandoffBuckets int     `json:"handoff_buckets"`
	HandoffCycles  int     `json:"handoff_cycles"`
	Handoffs       int     `json:"handoffs"`
	HandoffP50Ms   float64 `json:"handoff_p50_ms"`
	HandoffP99Ms   float64 `json:"handoff_p99_ms"`
	HandoffMaxMs   float64 `json:"handoff_max_ms"`
	// HandoffStagesMs splits the handoffs whose etcd writes were traced.
	HandoffStagesMs HandoffStages `json:"handoff_stages_ms"`

	// SingleHandoffs counts graceful handoffs of one bucket alone, the
	// handoff the floor below measures: a keyspace of two buckets held by
	// one worker, which a second joins and leaves SingleCycles times (each
	// join and each leave moves one bucket, so the old owner releases it
	// in a call of its own and the leader grants it in a round of its
	// own). The percentiles, stages and ratios are as for the handoffs
	// above, where a join or leave moves about a third of the keyspace at
	// once.
	SingleCycles                 int           `json:"single_cycles"`
	SingleHandoffs               int           `json:"single_handoffs"`
	SingleHandoffP50Ms           float64       `json:"single_handoff_p50_ms"`
	SingleHandoffP99Ms           float64       `json:"single_handoff_p99_ms"`
	SingleHandoffMaxMs           float64       `json:"single_handoff_max_ms"`
	SingleHandoffStagesMs        HandoffStages `json:"single_handoff_stages_ms"`
	SingleHandoffP99OverFloorP99 float64       `json:"single_handoff_p99_over_floor_p99"`
	SingleHandoffP50OverFloorP50 float64       `json:"single_handoff_p50_over_floor_p50"`

	// FloorPairs is how many times the store's own floor for a handoff was
	// measured on the same etcd, interleaved with the handoffs (a share
	// before each join and after the last leave of the handoffs above, and
	// one pair before each join and each leave of the single ones): two
	// sequential fenced writes, each seen through an etcd watch, as a
	// handoff needs them.
	// The first is a member's release record written by store.Release (the
	// compare-and-write transaction of the server's Release), the second
	// the grant written by store.Commit (fenced by an election key, with
	// the expectations of the leader's grant round). The percentiles are of
	// the time from the first write's start to the second one's watch
	// delivery; FloorStagesMs splits it at the first delivery. The ratios
	// compare the handoff with its floor (targets: p99 ratio ≤ 2, and
	// handoff_p50_ms ≤ 5).
	FloorPairs             int         `json:"floor_pairs"`
	FloorP50Ms             float64     `json:"floor_p50_ms"`
	FloorP99Ms             float64     `json:"floor_p99_ms"`
	FloorMaxMs             float64     `json:"floor_max_ms"`
	FloorStagesMs          FloorStages `json:"floor_stages_ms"`
	HandoffP99OverFloorP99 float64     `json:"handoff_p99_over_floor_p99"`
	HandoffP50OverFloorP50 float64     `json:"handoff_p50_over_floor_p50"`

	// ScaleoutS is the median time from a fourth worker's start (its Join)
	// until every bucket whose owner changed was acquired by its new owner
	// (all of them by the new worker, unless a lost release made the
	// server revoke a session meanwhile), in a keyspace of ScaleoutBuckets
	// buckets (16384 unless Quick) held by three workers whose handlers
	// return at once; ScaleoutMovedBuckets is the median count of those
	// buckets. ScaleoutEtcdWrites is the
	// median number of etcd revisions the scale-out took (etcd's revision
	// after minus before); the Map, Grant and Release counts split them by
	// the key they wrote (one revision can write several).
	ScaleoutBuckets       int       `json:"scaleout_buckets"`
	ScaleoutS             float64   `json:"scaleout_16384_s"`
	ScaleoutRunsS         []float64 `json:"scaleout_runs_s"`
	ScaleoutMovedBuckets  int       `json:"scaleout_moved_buckets"`
	ScaleoutEtcdWrites    int64     `json:"scaleout_etcd_writes"`
	ScaleoutMapWrites     int       `json:"scaleout_map_writes"`
	ScaleoutGrantWrites   int       `json:"scaleout_grant_writes"`
	ScaleoutReleaseWrites int       `json:"scaleout_release_writes"`

	// CrashTakeoverS is the median time from a worker's stop without
	// leaving (its Run context cancelled, as a killed process) until every
	// bucket it held was acquired by the others, in a keyspace of
	// CrashBuckets buckets with three workers and a lease TTL of LeaseTTLS.
	CrashBuckets       int       `json:"crash_buckets"`
	CrashTakeoverS     float64   `json:"crash_takeover_s"`
	CrashTakeoverRunsS []float64 `json:"crash_takeover_runs_s"`
	LeaseTTLS          float64   `json:"lease_ttl_s"`

	// WatchRouters client.Router instances, each on its own Client,
	// follow one keyspace while WatchEpochs new maps are written (a worker
	// joins and leaves repeatedly). A delay is from the moment the epoch
	// was written (seen on an etcd watch of the map key, or by the first
	// router if earlier) to the moment one router's Epoch() reached it;
	// the percentiles are over every router and epoch. WatchMissed counts
	// (router, epoch) pairs never reached within 10 s.
	WatchRouters     int     `json:"watch_routers"`
	WatchEpochs      int     `json:"watch_epochs"`
	WatchFanoutP50Ms float64 `json:"watch_fanout_100_p50_ms"`
	WatchFanoutP99Ms float64 `json:"watch_fanout_100_p99_ms"`
	WatchFanoutMaxMs float64 `json:"watch_fanout_100_max_ms"`
	WatchMissed      int     `json:"watch_missed"`
	WatchEtcdResyncs int     `json:"watch_etcd_resyncs,omitempty"`

	// LostReleases counts releases the server lost over the whole run: a
	// member's release record in etcd listed (bucket, token), and a later
	// write of the record dropped the pair while the member still held
	// the bucket at that token. Such a bucket moves only once the drain
	// timeout revokes the holder's session (RevokedSessions counts
	// revocations that quarantined buckets); the delay shows in the
	// figures above.
	LostReleases    int     `json:"lost_releases"`
	RevokedSessions int     `json:"revoked_sessions"`
	Runs            int     `json:"runs"`
	Quick           bool    `json:"quick,omitempty"`
	DurationS       float64 `json:"duration_s"`
}

// HandoffStages splits a graceful handoff at the two etcd writes it
// needs, as seen on an etcd watch: ReleaseToRecord from the old owner's
// Release returning to the release record's write (SDK and server API),
// RecordToGrant from there to the leader's grant write (the leader),
// GrantToAcquire from there to the new owner's Acquire (server view,
// grants stream and SDK).
type HandoffStages struct {
	Traced          int     `json:"traced"`
	ReleaseToRecord StageMs `json:"release_to_record"`
	RecordToGrant   StageMs `json:"record_to_grant"`
	GrantToAcquire  StageMs `json:"grant_to_acquire"`
}

// StageMs is the median and 99th percentile of one stage, in ms.
type StageMs struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
}

func stageOf(ds []time.Duration) StageMs {
	if len(ds) == 0 {
		return StageMs{}
	}
	return StageMs{P50: percentileMs(ds, 50), P99: percentileMs(ds, 99)}
}

// controlSizes are the case sizes of a run.
type controlSizes struct {
	routerBuckets, routerMembers  int
	handoffBuckets, handoffCycles int
	singleCycles                  int
	floorPairs                    int // besides the single handoffs' own
	scaleoutBuckets               int
	crashBuckets                  int
	watchBuckets, watchRouters    int
	watchCycles                   int
}

func sizesFor(quick bool) controlSizes {
	if quick {
		return controlSizes{
			routerBuckets: 1024, routerMembers: 10,
			handoffBuckets: 64, handoffCycles: 2,
			singleCycles:    3,
			floorPairs:      60,
			scaleoutBuckets: 1024,
			crashBuckets:    64,
			watchBuckets:    64, watchRouters: 10, watchCycles: 2,
		}
	}
	return controlSizes{
		routerBuckets: 16384, routerMembers: 10,
		handoffBuckets: 256, handoffCycles: 5,
		singleCycles:    50,
		floorPairs:      500,
		scaleoutBuckets: 16384,
		crashBuckets:    256,
		watchBuckets:    256, watchRouters: 100, watchCycles: 5,
	}
}

// Keyspaces of the suite, one per case, all on one server.
const (
	ksRouter   = "bench-router"
	ksHandoff  = "bench-handoff"
	ksSingle   = "bench-single"
	ksScaleout = "bench-scaleout"
	ksCrash    = "bench-crash"
	ksWatch    = "bench-watch"

	crashLeaseTTL = 2 * time.Second
	// A release the server loses (see ControlReport.LostReleases) is
	// recovered only by the drain timeout, which revokes the holder's
	// session and quarantines its buckets for one lease TTL; short values
	// keep such a recovery within the run's budget.
	benchLeaseTTL     = 3 * time.Second
	benchDrainTimeout = 3 * time.Second
	// controlBudget bounds a whole run.
	controlBudget = 110 * time.Second
	// settleTimeout bounds the wait for one change to be fully granted.
	settleTimeout = 30 * time.Second
	controlSteps  = 6
)

// Control measures the control plane end to end: it starts an embedded
// etcd and a Keyshard server on loopback, drives them with client.Worker
// and client.Router, and writes one progress line per step to progress.
// The whole run is bounded (under two minutes); it returns an error naming
// the step that failed or did not settle in time.
func Control(ctx context.Context, opts ControlOptions, progress io.Writer) (rep ControlReport, err error) {
	if opts.Runs <= 0 {
		opts.Runs = 3
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	sz := sizesFor(opts.Quick)
	rep = ControlReport{Runs: opts.Runs, Quick: opts.Quick}
	began := time.Now()
	ctx, cancel := context.WithTimeout(ctx, controlBudget)
	defer cancel()
	defer func() {
		if err != nil && errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
			err = fmt.Errorf("bench control did not finish within %v: %w", controlBudget, err)
		}
	}()

	e, err := startControlEnv(ctx, log, sz, opts.Runs, progress)
	if err != nil {
		return rep, err
	}
	defer e.close()
	e.stepNo = 1
	e.say("embedded etcd %s and server %s up in %v (keyspaces %s, %s, %s, %s, %s)",
		e.etcdEndpoints, e.url, time.Since(began).Round(time.Millisecond), ksRouter, ksHandoff, ksScaleout, ksCrash, ksWatch)

	steps := []struct {
		name string
		run  func(context.Context, *ControlReport) error
	}{
		{"router", e.routerCost},
		{"handoff", e.handoffs},
		{"scale-out", e.scaleout},
		{"crash takeover", e.crash},
		{"watch fan-out", e.watchFanout},
	}
	for _, s := range steps {
		e.stepNo++
		lost0, revoked0 := e.obs.damage()
		err := s.run(ctx, &rep)
		if lost, revoked := e.obs.damage(); lost > lost0 || revoked > revoked0 {
			e.say("%s: the server lost %d releases (a later release record overwrote them) and revoked %d sessions, quarantining their buckets (drain timeout %v)",
				s.name, lost-lost0, revoked-revoked0, benchDrainTimeout)
		}
		if err != nil {
			return rep, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	rep.WatchEtcdResyncs = e.obs.resyncCount()
	rep.LostReleases, rep.RevokedSessions = e.obs.damage()
	rep.DurationS = time.Since(began).Seconds()
	return rep, nil
}

// controlEnv is one run's embedded etcd, server, clients and workers.
type controlEnv struct {
	log      *slog.Logger
	sz       controlSizes
	runs     int
	progress io.Writer
	stepNo   int

	dir           string
	emb           *store.Embedded
	etcdEndpoints string
	st            *store.Store // a second etcd client: revisions and the map watch
	obs           *etcdObserver
	srv           *keyshardtest.Server
	url           string
	cl            *client.Client
	routers       []*client.Router

	workersCtx  context.Context
	stopWorkers context.CancelFunc
	workers     sync.WaitGroup // every worker's Run goroutine
	failed      chan error     // cap 1: the first worker that stopped on its own
	stopObs     context.CancelFunc
	obsDone     chan struct{}
}

func startControlEnv(ctx context.Context, log *slog.Logger, sz controlSizes, runs int, progress io.Writer) (_ *controlEnv, err error) {
	e := &controlEnv{log: log, sz: sz, runs: runs, progress: progress, failed: make(chan error, 1)}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if e.dir, err = os.MkdirTemp("", "keyshard-bench-control-"); err != nil {
		return nil, err
	}
	// The suite starts etcd itself, so that it can open a second client on
	// it to read revisions and watch map writes.
	e.emb, err = store.StartEmbedded(ctx, store.EmbeddedConfig{Dir: filepath.Join(e.dir, "etcd"), Name: "bench", Logger: log})
	if err != nil {
		return nil, err
	}
	e.etcdEndpoints = strings.Join(e.emb.Endpoints(), ",")
	if e.st, err = store.Open(ctx, store.Config{Endpoints: e.emb.Endpoints(), Logger: log}); err != nil {
		return nil, err
	}

	ks := func(name string, buckets int, ttl time.Duration) client.KeyspaceConfig {
		return client.KeyspaceConfig{Name: name, Buckets: buckets, LeaseTTL: ttl, DrainTimeout: benchDrainTimeout}
	}
	e.srv, err = keyshardtest.Start(ctx, keyshardtest.Options{
		Keyspaces: []client.KeyspaceConfig{
			ks(ksRouter, sz.routerBuckets, benchLeaseTTL),
			ks(ksHandoff, sz.handoffBuckets, benchLeaseTTL),
			ks(ksSingle, singleBuckets, benchLeaseTTL),
			ks(ksScaleout, sz.scaleoutBuckets, benchLeaseTTL),
			ks(ksCrash, sz.crashBuckets, crashLeaseTTL),
			ks(ksWatch, sz.watchBuckets, benchLeaseTTL),
		},
		Logger: log,
		Internal: &kitseam.Options{Config: func(c *server.Config) {
			c.Replica = "bench"
			c.Etcd = server.EtcdConfig{Endpoints: e.emb.Endpoints()}
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("start the embedded server: %w", err)
	}
	e.url = e.srv.URL()
	if e.cl, err = client.Dial(e.url, client.Logger(log)); err != nil {
		return nil, err
	}
	e.workersCtx, e.stopWorkers = context.WithCancel(context.WithoutCancel(ctx))

	rev, err := e.st.Rev(ctx)
	if err != nil {
		return nil, fmt.Errorf("read etcd's revision: %w", err)
	}
	e.obs = &etcdObserver{}
	octx, ostop := context.WithCancel(context.WithoutCancel(ctx))
	e.stopObs, e.obsDone = ostop, make(chan struct{})
	updates := e.st.Watch(octx, rev+1)
	go func() { // exits when close calls stopObs (Watch then closes updates)
		defer close(e.obsDone)
		e.obs.run(updates)
	}()
	return e, nil
}

// close stops everything in order: workers and routers (so that no stream
// holds the server's shutdown), the clients, the server, etcd. It is safe
// on a partly started env.
func (e *controlEnv) close() {
	for _, r := range e.routers {
		r.Close()
	}
	if e.stopWorkers != nil {
		e.stopWorkers()
	}
	e.workers.Wait()
	if e.cl != nil {
		e.cl.Close()
	}
	if e.srv != nil {
		if err := e.srv.Close(); err != nil {
			e.log.Warn("bench: server stopped with an error", "err", err)
		}
	}
	if e.stopObs != nil {
		e.stopObs()
		<-e.obsDone
	}
	if e.st != nil {
		e.st.Close()
	}
	if e.emb != nil {
		e.emb.Close()
	}
	if e.dir != "" {
		os.RemoveAll(e.dir)
	}
}

// say writes a progress line of the current step.
func (e *controlEnv) say(format string, args ...any) {
	fmt.Fprintf(e.progress, "control %d/%d  %s\n", e.stepNo, controlSteps, fmt.Sprintf(format, args...))
}

// benchWorker is a client.Worker run by the suite.
type benchWorker struct {
	name string
	w    *client.Worker
	kill context.CancelFunc // stops it as a crash does: no leave
	done chan struct{}      // closed when Run returned
}

// startWorker runs a worker for keyspace ks whose handler records into
// rec and returns at once. It returns an error only for a bad name.
func (e *controlEnv) startWorker(ks, name string, rec *recorder) (*benchWorker, error) {
	w, err := client.NewWorker(e.cl, ks, client.Member{ID: name, Address: "bench/" + name}, &benchHandler{name: name, rec: rec, grants: map[int]context.Context{}}, client.Logger(e.log))
	if err != nil {
		return nil, err
	}
	ctx, kill := context.WithCancel(e.workersCtx)
	bw := &benchWorker{name: name, w: w, kill: kill, done: make(chan struct{})}
	e.workers.Add(1)
	go func() { // exits when the worker stops: Close, kill, or the end of the run
		defer e.workers.Done()
		defer close(bw.done)
		if err := bw.w.Run(ctx); err != nil && ctx.Err() == nil {
			select {
			case e.failed <- fmt.Errorf("worker %s of keyspace %q stopped: %w", name, ks, err):
			default:
			}
		}
	}()
	return bw, nil
}

// leave closes bw gracefully (drain, then leave), bounded by settleTimeout.
func (e *controlEnv) leave(ctx context.Context, bw *benchWorker) error {
	cctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	if err := bw.w.Close(cctx); err != nil {
		return fmt.Errorf("worker %s leaving: %w", bw.name, err)
	}
	return nil
}

func (e *controlEnv) router(ctx context.Context, ks string) (*client.Router, error) {
	r, err := client.NewRouter(e.cl, ks, client.Logger(e.log))
	if err != nil {
		return nil, err
	}
	if err := r.Start(ctx); err != nil { // closes r
		return nil, err
	}
	e.routers = append(e.routers, r)
	return r, nil
}

// settle waits until the router's map names exactly the members want and
// every bucket is held (Acquire called, not released) by its owner under
// that map. It checks the in-memory record every 10 ms; the figures come
// from the timestamps the handlers recorded, not from when settle noticed.
func (e *controlEnv) settle(ctx context.Context, r *client.Router, rec *recorder, want ...string) error {
	wctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, state := rec.matches(r, want)
		if ok {
			return nil
		}
		select {
		case err := <-e.failed:
			select {
			case e.failed <- err: // every later wait fails too
			default:
			}
			return err
		case <-wctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("keyspace %q not settled after %v: %s", r.Keyspace(), settleTimeout, state)
		case <-tick.C:
		}
	}
}

// benchHandler is a client.Handler that returns at once and records when
// it was called.
type benchHandler struct {
	name string
	rec  *recorder

	mu     sync.Mutex
	grants map[int]context.Context // bucket → its grant's context, from Acquire to Release
}

// Acquire implements client.Handler.
func (h *benchHandler) Acquire(ctx context.Context, g client.Grant) error {
	now := time.Now()
	h.mu.Lock()
	h.grants[g.Bucket] = ctx
	h.mu.Unlock()
	h.rec.acquire(h.name, g.Bucket, now)
	return nil
}

// Release implements client.Handler.
func (h *benchHandler) Release(_ context.Context, bucket int) error {
	h.mu.Lock()
	gctx := h.grants[bucket]
	delete(h.grants, bucket)
	h.mu.Unlock()
	// A handoff calls Release while the grant's context is live; a
	// self-fence or a stop cancels it first.
	graceful := gctx != nil && gctx.Err() == nil
	h.rec.release(h.name, bucket, graceful, time.Now())
	return nil
}

// recorder is the record of one keyspace's Acquire and Release calls,
// shared by its workers' handlers.
type recorder struct {
	mu         sync.Mutex
	holder     []string    // bucket → worker between its Acquire and Release
	acquiredAt []time.Time // bucket → its latest Acquire
	releasedAt []time.Time // bucket → when its latest graceful Release returned, until the next Acquire
	handoffs   []handoff
}

// handoff is one bucket's graceful handoff: the old owner's Release
// returned at released, the new owner's Acquire was called at acquired.
type handoff struct {
	bucket             int
	released, acquired time.Time
}

func newRecorder(buckets int) *recorder {
	return &recorder{holder: make([]string, buckets), acquiredAt: make([]time.Time, buckets), releasedAt: make([]time.Time, buckets)}
}

func (r *recorder) acquire(worker string, b int, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b < 0 || b >= len(r.holder) {
		return
	}
	r.holder[b] = worker
	r.acquiredAt[b] = now
	if t := r.releasedAt[b]; !t.IsZero() {
		r.handoffs = append(r.handoffs, handoff{b, t, now})
		r.releasedAt[b] = time.Time{}
	}
}

func (r *recorder) release(worker string, b int, graceful bool, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b < 0 || b >= len(r.holder) || r.holder[b] != worker {
		return
	}
	r.holder[b] = ""
	if graceful {
		r.releasedAt[b] = now
	}
}

// resetHandoffs forgets the handoffs recorded so far.
func (r *recorder) resetHandoffs() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.handoffs = nil
}

func (r *recorder) handoffList() []handoff {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.handoffs)
}

// held returns the buckets worker holds.
func (r *recorder) held(worker string) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int
	for b, h := range r.holder {
		if h == worker {
			out = append(out, b)
		}
	}
	return out
}

// lastAcquire returns the latest Acquire of any of buckets, and false if
// one of them was not acquired after since.
func (r *recorder) lastAcquire(buckets []int, since time.Time) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var last time.Time
	for _, b := range buckets {
		t := r.acquiredAt[b]
		if !t.After(since) {
			return time.Time{}, false
		}
		if t.After(last) {
			last = t
		}
	}
	return last, true
}

// matches reports whether the router's map has exactly the owners want
// and every bucket is held by its owner; otherwise it says what differs.
func (r *recorder) matches(rt *client.Router, want []string) (bool, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	owners := map[string]bool{}
	wrong, example := 0, ""
	for b, h := range r.holder {
		o, ok := rt.BucketOwner(b)
		if ok {
			owners[o] = true
		}
		if !ok || h != o {
			if wrong == 0 {
				example = fmt.Sprintf(", such as bucket %d (owner %q, held by %q)", b, o, h)
			}
			wrong++
		}
	}
	same := len(owners) == len(want)
	for _, w := range want {
		same = same && owners[w]
	}
	if wrong == 0 && same {
		return true, ""
	}
	have := make([]string, 0, len(owners))
	for o := range owners {
		have = append(have, o)
	}
	sort.Strings(have)
	return false, fmt.Sprintf("map epoch %d assigns buckets to %v (want %v); %d of %d buckets not held by their owner%s", rt.Epoch(), have, want, wrong, len(r.holder), example)
}

// owners returns the owner of every bucket under the router's map.
func owners(rt *client.Router, buckets int) []string {
	out := make([]string, buckets)
	for b := range out {
		out[b], _ = rt.BucketOwner(b)
	}
	return out
}

// routerCost measures Router.OwnerString and Router.Owner, e.runs times,
// with a map of routerBuckets over routerMembers live workers.
func (e *controlEnv) routerCost(ctx context.Context, rep *ControlReport) error {
	sz, runs := e.sz, e.runs
	rt, err := e.router(ctx, ksRouter)
	if err != nil {
		return err
	}
	rec := newRecorder(sz.routerBuckets)
	var names []string
	for i := range sz.routerMembers {
		name := fmt.Sprintf("r%02d", i+1)
		names = append(names, name)
		if _, err := e.startWorker(ksRouter, name, rec); err != nil {
			return err
		}
	}
	if err := e.settle(ctx, rt, rec, names...); err != nil {
		return err
	}
	r := rand.New(rand.NewPCG(42, 8))
	bkeys := randomKeys(r, 4096, 16)
	skeys := make([]string, len(bkeys))
	for i, k := range bkeys {
		skeys[i] = string(k)
	}
	mask := len(bkeys) - 1
	var strNs, byteNs []float64
	for range runs {
		if err := ctx.Err(); err != nil {
			return err
		}
		ns, allocs := nsPerOp(func(b *testing.B) {
			b.ReportAllocs()
			for i := range b.N {
				o, _ := rt.OwnerString(skeys[i&mask])
				sink += uint64(len(o))
			}
		})
		strNs = append(strNs, ns)
		rep.RouterOwnerAllocs = max(rep.RouterOwnerAllocs, allocs)
		ns, allocs = nsPerOp(func(b *testing.B) {
			b.ReportAllocs()
			for i := range b.N {
				o, _ := rt.Owner(bkeys[i&mask])
				sink += uint64(len(o))
			}
		})
		byteNs = append(byteNs, ns)
		rep.RouterOwnerAllocs = max(rep.RouterOwnerAllocs, allocs)
	}
	rep.RouterBuckets, rep.RouterMembers = sz.routerBuckets, sz.routerMembers
	rep.RouterOwnerNs, rep.RouterOwnerBytesNs = medianOf(strNs), medianOf(byteNs)
	e.say("router: %d buckets over %d members (map epoch %d): OwnerString %.1f ns, Owner %.1f ns, %d allocs",
		sz.routerBuckets, sz.routerMembers, rt.Epoch(), rep.RouterOwnerNs, rep.RouterOwnerBytesNs, rep.RouterOwnerAllocs)
	return nil
}

// handoffs measures graceful handoffs: two workers hold the keyspace, a
// third joins and leaves handoffCycles times.
func (e *controlEnv) handoffs(ctx context.Context, rep *ControlReport) error {
	sz := e.sz
	rt, err := e.router(ctx, ksHandoff)
	if err != nil {
		return err
	}
	rec := newRecorder(sz.handoffBuckets)
	for _, name := range []string{"h1", "h2"} {
		if _, err := e.startWorker(ksHandoff, name, rec); err != nil {
			return err
		}
	}
	if err := e.settle(ctx, rt, rec, "h1", "h2"); err != nil {
		return err
	}
	floor, err := startFloor(ctx, e.emb.Endpoints(), e.log)
	if err != nil {
		return err
	}
	defer floor.close()
	// The floor's pairs run in shares between the handoff cycles, so that
	// both see the same machine.
	share := (sz.floorPairs + sz.handoffCycles) / (sz.handoffCycles + 1)
	rec.resetHandoffs()
	for i := range sz.handoffCycles {
		if err := floor.run(ctx, share); err != nil {
			return err
		}
		name := fmt.Sprintf("h3-%d", i+1)
		w, err := e.startWorker(ksHandoff, name, rec)
		if err != nil {
			return err
		}
		if err := e.settle(ctx, rt, rec, "h1", "h2", name); err != nil {
			return fmt.Errorf("%s joining: %w", name, err)
		}
		if err := e.leave(ctx, w); err != nil {
			return err
		}
		if err := e.settle(ctx, rt, rec, "h1", "h2"); err != nil {
			return fmt.Errorf("%s leaving: %w", name, err)
		}
	}
	if err := floor.run(ctx, share); err != nil {
		return err
	}
	hs := rec.handoffList()
	if len(hs) == 0 {
		return errors.New("no graceful handoff was recorded")
	}
	times, stages := e.handoffFigures(ksHandoff, hs)
	rep.HandoffBuckets, rep.HandoffCycles, rep.Handoffs = sz.handoffBuckets, sz.handoffCycles, len(times)
	rep.HandoffP50Ms, rep.HandoffP99Ms, rep.HandoffMaxMs = percentileMs(times, 50), percentileMs(times, 99), percentileMs(times, 100)
	rep.HandoffStagesMs = stages
	e.say("handoff: %d graceful handoffs (%d buckets, a third worker joined and left %d times): release → acquire p50 %.1f ms, p99 %.1f ms, max %.1f ms",
		rep.Handoffs, sz.handoffBuckets, sz.handoffCycles, rep.HandoffP50Ms, rep.HandoffP99Ms, rep.HandoffMaxMs)

	singles, err := e.singleHandoffs(ctx, floor)
	if err != nil {
		return err
	}
	times, stages = e.handoffFigures(ksSingle, singles)
	rep.SingleCycles, rep.SingleHandoffs = sz.singleCycles, len(times)
	rep.SingleHandoffP50Ms, rep.SingleHandoffP99Ms, rep.SingleHandoffMaxMs = percentileMs(times, 50), percentileMs(times, 99), percentileMs(times, 100)
	rep.SingleHandoffStagesMs = stages
	e.say("single handoffs: %d of one bucket alone (2 buckets, a second worker joined and left %d times): release → acquire p50 %.1f ms, p99 %.1f ms, max %.1f ms",
		rep.SingleHandoffs, sz.singleCycles, rep.SingleHandoffP50Ms, rep.SingleHandoffP99Ms, rep.SingleHandoffMaxMs)

	total, release, grant := floor.pairs()
	rep.FloorPairs = len(total)
	rep.FloorP50Ms, rep.FloorP99Ms, rep.FloorMaxMs = percentileMs(total, 50), percentileMs(total, 99), percentileMs(total, 100)
	rep.FloorStagesMs = FloorStages{Release: stageOf(release), Grant: stageOf(grant)}
	rep.HandoffP99OverFloorP99 = ratio(rep.HandoffP99Ms, rep.FloorP99Ms)
	rep.HandoffP50OverFloorP50 = ratio(rep.HandoffP50Ms, rep.FloorP50Ms)
	rep.SingleHandoffP99OverFloorP99 = ratio(rep.SingleHandoffP99Ms, rep.FloorP99Ms)
	rep.SingleHandoffP50OverFloorP50 = ratio(rep.SingleHandoffP50Ms, rep.FloorP50Ms)
	e.say("floor: %d pairs of fenced writes on the same etcd, each seen on a watch (interleaved with the handoffs): p50 %.1f ms, p99 %.1f ms, max %.1f ms; handoff/floor p50 %.2f×, p99 %.2f×; single handoff/floor p50 %.2f×, p99 %.2f×",
		rep.FloorPairs, rep.FloorP50Ms, rep.FloorP99Ms, rep.FloorMaxMs, rep.HandoffP50OverFloorP50, rep.HandoffP99OverFloorP99, rep.SingleHandoffP50OverFloorP50, rep.SingleHandoffP99OverFloorP99)
	fs := rep.FloorStagesMs
	e.say("floor stages (p50/p99 ms): release record written → seen %.1f/%.1f, → grant written and seen %.1f/%.1f",
		fs.Release.P50, fs.Release.P99, fs.Grant.P50, fs.Grant.P99)
	for _, c := range []struct {
		what string
		st   HandoffStages
	}{{"handoff", rep.HandoffStagesMs}, {"single handoff", rep.SingleHandoffStagesMs}} {
		st := c.st
		e.say("%s stages (p50/p99 ms, %d traced): release → release record in etcd %.1f/%.1f, → leader's grant write %.1f/%.1f, → Acquire %.1f/%.1f",
			c.what, st.Traced, st.ReleaseToRecord.P50, st.ReleaseToRecord.P99, st.RecordToGrant.P50, st.RecordToGrant.P99, st.GrantToAcquire.P50, st.GrantToAcquire.P99)
	}
	return nil
}

// singleBuckets is the size of the single handoffs' keyspace: with one
// worker holding both buckets, a second one's join moves one bucket to
// it and its leave moves that one back.
const singleBuckets = 2

// singleHandoffs measures handoffs of one bucket alone: worker s1 holds
// the keyspace of singleBuckets, a second one joins and leaves
// singleCycles times, with one floor pair before each join and each
// leave. Every join and leave must hand exactly one bucket over.
func (e *controlEnv) singleHandoffs(ctx context.Context, floor *floorRig) ([]handoff, error) {
	rt, err := e.router(ctx, ksSingle)
	if err != nil {
		return nil, err
	}
	rec := newRecorder(singleBuckets)
	if _, err := e.startWorker(ksSingle, "s1", rec); err != nil {
		return nil, err
	}
	if err := e.settle(ctx, rt, rec, "s1"); err != nil {
		return nil, err
	}
	rec.resetHandoffs()
	for i := range e.sz.singleCycles {
		if err := floor.run(ctx, 1); err != nil {
			return nil, err
		}
		name := fmt.Sprintf("s2-%d", i+1)
		w, err := e.startWorker(ksSingle, name, rec)
		if err != nil {
			return nil, err
		}
		if err := e.settle(ctx, rt, rec, "s1", name); err != nil {
			return nil, fmt.Errorf("%s joining: %w", name, err)
		}
		if err := floor.run(ctx, 1); err != nil {
			return nil, err
		}
		if err := e.leave(ctx, w); err != nil {
			return nil, err
		}
		if err := e.settle(ctx, rt, rec, "s1"); err != nil {
			return nil, fmt.Errorf("%s leaving: %w", name, err)
		}
		if n, want := len(rec.handoffList()), 2*(i+1); n != want {
			return nil, fmt.Errorf("%s joined and left: %d graceful handoffs of one bucket recorded so far, want %d (one per join and per leave)", name, n, want)
		}
	}
	return rec.handoffList(), nil
}

// handoffFigures returns how long each of hs took and its stages, split
// at the etcd writes the observer saw for it in keyspace ks.
func (e *controlEnv) handoffFigures(ks string, hs []handoff) ([]time.Duration, HandoffStages) {
	var times, toRecord, toGrant, toAcquire []time.Duration
	for _, h := range hs {
		times = append(times, h.acquired.Sub(h.released))
		if rw, gw, ok := e.obs.handoffWrites(ks, h); ok {
			toRecord = append(toRecord, rw.Sub(h.released))
			toGrant = append(toGrant, gw.Sub(rw))
			toAcquire = append(toAcquire, h.acquired.Sub(gw))
		}
	}
	return times, HandoffStages{Traced: len(toRecord), ReleaseToRecord: stageOf(toRecord), RecordToGrant: stageOf(toGrant), GrantToAcquire: stageOf(toAcquire)}
}

// scaleout measures a fourth worker joining three, e.runs times; between
// runs it leaves again.
func (e *controlEnv) scaleout(ctx context.Context, rep *ControlReport) error {
	sz, runs := e.sz, e.runs
	rt, err := e.router(ctx, ksScaleout)
	if err != nil {
		return err
	}
	rec := newRecorder(sz.scaleoutBuckets)
	base := []string{"s1", "s2", "s3"}
	for _, n := range base {
		if _, err := e.startWorker(ksScaleout, n, rec); err != nil {
			return err
		}
	}
	if err := e.settle(ctx, rt, rec, base...); err != nil {
		return err
	}
	rep.ScaleoutBuckets = sz.scaleoutBuckets
	var secs, writes, maps, grants, releases, movedN []float64
	for i := range runs {
		name := fmt.Sprintf("s4-%d", i+1)
		before := owners(rt, sz.scaleoutBuckets)
		rev0, err := e.st.Rev(ctx)
		if err != nil {
			return err
		}
		lost0, revoked0 := e.obs.damage()
		t0 := time.Now()
		w, err := e.startWorker(ksScaleout, name, rec)
		if err != nil {
			return err
		}
		if err := e.settle(ctx, rt, rec, append(slices.Clone(base), name)...); err != nil {
			return fmt.Errorf("%s joining: %w", name, err)
		}
		rev1, err := e.st.Rev(ctx)
		if err != nil {
			return err
		}
		after := owners(rt, sz.scaleoutBuckets)
		// Every bucket whose owner changed: all of them go to the new
		// worker, unless a lost release made the server revoke a session
		// meanwhile (counted in LostReleases).
		var moved []int
		for b := range after {
			if after[b] != before[b] {
				moved = append(moved, b)
			}
		}
		last, ok := rec.lastAcquire(moved, t0)
		if !ok || len(moved) == 0 {
			return fmt.Errorf("%s joining: %d buckets moved, not all acquired since its join", name, len(moved))
		}
		wc := e.obs.writes(ksScaleout, rev0, rev1)
		s := last.Sub(t0).Seconds()
		secs = append(secs, s)
		writes = append(writes, float64(rev1-rev0))
		maps = append(maps, float64(wc.maps))
		grants = append(grants, float64(wc.grants))
		releases = append(releases, float64(wc.releases))
		movedN = append(movedN, float64(len(moved)))
		rep.ScaleoutRunsS = append(rep.ScaleoutRunsS, s)
		e.say("scale-out %d/%d: %d buckets, a 4th worker joins 3: %d moved, all acquired %.3f s after its join; %d etcd revisions (%d map, %d grant, %d release writes)%s",
			i+1, runs, sz.scaleoutBuckets, len(moved), s, rev1-rev0, wc.maps, wc.grants, wc.releases, e.obs.damageSince(lost0, revoked0))
		if i == runs-1 {
			break
		}
		if err := e.leave(ctx, w); err != nil {
			return err
		}
		if err := e.settle(ctx, rt, rec, base...); err != nil {
			return fmt.Errorf("%s leaving: %w", name, err)
		}
	}
	rep.ScaleoutS = medianOf(secs)
	rep.ScaleoutMovedBuckets = int(math.Round(medianOf(movedN)))
	rep.ScaleoutEtcdWrites = int64(math.Round(medianOf(writes)))
	rep.ScaleoutMapWrites = int(math.Round(medianOf(maps)))
	rep.ScaleoutGrantWrites = int(math.Round(medianOf(grants)))
	rep.ScaleoutReleaseWrites = int(math.Round(medianOf(releases)))
	return nil
}

// crash measures the takeover of a crashed worker's buckets, e.runs times:
// three workers hold the keyspace; one stops without leaving; a new one
// joins before the next run.
func (e *controlEnv) crash(ctx context.Context, rep *ControlReport) error {
	sz, runs := e.sz, e.runs
	rt, err := e.router(ctx, ksCrash)
	if err != nil {
		return err
	}
	rec := newRecorder(sz.crashBuckets)
	live := []*benchWorker{}
	names := func() []string {
		var out []string
		for _, w := range live {
			out = append(out, w.name)
		}
		return out
	}
	for i := range 3 {
		w, err := e.startWorker(ksCrash, fmt.Sprintf("c%d", i+1), rec)
		if err != nil {
			return err
		}
		live = append(live, w)
	}
	if err := e.settle(ctx, rt, rec, names()...); err != nil {
		return err
	}
	rep.CrashBuckets, rep.LeaseTTLS = sz.crashBuckets, crashLeaseTTL.Seconds()
	var secs []float64
	for i := range runs {
		victim := live[0]
		live = live[1:]
		held := rec.held(victim.name)
		if len(held) == 0 {
			return fmt.Errorf("%s holds no bucket", victim.name)
		}
		lost0, revoked0 := e.obs.damage()
		t0 := time.Now()
		victim.kill()
		if err := e.settle(ctx, rt, rec, names()...); err != nil {
			return fmt.Errorf("after %s crashed: %w", victim.name, err)
		}
		<-victim.done
		last, ok := rec.lastAcquire(held, t0)
		if !ok {
			return fmt.Errorf("after %s crashed: not all of its %d buckets were acquired again", victim.name, len(held))
		}
		s := last.Sub(t0).Seconds()
		secs = append(secs, s)
		rep.CrashTakeoverRunsS = append(rep.CrashTakeoverRunsS, s)
		e.say("crash %d/%d: %s stopped without leaving, holding %d of %d buckets: all acquired by the others %.3f s later (lease TTL %v)%s",
			i+1, runs, victim.name, len(held), sz.crashBuckets, s, crashLeaseTTL, e.obs.damageSince(lost0, revoked0))
		if i == runs-1 {
			break
		}
		w, err := e.startWorker(ksCrash, fmt.Sprintf("c%d", i+4), rec)
		if err != nil {
			return err
		}
		live = append(live, w)
		if err := e.settle(ctx, rt, rec, names()...); err != nil {
			return err
		}
	}
	rep.CrashTakeoverS = medianOf(secs)
	return nil
}

// watchFanout measures how fast watchRouters routers, each on its own
// Client, follow new maps of one keyspace.
func (e *controlEnv) watchFanout(ctx context.Context, rep *ControlReport) (err error) {
	sz := e.sz
	rt, err := e.router(ctx, ksWatch)
	if err != nil {
		return err
	}
	rec := newRecorder(sz.watchBuckets)
	for _, name := range []string{"f1", "f2"} {
		if _, err := e.startWorker(ksWatch, name, rec); err != nil {
			return err
		}
	}
	if err := e.settle(ctx, rt, rec, "f1", "f2"); err != nil {
		return err
	}

	wctx, stopWatching := context.WithCancel(ctx)
	var watching sync.WaitGroup
	watchers := make([]*watcher, 0, sz.watchRouters)
	defer func() {
		stopWatching()
		watching.Wait()
		for _, w := range watchers {
			w.r.Close()
			w.c.Close()
		}
	}()
	for range sz.watchRouters {
		c, err := client.Dial(e.url, client.Logger(e.log))
		if err != nil {
			return err
		}
		r, err := client.NewRouter(c, ksWatch, client.Logger(e.log))
		if err == nil {
			err = r.Start(ctx) // closes r if it fails
		}
		if err != nil {
			c.Close()
			return err
		}
		w := &watcher{c: c, r: r}
		watchers = append(watchers, w)
		watching.Add(1)
		go func() { // exits when stopWatching is called
			defer watching.Done()
			w.follow(wctx)
		}()
	}

	// One join and leave, not measured, so that every router's stream is
	// up before the measured epochs; then the measured cycles.
	cycle := func(name string) error {
		w, err := e.startWorker(ksWatch, name, rec)
		if err != nil {
			return err
		}
		if err := e.settle(ctx, rt, rec, "f1", "f2", name); err != nil {
			return fmt.Errorf("%s joining: %w", name, err)
		}
		if err := e.leave(ctx, w); err != nil {
			return err
		}
		if err := e.settle(ctx, rt, rec, "f1", "f2"); err != nil {
			return fmt.Errorf("%s leaving: %w", name, err)
		}
		return nil
	}
	if err := cycle("f3-warmup"); err != nil {
		return err
	}
	if err := waitRouters(ctx, watchers, rt.Epoch()); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	startEpoch := rt.Epoch()
	for i := range sz.watchCycles {
		if err := cycle(fmt.Sprintf("f3-%d", i+1)); err != nil {
			return err
		}
	}
	epochs := e.obs.mapEpochs(ksWatch, startEpoch)
	if len(epochs) == 0 {
		return fmt.Errorf("no new map epoch after %d after %d join/leave cycles", startEpoch, sz.watchCycles)
	}
	final := epochs[len(epochs)-1].epoch
	_ = waitRouters(ctx, watchers, final) // missing ones are counted below

	var delays []time.Duration
	missed := 0
	for _, ep := range epochs {
		ref := ep.at
		seen := make([]time.Time, len(watchers))
		for i, w := range watchers {
			t, ok := w.reached(ep.epoch)
			if !ok {
				missed++
				continue
			}
			seen[i] = t
			if t.Before(ref) {
				ref = t
			}
		}
		for _, t := range seen {
			if !t.IsZero() {
				delays = append(delays, t.Sub(ref))
			}
		}
	}
	if len(delays) == 0 {
		return errors.New("no router reached any new epoch")
	}
	rep.WatchRouters, rep.WatchEpochs, rep.WatchMissed = sz.watchRouters, len(epochs), missed
	rep.WatchFanoutP50Ms, rep.WatchFanoutP99Ms, rep.WatchFanoutMaxMs = percentileMs(delays, 50), percentileMs(delays, 99), percentileMs(delays, 100)
	e.say("watch fan-out: %d routers, %d new epochs (%d join/leave cycles): epoch written → router has it p50 %.1f ms, p99 %.1f ms, max %.1f ms; %d missed",
		sz.watchRouters, len(epochs), sz.watchCycles, rep.WatchFanoutP50Ms, rep.WatchFanoutP99Ms, rep.WatchFanoutMaxMs, missed)
	return nil
}

// watcher is one router of the fan-out and the times its epoch changed.
type watcher struct {
	c *client.Client
	r *client.Router

	mu   sync.Mutex
	seen []epochAt // rising epochs
}

type epochAt struct {
	epoch uint64
	at    time.Time
}

// follow records every epoch the router reaches until ctx ends.
func (w *watcher) follow(ctx context.Context) {
	for {
		e := w.r.Epoch()
		now := time.Now()
		w.mu.Lock()
		if n := len(w.seen); n == 0 || w.seen[n-1].epoch < e {
			w.seen = append(w.seen, epochAt{e, now})
		}
		w.mu.Unlock()
		if err := w.r.WaitEpoch(ctx, e+1); err != nil {
			return
		}
	}
}

// reached returns when the router's epoch first reached e or beyond.
func (w *watcher) reached(e uint64) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.seen {
		if s.epoch >= e {
			return s.at, true
		}
	}
	return time.Time{}, false
}

// waitRouters waits up to 10 s for every router to reach epoch e.
func waitRouters(ctx context.Context, ws []*watcher, e uint64) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, w := range ws {
		if err := w.r.WaitEpoch(ctx, e); err != nil {
			return fmt.Errorf("a router did not reach epoch %d (it has %d): %w", e, w.r.Epoch(), err)
		}
	}
	return nil
}

// etcdObserver records every write under Keyshard's prefix as seen on an
// etcd watch of its own: which revision wrote which kind of key, when each
// map epoch arrived, when each bucket entered a release record or a
// grant; and from that it finds releases the server lost.
type etcdObserver struct {
	mu      sync.Mutex
	changes []observed
	resyncs int
	// The grant and release records of every member ("ks/id"); reset at
	// a resync.
	grants, releases map[string]map[int]uint64
	// dropped: pairs a later release record left out while the member
	// still held them. They are lost unless a grant write then moves the
	// bucket (the leader had acted on the earlier record).
	dropped       map[string]map[int]uint64
	lost, revoked int
	// Per keyspace and bucket: when it entered a release record, and when
	// it entered a member's grants at a new token.
	releasedAt, grantedAt map[string]map[int][]time.Time
}

type observed struct {
	rev      int64
	at       time.Time
	kind     store.Kind
	keyspace string
	epoch    uint64 // for maps
}

func (o *etcdObserver) run(updates <-chan store.Update) {
	for u := range updates {
		now := time.Now()
		o.mu.Lock()
		if u.Resync != nil {
			o.resyncs++ // the changes since the last update are lost
			o.grants, o.releases, o.dropped = nil, nil, nil
		}
		for _, c := range u.Changes {
			ob := observed{rev: c.ModRevision, at: now, kind: c.Kind, keyspace: c.Keyspace}
			if m, ok := c.Value.(shard.Map); ok && !c.Deleted {
				ob.epoch = m.Epoch
			}
			o.changes = append(o.changes, ob)
			o.audit(c, now)
		}
		o.mu.Unlock()
	}
}

// audit follows grant and release records. o.mu is held.
func (o *etcdObserver) audit(c store.Change, now time.Time) {
	if o.grants == nil {
		o.grants, o.releases, o.dropped = map[string]map[int]uint64{}, map[string]map[int]uint64{}, map[string]map[int]uint64{}
		o.releasedAt, o.grantedAt = map[string]map[int][]time.Time{}, map[string]map[int][]time.Time{}
	}
	member := c.Keyspace + "/" + c.ID
	pairs := func(bts []shard.BucketToken) map[int]uint64 {
		m := make(map[int]uint64, len(bts))
		for _, bt := range bts {
			m[bt.Bucket] = bt.Token
		}
		return m
	}
	mark := func(at map[string]map[int][]time.Time, b int) {
		if at[c.Keyspace] == nil {
			at[c.Keyspace] = map[int][]time.Time{}
		}
		at[c.Keyspace][b] = append(at[c.Keyspace][b], now)
	}
	switch v := c.Value.(type) {
	case shard.Grants:
		next, prev := pairs(v.Buckets), o.grants[member]
		for b, t := range next {
			if prev[b] != t {
				mark(o.grantedAt, b)
			}
		}
		for b, t := range o.dropped[member] {
			if next[b] != t {
				delete(o.dropped[member], b) // moved on the earlier record
			}
		}
		o.grants[member] = next
	case shard.Releases:
		next, prev, held := pairs(v.Buckets), o.releases[member], o.grants[member]
		for b, t := range next {
			if prev[b] != t {
				mark(o.releasedAt, b)
			}
			if o.dropped[member][b] == t {
				delete(o.dropped[member], b)
			}
		}
		for b, t := range prev {
			if next[b] != t && held[b] == t {
				if o.dropped[member] == nil {
					o.dropped[member] = map[int]uint64{}
				}
				o.dropped[member][b] = t
			}
		}
		o.releases[member] = next
	case shard.Quarantine:
		o.revoked++
	}
	if c.Deleted {
		switch c.Kind {
		case store.KindGrants: // the session ended holding them
			o.lost += len(o.dropped[member])
			delete(o.dropped, member)
			delete(o.grants, member)
		case store.KindReleases:
			delete(o.releases, member)
		}
	}
}

// damage returns the releases lost so far (including those still held)
// and the sessions revoked with buckets quarantined.
func (o *etcdObserver) damage() (lost, revoked int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	lost = o.lost
	for _, d := range o.dropped {
		lost += len(d)
	}
	return lost, o.revoked
}

// damageSince describes the damage since damage returned lost0 and
// revoked0, for a progress line ("" if none).
func (o *etcdObserver) damageSince(lost0, revoked0 int) string {
	lost, revoked := o.damage()
	if lost == lost0 && revoked == revoked0 {
		return ""
	}
	return fmt.Sprintf(" [the server lost %d releases; %d sessions revoked]", lost-lost0, revoked-revoked0)
}

// handoffWrites returns when h's bucket entered a release record and then
// a grant, between h's release and acquire.
func (o *etcdObserver) handoffWrites(ks string, h handoff) (record, grant time.Time, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	first := func(ts []time.Time, from time.Time) (time.Time, bool) {
		for _, t := range ts {
			if !t.Before(from) && !t.After(h.acquired) {
				return t, true
			}
		}
		return time.Time{}, false
	}
	record, ok = first(o.releasedAt[ks][h.bucket], h.released)
	if !ok {
		return
	}
	grant, ok = first(o.grantedAt[ks][h.bucket], record)
	return
}

func (o *etcdObserver) resyncCount() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.resyncs
}

// writeCount is the number of distinct revisions that wrote each kind of
// key of a keyspace.
type writeCount struct{ maps, grants, releases int }

// writes counts the revisions in (from, to] that wrote keys of keyspace
// ks, by kind.
func (o *etcdObserver) writes(ks string, from, to int64) writeCount {
	o.mu.Lock()
	defer o.mu.Unlock()
	seen := map[store.Kind]map[int64]bool{}
	for _, c := range o.changes {
		if c.keyspace != ks || c.rev <= from || c.rev > to {
			continue
		}
		if seen[c.kind] == nil {
			seen[c.kind] = map[int64]bool{}
		}
		seen[c.kind][c.rev] = true
	}
	return writeCount{maps: len(seen[store.KindMap]), grants: len(seen[store.KindGrants]), releases: len(seen[store.KindReleases])}
}

// mapEpochs returns the map epochs of ks above after, in order, with when
// each was seen.
func (o *etcdObserver) mapEpochs(ks string, after uint64) []epochAt {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []epochAt
	for _, c := range o.changes {
		if c.keyspace == ks && c.kind == store.KindMap && c.epoch > after {
			out = append(out, epochAt{c.epoch, c.at})
		}
	}
	return out
}

// ratio is a / b, rounded to two decimals; 0 if b is not positive.
func ratio(a, b float64) float64 {
	if !(b > 0) {
		return 0
	}
	return math.Round(a/b*100) / 100
}

// percentileMs returns the p-th percentile (nearest rank) of ds in
// milliseconds; p 100 is the maximum.
func percentileMs(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return math.NaN()
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	i := int(math.Ceil(p/100*float64(len(ds)))) - 1
	i = min(max(i, 0), len(ds)-1)
	return float64(ds[i].Microseconds()) / 1e3
}
