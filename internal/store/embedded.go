package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/keyshard/keyshard/internal/freeport"
)

// Server limits. The embedded etcd is started with them; an external etcd
// must be started with at least --max-txn-ops=1024 (etcd's default is 128)
// and should have --max-request-bytes=8388608 (etcd's default is 1.5 MiB),
// or large grant rounds fail with ErrTooLarge naming the flag.
const (
	DefaultMaxTxnOps       = 1024
	DefaultMaxRequestBytes = 8 << 20
)

// DefaultCompactionRetention is how much history the embedded etcd keeps
// (periodic auto-compaction). Watches that fall further behind resync.
const DefaultCompactionRetention = time.Hour

// EmbeddedConfig configures an etcd server run inside this process.
type EmbeddedConfig struct {
	// Dir is the data directory (required). Starting again from the same
	// Dir keeps every key, lease and revision.
	Dir string
	// Name is this member's name in the etcd cluster. Default "keyshard".
	Name string
	// ClientURL and PeerURL are where the server listens for clients and
	// for other members, such as "http://127.0.0.1:2379". Empty picks a
	// free loopback port.
	ClientURL, PeerURL string
	// InitialCluster lists every member of a new multi-member cluster as
	// etcd's --initial-cluster does ("a=http://127.0.0.1:2380,b=..."); it
	// must include Name=PeerURL. Empty means a cluster of this one member.
	// It is ignored when Dir already holds data.
	InitialCluster string
	// ClusterToken is etcd's --initial-cluster-token. Default
	// "keyshard".
	ClusterToken string
	// Logger receives etcd's warnings and errors. Nil sends only errors to
	// slog.Default(). etcd's info-level chatter is always dropped.
	Logger *slog.Logger
	// CompactionRetention is how much history etcd keeps; zero means
	// DefaultCompactionRetention, negative disables auto-compaction.
	CompactionRetention time.Duration
	// MaxTxnOps and MaxRequestBytes default to DefaultMaxTxnOps and
	// DefaultMaxRequestBytes.
	MaxTxnOps, MaxRequestBytes uint
	// UnsafeNoFsync skips fsync: faster, and loses data on a machine
	// crash. For tests only.
	UnsafeNoFsync bool
	// ElectionTimeout is how long a follower waits without hearing from
	// the leader before it campaigns (etcd's --election-timeout; 0: etcd's
	// default, 1s); heartbeats go every tenth of it. Lower means a lost
	// etcd leader is replaced sooner; see the README on short lease TTLs.
	ElectionTimeout time.Duration
	// ClientTLS, if set, serves clients over TLS (https client URLs) with
	// this certificate; with ClientCA set, clients must present a
	// certificate that CA signed.
	ClientTLS *ClientTLS
}

// ClientTLS is the certificate an embedded etcd serves clients with, and
// the CA its clients' certificates must chain to (empty: no client
// certificates required).
type ClientTLS struct {
	CertFile, KeyFile string
	ClientCA          string
}

// Embedded is a running in-process etcd server. Close stops it.
type Embedded struct {
	etcd      *embed.Etcd
	name      string
	endpoints []string
	peerURL   string

	closing   *atomic.Bool // demotes etcd's shutdown noise
	closeOnce sync.Once
	closed    chan struct{}
}

// StartEmbedded starts an etcd server and waits, bounded by ctx, until it
// is ready to serve (it has a leader; for a multi-member InitialCluster
// that needs a quorum of members started). On error nothing is left
// running. The server runs until Close, independent of ctx.
func StartEmbedded(ctx context.Context, cfg EmbeddedConfig) (*Embedded, error) {
	if cfg.Dir == "" {
		return nil, errors.New("store: start embedded etcd: EmbeddedConfig.Dir is empty")
	}
	pickClient, pickPeer := cfg.ClientURL == "", cfg.PeerURL == ""
	for attempt := 0; ; attempt++ {
		c := cfg
		if pickClient || pickPeer {
			urls, err := freeLoopbackURLs(2)
			if err != nil {
				return nil, fmt.Errorf("store: start embedded etcd: %w", err)
			}
			if pickClient {
				c.ClientURL = urls[0]
				if cfg.ClientTLS != nil {
					c.ClientURL = "https://" + strings.TrimPrefix(c.ClientURL, "http://")
				}
			}
			if pickPeer {
				c.PeerURL = urls[1]
			}
		}
		e, err := startEmbedded(ctx, c)
		// A port picked here may be taken by someone else before etcd binds
		// it; pick again.
		if err != nil && errors.Is(err, syscall.EADDRINUSE) && (pickClient || pickPeer) && attempt < 3 {
			continue
		}
		return e, err
	}
}

