package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/keyshard/keyshard/internal/bench"
	"github.com/keyshard/keyshard/internal/chaos"
	"github.com/keyshard/keyshard/internal/server"
)

func newBench() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure Keyshard against its speed and quality targets",
		Long: `Measure Keyshard against its targets. Each suite prints progress to stderr
and a summary (or, with --json, one JSON object) to stdout. Timings are
medians over --runs runs.`,
	}
	cmd.AddCommand(newBenchPlacement(), newBenchHotkeys(), newBenchControl(), newBenchStream(), newBenchTenants(), newBenchClients(), newBenchScale(), newBenchEtcd(), newBenchEcho())
	return cmd
}

func newBenchHotkeys() *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "hotkeys",
		Short: "Hot-key detector throughput, memory and accuracy, and the overflow decision cost",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.apply(); err != nil {
				return err
			}
			rep, err := bench.Hotkeys(cmd.Context(), f.runs, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if f.json {
				return writeJSON(cmd.OutOrStdout(), rep)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "detector            %.1fM observations/s, %.0f allocs each, %d bytes for 10,000 keys\n", rep.DetectorOpsPerS/1e6, rep.DetectorAllocs, rep.DetectorBytes)
			fmt.Fprintf(out, "router decision     %.1f ns\n", rep.RouterDecisionNs)
			fmt.Fprintf(out, "accuracy            recall %.4f, %d false reports\n", rep.Recall, rep.FalseReports)
			fmt.Fprintf(out, "10M distinct keys   heap growth %d bytes\n", rep.MemoryGrowth10MUniqueBytes)
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func newBenchControl() *cobra.Command {
	var f benchFlags
	var quick, verbose bool
	cmd := &cobra.Command{
		Use:   "control",
		Short: "The control plane end to end: router lookups, handoffs, scale-out, crash takeover, map fan-out",
		Long: `Start an embedded etcd and Keyshard server on loopback and drive them with
in-process SDK workers and routers: the cost of a router lookup, the time of
graceful handoffs (a third of a keyspace at once, and one bucket alone)
next to etcd's own floor for one (two fenced writes, each seen on a watch,
measured on the same etcd in between), a 4th worker joining 3 on 16384 buckets (time and etcd
writes), the takeover of a crashed worker's buckets, and 100 routers
following new maps. Takes under two minutes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.apply(); err != nil {
				return err
			}
			opts := bench.ControlOptions{Runs: f.runs, Quick: quick}
			if verbose {
				opts.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			}
			rep, err := bench.Control(cmd.Context(), opts, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if f.json {
				return writeJSON(cmd.OutOrStdout(), rep)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "measure\tvalue\ttarget")
			fmt.Fprintf(tw, "router OwnerString (%d buckets, %d members)\t%.1f ns, %d allocs\t≤ 50 ns, 0 allocs\n", rep.RouterBuckets, rep.RouterMembers, rep.RouterOwnerNs, rep.RouterOwnerAllocs)
			fmt.Fprintf(tw, "graceful handoff, release → acquire (%d)\tp50 %.1f ms, p99 %.1f ms\tp99 ≤ 50 ms\n", rep.Handoffs, rep.HandoffP50Ms, rep.HandoffP99Ms)
			fmt.Fprintf(tw, "store floor: 2 fenced writes, each seen on a watch (%d)\tp50 %.1f ms, p99 %.1f ms\t—\n", rep.FloorPairs, rep.FloorP50Ms, rep.FloorP99Ms)
			fmt.Fprintf(tw, "handoff / floor\tp50 %.2f×, p99 %.2f×\tp99 ≤ 2×, handoff p50 ≤ 5 ms\n", rep.HandoffP50OverFloorP50, rep.HandoffP99OverFloorP99)
			fmt.Fprintf(tw, "one bucket's handoff alone, release → acquire (%d)\tp50 %.1f ms, p99 %.1f ms\tp50 ≤ 5 ms\n", rep.SingleHandoffs, rep.SingleHandoffP50Ms, rep.SingleHandoffP99Ms)
			fmt.Fprintf(tw, "one bucket's handoff / floor\tp50 %.2f×, p99 %.2f×\tp99 ≤ 2×\n", rep.SingleHandoffP50OverFloorP50, rep.SingleHandoffP99OverFloorP99)
			fmt.Fprintf(tw, "scale-out 3 → 4 workers, %d buckets\t%.3f s, %d moved, %d etcd writes\t≤ 2 s, writes O(members)\n", rep.ScaleoutBuckets, rep.ScaleoutS, rep.ScaleoutMovedBuckets, rep.ScaleoutEtcdWrites)
			fmt.Fprintf(tw, "crash takeover\t%.3f s (lease TTL %.0f s)\t≤ TTL + 1 s\n", rep.CrashTakeoverS, rep.LeaseTTLS)
			fmt.Fprintf(tw, "map fan-out to %d routers (%d epochs)\tp50 %.1f ms, p99 %.1f ms, %d missed\tp99 ≤ 200 ms\n", rep.WatchRouters, rep.WatchEpochs, rep.WatchFanoutP50Ms, rep.WatchFanoutP99Ms, rep.WatchMissed)
			fmt.Fprintf(tw, "releases the server lost\t%d (%d sessions revoked)\t0\n", rep.LostReleases, rep.RevokedSessions)
			return tw.Flush()
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&quick, "quick", false, "small keyspaces and few routers: a smoke test, not comparable with the targets")
	cmd.Flags().BoolVar(&verbose, "verbose", false, "also print the server's, etcd's and workers' logs")
	return cmd
}

func newBenchTenants() *cobra.Command {
	var f benchFlags
	var quick, verbose bool
	cmd := &cobra.Command{
		Use:   "tenants",
		Short: "Tenant pools: aggregation CPU and etcd bytes, Targets cost, growth and leave moves, bytes per change, plan rounds",
		Long: `Measure tenant pools against their targets: a real server on an embedded
etcd with 100 reporters reporting 100,000 tenants every second (each tenant
by 3 reporters): the process's CPU and the etcd bytes written per second;
PoolFollower.Targets and Serves on that snapshot; the bytes one tenant's
change writes; and, on the pure core, a pool growing from 10 to 100
members (sizes changed, placements moved against the minimum), one member
leaving, and Planner rounds over 100,000 tenants. Takes about two minutes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.apply(); err != nil {
				return err
			}
			opts := bench.TenantsOptions{Runs: f.runs, Quick: quick}
			if verbose {
				opts.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			}
			rep, err := bench.Tenants(cmd.Context(), opts, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if f.json {
				return writeJSON(cmd.OutOrStdout(), rep)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "measure\tvalue\ttarget")
			fmt.Fprintf(tw, "aggregation, %d tenants, %d reporters/s (process)\t%.3f cores, %.0f etcd bytes/s\t< 1 core\n", rep.ServerTenants, rep.Reporters, rep.AggregateCPU, rep.EtcdBytesPerS)
			fmt.Fprintf(tw, "pure core, %d tenants (aggregate, rates, round)\t%.3f cores\t\n", rep.Tenants, rep.AggregateCoreCPU)
			fmt.Fprintf(tw, "PoolFollower.Targets / Serves\t%.1f ns, %d allocs / %.1f ns\t≤ 100 ns, 0 allocs\n", rep.TargetsNs, rep.TargetsAllocs, rep.ServesNs)
			fmt.Fprintf(tw, "growth 10 → 100 members, %d tenants\t%d sizes changed, %d moved (minimum %d, ×%.2f)\t0 sizes\n", rep.GrowthTenants, rep.GrowthSizeChanges, rep.GrowthMoved, rep.GrowthMinimum, rep.GrowthMovedOverMin)
			fmt.Fprintf(tw, "one member of 100 leaves\t%d of %d holders changed by one; %d changed; %d sizes\tholders only, by one\n", rep.LeaveChangedByOne, rep.LeaveHolders, rep.LeaveChanged, rep.LeaveSizeChanges)
			fmt.Fprintf(tw, "one tenant's change, %d tenants\t%d bytes, %d keys, %d tenants\tone chunk\n", rep.ServerTenants, rep.BytesWrittenPerTenantChange, rep.WritesPerTenantChange, rep.TenantsRewritten)
			fmt.Fprintf(tw, "plan round, %d tenants\tsteady %.1f ms, after a leave %.1f ms\t\n", rep.PlanTenants, rep.PlanSteadyMs, rep.PlanLeaveMs)
			return tw.Flush()
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&quick, "quick", false, "10,000 tenants and 10 reporters: a smoke test, not comparable with the targets")
	cmd.Flags().BoolVar(&verbose, "verbose", false, "also print the server's logs")
	return cmd
}

func newBenchClients() *cobra.Command {
	var (
		asJSON, quick, verbose bool
		runs, cycles           int
		langs, repo            string
	)
	cmd := &cobra.Command{
		Use:   "clients",
		Short: "Graceful handoff latency between worker processes of each client language (Go, Python, Node)",
		Long: `Start a Keyshard server (embedded etcd) on loopback and a fenced sink, and, for
each language of --langs, a keyspace of 64 buckets (lease TTL 10 s) held by
two worker processes of that language's client: ` + "`keyshard chaos worker`" + ` for Go,
python3 clients/python/tools/chaos_worker.py and node
clients/node/tools/chaos-worker.mjs from the repository for Python and Node.
A third worker of the same language joins and leaves gracefully --cycles
times. Each handoff is timed at the sink, on its clock, from the old owner's
release record to the new owner's acquire record of the bucket's next token.

Per language it prints the handoffs counted, their p50, p99 and max (medians
of the --runs runs), and the ratio of the p99 to Go's. Python and Node
workers need python3 and node on PATH and the repository (found from the
working directory, or --repo).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runs < 1 {
				return fmt.Errorf("--runs is %d; want at least 1", runs)
			}
			if cycles < 0 {
				return fmt.Errorf("--cycles is %d; want at least 1 (0: the default)", cycles)
			}
			ls, err := chaos.ParseLangs(langs)
			if err != nil {
				return fmt.Errorf("--langs: %w", err)
			}
			bin, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find the keyshard binary to run Go workers with: %w", err)
			}
			ws := chaos.Workers{Keyshard: bin, Repo: repo}
			if repo == "" {
				// Only Python and Node workers need the repository.
				r, err := chaos.FindRepo(".")
				if err != nil && slices.ContainsFunc(ls, func(l chaos.Lang) bool { return l != chaos.LangGo }) {
					return fmt.Errorf("%w, or pass --repo", err)
				}
				ws.Repo = r
			}
			opts := bench.ClientsOptions{Langs: ls, Runs: runs, Cycles: cycles, Quick: quick, Workers: ws}
			if verbose {
				opts.Logs = cmd.ErrOrStderr()
				opts.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			}
			rep, err := bench.Clients(cmd.Context(), opts, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if asJSON {
				err = writeJSON(cmd.OutOrStdout(), rep)
			} else {
				err = writeClientsText(cmd.OutOrStdout(), rep)
			}
			if err != nil {
				return err
			}
			var bad []string
			for _, l := range rep.Langs {
				if lh := rep.PerLang[l]; lh.Violations > 0 {
					bad = append(bad, fmt.Sprintf("%s: %d (%s)", l, lh.Violations, lh.ViolationExamples[0]))
				}
			}
			if len(bad) > 0 {
				return fmt.Errorf("safety violations in the sink's record: %s", strings.Join(bad, "; "))
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&langs, "langs", "go,python,node", "comma-separated client languages to measure: go, python, node")
	fl.IntVar(&cycles, "cycles", 0, "times the third worker joins and leaves per run (default 5, 2 with --quick)")
	fl.IntVar(&runs, "runs", 3, "runs per language; the medians of the runs' percentiles are reported")
	fl.BoolVar(&quick, "quick", false, "fewer cycles: a smoke test")
	fl.BoolVar(&asJSON, "json", false, "print one JSON object on stdout")
	fl.StringVar(&repo, "repo", "", "the Keyshard repository, for the Python and Node worker scripts (default: found from the working directory)")
	fl.BoolVar(&verbose, "verbose", false, "also print the server's and the workers' logs")
	return cmd
}

func writeClientsText(w io.Writer, rep bench.ClientsReport) error {
	fmt.Fprintf(w, "graceful handoff; %d buckets, lease TTL %.0f s, %d cycles × %d runs (p50/p99/max: medians of the runs)\n", rep.Buckets, rep.LeaseTTLS, rep.Cycles, rep.Runs)
	fmt.Fprintln(w, "  at sink: old owner's release record → new owner's acquire record, as the fenced sink received them")
	fmt.Fprintln(w, "  library: old owner's Release handler returned (the library took over) → new owner's Acquire handler called, on the machine's monotonic clock")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "lang\thandoffs\tat sink p50/p99 ms\tvs go\tlibrary p50/p99 ms\tvs go\tjoin ms\tleave ms\tfenced\tviolations")
	ratio := func(r *float64) string {
		if r == nil {
			return "-"
		}
		return fmt.Sprintf("%.2f", *r)
	}
	for _, l := range rep.Langs {
		lh := rep.PerLang[l]
		fmt.Fprintf(tw, "%s\t%d\t%.1f / %.1f\t%s\t%.1f / %.1f\t%s\t%.0f\t%.0f\t%d\t%d\n", l, lh.Handoffs, lh.HandoffP50Ms, lh.HandoffP99Ms, ratio(lh.P99RatioVsGo),
			lh.LibraryP50Ms, lh.LibraryP99Ms, ratio(lh.LibraryP99RatioVsGo), lh.JoinMs, lh.LeaveMs, lh.FencedReleases, lh.Violations)
	}
	return tw.Flush()
}

// benchFlags are shared by every bench suite.
type benchFlags struct {
	json      bool
	runs      int
	benchtime string
}

func (f *benchFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.json, "json", false, "print one JSON object on stdout")
	cmd.Flags().IntVar(&f.runs, "runs", 3, "runs per timing; the median is reported")
	cmd.Flags().StringVar(&f.benchtime, "benchtime", "100ms", "time per timing run (Go duration, or Nx for N iterations)")
}

func (f *benchFlags) apply() error {
	if f.runs < 1 {
		return fmt.Errorf("--runs is %d; want at least 1", f.runs)
	}
	testing.Init() // registers the flags that testing.Benchmark reads
	if err := flag.CommandLine.Set("test.benchtime", f.benchtime); err != nil {
		return fmt.Errorf("--benchtime %q: want a duration such as 100ms or an iteration count such as 1000x", f.benchtime)
	}
	return nil
}

func newBenchStream() *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "stream",
		Short: "Stream mode: the commit record's size, commits per second through the API and at the store, the SDK's catch-up filter",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.apply(); err != nil {
				return err
			}
			rep, err := bench.Stream(cmd.Context(), f.runs, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if f.json {
				return writeJSON(cmd.OutOrStdout(), rep)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "commit record       %d bytes for 4,096 buckets at one position, %d with 16 behind\n", rep.CommitBytesUniform4096, rep.CommitBytes16Exceptions)
			fmt.Fprintf(out, "commits (API)       %.0f/s from one worker with %d in flight, p50 %.2f ms, p99 %.2f ms, %.2f etcd writes per call\n", rep.CommitsPerS, rep.CommitInFlight, rep.CommitAPIP50Ms, rep.CommitAPIP99Ms, rep.CommitWritesPerCall)
			fmt.Fprintf(out, "commits (store)     %.0f/s one after the other, p50 %.2f ms, p99 %.2f ms, %.2f etcd writes per commit\n", rep.CommitsPerSStoreSequential, rep.CommitStoreP50Ms, rep.CommitStoreP99Ms, rep.CommitStoreWritesPerCall)
			fmt.Fprintf(out, "catch-up filter     %.1fM records/s (xxh64), %.1fM (synapse-sha256)\n", rep.CatchupFilterEventsPerS/1e6, rep.CatchupFilterSHA256EventsPerS/1e6)
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func newBenchPlacement() *cobra.Command {
	var f benchFlags
	var buckets, members []int
	var keys int
	var skipShards bool
	cmd := &cobra.Command{
		Use:   "placement",
		Short: "Key lookup, key spread, moves against the optimum and plan time, for a grid of bucket and member counts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.apply(); err != nil {
				return err
			}
			for _, b := range buckets {
				if b < 1 || b > 65536 {
					return fmt.Errorf("--buckets %d is out of range [1, 65536]", b)
				}
			}
			for _, n := range members {
				if n < 2 {
					return fmt.Errorf("--members %d: want at least 2 (one leaves in the remove case)", n)
				}
			}
			rep, err := bench.Placement(cmd.Context(), bench.PlacementOptions{Buckets: buckets, Members: members, Runs: f.runs, Keys: keys, SkipShards: skipShards}, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if f.json {
				return writeJSON(cmd.OutOrStdout(), rep)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "buckets\tmembers\tlookup ns\thash ns\tallocs\tmax/mean\tspread\tjoin moved/opt\tleave moved/opt\tjoin µs\tleave µs\tfull µs\t")
			for _, c := range rep.Cases {
				fmt.Fprintf(tw, "%d\t%d\t%.1f\t%.1f\t%d\t%.3f\t%d\t%d/%d\t%d/%d\t%.0f\t%.0f\t%.0f\t\n", c.Buckets, c.Members, c.LookupNs, c.HashNs, c.LookupAllocs,
					c.MaxOverMean, c.BucketSpread, c.Add.Moved, c.Add.Optimal, c.Remove.Moved, c.Remove.Optimal, c.RebalanceUs, c.RemoveUs, c.FullAssignUs)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if s := rep.Shards; s != nil {
				fmt.Fprintf(cmd.OutOrStdout(), "\nshuffle shards, %d tenants over %d members in %d zones: from nothing %.0f ms (max/mean %.3f), one member leaving %.1f ms (%d tenants changed, %d had it)\n",
					s.Tenants, s.Members, s.Zones, s.RecomputeMs, s.MaxOverMean, s.MemberLeaveMs, s.LeaveChanged, s.LeaveHolders)
				fmt.Fprintf(cmd.OutOrStdout(), "pairwise overlap: mean %.4f (random %.4f), above random p99 %.3f%% (random %.3f%%)\n", s.OverlapMean, s.OverlapRandomMean, s.OverlapTailPct, s.OverlapRandomTailP)
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().IntSliceVar(&buckets, "buckets", nil, "bucket counts to measure (default 1024,16384,65536)")
	cmd.Flags().IntSliceVar(&members, "members", nil, "member counts to measure (default 3,10,50,200)")
	cmd.Flags().IntVar(&keys, "keys", 1_000_000, "random keys for the keys-per-member spread")
	cmd.Flags().BoolVar(&skipShards, "skip-shards", false, "leave out the 100,000-tenant shuffle-shard case")
	return cmd
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newBenchScale() *cobra.Command {
	var (
		o          bench.ScaleOptions
		asJSON     bool
		scenarios  string
		liveBucket int
	)
	cmd := &cobra.Command{
		Use:   "scale",
		Short: "The control plane at fleet sizes: a join storm, 10,000 live members, 10,000 routers, a 10% crash",
		Long: `Run etcd (` + "`keyshard bench etcd`" + `) and ` + "`keyshard serve`" + ` as child processes on
loopback, fresh for each scenario, and drive them from this process with
simulated members (Join; a keep-alive every lease TTL / 3 and the grants
on a Session stream, or KeepAlive calls and WatchGrants with
--unary-keepalives; an immediate Release of every bucket asked for) and
routers (client.Router on WatchMap streams, and raw GetMap long polls),
all over shared HTTP/2
connections. CPU (utime+stime) and resident memory of serve and of etcd
are read from /proc apart.

Scenarios (--scenarios): join-storm (--members join one keyspace of
--buckets buckets within 10 s: time until every bucket is granted, etcd
writes, CPU), live (--live-members over --keyspaces keyspaces: CPU per
1,000 members, serve memory per member, etcd database size over a 30 s
window), live-floor (the live scenario's members against ` + "`keyshard bench echo`" + `,
the member API with nothing behind it: what HTTP/2 and connect alone cost
for that traffic, the floor under live's CPU and memory), routers
(--routers follow one keyspace; a member joins: the new
epoch's delay to each), crash (10% of --members stop without leaving:
time until their buckets are granted again). Each prints where the time
went from serve's /metrics. The binary run is this one, or $KEYSHARD_BIN.
The full sizes take several minutes. To profile a run, set
KEYSHARD_DEBUG_LISTEN (serve's /debug/pprof) and
KEYSHARD_BENCH_ETCD_DEBUG_LISTEN (etcd's) to two free addresses.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if scenarios != "" {
				for s := range strings.SplitSeq(scenarios, ",") {
					o.Scenarios = append(o.Scenarios, strings.TrimSpace(s))
				}
			}
			o.LiveBuckets = liveBucket
			o.Binary = os.Getenv("KEYSHARD_BIN")
			if o.Binary == "" {
				bin, err := os.Executable()
				if err != nil {
					return fmt.Errorf("find the keyshard binary to run serve and etcd with (or set KEYSHARD_BIN): %w", err)
				}
				o.Binary = bin
			}
			rep, err := bench.Scale(cmd.Context(), o, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), rep)
			}
			return writeScaleText(cmd.OutOrStdout(), rep)
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&asJSON, "json", false, "print one JSON object on stdout")
	fl.BoolVar(&o.Quick, "quick", false, "small sizes and short windows: a smoke test, not comparable with the targets")
	fl.StringVar(&scenarios, "scenarios", "", "comma-separated scenarios: join-storm, live, live-floor, routers, crash (default all)")
	fl.StringVar(&o.Etcd, "etcd", bench.EtcdEmbedded, "etcd to run: embedded (one member) or cluster3 (three members on loopback)")
	fl.IntVar(&o.Members, "members", 0, "members of the join storm and of the crash scenario (default 1000; 50 with --quick)")
	fl.IntVar(&o.Buckets, "buckets", 0, "buckets of the join storm's and the crash scenario's keyspace (default 65536; 1024 with --quick)")
	fl.IntVar(&o.LiveMembers, "live-members", 0, "members of the live scenario (default 10000; 100 with --quick)")
	fl.IntVar(&o.Keyspaces, "keyspaces", 0, "keyspaces of the live scenario (default 100; 2 with --quick)")
	fl.IntVar(&liveBucket, "live-buckets", 0, "buckets of each live keyspace and of the routers' keyspace (default 1024; 64 with --quick)")
	fl.IntVar(&o.Routers, "routers", 0, "routers following one keyspace, half streams, half long polls (default 10000; 200 with --quick)")
	fl.DurationVar(&o.Window, "window", 0, "the live scenario's measured window (default 30s; 3s with --quick)")
	fl.DurationVar(&o.LeaseTTL, "lease-ttl", 0, "lease TTL of every keyspace (default 10s, the server's; 3s with --quick)")
	fl.DurationVar(&o.Budget, "budget", 0, "the longest each wait may take before it is reported as timed out (default 3m; 60s with --quick)")
	fl.BoolVar(&o.UnaryKeepAlives, "unary-keepalives", false, "simulated members keep alive with KeepAlive calls and follow grants with WatchGrants, as the Python and Node.js clients do (default: both on a Session stream, as the Go SDK does over HTTP/2)")
	fl.StringVar(&o.Protocol, "protocol", bench.ProtocolGRPC, "what the simulated members speak: grpc (as the Go SDK with client.GRPC() and gRPC clients; served by grpc-go's HTTP/2 server) or connect (the Connect protocol over HTTP/2; served by net/http's)")
	fl.IntVar(&o.SessionsPerStream, "sessions-per-stream", 0, "simulated members per Sessions stream, sharing its keep-alive messages, as a process running many members with the Go SDK's SharedSessionStreams (default 0: a Session stream per member)")
	fl.IntVar(&o.MembersPerConn, "members-per-conn", 0, "simulated members per HTTP/2 connection to serve (default 0: all share one transport, about 250 streams per connection; 1: a connection per member, as a fleet of processes)")
	return cmd
}

func writeScaleText(w io.Writer, rep bench.ScaleReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "etcd: %s (%d member(s)), each scenario on a fresh etcd and serve\n", rep.Etcd, rep.EtcdMembers)
	fmt.Fprintln(tw, "measure\tvalue\ttarget")
	timedOut := func(b bool) string {
		if b {
			return " (TIMED OUT)"
		}
		return ""
	}
	health := func(name string, h bench.MemberHealth) {
		fmt.Fprintf(tw, "  members (%s)\t%d keep-alive errors, %d sessions lost, %d re-joins (%d failed), %d join retries, %d release errors, %d broken grant streams\t0 lost\n",
			name, h.KeepAliveErrors, h.SessionsLost, h.Rejoins, h.RejoinErrors, h.JoinRetries, h.ReleaseErrors, h.StreamErrors)
	}
	var wheres strings.Builder
	where := func(name string, t bench.TimeSplit) {
		fmt.Fprintf(&wheres, "  %-12s serve %.2f CPU s, etcd %.2f CPU s, bench %.2f CPU s; leader plan %.3f s in %d steps, writes %.3f s in %d (%d failed); %d epochs, %d grants, %d moves\n",
			name+":", t.ServeCPUS, t.EtcdCPUS, t.BenchCPUS, t.LeaderPlanS, t.LeaderPlans, t.LeaderWriteS, t.LeaderWrites, t.LeaderWriteFailures, t.MapEpochs, t.Grants, t.Moves)
	}
	if r := rep.JoinStorm; r != nil {
		fmt.Fprintf(tw, "join storm: %d members into %d buckets, joins over %.1f s\tall granted %.2f s after the last join%s (%.2f s after the first); %d etcd writes; %d releases of %d buckets\t≤ 10 s, writes O(members)\n",
			r.Members, r.Buckets, r.JoinsS, r.GrantedAfterLastJoinS, timedOut(r.TimedOut), r.GrantedAfterFirstJoinS, r.EtcdWrites, r.ReleaseCalls, r.ReleasedBucket)
		health("join storm", r.Health)
		where("join storm", r.Where)
	}
	if r := rep.Live; r != nil {
		fmt.Fprintf(tw, "live: %d members over %d keyspaces of %d buckets, %.0f s window%s\tserve %.1f%% + etcd %.1f%% of a core (%.2f%% per 1,000); %.0f keep-alives/s (%.0f%% checked on serve's view); %d errors, %d sessions lost\t≤ 30%% for 10,000\n",
			r.LiveMembers, r.Keyspaces, r.Buckets, r.WindowS, timedOut(r.TimedOut), r.ServeCPUPct, r.EtcdCPUPct, r.ServePlusEtcdPctPer1000, r.KeepAlivesPerS, r.ChecksOnReplicaPct, r.Health.KeepAliveErrors, r.Health.SessionsLost)
		fmt.Fprintf(tw, "  memory\tserve %.0f bytes/member (%d → %d MiB); etcd RSS %d MiB, db %d KiB (%d in use), %.1f writes/s\t≤ 20 KB/member\n",
			r.ServeRSSBytesPerMember, r.ServeRSSBeforeBytes>>20, r.ServeRSSAfterBytes>>20, r.EtcdRSSBytes>>20, r.EtcdDBSizeBytes>>10, r.EtcdDBInUseBytes>>10, r.EtcdWritesPerS)
		health("live", r.Health)
		where("live window", r.Where)
	}
	if r := rep.LiveFloor; r != nil {
		fmt.Fprintf(tw, "live floor: the same members against the member API with nothing behind it\tthe echo server %.1f%% of a core (%.2f%% per 1,000); %.0f keep-alives/s; %.0f bytes/member; %d errors\t—\n",
			r.EchoCPUPct, r.EchoCPUPctPer1000, r.KeepAlivesPerS, r.EchoRSSBytesPerMember, r.Health.KeepAliveErrors)
	}
	if r := rep.Routers; r != nil {
		fmt.Fprintf(tw, "routers: %d (%d streams, %d long polls) on %d buckets\tnew epoch p50 %.1f ms, p99 %.1f ms, max %.1f ms (streams p99 %.1f, polls p99 %.1f); %d missed\tp99 ≤ 1 s\n",
			r.Routers, r.StreamRouters, r.PollRouters, r.Buckets, r.P50Ms, r.P99Ms, r.MaxMs, r.StreamP99Ms, r.PollP99Ms, r.Missed)
		where("routers", r.Where)
	}
	if r := rep.Crash; r != nil {
		fmt.Fprintf(tw, "crash: %d of %d members, %d buckets, %d orphaned\tall granted again %.2f s after the crash%s; %d etcd writes\t≤ TTL + 2 s = %.0f s\n",
			r.Crashed, r.Members, r.Buckets, r.Orphaned, r.RegrantedS, timedOut(r.TimedOut), r.EtcdWrites, r.TargetS)
		health("crash", r.Health)
		where("crash", r.Where)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "where the time went:\n%s  not split: watch fan-out (no server metric), API handling vs the leader's work within serve, etcd's CPU by caller\n", wheres.String())
	return err
}

// benchEtcdDebugEnv names the address on which the etcd process of bench
// scale serves Go's profiles (/debug/pprof), to see where etcd's CPU goes;
// unset: none.
const benchEtcdDebugEnv = "KEYSHARD_BENCH_ETCD_DEBUG_LISTEN"

// profilesFromEnv serves Go's profiles on the address environment
// variable env names, until stop; unset: none.
func profilesFromEnv(env string) (stop func(), err error) {
	addr := os.Getenv(env)
	if addr == "" {
		return func() {}, nil
	}
	if stop, err = serveProfiles(addr); err != nil {
		return nil, fmt.Errorf("%s=%s: %w", env, addr, err)
	}
	return stop, nil
}

// serveProfiles serves net/http/pprof's handlers on addr until stop.
func serveProfiles(addr string) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: server.Profiles(), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }() // exits when stop closes the server
	return func() { _ = srv.Close(); <-done }, nil
}

