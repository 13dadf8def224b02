package keyshardtest

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/clock"
	"github.com/keyshard/keyshard/internal/kitseam"
	"github.com/keyshard/keyshard/internal/server"
)

// Options configure a Server. The zero value is a server with no
// keyspace, no hot-key pool and no tokens (on loopback it then accepts
// every call), on the real clock, with keyshard serve's election TTL,
// logging nowhere unless KEYSHARD_TEST_LOG is set in the environment.
type Options struct {
	// Keyspaces are created at start if they do not exist yet, as
	// keyshard serve's config file creates them. Zero fields take the
	// server's defaults: 4096 buckets, xxh64, exclusive, a 10 s lease and
	// a 30 s drain timeout. A keyspace that exists (after a Restart) must
	// have the same bucket count and hash.
	Keyspaces []client.KeyspaceConfig
	// HotKeyPools are created at start if they do not exist yet; an
	// existing pool keeps its stored settings. Threshold is required.
	HotKeyPools []client.HotKeyPool
	// AdminToken and MemberToken, if either is set, turn authentication
	// on: admin calls need AdminToken, member calls MemberToken, map and
	// hot-key calls either. At least 16 characters each. Server.Client and
	// Server.WaitEpoch use AdminToken.
	AdminToken  string
	MemberToken string
	// Clock is the server's time: leases, drain timeouts, the leader's
	// hot-key rounds. A *FakeClock moves them only when the test advances
	// it. Default: the real clock.
	Clock clock.Clock
	// Logger receives the server's logs. Default: discarded, or text on
	// stderr when KEYSHARD_TEST_LOG is set, to debug a failing test.
	Logger *slog.Logger
	// ElectionTTL is the lease of the replica's leadership: after a
	// leader replica is killed, another takes over about this much later
	// (a stopped one hands over at once). Whole seconds from 2 s to 1
	// min; default 5 s.
	ElectionTTL time.Duration
	// Internal is for Keyshard's own tests, benchmarks and demo, which
	// need more of the server's configuration (see internal/kitseam).
	// Code outside Keyshard's module cannot name its type; leave it nil.
	Internal *kitseam.Options
}

// minTokenLen is keyshard serve's shortest accepted token.
const minTokenLen = 16

// config checks o and returns the configuration of a replica named
// replica on etcd, and its logger. Errors name the field of Options at
// fault.
func (o Options) config(replica string, etcd server.EtcdConfig) (server.Config, *slog.Logger, error) {
	cfg := server.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Replica = replica
	cfg.Etcd = etcd
	for _, tok := range []struct{ field, token string }{{"AdminToken", o.AdminToken}, {"MemberToken", o.MemberToken}} {
		if tok.token != "" && len(tok.token) < minTokenLen {
			return cfg, nil, optionErr(tok.field, "%d characters; use at least %d", len(tok.token), minTokenLen)
		}
	}
	if o.AdminToken != "" {
		cfg.Auth.AdminTokens = []string{o.AdminToken}
	}
	if o.MemberToken != "" {
		cfg.Auth.MemberTokens = []string{o.MemberToken}
	}
	if o.ElectionTTL != 0 {
		if o.ElectionTTL < server.MinElectionTTL || o.ElectionTTL > server.MaxElectionTTL || o.ElectionTTL%time.Second != 0 {
			return cfg, nil, optionErr("ElectionTTL", "%v; want whole seconds from %v to %v", o.ElectionTTL, server.MinElectionTTL, server.MaxElectionTTL)
		}
		cfg.ElectionTTL = o.ElectionTTL
	}
	seen := map[string]bool{}
	for i, k := range o.Keyspaces {
		sk := server.KeyspaceConfig{Name: k.Name, Buckets: k.Buckets, Hash: k.Hash, Mode: k.Mode, LeaseTTL: k.LeaseTTL, DrainTimeout: k.DrainTimeout}
		bad := sk.Normalize() // fills defaults
		if err := named(fmt.Sprintf("Keyspaces[%d]", i), bad, sk.Name, seen); err != nil {
			return cfg, nil, err
		}
		cfg.Keyspaces = append(cfg.Keyspaces, sk)
	}
	seen = map[string]bool{}
	for i, p := range o.HotKeyPools {
		sp := server.HotKeyPoolConfig{Name: p.Name, Threshold: p.Threshold, LowThreshold: p.LowThreshold, Cooldown: p.Cooldown,
			ReportThreshold: p.ReportThreshold, ReportMaxAge: p.ReportMaxAge, MaxKeys: p.MaxKeys}
		bad := sp.Normalize() // fills defaults
		if err := named(fmt.Sprintf("HotKeyPools[%d]", i), bad, sp.Name, seen); err != nil {
			return cfg, nil, err
		}
		cfg.HotKeyPools = append(cfg.HotKeyPools, sp)
	}
	if o.Internal != nil && o.Internal.Config != nil {
		o.Internal.Config(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, nil, fmt.Errorf("keyshardtest: %w", err)
	}
	return cfg, o.logger().With("replica", cfg.Replica), nil
}

// logger returns Logger, or its default.
func (o Options) logger() *slog.Logger {
	if o.Logger != nil {
		return o.Logger
	}
	var out io.Writer = io.Discard
	if os.Getenv("KEYSHARD_TEST_LOG") != "" {
		out = os.Stderr
	}
	return slog.New(slog.NewTextHandler(out, nil))
}

// named checks the element at field of a list of named things: the error
// of its Normalize, and that its name is new to seen.
func named(field string, normalized error, name string, seen map[string]bool) error {
	if normalized != nil {
		return fieldErr(field, normalized)
	}
	if seen[name] {
		return optionErr(field+".Name", "%q is there twice", name)
	}
	seen[name] = true
	return nil
}

func optionErr(field, format string, args ...any) error {
	return fmt.Errorf("keyshardtest: Options.%s: %s", field, fmt.Sprintf(format, args...))
}

// goFields names the fields of client.KeyspaceConfig and
// client.HotKeyPool by the names keyshard serve's config file gives them,
// which start the server's validation errors.
var goFields = map[string]string{
	"name": "Name", "buckets": "Buckets", "hash": "Hash", "mode": "Mode", "lease_ttl": "LeaseTTL", "drain_timeout": "DrainTimeout",
	"threshold": "Threshold", "low_threshold": "LowThreshold", "cooldown": "Cooldown", "report_threshold": "ReportThreshold",
	"report_max_age": "ReportMaxAge", "max_keys": "MaxKeys",
}

// fieldErr turns the server's "lease_ttl: 500ms; ..." about the element
// at field into "Options.Keyspaces[0].LeaseTTL: 500ms; ...".
func fieldErr(field string, err error) error {
	name, rest, ok := strings.Cut(err.Error(), ": ")
	if goName, known := goFields[name]; ok && known {
		return optionErr(field+"."+goName, "%s", rest)
	}
	return optionErr(field, "%v", err)
}
