package demo

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/clock"
	"github.com/keyshard/keyshard/internal/kitseam"
	"github.com/keyshard/keyshard/internal/server"
	"github.com/keyshard/keyshard/keyshardtest"
)

// TenantsOptions shape a `keyshard demo --mode tenants` run. Zero values
// take the defaults.
type TenantsOptions struct {
	// Duration sets the pace (default 90s, at least 20s): the pool's
	// window is Duration/9 (at least 2s, whole seconds), its shrink
	// cooldown twice that, and the script's phases last a few windows
	// each. The run ends when the script has played, about Duration.
	Duration time.Duration
	// Out receives the running commentary (default: discard).
	Out io.Writer
	// Logger receives the server's and SDK's logs (default: discard).
	Logger *slog.Logger
}

// TenantsReport is the tenant-pool demo's own record, checked: the JSON
// object that `keyshard demo --mode tenants --json` prints last.
type TenantsReport struct {
	Pool              string  `json:"pool"`
	Tenants           int     `json:"tenants"`
	MembersStart      int     `json:"members_start"`
	MembersPeak       int     `json:"members_peak"`
	MembersEnd        int     `json:"members_end"`
	Zones             int     `json:"zones"`
	CapacityPerMember float64 `json:"capacity_per_member"`
	WindowS           float64 `json:"window_s"`
	ShrinkCooldownS   float64 `json:"shrink_cooldown_s"`
	WarmUpS           float64 `json:"warm_up_s"`
	LookbackS         float64 `json:"lookback_s"`
	// Versions counts the snapshot versions seen both by the client's
	// follower and by at least one member's follower: those checked.
	Versions int `json:"versions"`
	// VersionsClient counts the versions the client's follower installed.
	VersionsClient int `json:"versions_client"`
	// Disagreements counts (version, tenant, member) where the client's
	// targets named a member that, by its own follower at that version,
	// does not serve the tenant. Must be 0.
	Disagreements int `json:"disagreements"`
	// Reads counts the reads the clients sent to a member picked from
	// Targets; ReadsToNonServingMembers those the member, asking its own
	// follower at that moment, did not serve (must be 0);
	// ReadsWithoutTargets the reads that found no target (must be 0).
	Reads                    int64 `json:"reads"`
	ReadsToNonServingMembers int64 `json:"reads_to_non_serving_members"`
	ReadsWithoutTargets      int64 `json:"reads_without_targets"`
	// NonServingReads describes the first few such reads.
	NonServingReads []string `json:"non_serving_reads,omitempty"`
	// MaxSizeChangeFromPoolGrowth is the largest change of a steady
	// tenant's size from just before the pool grew to the end of the run
	// (the pool grew and shrank meanwhile). Must be 0.
	MaxSizeChangeFromPoolGrowth int `json:"max_size_change_from_pool_growth"`
	// SteadySizeChanges counts size changes of steady tenants after their
	// first sizing (must be 0); SizeChanges every size change seen.
	SteadySizeChanges int `json:"steady_size_changes"`
	SizeChanges       int `json:"size_changes"`
	// SubsetChanges counts (version, tenant) whose subset changed.
	SubsetChanges int `json:"subset_changes"`
	// SizeHistogram maps a size to the number of tenants of that size at
	// the end.
	SizeHistogram map[int]int `json:"size_histogram"`
	// MarkedReady counts the tenants members marked ready.
	MarkedReady int `json:"marked_ready"`
	// SteppedTenant's load stepped up tenfold and back; SteppedSizes are
	// its sizes over time, SteppedBaseSize and SteppedPeakSize the sizes
	// before and during the step.
	SteppedTenant   string      `json:"stepped_tenant"`
	SteppedBaseSize int         `json:"stepped_base_size"`
	SteppedPeakSize int         `json:"stepped_peak_size"`
	SteppedBack     bool        `json:"stepped_back"`
	SteppedSizes    []SizePoint `json:"stepped_sizes"`
	// PoolSizes are the pool's member counts over time.
	PoolSizes []SizePoint `json:"pool_sizes"`
	DurationS float64     `json:"duration_s"`
	// OK is true when every check passed.
	OK bool `json:"ok"`
}

// SizePoint is a size at a time of the run.
type SizePoint struct {
	AtS     float64 `json:"at_s"`
	Version uint64  `json:"version"`
	Size    int     `json:"size"`
	Why     string  `json:"why,omitempty"`
}

