package server

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestConfigFile(t *testing.T) {
	c := loadValid(t, `
listen: 127.0.0.1:7411
etcd:
  data_dir: /tmp/ks
keyspaces:
  - name: rooms
    buckets: 1024
    lease_ttl: 5s
  - name: senders
    hash: synapse-sha256
`)
	if c.ElectionTTL != DefaultElectionTTL {
		t.Fatalf("election_ttl %v, want the default %v", c.ElectionTTL, DefaultElectionTTL)
	}
	if c.RebalanceGap != DefaultRebalanceGap {
		t.Fatalf("rebalance_gap %v, want the default %v", c.RebalanceGap, DefaultRebalanceGap)
	}
	if c.Listen != "127.0.0.1:7411" || len(c.Keyspaces) != 2 {
		t.Fatalf("config %+v", c)
	}
	k := c.Keyspaces[0]
	if k.Buckets != 1024 || k.LeaseTTL != 5*time.Second || k.DrainTimeout != DefaultDrainTimeout || k.Mode != "exclusive" || k.Hash != "xxh64" {
		t.Fatalf("keyspace defaults: %+v", k)
	}
	if c.Keyspaces[1].Buckets != 4096 {
		t.Fatalf("default buckets: %+v", c.Keyspaces[1])
	}
}

func TestConfigHotKeyPools(t *testing.T) {
	c := loadValid(t, `
hotkey_pools:
  - name: ingest
    threshold: 6400
  - name: api
    threshold: 100
    low_threshold: 80
    cooldown: 1m
    report_threshold: 5
    report_max_age: 10s
    max_keys: 2048
`)
	want := []HotKeyPoolConfig{
		{Name: "ingest", Threshold: 6400, LowThreshold: 3200, Cooldown: 30 * time.Second, ReportThreshold: 100, ReportMaxAge: 30 * time.Second, MaxKeys: 1024},
		{Name: "api", Threshold: 100, LowThreshold: 80, Cooldown: time.Minute, ReportThreshold: 5, ReportMaxAge: 10 * time.Second, MaxKeys: 2048},
	}
	if len(c.HotKeyPools) != 2 || c.HotKeyPools[0] != want[0] || c.HotKeyPools[1] != want[1] {
		t.Fatalf("pools %+v\nwant  %+v", c.HotKeyPools, want)
	}
	for _, p := range c.HotKeyPools {
		if err := p.store().Validate(); err != nil {
			t.Errorf("normalized pool %q does not store: %v", p.Name, err)
		}
	}
}

func TestConfigTenantPools(t *testing.T) {
	c := loadValid(t, `
advertise_url: http://10.0.0.5:7400
tenant_pools:
  - name: index-gateways
    lease_ttl: 15s
    policy:
      capacity_per_member: 50
      headroom: 1.25
      max_size: 12
      shrink_cooldown: 15m
      lookback: 5m
      warm_up: 2m
      zone_aware: true
      window: 2m
      overrides:
        big-customer: {size: 8}
`)
	if len(c.TenantPools) != 1 || c.AdvertiseURL != "http://10.0.0.5:7400" {
		t.Fatalf("config %+v", c)
	}
	p, err := c.TenantPools[0].Normalize()
	if err != nil {
		t.Fatal(err)
	}
	if p.LeaseTTL != 15*time.Second || p.Window != 2*time.Minute || p.Policy.MinSize != 1 || p.Policy.Tolerance != 0.1 ||
		p.Policy.Headroom != 1.25 || p.Policy.Overrides["big-customer"].Size != 8 || !p.Policy.ZoneAware {
		t.Fatalf("pool %+v", p)
	}
}

func TestConfigEnvOverridesFile(t *testing.T) {
	c := DefaultConfig()
	env := map[string]string{"KEYSHARD_LISTEN": "0.0.0.0:9000", "KEYSHARD_ADMIN_TOKENS": "aaaaaaaaaaaaaaaa, bbbbbbbbbbbbbbbb", "KEYSHARD_ETCD_ENDPOINTS": "http://e1:2379,http://e2:2379"}
	c.FromEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Listen != "0.0.0.0:9000" || len(c.Auth.AdminTokens) != 2 || len(c.Etcd.Endpoints) != 2 {
		t.Fatalf("%+v", c)
	}
}

