package keyshardtest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/internal/server"
	"github.com/keyshard/keyshard/internal/store"
)

// Bounds on waiting for the server. They are deadlines for failing, never
// a pace: a healthy server starts and stops in well under a second.
const (
	// startBound bounds NewServer and Restart until the server is ready.
	startBound = time.Minute
	// stopBound bounds a stop until Run has returned; past it the stop
	// fails and reports the replica's goroutines. Run itself gives
	// in-flight calls 10 s.
	stopBound = 30 * time.Second
)

// ErrClosed is returned by Restart on a Server that was closed.
var ErrClosed = errors.New("keyshardtest: server closed")

// Server is one keyshard serve replica run in process: the real server,
// with its etcd embedded in a data directory of its own, serving its API
// on loopback, as `keyshard serve` does. NewServer and Start return it
// ready; Close stops it. Its methods are safe for concurrent use; starts
// and stops wait for each other.
type Server struct {
	tb      testing.TB    // nil for Start: failures are only returned
	cfg     server.Config // as of the first start; Restart listens on the address it bound
	sopts   server.Options
	token   string // what Client and WaitEpoch send: the admin token, or none
	started func(*server.Server)
	rounds  *rounds
	ownDir  string // Start's data directory, removed by Close

	life sync.Mutex // held by start and Stop

	mu      sync.Mutex
	cur     *run   // nil while stopped
	addr    string // set by the first start
	closed  bool
	clients []*client.Client
}

// run is one start of a replica: one call of Run.
type run struct {
	replica string
	srv     *server.Server
	stop    context.CancelFunc
	done    chan error // Run's result
	label   string     // the pprof label value of Run's goroutines
}

