package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"
)

// Fault kinds.
const (
	WorkerKill       = "worker-kill"       // kill -9 a worker, restart it (--replace)
	WorkerStop       = "worker-stop"       // SIGSTOP a worker, SIGCONT it
	ReplicaKill      = "replica-kill"      // kill -9 a serve replica, restart it
	ReplicaStop      = "replica-stop"      // SIGSTOP a serve replica, SIGCONT it
	ReplicaPartition = "replica-partition" // cut a replica off from etcd
	EtcdKill         = "etcd-kill"         // kill -9 an etcd member, restart it
	EtcdStop         = "etcd-stop"         // SIGSTOP an etcd member, SIGCONT it
	EtcdLeader       = "etcd-leader"       // kill -9 the etcd leader while a worker drains
	Partition        = "partition"         // cut a worker's link to the replicas
	Reset            = "reset"             // reset every worker connection (TCP RST)
	Latency          = "latency"           // add delay on a worker's link
	Netns            = "netns"             // cut a worker in its own network namespace (root, iproute2)
)

// FaultKinds lists every fault kind and what it does.
var FaultKinds = []struct{ Name, What string }{
	{WorkerKill, "kill -9 a worker, restart it with --replace"},
	{WorkerStop, "SIGSTOP a worker for TTL/2..2·TTL, then SIGCONT"},
	{ReplicaKill, "kill -9 a serve replica, restart it on its address"},
	{ReplicaStop, "SIGSTOP a serve replica for TTL/2..2·TTL, then SIGCONT"},
	{ReplicaPartition, "cut a serve replica off from every etcd member (fault proxies)"},
	{EtcdKill, "kill -9 an etcd member (sometimes the leader), restart it"},
	{EtcdStop, "SIGSTOP an etcd member, then SIGCONT"},
	{EtcdLeader, "kill -9 the etcd leader while a worker's drain hands buckets over"},
	{Partition, "cut one worker's link to the replicas (fault proxy), then heal it"},
	{Reset, "close every worker connection with a TCP RST"},
	{Latency, "add 50–300 ms each way on one worker's link"},
	{Netns, "move a worker into its own network namespace and take its veth down (root, ip netns)"},
}

// DefaultFaults is every fault kind but netns, which needs root.
func DefaultFaults() []string {
	var out []string
	for _, k := range FaultKinds {
		if k.Name != Netns {
			out = append(out, k.Name)
		}
	}
	return out
}

// Config configures Run.
type Config struct {
	// Binary is the keyshard binary to run (serve, chaos etcd, chaos
	// worker). Required.
	Binary string
	// Dir is a directory for the etcd members' data. Required.
	Dir string
	// Seed picks the faults, targets and durations: the same seed gives
	// the same schedule.
	Seed uint64
	// Duration is how long to inject faults (setup and the final checks
	// come on top).
	Duration time.Duration
	// Faults are the kinds to inject (default DefaultFaults), in any
	// order.
	Faults []string
	// TTL is the keyspace's lease TTL; DrainTimeout its drain timeout.
	TTL, DrainTimeout time.Duration
	// ElectionTTL is the replicas' election_ttl (default: TTL - 1 s in
	// whole seconds, at least 2 s), so that a crashed leader is replaced
	// within the bound.
	ElectionTTL time.Duration
	// EtcdElection is the etcd members' election timeout (default TTL/6,
	// at most etcd's default 1s, at least 100ms), so that a lost etcd
	// leader is replaced well within the TTL, as the README advises for
	// short lease TTLs.
	EtcdElection time.Duration
	// Workers, Members and Buckets size the cluster.
	Workers, Members, Buckets int
	// Interval is the time between two writes of one held bucket.
	Interval time.Duration
	// Bound is how long a bucket may stay unserved after a fault (default
	// TTL + 1 s). Every fault keeps an etcd quorum and one replica.
	Bound time.Duration
	// SettleLimit is how long to wait, after a fault is healed, for every
	// bucket to be served again before moving on.
	SettleLimit time.Duration
	// Progress receives progress lines (nil: none). Log receives the
	// children's logs, each line prefixed with its name (nil: none).
	Progress, Log io.Writer
}

// DefaultConfig returns the defaults: 3 etcd members, 4 workers, 32
// buckets, TTL 3 s, one minute.
func DefaultConfig() Config {
	return Config{
		Duration: time.Minute, TTL: 3 * time.Second, DrainTimeout: 10 * time.Second,
		Workers: 4, Members: 3, Buckets: 32, Interval: 100 * time.Millisecond,
	}
}

