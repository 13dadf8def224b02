package server

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"
	"unicode"

	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/internal/tenantpool"
	"github.com/keyshard/keyshard/placement"
)

// Defaults of a tenant pool (see TenantPoolPolicy in the API).
const (
	DefaultTenantHeadroom       = 1.0
	DefaultTenantMinSize        = 1
	DefaultTenantShrinkCooldown = 10 * time.Minute
	DefaultTenantWindow         = time.Minute
	DefaultTenantLeaseTTL       = 10 * time.Second
)

// TenantPoolConfig is a tenant pool declared in the config file, or sent
// to PutTenantPool. Zero values take the defaults. Durations are Go
// durations ("10m", "1m30s").
type TenantPoolConfig struct {
	Name     string                 `yaml:"name"`
	Policy   TenantPoolPolicyConfig `yaml:"policy"`
	LeaseTTL time.Duration          `yaml:"lease_ttl"`
}

// TenantPoolPolicyConfig is a pool's policy; see TenantPoolPolicy in the
// API for every field.
type TenantPoolPolicyConfig struct {
	CapacityPerMember float64                         `yaml:"capacity_per_member"`
	Headroom          float64                         `yaml:"headroom"`
	MinSize           int                             `yaml:"min_size"`
	MaxSize           int                             `yaml:"max_size"`
	ShrinkCooldown    time.Duration                   `yaml:"shrink_cooldown"`
	MaxShrinkStep     int                             `yaml:"max_shrink_step"`
	Lookback          time.Duration                   `yaml:"lookback"`
	WarmUp            time.Duration                   `yaml:"warm_up"`
	ZoneAware         bool                            `yaml:"zone_aware"`
	Overrides         map[string]TenantOverrideConfig `yaml:"overrides"`
	Tolerance         float64                         `yaml:"tolerance"`
	RebalanceMoves    int                             `yaml:"rebalance_moves"`
	ForgetAfter       time.Duration                   `yaml:"forget_after"`
	Window            time.Duration                   `yaml:"window"`
}

// TenantOverrideConfig is a per-tenant exception to a pool's sizing.
type TenantOverrideConfig struct {
	Size    int `yaml:"size"`
	MinSize int `yaml:"min_size"`
	MaxSize int `yaml:"max_size"`
}

// Normalize fills defaults, validates and returns the pool as stored. The
// error starts with the field's name ("policy.window: ..."), so that
// callers can prefix where the pool came from.
func (c TenantPoolConfig) Normalize() (store.TenantPool, error) {
	if err := validName(c.Name); err != nil {
		return store.TenantPool{}, fmt.Errorf("name: %w", err)
	}
	p := c.Policy
	fe := func(field, format string, args ...any) (store.TenantPool, error) {
		return store.TenantPool{}, fmt.Errorf("policy.%s: %s", field, fmt.Sprintf(format, args...))
	}
	if !finiteF(p.CapacityPerMember) || p.CapacityPerMember <= 0 {
		return fe("capacity_per_member", "%v; want a finite number > 0, the requests/s one member serves for one tenant (required)", p.CapacityPerMember)
	}
	if p.Headroom == 0 {
		p.Headroom = DefaultTenantHeadroom
	}
	if !finiteF(p.Headroom) || p.Headroom < 0 {
		return fe("headroom", "%v; want a finite number > 0 (0 means %v)", p.Headroom, DefaultTenantHeadroom)
	}
	if p.MinSize == 0 {
		p.MinSize = DefaultTenantMinSize
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"min_size", p.MinSize}, {"max_size", p.MaxSize}, {"max_shrink_step", p.MaxShrinkStep}, {"rebalance_moves", p.RebalanceMoves}} {
		if f.v < 0 {
			return fe(f.name, "%d; want >= 0", f.v)
		}
	}
	if p.MaxSize > 0 && p.MaxSize < p.MinSize {
		return fe("max_size", "%d is below min_size %d", p.MaxSize, p.MinSize)
	}
	if p.Window == 0 {
		p.Window = DefaultTenantWindow
	}
	if p.ShrinkCooldown == 0 {
		p.ShrinkCooldown = DefaultTenantShrinkCooldown
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"window", p.Window}, {"shrink_cooldown", p.ShrinkCooldown}, {"lookback", p.Lookback}, {"warm_up", p.WarmUp}, {"forget_after", p.ForgetAfter}} {
		switch {
		case f.v < 0:
			return fe(f.name, "%v; want a duration >= 0", f.v)
		case f.v > store.MaxTenantPoolPeriod:
			return fe(f.name, "%v; want at most %v", f.v, store.MaxTenantPoolPeriod)
		case f.v%time.Millisecond != 0:
			return fe(f.name, "%v; want whole milliseconds", f.v)
		}
	}
	if p.Window < store.MinTenantWindow {
		return fe("window", "%v; want at least %v (0 means %v)", p.Window, store.MinTenantWindow, DefaultTenantWindow)
	}
	if p.ShrinkCooldown < p.Window {
		return fe("shrink_cooldown", "%v is shorter than the window %v; want at least the window, so that a new leader, which measures from scratch, cannot shrink anyone before it has measured", p.ShrinkCooldown, p.Window)
	}
	if p.Tolerance == 0 {
		p.Tolerance = placement.DefaultTolerance
	}
	if !finiteF(p.Tolerance) || p.Tolerance < 0 {
		return fe("tolerance", "%v; want a finite number > 0 (0 means %v)", p.Tolerance, placement.DefaultTolerance)
	}
	ttl := c.LeaseTTL
	if ttl == 0 {
		ttl = DefaultTenantLeaseTTL
	}
	if ttl < store.MinTenantLeaseTTL || ttl > store.MaxTenantLeaseTTL || ttl%time.Second != 0 {
		return store.TenantPool{}, fmt.Errorf("lease_ttl: %v; want whole seconds from %v to %v (0 means %v)", ttl, store.MinTenantLeaseTTL, store.MaxTenantLeaseTTL, DefaultTenantLeaseTTL)
	}
	pol := tenantpool.Policy{
		CapacityPerMember: p.CapacityPerMember, Headroom: p.Headroom, MinSize: p.MinSize, MaxSize: p.MaxSize,
		ShrinkCooldown: p.ShrinkCooldown, MaxShrinkStep: p.MaxShrinkStep, Lookback: p.Lookback, WarmUp: p.WarmUp,
		ZoneAware: p.ZoneAware, Tolerance: p.Tolerance, RebalanceMoves: p.RebalanceMoves, ForgetAfter: p.ForgetAfter,
	}
	if len(p.Overrides) > 0 {
		pol.Overrides = make(map[string]tenantpool.Override, len(p.Overrides))
		for id, o := range p.Overrides {
			if len(id) > store.MaxTenantLen {
				return fe(fmt.Sprintf("overrides[%.40q]", id), "tenant id is %d bytes; want at most %d", len(id), store.MaxTenantLen)
			}
			pol.Overrides[id] = tenantpool.Override(o)
		}
	}
	if err := pol.Validate(); err != nil {
		var fe *tenantpool.FieldError
		if errors.As(err, &fe) {
			return store.TenantPool{}, fmt.Errorf("policy.%s: %s", snakeField(fe.Field), fe.Reason)
		}
		return store.TenantPool{}, fmt.Errorf("policy: %w", err)
	}
	sp := store.TenantPool{Name: c.Name, Policy: pol, Window: p.Window, LeaseTTL: ttl}
	if err := sp.Validate(); err != nil {
		return store.TenantPool{}, err
	}
	return sp, nil
}

