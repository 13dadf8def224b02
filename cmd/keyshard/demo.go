package main

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	"github.com/keyshard/keyshard/internal/demo"
)

func newDemo() *cobra.Command {
	var opts demo.Options
	var asJSON, verbose bool
	var mode string
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run an embedded Keyshard with workers that join, leave and crash, and check the record",
		Long: `Start an embedded Keyshard server (with its own etcd in a temporary
directory), in-process workers, and a router sending keyed events to the
owners of their buckets. On a schedule a worker joins, another joins, one
leaves gracefully, one crashes and one more joins; the demo narrates each
change, then checks its own record: no two grants of one bucket overlapped,
fencing tokens increased, every event was processed by its bucket's holder,
and every change moved the optimal number of buckets.

With --mode stream, the workers are stream workers of a stream keyspace:
they read one Kafka partition (kfake, in process; offset = position) that
a producer appends keyed events to, commit a position per bucket, and hand
positions over with their buckets. The demo checks that every event was
handled by a holder of its bucket, each key in stream order within each
holder's tenure, with no duplicate after a graceful move and duplicates
after a crash only after that bucket's last commit.

With --mode tenants, a tenant pool of 10 gateways in 3 zones serves 200
tenants under Zipf load from 3 clients (PoolFollower and LoadReporter
each); one tenant's load steps up tenfold and back, the pool grows to 20
gateways and its first 10 leave. The demo checks that clients and
gateways agreed at every snapshot version, that every read went to a
gateway serving its tenant, and that no steady tenant's size followed the
pool's. Its pace follows --duration (default 90s): window duration/9,
shrink cooldown twice that.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.Out = cmd.ErrOrStderr()
			if verbose {
				opts.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			} else {
				opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
			}
			var rep any
			var ok bool
			switch mode {
			case "exclusive":
				r, err := demo.Run(cmd.Context(), opts)
				if err != nil {
					return err
				}
				rep, ok = r, r.OK
			case "hotkeys":
				hopts := demo.HotkeysOptions{Duration: opts.Duration, Rate: opts.Rate, Out: opts.Out, Logger: opts.Logger}
				if !cmd.Flags().Changed("duration") {
					hopts.Duration = 0 // the mode's own default
				}
				if !cmd.Flags().Changed("rate") {
					hopts.Rate = 0
				}
				r, err := demo.RunHotkeys(cmd.Context(), hopts)
				if err != nil {
					return err
				}
				rep, ok = r, r.OK
			case "stream":
				sopts := demo.StreamOptions{Duration: opts.Duration, Workers: opts.Workers, Buckets: opts.Buckets, Rate: opts.Rate, Out: opts.Out, Logger: opts.Logger}
				if !cmd.Flags().Changed("workers") {
					sopts.Workers = 0 // the mode's own default
				}
				r, err := demo.RunStream(cmd.Context(), sopts)
				if err != nil {
					return err
				}
				rep, ok = r, r.OK
			case "tenants":
				topts := demo.TenantsOptions{Duration: opts.Duration, Out: opts.Out, Logger: opts.Logger}
				if !cmd.Flags().Changed("duration") {
					topts.Duration = 0 // the mode's own default
				}
				r, err := demo.RunTenants(cmd.Context(), topts)
				if err != nil {
					return err
				}
				rep, ok = r, r.OK
			default:
				return fmt.Errorf("--mode %q: want exclusive, stream, hotkeys or tenants", mode)
			}
			if asJSON {
				if err := writeJSON(cmd.OutOrStdout(), rep); err != nil {
					return err
				}
			}
			if !ok {
				return fmt.Errorf("demo: a check failed (see above)")
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&opts.Duration, "duration", 30*time.Second, "how long the demo runs (at least 10s)")
	fl.IntVar(&opts.Workers, "workers", 3, "workers at the start")
	fl.IntVar(&opts.Buckets, "buckets", 256, "buckets of the demo keyspace")
	fl.IntVar(&opts.Rate, "rate", 2000, "keyed events per second")
	fl.StringVar(&mode, "mode", "exclusive", `"exclusive" (workers owning buckets), "stream" (stream workers reading one Kafka partition on kfake, positions per bucket) or "hotkeys" (Kafka overflow router on kfake) or "tenants" (a shuffle-sharded tenant pool that grows and shrinks)`)
	fl.BoolVar(&asJSON, "json", false, "end with one JSON object of the checked figures on stdout")
	fl.BoolVar(&verbose, "verbose", false, "also print the server's and workers' logs")
	return cmd
}
