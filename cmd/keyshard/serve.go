package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/keyshard/keyshard/internal/server"
)

func newServe() *cobra.Command {
	var (
		configFile string
		f          server.Config
		adminToks  []string
		memberToks []string
		endpoints  []string
		limits     = make([]int, len(server.LimitSettings))
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the Keyshard control plane (API, balancer, embedded etcd)",
		Long: `Run one Keyshard replica: the API (gRPC and HTTP/JSON on one port, with
/healthz, /readyz and /metrics), the watch that serves maps and grants, and
the election that runs the balancer on one replica.

State lives in an embedded etcd in --data-dir unless --etcd-endpoints names an
external etcd cluster. Settings come from flags, then KEYSHARD_* environment
variables, then --config (YAML), then defaults.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := server.DefaultConfig()
			if configFile != "" {
				if err := cfg.LoadFile(configFile); err != nil {
					return err
				}
			}
			cfg.FromEnv(os.LookupEnv)
			fl := cmd.Flags()
			if fl.Changed("listen") {
				cfg.Listen = f.Listen
			}
			if fl.Changed("replica") {
				cfg.Replica = f.Replica
			}
			if fl.Changed("advertise-url") {
				cfg.AdvertiseURL = f.AdvertiseURL
			}
			if fl.Changed("debug-listen") {
				cfg.DebugListen = f.DebugListen
			}
			if fl.Changed("election-ttl") {
				cfg.ElectionTTL = f.ElectionTTL
			}
			if fl.Changed("rebalance-gap") {
				cfg.RebalanceGap = f.RebalanceGap
			}
			if fl.Changed("data-dir") {
				cfg.Etcd.DataDir = f.Etcd.DataDir
			}
			if fl.Changed("etcd-endpoints") {
				cfg.Etcd.Endpoints = endpoints
			}
			if fl.Changed("etcd-cert") {
				cfg.Etcd.TLS.CertFile = f.Etcd.TLS.CertFile
			}
			if fl.Changed("etcd-key") {
				cfg.Etcd.TLS.KeyFile = f.Etcd.TLS.KeyFile
			}
			if fl.Changed("etcd-ca") {
				cfg.Etcd.TLS.CAFile = f.Etcd.TLS.CAFile
			}
			if fl.Changed("tls-cert") {
				cfg.TLS.CertFile = f.TLS.CertFile
			}
			if fl.Changed("tls-key") {
				cfg.TLS.KeyFile = f.TLS.KeyFile
			}
			if fl.Changed("admin-token") {
				cfg.Auth.AdminTokens = adminToks
			}
			if fl.Changed("member-token") {
				cfg.Auth.MemberTokens = memberToks
			}
			if fl.Changed("log-level") {
				cfg.LogLevel = f.LogLevel
			}
			for i, l := range server.LimitSettings {
				if fl.Changed(l.Flag) {
					*l.Field(&cfg.Limits) = limits[i]
				}
			}
			log := newLogger(cmd, cfg.LogLevel)
			slog.SetDefault(log)
			srv, err := server.New(cfg, server.Options{Logger: log})
			if err != nil {
				return err
			}
			return srv.Run(cmd.Context())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&configFile, "config", "", "YAML config file (see README: Configuration)")
	fl.StringVar(&f.Listen, "listen", server.DefaultListen, "API address (host:port)")
	fl.StringVar(&f.Replica, "replica", "", "name of this replica (default hostname-pid)")
	fl.StringVar(&f.AdvertiseURL, "advertise-url", "", "URL other replicas reach this one's API at, to forward tenant-pool calls to the leader (default http(s)://<listen address>, the host name when listening on every address)")
	fl.StringVar(&f.DebugListen, "debug-listen", "", "address of a second listener serving Go's profiles (/debug/pprof) without a token, e.g. 127.0.0.1:7401 (empty: none; keep it private)")
	fl.DurationVar(&f.ElectionTTL, "election-ttl", server.DefaultElectionTTL, "lease of the leader election: a crashed leader is replaced after about this long (whole seconds, 2s-1m; at most the smallest lease_ttl)")
	fl.DurationVar(&f.RebalanceGap, "rebalance-gap", server.DefaultRebalanceGap, "least time between two maps that only move buckets onto joining members: joins within it become one epoch (0: every map at once; at most 10s)")
	fl.StringVar(&f.Etcd.DataDir, "data-dir", "keyshard-data", "embedded etcd data directory")
	fl.StringSliceVar(&endpoints, "etcd-endpoints", nil, "external etcd endpoints (comma-separated); empty runs an embedded etcd")
	fl.StringVar(&f.Etcd.TLS.CertFile, "etcd-cert", "", "client certificate for the external etcd")
	fl.StringVar(&f.Etcd.TLS.KeyFile, "etcd-key", "", "client key for the external etcd")
	fl.StringVar(&f.Etcd.TLS.CAFile, "etcd-ca", "", "CA that signed the external etcd's certificates")
	fl.StringVar(&f.TLS.CertFile, "tls-cert", "", "certificate for the API port")
	fl.StringVar(&f.TLS.KeyFile, "tls-key", "", "key for the API port")
	fl.StringSliceVar(&adminToks, "admin-token", nil, "bearer token(s) of the admin role (prefer KEYSHARD_ADMIN_TOKENS)")
	fl.StringSliceVar(&memberToks, "member-token", nil, "bearer token(s) of the member role (prefer KEYSHARD_MEMBER_TOKENS)")
	fl.StringVar(&f.LogLevel, "log-level", "info", "debug, info, warn or error")
	for i, l := range server.LimitSettings {
		fl.IntVar(&limits[i], l.Flag, l.Default, l.Help+" ("+l.Key+")")
	}
	return cmd
}

// newLogger logs text to stderr at level (already validated by Config).
func newLogger(cmd *cobra.Command, level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "keyshard: log level %q: %v; using info\n", level, err)
	}
	return slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: l}))
}
