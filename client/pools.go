package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/clock"
	"github.com/keyshard/keyshard/placement"
)

// Limits of tenant pools' calls, as the server enforces them.
const (
	// MaxPoolBatch is the most tenants one MarkReady call carries, and the
	// most counts one load report carries; PoolMember.MarkReady and
	// LoadReporter split larger batches into several calls.
	MaxPoolBatch = 10000
	// MaxTenantLen is the longest tenant id, in bytes.
	MaxTenantLen = 256
)

type poolOptions struct {
	clock    clock.Clock
	log      *slog.Logger
	onEvent  func(PoolEvent)
	interval time.Duration
	replace  bool
}

type poolOpt func(*poolOptions)

func (f poolOpt) applyPool(o *poolOptions) { f(o) }

// OnPoolEvent sets a function called with every PoolEvent of a
// PoolFollower, PoolMember or LoadReporter. Calls are serialized, made
// from the type's own goroutine (or from Close), and must not block.
func OnPoolEvent(f func(PoolEvent)) PoolOption {
	return poolOpt(func(o *poolOptions) { o.onEvent = f })
}

// ReportInterval sets the time between two load reports of a
// LoadReporter (default DefaultReportInterval). Other types ignore it.
func ReportInterval(d time.Duration) PoolOption {
	return poolOpt(func(o *poolOptions) { o.interval = d })
}

// ReplaceMember makes JoinPool take over the member id from a session
// that is still alive (a restarted process): the old session ends at
// once. Without it, JoinPool fails with ErrExists while that session
// lives. Re-joins after a lost session always replace. Other types ignore
// it.
func ReplaceMember(replace bool) PoolOption {
	return poolOpt(func(o *poolOptions) { o.replace = replace })
}

func newPoolOptions(c *Client, opts []PoolOption) poolOptions {
	o := poolOptions{clock: c.opts.clock, log: c.opts.log}
	for _, opt := range opts {
		if opt != nil {
			opt.applyPool(&o)
		}
	}
	return o
}

// PoolEventKind says what happened to a PoolFollower, PoolMember or
// LoadReporter.
type PoolEventKind int

const (
	// PoolUpdated: the follower installed a newer snapshot (Version).
	PoolUpdated PoolEventKind = iota + 1
	// PoolStale: the follower lost the control plane (Err says how); it
	// keeps answering from snapshot Version and retries by itself.
	PoolStale
	// PoolRecovered: the follower reached the control plane again.
	PoolRecovered
	// PoolJoined: the member's session started (Session), at JoinPool or
	// at a re-join after a lost session.
	PoolJoined
	// PoolSessionLost: the member's session ended without Leave (Err):
	// the server answered not found, or no keep-alive was answered for
	// the lease TTL. The member re-joins by itself.
	PoolSessionLost
	// PoolReportDropped: a load report was given up (Err says why) and
	// Dropped requests were not counted by the control plane.
	PoolReportDropped
	// PoolReported: a load report call ended (Seq): Err is nil if the
	// control plane took it (counted, or recognized as a replay), else
	// why it failed (the report is retried, or dropped with a
	// PoolReportDropped event).
	PoolReported
	// PoolDraining: the member's Leave is draining it (Tenants still list
	// it; Until, once set, is when the last stops reading it), at the
	// start of the drain and at each change of Tenants.
	PoolDraining
	// PoolLeft: Leave ended the member's session (Session): Err is nil
	// after a full drain, else why it ended before (reads of data only
	// the member held may miss).
	PoolLeft
)

func (k PoolEventKind) String() string {
	switch k {
	case PoolUpdated:
		return "updated"
	case PoolStale:
		return "stale"
	case PoolRecovered:
		return "recovered"
	case PoolJoined:
		return "joined"
	case PoolSessionLost:
		return "session lost"
	case PoolReportDropped:
		return "report dropped"
	case PoolReported:
		return "reported"
	case PoolDraining:
		return "draining"
	case PoolLeft:
		return "left"
	}
	return fmt.Sprintf("PoolEventKind(%d)", int(k))
}

