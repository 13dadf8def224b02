package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/keyshard/keyshard/internal/chaos"
	"github.com/keyshard/keyshard/internal/store"
)

func newChaos() *cobra.Command {
	cfg := chaos.DefaultConfig()
	var (
		faults  string
		seed    int64
		asJSON  bool
		logs    bool
		keepDir bool
	)
	cmd := &cobra.Command{
		Use:   "chaos",
		Short: "Run real processes under random faults and check every write against the guarantees",
		Long: `Start a cluster of real processes on this machine: three etcd members, two
` + "`keyshard serve`" + ` replicas on them (each reaching etcd through fault proxies),
workers that reach the replicas through fault proxies, and a fenced sink that
records every grant, release and write with its own clock and refuses writes
with an old fencing token. Then inject faults, one at a time, on a random
schedule that the seed fixes: kill -9 and SIGSTOP of workers, replicas and etcd
members (also the etcd leader during a handoff), partitions, connection resets
and latency through the proxies, and (as root, with --faults netns) a worker's
veth link taken down. Each fault is proven to have taken effect, healed, and
the run waits until every bucket is served again.

At the end the whole record is checked: no bucket held by two live workers at
once, fencing tokens strictly rising per bucket, late writes refused (and
counted), every bucket served again within the bound (TTL + 1 s) after each
fault, no stuck session. It prints, per fault kind: injected, proven,
violations, bound misses, refused late writes, and unserved time p50/p99/max.

Exit status: 0 if clean, 1 on any safety violation (or if the cluster could
not run), 3 on liveness bound misses only. Replay a run with the same --seed
(and the same --faults, --ttl, --workers).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("seed") {
				seed = time.Now().UnixNano() % 1_000_000
			}
			if seed < 0 {
				return fmt.Errorf("--seed %d: want a non-negative number", seed)
			}
			cfg.Seed = uint64(seed)
			cfg.Faults = nil
			for f := range strings.SplitSeq(faults, ",") {
				switch f = strings.TrimSpace(f); f {
				case "":
				case "all":
					cfg.Faults = append(cfg.Faults, chaos.DefaultFaults()...)
				default:
					cfg.Faults = append(cfg.Faults, f)
				}
			}
			bin, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find the keyshard binary to start the cluster with: %w", err)
			}
			cfg.Binary = bin
			dir, err := os.MkdirTemp("", "keyshard-chaos-")
			if err != nil {
				return err
			}
			cleanup := func() {
				if !keepDir {
					os.RemoveAll(dir)
				}
			}
			defer cleanup()
			if keepDir {
				fmt.Fprintf(cmd.ErrOrStderr(), "keeping the etcd data in %s\n", dir)
			}
			cfg.Dir = dir
			out := cmd.OutOrStdout()
			cfg.Progress = out
			if asJSON {
				cfg.Progress = cmd.ErrOrStderr()
			}
			if logs {
				cfg.Log = cmd.ErrOrStderr()
			}
			rep, err := chaos.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				rep.WriteText(out)
			}
			// The report says what was found; the exit status says it to
			// scripts.
			switch {
			case !rep.OK():
				cleanup()
				os.Exit(1)
			case len(rep.Analysis.Misses) > 0:
				cleanup()
				os.Exit(3)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long to inject faults (setup and checks come on top)")
	fl.Int64Var(&seed, "seed", 0, "seed of the fault schedule (default: random, printed)")
	fl.StringVar(&faults, "faults", "all", "comma-separated fault kinds: "+faultKindNames()+"; all is every kind but netns (all,netns adds it)")
	fl.DurationVar(&cfg.TTL, "ttl", cfg.TTL, "the keyspace's lease TTL")
	fl.DurationVar(&cfg.ElectionTTL, "election-ttl", 0, "the replicas' election TTL (default TTL - 1s in whole seconds, at least 2s)")
	fl.DurationVar(&cfg.EtcdElection, "etcd-election-timeout", 0, "the etcd members' election timeout (default TTL/6, at most 1s, at least 100ms)")
	fl.IntVar(&cfg.Workers, "workers", cfg.Workers, "number of worker processes")
	fl.IntVar(&cfg.Buckets, "buckets", cfg.Buckets, "buckets in the keyspace")
	fl.DurationVar(&cfg.Bound, "bound", 0, "longest a bucket may stay unserved after a fault (default TTL + 1s)")
	fl.BoolVar(&asJSON, "json", false, "print the report as JSON on stdout (progress goes to stderr)")
	fl.BoolVar(&logs, "logs", false, "stream every child process's log to stderr")
	fl.BoolVar(&keepDir, "keep", false, "keep the etcd data directory")
	cmd.AddCommand(newChaosEtcd(), newChaosWorker())
	return cmd
}

func faultKindNames() string {
	var names []string
	for _, k := range chaos.FaultKinds {
		names = append(names, k.Name)
	}
	return strings.Join(names, ", ")
}

// newChaosEtcd runs one etcd member: the chaos suite starts three, so
// that kill -9 of one is real.
func newChaosEtcd() *cobra.Command {
	var cfg store.EmbeddedConfig
	cmd := &cobra.Command{
		Use:    "etcd",
		Short:  "Run one embedded etcd member (used by keyshard chaos)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			cfg.Logger = log
			cfg.UnsafeNoFsync = true // a kill -9 keeps the page cache; only a machine crash would lose data
			ctx, cancel := context.WithTimeout(cmd.Context(), 60*time.Second)
			e, err := store.StartEmbedded(ctx, cfg)
			cancel()
			if err != nil {
				return err
			}
			defer e.Close()
			log.Info("etcd member ready", "name", e.Name(), "client", strings.Join(e.Endpoints(), ","), "peer", e.PeerURL())
			select {
			case <-cmd.Context().Done():
				return nil
			case err := <-e.Err():
				return fmt.Errorf("etcd member %s: %w", e.Name(), err)
			}
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.Name, "name", "keyshard", "member name")
	fl.StringVar(&cfg.Dir, "dir", "", "data directory (required)")
	fl.StringVar(&cfg.ClientURL, "client-url", "", "client URL (http://127.0.0.1:port)")
	fl.StringVar(&cfg.PeerURL, "peer-url", "", "peer URL (http://127.0.0.1:port)")
	fl.StringVar(&cfg.InitialCluster, "initial-cluster", "", "every member as name=peerURL, comma-separated")
	fl.StringVar(&cfg.ClusterToken, "cluster-token", "keyshard", "initial cluster token")
	fl.DurationVar(&cfg.ElectionTimeout, "election-timeout", 0, "etcd election timeout; heartbeats every tenth of it (default etcd's 1s)")
	return cmd
}

// newChaosWorker runs one chaos worker: a client.Worker that writes to
// the fenced sink with its grants' tokens.
func newChaosWorker() *cobra.Command {
	var (
		cfg   chaos.WorkerConfig
		level string
	)
	cmd := &cobra.Command{
		Use:    "worker",
		Short:  "Run one worker that writes to a fenced sink (used by keyshard chaos and the fault tests)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var l slog.Level
			if err := l.UnmarshalText([]byte(level)); err != nil {
				return fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: l})).With("worker", cfg.ID)
			err := chaos.RunWorker(cmd.Context(), cfg, log)
			if errors.Is(err, chaos.ErrDrainTimeout) {
				log.Error("drain did not finish", "err", err)
				os.Exit(2)
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.Server, "server", "", "Keyshard server URL (http://host:port)")
	fl.StringVar(&cfg.Sink, "sink", "", "fenced sink URL")
	fl.StringVar(&cfg.Keyspace, "keyspace", chaos.Keyspace, "keyspace to join")
	fl.StringVar(&cfg.ID, "id", "", "member id")
	fl.DurationVar(&cfg.Interval, "interval", 20*time.Millisecond, "time between two writes of one held bucket")
	fl.DurationVar(&cfg.ReleaseDelay, "release-delay", 0, "how long a handoff's Release keeps writing before it returns")
	fl.BoolVar(&cfg.BlockRelease, "block-release", false, "make a handoff's Release hang, still writing, until the grant's context is cancelled")
	fl.DurationVar(&cfg.DrainTimeout, "drain-timeout", 30*time.Second, "how long the graceful leave may take on SIGTERM")
	fl.BoolVar(&cfg.Replace, "replace", false, "take over the member id from a session still alive (a restarted process)")
	fl.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	return cmd
}