func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		yaml string
		mod  func(*Config)
		want string
	}{
		{"unknown field", "listn: 1.2.3.4:5\n", nil, "field listn not found"},
		{"bad listen", "", func(c *Config) { c.Listen = "7400" }, `listen: "7400" is not host:port`},
		{"no auth on public address", "", func(c *Config) { c.Listen = "0.0.0.0:7400" }, "auth: no tokens for 0.0.0.0:7400"},
		{"disabled auth on public address", "", func(c *Config) { c.Listen = "0.0.0.0:7400"; c.Auth.Disabled = true }, "auth.disabled: refusing"},
		{"short token", "", func(c *Config) { c.Auth.AdminTokens = []string{"secret"} }, "token 0 is 6 characters"},
		{"half tls", "", func(c *Config) { c.TLS.CertFile = "x.pem" }, "tls: cert_file and key_file go together"},
		{"missing cert", "", func(c *Config) { c.TLS.CertFile, c.TLS.KeyFile = "/nope.pem", "/nope.key" }, "tls.cert_file: cannot read /nope.pem"},
		{"no store", "", func(c *Config) { c.Etcd.DataDir = "" }, "etcd: set data_dir"},
		{"endpoint without port", "", func(c *Config) { c.Etcd.Endpoints = []string{"etcd1"} }, `etcd.endpoints[0]: "etcd1" has no port`},
		{"log level", "", func(c *Config) { c.LogLevel = "loud" }, `log_level: "loud"`},
		{"election ttl too short", "election_ttl: 1s\n", nil, "election_ttl: 1s; want whole seconds from 2s to 1m0s (flag --election-ttl"},
		{"election ttl too long", "election_ttl: 2m\n", nil, "election_ttl: 2m0s; want whole seconds from 2s to 1m0s"},
		{"rebalance gap negative", "rebalance_gap: -1s\n", nil, "rebalance_gap: -1s; want 0 (every map at once) to 10s (flag --rebalance-gap)"},
		{"rebalance gap too long", "rebalance_gap: 11s\n", nil, "rebalance_gap: 11s; want 0"},
		{"election ttl fraction", "", func(c *Config) { c.ElectionTTL = 2500 * time.Millisecond }, "election_ttl: 2.5s; want whole seconds"},
		{"keyspace name", "keyspaces:\n  - name: 'bad name'\n", nil, `keyspaces[0]: name: "bad name" has ' '`},
		{"tenant pool capacity", "tenant_pools:\n  - name: gw\n", nil, "tenant_pools[0].policy.capacity_per_member: 0; want a finite number > 0"},
		{"tenant pool window", "tenant_pools:\n  - name: gw\n    policy:\n      capacity_per_member: 10\n      window: 1s\n", nil, "tenant_pools[0].policy.window: 1s; want at least 2s"},
		{"tenant pool cooldown", "tenant_pools:\n  - name: gw\n    policy:\n      capacity_per_member: 10\n      shrink_cooldown: 30s\n", nil, "tenant_pools[0].policy.shrink_cooldown: 30s is shorter than the window 1m0s"},
		{"tenant pool override", "tenant_pools:\n  - name: gw\n    policy:\n      capacity_per_member: 10\n      overrides:\n        t1: {size: 2, max_size: 3}\n", nil, `tenant_pools[0].policy.overrides["t1"].size`},
		{"tenant pool twice", "tenant_pools:\n  - name: gw\n    policy: {capacity_per_member: 1}\n  - name: gw\n    policy: {capacity_per_member: 2}\n", nil, `tenant_pools[1].name: "gw" is declared twice`},
		{"tenant pool lease", "tenant_pools:\n  - name: gw\n    policy: {capacity_per_member: 1}\n    lease_ttl: 1s\n", nil, "tenant_pools[0].lease_ttl: 1s"},
		{"advertise url scheme", "advertise_url: ftp://x:1\n", nil, `advertise_url: "ftp://x:1": scheme "ftp"`},
		{"advertise url host", "advertise_url: 'http://'\n", nil, "advertise_url: \"http://\" has no host"},
		{"keyspace buckets", "keyspaces:\n  - name: a\n    buckets: 70000\n", nil, "keyspaces[0]: buckets: 70000 is out of range"},
		{"keyspace hash", "keyspaces:\n  - name: a\n    hash: md5\n", nil, `keyspaces[0]: hash: "md5" is unknown`},
		{"keyspace ttl", "keyspaces:\n  - name: a\n    lease_ttl: 1500ms\n", nil, "keyspaces[0]: lease_ttl: 1.5s; want whole seconds"},
		{"keyspace mode", "keyspaces:\n  - name: a\n    mode: shared\n", nil, `keyspaces[0]: mode: "shared" is unknown`},
		{"duplicate keyspace", "keyspaces:\n  - name: a\n  - name: a\n", nil, `keyspaces[1].name: "a" is declared twice`},
		{"bad duration", "keyspaces:\n  - name: a\n    lease_ttl: soon\n", nil, "soon"},
		{"pool name", "hotkey_pools:\n  - name: 'a b'\n    threshold: 1\n", nil, `hotkey_pools[0].name: "a b" has ' '`},
		{"pool threshold", "hotkey_pools:\n  - name: a\n    threshold: 1\n  - name: b\n", nil, "hotkey_pools[1].threshold: 0; want a number > 0"},
		{"pool low threshold", "hotkey_pools:\n  - name: a\n    threshold: 10\n    low_threshold: 20\n", nil, "hotkey_pools[0].low_threshold: 20 is above the threshold 10"},
		{"pool report threshold", "hotkey_pools:\n  - name: a\n    threshold: 10\n    report_threshold: -1\n", nil, "hotkey_pools[0].report_threshold: -1"},
		{"pool cooldown", "hotkey_pools:\n  - name: a\n    threshold: 10\n    cooldown: -5s\n", nil, "hotkey_pools[0].cooldown: -5s; want a positive duration"},
		{"pool report max age", "hotkey_pools:\n  - name: a\n    threshold: 10\n    report_max_age: 1s\n", nil, "hotkey_pools[0].report_max_age: 1s; want at least 2s"},
		{"pool max keys", "hotkey_pools:\n  - name: a\n    threshold: 10\n    max_keys: 5000\n", nil, "hotkey_pools[0].max_keys: 5000; want 1 to 2048"},
		{"pool unknown field", "hotkey_pools:\n  - name: a\n    treshold: 10\n", nil, "field treshold not found"},
		{"duplicate pool", "hotkey_pools:\n  - {name: a, threshold: 1}\n  - {name: a, threshold: 2}\n", nil, `hotkey_pools[1].name: "a" is declared twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			var err error
			if tc.yaml != "" {
				path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".yaml")
				os.WriteFile(path, []byte(tc.yaml), 0o644)
				err = c.LoadFile(path)
			}
			if err == nil && tc.mod != nil {
				tc.mod(&c)
			}
			if err == nil {
				err = c.Validate()
			}
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrConfig mentioning %q", err, tc.want)
			}
		})
	}
}

// TestConfigLimits: limits come from the file under limits:, zero means
// the default, and a bad value is refused naming its key.
func TestConfigLimits(t *testing.T) {
	c := loadValid(t, `
limits:
  max_request_bytes: 1048576
  max_long_polls: 0
`)
	want := Limits{MaxRequestBytes: 1 << 20, MaxReportBytes: 8 << 20, MaxLookupKeys: 10000, MaxLookupKeyBytes: 1024, MaxLongPolls: 2048}
	if c.Limits != want {
		t.Fatalf("limits %+v, want %+v", c.Limits, want)
	}
	for _, tc := range []struct {
		set  func(*Limits)
		want string
	}{
		{func(l *Limits) { l.MaxLongPolls = -1 }, "limits.max_long_polls: -1; want 1 to"},
		{func(l *Limits) { l.MaxRequestBytes = 2 << 30 }, "limits.max_request_bytes: 2147483648; want 1 to 1073741824 (0 means 4194304)"},
		{func(l *Limits) { l.MaxLookupKeyBytes = -5 }, "limits.max_lookup_key_bytes"},
	} {
		c := DefaultConfig()
		tc.set(&c.Limits)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want one containing %q", err, tc.want)
		}
	}
}

// loadValid loads the YAML text onto DefaultConfig and validates it.
func loadValid(t *testing.T, text string) Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keyshard.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	if err := c.LoadFile(path); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return c
}