const (
	tpPool          = "gateways"
	tpTenants       = 200
	tpMembers       = 10
	tpGrowTo        = 20
	tpZones         = 3
	tpCapacity      = 10.0 // requests/s one member serves for one tenant
	tpTopRate       = 80.0 // the busiest tenant's requests/s
	tpZipfS         = 1.1
	tpFloorRate     = 0.5 // every tenant gets at least this
	tpStepped       = 12  // the stepped tenant's index
	tpSteppedRate   = 4.0 // its rate before and after the step
	tpStepFactor    = 10
	tpClients       = 3
	tpLoadDelay     = 300 * time.Millisecond // a gateway's simulated load of a new tenant
	tpLeaseTTL      = 5 * time.Second
	tpTick          = 50 * time.Millisecond
	tpMaxCatchUp    = 4 * tpTick // the most load a client sends for one tick it got late
	tpWatchPeriod   = 200 * time.Millisecond
	tpMinDuration   = 20 * time.Second
	tpDefaultLength = 90 * time.Second
	tpMaxNoted      = 5
	// tpLinger is how long a gateway's process outlives its drain: a
	// client whose follower is a version behind the gateway's may still
	// read it (a removal the gateway saw dropped, once the members that
	// took its places were marked ready, is still a target there until
	// their warm-up ends).
	tpLinger = time.Second
)

// RunTenants starts an embedded Keyshard server with a tenant pool of
// gateways in three zones, clients that read tenants from the members
// their PoolFollower names and report the load (LoadReporter), and
// gateways (PoolMember) that mark new tenants ready after a simulated
// load. The script: steady Zipf load over 200 tenants; one tenant's load
// steps up tenfold and back; the pool grows from 10 to 20 members and the
// first 10 leave. It narrates sizes and subset changes, then checks its
// own record. It returns an error only if the demo could not run; failed
// checks show in the report (OK false).
func RunTenants(ctx context.Context, opts TenantsOptions) (TenantsReport, error) {
	if opts.Duration == 0 {
		opts.Duration = tpDefaultLength
	}
	if opts.Duration < tpMinDuration {
		return TenantsReport{}, fmt.Errorf("--duration %v is too short: the tenant-pool demo needs at least %v", opts.Duration, tpMinDuration)
	}
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	w := max(2*time.Second, (opts.Duration / 9).Truncate(time.Second))
	d := &tenantsDemo{
		opts: opts, clock: clock.Real{}, start: time.Now(), window: w,
		gateways: map[string]*gateway{}, versions: map[uint64]*versionRecord{},
		rates: tenantRates(),
	}
	d.report = TenantsReport{
		Pool: tpPool, Tenants: tpTenants, MembersStart: tpMembers, Zones: tpZones, CapacityPerMember: tpCapacity,
		WindowS: w.Seconds(), ShrinkCooldownS: (2 * w).Seconds(), WarmUpS: w.Seconds(), LookbackS: w.Seconds(),
		SteppedTenant: tenantID(tpStepped), SizeHistogram: map[int]int{},
	}
	return d.run(ctx)
}

// tenantRates is the steady load: Zipf(1.1) by rank from tpTopRate, with a
// floor, each rate kept to at most 80% of its size band (sizes move at
// multiples of capacity × zones) so that measurement noise cannot flip a
// steady tenant's size; the stepped tenant starts at tpSteppedRate.
func tenantRates() []float64 {
	rates := make([]float64, tpTenants)
	band := tpCapacity * tpZones
	for i := range rates {
		r := max(tpTopRate/math.Pow(float64(i+1), tpZipfS), tpFloorRate)
		r = min(r, 0.8*band*math.Ceil(r/band))
		rates[i] = r
	}
	rates[tpStepped] = tpSteppedRate
	return rates
}

func tenantID(i int) string { return fmt.Sprintf("tenant-%03d", i) }

type tenantsDemo struct {
	opts   TenantsOptions
	clock  clock.Clock // the SDK's and the gateways' clock
	start  time.Time
	window time.Duration
	outMu  sync.Mutex
	cl     *client.Client
	rates  []float64
	factor atomic.Int64 // the stepped tenant's load factor

	mu       sync.Mutex
	gateways map[string]*gateway
	versions map[uint64]*versionRecord
	noted    []string
	report   TenantsReport
	// growthBase is every steady tenant's size just before the pool grew.
	growthBase map[string]int
	// counting: the steady tenants' sizes have settled (after their first
	// sizing, measured from a window that was not yet full, and one more
	// window); size changes of steady tenants count from then on.
	counting bool

	reads, nonServing, noTargets atomic.Int64
	marked                       atomic.Int64
}

// versionRecord is what the client's follower and the members' followers
// said at one snapshot version.
type versionRecord struct {
	targets map[string][]string        // client: tenant → targets (now and after the spans)
	serves  map[string]map[string]bool // member → tenant → serves, per the member's own follower
}

func (d *tenantsDemo) say(format string, args ...any) {
	d.outMu.Lock()
	defer d.outMu.Unlock()
	fmt.Fprintf(d.opts.Out, "[%5.1fs] %s\n", d.since(), fmt.Sprintf(format, args...))
}