// PoolEvent is something that happened to a PoolFollower, PoolMember or
// LoadReporter (see OnPoolEvent).
type PoolEvent struct {
	Kind PoolEventKind
	Pool string
	// Version is the snapshot version held (follower events).
	Version uint64
	// Session is the member's session (PoolJoined, PoolSessionLost,
	// PoolDraining, PoolLeft).
	Session string
	// Err says why, for PoolStale, PoolSessionLost, PoolReportDropped,
	// PoolLeft.
	Err error
	// Tenants is the number of tenants of the snapshot that still list
	// the member, in their subset or as a read target (PoolDraining,
	// PoolLeft).
	Tenants int
	// Until is when the last of them stops reading the member, by the
	// snapshot (PoolDraining once the member is in no subset; else zero).
	Until time.Time
	// Dropped is the sum of the counts dropped (PoolReportDropped).
	Dropped int64
	// Seq is the load report's number (PoolReported, PoolReportDropped).
	Seq uint64
}

// emitter serializes the calls of an OnPoolEvent function.
type emitter struct {
	mu sync.Mutex
	f  func(PoolEvent)
}

func (e *emitter) emit(ev PoolEvent) {
	if e == nil || e.f == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.f(ev)
}

// PoolFollower answers which members serve a tenant of a tenant pool, from
// a local copy of the pool's snapshot that it keeps current in the
// background: Targets for a client (which members to read a tenant from),
// Serves and Tenants for a server (which tenants to prefetch). Both sides
// reading the same snapshot version get the same answers, which are the
// answers the control plane gives.
//
// It follows the WatchPoolSnapshot stream (a full snapshot, then the
// tenants that changed), reconnecting with capped exponential backoff and
// falling back to GetPoolSnapshot long polls when the stream keeps
// failing, across the Client's replicas. While it cannot reach the
// control plane it keeps answering from the last snapshot, says so
// (Stale, a PoolStale event and a warning in the log), and recovers by
// itself.
//
// Lookups read an immutable snapshot through an atomic pointer: they take
// no lock, and Targets of a tenant the snapshot lists does not allocate.
// Its methods are safe for concurrent use. Close it when done.
type PoolFollower struct {
	c     *Client
	pool  string
	clock clock.Clock
	log   *slog.Logger
	ev    *emitter

	cur   atomic.Pointer[poolSnap]
	ready chan struct{} // closed once the first snapshot is installed
	life  *lifecycle
	own   sync.WaitGroup

	mu         sync.Mutex
	staleSince time.Time
	lastErr    error // the newest failure (kept after recovery, for Stale's callers)
	runErr     error
}

// FollowPool returns a PoolFollower of tenant pool pool, once it holds the
// pool's snapshot. It follows the snapshot from a goroutine of its own
// until Close or the Client's Close; ctx bounds only the wait for the
// first snapshot. It takes the options Clock, Logger and OnPoolEvent.
//
// It returns an *ArgError (wrapping ErrInvalid) for a bad pool name; an
// error wrapping ErrNotFound if the pool does not exist,
// ErrUnauthenticated or ErrPermissionDenied if the token is refused; or
// ctx's error (with the last failure) if the control plane could not be
// reached in time.
func (c *Client) FollowPool(ctx context.Context, pool string, opts ...PoolOption) (*PoolFollower, error) {
	if err := validName("Client.FollowPool", "pool name", pool); err != nil {
		return nil, err
	}
	o := newPoolOptions(c, opts)
	return c.followPool(ctx, pool, o, &emitter{f: o.onEvent})
}