func startEmbedded(ctx context.Context, cfg EmbeddedConfig) (*Embedded, error) {
	closing := new(atomic.Bool)
	ec, err := embedConfig(cfg, closing)
	if err != nil {
		return nil, fmt.Errorf("store: start embedded etcd: %w", err)
	}
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("store: start embedded etcd in %s: %w", cfg.Dir, err)
	}
	em := &Embedded{
		etcd:      e,
		name:      ec.Name,
		endpoints: []string{cfg.ClientURL},
		peerURL:   cfg.PeerURL,
		closing:   closing,
		closed:    make(chan struct{}),
	}
	select {
	case <-e.Server.ReadyNotify():
		return em, nil
	case err := <-e.Err():
		em.Close()
		return nil, fmt.Errorf("store: start embedded etcd in %s: %w", cfg.Dir, err)
	case <-e.Server.StopNotify():
		em.Close()
		return nil, fmt.Errorf("store: start embedded etcd in %s: server stopped while starting", cfg.Dir)
	case <-ctx.Done():
		em.Close()
		return nil, fmt.Errorf("store: start embedded etcd in %s: waiting until ready: %w: %w", cfg.Dir, ErrUnavailable, ctx.Err())
	}
}

func embedConfig(cfg EmbeddedConfig, closing *atomic.Bool) (*embed.Config, error) {
	ec := embed.NewConfig()
	ec.Dir = cfg.Dir
	ec.Name = cfg.Name
	if ec.Name == "" {
		ec.Name = "keyshard"
	}
	cu, err := url.Parse(cfg.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("client URL %q: %w", cfg.ClientURL, err)
	}
	pu, err := url.Parse(cfg.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("peer URL %q: %w", cfg.PeerURL, err)
	}
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	if t := cfg.ClientTLS; t != nil {
		ec.ClientTLSInfo = transport.TLSInfo{CertFile: t.CertFile, KeyFile: t.KeyFile, TrustedCAFile: t.ClientCA, ClientCertAuth: t.ClientCA != ""}
	}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	ec.InitialCluster = cfg.InitialCluster
	if ec.InitialCluster == "" {
		ec.InitialCluster = ec.Name + "=" + cfg.PeerURL
	}
	ec.InitialClusterToken = cfg.ClusterToken
	if ec.InitialClusterToken == "" {
		ec.InitialClusterToken = "keyshard"
	}
	ec.MaxTxnOps = cfg.MaxTxnOps
	if ec.MaxTxnOps == 0 {
		ec.MaxTxnOps = DefaultMaxTxnOps
	}
	ec.MaxRequestBytes = cfg.MaxRequestBytes
	if ec.MaxRequestBytes == 0 {
		ec.MaxRequestBytes = DefaultMaxRequestBytes
	}
	switch r := cfg.CompactionRetention; {
	case r == 0:
		ec.AutoCompactionMode = embed.CompactorModePeriodic
		ec.AutoCompactionRetention = DefaultCompactionRetention.String()
	case r > 0:
		ec.AutoCompactionMode = embed.CompactorModePeriodic
		ec.AutoCompactionRetention = r.String()
	default:
		ec.AutoCompactionRetention = "0"
	}
	ec.UnsafeNoFsync = cfg.UnsafeNoFsync
	if d := cfg.ElectionTimeout; d > 0 {
		if d < 100*time.Millisecond {
			return nil, fmt.Errorf("election timeout %v: want at least 100ms", d)
		}
		ec.ElectionMs = uint(d / time.Millisecond)
		ec.TickMs = ec.ElectionMs / 10
	}
	ec.EnableGRPCGateway = false
	ec.Logger = "zap"
	h, min := slog.Default().Handler(), zapcore.ErrorLevel
	if cfg.Logger != nil {
		h, min = cfg.Logger.Handler(), zapcore.WarnLevel
	}
	lg := zapToSlog(h, min, "etcd", closing).With(zap.String("etcd-member", ec.Name))
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	return ec, nil
}

// Endpoints returns the client URLs to pass to Open.
func (e *Embedded) Endpoints() []string { return append([]string(nil), e.endpoints...) }

// Name returns the member's name in its cluster.
func (e *Embedded) Name() string { return e.name }

// PeerURL returns the URL other members reach this one at.
func (e *Embedded) PeerURL() string { return e.peerURL }

// IsLeader reports whether this member currently leads its etcd cluster
// (not to be confused with Keyshard's own leader election).
func (e *Embedded) IsLeader() bool {
	srv := e.etcd.Server
	return srv.MemberID() == srv.Leader()
}

// Err returns a channel that receives a fatal server error, if one
// happens while running.
func (e *Embedded) Err() <-chan error { return e.etcd.Err() }

// Close stops the server and waits until it has stopped and released its
// data directory. It is idempotent and safe to call concurrently; every
// call returns only once the server is down.
func (e *Embedded) Close() {
	e.closeOnce.Do(func() {
		e.closing.Store(true)
		e.etcd.Close()
		close(e.closed)
	})
	<-e.closed
}

// freeLoopbackURLs returns n distinct http://127.0.0.1:<port> URLs whose
// ports were free a moment ago, below the kernel's ephemeral range.
func freeLoopbackURLs(n int) ([]string, error) {
	addrs, err := freeport.Addrs(n)
	if err != nil {
		return nil, err
	}
	urls := make([]string, n)
	for i, a := range addrs {
		urls[i] = "http://" + a
	}
	return urls, nil
}
