package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/spf13/cobra"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/hotkey"
)

// The hot-key verbs go through the SDK like the other verbs: the admin
// API for pools, Client.OverflowSet and WatchOverflowSet for sets.

// explainHot adds what to do next to the errors an operator meets first
// with the hot-key verbs, whose token may be an admin or a member one.
func (c *connFlags) explainHot(err error) error {
	if errors.Is(err, client.ErrUnauthenticated) || errors.Is(err, client.ErrPermissionDenied) {
		return fmt.Errorf("%w\n(pass a token with --token or KEYSHARD_TOKEN: an admin token for pools, an admin or member token for sets)", err)
	}
	return c.explain(err)
}

func newHotKeys() *cobra.Command {
	var c connFlags
	hotkeys := &cobra.Command{
		Use:   "hotkeys",
		Short: "Manage hot-key pools and show their cluster-wide overflow sets",
		Long: `A hot-key pool is a group of producers (for example every process writing one
Kafka topic) that report their local heavy hitters to keyshard serve; the
leader sums the reports every second into the pool's overflow set, which every
producer follows, so a key spread over many producers is caught at the pool's
threshold.`,
	}
	c.register(hotkeys)
	hotkeys.PersistentFlags().Lookup("token").Usage = "bearer token (env KEYSHARD_TOKEN): admin for pools; admin or member for sets"

	pool := &cobra.Command{Use: "pool", Short: "Create, change and list hot-key pools"}
	var (
		p                     client.HotKeyPool
		cooldown, maxAge      time.Duration
		threshold, low, repTh float64
	)
	put := &cobra.Command{
		Use:   "put NAME --threshold N",
		Short: "Create a hot-key pool, or replace its settings (unset flags get their defaults)",
		Example: `  keyshard hotkeys pool put ingest --threshold 6400
  keyshard hotkeys pool put ingest --threshold 6400 --cooldown 1m --max-keys 256`,
		Args: cobra.ExactArgs(1),
		RunE: c.with(func(cmd *cobra.Command, args []string, adm *client.Admin) error {
			if p.MaxKeys < 0 {
				return fmt.Errorf("--max-keys %d: want 0 (the default, 1024) to 2048", p.MaxKeys)
			}
			p.Name, p.Threshold, p.LowThreshold, p.ReportThreshold = args[0], threshold, low, repTh
			p.Cooldown, p.ReportMaxAge = 0, 0 // unset: the server's defaults
			if cmd.Flags().Changed("cooldown") {
				p.Cooldown = cooldown
			}
			if cmd.Flags().Changed("report-max-age") {
				p.ReportMaxAge = maxAge
			}
			got, err := adm.PutHotKeyPool(cmd.Context(), p)
			if err != nil {
				return c.explainHot(err)
			}
			printPool(cmd.OutOrStdout(), got)
			return nil
		}),
	}
	put.Flags().Float64Var(&threshold, "threshold", 0, "summed rate (messages/s over all producers) at which a key enters the overflow set (required)")
	put.Flags().Float64Var(&low, "low-threshold", 0, "summed rate below which a key in the set starts cooling down (default threshold/2)")
	put.Flags().DurationVar(&cooldown, "cooldown", 30*time.Second, "how long a key must stay below the low threshold before it leaves the set")
	put.Flags().Float64Var(&repTh, "report-threshold", 0, "local rate from which producers report a key (default threshold/64)")
	put.Flags().DurationVar(&maxAge, "report-max-age", 30*time.Second, "how long a producer's report counts (at least 2s)")
	put.Flags().IntVar(&p.MaxKeys, "max-keys", 1024, "most keys in the set; past it the highest rates win (at most 2048)")
	put.MarkFlagRequired("threshold")

	list := &cobra.Command{
		Use:   "list",
		Short: "List hot-key pools",
		Args:  cobra.NoArgs,
		RunE: c.with(func(cmd *cobra.Command, _ []string, adm *client.Admin) error {
			pools, err := adm.ListHotKeyPools(cmd.Context())
			if err != nil {
				return c.explainHot(err)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tTHRESHOLD\tLOW THRESHOLD\tCOOLDOWN\tREPORT THRESHOLD\tREPORT MAX AGE\tMAX KEYS")
			for _, p := range pools {
				fmt.Fprintf(tw, "%s\t%g\t%g\t%v\t%g\t%v\t%d\n", p.Name, p.Threshold, p.LowThreshold, p.Cooldown, p.ReportThreshold, p.ReportMaxAge, p.MaxKeys)
			}
			return tw.Flush()
		}),
	}
	pool.AddCommand(put, list)

	var watch bool
	set := &cobra.Command{
		Use:   "set POOL",
		Short: "Show a pool's overflow set: version, and each key with its summed rate and since when it is in",
		Long: `Show a pool's overflow set: its version (which rises whenever its keys change),
and each key with its summed rate at the last change, when it entered the set,
and, if its rate has fallen below the low threshold, since when it is cooling
down. With --watch, print every new version until interrupted.`,
		Args: cobra.ExactArgs(1),
		RunE: c.withClient(func(cmd *cobra.Command, args []string, cl *client.Client) error {
			ctx, out, pool := cmd.Context(), cmd.OutOrStdout(), args[0]
			s, err := cl.OverflowSet(ctx, pool)
			if err != nil {
				return c.explainHot(err)
			}
			printSet(out, pool, s)
			if !watch {
				return nil
			}
			// The stream goes to the replica that just answered.
			err = cl.WatchOverflowSet(ctx, pool, s.Version, func(s hotkey.OverflowSet) {
				fmt.Fprintln(out)
				printSet(out, pool, s)
			})
			if err != nil && ctx.Err() == nil {
				return c.explainHot(err)
			}
			return nil
		}),
	}
	set.Flags().BoolVar(&watch, "watch", false, "print every new version until interrupted")

	hotkeys.AddCommand(pool, set)
	return hotkeys
}

func printPool(out io.Writer, p client.HotKeyPool) {
	fmt.Fprintf(out, "hot-key pool %s: threshold %g/s, low threshold %g/s, cooldown %v, report threshold %g/s, report max age %v, max keys %d\n",
		p.Name, p.Threshold, p.LowThreshold, p.Cooldown, p.ReportThreshold, p.ReportMaxAge, p.MaxKeys)
}

func printSet(out io.Writer, pool string, s hotkey.OverflowSet) {
	if s.Version == 0 {
		fmt.Fprintf(out, "pool %s: no overflow set yet (version 0)\n", pool)
		return
	}
	fmt.Fprintf(out, "pool %s, version %d, %s\n", pool, s.Version, plural(len(s.Entries), "key"))
	if len(s.Entries) == 0 {
		return
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tRATE\tSINCE\tCOOLING SINCE")
	for _, e := range s.Entries {
		cooling := "-"
		if !e.BelowSince.IsZero() {
			cooling = e.BelowSince.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%.6g\t%s\t%s\n", printableKey(e.Key), e.Rate, e.Since.UTC().Format(time.RFC3339), cooling)
	}
	tw.Flush()
}

// printableKey returns key as is, or quoted if it has spaces or control
// characters that would break the table.
func printableKey(key string) string {
	if strings.ContainsFunc(key, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) || strings.HasPrefix(key, `"`) {
		return strconv.Quote(key)
	}
	return key
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
