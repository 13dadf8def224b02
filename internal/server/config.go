package server

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/placement"
)

// Config is everything `keyshard serve` needs. Build one with
// DefaultConfig, then overlay a file (LoadFile), the environment (FromEnv)
// and flags; Validate reports the first bad field by its name.
type Config struct {
	// Listen is the API address: gRPC, HTTP/JSON, /healthz, /readyz and
	// /metrics share it.
	Listen string `yaml:"listen"`
	// Replica names this serve process in status output and elections.
	// Default: hostname-pid.
	Replica string `yaml:"replica"`
	// ElectionTTL is the lease of this replica's election session: a
	// leader that crashes or is cut off from etcd is replaced about this
	// long later, and a leader that cannot renew its lease for about this
	// long stops leading. Whole seconds, MinElectionTTL to MaxElectionTTL;
	// default DefaultElectionTTL. Keep it at most the smallest keyspace
	// lease_ttl.
	ElectionTTL time.Duration `yaml:"election_ttl"`
	// TLS for the API port; both files or neither.
	TLS TLSFiles `yaml:"tls"`
	// Etcd is where state lives: embedded (default) or external.
	Etcd EtcdConfig `yaml:"etcd"`
	// Auth holds the bearer tokens of the two roles.
	Auth AuthConfig `yaml:"auth"`
	// Keyspaces are created at start if they do not exist yet.
	Keyspaces []KeyspaceConfig `yaml:"keyspaces"`
	// HotKeyPools are created at start if they do not exist yet; an
	// existing pool keeps its stored settings (change them with
	// `keyshard hotkeys pool put`).
	HotKeyPools []HotKeyPoolConfig `yaml:"hotkey_pools"`
	// TenantPools are created at start, or updated to these settings if
	// they exist with others: the config file declares them. Pools not
	// listed are left alone.
	TenantPools []TenantPoolConfig `yaml:"tenant_pools"`
	// AdvertiseURL is the URL other replicas reach this one's API at, to
	// forward tenant-pool calls to it while it leads. Default:
	// http(s)://<listen address>, with the host name when listening on
	// every address.
	AdvertiseURL string `yaml:"advertise_url"`
	// RebalanceGap is the least time between two maps of a keyspace that
	// only move buckets onto members that joined (or whose weight
	// changed): joins within it are gathered into one epoch, so a rollout
	// of many workers moves each bucket about once. Maps that place
	// buckets of a member that crashed, left or drains are never held
	// back. 0 writes every map at once; at most MaxRebalanceGap; default
	// DefaultRebalanceGap.
	RebalanceGap time.Duration `yaml:"rebalance_gap"`
	// DebugListen, when set, is the address (host:port) of a second
	// listener that serves Go's profiles (/debug/pprof/...) with no
	// token: bind it to loopback, or to a network only operators reach.
	// Empty: no such listener.
	DebugListen string `yaml:"debug_listen"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `yaml:"log_level"`
	// Limits bound request sizes, lookups and long polls.
	Limits Limits `yaml:"limits"`
	// TenantPoolTxnBytes bounds the keys and values of each transaction
	// of a tenant pool's publication; 0: store.DefaultTenantTxnBytes
	// (1 MiB, below etcd's default 1.5 MiB request limit). Not read from
	// the config file: Keyshard's tests set it small.
	TenantPoolTxnBytes int `yaml:"-"`
}

// TLSFiles names PEM files.
type TLSFiles struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// CAFile verifies the peer (for etcd: the etcd servers' CA).
	CAFile string `yaml:"ca_file"`
}

// EtcdConfig selects the store.
type EtcdConfig struct {
	// DataDir is the embedded etcd's data directory. Used when Endpoints
	// is empty.
	DataDir string `yaml:"data_dir"`
	// Endpoints of an external etcd cluster; empty means embedded.
	Endpoints []string `yaml:"endpoints"`
	// TLS to the external etcd (client certificate and CA).
	TLS      TLSFiles `yaml:"tls"`
	Username string   `yaml:"username"`
	Password string   `yaml:"password"`
}

// AuthConfig holds bearer tokens. A request must carry one of the tokens
// of a role the method needs: admin for AdminService, member for
// MemberService, either for MapService and HotKeyService.
type AuthConfig struct {
	AdminTokens  []string `yaml:"admin_tokens"`
	MemberTokens []string `yaml:"member_tokens"`
	// Disabled accepts every request without a token. Allowed only on a
	// loopback Listen address unless InsecureAnyAddress is also set.
	Disabled           bool `yaml:"disabled"`
	InsecureAnyAddress bool `yaml:"insecure_any_address"`
}

// KeyspaceConfig is a keyspace declared in the config file.
type KeyspaceConfig struct {
	Name         string             `yaml:"name"`
	Buckets      int                `yaml:"buckets"`
	Hash         placement.HashMode `yaml:"hash"`
	Mode         string             `yaml:"mode"`
	LeaseTTL     time.Duration      `yaml:"lease_ttl"`
	DrainTimeout time.Duration      `yaml:"drain_timeout"`
}

// HotKeyPoolConfig is a hot-key pool: a group of producers whose heavy
// hitters the leader sums into one cluster-wide overflow set. Rates are
// messages per second; zero values mean the defaults.
type HotKeyPoolConfig struct {
	Name string `yaml:"name"`
	// Threshold is the summed rate at which a key enters the set.
	// Required, > 0.
	Threshold float64 `yaml:"threshold"`
	// LowThreshold is the summed rate below which a key in the set starts
	// cooling down. Default Threshold/2; at most Threshold.
	LowThreshold float64 `yaml:"low_threshold"`
	// Cooldown is how long a key must stay below LowThreshold before it
	// leaves. Default DefaultHotKeyCooldown.
	Cooldown time.Duration `yaml:"cooldown"`
	// ReportThreshold is the local rate from which producers should report
	// a key. Default Threshold/64; at most Threshold.
	ReportThreshold float64 `yaml:"report_threshold"`
	// ReportMaxAge is how long a report counts. Default
	// DefaultHotKeyReportMaxAge, at least store.MinReportMaxAge.
	ReportMaxAge time.Duration `yaml:"report_max_age"`
	// MaxKeys caps the set. Default DefaultHotKeyMaxKeys, at most
	// store.MaxOverflowKeys.
	MaxKeys int `yaml:"max_keys"`
}

// Defaults for keyspaces, hot-key pools and the server.
const (
	DefaultListen       = "127.0.0.1:7400"
	DefaultLeaseTTL     = 10 * time.Second
	DefaultDrainTimeout = 30 * time.Second
	MinLeaseTTL         = 2 * time.Second

	DefaultHotKeyCooldown     = 30 * time.Second
	DefaultHotKeyReportMaxAge = 30 * time.Second
	DefaultHotKeyMaxKeys      = 1024
	// DefaultReportShare: the default report threshold is
	// Threshold/DefaultReportShare, so a key spread evenly over up to that
	// many producers is still reported by each and caught at the
	// threshold.
	DefaultReportShare = 64
)

// Bounds of Config.ElectionTTL. Below 2 s a leader would give up on a
// slow etcd after one missed renewal; above a minute handoffs would stall
// for a minute after a leader crash.
const (
	DefaultElectionTTL = 5 * time.Second
	MinElectionTTL     = 2 * time.Second
	MaxElectionTTL     = time.Minute
)

// Bounds of Config.RebalanceGap.
const (
	DefaultRebalanceGap = 250 * time.Millisecond
	MaxRebalanceGap     = 10 * time.Second
)

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("config")

func configErr(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrConfig, field, fmt.Sprintf(format, args...))
}

// DefaultConfig returns a Config that serves on loopback from an embedded
// etcd in ./keyshard-data, without authentication.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	if host == "" {
		host = "keyshard"
	}
	return Config{
		Listen:       DefaultListen,
		Replica:      fmt.Sprintf("%s-%d", host, os.Getpid()),
		ElectionTTL:  DefaultElectionTTL,
		RebalanceGap: DefaultRebalanceGap,
		Etcd:         EtcdConfig{DataDir: "keyshard-data"},
		LogLevel:     "info",
		Limits:       DefaultLimits(),
	}
}

// LoadFile overlays the YAML file at path onto c. Unknown fields are
// errors, reported with their line.
func (c *Config) LoadFile(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%w: read %s: %v", ErrConfig, path, err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrConfig, path, err)
	}
	return nil
}

// envVars maps environment variables to the fields they set.
var envVars = []struct {
	name, field string
	set         func(c *Config, v string)
}{
	{"KEYSHARD_LISTEN", "listen", func(c *Config, v string) { c.Listen = v }},
	{"KEYSHARD_REPLICA", "replica", func(c *Config, v string) { c.Replica = v }},
	{"KEYSHARD_ADVERTISE_URL", "advertise_url", func(c *Config, v string) { c.AdvertiseURL = v }},
	{"KEYSHARD_DEBUG_LISTEN", "debug_listen", func(c *Config, v string) { c.DebugListen = v }},
	{"KEYSHARD_DATA_DIR", "etcd.data_dir", func(c *Config, v string) { c.Etcd.DataDir = v }},
	{"KEYSHARD_ETCD_ENDPOINTS", "etcd.endpoints", func(c *Config, v string) { c.Etcd.Endpoints = splitList(v) }},
	{"KEYSHARD_ETCD_USERNAME", "etcd.username", func(c *Config, v string) { c.Etcd.Username = v }},
	{"KEYSHARD_ETCD_PASSWORD", "etcd.password", func(c *Config, v string) { c.Etcd.Password = v }},
	{"KEYSHARD_ADMIN_TOKENS", "auth.admin_tokens", func(c *Config, v string) { c.Auth.AdminTokens = splitList(v) }},
	{"KEYSHARD_MEMBER_TOKENS", "auth.member_tokens", func(c *Config, v string) { c.Auth.MemberTokens = splitList(v) }},
	{"KEYSHARD_LOG_LEVEL", "log_level", func(c *Config, v string) { c.LogLevel = v }},
}

// FromEnv overlays the KEYSHARD_* environment variables read through
// lookup (os.LookupEnv in production) onto c.
func (c *Config) FromEnv(lookup func(string) (string, bool)) {
	for _, e := range envVars {
		if v, ok := lookup(e.name); ok {
			e.set(c, v)
		}
	}
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// Validate checks every field and fills defaults into keyspaces. The
// error names the field, what is wrong and what to do.
func (c *Config) Validate() error {
	host, port, err := net.SplitHostPort(c.Listen)
	if err != nil || port == "" {
		return configErr("listen", "%q is not host:port (for example %s)", c.Listen, DefaultListen)
	}
	if c.Replica == "" {
		return configErr("replica", "empty; name this serve process")
	}
	if c.ElectionTTL == 0 {
		c.ElectionTTL = DefaultElectionTTL
	}
	if c.ElectionTTL < MinElectionTTL || c.ElectionTTL > MaxElectionTTL || c.ElectionTTL%time.Second != 0 {
		return configErr("election_ttl", "%v; want whole seconds from %v to %v (flag --election-ttl; etcd leases count in seconds)", c.ElectionTTL, MinElectionTTL, MaxElectionTTL)
	}
	if c.RebalanceGap < 0 || c.RebalanceGap > MaxRebalanceGap {
		return configErr("rebalance_gap", "%v; want 0 (every map at once) to %v (flag --rebalance-gap)", c.RebalanceGap, MaxRebalanceGap)
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		return configErr("tls", "cert_file and key_file go together; set both or neither")
	}
	for _, f := range []struct{ field, path string }{{"tls.cert_file", c.TLS.CertFile}, {"tls.key_file", c.TLS.KeyFile}, {"tls.ca_file", c.TLS.CAFile}, {"etcd.tls.cert_file", c.Etcd.TLS.CertFile}, {"etcd.tls.key_file", c.Etcd.TLS.KeyFile}, {"etcd.tls.ca_file", c.Etcd.TLS.CAFile}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			return configErr(f.field, "cannot read %s: %v", f.path, err)
		}
	}
	if len(c.Etcd.Endpoints) == 0 && c.Etcd.DataDir == "" {
		return configErr("etcd", "set data_dir for the embedded etcd, or endpoints for an external one")
	}
	for i, ep := range c.Etcd.Endpoints {
		if !strings.Contains(ep, ":") {
			return configErr(fmt.Sprintf("etcd.endpoints[%d]", i), "%q has no port (for example http://10.0.0.1:2379)", ep)
		}
	}
	loopback := host == "localhost"
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		loopback = true
	}
	noTokens := len(c.Auth.AdminTokens) == 0 && len(c.Auth.MemberTokens) == 0
	switch {
	case c.Auth.Disabled && !loopback && !c.Auth.InsecureAnyAddress:
		return configErr("auth.disabled", "refusing to serve %s without authentication; set auth tokens, listen on loopback, or set auth.insecure_any_address", c.Listen)
	case noTokens && !c.Auth.Disabled && !loopback:
		return configErr("auth", "no tokens for %s; set auth.admin_tokens and auth.member_tokens (or KEYSHARD_ADMIN_TOKENS, KEYSHARD_MEMBER_TOKENS)", c.Listen)
	}
	for i, tok := range append(append([]string{}, c.Auth.AdminTokens...), c.Auth.MemberTokens...) {
		if len(tok) < 16 {
			return configErr("auth", "token %d is %d characters; use at least 16 random characters", i, len(tok))
		}
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return configErr("log_level", "%q; want debug, info, warn or error", c.LogLevel)
	}
	if err := c.Limits.normalize(); err != nil {
		return err
	}
	seen := map[string]bool{}
	for i := range c.Keyspaces {
		k := &c.Keyspaces[i]
		field := fmt.Sprintf("keyspaces[%d]", i)
		if err := k.Normalize(); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrConfig, field, err)
		}
		if seen[k.Name] {
			return configErr(field+".name", "%q is declared twice", k.Name)
		}
		seen[k.Name] = true
	}
	pools := map[string]bool{}
	for i := range c.HotKeyPools {
		p := &c.HotKeyPools[i]
		field := fmt.Sprintf("hotkey_pools[%d]", i)
		if err := p.Normalize(); err != nil {
			return fmt.Errorf("%w: %s.%v", ErrConfig, field, err)
		}
		if pools[p.Name] {
			return configErr(field+".name", "%q is declared twice", p.Name)
		}
		pools[p.Name] = true
	}
	if err := c.validateTenantPools(); err != nil {
		return err
	}
	if c.DebugListen != "" {
		_, port, err := net.SplitHostPort(c.DebugListen)
		if err != nil {
			return configErr("debug_listen", "%q is not host:port: %v (for example 127.0.0.1:7401)", c.DebugListen, err)
		}
		if c.DebugListen == c.Listen && port != "0" {
			return configErr("debug_listen", "%q is the API's listen address; give the profiles a port of their own", c.DebugListen)
		}
	}
	return c.validateAdvertiseURL()
}

// AuthOpen reports whether requests need no token: auth disabled, or no
// tokens configured on a loopback address.
func (c *Config) AuthOpen() bool {
	return c.Auth.Disabled || len(c.Auth.AdminTokens) == 0 && len(c.Auth.MemberTokens) == 0
}

// Normalize fills defaults into k and validates it; the error names the
// field.
func (k *KeyspaceConfig) Normalize() error {
	if err := validName(k.Name); err != nil {
		return fmt.Errorf("name: %w", err)
	}
	if k.Buckets == 0 {
		k.Buckets = placement.DefaultBuckets
	}
	if k.Buckets < placement.MinBuckets || k.Buckets > placement.MaxBuckets {
		return fmt.Errorf("buckets: %d is out of range [%d, %d]", k.Buckets, placement.MinBuckets, placement.MaxBuckets)
	}
	if k.Hash == "" {
		k.Hash = placement.HashXXH64
	}
	if err := k.Hash.Validate(); err != nil {
		return fmt.Errorf("hash: %q is unknown; use %q or %q", string(k.Hash), placement.HashXXH64, placement.HashSynapse)
	}
	switch k.Mode {
	case "":
		k.Mode = "exclusive"
	case "exclusive", "stream":
	default:
		return fmt.Errorf("mode: %q is unknown; use \"exclusive\" or \"stream\"", k.Mode)
	}
	if k.LeaseTTL == 0 {
		k.LeaseTTL = DefaultLeaseTTL
	}
	if k.LeaseTTL < MinLeaseTTL || k.LeaseTTL%time.Second != 0 {
		return fmt.Errorf("lease_ttl: %v; want whole seconds, at least %v (etcd leases count in seconds)", k.LeaseTTL, MinLeaseTTL)
	}
	if k.DrainTimeout == 0 {
		k.DrainTimeout = DefaultDrainTimeout
	}
	if k.DrainTimeout < 0 {
		return fmt.Errorf("drain_timeout: %v; want a positive duration", k.DrainTimeout)
	}
	return nil
}

// Normalize fills defaults into p and validates it. The error starts with
// the field's name ("threshold: 0; want a number > 0"), so that callers
// can prefix where the pool came from.
func (p *HotKeyPoolConfig) Normalize() error {
	if err := validName(p.Name); err != nil {
		return fmt.Errorf("name: %w", err)
	}
	switch {
	case math.IsNaN(p.Threshold) || math.IsInf(p.Threshold, 0):
		return fmt.Errorf("threshold: %v; want a finite number > 0", p.Threshold)
	case p.Threshold <= 0:
		return fmt.Errorf("threshold: %v; want a number > 0", p.Threshold)
	}
	if p.LowThreshold == 0 {
		p.LowThreshold = p.Threshold / 2
	}
	switch {
	case math.IsNaN(p.LowThreshold) || math.IsInf(p.LowThreshold, 0) || p.LowThreshold < 0:
		return fmt.Errorf("low_threshold: %v; want a number in (0, threshold] (0 means threshold/2)", p.LowThreshold)
	case p.LowThreshold > p.Threshold:
		return fmt.Errorf("low_threshold: %v is above the threshold %v; want at most the threshold (0 means threshold/2)", p.LowThreshold, p.Threshold)
	}
	if p.ReportThreshold == 0 {
		p.ReportThreshold = p.Threshold / DefaultReportShare
	}
	switch {
	case math.IsNaN(p.ReportThreshold) || math.IsInf(p.ReportThreshold, 0) || p.ReportThreshold < 0:
		return fmt.Errorf("report_threshold: %v; want a number in (0, threshold] (0 means threshold/%d)", p.ReportThreshold, DefaultReportShare)
	case p.ReportThreshold > p.Threshold:
		return fmt.Errorf("report_threshold: %v is above the threshold %v; want at most the threshold (0 means threshold/%d)", p.ReportThreshold, p.Threshold, DefaultReportShare)
	}
	if p.Cooldown == 0 {
		p.Cooldown = DefaultHotKeyCooldown
	}
	if err := checkPoolDuration("cooldown", p.Cooldown, time.Millisecond, DefaultHotKeyCooldown); err != nil {
		return err
	}
	if p.ReportMaxAge == 0 {
		p.ReportMaxAge = DefaultHotKeyReportMaxAge
	}
	if p.ReportMaxAge > 0 && p.ReportMaxAge < store.MinReportMaxAge {
		return fmt.Errorf("report_max_age: %v; want at least %v (producers report about every second, so a shorter age drops reports that are merely late)", p.ReportMaxAge, store.MinReportMaxAge)
	}
	if err := checkPoolDuration("report_max_age", p.ReportMaxAge, store.MinReportMaxAge, DefaultHotKeyReportMaxAge); err != nil {
		return err
	}
	if p.MaxKeys == 0 {
		p.MaxKeys = DefaultHotKeyMaxKeys
	}
	if p.MaxKeys < 0 || p.MaxKeys > store.MaxOverflowKeys {
		return fmt.Errorf("max_keys: %d; want 1 to %d (0 means %d)", p.MaxKeys, store.MaxOverflowKeys, DefaultHotKeyMaxKeys)
	}
	return nil
}

// checkPoolDuration checks a hot-key pool's duration: whole milliseconds,
// in [least, store.MaxHotPoolDuration].
func checkPoolDuration(field string, d, least, def time.Duration) error {
	switch {
	case d < least:
		return fmt.Errorf("%s: %v; want a positive duration (0 means %v)", field, d, def)
	case d > store.MaxHotPoolDuration:
		return fmt.Errorf("%s: %v; want at most %v", field, d, store.MaxHotPoolDuration)
	case d%time.Millisecond != 0:
		return fmt.Errorf("%s: %v; want whole milliseconds", field, d)
	}
	return nil
}

// validName checks keyspace and member names: 1-128 characters of
// [A-Za-z0-9._:@-].
func validName(s string) error {
	if s == "" {
		return errors.New("empty; use 1-128 characters of A-Z a-z 0-9 . _ : @ -")
	}
	if len(s) > 128 {
		return fmt.Errorf("%d characters; at most 128", len(s))
	}
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', strings.ContainsRune("._:@-", r):
		default:
			return fmt.Errorf("%q has %q at offset %d; use only A-Z a-z 0-9 . _ : @ -", s, r, i)
		}
	}
	return nil
}

func placementHash(s string) placement.HashMode { return placement.HashMode(s) }