// NewServer starts a keyshard serve replica for the test, its etcd in
// tb.TempDir(), and returns it once it serves: its keyspaces and hot-key
// pools exist and it answers calls at URL. Bad options or a failed start
// fail the test. Close is registered with tb.Cleanup.
func NewServer(tb testing.TB, opts Options) *Server {
	tb.Helper()
	s, err := newServer(tb, opts, "keyshardtest", server.EtcdConfig{DataDir: tb.TempDir()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	if err := s.startBounded(); err != nil {
		tb.Fatal(err)
	}
	return s
}

// Start is NewServer for code that is not a test (a benchmark, a demo):
// the data directory is a new temporary directory that Close removes,
// ctx bounds the start only, and every failure is returned. The caller
// must call Close.
func Start(ctx context.Context, opts Options) (*Server, error) {
	dir, err := os.MkdirTemp("", "keyshardtest-")
	if err != nil {
		return nil, fmt.Errorf("keyshardtest: %w", err)
	}
	s, err := newServer(nil, opts, "keyshardtest", server.EtcdConfig{DataDir: dir})
	if err == nil {
		s.ownDir = dir
		err = s.start(ctx)
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// NewReplicas starts an etcd of its own, in tb.TempDir(), and n keyshard
// serve replicas on it named r1 to rn, as a deployment of several
// replicas runs: one leads, every one serves, and another takes over
// when the leader stops. Stop, Restart and Close act on one replica; the
// etcd stops at the test's cleanup, after every replica. Client dials one
// replica; dial them all with client.Dial and the URLs joined by commas.
func NewReplicas(tb testing.TB, n int, opts Options) []*Server {
	tb.Helper()
	if n < 1 {
		tb.Fatalf("keyshardtest: NewReplicas: n is %d; want at least 1", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startBound)
	defer cancel()
	emb, err := store.StartEmbedded(ctx, store.EmbeddedConfig{Dir: tb.TempDir(), Logger: opts.logger()})
	if err != nil {
		tb.Fatalf("keyshardtest: start etcd: %v", err)
	}
	tb.Cleanup(emb.Close) // after the replicas' cleanups, registered below
	all := make([]*Server, n)
	for i := range all {
		s, err := newServer(tb, opts, fmt.Sprintf("r%d", i+1), server.EtcdConfig{Endpoints: emb.Endpoints()})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { s.Close() })
		if err := s.startBounded(); err != nil {
			tb.Fatal(err)
		}
		all[i] = s
	}
	return all
}

func newServer(tb testing.TB, opts Options, replica string, etcd server.EtcdConfig) (*Server, error) {
	cfg, log, err := opts.config(replica, etcd)
	if err != nil {
		return nil, err
	}
	s := &Server{tb: tb, cfg: cfg, token: opts.AdminToken, rounds: newRounds()}
	s.sopts = server.Options{Logger: log, Clock: opts.Clock}
	if opts.Internal != nil {
		s.started = opts.Internal.Started
	}
	return s, nil
}

// runs numbers every start in this process, so that a profile label
// names one run of one replica.
var runs atomic.Int64

// goroutineLabel is the pprof label key on every goroutine of a run.
const goroutineLabel = "keyshardtest.server"

func (s *Server) startBounded() error {
	ctx, cancel := context.WithTimeout(context.Background(), startBound)
	defer cancel()
	return s.start(ctx)
}

// start runs the replica and waits, bounded by ctx, until it is ready. A
// running replica is left alone.
func (s *Server) start(ctx context.Context) error {
	s.life.Lock()
	defer s.life.Unlock()
	s.mu.Lock()
	closed, running, cfg := s.closed, s.cur != nil, s.cfg
	if s.addr != "" {
		cfg.Listen = s.addr
	}
	s.mu.Unlock()
	switch {
	case closed:
		return ErrClosed
	case running:
		return nil
	}
	sopts := s.sopts
	sopts.OnHotKeyTerm, sopts.OnHotKeyRound = s.rounds.started()
	sopts.OnTenantPoolTerm, sopts.OnTenantPoolRound = s.rounds.tenantPoolHooks()
	srv, err := server.New(cfg, sopts)
	if err != nil {
		return fmt.Errorf("keyshardtest: %w", err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	r := &run{replica: cfg.Replica, srv: srv, stop: stop, done: make(chan error, 1), label: fmt.Sprintf("%s#%d", cfg.Replica, runs.Add(1))}
	// Every goroutine Run starts inherits the label, so that a stop that
	// hangs can say which of them are still there.
	go pprof.Do(runCtx, pprof.Labels(goroutineLabel, r.label), func(ctx context.Context) { r.done <- srv.Run(ctx) }) // exits when r.stop is called
	select {
	case <-srv.Ready():
	case err := <-r.done:
		stop()
		return fmt.Errorf("keyshardtest: keyshard serve %s stopped before it was ready: %w", r.replica, err)
	case <-ctx.Done():
		return fmt.Errorf("keyshardtest: keyshard serve %s is not ready: %w", r.replica, errors.Join(ctx.Err(), r.halt(stopBound)))
	}
	s.mu.Lock()
	s.cur = r
	if s.addr == "" {
		s.addr = srv.Addr()
	}
	s.mu.Unlock()
	if s.started != nil {
		s.started(srv)
	}
	return nil
}

// halt stops r and waits up to bound for Run to return. Past the bound it
// returns an error listing r's goroutines, which are still running.
func (r *run) halt(bound time.Duration) error {
	r.stop()
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case err := <-r.done:
		if err != nil {
			return fmt.Errorf("keyshardtest: keyshard serve %s: %w", r.replica, err)
		}
		return nil
	case <-t.C:
		return fmt.Errorf("keyshardtest: keyshard serve %s did not stop within %v; its goroutines still running:\n%s",
			r.replica, bound, goroutinesLabelled(r.label))
	}
}

// fail reports err to the test, if there is one, and returns it.
func (s *Server) fail(err error) error {
	if err != nil && s.tb != nil {
		s.tb.Helper()
		s.tb.Error(err)
	}
	return err
}

// URL returns the base URL of the API, for client.Dial: the same across
// Restart.
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg.TLS.CertFile != "" {
		return "https://" + s.addr
	}
	return "http://" + s.addr
}

// Client dials the server with opts, and with the admin token if
// Options set one (a client.Token in opts replaces it). Close closes the
// client. A dial error fails the test; for a Server from Start it panics,
// as httptest.NewServer does when it cannot listen.
func (s *Server) Client(opts ...client.Option) *client.Client {
	if s.tb != nil {
		s.tb.Helper()
	}
	if s.token != "" {
		opts = append([]client.Option{client.Token(s.token)}, opts...)
	}
	c, err := client.Dial(s.URL(), opts...)
	if err != nil {
		if s.tb == nil {
			panic(fmt.Sprintf("keyshardtest: dial %s: %v", s.URL(), err))
		}
		s.tb.Fatalf("keyshardtest: dial %s: %v", s.URL(), err)
	}
	s.mu.Lock()
	s.clients = append(s.clients, c)
	s.mu.Unlock()
	return c
}

// Stop stops the replica as a shutdown of keyshard serve does (calls in
// flight finish, the leader hands over, etcd stops last) and waits until
// everything it ran has returned. Clients and workers see it gone until
// Restart. If it has not stopped within 30 s, Stop fails the test with
// the replica's goroutines that are still running. Stopping a stopped
// Server does nothing.
func (s *Server) Stop() error {
	if s.tb != nil {
		s.tb.Helper()
	}
	s.life.Lock()
	defer s.life.Unlock()
	return s.fail(s.stop())
}

func (s *Server) stop() error {
	s.mu.Lock()
	r := s.cur
	s.cur = nil
	s.mu.Unlock()
	if r == nil {
		return nil
	}
	return r.halt(stopBound)
}

// Restart stops the replica if it runs, then starts it again on the same
// data directory and address and returns once it is ready: state in
// etcd survives, and clients and workers reconnect on their own. Failures
// fail the test (t.Fatal: call it from the test's goroutine).
func (s *Server) Restart() error {
	if s.tb != nil {
		s.tb.Helper()
	}
	if err := s.Stop(); err != nil {
		if s.tb != nil {
			s.tb.FailNow()
		}
		return err
	}
	if err := s.startBounded(); err != nil {
		if s.tb != nil {
			s.tb.Fatal(err)
		}
		return err
	}
	return nil
}

// Close closes the clients from Client, stops the replica as Stop does
// and, for a Server from Start, removes its data directory. A Server from
// NewServer is closed at the end of its test. Close is idempotent; it
// returns the error of Run, or of a stop that hung, once.
func (s *Server) Close() error {
	if s.tb != nil {
		s.tb.Helper()
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true // from now on start refuses
	clients := s.clients
	s.clients = nil
	s.mu.Unlock()
	for _, c := range clients {
		c.Close()
	}
	err := s.Stop()
	if s.ownDir != "" {
		os.RemoveAll(s.ownDir)
	}
	return err
}

// WaitEpoch returns the map of keyspace once it is at epoch or later. It
// follows the map with the API's long poll (GetMap with sinceEpoch), as a
// Router does, so it returns as soon as the server has the epoch. It
// returns ctx's error when ctx ends first, and the API's error if a call
// fails (code not_found for a keyspace that does not exist).
func (s *Server) WaitEpoch(ctx context.Context, keyspace string, epoch uint64) (*keyshardv1.Map, error) {
	var opts []connect.ClientOption
	if s.token != "" {
		opts = append(opts, connect.WithInterceptors(bearer(s.token)))
	}
	maps := keyshardv1connect.NewMapServiceClient(http.DefaultClient, s.URL(), opts...)
	var since uint64
	for {
		req := &keyshardv1.GetMapRequest{Keyspace: keyspace, SinceEpoch: since, Wait: durationpb.New(30 * time.Second)}
		resp, err := maps.GetMap(ctx, connect.NewRequest(req))
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil:
			return nil, fmt.Errorf("keyshardtest: wait for epoch %d of keyspace %q: %w", epoch, keyspace, err)
		}
		m := resp.Msg.GetMap()
		if m.GetEpoch() >= epoch {
			return m, nil
		}
		since = m.GetEpoch()
	}
}

// WaitLeading returns once the replica, in its current run, leads: its
// leader loops run, and its hot-key aggregation and tenant-pool rounds
// have set their tickers, so that advancing a fake Clock by a second runs
// a round of each. It returns ctx's error when ctx ends first.
func (s *Server) WaitLeading(ctx context.Context) error {
	return s.rounds.wait(ctx, func(r *rounds) bool { return r.leading == r.starts && r.tpLeading == r.starts })
}

// WaitTenantPoolRound returns once the replica, as leader, has finished a
// tenant-pool round (of every pool) that began at or after at by
// Options.Clock: its writes are then committed. With a fake clock,
// advance it past at first. It returns ctx's error when ctx ends first.
func (s *Server) WaitTenantPoolRound(ctx context.Context, at time.Time) error {
	return s.rounds.wait(ctx, func(r *rounds) bool { return !r.tpLast.Before(at) })
}

// WaitHotKeyRound returns once the replica, as leader, has finished a
// hot-key aggregation round that began at or after at by Options.Clock:
// the overflow sets then reflect every report the server had at that
// time. With a fake clock, advance it past at first. It returns ctx's
// error when ctx ends first.
func (s *Server) WaitHotKeyRound(ctx context.Context, at time.Time) error {
	return s.rounds.wait(ctx, func(r *rounds) bool { return !r.last.Before(at) })
}

func bearer(token string) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", "Bearer "+token)
			return next(ctx, req)
		}
	}
}