func (d *tenantsDemo) since() float64 { return time.Since(d.start).Seconds() }

func (d *tenantsDemo) run(ctx context.Context) (TenantsReport, error) {
	ctx, cancel := context.WithTimeout(ctx, 4*d.opts.Duration+time.Minute)
	defer cancel()
	srv, err := keyshardtest.Start(ctx, keyshardtest.Options{
		Logger:   d.opts.Logger,
		Internal: &kitseam.Options{Config: func(c *server.Config) { c.Replica = "demo" }},
	})
	if err != nil {
		return TenantsReport{}, fmt.Errorf("start the embedded server: %w", err)
	}
	defer srv.Close()
	d.cl, err = client.Dial(srv.URL(), client.Logger(d.opts.Logger), client.Clock(d.clock))
	if err != nil {
		return TenantsReport{}, err
	}
	defer d.cl.Close()
	w := d.window
	pool, err := d.cl.Admin().PutTenantPool(ctx, client.TenantPool{
		Name: tpPool, LeaseTTL: tpLeaseTTL,
		Policy: client.TenantPoolPolicy{
			CapacityPerMember: tpCapacity, Headroom: 1, ShrinkCooldown: 2 * w, Window: w,
			Lookback: w, WarmUp: w, ZoneAware: true,
		},
	})
	if err != nil {
		return TenantsReport{}, err
	}
	p := pool.Policy
	fmt.Fprintf(d.opts.Out, "keyshard demo: server on %s (embedded etcd), tenant pool %q\n", srv.URL(), tpPool)
	fmt.Fprintf(d.opts.Out, "policy: capacity %.0f req/s per member per tenant, zone-aware over %d zones, window %v, shrink cooldown %v (step: one member per zone), warm-up %v, lookback %v\n",
		p.CapacityPerMember, tpZones, p.Window, p.ShrinkCooldown, p.WarmUp, p.Lookback)
	fmt.Fprintf(d.opts.Out, "load: %d tenants, Zipf(%.1f) from %.0f req/s, floor %.1f req/s; %d clients; gateways mark a new tenant ready %v after they see it\n\n",
		tpTenants, tpZipfS, tpTopRate, tpFloorRate, tpClients, tpLoadDelay)

	// Gateways first, so that clients start against the full first pool.
	gctx, stopGateways := context.WithCancel(context.WithoutCancel(ctx))
	var gwg sync.WaitGroup
	defer func() { stopGateways(); gwg.Wait(); d.closeGateways() }()
	if err := d.join(ctx, gctx, &gwg, 0, tpMembers); err != nil {
		return d.report, err
	}
	// The client side: one follower that records every version, and
	// clients sharing it that read and report.
	var follower atomic.Pointer[client.PoolFollower]
	f, err := d.cl.FollowPool(ctx, tpPool, client.OnPoolEvent(func(ev client.PoolEvent) {
		if ev.Kind == client.PoolUpdated {
			if f := follower.Load(); f != nil {
				d.recordClient(f, ev.Version)
			}
		}
	}))
	if err != nil {
		return d.report, err
	}
	defer f.Close()
	follower.Store(f)
	d.recordClient(f, f.Version())
	if err := d.waitFor(ctx, 10*time.Second, "every follower sees the first members", func() bool { return d.allSee(f, tpMembers) }); err != nil {
		return d.report, err
	}

	cctx, stopClients := context.WithCancel(ctx)
	var cwg sync.WaitGroup
	reporters := make([]*client.LoadReporter, tpClients)
	for i := range reporters {
		reporters[i], err = d.cl.NewLoadReporter(tpPool, fmt.Sprintf("client-%d", i), client.ReportInterval(max(w/8, 250*time.Millisecond)))
		if err != nil {
			stopClients()
			return d.report, err
		}
	}
	d.factor.Store(1)
	for i, r := range reporters {
		cwg.Go(func() { d.clientLoop(cctx, i, f, r) }) // exits on stopClients
	}
	wctx, stopWatch := context.WithCancel(ctx)
	var wwg sync.WaitGroup
	wwg.Go(func() { d.watch(wctx, f) }) // exits on stopWatch
	stopAll := func() {
		stopClients()
		cwg.Wait()
		for _, r := range reporters {
			r.Close()
		}
		stopWatch()
		wwg.Wait()
	}
	err = d.script(ctx, gctx, &gwg, f)
	stopAll()
	if err != nil {
		return d.report, err
	}
	d.finish(f)
	return d.report, nil
}

