package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/keyshard/keyshard/client"
)

// The tenant-pool verbs: `pools` (list, put, delete), `tenants POOL` and
// `tenant POOL TENANT`, all through the SDK.

// explainPools adds what to do next to the errors an operator meets first
// with the tenant-pool verbs.
func (c *connFlags) explainPools(err error) error {
	switch {
	case errors.Is(err, client.ErrUnauthenticated), errors.Is(err, client.ErrPermissionDenied):
		return fmt.Errorf("%w\n(pass a token with --token or KEYSHARD_TOKEN: an admin token to change pools, an admin or member token to read them)", err)
	case errors.Is(err, client.ErrNotFound):
		return fmt.Errorf("%w\n(list the pools with `keyshard pools`; create one with `keyshard pools put NAME --capacity N`)", err)
	}
	return c.explain(err)
}

func addPoolCommands(root *cobra.Command) {
	var c connFlags
	pools := &cobra.Command{
		Use:   "pools",
		Short: "List tenant pools; create, change and delete them",
		Long: `A tenant pool serves each tenant from a subset of its members (shuffle
sharding), sized by the leader from the tenant's own load:

  size = clamp(ceil(rate × headroom / capacity), min, max), rounded up to a multiple of the zones

Without a subcommand, list the pools with their members, tenants and snapshot
version.`,
		Args: cobra.NoArgs,
		RunE: c.withClient(func(cmd *cobra.Command, _ []string, cl *client.Client) error {
			ps, err := cl.TenantPools(cmd.Context())
			if err != nil {
				return c.explainPools(err)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tMEMBERS\tTENANTS\tVERSION\tCAPACITY\tHEADROOM\tMIN\tMAX\tZONES\tUPDATED")
			for _, p := range ps {
				pol := p.Pool.Policy
				updated := "-"
				if !p.Updated.IsZero() {
					updated = p.Updated.Local().Format(time.DateTime)
				}
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%g/s\t%g\t%d\t%s\t%s\t%s\n", p.Pool.Name, p.Members, p.Tenants, p.Version,
					pol.CapacityPerMember, pol.Headroom, pol.MinSize, countOrNone(pol.MaxSize), onOff(pol.ZoneAware), updated)
			}
			if len(ps) == 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), "no tenant pools; create one with `keyshard pools put NAME --capacity N`")
			}
			return tw.Flush()
		}),
	}
	c.register(pools)
	pools.PersistentFlags().Lookup("token").Usage = "bearer token (env KEYSHARD_TOKEN): admin to change pools; admin or member to read"

	var (
		p         client.TenantPool
		overrides []string
	)
	put := &cobra.Command{
		Use:   "put NAME --capacity N",
		Short: "Create a tenant pool, or replace its settings (unset flags get the server's defaults)",
		Example: `  keyshard pools put index-gateways --capacity 10
  keyshard pools put index-gateways --capacity 10 --headroom 1.2 --min 3 --max 30 --zone-aware \
      --lookback 15m --warm-up 1m --override tenant-a=size:12 --override tenant-b=min:6`,
		Args: cobra.ExactArgs(1),
		RunE: c.with(func(cmd *cobra.Command, args []string, adm *client.Admin) error {
			p.Name = args[0]
			ov, err := parseOverrides(overrides)
			if err != nil {
				return err
			}
			p.Policy.Overrides = ov
			got, err := adm.PutTenantPool(cmd.Context(), p)
			if err != nil {
				return c.explainPools(err)
			}
			printTenantPool(cmd.OutOrStdout(), got)
			return nil
		}),
	}
	fl := put.Flags()
	fl.Float64Var(&p.Policy.CapacityPerMember, "capacity", 0, "requests/s one member serves for one tenant (required)")
	fl.Float64Var(&p.Policy.Headroom, "headroom", 0, "multiplies the rate before sizing, 1.25 keeps 20% spare (default 1)")
	fl.IntVar(&p.Policy.MinSize, "min", 0, "smallest size of any tenant (default 1)")
	fl.IntVar(&p.Policy.MaxSize, "max", 0, "largest size of any tenant (default: no bound but the pool)")
	fl.DurationVar(&p.Policy.ShrinkCooldown, "shrink-cooldown", 0, "how long a smaller size must be wanted before a shrink (default 10m, at least --window)")
	fl.IntVar(&p.Policy.MaxShrinkStep, "max-shrink-step", 0, "most members one shrink removes (default one per zone)")
	fl.DurationVar(&p.Policy.Lookback, "lookback", 0, "how long a member removed from a subset stays a read target (default 0)")
	fl.DurationVar(&p.Policy.WarmUp, "warm-up", 0, "how long a member added to a subset waits to be read unless it reports ready (default 0)")
	fl.BoolVar(&p.Policy.ZoneAware, "zone-aware", false, "spread each tenant over zones; sizes are multiples of the zone count")
	fl.Float64Var(&p.Policy.Tolerance, "tolerance", 0, "balance tolerance of the subsets (default 0.1)")
	fl.IntVar(&p.Policy.RebalanceMoves, "rebalance-moves", 0, "placements one round may move only for balance (default 0)")
	fl.DurationVar(&p.Policy.ForgetAfter, "forget-after", 0, "drop a tenant with no load for this long (default: never)")
	fl.DurationVar(&p.Policy.Window, "window", 0, "the span load is measured over (default 1m, at least 2s)")
	fl.DurationVar(&p.LeaseTTL, "lease-ttl", 0, "members' session TTL (default 10s, at least 2s)")
	fl.StringArrayVar(&overrides, "override", nil, "per-tenant exception TENANT=size:N or TENANT=min:N[,max:M] (repeatable)")
	put.MarkFlagRequired("capacity")

	var yes bool
	del := &cobra.Command{
		Use:   "delete NAME --yes",
		Short: "Delete a tenant pool, its members' sessions and its snapshot",
		Args:  cobra.ExactArgs(1),
		RunE: c.with(func(cmd *cobra.Command, args []string, adm *client.Admin) error {
			if !yes {
				return fmt.Errorf("deleting pool %q ends its members' sessions and forgets every tenant's size; pass --yes to do it", args[0])
			}
			if err := adm.DeleteTenantPool(cmd.Context(), args[0]); err != nil {
				return c.explainPools(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted tenant pool %s\n", args[0])
			return nil
		}),
	}
	del.Flags().BoolVar(&yes, "yes", false, "confirm the deletion")
	pools.AddCommand(put, del)

	var (
		tc    connFlags
		limit int
		watch bool
	)
	tenants := &cobra.Command{
		Use:   "tenants POOL",
		Short: "Show a pool's busiest tenants: rate, size, members and why the size last changed",
		Long: `Show a pool's tenants, busiest first: the rate the leader measures, the size,
the members (+ joined and not read yet, - removed and served for the lookback)
and why the size last changed. With --watch, print again at every new
snapshot version until interrupted.`,
		Args: cobra.ExactArgs(1),
		RunE: tc.withClient(func(cmd *cobra.Command, args []string, cl *client.Client) error {
			ctx, out, pool := cmd.Context(), cmd.OutOrStdout(), args[0]
			page, err := cl.Tenants(ctx, pool, nil, limit)
			if err != nil {
				return tc.explainPools(err)
			}
			printTenants(out, page)
			if !watch {
				return nil
			}
			f, err := cl.FollowPool(ctx, pool)
			if err != nil {
				return tc.explainPools(err)
			}
			defer f.Close()
			for {
				select {
				case <-ctx.Done():
					return nil
				case <-f.Changed():
				}
				page, err := cl.Tenants(ctx, pool, nil, limit)
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					fmt.Fprintf(cmd.ErrOrStderr(), "%v (retrying at the next version)\n", err)
					continue
				}
				fmt.Fprintln(out)
				printTenants(out, page)
			}
		}),
	}
	tc.register(tenants)
	tenants.Flags().IntVar(&limit, "limit", 20, fmt.Sprintf("tenants to show, busiest first (at most %d)", client.MaxTenantsPage))
	tenants.Flags().BoolVar(&watch, "watch", false, "print again at every new snapshot version")

	var oc connFlags
	tenant := &cobra.Command{
		Use:   "tenant POOL TENANT",
		Short: "Show one tenant: rate, size, members with their state, read targets, and why the size last changed",
		Args:  cobra.ExactArgs(2),
		RunE: oc.withClient(func(cmd *cobra.Command, args []string, cl *client.Client) error {
			page, err := cl.Tenants(cmd.Context(), args[0], []string{args[1]}, 0)
			if err != nil {
				return oc.explainPools(err)
			}
			if len(page.Tenants) != 1 {
				return fmt.Errorf("the server answered %d tenants for %q; want 1", len(page.Tenants), args[1])
			}
			printTenant(cmd.OutOrStdout(), page.Version, page.Tenants[0])
			return nil
		}),
	}
	oc.register(tenant)

	root.AddCommand(pools, tenants, tenant)
}

