package client

import (
	"context"
	"fmt"
	"math"
	"time"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
)

// TenantPool is a tenant pool's settings (see TenantPoolPolicy). Zero
// fields take the server's defaults; PutTenantPool returns them filled in.
type TenantPool struct {
	Name   string
	Policy TenantPoolPolicy
	// LeaseTTL is how long a member's session lives without a keep-alive
	// (default 10s, at least 2s).
	LeaseTTL time.Duration
}

// TenantPoolPolicy says how a pool sizes and places tenants:
//
//	size = clamp(⌈rate × Headroom / CapacityPerMember⌉, MinSize, MaxSize),
//	       rounded up to a multiple of the zones with ZoneAware
//
// growing at once, shrinking after ShrinkCooldown by at most MaxShrinkStep.
// The proto's TenantPoolPolicy documents every field and default.
type TenantPoolPolicy struct {
	CapacityPerMember float64 // requests/s one member serves for one tenant; required
	Headroom          float64 // default 1
	MinSize, MaxSize  int     // default 1; 0: no bound but the pool
	ShrinkCooldown    time.Duration
	MaxShrinkStep     int
	Lookback          time.Duration
	WarmUp            time.Duration
	ZoneAware         bool
	Overrides         map[string]TenantOverride
	Tolerance         float64
	RebalanceMoves    int
	ForgetAfter       time.Duration
	Window            time.Duration
}

// TenantOverride is a per-tenant exception: a fixed Size, or the tenant's
// own MinSize and MaxSize.
type TenantOverride struct {
	Size, MinSize, MaxSize int
}

// TenantPoolStatus is a pool with its live members, tenants and snapshot
// version.
type TenantPoolStatus struct {
	Pool    TenantPool
	Members int
	Tenants int
	Version uint64
	Updated time.Time
}

// TenantStatus is the operator's view of one tenant.
type TenantStatus struct {
	Tenant string
	// Size is the tenant's size; Members its subset (with members removed
	// within the lookback) and Targets its read targets now.
	Size    int
	Members []TenantMember
	Targets []string
	// Why explains the last size change, at When.
	Why  string
	When time.Time
	// Rate is the requests/s the leader measures now; RateKnown is false
	// when the leader could not be asked.
	Rate      float64
	RateKnown bool
	// Known is false for a tenant the snapshot does not hold: it is served
	// by the stateless subset at the pool's minimum size.
	Known bool
}

// TenantMember is one member of a tenant's subset.
type TenantMember struct {
	ID string
	// Added is when it joined the subset (zero: from the start).
	Added time.Time
	Ready bool
	// Removed is when it left the subset; zero while it is in it.
	Removed time.Time
}

// TenantsPage is GetTenants' answer.
type TenantsPage struct {
	Version uint64
	Tenants []TenantStatus
	// Total is the number of tenants in the snapshot.
	Total int
}

// PutTenantPool creates a tenant pool or replaces its settings, and
// returns them as stored, defaults filled in. Bad settings give an error
// wrapping ErrInvalid that names the field.
func (a *Admin) PutTenantPool(ctx context.Context, pool TenantPool) (TenantPool, error) {
	p, err := tenantPoolToProto("Admin.PutTenantPool", pool)
	if err != nil {
		return TenantPool{}, err
	}
	resp, err := call(ctx, a.c, poolAPI.PutTenantPool, &keyshardv1.PutTenantPoolRequest{Pool: p})
	if err != nil {
		return TenantPool{}, fmt.Errorf("put tenant pool %q: %w", pool.Name, err)
	}
	return tenantPoolFromProto(resp.GetPool()), nil
}

// DeleteTenantPool deletes a pool, its members' sessions and its snapshot.
func (a *Admin) DeleteTenantPool(ctx context.Context, name string) error {
	if err := validName("Admin.DeleteTenantPool", "tenant pool name", name); err != nil {
		return err
	}
	if _, err := call(ctx, a.c, poolAPI.DeleteTenantPool, &keyshardv1.DeleteTenantPoolRequest{Name: name}); err != nil {
		return fmt.Errorf("delete tenant pool %q: %w", name, err)
	}
	return nil
}

