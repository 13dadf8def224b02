package store

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"
	"go.uber.org/zap/zapcore"
)

// Config says how to reach etcd.
type Config struct {
	// Endpoints are etcd client URLs (Embedded.Endpoints for the embedded
	// server). Required.
	Endpoints []string
	// TLS, if set, is used for every connection.
	TLS *tls.Config
	// Username and Password enable etcd authentication.
	Username, Password string
	// DialTimeout bounds the first connection in Open. Default 5 s.
	DialTimeout time.Duration
	// MaxTxnOps is the largest number of operations this store puts in one
	// transaction level; it must not exceed the server's --max-txn-ops.
	// Default DefaultMaxTxnOps.
	MaxTxnOps int
	// MaxRequestBytes is the largest request the client sends; it should
	// not exceed the server's --max-request-bytes. Default
	// DefaultMaxRequestBytes.
	MaxRequestBytes int
	// Logger receives the client's warnings and errors, and the store's
	// own (watch resyncs, for example). Nil discards them.
	Logger *slog.Logger
	// Namespace, if set, puts every key, watch and lease of this store
	// under that prefix (etcd's namespace client): a Store that must not
	// meet a Keyshard on the same etcd, such as `keyshard bench control`'s
	// measure of etcd's own floor, runs the same code on keys the server
	// never reads. A replica leaves it empty.
	Namespace string
}

// Store is a connection to etcd with Keyshard's schema on top. It is safe
// for concurrent use. Close releases it; sessions, watches and elections
// made from it stop working after Close.
type Store struct {
	client *clientv3.Client
	log    *slog.Logger
	maxOps int

	renewer     *renewer      // KeepAliveOnce's shared stream
	terms       *termReads    // KeepAliveOnce's shared confirming reads
	renewals    renewals      // RenewMember's batches
	renewWindow time.Duration // RenewBatchWindow; 0 in tests that make batches themselves
	renewCheck  RenewCheck    // SetRenewCheck's; nil: checks go to etcd

	closeOnce sync.Once
	closeErr  error
	checker   sync.WaitGroup // checkEndpoints, exited before Close returns
}

// The client's gRPC keep-alive. While a call or stream is open on a
// connection that has been silent for clientKeepAliveTime, the client
// pings it and drops it if no answer comes within clientKeepAliveTimeout.
//
// etcd enforces a policy on these pings, embedded or not: at most one
// every --grpc-keepalive-min-time (5s by default), and none on a
// connection without a call open (PermitWithoutStream is false, fixed in
// etcd's code), where every ping less than two hours after the last one
// counts. At the third ping too many etcd closes the connection with a
// GOAWAY "too_many_pings", which gRPC logs as an error. So the client
// never pings without a call open, and pings less often than the
// default minimum. An idle connection costs no ping: a dead endpoint is
// found by the call that next opens a stream on it (a keep-alive check
// within clientKeepAliveTime+clientKeepAliveTimeout), and, with several
// endpoints, by checkEndpoints within about a second.
const (
	clientKeepAliveTime      = 10 * time.Second // gRPC's floor; above etcd's 5s
	clientKeepAliveTimeout   = 5 * time.Second
	clientPingsWithoutStream = false
)

