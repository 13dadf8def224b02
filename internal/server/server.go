package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/clock"
	"github.com/keyshard/keyshard/internal/dashboard"
	"github.com/keyshard/keyshard/internal/grpcbridge"
	"github.com/keyshard/keyshard/internal/store"
)

// Server is one `keyshard serve` replica: the API on one port, a watch
// that keeps its view of the store current, and a campaign for leadership
// that runs the coordinator while elected.
type Server struct {
	cfg     Config
	log     *slog.Logger
	clock   clock.Clock
	reg     *prometheus.Registry
	metrics *metrics
	auth    *authenticator
	polls   *longPolls
	// sessionHub wakes Session streams when their keyspace changes.
	sessionHub sessionHub
	view       *view
	onTerm     func()          // Options.OnHotKeyTerm; never nil
	onRound    func(time.Time) // Options.OnHotKeyRound; never nil
	seams      seams           // nil fields: the store's
	reach      reachability    // whether etcd answers this replica's probe
	commits    commits         // Commit calls queued behind their session's write

	// copyCheckOffUntil: checkRenewals leaves batches to etcd until then
	// (unix nanoseconds), after its view missed a revision in time.
	copyCheckOffUntil atomic.Int64

	// Tenant pools.
	tpState
	tpLeader  atomic.Pointer[tpLeader] // set while this replica's loop leads
	onTPTerm  func()                   // Options.OnTenantPoolTerm; never nil
	onTPRound func(time.Time)          // Options.OnTenantPoolRound; never nil
	forward   *forwarder

	// Set by Run.
	store    *store.Store
	sessions sessions

	ready     chan struct{} // closed once the API listens and the view is synced
	addr      string        // the bound API address, valid after ready
	debugAddr string        // the bound profiles address (debug_listen), valid after ready
	addrOnce  sync.Once
}

// Options are the parts of a server that are not configuration: where it
// logs, what time it reads, and whom it tells of its hot-key rounds. Zero
// values mean slog.Default, the real clock and nobody.
type Options struct {
	Logger *slog.Logger
	Clock  clock.Clock
	// OnHotKeyTerm is called when this replica, as leader, has started its
	// hot-key aggregation in a new term: its ticker is set, so advancing
	// Clock by a second runs a round. OnHotKeyRound is called after every
	// round, with the Clock time the round began. Both are called from
	// the aggregation goroutine and must return at once; keyshardtest
	// waits on them so that tests driving a fake clock need not sleep.
	OnHotKeyTerm  func()
	OnHotKeyRound func(at time.Time)
	// OnTenantPoolTerm and OnTenantPoolRound are the same for the
	// leader's tenant-pool rounds (one round covers every pool).
	OnTenantPoolTerm  func()
	OnTenantPoolRound func(at time.Time)
}

// New validates cfg and returns a server that has started nothing.
func New(cfg Config, opts Options) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := newMetrics(reg)
	if opts.OnHotKeyTerm == nil {
		opts.OnHotKeyTerm = func() {}
	}
	if opts.OnHotKeyRound == nil {
		opts.OnHotKeyRound = func(time.Time) {}
	}
	if opts.OnTenantPoolTerm == nil {
		opts.OnTenantPoolTerm = func() {}
	}
	if opts.OnTenantPoolRound == nil {
		opts.OnTenantPoolRound = func(time.Time) {}
	}
	fwd, err := newForwarder(cfg)
	if err != nil {
		return nil, err
	}
	s := &Server{
		onTPTerm:  opts.OnTenantPoolTerm,
		onTPRound: opts.OnTenantPoolRound,
		forward:   fwd,
		tpState:   tpState{tpWrites: map[string]TenantPoolWrite{}},
		cfg:       cfg,
		log:       log,
		clock:     clock.Or(opts.Clock),
		reg:       reg,
		metrics:   m,
		auth:      newAuthenticator(cfg.Auth, cfg.AuthOpen(), reg),
		polls:     &longPolls{most: int64(cfg.Limits.MaxLongPolls), m: m},
		view:      newView(log, m),
		ready:     make(chan struct{}),
		onTerm:    opts.OnHotKeyTerm,
		onRound:   opts.OnHotKeyRound,
	}
	s.sessionHub.s = s
	if cfg.AuthOpen() {
		log.Warn("the API accepts requests without a token; set auth.admin_tokens and auth.member_tokens before exposing it", "listen", cfg.Listen)
	}
	return s, nil
}