// script plays the demo's changes, waiting on conditions (each bounded)
// between them.
func (d *tenantsDemo) script(ctx, gctx context.Context, gwg *sync.WaitGroup, f *client.PoolFollower) error {
	w := d.window
	stepped := tenantID(tpStepped)
	d.say("steady load; the leader sizes nobody during its first window (%v), then sizes from what it measured, growing as the window fills: until then every tenant gets the stateless subset of %d members", w, tpZones)
	if err := d.waitFor(ctx, 4*w+10*time.Second, "every tenant is sized", func() bool {
		for i := range tpTenants {
			if !f.Known(tenantID(i)) {
				return false
			}
		}
		return true
	}); err != nil {
		return err
	}
	d.say("every tenant is sized from its own load; steady for one window, then steady tenants' sizes must not change")
	if err := pause(ctx, w); err != nil {
		return err
	}
	d.mu.Lock()
	d.counting = true
	d.mu.Unlock()
	base := d.sizeOf(stepped)
	d.report.SteppedBaseSize = base
	d.factor.Store(tpStepFactor)
	d.say("step: %s's load ×%d (%.0f → %.0f req/s)", stepped, tpStepFactor, tpSteppedRate, tpSteppedRate*tpStepFactor)
	if err := d.waitFor(ctx, 3*w+10*time.Second, stepped+" grows", func() bool { return d.sizeOf(stepped) > base }); err != nil {
		return err
	}
	if err := pause(ctx, w); err != nil {
		return err
	}
	d.factor.Store(1)
	d.say("step over: %s back to %.0f req/s (its size shrinks after the cooldown, %v)", stepped, tpSteppedRate, 2*w)

	d.mu.Lock()
	d.report.PoolSizes = append(d.report.PoolSizes, SizePoint{AtS: d.since(), Version: f.Version(), Size: tpMembers, Why: "before growth"})
	d.mu.Unlock()
	d.say("the pool grows: %d gateways join", tpGrowTo-tpMembers)
	base0 := d.steadySizes()
	d.mu.Lock()
	d.growthBase = base0
	d.mu.Unlock()
	if err := d.join(ctx, gctx, gwg, tpMembers, tpGrowTo); err != nil {
		return err
	}
	if err := d.waitFor(ctx, 10*time.Second, "the snapshot lists 20 members", func() bool { return len(f.Members()) == tpGrowTo }); err != nil {
		return err
	}
	if err := pause(ctx, w); err != nil {
		return err
	}
	d.say("the pool shrinks back: the first %d gateways leave, one every %v (each drains: read for the lookback, %v, after the leader's next round)", tpMembers, w/5, w)
	var lwg sync.WaitGroup
	for i := range tpMembers {
		g := d.gateway(memberID(i))
		d.say("%s leaves", g.id)
		lwg.Go(func() { // exits when the drain is over or ctx ends
			if err := g.leave(ctx); err != nil {
				d.say("%s: leave: %v", g.id, err)
				return
			}
			d.say("%s left: drained, its process ends in %v", g.id, tpLinger)
		})
		if err := pause(ctx, w/5); err != nil {
			lwg.Wait()
			return err
		}
	}
	lwg.Wait()
	if err := d.waitFor(ctx, 10*time.Second, "the snapshot lists 10 members", func() bool { return len(f.Members()) == tpGrowTo-tpMembers }); err != nil {
		return err
	}
	d.waitFor(ctx, 4*w, stepped+" shrinks back", func() bool { return d.sizeOf(stepped) == base }) // reported, not fatal
	return pause(ctx, w)
}

func memberID(i int) string { return fmt.Sprintf("gw-%02d", i) }

// waitFor polls cond every tpTick until it holds or limit passes.
func (d *tenantsDemo) waitFor(ctx context.Context, limit time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			d.say("gave up waiting after %v: %s", limit, what)
			return fmt.Errorf("demo: %s did not happen within %v", what, limit)
		}
		if err := pause(ctx, tpTick); err != nil {
			return err
		}
	}
	return nil
}

