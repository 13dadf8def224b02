package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/internal/kitseam"
	"github.com/keyshard/keyshard/internal/server"
	"github.com/keyshard/keyshard/internal/tenantpool"
	"github.com/keyshard/keyshard/keyshardtest"
	"github.com/keyshard/keyshard/placement"
)

// TenantsOptions shape `keyshard bench tenants`.
type TenantsOptions struct {
	// Runs per figure; the median is reported (default 3).
	Runs int
	// Quick uses 10,000 tenants, 10 reporters and short measurements: a
	// smoke test, not comparable with the targets.
	Quick bool
	// Logger receives the server's logs (default: discard).
	Logger *slog.Logger
}

// TenantsReport is the output of `keyshard bench tenants --json`. Its
// targets: aggregate_100k_tenants_100_reporters_cpu < 1 core, targets_ns
// ≤ 100 with 0 allocs, growth_size_changes 0, one member leaving changing
// only its holders' subsets by one member each, one chunk rewritten per
// tenant change.
type TenantsReport struct {
	Tenants int `json:"tenants"`
	// ServerTenants is the number of tenants of the real server's figures
	// (aggregation CPU, etcd bytes, Targets, bytes per change): Tenants,
	// every one reporting from the start, so that the leader's first
	// sizing rewrites every chunk in one round (published in several
	// transactions under the budget: store.StateWrites).
	ServerTenants      int `json:"server_tenants"`
	Reporters          int `json:"reporters"`
	ReportersPerTenant int `json:"reporters_per_tenant"`
	// AggregateCPU is the process's CPU (user + system, getrusage) per
	// second of wall time while Reporters LoadReporters each reported
	// every second their share of Tenants (each tenant by
	// ReportersPerTenant of them), in cores. The process holds the server
	// (aggregation, rounds, publication), the embedded etcd and the
	// reporters themselves (counting and sending): an upper bound of the
	// server's own cost. AggregateCoreCPU is the pure core's share, timed
	// directly: Aggregator.Add of the same reports, Rates and a Planner
	// round, per simulated second.
	AggregateCPU     float64 `json:"aggregate_100k_tenants_100_reporters_cpu"`
	AggregateCoreCPU float64 `json:"aggregate_core_cpu"`
	// EtcdBytesPerS is what the leader's rounds wrote to etcd per second
	// over the same measurement (keyshard_tenantpool_bytes_written_total),
	// steady load.
	EtcdBytesPerS float64 `json:"etcd_bytes_per_s"`
	// MeasureS is the length of one CPU measurement.
	MeasureS float64 `json:"measure_s"`
	// TargetsNs and TargetsAllocs: PoolFollower.Targets of a known tenant
	// from the local snapshot of Tenants tenants; ServesNs:
	// PoolFollower.Serves.
	TargetsNs     float64 `json:"targets_ns"`
	TargetsAllocs int64   `json:"targets_allocs"`
	ServesNs      float64 `json:"serves_ns"`
	// Growth: a pool of 10 members in 3 zones grows to 100 in four steps,
	// rates steady over GrowthTenants heavy-tailed tenants, with
	// RebalanceMoves GrowthRebalanceMoves per round, until a round moves
	// nothing. GrowthSizeChanges counts sizes that changed (target 0);
	// GrowthMoved the placements moved, GrowthMinimum the fewest that can
	// bring every member within the tolerance (tenantpool.MinMoves).
	GrowthTenants        int     `json:"growth_tenants"`
	GrowthRebalanceMoves int     `json:"growth_rebalance_moves"`
	GrowthSizeChanges    int     `json:"growth_size_changes"`
	GrowthMoved          int     `json:"growth_moved"`
	GrowthMinimum        int     `json:"growth_minimum"`
	GrowthMovedOverMin   float64 `json:"growth_moved_over_minimum"`
	GrowthRounds         int     `json:"growth_rounds"`
	// Leave: one member of the 100 leaves (after the growth, RebalanceMoves
	// 0). LeaveHolders counts the
	// subsets that held it; LeaveChanged the subsets that changed;
	// LeaveChangedByOne those that changed by exactly the leaver replaced
	// by one member; LeaveSizeChanges sizes that changed (target 0).
	LeaveHolders      int `json:"leave_holders"`
	LeaveChanged      int `json:"leave_changed"`
	LeaveChangedByOne int `json:"leave_changed_by_one"`
	LeaveSizeChanges  int `json:"leave_size_changes"`
	// BytesWrittenPerTenantChange: one tenant's change (one member marks
	// it ready) in a pool of Tenants tenants: the bytes (keys and values)
	// of the round's write, its keys and the tenants it rewrote.
	BytesWrittenPerTenantChange int `json:"bytes_written_per_tenant_change"`
	WritesPerTenantChange       int `json:"writes_per_tenant_change"`
	TenantsRewritten            int `json:"tenants_rewritten"`
	// PlanSteadyMs and PlanLeaveMs: a Planner round over PlanTenants
	// tenants and 100 members, steady, and after one member left.
	PlanTenants  int     `json:"plan_tenants"`
	PlanSteadyMs float64 `json:"plan_steady_ms"`
	PlanLeaveMs  float64 `json:"plan_leave_ms"`
}