// Ready is closed once the API is listening and the view has loaded the
// store.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Addr returns the address the API listens on; valid once Ready is closed.
func (s *Server) Addr() string { return s.addr }

// DebugAddr returns the profiles' listen address once Run has bound it
// ("" without debug_listen).
func (s *Server) DebugAddr() string { return s.debugAddr }

// Profiles serves net/http/pprof's handlers: serve's debug_listen, and
// the etcd process of bench scale.
func Profiles() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// Run starts etcd (embedded, unless endpoints are configured), the API,
// the watch and the campaign, and blocks until ctx is done and every
// goroutine has exited. Shutdown is graceful: the API stops accepting,
// in-flight calls finish (up to 10 s), the term ends, and the embedded etcd
// stops last.
func (s *Server) Run(ctx context.Context) error {
	endpoints := s.cfg.Etcd.Endpoints
	if len(endpoints) == 0 {
		s.log.Info("starting embedded etcd", "data_dir", s.cfg.Etcd.DataDir)
		// etcd's own warnings are about its single-node setup, not
		// actionable here; its errors still reach slog's default logger.
		emb, err := store.StartEmbedded(ctx, store.EmbeddedConfig{Dir: s.cfg.Etcd.DataDir})
		if err != nil {
			return fmt.Errorf("start embedded etcd in %s: %w", s.cfg.Etcd.DataDir, err)
		}
		defer emb.Close()
		endpoints = emb.Endpoints()
	}
	embedded := len(s.cfg.Etcd.Endpoints) == 0
	etcdTLS, err := s.etcdTLS()
	if err != nil {
		return err
	}
	st, err := store.Open(ctx, store.Config{Endpoints: endpoints, TLS: etcdTLS, Username: s.cfg.Etcd.Username, Password: s.cfg.Etcd.Password, Logger: s.log})
	if err != nil {
		return fmt.Errorf("connect to etcd %v: %w (check --etcd-endpoints and that etcd is running)", endpoints, err)
	}
	defer st.Close()
	s.store = st
	st.SetRenewCheck(s.checkRenewals)
	secret, err := st.ClusterSecret(ctx)
	if err != nil {
		return fmt.Errorf("read the cluster secret: %w", err)
	}
	s.sessions = sessions{secret: secret}
	if embedded {
		// Nobody else can share an embedded etcd: an election key left by
		// this process's previous run (killed) only delays the campaign
		// until its lease runs out, so end it now.
		if n, err := st.ClearElection(ctx); err != nil {
			return fmt.Errorf("clear the previous run's election key: %w", err)
		} else if n > 0 {
			s.log.Info("ended the election session of the previous run", "sessions", n)
		}
	}
	if err := s.createKeyspaces(ctx); err != nil {
		return err
	}
	if err := s.createHotKeyPools(ctx); err != nil {
		return err
	}
	if err := s.createTenantPools(ctx); err != nil {
		return err
	}

	lis, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (is another keyshard running? choose another --listen)", s.cfg.Listen, err)
	}
	s.addr = lis.Addr().String()
	httpSrv, err := s.httpServer()
	if err != nil {
		lis.Close()
		return err
	}

	var debugSrv *http.Server
	var debugLis net.Listener
	if s.cfg.DebugListen != "" {
		if debugLis, err = net.Listen("tcp", s.cfg.DebugListen); err != nil {
			lis.Close()
			return fmt.Errorf("listen on %s for the profiles (debug_listen): %w", s.cfg.DebugListen, err)
		}
		s.debugAddr = debugLis.Addr().String()
		debugSrv = &http.Server{Handler: Profiles(), ReadHeaderTimeout: 10 * time.Second}
		s.log.Info("serving Go's profiles without a token: keep this address private", "debug_listen", s.debugAddr, "example", "go tool pprof http://"+s.debugAddr+"/debug/pprof/profile?seconds=30")
	}

	s.reach.lastOK = s.clock.Now() // the store just answered
	s.metrics.storeReachable.Set(1)
	probeTick := s.clock.NewTicker(probeInterval)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.probeStore(gctx, probeTick) }) // exits when gctx ends
	g.Go(func() error { return s.view.run(gctx, st) })          // exits when gctx ends
	g.Go(func() error { return s.campaign(gctx) })              // exits when gctx ends
	g.Go(func() error { return s.advertise(gctx) })             // exits when gctx ends
	// gRPC connections are served by grpc-go's HTTP/2 server, handing
	// each call to the same handler (grpcbridge): for a fleet of members
	// on Session streams, serve takes a fifth less CPU than with
	// net/http's. With TLS, Split does the handshake.
	grpcLis, lis := grpcbridge.Split(lis, grpcbridge.SplitOptions{
		TLSConfig: httpSrv.TLSConfig,
		OnTLSError: func(remote net.Addr, err error) {
			s.log.Info("TLS handshake failed; check the client's CA and server name", "remote", remote.String(), "err", err)
		},
		OnRoute: func(toGRPC bool) {
			if toGRPC {
				s.metrics.apiConns.WithLabelValues("grpc").Inc()
			} else {
				s.metrics.apiConns.WithLabelValues("http").Inc()
			}
		},
	})
	bridge := grpcbridge.New(httpSrv.Handler, grpcbridge.Options{
		BaseContext: httpSrv.BaseContext(lis),
		// Twice the larger limit: a message up to that size reaches
		// the handler, whose limits refuse it naming the flag; grpc-go
		// refuses a larger one before reading it whole.
		MaxRecvMsgSize: 2*max(s.cfg.Limits.MaxRequestBytes, s.cfg.Limits.MaxReportBytes) + envelopeBytes,
		Log:            s.log,
		// The one stream every live member holds (or shares with the
		// other members of its process), on grpc-go's stream.
		Streams: map[string]grpcbridge.StreamHandler{
			keyshardv1connect.MemberServiceSessionProcedure:  s.grpcSession,
			keyshardv1connect.MemberServiceSessionsProcedure: s.grpcSessions,
		},
	})
	g.Go(func() error { // exits when the listener closes
		if err := bridge.Serve(grpcLis); err != nil && !errors.Is(err, net.ErrClosed) {
			return fmt.Errorf("serve API (gRPC): %w", err)
		}
		return nil
	})
	g.Go(func() error { // exits when the listener closes
		err := httpSrv.Serve(lis) // TLS, if any, is done: grpcbridge.Split
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("serve API: %w", err)
	})
	if debugSrv != nil {
		g.Go(func() error { // exits when the listener closes
			if err := debugSrv.Serve(debugLis); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve the profiles: %w", err)
			}
			return nil
		})
		g.Go(func() error { // exits when gctx ends, after closing the profiles' listener
			<-gctx.Done()
			return debugSrv.Close()
		})
	}
	g.Go(func() error { // exits when gctx ends, after shutting the API down
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(gctx), 10*time.Second)
		defer cancel()
		if err := httpSrv.Shutdown(sctx); err != nil { // ends the streams of both servers
			s.log.Warn("API shutdown did not finish in time; closing the remaining connections", "err", err)
			bridge.Stop()
			return httpSrv.Close()
		}
		if err := bridge.Shutdown(sctx); err != nil {
			s.log.Warn("API shutdown (gRPC) did not finish in time; closed the remaining connections", "err", err)
		}
		return nil
	})
	g.Go(func() error { // exits once ready, or when gctx ends
		select {
		case <-gctx.Done():
			return nil
		case <-s.view.synced:
		}
		s.log.Info("keyshard serving", "listen", s.addr, "replica", s.cfg.Replica, "etcd", endpoints)
		close(s.ready)
		return nil
	})
	err = g.Wait()
	if ctx.Err() != nil {
		return nil // a requested shutdown, not a failure
	}
	return err
}

