package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/keyshard/keyshard/client"
)

// topFrame is what one refresh of `keyshard top` read: the same overview
// as the dashboard's, from the same public calls.
type topFrame struct {
	server  string
	at      time.Time
	err     error // Status failed: nothing else was read
	status  client.Status
	members map[string]client.Members // by keyspace
	memErr  map[string]error
	history map[string][]client.EpochChange
	hot     []client.HotKeyPool
	pools   []client.TenantPoolStatus
}

func newTop(c *connFlags) *cobra.Command {
	var (
		interval    time.Duration
		count       int
		maxMembers  int
		epochsShown int
	)
	cmd := &cobra.Command{
		Use:   "top",
		Short: "The dashboard's overview in the terminal, refreshing: replicas, store, keyspaces, members, recent epochs",
		Long: `top shows what the dashboard's overview shows (/ui on keyshard serve) and
refreshes it every --interval until interrupted: the replica answering and
the leader, the replicas and the store's health, every keyspace (epoch,
members, unassigned buckets, handoffs in flight, draining members,
releasing buckets, and members waiting for the map to give them buckets:
a join held back for the rebalance gap), its members (target / granted / releasing buckets,
lease left) and its latest epochs with their reasons, and the hot-key and
tenant pools. It needs a member or an admin token when the server has
tokens. When the server cannot be reached it says so and keeps trying.`,
		Args: cobra.NoArgs,
		RunE: c.withClient(func(cmd *cobra.Command, _ []string, cl *client.Client) error {
			switch {
			case interval < 100*time.Millisecond:
				return fmt.Errorf("--interval %v: want at least 100ms", interval)
			case count < 0:
				return fmt.Errorf("--count %d: want 0 (until interrupted) or more", count)
			case maxMembers < 0:
				return fmt.Errorf("--members %d: want 0 or more", maxMembers)
			case epochsShown < 0:
				return fmt.Errorf("--epochs %d: want 0 or more", epochsShown)
			}
			out := cmd.OutOrStdout()
			clear := isTerminal(out)
			ctx := cmd.Context()
			for n := 0; count == 0 || n < count; n++ {
				if n > 0 {
					select {
					case <-ctx.Done():
						return nil
					case <-time.After(interval):
					}
				}
				f := readTop(ctx, cl.Admin(), c.server, epochsShown)
				if ctx.Err() != nil {
					return nil
				}
				var b strings.Builder
				if clear {
					b.WriteString("\x1b[H\x1b[2J") // home, clear: one frame per screen
				} else if n > 0 {
					b.WriteString("\n")
				}
				renderTop(&b, f, maxMembers, interval)
				io.WriteString(out, b.String())
			}
			return nil
		}),
	}
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "time between refreshes")
	cmd.Flags().IntVar(&count, "count", 0, "refreshes to show, then exit (0: until interrupted)")
	cmd.Flags().IntVar(&maxMembers, "members", 12, "members shown per keyspace (the rest are counted)")
	cmd.Flags().IntVar(&epochsShown, "epochs", 3, "latest epochs shown per keyspace")
	return cmd
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// readTop reads one frame. Each read is bounded by the refresh; a failed
// read other than Status shows in its place.
func readTop(ctx context.Context, adm *client.Admin, server string, epochs int) topFrame {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	f := topFrame{server: server, at: time.Now(), members: map[string]client.Members{}, memErr: map[string]error{}, history: map[string][]client.EpochChange{}}
	if f.status, f.err = adm.Status(ctx); f.err != nil {
		return f
	}
	for _, k := range f.status.Keyspaces {
		name := k.Keyspace.Name
		if ms, err := adm.ListMembers(ctx, name, client.WithLeaseLeft()); err != nil {
			f.memErr[name] = err
		} else {
			f.members[name] = ms
		}
		if epochs > 0 {
			if h, err := adm.History(ctx, name, epochs); err == nil {
				f.history[name] = h
			}
		}
	}
	f.hot, _ = adm.ListHotKeyPools(ctx)
	f.pools, _ = adm.ListTenantPools(ctx)
	return f
}

