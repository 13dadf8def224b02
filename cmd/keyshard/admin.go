package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/placement"
)

// connFlags are how the admin verbs reach a server.
type connFlags struct {
	server string
	token  string
}

func (c *connFlags) register(cmd *cobra.Command) {
	def := os.Getenv("KEYSHARD_URL")
	if def == "" {
		def = "http://127.0.0.1:7400"
	}
	cmd.PersistentFlags().StringVar(&c.server, "server", def, "Keyshard API URL (env KEYSHARD_URL)")
	cmd.PersistentFlags().StringVar(&c.token, "token", os.Getenv("KEYSHARD_TOKEN"), "admin bearer token (env KEYSHARD_TOKEN)")
}

// with wraps a verb: it dials the server, runs f with the admin API, and
// closes the connection.
func (c *connFlags) with(f func(cmd *cobra.Command, args []string, adm *client.Admin) error) func(*cobra.Command, []string) error {
	return c.withClient(func(cmd *cobra.Command, args []string, cl *client.Client) error {
		return f(cmd, args, cl.Admin())
	})
}

// withClient wraps a verb: it dials the server, runs f with the Client,
// and closes the connection.
func (c *connFlags) withClient(f func(cmd *cobra.Command, args []string, cl *client.Client) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		var opts []client.Option
		if c.token != "" {
			opts = append(opts, client.Token(c.token))
		}
		cl, err := client.Dial(c.server, opts...)
		if err != nil {
			return fmt.Errorf("--server %q: %w", c.server, err)
		}
		defer cl.Close()
		return f(cmd, args, cl)
	}
}

// explain adds what to do next to the errors an operator meets first.
func (c *connFlags) explain(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, client.ErrUnavailable):
		return fmt.Errorf("%w\n(is `keyshard serve` running at %s? set --server or KEYSHARD_URL)", err, c.server)
	case errors.Is(err, client.ErrUnauthenticated), errors.Is(err, client.ErrPermissionDenied):
		return fmt.Errorf("%w\n(pass an admin token with --token or KEYSHARD_TOKEN)", err)
	}
	return err
}