func (s *Server) createKeyspaces(ctx context.Context) error {
	for _, k := range s.cfg.Keyspaces {
		_, err := s.store.CreateKeyspace(ctx, k.store())
		switch {
		case err == nil:
			s.log.Info("created keyspace from config", "keyspace", k.Name, "buckets", k.Buckets)
		case errors.Is(err, store.ErrExists):
			have, _, gerr := s.store.GetKeyspace(ctx, k.Name)
			if gerr != nil {
				return gerr
			}
			if have.Buckets != k.Buckets || have.Hash != k.Hash {
				return fmt.Errorf("%w: keyspace %q exists with %d buckets and hash %s, but the config asks for %d and %s; bucket count and hash cannot change while clients run",
					ErrConfig, k.Name, have.Buckets, have.Hash, k.Buckets, k.Hash)
			}
		default:
			return fmt.Errorf("create keyspace %q: %w", k.Name, err)
		}
	}
	return nil
}

// compressMinBytes is the least size of a response message that is
// compressed, for clients that accept it.
const compressMinBytes = 16 << 10

func (s *Server) httpServer() (*http.Server, error) {
	opts := []connect.HandlerOption{
		connect.WithRequestGate(s.auth.gate),
		connect.WithRequestGate(s.sizeGate),
		connect.WithInterceptors(reachGate{s}),
		connect.WithCodec(strictJSONCodecs[0]),
		connect.WithCodec(strictJSONCodecs[1]),
		// Small messages go uncompressed even to clients that accept gzip:
		// a member's grants (1–4 KiB) cost more CPU to compress than they
		// save on any network Keyshard runs on, and a join storm sends
		// thousands a second. Maps of many buckets are still compressed.
		connect.WithCompressMinBytes(compressMinBytes),
		connect.WithConditionalHandlerOptions(func(spec connect.Spec) []connect.HandlerOption {
			most, _ := s.cfg.Limits.readMax(spec.Procedure)
			return []connect.HandlerOption{connect.WithReadMaxBytes(most)}
		}),
	}
	mux := http.NewServeMux()
	mux.Handle(keyshardv1connect.NewAdminServiceHandler(&adminService{s}, opts...))
	mux.Handle(keyshardv1connect.NewMemberServiceHandler(&memberService{s: s}, opts...))
	mux.Handle(keyshardv1connect.NewMapServiceHandler(&mapService{s}, opts...))
	mux.Handle(keyshardv1connect.NewHotKeyServiceHandler(&hotKeyService{s}, opts...))
	mux.Handle(keyshardv1connect.NewTenantPoolServiceHandler(&tenantPoolService{s: s}, opts...))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.view.ready() {
			http.Error(w, "not ready: loading the store", http.StatusServiceUnavailable)
			return
		}
		if down, lastOK, _ := s.reach.state(); down {
			http.Error(w, fmt.Sprintf("not ready: etcd unreachable (no successful read for %v)", s.clock.Since(lastOK).Truncate(time.Millisecond)), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.Handle("/metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	// The dashboard's page needs no token (it asks for one); the API calls
	// it makes carry it, and the gate above checks them as any other.
	ui := dashboard.Handler()
	mux.Handle(dashboard.Prefix, ui)
	mux.Handle(strings.TrimSuffix(dashboard.Prefix, "/"), ui)
	// Streams and long polls end when shutdown begins, so clients move to
	// another replica at once instead of holding Shutdown for its timeout.
	base, endStreams := context.WithCancel(context.Background())
	// HTTP/2 without TLS is served with prior knowledge only (as gRPC
	// clients and the Go SDK speak it). An HTTP/1.1 request asking to
	// upgrade to h2c is served as HTTP/1.1: an upgrade would have to read
	// its whole body into memory before any handler, or the token check,
	// could see it.
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetHTTP2(true)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Handler:           s.limitBodies(jsonErrors(mux)),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return base },
		Protocols:         protocols,
	}
	srv.RegisterOnShutdown(endStreams)
	if s.cfg.TLS.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(s.cfg.TLS.CertFile, s.cfg.TLS.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: tls: load %s and %s: %v", ErrConfig, s.cfg.TLS.CertFile, s.cfg.TLS.KeyFile, err)
		}
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
	}
	return srv, nil
}

func (s *Server) etcdTLS() (*tls.Config, error) {
	t := s.cfg.Etcd.TLS
	if t.CertFile == "" && t.CAFile == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: etcd.tls: load %s and %s: %v", ErrConfig, t.CertFile, t.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: etcd.tls.ca_file: %v", ErrConfig, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: etcd.tls.ca_file: %s holds no PEM certificate", ErrConfig, t.CAFile)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}