func pause(ctx context.Context, dur time.Duration) error {
	t := time.NewTimer(dur)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// allSee reports whether the client's follower and every gateway's hold
// a snapshot of n members at one version.
func (d *tenantsDemo) allSee(f *client.PoolFollower, n int) bool {
	if len(f.Members()) != n {
		return false
	}
	v := f.Version()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, g := range d.gateways {
		if g.m.Follower().Version() != v {
			return false
		}
	}
	return true
}

// --- gateways ---

// gateway is one server process of the pool: a PoolMember that loads the
// tenants it is placed on (a delay) and marks them ready, and answers
// reads for the tenants its own follower says it serves.
type gateway struct {
	d    *tenantsDemo
	id   string
	m    *client.PoolMember
	mu   sync.Mutex
	left time.Time       // when its Leave began (by the demo's clock); zero while a member
	held map[string]bool // the tenants it served when its Leave began
	done time.Time       // when its Leave returned; the process ends tpLinger later
	// draining closes when the control plane has taken its Leave (the
	// first PoolDraining event); until is when the drain said, at the
	// latest, the last tenant stops reading it.
	draining  chan struct{}
	drainOnce sync.Once
	until     time.Time
}

// join starts gateways [from, to).
func (d *tenantsDemo) join(ctx, gctx context.Context, gwg *sync.WaitGroup, from, to int) error {
	for i := from; i < to; i++ {
		g := &gateway{d: d, id: memberID(i), draining: make(chan struct{})}
		var follower atomic.Pointer[client.PoolFollower]
		changed := make(chan struct{}, 1)
		m, err := d.cl.JoinPool(ctx, tpPool, client.Member{ID: g.id, Address: g.id + ".demo:7000", Zone: fmt.Sprintf("zone-%c", 'a'+i%tpZones)},
			client.OnPoolEvent(func(ev client.PoolEvent) {
				if ev.Kind == client.PoolDraining {
					g.drained(ev)
					return
				}
				if ev.Kind != client.PoolUpdated {
					return
				}
				if f := follower.Load(); f != nil {
					d.recordMember(g.id, f, ev.Version)
				}
				select {
				case changed <- struct{}{}:
				default:
				}
			}))
		if err != nil {
			return err
		}
		g.m = m
		follower.Store(m.Follower())
		d.recordMember(g.id, m.Follower(), m.Follower().Version())
		d.mu.Lock()
		d.gateways[g.id] = g
		d.mu.Unlock()
		gwg.Go(func() { g.prefetch(gctx, changed) }) // exits on gctx's end
		d.say("%s joined (%s)", g.id, fmt.Sprintf("zone-%c", 'a'+i%tpZones))
	}
	return nil
}

// prefetch "loads" every tenant newly served, then marks them ready.
func (g *gateway) prefetch(ctx context.Context, changed <-chan struct{}) {
	loaded := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
		g.mu.Lock()
		left := !g.left.IsZero()
		g.mu.Unlock()
		if left {
			return
		}
		var fresh []string
		for _, t := range g.m.Tenants() {
			if !loaded[t] {
				fresh = append(fresh, t)
			}
		}
		if len(fresh) == 0 {
			continue
		}
		if pause(ctx, tpLoadDelay) != nil {
			return
		}
		r, err := g.m.MarkReady(ctx, fresh...)
		if err != nil {
			if ctx.Err() == nil {
				g.d.say("%s: mark ready: %v", g.id, err)
			}
			continue
		}
		for _, t := range fresh {
			loaded[t] = true
		}
		g.d.marked.Add(int64(r.Marked))
	}
}

// leave drains the gateway (PoolMember.Leave) and ends its process when
// the drain is over. The drain lasts past the lookback after the call:
// the member leaves the subsets at the leader's next round, and is read
// for the lookback from then on (and until the members that took its
// places are read), so the gateway answers until Leave returns.
func (g *gateway) leave(ctx context.Context) error {
	held := map[string]bool{}
	for _, t := range g.m.Tenants() { // a draining member gains no tenant
		held[t] = true
	}
	g.mu.Lock()
	g.left, g.held = g.d.clock.Now(), held
	g.mu.Unlock()
	err := g.m.Leave(ctx)
	g.mu.Lock()
	g.done = g.d.clock.Now()
	g.mu.Unlock()
	return err
}

// drained takes a PoolDraining event of the gateway's Leave.
func (g *gateway) drained(ev client.PoolEvent) {
	g.drainOnce.Do(func() { close(g.draining) })
	g.mu.Lock()
	said := !g.until.IsZero()
	if !ev.Until.IsZero() {
		g.until = ev.Until
	}
	g.mu.Unlock()
	if !said && !ev.Until.IsZero() {
		g.d.say("%s drains: in no subset, read by %d tenants until %.1fs", g.id, ev.Tenants, ev.Until.Sub(g.d.start).Seconds())
	}
}

// serves answers a read: does this gateway serve tenant now, by its own
// follower? While it drains it also answers for the tenants it held when
// its Leave began (it still has their data, and a client a version behind
// its follower may still read it), and for tpLinger after its Leave
// returned only for those; then not at all.
func (g *gateway) serves(tenant string) bool {
	g.mu.Lock()
	done, held := g.done, g.held[tenant]
	g.mu.Unlock()
	if !done.IsZero() {
		return held && g.d.clock.Since(done) < tpLinger
	}
	return held || g.m.Serves(tenant)
}

// isGone reports whether the gateway's Leave returned.
func (g *gateway) isGone() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.done.IsZero()
}

func (d *tenantsDemo) gateway(id string) *gateway {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.gateways[id]
}