// followPool is FollowPool with the options applied and the emitter
// given (a PoolMember shares its own with its follower).
func (c *Client) followPool(ctx context.Context, pool string, o poolOptions, ev *emitter) (*PoolFollower, error) {
	f := &PoolFollower{
		c: c, pool: pool, clock: o.clock, log: o.log.With("tenant_pool", pool),
		ev:    ev,
		ready: make(chan struct{}),
		life:  newLifecycle("PoolFollower"),
	}
	f.cur.Store(&poolSnap{tenants: map[string]*poolTenant{}, byMem: map[string][]string{}, next: make(chan struct{})})
	runCtx, end, err := f.life.begin(context.Background(), c)
	if err != nil {
		return nil, err
	}
	f.own.Go(func() { f.run(runCtx, end) })
	if err := f.waitReady(ctx); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func (f *PoolFollower) run(ctx context.Context, end func()) {
	defer end()
	err := f.load(ctx)
	if err == nil {
		err = f.follow(ctx)
	}
	err = f.life.result(context.Background(), f.c, err)
	f.mu.Lock()
	f.runErr = err
	f.mu.Unlock()
}

func (f *PoolFollower) waitReady(ctx context.Context) error {
	select {
	case <-f.ready:
		return nil
	case <-f.life.done:
	case <-ctx.Done():
	}
	select {
	case <-f.ready:
		return nil
	default:
	}
	f.mu.Lock()
	runErr, lastErr := f.runErr, f.lastErr
	f.mu.Unlock()
	select {
	case <-f.life.done:
		if runErr == nil {
			runErr = ErrClosed
		}
		return fmt.Errorf("follow tenant pool %q: %w", f.pool, runErr)
	default:
	}
	if lastErr != nil {
		return fmt.Errorf("follow tenant pool %q: no snapshot yet: %w (last attempt: %w)", f.pool, ctx.Err(), lastErr)
	}
	return fmt.Errorf("follow tenant pool %q: no snapshot yet: %w", f.pool, ctx.Err())
}

// load reads the current snapshot (GetPoolSnapshot without waiting),
// retrying failures that may pass. It returns nil once loaded or ctx
// ended, or an error that retrying cannot fix.
func (f *PoolFollower) load(ctx context.Context) error {
	var b backoff
	for {
		resp, err := call(ctx, f.c, poolAPI.GetPoolSnapshot, &keyshardv1.GetPoolSnapshotRequest{Pool: f.pool, Wait: durationpb.New(0)})
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil:
			if err := f.install(resp.GetSnapshot()); err != nil {
				return fmt.Errorf("tenant pool %q: the server sent a bad snapshot: %w", f.pool, err)
			}
			f.contact()
			close(f.ready)
			return nil
		case permanent(err, false):
			return fmt.Errorf("tenant pool %q: get snapshot: %w", f.pool, err)
		}
		f.failed(err)
		if !clock.Sleep(ctx, f.clock, b.next()) {
			return nil
		}
	}
}

// follow keeps the snapshot current until ctx ends.
func (f *PoolFollower) follow(ctx context.Context) error {
	fl := follower[keyshardv1.PoolSnapshot]{
		clock: f.clock,
		log:   f.log,
		what:  "tenant pool snapshot",
		watch: f.watch,
		poll: func(ctx context.Context) (*keyshardv1.PoolSnapshot, bool, error) {
			req := &keyshardv1.GetPoolSnapshotRequest{Pool: f.pool, SinceVersion: f.cur.Load().version, Wait: durationpb.New(pollWait)}
			resp, err := callWithin(ctx, f.c, poolAPI.GetPoolSnapshot, req, budget{wait: pollWait})
			if err != nil {
				if ctx.Err() == nil {
					f.failed(err)
				}
				return nil, false, err
			}
			f.contact()
			return resp.GetSnapshot(), resp.GetChanged(), nil
		},
		apply: func(m *keyshardv1.PoolSnapshot) {
			if err := f.install(m); err != nil {
				f.log.Error("keyshard: ignoring a bad tenant pool snapshot", "version", m.GetVersion(), "err", err)
			}
		},
		fatal: func(err error) bool { return errors.Is(err, ErrClosed) },
	}
	return fl.run(ctx)
}

// errNoFirstSnapshot ends a watch whose full snapshot did not come in
// time: the replica holds the stream without answering.
var errNoFirstSnapshot = errors.New("no snapshot in time")