// ListTenantPools returns every tenant pool with its status.
func (a *Admin) ListTenantPools(ctx context.Context) ([]TenantPoolStatus, error) {
	return a.c.TenantPools(ctx)
}

// TenantPools returns every tenant pool with its status. Admin and member
// tokens may call it.
func (c *Client) TenantPools(ctx context.Context) ([]TenantPoolStatus, error) {
	resp, err := call(ctx, c, poolAPI.ListTenantPools, &keyshardv1.ListTenantPoolsRequest{})
	if err != nil {
		return nil, fmt.Errorf("list tenant pools: %w", err)
	}
	out := make([]TenantPoolStatus, 0, len(resp.GetPools()))
	for _, p := range resp.GetPools() {
		out = append(out, TenantPoolStatus{
			Pool:    tenantPoolFromProto(p.GetPool()),
			Members: int(p.GetMembers()),
			Tenants: int(p.GetTenants()),
			Version: p.GetVersion(),
			Updated: timeFromProto(p.GetUpdated()),
		})
	}
	return out, nil
}

// MaxTenantsPage is the most tenants one Tenants call returns.
const MaxTenantsPage = 10_000

// Tenants returns the operator's view of a pool's tenants: the listed
// ones (also tenants the snapshot does not hold), or with none listed the
// limit busiest (0 means 100; at most MaxTenantsPage). Any replica
// answers; the rates come from the leader.
func (c *Client) Tenants(ctx context.Context, pool string, tenants []string, limit int) (TenantsPage, error) {
	const fn = "Client.Tenants"
	if err := validName(fn, "tenant pool name", pool); err != nil {
		return TenantsPage{}, err
	}
	if limit < 0 || limit > MaxTenantsPage {
		return TenantsPage{}, argError(fn, "limit", "%d is outside [0, %d]", limit, MaxTenantsPage)
	}
	for i, t := range tenants {
		if t == "" {
			return TenantsPage{}, argError(fn, fmt.Sprintf("tenants[%d]", i), "is empty")
		}
	}
	resp, err := call(ctx, c, poolAPI.GetTenants, &keyshardv1.GetTenantsRequest{Pool: pool, Tenants: tenants, Limit: uint32(limit)})
	if err != nil {
		return TenantsPage{}, fmt.Errorf("tenants of pool %q: %w", pool, err)
	}
	page := TenantsPage{Version: resp.GetVersion(), Total: int(resp.GetTotal())}
	for _, ts := range resp.GetTenants() {
		a := ts.GetAssignment()
		st := TenantStatus{
			Tenant:    a.GetTenant(),
			Size:      int(a.GetSize()),
			Why:       a.GetWhy(),
			When:      timeFromProto(a.GetWhen()),
			Rate:      ts.GetRate(),
			RateKnown: ts.GetRateKnown(),
			Known:     ts.GetKnown(),
		}
		removed := map[string]time.Time{}
		for _, r := range a.GetRemoved() {
			removed[r.GetMember()] = timeFromProto(r.GetAt())
		}
		for _, m := range a.GetMembers() {
			st.Members = append(st.Members, TenantMember{ID: m.GetMember(), Added: timeFromProto(m.GetAdded()), Ready: m.GetReady(), Removed: removed[m.GetMember()]})
		}
		now := c.opts.clock.Now()
		for _, sp := range a.GetTargets() {
			if from := timeFromProto(sp.GetFrom()); from.IsZero() || !from.After(now) {
				st.Targets = sp.GetMembers()
			}
		}
		page.Tenants = append(page.Tenants, st)
	}
	return page, nil
}

