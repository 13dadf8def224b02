package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/client"
)

// The hot-key verbs call the API's generated clients directly, to print
// every field of the server's answer.

// hotClient is one replica's services the hot-key verbs call.
type hotClient struct {
	admin keyshardv1connect.AdminServiceClient
	hot   keyshardv1connect.HotKeyServiceClient
}

// hotClients are the services of every replica given to --server, in
// order.
type hotClients []hotClient

// each calls f with each replica's services in order until one answers
// with something other than Unavailable, as the SDK does with several
// URLs, and returns that answer.
func (cl hotClients) each(ctx context.Context, f func(hotClient) error) error {
	var err error
	for _, c := range cl {
		if err = f(c); ctx.Err() != nil || connect.CodeOf(err) != connect.CodeUnavailable {
			return err
		}
	}
	return err
}

// withHot wraps a hot-key verb: it checks --server as the SDK does, and
// runs f with the API clients of every replica it names, sending --token
// on every call.
func (c *connFlags) withHot(f func(cmd *cobra.Command, args []string, cl hotClients) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		sdk, err := client.Dial(c.server) // validates and normalizes the URLs; no IO
		if err != nil {
			return fmt.Errorf("--server %q: %w", c.server, err)
		}
		urls := sdk.URLs()
		sdk.Close()
		opts := []connect.ClientOption{connect.WithInterceptors(bearerHeader(c.token))}
		hc := &http.Client{} // no timeout: --watch is a long-lived stream
		cl := make(hotClients, 0, len(urls))
		for _, u := range urls {
			cl = append(cl, hotClient{
				admin: keyshardv1connect.NewAdminServiceClient(hc, u, opts...),
				hot:   keyshardv1connect.NewHotKeyServiceClient(hc, u, opts...),
			})
		}
		return f(cmd, args, cl)
	}
}

// bearerHeader sends "Authorization: Bearer <token>" on unary calls and
// streams; an empty token sends nothing.
type bearerHeader string

func (b bearerHeader) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if b != "" {
			req.Header().Set("Authorization", "Bearer "+string(b))
		}
		return next(ctx, req)
	}
}

func (b bearerHeader) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		if b != "" {
			conn.RequestHeader().Set("Authorization", "Bearer "+string(b))
		}
		return conn
	}
}