// Open connects to etcd. It waits, bounded by ctx and cfg.DialTimeout, for
// one endpoint to answer, and returns an error wrapping ErrUnavailable if
// none does.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("store: open: Config.Endpoints is empty")
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.MaxTxnOps <= 0 {
		cfg.MaxTxnOps = DefaultMaxTxnOps
	}
	if cfg.MaxTxnOps < 2 {
		return nil, fmt.Errorf("store: open: Config.MaxTxnOps %d is below 2", cfg.MaxTxnOps)
	}
	if cfg.MaxRequestBytes <= 0 {
		cfg.MaxRequestBytes = DefaultMaxRequestBytes
	}
	log := cfg.Logger
	var h slog.Handler
	if log != nil {
		h = log.Handler()
	} else {
		log = slog.New(slog.DiscardHandler)
	}
	c, err := clientv3.New(clientConfig(cfg, h))
	if err != nil {
		return nil, etcdErr("store: open", err)
	}
	if cfg.Namespace != "" {
		c.KV = namespace.NewKV(c.KV, cfg.Namespace)
		c.Watcher = namespace.NewWatcher(c.Watcher, cfg.Namespace)
		c.Lease = namespace.NewLease(c.Lease, cfg.Namespace)
	}
	s := &Store{client: c, log: log, maxOps: cfg.MaxTxnOps}
	s.renewer = newRenewer(s)
	s.terms = &termReads{read: s.confirmingTerm, base: c.Ctx()}
	s.renewWindow = RenewBatchWindow
	// clientv3.New does not wait for a connection; check that etcd answers
	// so that a bad endpoint fails here, clearly.
	sctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	if _, err := c.Get(sctx, Prefix+"keyspaces/", clientv3.WithCountOnly(), clientv3.WithPrefix()); err != nil {
		c.Close()
		return nil, etcdErr(fmt.Sprintf("store: open %v", cfg.Endpoints), err)
	}
	if len(cfg.Endpoints) > 1 {
		s.checker.Go(func() { s.checkEndpoints(cfg.Endpoints) }) // exits when the client is closed
	}
	return s, nil
}

// clientConfig is the etcd client's configuration for cfg, logging to h
// (nil: nowhere).
func clientConfig(cfg Config, h slog.Handler) clientv3.Config {
	return clientv3.Config{
		Endpoints:   cfg.Endpoints,
		TLS:         cfg.TLS,
		Username:    cfg.Username,
		Password:    cfg.Password,
		DialTimeout: cfg.DialTimeout,
		// gRPC framing adds a little to each request; let the server be the
		// one to refuse, with an error that names its flag.
		MaxCallSendMsgSize: cfg.MaxRequestBytes + 64<<10,
		Logger:             zapToSlog(h, zapcore.WarnLevel, "etcd-client", nil),
		// Check connections with a call open, within etcd's keep-alive
		// policy (see clientKeepAliveTime).
		DialKeepAliveTime:    clientKeepAliveTime,
		DialKeepAliveTimeout: clientKeepAliveTimeout,
		PermitWithoutStream:  clientPingsWithoutStream,
	}
}

// Close closes the connection. It is idempotent. Leases are not revoked:
// close sessions first if their keys should vanish at once.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closeErr = s.client.Close()
		s.checker.Wait()
	})
	return s.closeErr
}

// closed reports whether Close has been called.
func (s *Store) closed() bool { return s.client.Ctx().Err() != nil }

// errClosed is what calls on a closed Store return, at once: clientv3
// would otherwise retry against its closed connection for seconds.
func errClosed(op string) error { return fmt.Errorf("store: %s: %w", op, ErrClosed) }

// err translates err from etcd; after Close it reports ErrClosed.
func (s *Store) err(op string, err error) error {
	if err == nil {
		return nil
	}
	if s.closed() {
		return fmt.Errorf("store: %s: %w", op, ErrClosed)
	}
	return etcdErr("store: "+op, err)
}

// Rev returns etcd's current revision.
func (s *Store) Rev(ctx context.Context) (int64, error) {
	if s.closed() {
		return 0, errClosed("current revision")
	}
	resp, err := s.client.Get(ctx, Prefix+"keyspaces/", clientv3.WithCountOnly(), clientv3.WithPrefix())
	if err != nil {
		return 0, s.err("current revision", err)
	}
	return resp.Header.Revision, nil
}

// Compact compacts etcd's history up to rev: watches that start at or
// before rev resync. For tests and operators; the embedded server also
// compacts periodically on its own.
func (s *Store) Compact(ctx context.Context, rev int64) error {
	if s.closed() {
		return errClosed("compact")
	}
	_, err := s.client.Compact(ctx, rev, clientv3.WithCompactPhysical())
	return s.err(fmt.Sprintf("compact at %d", rev), err)
}