func tenantPoolToProto(fn string, p TenantPool) (*keyshardv1.TenantPool, error) {
	if err := validName(fn, "tenant pool name", p.Name); err != nil {
		return nil, err
	}
	pol := p.Policy
	for _, f := range []struct {
		name string
		v    float64
	}{{"CapacityPerMember", pol.CapacityPerMember}, {"Headroom", pol.Headroom}, {"Tolerance", pol.Tolerance}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 {
			return nil, argError(fn, "TenantPool.Policy."+f.name, "%v is not a finite number >= 0", f.v)
		}
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"Policy.ShrinkCooldown", pol.ShrinkCooldown}, {"Policy.Lookback", pol.Lookback}, {"Policy.WarmUp", pol.WarmUp}, {"Policy.ForgetAfter", pol.ForgetAfter}, {"Policy.Window", pol.Window}, {"LeaseTTL", p.LeaseTTL}} {
		if f.v < 0 {
			return nil, argError(fn, "TenantPool."+f.name, "%v is negative (0 means the default)", f.v)
		}
	}
	count := func(name string, v int) (uint32, error) {
		if v < 0 || v > math.MaxUint32 {
			return 0, argError(fn, name, "%d is out of range (0 means the default)", v)
		}
		return uint32(v), nil
	}
	out := &keyshardv1.TenantPoolPolicy{
		CapacityPerMember: pol.CapacityPerMember,
		Headroom:          pol.Headroom,
		ShrinkCooldown:    durationToProto(pol.ShrinkCooldown),
		Lookback:          durationToProto(pol.Lookback),
		WarmUp:            durationToProto(pol.WarmUp),
		ZoneAware:         pol.ZoneAware,
		Tolerance:         pol.Tolerance,
		ForgetAfter:       durationToProto(pol.ForgetAfter),
		Window:            durationToProto(pol.Window),
	}
	var err error
	for _, f := range []struct {
		name string
		v    int
		dst  *uint32
	}{{"TenantPool.Policy.MinSize", pol.MinSize, &out.MinSize}, {"TenantPool.Policy.MaxSize", pol.MaxSize, &out.MaxSize}, {"TenantPool.Policy.MaxShrinkStep", pol.MaxShrinkStep, &out.MaxShrinkStep}, {"TenantPool.Policy.RebalanceMoves", pol.RebalanceMoves, &out.RebalanceMoves}} {
		if *f.dst, err = count(f.name, f.v); err != nil {
			return nil, err
		}
	}
	if len(pol.Overrides) > 0 {
		out.Overrides = make(map[string]*keyshardv1.TenantOverride, len(pol.Overrides))
	}
	for t, o := range pol.Overrides {
		name := fmt.Sprintf("TenantPool.Policy.Overrides[%q]", t)
		var po keyshardv1.TenantOverride
		for _, f := range []struct {
			name string
			v    int
			dst  *uint32
		}{{name + ".Size", o.Size, &po.Size}, {name + ".MinSize", o.MinSize, &po.MinSize}, {name + ".MaxSize", o.MaxSize, &po.MaxSize}} {
			if *f.dst, err = count(f.name, f.v); err != nil {
				return nil, err
			}
		}
		out.Overrides[t] = &po
	}
	return &keyshardv1.TenantPool{Name: p.Name, Policy: out, LeaseTtl: durationToProto(p.LeaseTTL)}, nil
}

func tenantPoolFromProto(p *keyshardv1.TenantPool) TenantPool {
	pol := p.GetPolicy()
	out := TenantPool{
		Name:     p.GetName(),
		LeaseTTL: p.GetLeaseTtl().AsDuration(),
		Policy: TenantPoolPolicy{
			CapacityPerMember: pol.GetCapacityPerMember(),
			Headroom:          pol.GetHeadroom(),
			MinSize:           int(pol.GetMinSize()),
			MaxSize:           int(pol.GetMaxSize()),
			ShrinkCooldown:    pol.GetShrinkCooldown().AsDuration(),
			MaxShrinkStep:     int(pol.GetMaxShrinkStep()),
			Lookback:          pol.GetLookback().AsDuration(),
			WarmUp:            pol.GetWarmUp().AsDuration(),
			ZoneAware:         pol.GetZoneAware(),
			Tolerance:         pol.GetTolerance(),
			RebalanceMoves:    int(pol.GetRebalanceMoves()),
			ForgetAfter:       pol.GetForgetAfter().AsDuration(),
			Window:            pol.GetWindow().AsDuration(),
		},
	}
	if len(pol.GetOverrides()) > 0 {
		out.Policy.Overrides = make(map[string]TenantOverride, len(pol.GetOverrides()))
		for t, o := range pol.GetOverrides() {
			out.Policy.Overrides[t] = TenantOverride{Size: int(o.GetSize()), MinSize: int(o.GetMinSize()), MaxSize: int(o.GetMaxSize())}
		}
	}
	return out
}