type tenantsSizes struct {
	tenants, reporters, perTenant, members int
	serverTenants                          int
	window, measure                        time.Duration
	growthTenants, planTenants             int
}

func tenantsSizesFor(quick bool) tenantsSizes {
	if quick {
		return tenantsSizes{tenants: 10_000, serverTenants: 10_000, reporters: 10, perTenant: 3, members: 10, window: 2 * time.Second, measure: 2 * time.Second, growthTenants: 2_000, planTenants: 10_000}
	}
	return tenantsSizes{tenants: 100_000, serverTenants: 100_000, reporters: 100, perTenant: 3, members: 10, window: 5 * time.Second, measure: 10 * time.Second, growthTenants: 10_000, planTenants: 100_000}
}

const tbPool = "bench-gateways"

// tbChangeTries bounds the tenants marked ready to see a round that
// rewrote only that tenant.
const tbChangeTries = 10

// tbRates is a heavy-tailed steady load over n tenants (Pareto, α = 1.1,
// from 0.5 req/s), capped at 88 req/s so that every size fits a pool of
// 10 members at capacity 10.
func tbRates(n int, seed uint64) map[string]float64 {
	r := rand.New(rand.NewPCG(seed, 11))
	rates := make(map[string]float64, n)
	for i := range n {
		rates[tbTenant(i)] = math.Min(0.5*math.Pow(1-r.Float64(), -1/1.1), 88)
	}
	return rates
}

func tbTenant(i int) string { return fmt.Sprintf("tenant-%06d", i) }

func tbPolicy() tenantpool.Policy {
	return tenantpool.Policy{CapacityPerMember: 10, Headroom: 1, ShrinkCooldown: 5 * time.Minute, Lookback: time.Minute, WarmUp: 30 * time.Second, ZoneAware: true}
}

func tbMembers(n, zones int) []placement.Member {
	ms := make([]placement.Member, n)
	for i := range ms {
		ms[i] = placement.Member{ID: fmt.Sprintf("m%03d", i), Weight: 1, Zone: fmt.Sprintf("z%d", i%zones)}
	}
	return ms
}