// newBenchEcho is `keyshard bench echo`, the echo server of bench
// scale's live-floor scenario.
func newBenchEcho() *cobra.Command {
	var (
		listen string
		ttl    time.Duration
	)
	cmd := &cobra.Command{
		Use:    "echo",
		Short:  "Serve the member API with nothing behind it (keep-alives answered in 20 ms batches, as serve answers them) for bench scale's live-floor; prints its address",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if listen == "" {
				return fmt.Errorf("--listen is empty; name a host:port to serve on")
			}
			stop, err := profilesFromEnv("KEYSHARD_DEBUG_LISTEN")
			if err != nil {
				return err
			}
			defer stop()
			return bench.RunEcho(cmd.Context(), listen, ttl, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "", "host:port to serve on (port 0: a free one, printed)")
	cmd.Flags().DurationVar(&ttl, "lease-ttl", 10*time.Second, "lease TTL the sessions are given")
	return cmd
}

// newBenchEtcd is `keyshard bench etcd`, the etcd process of bench scale.
func newBenchEtcd() *cobra.Command {
	var (
		dir     string
		members int
	)
	cmd := &cobra.Command{
		Use:    "etcd",
		Short:  "Run an etcd (1 or 3 members on loopback) for bench scale; prints its endpoints",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return fmt.Errorf("--dir is empty; name a data directory")
			}
			stop, err := profilesFromEnv(benchEtcdDebugEnv)
			if err != nil {
				return err
			}
			defer stop()
			return bench.RunEtcd(cmd.Context(), dir, members, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "data directory")
	cmd.Flags().IntVar(&members, "members", 1, "etcd members: 1 or 3")
	return cmd
}