func finiteF(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// snakeField turns tenantpool's field names (`Overrides["t1"].MinSize`)
// into the API's (`overrides["t1"].min_size`).
func snakeField(f string) string {
	var b strings.Builder
	quoted := false
	for i, r := range f {
		switch {
		case r == '"':
			quoted = !quoted
			b.WriteRune(r)
		case quoted:
			b.WriteRune(r)
		case unicode.IsUpper(r):
			if i > 0 && f[i-1] != '.' {
				b.WriteByte('_')
			}
			b.WriteRune(unicode.ToLower(r))
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// tenantPoolFromProto reads an API pool into a config. Errors are
// INVALID_ARGUMENT naming the field ("pool.policy.window").
func tenantPoolFromProto(p *v1.TenantPool) (store.TenantPool, error) {
	if p == nil {
		return store.TenantPool{}, invalid("pool: missing; send {\"pool\": {\"name\": ..., \"policy\": {\"capacity_per_member\": ...}}}")
	}
	c := TenantPoolConfig{Name: p.GetName()}
	dur := func(field string, d *durationpb.Duration, into *time.Duration) error {
		if d == nil {
			return nil
		}
		if err := d.CheckValid(); err != nil {
			return invalid("pool.%s: %v", field, err)
		}
		*into = d.AsDuration()
		if *into < 0 {
			return invalid("pool.%s: %v; want a duration >= 0", field, *into)
		}
		return nil
	}
	if err := dur("lease_ttl", p.GetLeaseTtl(), &c.LeaseTTL); err != nil {
		return store.TenantPool{}, err
	}
	if pp := p.GetPolicy(); pp != nil {
		c.Policy = TenantPoolPolicyConfig{
			CapacityPerMember: pp.GetCapacityPerMember(), Headroom: pp.GetHeadroom(),
			MinSize: int(pp.GetMinSize()), MaxSize: int(pp.GetMaxSize()), MaxShrinkStep: int(pp.GetMaxShrinkStep()),
			ZoneAware: pp.GetZoneAware(), Tolerance: pp.GetTolerance(), RebalanceMoves: int(pp.GetRebalanceMoves()),
		}
		for _, d := range []struct {
			field string
			d     *durationpb.Duration
			into  *time.Duration
		}{
			{"policy.shrink_cooldown", pp.GetShrinkCooldown(), &c.Policy.ShrinkCooldown},
			{"policy.lookback", pp.GetLookback(), &c.Policy.Lookback},
			{"policy.warm_up", pp.GetWarmUp(), &c.Policy.WarmUp},
			{"policy.forget_after", pp.GetForgetAfter(), &c.Policy.ForgetAfter},
			{"policy.window", pp.GetWindow(), &c.Policy.Window},
		} {
			if err := dur(d.field, d.d, d.into); err != nil {
				return store.TenantPool{}, err
			}
		}
		if len(pp.GetOverrides()) > 0 {
			c.Policy.Overrides = map[string]TenantOverrideConfig{}
			for id, o := range pp.GetOverrides() {
				if o == nil {
					continue
				}
				c.Policy.Overrides[id] = TenantOverrideConfig{Size: int(o.GetSize()), MinSize: int(o.GetMinSize()), MaxSize: int(o.GetMaxSize())}
			}
		}
	}
	sp, err := c.Normalize()
	if err != nil {
		return store.TenantPool{}, invalid("pool.%v", err)
	}
	return sp, nil
}

// tenantPolicyProto is the API form of a policy; window is the pool's.
func tenantPolicyProto(p tenantpool.Policy, window time.Duration) *v1.TenantPoolPolicy {
	out := &v1.TenantPoolPolicy{
		CapacityPerMember: p.CapacityPerMember, Headroom: p.Headroom, MinSize: uint32(p.MinSize), MaxSize: uint32(p.MaxSize),
		ShrinkCooldown: durationpb.New(p.ShrinkCooldown), MaxShrinkStep: uint32(p.MaxShrinkStep),
		Lookback: durationpb.New(p.Lookback), WarmUp: durationpb.New(p.WarmUp), ZoneAware: p.ZoneAware,
		Tolerance: p.Tolerance, RebalanceMoves: uint32(p.RebalanceMoves), ForgetAfter: durationpb.New(p.ForgetAfter),
	}
	if window > 0 {
		out.Window = durationpb.New(window)
	}
	if len(p.Overrides) > 0 {
		out.Overrides = make(map[string]*v1.TenantOverride, len(p.Overrides))
		for id, o := range p.Overrides {
			out.Overrides[id] = &v1.TenantOverride{Size: uint32(o.Size), MinSize: uint32(o.MinSize), MaxSize: uint32(o.MaxSize)}
		}
	}
	return out
}

func tenantPoolProto(p store.TenantPool) *v1.TenantPool {
	return &v1.TenantPool{Name: p.Name, Policy: tenantPolicyProto(p.Policy, p.Window), LeaseTtl: durationpb.New(p.LeaseTTL)}
}

// validateTenantPools normalizes the config file's tenant pools.
func (c *Config) validateTenantPools() error {
	seen := map[string]bool{}
	for i, p := range c.TenantPools {
		field := fmt.Sprintf("tenant_pools[%d]", i)
		if _, err := p.Normalize(); err != nil {
			return fmt.Errorf("%w: %s.%v", ErrConfig, field, err)
		}
		if seen[p.Name] {
			return configErr(field+".name", "%q is declared twice", p.Name)
		}
		seen[p.Name] = true
	}
	return nil
}

// sortedPools sorts pool protos by name.
func sortedPools(ps []*v1.TenantPoolStatus) {
	sort.Slice(ps, func(i, j int) bool { return ps[i].GetPool().GetName() < ps[j].GetPool().GetName() })
}

// validateAdvertiseURL checks advertise_url: an http or https URL with a
// host, nothing after the path.
func (c *Config) validateAdvertiseURL() error {
	if c.AdvertiseURL == "" {
		return nil
	}
	u, err := url.Parse(c.AdvertiseURL)
	switch {
	case err != nil:
		return configErr("advertise_url", "%q: %v", c.AdvertiseURL, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return configErr("advertise_url", "%q: scheme %q; want http or https (https when tls is set)", c.AdvertiseURL, u.Scheme)
	case u.Host == "":
		return configErr("advertise_url", "%q has no host; want for example http://10.0.0.5:7400", c.AdvertiseURL)
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return configErr("advertise_url", "%q: want scheme://host:port and an optional path, without user, query or fragment", c.AdvertiseURL)
	case (u.Scheme == "https") != (c.TLS.CertFile != ""):
		return configErr("advertise_url", "%q: scheme %s, but the API is served %s; the scheme must match tls", c.AdvertiseURL, u.Scheme, map[bool]string{true: "with TLS", false: "without TLS"}[c.TLS.CertFile != ""])
	}
	return nil
}

// advertiseURL returns the URL this replica advertises, its API bound at
// addr.
func (s *Server) advertiseURL(addr string) string {
	if s.cfg.AdvertiseURL != "" {
		return strings.TrimRight(s.cfg.AdvertiseURL, "/")
	}
	scheme := "http"
	if s.cfg.TLS.CertFile != "" {
		scheme = "https"
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return scheme + "://" + addr
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil && h != "" {
			host = h
		}
	}
	return scheme + "://" + net.JoinHostPort(host, port)
}