func (c *Config) validate() error {
	if c.Binary == "" || c.Dir == "" {
		return errors.New("chaos: Config.Binary and Config.Dir are required")
	}
	if len(c.Faults) == 0 {
		c.Faults = DefaultFaults()
	}
	// Sorted, so that the schedule depends on the set of kinds and not
	// on the order they were given in.
	c.Faults = slices.Compact(slices.Sorted(slices.Values(c.Faults)))
	for _, f := range c.Faults {
		if !slices.ContainsFunc(FaultKinds, func(k struct{ Name, What string }) bool { return k.Name == f }) {
			var names []string
			for _, k := range FaultKinds {
				names = append(names, k.Name)
			}
			return fmt.Errorf("chaos: unknown fault kind %q; the kinds are %s", f, strings.Join(names, ", "))
		}
	}
	switch {
	case c.TTL < time.Second:
		return fmt.Errorf("chaos: TTL %v: want at least 1s", c.TTL)
	case c.Workers < 2:
		return fmt.Errorf("chaos: %d workers: want at least 2, so that buckets have somewhere to go", c.Workers)
	case c.Members != 3:
		return fmt.Errorf("chaos: %d etcd members: the suite runs 3 (a fault takes one down and keeps the quorum)", c.Members)
	case c.Buckets < c.Workers:
		return fmt.Errorf("chaos: %d buckets for %d workers: want at least one per worker", c.Buckets, c.Workers)
	case c.Interval <= 0 || c.Duration <= 0:
		return errors.New("chaos: Interval and Duration must be positive")
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 10 * time.Second
	}
	if c.EtcdElection <= 0 {
		c.EtcdElection = min(max(c.TTL/6, 100*time.Millisecond), time.Second)
	}
	if c.ElectionTTL <= 0 {
		c.ElectionTTL = max((c.TTL - time.Second).Truncate(time.Second), 2*time.Second)
	}
	if c.Bound <= 0 {
		c.Bound = c.TTL + time.Second
	}
	if c.SettleLimit <= 0 {
		c.SettleLimit = max(30*time.Second, 6*c.TTL)
	}
	return nil
}

// KindStats sums up the faults of one kind.
type KindStats struct {
	Kind       string `json:"kind"`
	Injected   int    `json:"injected"`
	Proven     int    `json:"proven"`
	Violations int    `json:"violations"`
	// Misses counts faults after which a bucket stayed unserved longer
	// than the bound, or that never settled.
	Misses int `json:"bound_misses"`
	// Refused counts late (stale) writes the sink refused.
	Refused int `json:"refused_writes"`
	// P50, P99 and Max are over the faults of this kind, of the longest
	// time one bucket stayed unserved after each.
	P50 time.Duration `json:"unserved_p50_ns"`
	P99 time.Duration `json:"unserved_p99_ns"`
	Max time.Duration `json:"unserved_max_ns"`
}

// Report is the outcome of a run.
type Report struct {
	Seed         uint64        `json:"seed"`
	Duration     time.Duration `json:"duration_ns"`
	Faults       []string      `json:"faults"`
	TTL          time.Duration `json:"ttl_ns"`
	Election     time.Duration `json:"election_ttl_ns"`
	EtcdElection time.Duration `json:"etcd_election_timeout_ns"`
	Bound        time.Duration `json:"bound_ns"`
	Workers      int           `json:"workers"`
	Buckets      int           `json:"buckets"`
	Records      int           `json:"records"`
	Kinds        []KindStats   `json:"kinds"`
	Analysis     *Analysis     `json:"analysis"`
	// Skipped names fault kinds that cannot run here, and why.
	Skipped map[string]string `json:"skipped,omitempty"`
	// Replay is the command line that replays the run's schedule.
	Replay string `json:"replay"`
	// Interrupted: the run was stopped early (its context ended).
	Interrupted bool `json:"interrupted,omitempty"`
}

// OK reports whether the run found no safety violation.
func (r *Report) OK() bool { return len(r.Analysis.Violations) == 0 }

// step is one scheduled fault: every draw from the seed's random stream
// is made whatever the kind, so that the schedule depends on the seed
// alone.
type step struct {
	kind    string
	target  int           // index into the kind's targets, taken modulo their number
	dur     time.Duration // how long the fault lasts (stop, partition, latency)
	restart time.Duration // how long a killed process stays down
	delay   time.Duration // added latency, each way
	pause   time.Duration // quiet time after the fault settled
}

func nextStep(rng *rand.Rand, kinds []string, ttl time.Duration) step {
	return step{
		kind:    kinds[rng.IntN(len(kinds))],
		target:  rng.IntN(1 << 20),
		dur:     ttl/2 + time.Duration(rng.Int64N(int64(3*ttl/2))),
		restart: 200*time.Millisecond + time.Duration(rng.Int64N(int64(ttl))),
		delay:   50*time.Millisecond + time.Duration(rng.Int64N(int64(250*time.Millisecond))),
		pause:   500*time.Millisecond + time.Duration(rng.Int64N(int64(1500*time.Millisecond))),
	}
}