func (b bearerHeader) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// explainRPC adds what to do next to the API errors an operator meets
// first.
func (c *connFlags) explainRPC(err error) error {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable:
		return fmt.Errorf("%w\n(is `keyshard serve` running at %s? set --server or KEYSHARD_URL)", err, c.server)
	case connect.CodeUnauthenticated, connect.CodePermissionDenied:
		return fmt.Errorf("%w\n(pass a token with --token or KEYSHARD_TOKEN: an admin token for pools, an admin or member token for sets)", err)
	}
	return err
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
		p                     v1.HotKeyPool
		cooldown, maxAge      time.Duration
		maxKeys               int
		threshold, low, repTh float64
	)
	put := &cobra.Command{
		Use:   "put NAME --threshold N",
		Short: "Create a hot-key pool, or replace its settings (unset flags get their defaults)",
		Example: `  keyshard hotkeys pool put ingest --threshold 6400
  keyshard hotkeys pool put ingest --threshold 6400 --cooldown 1m --max-keys 256`,
		Args: cobra.ExactArgs(1),
		RunE: c.withHot(func(cmd *cobra.Command, args []string, cl hotClients) error {
			if maxKeys < 0 {
				return fmt.Errorf("--max-keys %d: want 0 (the default, 1024) to 2048", maxKeys)
			}
			p.Name, p.Threshold, p.LowThreshold, p.ReportThreshold, p.MaxKeys = args[0], threshold, low, repTh, uint32(maxKeys)
			if cmd.Flags().Changed("cooldown") {
				p.Cooldown = durationpb.New(cooldown)
			}
			if cmd.Flags().Changed("report-max-age") {
				p.ReportMaxAge = durationpb.New(maxAge)
			}
			var r *connect.Response[v1.PutHotKeyPoolResponse]
			err := cl.each(cmd.Context(), func(h hotClient) (err error) {
				r, err = h.admin.PutHotKeyPool(cmd.Context(), connect.NewRequest(&v1.PutHotKeyPoolRequest{Pool: &p}))
				return err
			})
			if err != nil {
				return c.explainRPC(err)
			}
			printPool(cmd.OutOrStdout(), r.Msg.Pool)
			return nil
		}),
	}
	put.Flags().Float64Var(&threshold, "threshold", 0, "summed rate (messages/s over all producers) at which a key enters the overflow set (required)")
	put.Flags().Float64Var(&low, "low-threshold", 0, "summed rate below which a key in the set starts cooling down (default threshold/2)")
	put.Flags().DurationVar(&cooldown, "cooldown", 30*time.Second, "how long a key must stay below the low threshold before it leaves the set")
	put.Flags().Float64Var(&repTh, "report-threshold", 0, "local rate from which producers report a key (default threshold/64)")
	put.Flags().DurationVar(&maxAge, "report-max-age", 30*time.Second, "how long a producer's report counts (at least 2s)")
	put.Flags().IntVar(&maxKeys, "max-keys", 1024, "most keys in the set; past it the highest rates win (at most 2048)")
	put.MarkFlagRequired("threshold")

	list := &cobra.Command{
		Use:   "list",
		Short: "List hot-key pools",
		Args:  cobra.NoArgs,
		RunE: c.withHot(func(cmd *cobra.Command, _ []string, cl hotClients) error {
			var r *connect.Response[v1.ListHotKeyPoolsResponse]
			err := cl.each(cmd.Context(), func(h hotClient) (err error) {
				r, err = h.admin.ListHotKeyPools(cmd.Context(), connect.NewRequest(&v1.ListHotKeyPoolsRequest{}))
				return err
			})
			if err != nil {
				return c.explainRPC(err)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tTHRESHOLD\tLOW THRESHOLD\tCOOLDOWN\tREPORT THRESHOLD\tREPORT MAX AGE\tMAX KEYS")
			for _, p := range r.Msg.Pools {
				fmt.Fprintf(tw, "%s\t%g\t%g\t%v\t%g\t%v\t%d\n", p.Name, p.Threshold, p.LowThreshold, p.Cooldown.AsDuration(), p.ReportThreshold, p.ReportMaxAge.AsDuration(), p.MaxKeys)
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
		RunE: c.withHot(func(cmd *cobra.Command, args []string, cl hotClients) error {
			ctx, out := cmd.Context(), cmd.OutOrStdout()
			var (
				r    *connect.Response[v1.GetOverflowSetResponse]
				from hotClient // the replica that answered; --watch follows it
			)
			err := cl.each(ctx, func(h hotClient) (err error) {
				r, err = h.hot.GetOverflowSet(ctx, connect.NewRequest(&v1.GetOverflowSetRequest{Pool: args[0]}))
				from = h
				return err
			})
			if err != nil {
				return c.explainRPC(err)
			}
			printSet(out, r.Msg.Set)
			if !watch {
				return nil
			}
			stream, err := from.hot.WatchOverflowSet(ctx, connect.NewRequest(&v1.WatchOverflowSetRequest{Pool: args[0], SinceVersion: r.Msg.Set.Version}))
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return c.explainRPC(err)
			}
			defer stream.Close()
			for stream.Receive() {
				fmt.Fprintln(out)
				printSet(out, stream.Msg())
			}
			if err := stream.Err(); err != nil && ctx.Err() == nil && !errors.Is(err, io.EOF) {
				return c.explainRPC(err)
			}
			return nil
		}),
	}
	set.Flags().BoolVar(&watch, "watch", false, "print every new version until interrupted")

	hotkeys.AddCommand(pool, set)
	return hotkeys
}

func printPool(out io.Writer, p *v1.HotKeyPool) {
	fmt.Fprintf(out, "hot-key pool %s: threshold %g/s, low threshold %g/s, cooldown %v, report threshold %g/s, report max age %v, max keys %d\n",
		p.Name, p.Threshold, p.LowThreshold, p.Cooldown.AsDuration(), p.ReportThreshold, p.ReportMaxAge.AsDuration(), p.MaxKeys)
}

func printSet(out io.Writer, s *v1.OverflowSet) {
	if s.Version == 0 {
		fmt.Fprintf(out, "pool %s: no overflow set yet (version 0)\n", s.Pool)
		return
	}
	fmt.Fprintf(out, "pool %s, version %d, %s\n", s.Pool, s.Version, plural(len(s.Keys), "key"))
	if len(s.Keys) == 0 {
		return
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tRATE\tSINCE\tCOOLING SINCE")
	for _, k := range s.Keys {
		cooling := "-"
		if k.CoolingSince != nil {
			cooling = k.CoolingSince.AsTime().UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%.6g\t%s\t%s\n", printableKey(k.Key), k.Rate, k.Since.AsTime().UTC().Format(time.RFC3339), cooling)
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