// Tenants measures tenant pools against the targets, writing progress
// lines to progress.
func Tenants(ctx context.Context, opts TenantsOptions, progress io.Writer) (TenantsReport, error) {
	if opts.Runs <= 0 {
		opts.Runs = 3
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	sz := tenantsSizesFor(opts.Quick)
	rep := TenantsReport{Tenants: sz.tenants, ServerTenants: sz.serverTenants, Reporters: sz.reporters, ReportersPerTenant: sz.perTenant, MeasureS: sz.measure.Seconds(),
		GrowthTenants: sz.growthTenants, PlanTenants: sz.planTenants}
	say := func(format string, args ...any) { fmt.Fprintf(progress, "tenants: "+format+"\n", args...) }

	say("plan rounds over %d tenants and 100 members (%d runs)", sz.planTenants, opts.Runs)
	if err := tbPlanRounds(sz, opts.Runs, &rep); err != nil {
		return rep, err
	}
	say("plan: steady %.1f ms, after a leave %.1f ms", rep.PlanSteadyMs, rep.PlanLeaveMs)
	say("growth 10 → 100 members over %d tenants", sz.growthTenants)
	if err := tbGrowth(sz, &rep); err != nil {
		return rep, err
	}
	say("growth: %d size changes, %d placements moved (minimum %d) in %d rounds; leave: %d of %d holders changed by one, %d size changes",
		rep.GrowthSizeChanges, rep.GrowthMoved, rep.GrowthMinimum, rep.GrowthRounds, rep.LeaveChangedByOne, rep.LeaveHolders, rep.LeaveSizeChanges)
	say("the pure core: %d reports of %d tenants per second, rates and a round", sz.reporters, sz.tenants)
	rep.AggregateCoreCPU = median(opts.Runs, func() float64 { return tbCoreCPU(sz) })
	say("the pure core: %.3f cores", rep.AggregateCoreCPU)
	if err := tbServer(ctx, sz, opts, &rep, say); err != nil {
		return rep, err
	}
	return rep, nil
}

// tbPlanRounds times Planner rounds: steady, and after a member left.
func tbPlanRounds(sz tenantsSizes, runs int, rep *TenantsReport) error {
	rates := tbRates(sz.planTenants, 3)
	p := tbPolicy()
	ms := tbMembers(100, 3)
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	st, _, err := tenantpool.Plan(tenantpool.State{}, ms, rates, p, t0)
	if err != nil {
		return err
	}
	var steady, leave []float64
	left := slices.Delete(slices.Clone(ms), 42, 43)
	for i := range runs {
		pl := tenantpool.NewPlanner(tenantpool.Clone(st))
		now := t0.Add(time.Duration(i+1) * time.Second)
		start := time.Now()
		if _, _, err := pl.Plan(ms, rates, p, now); err != nil {
			return err
		}
		steady = append(steady, float64(time.Since(start).Microseconds())/1000)
		start = time.Now()
		if _, _, err := pl.Plan(left, rates, p, now.Add(time.Second)); err != nil {
			return err
		}
		leave = append(leave, float64(time.Since(start).Microseconds())/1000)
	}
	rep.PlanSteadyMs, rep.PlanLeaveMs = medianOf(steady), medianOf(leave)
	return nil
}

// tbGrowth grows a pool from 10 to 100 members with steady rates, then
// makes one member leave, counting sizes and placements changed.
func tbGrowth(sz tenantsSizes, rep *TenantsReport) error {
	p := tbPolicy()
	p.RebalanceMoves = sz.growthTenants / 4
	rep.GrowthRebalanceMoves = p.RebalanceMoves
	rates := tbRates(sz.growthTenants, 1)
	pl := tenantpool.NewPlanner(tenantpool.State{})
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	round := func(ms []placement.Member) (tenantpool.Changes, error) {
		now = now.Add(time.Second)
		_, ch, err := pl.Plan(ms, rates, p, now)
		return ch, err
	}
	if _, err := round(tbMembers(10, 3)); err != nil {
		return err
	}
	start := tenantpool.Clone(pl.State())
	rep.GrowthMinimum = tenantpool.MinMoves(start, tbMembers(100, 3), rates, placement.DefaultTolerance)
	count := func(ch tenantpool.Changes) int {
		rep.GrowthSizeChanges += len(ch.Sizes)
		n := 0
		for _, c := range ch.Subsets {
			n += len(c.Added)
		}
		return n
	}
	for _, n := range []int{25, 50, 75, 100} {
		ch, err := round(tbMembers(n, 3))
		if err != nil {
			return err
		}
		rep.GrowthMoved += count(ch)
		rep.GrowthRounds++
	}
	for range 200 {
		ch, err := round(tbMembers(100, 3))
		if err != nil {
			return err
		}
		k := count(ch)
		rep.GrowthMoved += k
		rep.GrowthRounds++
		if k == 0 && len(ch.Tenants) == 0 {
			break
		}
	}
	if rep.GrowthMinimum > 0 {
		rep.GrowthMovedOverMin = float64(rep.GrowthMoved) / float64(rep.GrowthMinimum)
	}

	// One member leaves, under the default policy (no rebalance moves: a
	// round with them may also swap a few placements for balance).
	p.RebalanceMoves = 0
	before := tenantpool.Clone(pl.State())
	ms := tbMembers(100, 3)
	gone := ms[42].ID
	st, ch, err := pl.Plan(slices.Delete(slices.Clone(ms), 42, 43), rates, p, now.Add(time.Second))
	if err != nil {
		return err
	}
	rep.LeaveSizeChanges = len(ch.Sizes)
	for id, old := range before.Tenants {
		ts := st.Tenants[id]
		oldIDs, newIDs := tbIDs(old.Members), tbIDs(ts.Members)
		held := slices.Contains(oldIDs, gone)
		if held {
			rep.LeaveHolders++
		}
		if slices.Equal(oldIDs, newIDs) {
			continue
		}
		rep.LeaveChanged++
		var added, removed []string
		for _, m := range newIDs {
			if !slices.Contains(oldIDs, m) {
				added = append(added, m)
			}
		}
		for _, m := range oldIDs {
			if !slices.Contains(newIDs, m) {
				removed = append(removed, m)
			}
		}
		if held && len(added) == 1 && slices.Equal(removed, []string{gone}) {
			rep.LeaveChangedByOne++
		}
	}
	return nil
}

func tbIDs(ps []tenantpool.Placement) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.ID
	}
	return out
}