// Run starts the cluster, injects faults for cfg.Duration on the seed's
// schedule, checks the whole record and returns the report. It returns an
// error if the cluster could not be run (not for violations: see
// Report.OK). Every process it started is gone when it returns. Ending
// ctx stops the run early; the report covers what was recorded.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	p := newProgress(cfg.Progress)
	defer p.stop()
	rep := &Report{Seed: cfg.Seed, Duration: cfg.Duration, Faults: cfg.Faults, TTL: cfg.TTL, Election: cfg.ElectionTTL, EtcdElection: cfg.EtcdElection,
		Bound: cfg.Bound, Workers: cfg.Workers, Buckets: cfg.Buckets, Skipped: map[string]string{}}
	rep.Replay = fmt.Sprintf("keyshard chaos --seed %d --duration %v --faults %s --ttl %v --election-ttl %v --etcd-election-timeout %v --workers %d",
		cfg.Seed, cfg.Duration, strings.Join(cfg.Faults, ","), cfg.TTL, cfg.ElectionTTL, cfg.EtcdElection, cfg.Workers)
	p.printf("seed %d; faults %s; TTL %v; election TTL %v; etcd election timeout %v; bound %v; replay: %s", cfg.Seed, strings.Join(cfg.Faults, ","), cfg.TTL, cfg.ElectionTTL, cfg.EtcdElection, cfg.Bound, rep.Replay)

	kinds := slices.Clone(cfg.Faults)
	if slices.Contains(kinds, Netns) {
		if why := netnsUnavailable(); why != "" {
			p.printf("skipping fault kind %s: %s", Netns, why)
			rep.Skipped[Netns] = why
			kinds = slices.DeleteFunc(kinds, func(k string) bool { return k == Netns })
		}
	}
	if len(kinds) == 0 {
		return nil, errors.New("chaos: no fault kind can run here")
	}

	c := &cluster{cfg: cfg}
	defer c.close()
	r := &runner{c: c, p: p, cfg: cfg}
	p.phase("starting the cluster")
	if err := c.start(ctx, p, slices.Contains(kinds, Netns)); err != nil {
		return nil, fmt.Errorf("chaos: start the cluster: %w", err)
	}
	p.watch(c.sink)
	p.phase("waiting until every bucket is served")
	if d, ok := r.settle(ctx, 0, 2*cfg.SettleLimit); !ok {
		return nil, fmt.Errorf("chaos: the cluster never served every bucket (waited %v)", d)
	}
	p.printf("cluster up: 3 etcd members, 2 replicas, %d workers; every one of %d buckets served", cfg.Workers, cfg.Buckets)

	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	deadline := time.Now().Add(cfg.Duration)
	for n := 1; time.Now().Before(deadline) && ctx.Err() == nil; n++ {
		st := nextStep(rng, kinds, cfg.TTL)
		if err := r.revive(ctx); err != nil {
			return nil, err
		}
		if err := r.inject(ctx, n, st); err != nil {
			if ctx.Err() != nil {
				break
			}
			return nil, fmt.Errorf("chaos: fault %d (%s): %w", n, st.kind, err)
		}
		sleepCtx(ctx, st.pause)
	}
	if ctx.Err() != nil {
		p.printf("interrupted: the report covers what was recorded until now")
		rep.Interrupted = true
	} else {
		r.finalChecks(ctx)
	}

	recs := c.sink.Records()
	rep.Records = len(recs)
	rep.Analysis = Analyze(recs, cfg.Buckets, cfg.Bound)
	if fs := rep.Analysis.Faults; rep.Interrupted && len(fs) > 0 && !fs[len(fs)-1].Settled {
		// The interruption, not the system, cut the last fault short.
		last := fs[len(fs)-1]
		rep.Analysis.Misses = slices.DeleteFunc(rep.Analysis.Misses, func(m string) bool { return m == last.Miss })
		last.Miss = ""
	}
	rep.Analysis.Misses = append(rep.Analysis.Misses, r.misses...)
	rep.Kinds = kindStats(rep.Analysis, cfg.Faults)
	p.printf("done: %d records, %d writes (%d late writes refused), %d violations, %d bound misses",
		len(recs), rep.Analysis.Writes, rep.Analysis.Refused, len(rep.Analysis.Violations), len(rep.Analysis.Misses))
	return rep, nil
}