// parseOverrides parses --override TENANT=size:N or TENANT=min:N,max:M.
func parseOverrides(in []string) (map[string]client.TenantOverride, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make(map[string]client.TenantOverride, len(in))
	for _, s := range in {
		tenant, spec, ok := strings.Cut(s, "=")
		if !ok || tenant == "" || spec == "" {
			return nil, fmt.Errorf("--override %q: want TENANT=size:N or TENANT=min:N,max:M", s)
		}
		if _, dup := out[tenant]; dup {
			return nil, fmt.Errorf("--override %q: tenant %q is overridden twice", s, tenant)
		}
		var o client.TenantOverride
		for _, part := range strings.Split(spec, ",") {
			k, v, ok := strings.Cut(part, ":")
			n, err := strconv.Atoi(v)
			if !ok || err != nil || n <= 0 {
				return nil, fmt.Errorf("--override %q: %q is not KEY:N with N a positive integer", s, part)
			}
			switch k {
			case "size":
				o.Size = n
			case "min":
				o.MinSize = n
			case "max":
				o.MaxSize = n
			default:
				return nil, fmt.Errorf("--override %q: unknown key %q; want size, min or max", s, k)
			}
		}
		out[tenant] = o
	}
	return out, nil
}

func countOrNone(n int) string {
	if n == 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

func onOff(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func printTenantPool(out io.Writer, p client.TenantPool) {
	pol := p.Policy
	fmt.Fprintf(out, "tenant pool %s: capacity %g/s per member, headroom %g, size %d..%s, zone-aware %s\n",
		p.Name, pol.CapacityPerMember, pol.Headroom, pol.MinSize, countOrNone(pol.MaxSize), onOff(pol.ZoneAware))
	fmt.Fprintf(out, "  shrink cooldown %v (step %s), window %v, lookback %v, warm-up %v, tolerance %g, rebalance moves %d, forget after %s, lease TTL %v\n",
		pol.ShrinkCooldown, countOrNone(pol.MaxShrinkStep), pol.Window, pol.Lookback, pol.WarmUp, pol.Tolerance, pol.RebalanceMoves, durOrNever(pol.ForgetAfter), p.LeaseTTL)
	for _, t := range slices.Sorted(maps.Keys(pol.Overrides)) {
		o := pol.Overrides[t]
		if o.Size > 0 {
			fmt.Fprintf(out, "  override %s: size %d\n", t, o.Size)
		} else {
			fmt.Fprintf(out, "  override %s: min %s, max %s\n", t, countOrNone(o.MinSize), countOrNone(o.MaxSize))
		}
	}
}

func durOrNever(d time.Duration) string {
	if d == 0 {
		return "never"
	}
	return d.String()
}

func rateString(t client.TenantStatus) string {
	if !t.RateKnown {
		return "?"
	}
	return strconv.FormatFloat(t.Rate, 'f', 1, 64) + "/s"
}

// memberList marks members: + joined and not a read target yet,
// - removed (a read target for the lookback, or, removed before it was
// read, still serving for clients a version behind).
func memberList(t client.TenantStatus) string {
	target := make(map[string]bool, len(t.Targets))
	for _, m := range t.Targets {
		target[m] = true
	}
	parts := make([]string, 0, len(t.Members))
	for _, m := range t.Members {
		switch {
		case !m.Removed.IsZero():
			parts = append(parts, "-"+m.ID)
		case !target[m.ID]:
			parts = append(parts, "+"+m.ID)
		default:
			parts = append(parts, m.ID)
		}
	}
	return strings.Join(parts, " ")
}

func printTenants(out io.Writer, page client.TenantsPage) {
	fmt.Fprintf(out, "version %d, %d tenants (showing %d)\n", page.Version, page.Total, len(page.Tenants))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tRATE\tSIZE\tMEMBERS\tWHY")
	for _, t := range page.Tenants {
		why := t.Why
		if !t.Known {
			why = "not measured yet: stateless subset at the minimum size"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", t.Tenant, rateString(t), t.Size, memberList(t), why)
	}
	tw.Flush()
}

func printTenant(out io.Writer, version uint64, t client.TenantStatus) {
	fmt.Fprintf(out, "tenant %s (snapshot version %d)\n", t.Tenant, version)
	fmt.Fprintf(out, "  rate     %s\n", rateString(t))
	fmt.Fprintf(out, "  size     %d\n", t.Size)
	if t.Known {
		when := ""
		if !t.When.IsZero() {
			when = " (at " + t.When.Local().Format(time.DateTime) + ")"
		}
		fmt.Fprintf(out, "  why      %s%s\n", t.Why, when)
	} else {
		fmt.Fprintln(out, "  why      not measured yet: served by the stateless subset at the pool's minimum size")
	}
	fmt.Fprintf(out, "  targets  %s\n", strings.Join(t.Targets, " "))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  MEMBER\tSTATE\tADDED\tREMOVED")
	target := make(map[string]bool, len(t.Targets))
	for _, m := range t.Targets {
		target[m] = true
	}
	for _, m := range t.Members {
		state := "serving"
		switch {
		case !m.Removed.IsZero():
			state = "removed, read for the lookback"
			if !target[m.ID] {
				state = "removed, no read target; serves for the lookback (clients a version behind may read it)"
			}
		case !target[m.ID]:
			state = "warming up (not read yet)"
		case m.Ready:
			state = "serving (ready)"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", m.ID, state, stamp(m.Added, "from the start"), stamp(m.Removed, "-"))
	}
	tw.Flush()
}

func stamp(t time.Time, zero string) string {
	if t.IsZero() {
		return zero
	}
	return t.Local().Format(time.DateTime)
}