// watch opens one WatchPoolSnapshot stream from version 0, so that the
// server answers at once with the full snapshot (which proves the stream
// alive), and applies its messages. With several replicas, a stream whose
// first message does not come within ReplicaTimeout is abandoned as
// unavailable.
func (f *PoolFollower) watch(ctx context.Context, yield func(*keyshardv1.PoolSnapshot)) error {
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopTimer := func() {}
	if len(f.c.eps) > 1 { // as for calls: with one replica, nothing to move to
		t := f.clock.AfterFunc(f.c.opts.replicaTimeout, func() { cancel(errNoFirstSnapshot) })
		stopTimer = func() { t.Stop() }
	}
	defer stopTimer()
	first := true
	var bad error
	var streamVer uint64 // the version of the stream's previous message, which a delta applies to
	err := stream(sctx, f.c, poolAPI.WatchPoolSnapshot, &keyshardv1.WatchPoolSnapshotRequest{Pool: f.pool}, func(m *keyshardv1.PoolSnapshot) {
		if bad != nil {
			return
		}
		if first {
			stopTimer()
			first = false
			if !m.GetFull() {
				bad = errors.New("the stream's first message is not a full snapshot")
				cancel(bad)
				return
			}
		}
		if held := f.cur.Load().version; !m.GetFull() && m.GetVersion() > held && streamVer != held {
			// The stream's base is not the snapshot held (it was behind
			// it, then skipped past it): read it whole again.
			bad = fmt.Errorf("a delta from version %d onto version %d held", streamVer, held)
			cancel(bad)
			return
		}
		streamVer = m.GetVersion()
		f.contact()
		yield(m)
	})
	switch {
	case ctx.Err() != nil:
		return err
	case bad != nil: // resynchronize: not an outage
		return fmt.Errorf("%w: tenant pool %q: %w", ErrUnavailable, f.pool, bad)
	case errors.Is(context.Cause(sctx), errNoFirstSnapshot):
		err = fmt.Errorf("%w: tenant pool %q: the stream brought no snapshot within %v", ErrUnavailable, f.pool, f.c.opts.replicaTimeout)
	case err == nil:
		err = fmt.Errorf("%w: tenant pool %q: the server ended the stream", ErrUnavailable, f.pool)
	}
	f.failed(err)
	return err
}

// install applies m to the snapshot held, if it is newer (a delta applies
// to the snapshot held). Only the follower's goroutine calls it.
func (f *PoolFollower) install(m *keyshardv1.PoolSnapshot) error {
	if m == nil {
		return errors.New("no snapshot")
	}
	if p := m.GetPool(); p != "" && p != f.pool {
		return fmt.Errorf("snapshot of pool %q", p)
	}
	old := f.cur.Load()
	isFirst := !isClosedChan(f.ready)
	if !isFirst && m.GetVersion() <= old.version {
		return nil
	}
	if isFirst && !m.GetFull() {
		return errors.New("a delta before any full snapshot")
	}
	s, err := buildPoolSnap(old, m)
	if err != nil {
		return err
	}
	f.cur.Store(s)
	close(old.next)
	f.ev.emit(PoolEvent{Kind: PoolUpdated, Pool: f.pool, Version: s.version})
	return nil
}