// kindStats sums the analysis up per fault kind, in the order of kinds.
func kindStats(a *Analysis, kinds []string) []KindStats {
	var out []KindStats
	for _, k := range kinds {
		ks := KindStats{Kind: k}
		var un []time.Duration
		for _, f := range a.Faults {
			if f.Kind != k {
				continue
			}
			ks.Injected++
			if f.Proven {
				ks.Proven++
			}
			ks.Violations += len(f.Violations)
			ks.Refused += f.Refused
			un = append(un, f.Unserved)
			if f.Miss != "" {
				ks.Misses++
			}
		}
		if len(un) > 0 {
			slices.Sort(un)
			ks.P50, ks.P99, ks.Max = percentile(un, 0.50), percentile(un, 0.99), un[len(un)-1]
		}
		out = append(out, ks)
	}
	return out
}

// percentile returns the q-quantile of sorted ds (nearest rank).
func percentile(ds []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(ds))+0.5) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

// WriteText writes the report as a table for people.
func (r *Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "\nseed %d, %v of faults, TTL %v, %d workers, %d buckets: %d records, %d writes, %d late writes refused\n",
		r.Seed, r.Duration, r.TTL, r.Workers, r.Buckets, r.Records, r.Analysis.Writes, r.Analysis.Refused)
	if r.Interrupted {
		fmt.Fprintln(w, "(interrupted before the duration ended)")
	}
	fmt.Fprintf(w, "%-18s %8s %7s %10s %7s %8s %9s %9s %9s\n", "fault", "injected", "proven", "violations", "misses", "refused", "unserved", "p99", "max")
	fmt.Fprintf(w, "%-18s %8s %7s %10s %7s %8s %9s %9s %9s\n", "", "", "", "", "", "", "p50", "", "")
	for _, k := range r.Kinds {
		if why, ok := r.Skipped[k.Kind]; ok {
			fmt.Fprintf(w, "%-18s skipped: %s\n", k.Kind, why)
			continue
		}
		fmt.Fprintf(w, "%-18s %8d %7d %10d %7d %8d %9s %9s %9s\n", k.Kind, k.Injected, k.Proven, k.Violations, k.Misses, k.Refused,
			dur(k.P50, k.Injected), dur(k.P99, k.Injected), dur(k.Max, k.Injected))
	}
	for i, v := range r.Analysis.Violations {
		if i == 50 {
			fmt.Fprintf(w, "... and %d more violations\n", len(r.Analysis.Violations)-i)
			break
		}
		fmt.Fprintf(w, "VIOLATION %s\n", v)
	}
	for _, m := range r.Analysis.Misses {
		fmt.Fprintf(w, "bound miss: %s\n", m)
	}
	verdict := "no safety violation"
	if !r.OK() {
		verdict = fmt.Sprintf("%d SAFETY VIOLATIONS", len(r.Analysis.Violations))
	}
	fmt.Fprintf(w, "%s; %d liveness bound misses (bound %v). Replay: %s\n", verdict, len(r.Analysis.Misses), r.Bound, r.Replay)
}

func dur(d time.Duration, n int) string {
	if n == 0 {
		return "-"
	}
	return d.Round(10 * time.Millisecond).String()
}

// progress prints timestamped progress lines, and a heartbeat line with
// the current phase whenever nothing was printed for a few seconds, so
// that a run is never silent.
type progress struct {
	w     io.Writer
	start time.Time

	mu    sync.Mutex
	last  time.Time
	what  string
	sink  *Sink
	quit  chan struct{}
	done  chan struct{}
	stops sync.Once
}

const heartbeat = 5 * time.Second

func newProgress(w io.Writer) *progress {
	p := &progress{w: w, start: time.Now(), last: time.Now(), quit: make(chan struct{}), done: make(chan struct{})}
	go p.beat() // exits when stop closes quit
	return p
}

func (p *progress) beat() {
	defer close(p.done)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-p.quit:
			return
		case <-t.C:
		}
		p.mu.Lock()
		quiet, what, s := time.Since(p.last) >= heartbeat, p.what, p.sink
		p.mu.Unlock()
		if quiet && what != "" {
			extra := ""
			if s != nil {
				extra = fmt.Sprintf(" (%d records so far)", s.Seq())
			}
			p.printf("... %s%s", what, extra)
		}
	}
}

func (p *progress) stop() {
	p.stops.Do(func() { close(p.quit) })
	<-p.done
}

func (p *progress) watch(s *Sink) {
	p.mu.Lock()
	p.sink = s
	p.mu.Unlock()
}

// phase says what the run is doing, for the heartbeat.
func (p *progress) phase(what string) {
	p.mu.Lock()
	p.what = what
	p.mu.Unlock()
}

func (p *progress) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last = time.Now()
	if p.w == nil {
		return
	}
	fmt.Fprintf(p.w, "[%7.1fs] %s\n", time.Since(p.start).Seconds(), fmt.Sprintf(format, args...))
}