// tbReports are one simulated second of every reporter's reports: each
// tenant's count for the second is split over perTenant reporters.
func tbReports(sz tenantsSizes, rates map[string]float64) [][]tenantpool.Count {
	out := make([][]tenantpool.Count, sz.reporters)
	for i := range sz.tenants {
		id := tbTenant(i)
		n := max(1, int64(math.Round(rates[id]/float64(sz.perTenant))))
		for k := range sz.perTenant {
			r := (i + k) % sz.reporters
			out[r] = append(out[r], tenantpool.Count{Tenant: id, N: n})
		}
	}
	return out
}

// tbCoreCPU is the pure core's cost per simulated second, in cores: every
// reporter's report added, the rates read and a Planner round, over
// simulated seconds run back to back.
func tbCoreCPU(sz tenantsSizes) float64 {
	rates := tbRates(sz.tenants, 5)
	reports := tbReports(sz, rates)
	agg, err := tenantpool.NewAggregator(tenantpool.AggregatorConfig{Window: sz.window})
	if err != nil {
		return math.NaN()
	}
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	agg.Start(t0)
	pl := tenantpool.NewPlanner(tenantpool.State{})
	ms := tbMembers(sz.members, 3)
	p := tbPolicy()
	seq := make([]uint64, sz.reporters)
	second := func(s int) {
		now := t0.Add(time.Duration(s) * time.Second)
		for r, cs := range reports {
			for i := 0; i < len(cs); i += tenantpool.DefaultMaxCounts {
				seq[r]++
				agg.Add(tenantpool.Report{Reporter: fmt.Sprintf("r%03d", r), Seq: seq[r], Time: now, Counts: cs[i:min(len(cs), i+tenantpool.DefaultMaxCounts)]}, now)
			}
		}
		pl.Plan(ms, agg.Rates(now), p, now)
	}
	warm := int(sz.window/time.Second) + 2
	for s := range warm { // past the first sizing
		second(s)
	}
	const measured = 5
	start := time.Now()
	for s := warm; s < warm+measured; s++ {
		second(s)
	}
	return time.Since(start).Seconds() / measured
}

// cpuTime is the process's user + system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// scrapeSum sums every series of metric name on url's /metrics.
func scrapeSum(ctx context.Context, url, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", name, err)
		}
		sum += f
	}
	return sum, sc.Err()
}