func (d *tenantsDemo) closeGateways() {
	d.mu.Lock()
	gs := make([]*gateway, 0, len(d.gateways))
	for _, g := range d.gateways {
		gs = append(gs, g)
	}
	d.mu.Unlock()
	for _, g := range gs {
		g.m.Close()
	}
}

// --- clients ---

// clientLoop sends client i's share of every tenant's requests: each one
// is counted by the client's LoadReporter and read from a member picked
// from Targets.
func (d *tenantsDemo) clientLoop(ctx context.Context, i int, f *client.PoolFollower, r *client.LoadReporter) {
	rng := rand.New(rand.NewPCG(uint64(i), 42))
	owed := make([]float64, tpTenants)
	t := time.NewTicker(tpTick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			// A client that fell behind (a starved goroutine on a busy
			// machine) sends less, not a burst: a burst would read as a
			// steady tenant's load rising for a window and grow it.
			dt := min(now.Sub(last), tpMaxCatchUp).Seconds()
			last = now
			for k := range owed {
				rate := d.rates[k]
				if k == tpStepped {
					rate *= float64(d.factor.Load())
				}
				owed[k] += rate * dt / tpClients
				n := int64(owed[k])
				if n == 0 {
					continue
				}
				owed[k] -= float64(n)
				tenant := tenantID(k)
				r.Add(tenant, n)
				for range n {
					d.read(f, tenant, rng)
				}
			}
		}
	}
}

// read sends one read of tenant to a member picked from Targets; the
// member checks with its own follower that it serves the tenant.
func (d *tenantsDemo) read(f *client.PoolFollower, tenant string, rng *rand.Rand) {
	d.reads.Add(1)
	ts := f.Targets(tenant)
	if len(ts) == 0 {
		d.noTargets.Add(1)
		d.note(fmt.Sprintf("%.1fs: no target for %s at version %d", d.since(), tenant, f.Version()))
		return
	}
	id := ts[rng.IntN(len(ts))]
	g := d.gateway(id)
	if g != nil && g.serves(tenant) {
		return
	}
	d.nonServing.Add(1)
	mv := uint64(0)
	if g != nil {
		mv = g.m.Follower().Version()
	}
	d.note(fmt.Sprintf("%.1fs: read of %s sent to %s (client at version %d, member at %d) which does not serve it", d.since(), tenant, id, f.Version(), mv))
}

func (d *tenantsDemo) note(s string) {
	d.mu.Lock()
	first := len(d.noted) < tpMaxNoted
	if first {
		d.noted = append(d.noted, s)
	}
	d.mu.Unlock()
	if first {
		d.say("FAIL %s", s)
	}
}

// --- records ---