func addAdminCommands(root *cobra.Command) {
	var c connFlags
	status := &cobra.Command{
		Use:   "status",
		Short: "Show the leader and every keyspace: epoch, members, handoffs in flight",
		Args:  cobra.NoArgs,
		RunE: c.with(func(cmd *cobra.Command, _ []string, adm *client.Admin) error {
			st, err := adm.Status(cmd.Context())
			if err != nil {
				return c.explain(err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "replica %s, leader %s\n", st.Replica, orNone(st.Leader))
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "KEYSPACE\tBUCKETS\tHASH\tEPOCH\tMEMBERS\tUNASSIGNED\tHANDOFFS")
			for _, k := range st.Keyspaces {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%d\n", k.Keyspace.Name, k.Keyspace.Buckets, k.Keyspace.Hash, k.Epoch, k.Members, k.UnassignedBuckets, k.HandoffsInFlight)
			}
			return tw.Flush()
		}),
	}

	keyspace := &cobra.Command{Use: "keyspace", Short: "Create, import, list and show keyspaces"}
	var kc client.KeyspaceConfig
	var hash string
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a keyspace (bucket count and hash cannot change afterwards)",
		Args:  cobra.ExactArgs(1),
		RunE: c.with(func(cmd *cobra.Command, args []string, adm *client.Admin) error {
			kc.Name, kc.Hash = args[0], placement.HashMode(hash)
			got, err := adm.CreateKeyspace(cmd.Context(), kc)
			if err != nil {
				return c.explain(err)
			}
			printKeyspace(cmd.OutOrStdout(), got)
			return nil
		}),
	}
	create.Flags().IntVar(&kc.Buckets, "buckets", 4096, "bucket count, 1..65536 (at least 32 per member you expect)")
	create.Flags().StringVar(&hash, "hash", "xxh64", `"xxh64" or "synapse-sha256"`)
	create.Flags().StringVar(&kc.Mode, "mode", client.ModeExclusive, `"exclusive" or "stream" (a committed stream position per bucket); cannot change`)
	create.Flags().DurationVar(&kc.LeaseTTL, "lease-ttl", 10*time.Second, "member session lifetime without keep-alive (whole seconds, >= 2s)")
	create.Flags().DurationVar(&kc.DrainTimeout, "drain-timeout", 30*time.Second, "time a member may take to release a moved bucket before its session is revoked")
	list := &cobra.Command{
		Use:   "list",
		Short: "List keyspaces",
		Args:  cobra.NoArgs,
		RunE: c.with(func(cmd *cobra.Command, _ []string, adm *client.Admin) error {
			ks, err := adm.ListKeyspaces(cmd.Context())
			if err != nil {
				return c.explain(err)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tBUCKETS\tHASH\tMODE\tLEASE TTL\tDRAIN TIMEOUT")
			for _, k := range ks {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%v\t%v\n", k.Name, k.Buckets, k.Hash, k.Mode, k.LeaseTTL, k.DrainTimeout)
			}
			return tw.Flush()
		}),
	}
	show := &cobra.Command{
		Use:   "show NAME",
		Short: "Show one keyspace",
		Args:  cobra.ExactArgs(1),
		RunE: c.with(func(cmd *cobra.Command, args []string, adm *client.Admin) error {
			k, err := adm.GetKeyspace(cmd.Context(), args[0])
			if err != nil {
				return c.explain(err)
			}
			printKeyspace(cmd.OutOrStdout(), k)
			return nil
		}),
	}
	keyspace.AddCommand(create, importCommand(&c), list, show)

	members := &cobra.Command{
		Use:   "members KEYSPACE",
		Short: "List a keyspace's members with their target, granted and releasing buckets",
		Args:  cobra.ExactArgs(1),
		RunE: c.with(func(cmd *cobra.Command, args []string, adm *client.Admin) error {
			ms, err := adm.ListMembers(cmd.Context(), args[0])
			if err != nil {
				return c.explain(err)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintf(tw, "epoch %d\n", ms.Epoch)
			fmt.Fprintln(tw, "MEMBER\tADDRESS\tZONE\tWEIGHT\tTARGET\tGRANTED\tRELEASING\tSTATE")
			for _, m := range ms.Members {
				state := "active"
				if m.Draining {
					state = "draining"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%g\t%d\t%d\t%d\t%s\n", m.ID, orNone(m.Address), orNone(m.Zone), m.Weight, m.TargetBuckets, m.GrantedBuckets, m.ReleasingBuckets, state)
			}
			return tw.Flush()
		}),
	}

	mapCmd := &cobra.Command{
		Use:   "map KEYSPACE",
		Short: "Show a keyspace's map: epoch, buckets per member, handoffs in flight",
		Args:  cobra.ExactArgs(1),
		RunE: c.with(func(cmd *cobra.Command, args []string, adm *client.Admin) error {
			ms, err := adm.ListMembers(cmd.Context(), args[0])
			if err != nil {
				return c.explain(err)
			}
			k, err := adm.GetKeyspace(cmd.Context(), args[0])
			if err != nil {
				return c.explain(err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "keyspace %s, epoch %d, %d buckets\n", k.Name, ms.Epoch, k.Buckets)
			width := 40
			inFlight := 0
			for _, m := range ms.Members {
				bar := strings.Repeat("█", m.TargetBuckets*width/max(k.Buckets, 1))
				fmt.Fprintf(out, "  %-20s %6d %s\n", m.ID, m.TargetBuckets, bar)
				inFlight += m.ReleasingBuckets
			}
			fmt.Fprintf(out, "handoffs in flight: %d\n", inFlight)
			return nil
		}),
	}

	drain := &cobra.Command{
		Use:   "drain KEYSPACE MEMBER",
		Short: "Move every bucket away from a member, with a progress bar until they have moved",
		Args:  cobra.ExactArgs(2),
		RunE: c.with(func(cmd *cobra.Command, args []string, adm *client.Admin) error {
			if err := adm.DrainMember(cmd.Context(), args[0], args[1]); err != nil {
				return c.explain(err)
			}
			out := cmd.ErrOrStderr()
			total := -1
			err := adm.WaitDrained(cmd.Context(), args[0], args[1], func(left int) {
				if total < left {
					total = left
				}
				drawBar(out, total-left, total, fmt.Sprintf("draining %s", args[1]))
			})
			fmt.Fprintln(out)
			if err != nil {
				return c.explain(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s holds no bucket of %s; stop it, or keep it as a spare\n", args[1], args[0])
			return nil
		}),
	}

	for _, cmd := range []*cobra.Command{status, keyspace, members, mapCmd, drain, newPositions(&c), newTop(&c)} {
		c.register(cmd)
		root.AddCommand(cmd)
	}
}

func printKeyspace(out io.Writer, k client.KeyspaceConfig) {
	fmt.Fprintf(out, "keyspace %s: %d buckets, hash %s, mode %s, lease TTL %v, drain timeout %v\n", k.Name, k.Buckets, k.Hash, k.Mode, k.LeaseTTL, k.DrainTimeout)
}

// drawBar redraws a one-line progress bar on out.
func drawBar(out io.Writer, done, total int, label string) {
	const width = 30
	filled := width
	if total > 0 {
		filled = done * width / total
	}
	fmt.Fprintf(out, "\r%s [%s%s] %d/%d buckets moved", label, strings.Repeat("#", filled), strings.Repeat(".", width-filled), done, max(total, 0))
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