// tbServer runs the figures that need a real server: the process CPU of
// aggregation, Targets from a follower of the full snapshot, and the bytes
// of one tenant's change.
func tbServer(ctx context.Context, sz tenantsSizes, opts TenantsOptions, rep *TenantsReport, say func(string, ...any)) error {
	var srvMu sync.Mutex
	var ks *server.Server
	srv, err := keyshardtest.Start(ctx, keyshardtest.Options{
		Logger: opts.Logger,
		Internal: &kitseam.Options{
			Config:  func(c *server.Config) { c.Replica = "bench" },
			Started: func(s *server.Server) { srvMu.Lock(); ks = s; srvMu.Unlock() },
		},
	})
	if err != nil {
		return fmt.Errorf("start the embedded server: %w", err)
	}
	defer srv.Close()
	cl, err := client.Dial(srv.URL(), client.Logger(opts.Logger))
	if err != nil {
		return err
	}
	defer cl.Close()
	if _, err := cl.Admin().PutTenantPool(ctx, client.TenantPool{Name: tbPool, Policy: client.TenantPoolPolicy{
		CapacityPerMember: 10, Headroom: 1, ShrinkCooldown: 10 * time.Minute, Window: sz.window, ZoneAware: true, WarmUp: time.Hour,
	}}); err != nil {
		return err
	}
	// Members join with raw calls (no follower each) and keep alive.
	api := keyshardv1connect.NewTenantPoolServiceClient(http.DefaultClient, srv.URL())
	mctx, stopMembers := context.WithCancel(ctx)
	var mwg sync.WaitGroup
	defer func() { stopMembers(); mwg.Wait() }()
	sessions := make([]string, sz.members)
	for i := range sz.members {
		resp, err := api.JoinPool(ctx, connect.NewRequest(&keyshardv1.JoinPoolRequest{Pool: tbPool, Member: &keyshardv1.Member{Id: fmt.Sprintf("m%03d", i), Address: "bench", Zone: fmt.Sprintf("z%d", i%3)}}))
		if err != nil {
			return fmt.Errorf("join: %w", err)
		}
		sessions[i] = resp.Msg.GetSession()
		ttl := resp.Msg.GetLeaseTtl().AsDuration()
		mwg.Go(func() { // exits on stopMembers
			t := time.NewTicker(max(ttl/3, 100*time.Millisecond))
			defer t.Stop()
			for {
				api.PoolKeepAlive(mctx, connect.NewRequest(&keyshardv1.PoolKeepAliveRequest{Session: sessions[i]}))
				select {
				case <-mctx.Done():
					return
				case <-t.C:
				}
			}
		})
	}
	// Reporters: each adds its share of every second's counts and reports
	// every second.
	srvSz := sz
	srvSz.tenants = sz.serverTenants
	rates := tbRates(sz.serverTenants, 5)
	reports := tbReports(srvSz, rates)
	rctx, stopReporters := context.WithCancel(ctx)
	var rwg sync.WaitGroup
	reporters := make([]*client.LoadReporter, sz.reporters)
	defer func() {
		stopReporters()
		rwg.Wait()
		for _, r := range reporters {
			if r != nil {
				r.Close()
			}
		}
	}()
	for i := range reporters {
		reporters[i], err = cl.NewLoadReporter(tbPool, fmt.Sprintf("reporter-%03d", i), client.ReportInterval(time.Second))
		if err != nil {
			return err
		}
		r, cs := reporters[i], reports[i]
		rwg.Go(func() { // exits on stopReporters
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				for _, c := range cs {
					r.Add(c.Tenant, c.N)
				}
				select {
				case <-rctx.Done():
					return
				case <-t.C:
				}
			}
		})
	}
	say("server: %d members, %d reporters of %d tenants each second (each tenant by %d); waiting for the first sizing (window %v)",
		sz.members, sz.reporters, sz.serverTenants, sz.perTenant, sz.window)
	var f *client.PoolFollower
	deadline := time.Now().Add(sz.window + 2*time.Minute)
	for {
		st, err := cl.TenantPools(ctx)
		if err != nil {
			return err
		}
		if len(st) == 1 && st[0].Tenants >= sz.serverTenants {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the leader did not size the %d tenants in time", sz.serverTenants)
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
	say("server: every tenant sized; settling for a window")
	if err := sleepCtx(ctx, sz.window+time.Second); err != nil {
		return err
	}
	var cpus, bps []float64
	for run := range opts.Runs {
		b0, err := scrapeSum(ctx, srv.URL(), "keyshard_tenantpool_bytes_written_total")
		if err != nil {
			return err
		}
		c0, w0 := cpuTime(), time.Now()
		if err := sleepCtx(ctx, sz.measure); err != nil {
			return err
		}
		c1, el := cpuTime(), time.Since(w0)
		b1, err := scrapeSum(ctx, srv.URL(), "keyshard_tenantpool_bytes_written_total")
		if err != nil {
			return err
		}
		cpus = append(cpus, (c1-c0).Seconds()/el.Seconds())
		bps = append(bps, (b1-b0)/el.Seconds())
		say("run %d: %.3f cores, %.0f etcd bytes/s", run+1, cpus[run], bps[run])
	}
	rep.AggregateCPU, rep.EtcdBytesPerS = medianOf(cpus), medianOf(bps)

	// A follower holding the full snapshot.
	f, err = cl.FollowPool(ctx, tbPool)
	if err != nil {
		return err
	}
	defer f.Close()
	known := make([]string, 0, 1024)
	for i := 0; len(known) < 1024 && i < sz.serverTenants; i++ {
		if f.Known(tbTenant(i)) {
			known = append(known, tbTenant(i))
		}
	}
	if len(known) == 0 {
		return fmt.Errorf("the follower knows none of the tenants")
	}
	// One tenant's change: a member marks one of its tenants ready.
	srvMu.Lock()
	s := ks
	srvMu.Unlock()
	// A round that also rewrote other tenants (load noise moving their
	// cooldown bookkeeping) is not one tenant's change: mark another
	// tenant ready, up to tbChangeTries times, and keep the smallest.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tries := 0
	for _, t := range known {
		member := -1
		for i := range sz.members {
			if f.Serves(fmt.Sprintf("m%03d", i), t) {
				member = i
				break
			}
		}
		if member < 0 {
			continue
		}
		v0 := s.LastTenantPoolWrite(tbPool).Version
		if _, err := api.MarkReady(ctx, connect.NewRequest(&keyshardv1.MarkReadyRequest{Session: sessions[member], Tenants: []string{t}})); err != nil {
			return fmt.Errorf("mark ready: %w", err)
		}
		var w server.TenantPoolWrite
		for {
			w = s.LastTenantPoolWrite(tbPool)
			if w.Version > v0 && w.Tenants > 0 {
				break
			}
			if err := sleepCtx(wctx, 50*time.Millisecond); err != nil {
				return fmt.Errorf("no round wrote the change: %w", err)
			}
		}
		if rep.TenantsRewritten == 0 || w.Tenants < rep.TenantsRewritten {
			rep.BytesWrittenPerTenantChange, rep.WritesPerTenantChange, rep.TenantsRewritten = w.Bytes, w.Writes, w.Tenants
		}
		if tries++; rep.TenantsRewritten == 1 || tries == tbChangeTries {
			break
		}
	}
	if tries == 0 {
		return fmt.Errorf("no member serves a known tenant")
	}
	say("one tenant's change: %d bytes in %d keys (%d tenants rewritten)", rep.BytesWrittenPerTenantChange, rep.WritesPerTenantChange, rep.TenantsRewritten)
	// Targets and Serves from the follower's last snapshot, everything
	// else stopped (the follower keeps answering after Close):
	// allocations are counted process-wide, and the leader's rounds would
	// count in.
	f.Close()
	stopReporters()
	rwg.Wait()
	stopMembers()
	mwg.Wait()
	cl.Close()
	srv.Close()
	var tns, sns []float64
	var allocs int64
	for range opts.Runs {
		ns, a := nsPerOp(func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if len(f.Targets(known[i%len(known)])) == 0 {
					b.Fatal("no targets")
				}
			}
		})
		tns, allocs = append(tns, ns), max(allocs, a)
		ns, _ = nsPerOp(func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				f.Serves("m003", known[i%len(known)])
			}
		})
		sns = append(sns, ns)
	}
	rep.TargetsNs, rep.TargetsAllocs, rep.ServesNs = medianOf(tns), allocs, medianOf(sns)
	say("follower of %d tenants: Targets %.1f ns (%d allocs), Serves %.1f ns", sz.serverTenants, rep.TargetsNs, rep.TargetsAllocs, rep.ServesNs)

	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