// renderTop writes a frame as text. It is pure: the frame in, the text out.
func renderTop(w io.Writer, f topFrame, maxMembers int, interval time.Duration) {
	fmt.Fprintf(w, "keyshard top — %s — %s (every %v; Ctrl-C quits)\n", f.server, f.at.Format("15:04:05"), interval)
	if f.err != nil {
		fmt.Fprintf(w, "\ncannot read the control plane: %v\nretrying every %v (is `keyshard serve` running there? --server or KEYSHARD_URL names it; --token or KEYSHARD_TOKEN passes a token)\n", f.err, interval)
		return
	}
	st := f.status
	fmt.Fprintf(w, "replica %s, leader %s", st.Replica, orNone(st.Leader))
	if len(st.Replicas) > 0 {
		ids := make([]string, len(st.Replicas))
		for i, r := range st.Replicas {
			ids[i] = r.ID
			if r.Leader {
				ids[i] += "*"
			}
		}
		fmt.Fprintf(w, "; replicas %s", strings.Join(ids, " "))
	}
	fmt.Fprintln(w)
	if s := st.Store; len(s.Endpoints) > 0 {
		health := "healthy"
		if !s.Healthy {
			health = "UNHEALTHY: " + s.Error
		}
		eps := fmt.Sprintf("%d endpoints", len(s.Endpoints))
		if len(s.Endpoints) == 1 {
			eps = "endpoint " + s.Endpoints[0]
		}
		fmt.Fprintf(w, "store %s; %s, %s, revision %d, read in %v\n", health, eps, mib(s.DBSizeBytes), s.Revision, s.Latency.Round(100*time.Microsecond))
	}

	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	// WAITING: active members the map gives no bucket yet (a join held
	// back for the rebalance gap).
	fmt.Fprintln(tw, "KEYSPACE\tBUCKETS\tMODE\tEPOCH\tMEMBERS\tUNASSIGNED\tHANDOFFS\tDRAINING\tRELEASING\tWAITING")
	for _, k := range st.Keyspaces {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", k.Keyspace.Name, k.Keyspace.Buckets, k.Keyspace.Mode, k.Epoch, k.Members, k.UnassignedBuckets, k.HandoffsInFlight, k.DrainingMembers, k.ReleasingBuckets, k.MembersWithoutBuckets)
	}
	if len(st.Keyspaces) == 0 {
		fmt.Fprintln(tw, "(none: keyshard keyspace create NAME)")
	}
	tw.Flush()

	for _, k := range st.Keyspaces {
		name := k.Keyspace.Name
		fmt.Fprintf(w, "\n%s\n", name)
		if err := f.memErr[name]; err != nil {
			fmt.Fprintf(w, "  members: %v\n", err)
		} else if ms := f.members[name].Members; len(ms) > 0 && maxMembers > 0 {
			sort.Slice(ms, func(i, j int) bool { return ms[i].ID < ms[j].ID })
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "  MEMBER\tZONE\tWEIGHT\tTARGET\tGRANTED\tRELEASING\tLEASE LEFT\t")
			for _, m := range ms[:min(len(ms), maxMembers)] {
				lease, state := "-", ""
				if m.LeaseLeft > 0 {
					lease = m.LeaseLeft.String()
				}
				if m.Draining {
					state = "draining"
				}
				fmt.Fprintf(tw, "  %s\t%s\t%g\t%d\t%d\t%d\t%s\t%s\n", m.ID, orNone(m.Zone), max(m.Weight, 1), m.TargetBuckets, m.GrantedBuckets, m.ReleasingBuckets, lease, state)
			}
			tw.Flush()
			if len(ms) > maxMembers {
				fmt.Fprintf(w, "  … and %d more (--members)\n", len(ms)-maxMembers)
			}
		}
		for _, h := range f.history[name] {
			who := ""
			if len(h.Members) > 0 {
				who = " " + strings.Join(h.Members, ",")
			}
			fmt.Fprintf(w, "  epoch %d %s: %s%s, %d buckets moved\n", h.Epoch, h.Time.Local().Format("15:04:05"), h.Reason, who, h.MovedBuckets)
		}
	}

	if len(f.hot) > 0 {
		names := make([]string, len(f.hot))
		for i, p := range f.hot {
			names[i] = fmt.Sprintf("%s (threshold %g/s)", p.Name, p.Threshold)
		}
		fmt.Fprintf(w, "\nhot-key pools: %s\n", strings.Join(names, ", "))
	}
	if len(f.pools) > 0 {
		fmt.Fprintln(w, "\ntenant pools:")
		for _, p := range f.pools {
			fmt.Fprintf(w, "  %s: %d members, %d tenants, version %d\n", p.Pool.Name, p.Members, p.Tenants, p.Version)
		}
	}
}

// mib formats a byte count.
func mib(n int64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