// recordClient records the client follower's targets at version v, if it
// still holds v after reading them. Targets are taken now and at a time
// after every span has begun, so both sides of a warm-up or lookback are
// covered.
func (d *tenantsDemo) recordClient(f *client.PoolFollower, v uint64) {
	now := time.Now()
	later := now.Add(10 * d.window)
	ts := make(map[string][]string, tpTenants)
	for i := range tpTenants {
		t := tenantID(i)
		a, b := f.TargetsAt(t, now), f.TargetsAt(t, later)
		u := slices.Clone(a)
		for _, m := range b {
			if !slices.Contains(u, m) {
				u = append(u, m)
			}
		}
		ts[t] = u
	}
	if f.Version() != v {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.recordAt(v)
	if r.targets == nil {
		r.targets = ts
	}
}

// recordMember records which tenants member serves by its own follower at
// version v.
func (d *tenantsDemo) recordMember(member string, f *client.PoolFollower, v uint64) {
	s := make(map[string]bool, tpTenants)
	for i := range tpTenants {
		t := tenantID(i)
		if f.Serves(member, t) {
			s[t] = true
		}
	}
	if f.Version() != v {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.recordAt(v)
	if r.serves[member] == nil {
		r.serves[member] = s
	}
}

func (d *tenantsDemo) recordAt(v uint64) *versionRecord {
	r := d.versions[v]
	if r == nil {
		r = &versionRecord{serves: map[string]map[string]bool{}}
		d.versions[v] = r
	}
	return r
}

// --- the operator's view: sizes and subsets as they change ---

// tenantView is one tenant as the last Tenants call showed it.
type tenantView struct {
	size    int
	members []string
}

// watch polls the operator's view of every tenant, narrates size and
// subset changes and the pool's size, and keeps the histories the checks
// need.
func (d *tenantsDemo) watch(ctx context.Context, f *client.PoolFollower) {
	t := time.NewTicker(tpWatchPeriod)
	defer t.Stop()
	var lastVersion uint64
	prev := map[string]tenantView{}
	members := 0
	lastProgress := time.Now()
	ids := make([]string, tpTenants)
	for i := range ids {
		ids[i] = tenantID(i)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n := len(f.Members()); n != members {
			members = n
			d.mu.Lock()
			d.report.PoolSizes = append(d.report.PoolSizes, SizePoint{AtS: d.since(), Version: f.Version(), Size: n})
			d.report.MembersPeak = max(d.report.MembersPeak, n)
			d.mu.Unlock()
			d.say("pool: %d members at version %d", n, f.Version())
		}
		page, err := d.cl.Tenants(ctx, tpPool, ids, 0)
		if err != nil {
			if ctx.Err() == nil {
				d.say("tenants: %v", err)
			}
			continue
		}
		if page.Version != lastVersion {
			lastVersion = page.Version
			d.diff(page, prev)
		}
		if time.Since(lastProgress) >= 3*time.Second {
			lastProgress = time.Now()
			d.say("progress: version %d, %d reads (%d to non-serving members), %d tenants marked ready", f.Version(), d.reads.Load(), d.nonServing.Load(), d.marked.Load())
		}
	}
}

// diff narrates what changed from prev to page and updates prev.
func (d *tenantsDemo) diff(page client.TenantsPage, prev map[string]tenantView) {
	var grew, shrank []string
	subsets := 0
	joined, left := map[string]int{}, map[string]int{}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, ts := range page.Tenants {
		if !ts.Known {
			continue
		}
		var ms []string
		for _, m := range ts.Members {
			if m.Removed.IsZero() {
				ms = append(ms, m.ID)
			}
		}
		sort.Strings(ms)
		old, seen := prev[ts.Tenant]
		prev[ts.Tenant] = tenantView{size: ts.Size, members: ms}
		if ts.Tenant == tenantID(tpStepped) && (!seen || old.size != ts.Size) {
			d.report.SteppedSizes = append(d.report.SteppedSizes, SizePoint{AtS: d.since(), Version: page.Version, Size: ts.Size, Why: ts.Why})
			d.report.SteppedPeakSize = max(d.report.SteppedPeakSize, ts.Size)
		}
		if !seen {
			continue
		}
		if b, ok := d.growthBase[ts.Tenant]; ok {
			d.report.MaxSizeChangeFromPoolGrowth = max(d.report.MaxSizeChangeFromPoolGrowth, abs(ts.Size-b))
		}
		if old.size != ts.Size {
			d.report.SizeChanges++
			if ts.Tenant != tenantID(tpStepped) && d.counting {
				d.report.SteadySizeChanges++
			}
			s := fmt.Sprintf("%s %d → %d (%s)", ts.Tenant, old.size, ts.Size, ts.Why)
			if ts.Size > old.size {
				grew = append(grew, s)
			} else {
				shrank = append(shrank, s)
			}
		}
		if !slices.Equal(old.members, ms) {
			subsets++
			for _, m := range ms {
				if !slices.Contains(old.members, m) {
					joined[m]++
				}
			}
			for _, m := range old.members {
				if !slices.Contains(ms, m) {
					left[m]++
				}
			}
		}
	}
	d.report.SubsetChanges += subsets
	for _, s := range grew {
		d.sayLocked("v%d: size grew: %s", page.Version, s)
	}
	for _, s := range shrank {
		d.sayLocked("v%d: size shrank: %s", page.Version, s)
	}
	if subsets > 0 {
		d.sayLocked("v%d: %d subsets changed: %s", page.Version, subsets, moves(joined, left))
	}
}

func (d *tenantsDemo) sayLocked(format string, args ...any) {
	d.outMu.Lock()
	defer d.outMu.Unlock()
	fmt.Fprintf(d.opts.Out, "[%5.1fs] %s\n", d.since(), fmt.Sprintf(format, args...))
}

// moves describes members joining and leaving subsets.
func moves(joined, left map[string]int) string {
	var parts []string
	for _, m := range slices.Sorted(maps.Keys(left)) {
		parts = append(parts, fmt.Sprintf("-%s×%d", m, left[m]))
	}
	for _, m := range slices.Sorted(maps.Keys(joined)) {
		parts = append(parts, fmt.Sprintf("+%s×%d", m, joined[m]))
	}
	return strings.Join(parts, " ")
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// sizeOf is tenant's size as the leader reports it (0 if unknown).
func (d *tenantsDemo) sizeOf(tenant string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	page, err := d.cl.Tenants(ctx, tpPool, []string{tenant}, 0)
	if err != nil || len(page.Tenants) == 0 || !page.Tenants[0].Known {
		return 0
	}
	return page.Tenants[0].Size
}

// steadySizes returns every steady tenant's size now.
func (d *tenantsDemo) steadySizes() map[string]int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ids := make([]string, 0, tpTenants)
	for i := range tpTenants {
		if i != tpStepped {
			ids = append(ids, tenantID(i))
		}
	}
	out := map[string]int{}
	page, err := d.cl.Tenants(ctx, tpPool, ids, 0)
	if err != nil {
		return out
	}
	for _, ts := range page.Tenants {
		out[ts.Tenant] = ts.Size
	}
	return out
}

// finish compares the records, computes the report and prints the checks.
func (d *tenantsDemo) finish(f *client.PoolFollower) {
	end := d.steadySizes()
	r := &d.report
	d.mu.Lock()
	for t, before := range d.growthBase {
		now, ok := end[t]
		if !ok {
			now = 0
		}
		r.MaxSizeChangeFromPoolGrowth = max(r.MaxSizeChangeFromPoolGrowth, abs(now-before))
	}
	if len(d.growthBase) == 0 {
		r.MaxSizeChangeFromPoolGrowth = -1 // the pool never grew: not measured
	}
	for v, rec := range d.versions {
		if rec.targets == nil {
			continue
		}
		r.VersionsClient++
		if len(rec.serves) == 0 {
			continue
		}
		r.Versions++
		for t, ms := range rec.targets {
			for _, m := range ms {
				s, ok := rec.serves[m]
				if ok && !s[t] {
					r.Disagreements++
					if r.Disagreements <= tpMaxNoted {
						d.noted = append(d.noted, fmt.Sprintf("version %d: the client reads %s from %s, which does not serve it at that version", v, t, m))
					}
				}
			}
		}
	}
	r.NonServingReads = slices.Clone(d.noted)
	d.mu.Unlock()
	for _, s := range end {
		r.SizeHistogram[s]++
	}
	if s := d.sizeOf(r.SteppedTenant); s > 0 {
		r.SizeHistogram[s]++
		r.SteppedBack = s == r.SteppedBaseSize
	}
	r.MembersEnd = len(f.Members())
	r.Reads, r.ReadsToNonServingMembers, r.ReadsWithoutTargets = d.reads.Load(), d.nonServing.Load(), d.noTargets.Load()
	r.MarkedReady = int(d.marked.Load())
	r.DurationS = d.since()
	stepped := r.SteppedPeakSize > r.SteppedBaseSize && r.SteppedBaseSize > 0
	grewShrank := r.MembersPeak == tpGrowTo && r.MembersEnd == tpGrowTo-tpMembers
	r.OK = r.Versions > 0 && r.Disagreements == 0 && r.Reads > 0 && r.ReadsToNonServingMembers == 0 && r.ReadsWithoutTargets == 0 &&
		r.MaxSizeChangeFromPoolGrowth == 0 && r.SteadySizeChanges == 0 && stepped && r.SteppedBack && grewShrank

	out := d.opts.Out
	d.outMu.Lock()
	defer d.outMu.Unlock()
	fmt.Fprintf(out, "\nchecks:\n")
	check := func(ok bool, format string, args ...any) {
		mark := "ok  "
		if !ok {
			mark = "FAIL"
		}
		fmt.Fprintf(out, "  %s %s\n", mark, fmt.Sprintf(format, args...))
	}
	check(r.Versions > 0 && r.Disagreements == 0, "clients and servers agreed at every version both saw: %d versions, %d disagreements", r.Versions, r.Disagreements)
	check(r.Reads > 0 && r.ReadsToNonServingMembers == 0 && r.ReadsWithoutTargets == 0, "every read went to a member serving its tenant: %d reads, %d to non-serving members, %d without a target",
		r.Reads, r.ReadsToNonServingMembers, r.ReadsWithoutTargets)
	check(r.MaxSizeChangeFromPoolGrowth == 0 && r.SteadySizeChanges == 0, "no size followed the pool (%d → %d → %d members): max size change of a steady tenant %d, %d steady size changes",
		tpMembers, r.MembersPeak, r.MembersEnd, r.MaxSizeChangeFromPoolGrowth, r.SteadySizeChanges)
	check(stepped && r.SteppedBack, "%s followed its own load: size %d → %d → back to %d: %v", r.SteppedTenant, r.SteppedBaseSize, r.SteppedPeakSize, r.SteppedBaseSize, r.SteppedBack)
	check(grewShrank, "the pool grew to %d members and shrank to %d", r.MembersPeak, r.MembersEnd)
	for _, n := range r.NonServingReads {
		fmt.Fprintf(out, "       %s\n", n)
	}
	fmt.Fprintf(out, "sizes at the end: %v; %d size changes, %d subset changes, %d tenants marked ready\n", r.SizeHistogram, r.SizeChanges, r.SubsetChanges, r.MarkedReady)
}