func isClosedChan(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// contact records an answer of the control plane: the follower is not
// stale any more.
func (f *PoolFollower) contact() {
	f.mu.Lock()
	was := f.staleSince
	f.staleSince = time.Time{}
	f.mu.Unlock()
	if !was.IsZero() {
		v := f.cur.Load().version
		f.log.Info("keyshard: tenant pool control plane reachable again", "version", v, "stale_for", f.clock.Since(was))
		f.ev.emit(PoolEvent{Kind: PoolRecovered, Pool: f.pool, Version: v})
	}
}

// failed records a failed watch or poll: the follower is stale from now
// on, if it was not.
func (f *PoolFollower) failed(err error) {
	if err == nil || errors.Is(err, ErrClosed) {
		return
	}
	now := f.clock.Now()
	f.mu.Lock()
	first := f.staleSince.IsZero()
	if first {
		f.staleSince = now
	}
	f.lastErr = err
	f.mu.Unlock()
	if first {
		v := f.cur.Load().version
		f.log.Warn("keyshard: cannot reach the control plane; answering from the last tenant pool snapshot", "version", v, "err", err)
		f.ev.emit(PoolEvent{Kind: PoolStale, Pool: f.pool, Version: v, Err: err})
	}
}

// Stale reports whether the follower has lost the control plane: since
// when (zero if it has not: its last watch or poll succeeded) and the
// error of the newest failure. While stale it answers from the snapshot
// of Version, which may be out of date.
func (f *PoolFollower) Stale() (since time.Time, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.staleSince.IsZero() {
		return time.Time{}, nil
	}
	return f.staleSince, f.lastErr
}

// Pool returns the pool's name.
func (f *PoolFollower) Pool() string { return f.pool }

// Version returns the version of the snapshot held.
func (f *PoolFollower) Version() uint64 { return f.cur.Load().version }

// Changed returns a channel closed when the snapshot held is replaced by
// a newer one; call it again then for the next change.
func (f *PoolFollower) Changed() <-chan struct{} { return f.cur.Load().next }

// WaitVersion blocks until the snapshot held has reached version v, ctx
// ends (returning ctx.Err()), or the follower stopped (ErrClosed).
func (f *PoolFollower) WaitVersion(ctx context.Context, v uint64) error {
	for {
		s := f.cur.Load()
		if s.version >= v {
			return nil
		}
		select {
		case <-s.next:
		case <-ctx.Done():
			return ctx.Err()
		case <-f.life.done:
			return ErrClosed
		}
	}
}

// Targets returns the members to read tenant from now, by the follower's
// clock, sorted: the snapshot's read targets of the tenant at now (its
// TargetSpan whose from is the last at or before now), or, for a tenant
// the snapshot does not list, placement.Subset of the snapshot's members
// at the pool's initial size for the tenant (its min size, or its fixed
// size), as the control plane computes it. The slice of a listed tenant
// belongs to the snapshot (do not modify it) and costs no allocation; the
// subset of an unlisted tenant is computed at each call. nil for an empty
// tenant.
func (f *PoolFollower) Targets(tenant string) []string {
	return f.cur.Load().targets(tenant, f.clock.Now())
}

// TargetsAt is Targets at time now.
func (f *PoolFollower) TargetsAt(tenant string, now time.Time) []string {
	return f.cur.Load().targets(tenant, now)
}

// Serves reports whether member serves tenant: it is in the tenant's
// subset (ready or not: it should load the tenant's data), or was removed
// from it within the lookback. For a tenant the snapshot does not list:
// whether member is in its stateless subset (see Targets). Every member
// Targets returns, at any time, serves the tenant.
func (f *PoolFollower) Serves(member, tenant string) bool {
	return f.cur.Load().serves(member, tenant)
}

// Tenants returns the tenants of the snapshot that member serves, sorted.
// The slice belongs to the snapshot: do not modify it. Tenants the
// snapshot does not list cannot be enumerated; ask Serves for them.
func (f *PoolFollower) Tenants(member string) []string { return f.cur.Load().byMem[member] }

// Known reports whether the snapshot lists tenant.
func (f *PoolFollower) Known(tenant string) bool { _, ok := f.cur.Load().tenants[tenant]; return ok }

// Members returns the pool's members as the snapshot placed them, sorted
// by id.
func (f *PoolFollower) Members() []Member {
	s := f.cur.Load()
	out := make([]Member, len(s.raw))
	for i, m := range s.raw {
		out[i] = memberFromProto(m)
	}
	return out
}

// Close stops following the snapshot and waits for the follower's
// goroutine. Lookups keep answering from the last snapshot. Close is
// idempotent and returns nil.
func (f *PoolFollower) Close() error {
	if f.life.close() {
		f.life.stop()
	}
	f.own.Wait()
	return nil
}

// --- the local snapshot ---

// poolSnap is one immutable version of a pool's snapshot, with the
// answers precomputed.
type poolSnap struct {
	version uint64
	policy  poolPolicy
	raw     []*keyshardv1.Member
	members []placement.Member // sorted; weight 0: draining; zones blanked unless zone-aware
	zones   int                // distinct zones of the members of weight > 0 (1 unless zone-aware)
	tenants map[string]*poolTenant
	byMem   map[string][]string // member -> tenants it serves, sorted
	next    chan struct{}       // closed when a newer snapshot replaces this one
}

type poolTenant struct {
	spans  []poolSpan // sorted by from; the first from is math.MinInt64 if unset
	serves []string   // members and removed members, sorted
	// removed are the removed members with when they left (unix ns): one
	// that no span reads is served for the lookback from then on, for
	// clients a version behind.
	removed []poolRemoval
}

type poolRemoval struct {
	member string
	at     int64 // unix ns
}

type poolSpan struct {
	from    int64 // unix ns
	targets []string
}

// poolPolicy is what the SDK needs of a TenantPoolPolicy: the initial size
// of an unlisted tenant.
type poolPolicy struct {
	min, max  int
	zoneAware bool
	lookback  time.Duration
	overrides map[string]*keyshardv1.TenantOverride
}

func (s *poolSnap) targets(tenant string, now time.Time) []string {
	t, ok := s.tenants[tenant]
	if !ok {
		return s.fallback(tenant)
	}
	vs := t.spans
	if len(vs) == 0 {
		return nil
	}
	n := now.UnixNano()
	i := len(vs) - 1
	for i > 0 && vs[i].from > n {
		i--
	}
	return vs[i].targets
}

func (s *poolSnap) serves(member, tenant string) bool {
	t, ok := s.tenants[tenant]
	if !ok {
		return slices.Contains(s.fallback(tenant), member)
	}
	_, found := slices.BinarySearch(t.serves, member)
	return found
}

// drained reports whether member may stop: the snapshot places it with
// weight 0 or not at all, and no tenant lists it.
func (s *poolSnap) drained(member string) bool {
	if len(s.byMem[member]) > 0 {
		return false
	}
	i, ok := slices.BinarySearchFunc(s.members, member, func(m placement.Member, id string) int { return strings.Compare(m.ID, id) })
	return !ok || s.members[i].Weight == 0
}

// readUntil is when the last tenant that lists member stops reading it,
// by the snapshot's spans, or by the lookback for a removed member no
// span reads (removed before it was read: clients a version behind may
// still read it); zero if one reads it with no end (it is in a subset) or
// none reads it. The control plane's LeavePool answers the same.
func (s *poolSnap) readUntil(member string) time.Time {
	var end int64 = math.MinInt64
	for _, id := range s.byMem[member] {
		t := s.tenants[id]
		spans := t.spans
		last := -1
		for i, sp := range spans {
			if _, ok := slices.BinarySearch(sp.targets, member); ok {
				last = i
			}
		}
		switch {
		case last < 0:
			for _, r := range t.removed {
				if r.member == member {
					end = max(end, r.at+int64(s.policy.lookback))
				}
			}
		case last == len(spans)-1:
			return time.Time{}
		default:
			end = max(end, spans[last+1].from)
		}
	}
	if end == math.MinInt64 {
		return time.Time{}
	}
	return time.Unix(0, end)
}

// fallback is the stateless subset of a tenant the snapshot does not
// list, as tenantpool.Snapshot computes it.
func (s *poolSnap) fallback(tenant string) []string {
	if tenant == "" {
		return nil
	}
	sub, _ := placement.Subset(tenant, s.members, s.policy.initialSize(tenant, s.zones))
	return sub
}

// initialSize is the size of a tenant nothing was measured for: its fixed
// size, or its minimum rounded up to a multiple of the zones (zone-aware
// pools), not above its maximum rounded down (but at least the zones).
func (p poolPolicy) initialSize(tenant string, zones int) int {
	lo, hi := p.min, p.max
	if o := p.overrides[tenant]; o != nil {
		if o.GetSize() > 0 {
			return int(o.GetSize())
		}
		if o.GetMinSize() > 0 {
			lo = int(o.GetMinSize())
		}
		if o.GetMaxSize() > 0 {
			hi = int(o.GetMaxSize())
		}
	}
	z := 1
	if p.zoneAware && zones > 1 {
		z = zones
	}
	lo = (max(lo, 1) + z - 1) / z * z
	if hi > 0 {
		lo = min(lo, max(hi/z*z, z))
	}
	return lo
}

// buildPoolSnap returns the snapshot m makes of prev: m's tenants alone
// if m is full, else prev's with m's changed tenants replaced and its
// removed tenants dropped. The members and the policy are m's (a message
// without a policy keeps prev's).
func buildPoolSnap(prev *poolSnap, m *keyshardv1.PoolSnapshot) (*poolSnap, error) {
	s := &poolSnap{version: m.GetVersion(), next: make(chan struct{}), policy: prev.policy}
	if pp := m.GetPolicy(); pp != nil {
		s.policy = poolPolicy{min: int(pp.GetMinSize()), max: int(pp.GetMaxSize()), zoneAware: pp.GetZoneAware(), lookback: pp.GetLookback().AsDuration(), overrides: pp.GetOverrides()}
	}
	s.raw = slices.Clone(m.GetMembers())
	slices.SortFunc(s.raw, func(a, b *keyshardv1.Member) int { return strings.Compare(a.GetId(), b.GetId()) })
	zones := map[string]bool{}
	for i, pm := range s.raw {
		if pm.GetId() == "" || (i > 0 && s.raw[i-1].GetId() == pm.GetId()) {
			return nil, fmt.Errorf("members[%d]: id %q is empty or repeated", i, pm.GetId())
		}
		w := pm.GetWeight()
		if math.IsNaN(w) || math.IsInf(w, 0) || w < 0 {
			return nil, fmt.Errorf("member %q: weight %v", pm.GetId(), w)
		}
		// Weight 0 is a draining (leaving) member: in no stateless subset,
		// as the control plane computes them.
		pm2 := placement.Member{ID: pm.GetId(), Weight: w}
		if s.policy.zoneAware {
			pm2.Zone = pm.GetZone()
			if w > 0 {
				zones[pm2.Zone] = true
			}
		}
		s.members = append(s.members, pm2)
	}
	s.zones = max(len(zones), 1)

	changed := make(map[string]*poolTenant, len(m.GetTenants()))
	for i, a := range m.GetTenants() {
		if a.GetTenant() == "" {
			return nil, fmt.Errorf("tenants[%d]: empty tenant", i)
		}
		changed[a.GetTenant()] = tenantFromProto(a)
	}
	if m.GetFull() {
		s.tenants = changed
		s.byMem = map[string][]string{}
		for _, id := range slices.Sorted(maps.Keys(s.tenants)) {
			for _, mem := range s.tenants[id].serves {
				s.byMem[mem] = append(s.byMem[mem], id)
			}
		}
		return s, nil
	}
	// A delta: copy on write.
	s.tenants = make(map[string]*poolTenant, len(prev.tenants)+len(changed))
	for id, t := range prev.tenants {
		s.tenants[id] = t
	}
	touched := map[string]bool{}
	affected := map[string]bool{}
	for _, id := range m.GetRemovedTenants() {
		if t, ok := prev.tenants[id]; ok {
			touched[id] = true
			for _, mem := range t.serves {
				affected[mem] = true
			}
			delete(s.tenants, id)
		}
	}
	for id, t := range changed {
		touched[id] = true
		if old, ok := prev.tenants[id]; ok {
			for _, mem := range old.serves {
				affected[mem] = true
			}
		}
		for _, mem := range t.serves {
			affected[mem] = true
		}
		s.tenants[id] = t
	}
	s.byMem = make(map[string][]string, len(prev.byMem))
	for mem, ts := range prev.byMem {
		if !affected[mem] {
			s.byMem[mem] = ts
		}
	}
	for mem := range affected {
		var ts []string
		for _, id := range prev.byMem[mem] {
			if !touched[id] {
				ts = append(ts, id)
			}
		}
		for id, t := range changed {
			if _, ok := slices.BinarySearch(t.serves, mem); ok {
				ts = append(ts, id)
			}
		}
		if len(ts) > 0 {
			slices.Sort(ts)
			s.byMem[mem] = ts
		}
	}
	return s, nil
}

func tenantFromProto(a *keyshardv1.TenantAssignment) *poolTenant {
	t := &poolTenant{}
	for _, p := range a.GetMembers() {
		t.serves = append(t.serves, p.GetMember())
	}
	for _, r := range a.GetRemoved() {
		t.serves = append(t.serves, r.GetMember())
		if r.GetAt() != nil {
			t.removed = append(t.removed, poolRemoval{r.GetMember(), r.GetAt().AsTime().UnixNano()})
		}
	}
	slices.Sort(t.serves)
	t.serves = slices.Compact(t.serves)
	for _, sp := range a.GetTargets() {
		from := int64(math.MinInt64)
		if sp.GetFrom() != nil {
			from = sp.GetFrom().AsTime().UnixNano()
		}
		targets := slices.Clone(sp.GetMembers())
		slices.Sort(targets)
		t.spans = append(t.spans, poolSpan{from: from, targets: targets})
	}
	slices.SortStableFunc(t.spans, func(a, b poolSpan) int { return cmp.Compare(a.from, b.from) })
	return t
}
