package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/clock"
)

// Option configures Dial. Options given to Dial last win.
type Option interface{ applyClient(*clientOptions) }

// WorkerOption configures NewWorker.
type WorkerOption interface{ applyWorker(*workerOptions) }

// RouterOption configures NewRouter.
type RouterOption interface{ applyRouter(*routerOptions) }

// HotKeysOption configures NewHotKeys.
type HotKeysOption interface{ applyHotKeys(*hotKeysOptions) }

// PoolOption configures FollowPool, JoinPool and NewLoadReporter.
type PoolOption interface{ applyPool(*poolOptions) }

// SharedOption is an option that Dial, NewWorker, NewRouter and
// NewHotKeys all take. Given to Dial it sets the default for the Routers,
// Workers and HotKeys of the Client.
type SharedOption interface {
	Option
	WorkerOption
	RouterOption
	HotKeysOption
	PoolOption
}

type clientOptions struct {
	token          string
	hc             *http.Client
	tls            *tls.Config
	clock          clock.Clock
	log            *slog.Logger
	replicaTimeout time.Duration
	grpc           bool
	sharedSessions bool
	hcSet          bool
	tlsSet         bool
}

// defaultReplicaTimeout is how long a call waits for one replica before
// trying the next, when Dial was given several.
const defaultReplicaTimeout = 5 * time.Second

type clientOpt func(*clientOptions)

func (f clientOpt) applyClient(o *clientOptions) { f(o) }

// Token sets the bearer token sent with every call
// (Authorization: Bearer <token>). The token's role decides which
// services it may call: admin for Admin, member for Workers, either for
// Routers.
func Token(token string) Option {
	return clientOpt(func(o *clientOptions) { o.token = token })
}

// HTTPClient sets the http.Client the Client calls the server with. It
// must not have a Timeout, since map and grant watches are long-lived
// streams. With GRPC() over http:// it must speak HTTP/2 without TLS
// (h2c). TLSConfig cannot be combined with it: configure TLS on the
// client's transport instead.
func HTTPClient(hc *http.Client) Option {
	return clientOpt(func(o *clientOptions) { o.hc, o.hcSet = hc, hc != nil })
}

// TLSConfig sets the TLS configuration of the default transport, for
// https:// URLs (for example a private CA or a client certificate).
func TLSConfig(cfg *tls.Config) Option {
	return clientOpt(func(o *clientOptions) { o.tls, o.tlsSet = cfg, cfg != nil })
}

// GRPC makes the Client speak gRPC instead of the Connect protocol. Over
// http:// the default transport then uses HTTP/2 without TLS (h2c). The
// default, the Connect protocol, works over HTTP/1.1 and through any proxy.
func GRPC() Option {
	return clientOpt(func(o *clientOptions) { o.grpc = true })
}

// ReplicaTimeout sets how long a call waits for one replica before it
// tries the next, when Dial was given several URLs (default 5s). Long
// polls wait this long on top of the wait they ask the server for. A
// Worker bounds its calls by its session's deadlines as well: a
// keep-alive by the fence deadline, a Join by the lease TTL minus the
// fence margin, shared among the replicas not yet tried. With one URL,
// calls are bounded only by their context.
func ReplicaTimeout(d time.Duration) Option {
	return clientOpt(func(o *clientOptions) { o.replicaTimeout = d })
}

// SharedSessionStreams makes the Workers of the Client share their
// Session streams: instead of a stream each, they carry their grants and
// keep-alives on one MemberService.Sessions stream per replica, opened
// when the first Worker's session needs it and closed when no session
// uses it any more. Keep-alives that fall due together go in one message
// (at most one such message every 100ms per stream); each keeps its own
// bound, and one the replica does not answer in time ends the shared
// stream, as it ends a Session stream. The stream needs HTTP/2, as
// Session streams do (GRPC, https, or an HTTPClient that speaks h2c); a
// replica that answers it UNIMPLEMENTED makes the Workers use
// WatchGrants and KeepAlive calls instead, for the rest of the Client's
// life. It is meant for a process that runs many Workers on one Client;
// without it each Worker has a Session stream of its own (see Worker).
func SharedSessionStreams() Option {
	return clientOpt(func(o *clientOptions) { o.sharedSessions = true })
}

type sharedOpt struct {
	clock clock.Clock
	log   *slog.Logger
}

func (s sharedOpt) applyClient(o *clientOptions) {
	if s.clock != nil {
		o.clock = s.clock
	}
	if s.log != nil {
		o.log = s.log
	}
}

func (s sharedOpt) applyWorker(o *workerOptions) {
	if s.clock != nil {
		o.clock = s.clock
	}
	if s.log != nil {
		o.log = s.log
	}
}

func (s sharedOpt) applyRouter(o *routerOptions) {
	if s.clock != nil {
		o.clock = s.clock
	}
	if s.log != nil {
		o.log = s.log
	}
}

func (s sharedOpt) applyPool(o *poolOptions) {
	if s.clock != nil {
		o.clock = s.clock
	}
	if s.log != nil {
		o.log = s.log
	}
}

func (s sharedOpt) applyHotKeys(o *hotKeysOptions) {
	if s.clock != nil {
		o.clock = s.clock
	}
	if s.log != nil {
		o.log = s.log
	}
}

// Clock sets the clock used for keep-alives, self-fencing, backoff,
// polling and hot-key reports (default: the system clock; for a Worker,
// Router or HotKeys, the Client's). Tests pass a *clocktest.Fake (or
// keyshardtest.FakeClock, the same type). A nil c leaves the default.
func Clock(c clock.Clock) SharedOption { return sharedOpt{clock: c} }

// Logger sets the logger (default: discard; for a Worker, Router or
// HotKeys, the Client's). Reconnects and retried failures are logged at
// Warn, session loss at Error. A nil l leaves the default.
func Logger(l *slog.Logger) SharedOption { return sharedOpt{log: l} }

// Client is a connection to a Keyshard cluster: the five services of
// keyshard.v1 behind one or more replica URLs. It is safe for concurrent
// use. Routers, Workers and HotKeys built on it take their defaults from
// it; close them before the Client.
//
// With several replicas, every call goes first to the replica that
// answered last. A call that the replica answers with Unavailable, that
// fails in transport, or that gets no answer within ReplicaTimeout (or
// the call's own budget) moves on to the next replica, each tried at most
// once per call. Streams (map, grant and overflow-set watches) are opened
// on the preferred replica and reopened elsewhere as soon as any call of
// the Client moves away from it.
type Client struct {
	eps   []*endpoint
	opts  clientOptions
	authz string

	mu     sync.Mutex
	pref   int                // index in eps of the replica calls try first
	moved  context.Context    // cancelled when pref changes; streams on the old replica end
	onMove context.CancelFunc // cancels moved

	// noSession: (mu) why the Client's Workers do not open Session
	// streams (nil: they do), for the life of the Client.
	noSession error
	// noSessionLogged: (mu) noSession was logged.
	noSessionLogged bool

	// shared are the Sessions streams of SharedSessionStreams; see
	// sessionmux.go.
	shared sharedStreams

	ctx       context.Context // cancelled by Close; every call is bound to it
	cancel    context.CancelFunc
	closeOnce sync.Once
	ownHTTP   *http.Transport // closed by Close when Dial made it
}

// endpoint is one replica: the five services at its URL.
type endpoint struct {
	url    string
	admin  keyshardv1connect.AdminServiceClient
	member keyshardv1connect.MemberServiceClient
	maps   keyshardv1connect.MapServiceClient
	hot    keyshardv1connect.HotKeyServiceClient
	pools  keyshardv1connect.TenantPoolServiceClient
}

// The service interfaces, by short names for method expressions such as
// memberAPI.KeepAlive.
type (
	adminAPI  = keyshardv1connect.AdminServiceClient
	memberAPI = keyshardv1connect.MemberServiceClient
	mapAPI    = keyshardv1connect.MapServiceClient
	hotAPI    = keyshardv1connect.HotKeyServiceClient
	poolAPI   = keyshardv1connect.TenantPoolServiceClient
)

// service returns e's client of service S (one of the five above).
func service[S any](e *endpoint) S {
	var s S
	switch p := any(&s).(type) {
	case *adminAPI:
		*p = e.admin
	case *memberAPI:
		*p = e.member
	case *mapAPI:
		*p = e.maps
	case *hotAPI:
		*p = e.hot
	case *poolAPI:
		*p = e.pools
	}
	return s
}

// Dial returns a Client for the Keyshard cluster at rawURL: one server
// URL, such as "http://127.0.0.1:7400" or "https://keyshard.internal", or
// several replicas' URLs separated by commas, such as
// "http://a:7400,http://b:7400". Give a Worker every replica's URL (at
// least two): a worker whose only replica is paused or cut off from etcd
// cannot renew its lease and fences, although another replica is healthy.
// Dial does no IO: an unreachable server shows up as ErrUnavailable on the
// first call. It returns an *ArgError (wrapping ErrInvalid) if a URL is
// not an absolute http or https URL, is given twice, or the options are
// bad or contradict each other.
func Dial(rawURL string, opts ...Option) (*Client, error) {
	var o clientOptions
	for _, opt := range opts {
		if opt != nil {
			opt.applyClient(&o)
		}
	}
	var bases []*url.URL
	seen := map[string]bool{}
	for _, raw := range strings.Split(rawURL, ",") {
		raw = strings.TrimSpace(raw)
		if raw == "" && rawURL != "" {
			return nil, argError("Dial", "server URL list", "%q has an empty entry; separate replicas' URLs with single commas", rawURL)
		}
		base, err := parseServerURL(raw)
		if err != nil {
			return nil, err
		}
		u := strings.TrimSuffix(base.String(), "/")
		if seen[u] {
			return nil, argError("Dial", "server URL", "%q is given twice", u)
		}
		seen[u] = true
		if o.tlsSet && base.Scheme != "https" {
			return nil, argError("Dial", "TLSConfig", "is given for %q; use an https:// URL", raw)
		}
		bases = append(bases, base)
	}
	if o.hcSet && o.tlsSet {
		return nil, argError("Dial", "TLSConfig", "and HTTPClient are both given; set TLS on the http.Client's transport")
	}
	if strings.ContainsAny(o.token, "\r\n") {
		return nil, argError("Dial", "Token", "contains a line break")
	}
	if o.replicaTimeout < 0 {
		return nil, argError("Dial", "ReplicaTimeout", "%v is negative (0 means the default, %v)", o.replicaTimeout, defaultReplicaTimeout)
	}
	if o.replicaTimeout == 0 {
		o.replicaTimeout = defaultReplicaTimeout
	}
	o.clock = clock.Or(o.clock)
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	c := &Client{opts: o}
	if o.token != "" {
		c.authz = "Bearer " + o.token
	}
	anyHTTPS := false
	for _, base := range bases {
		anyHTTPS = anyHTTPS || base.Scheme == "https"
		if o.token != "" && base.Scheme == "http" && !isLoopback(base.Hostname()) {
			o.log.Warn("keyshard: sending a bearer token over plain http", "url", base.String())
		}
	}
	hc := o.hc
	if hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		if anyHTTPS {
			tr.TLSClientConfig = o.tls
		}
		if o.grpc { // gRPC needs HTTP/2; without TLS that is h2c with prior knowledge
			tr.Protocols = new(http.Protocols)
			tr.Protocols.SetHTTP1(anyHTTPS)
			tr.Protocols.SetHTTP2(anyHTTPS)
			tr.Protocols.SetUnencryptedHTTP2(true)
		}
		c.ownHTTP = tr
		hc = &http.Client{Transport: tr}
		if !o.grpc && !anyHTTPS {
			// HTTP/1.1 only: a Session stream would be answered
			// UNIMPLEMENTED.
			c.noSession = errors.New("the Client speaks the Connect protocol over HTTP/1.1 (http:// URLs without GRPC), and Session streams need HTTP/2")
		}
	}
	var copts []connect.ClientOption
	if o.grpc {
		copts = append(copts, connect.WithGRPC())
	}
	for _, base := range bases {
		u := strings.TrimSuffix(base.String(), "/")
		c.eps = append(c.eps, &endpoint{
			url:    u,
			admin:  keyshardv1connect.NewAdminServiceClient(hc, u, copts...),
			member: keyshardv1connect.NewMemberServiceClient(hc, u, copts...),
			maps:   keyshardv1connect.NewMapServiceClient(hc, u, copts...),
			hot:    keyshardv1connect.NewHotKeyServiceClient(hc, u, copts...),
			pools:  keyshardv1connect.NewTenantPoolServiceClient(hc, u, copts...),
		})
	}
	c.moved, c.onMove = context.WithCancel(context.Background())
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.shared.init()
	return c, nil
}

func parseServerURL(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, argError("Dial", "server URL", "is empty; want for example http://127.0.0.1:7400")
	}
	if !strings.Contains(raw, "://") {
		return nil, argError("Dial", "server URL", "%q must start with http:// or https://, for example http://%s", raw, raw)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, argError("Dial", "server URL", "%q: %v", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, argError("Dial", "server URL", "%q must start with http:// or https://, for example http://127.0.0.1:7400", raw)
	}
	if u.Host == "" || u.Hostname() == "" {
		return nil, argError("Dial", "server URL", "%q has no host", raw)
	}
	if u.User != nil {
		return nil, argError("Dial", "server URL", "%q carries user info; pass credentials with Token", raw)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		return nil, argError("Dial", "server URL", "%q must not have a query or fragment", raw)
	}
	return u, nil
}

func isLoopback(host string) bool {
	return host == "localhost" || strings.HasPrefix(host, "127.") || host == "::1"
}

// URL returns the URL of the replica the Client calls first now (the one
// that answered last), without a trailing slash.
func (c *Client) URL() string {
	i, _ := c.preferred()
	return c.eps[i].url
}

// URLs returns the URLs of every replica given to Dial, in the order
// given, without trailing slashes.
func (c *Client) URLs() []string {
	out := make([]string, len(c.eps))
	for i, e := range c.eps {
		out[i] = e.url
	}
	return out
}

// preferred returns the index of the replica to try first and a context
// cancelled once that changes.
func (c *Client) preferred() (int, context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pref, c.moved
}

// prefer makes eps[i] the replica to try first, if the preference is
// still the one seen as moved. Streams open on the old one end.
func (c *Client) prefer(i int, moved context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.moved != moved || c.pref == i {
		return
	}
	c.opts.log.Warn("keyshard: moving to another replica", "from", c.eps[c.pref].url, "to", c.eps[i].url)
	c.pref = i
	c.onMove()
	c.moved, c.onMove = context.WithCancel(context.Background())
}

// sessionStreams reports whether the Client's Workers open Session
// streams, which carry their grants and keep-alives over HTTP/2. The
// first time it reports false, it logs why (at Info).
func (c *Client) sessionStreams() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.logNoSessionLocked()
	return c.noSession == nil
}

// noSessionStreams records that a stream of rpc (Session or Sessions)
// was answered UNIMPLEMENTED (err): an older server, or a transport or
// proxy that speaks HTTP/1.1. The Client's Workers open none for the rest
// of its life; it logs that once (at Info).
func (c *Client) noSessionStreams(rpc string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.noSession == nil {
		c.noSession = fmt.Errorf("a replica answered a %s stream UNIMPLEMENTED: %w", rpc, err)
	}
	c.logNoSessionLocked()
}

func (c *Client) logNoSessionLocked() {
	if c.noSession != nil && !c.noSessionLogged {
		c.noSessionLogged = true
		c.opts.log.Info("keyshard: workers keep alive with KeepAlive calls and follow grants with WatchGrants, not on Session streams", "why", c.noSession)
	}
}

// Admin returns the admin API of the Client.
func (c *Client) Admin() *Admin { return &Admin{c: c} }

// Clock returns the Client's clock (see the Clock option), which the
// Workers, Routers and HotKeys made from it use unless given their own.
func (c *Client) Clock() clock.Clock { return c.opts.clock }

// Logger returns the Client's logger (see the Logger option).
func (c *Client) Logger() *slog.Logger { return c.opts.log }

// Close cancels the Client's calls in flight, including the streams of
// its Routers and Workers, waits for the goroutines of its shared
// Sessions streams (SharedSessionStreams) to exit, and closes idle
// connections. Later calls return ErrClosed. Close the Client's Workers
// (which leave gracefully) and Routers first. Close is idempotent and
// returns nil.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.cancel()
		c.shared.close()
		if c.ownHTTP != nil {
			c.ownHTTP.CloseIdleConnections()
		}
	})
	return nil
}

// closed reports whether Close has been called.
func (c *Client) closed() bool { return c.ctx.Err() != nil }

// bind returns ctx, also cancelled when the Client closes.
func (c *Client) bind(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

func newRequest[T any](c *Client, msg *T) *connect.Request[T] {
	r := connect.NewRequest(msg)
	if c.authz != "" {
		r.Header().Set("Authorization", c.authz)
	}
	return r
}

// budget bounds a call beyond its context, on the Client's clock.
type budget struct {
	// within bounds the whole call, over every replica tried (0: only
	// ctx bounds it).
	within time.Duration
	// wait is how long the server may hold the call before it answers
	// (a long poll's wait); it adds to ReplicaTimeout.
	wait time.Duration
}

// errAttemptTimeout is the cause of an attempt cancelled by its budget.
var errAttemptTimeout = errors.New("no answer in time")

// errMoved is the cause of a stream ended because the Client moved to
// another replica.
var errMoved = errors.New("moved to another replica")

// call makes one unary call with no budget beyond ctx (and, with several
// replicas, ReplicaTimeout per replica), and translates its error.
func call[S, Req, Res any](ctx context.Context, c *Client, m func(S, context.Context, *connect.Request[Req]) (*connect.Response[Res], error), req *Req) (*Res, error) {
	return callWithin(ctx, c, m, req, budget{})
}

// callWithin makes one unary call within b, trying each replica at most
// once, starting with the preferred one, while the answer is
// ErrUnavailable (a refusal, a transport error or no answer in time). A
// replica that answers becomes the preferred one.
func callWithin[S, Req, Res any](ctx context.Context, c *Client, m func(S, context.Context, *connect.Request[Req]) (*connect.Response[Res], error), req *Req, b budget) (*Res, error) {
	if c.closed() {
		return nil, ErrClosed
	}
	ctx, cancel := c.bind(ctx)
	defer cancel()
	clk := c.opts.clock
	start := clk.Now()
	first, moved := c.preferred()
	var err error
	for i := range len(c.eps) {
		limit := time.Duration(0) // no limit
		if len(c.eps) > 1 {
			limit = c.opts.replicaTimeout + b.wait
		}
		if b.within > 0 {
			left := b.within - clk.Since(start)
			if left <= 0 {
				if err == nil {
					err = fmt.Errorf("%w: no answer within %v", ErrUnavailable, b.within)
				}
				return nil, err
			}
			share := left / time.Duration(len(c.eps)-i)
			if limit == 0 || share < limit {
				limit = share
			}
		}
		n := (first + i) % len(c.eps)
		var resp *Res
		resp, err = attempt(ctx, c, c.eps[n], m, req, limit)
		if err == nil {
			c.prefer(n, moved)
			return resp, nil
		}
		if ctx.Err() != nil || !errors.Is(err, ErrUnavailable) {
			return nil, err
		}
		if i+1 < len(c.eps) {
			c.opts.log.Warn("keyshard: replica unavailable; trying the next", "url", c.eps[n].url, "err", err)
		}
	}
	if len(c.eps) > 1 {
		err = fmt.Errorf("all %d replicas failed; the last: %w", len(c.eps), err)
	}
	return nil, err
}

// attempt makes one call to e, cancelled after limit (0: no limit) on the
// Client's clock.
func attempt[S, Req, Res any](ctx context.Context, c *Client, e *endpoint, m func(S, context.Context, *connect.Request[Req]) (*connect.Response[Res], error), req *Req, limit time.Duration) (*Res, error) {
	actx, acancel := context.WithCancelCause(ctx)
	defer acancel(nil)
	if limit > 0 {
		t := c.opts.clock.AfterFunc(limit, func() { acancel(errAttemptTimeout) })
		defer t.Stop()
	}
	resp, err := m(service[S](e), actx, newRequest(c, req))
	if err != nil {
		if ctx.Err() == nil && errors.Is(context.Cause(actx), errAttemptTimeout) {
			return nil, fmt.Errorf("%w: %s did not answer within %v", ErrUnavailable, e.url, limit)
		}
		return nil, c.translate(err)
	}
	return resp.Msg, nil
}

// stream opens a server stream on the preferred replica and calls yield
// for every message until the stream ends, ctx is done, or the Client
// moves to another replica. A stream the server ends cleanly returns nil.
// A stream that fails with ErrUnavailable makes the next replica the
// preferred one, so that the next stream opens there.
func stream[S, Req, Res any](ctx context.Context, c *Client, f func(S, context.Context, *connect.Request[Req]) (*connect.ServerStreamForClient[Res], error), req *Req, yield func(*Res)) error {
	return onPreferred(ctx, c, func(sctx context.Context, _ context.CancelCauseFunc, e *endpoint) error {
		s, err := f(service[S](e), sctx, newRequest(c, req))
		if err != nil {
			return err
		}
		for s.Receive() {
			yield(s.Msg())
		}
		err = s.Err()
		s.Close()
		return err
	})
}

// bidiStream is a bidi stream open on one replica. Its receiving side
// belongs to the goroutine that bidi runs it on; send is safe for
// concurrent use (connect allows one Send at a time, alongside Receive).
type bidiStream[Req, Res any] struct {
	st *connect.BidiStreamForClient[Req, Res]
	// abort ends the stream with cause: bidi then returns ErrUnavailable
	// wrapping it, and the next replica becomes the preferred one.
	abort context.CancelCauseFunc

	sendMu    sync.Mutex // serializes Send
	closeOnce sync.Once  // CloseRequest
}

// send sends m. It fails (io.EOF) once the stream is over: the receiving
// side then has its error.
func (b *bidiStream[Req, Res]) send(m *Req) error {
	b.sendMu.Lock()
	defer b.sendMu.Unlock()
	return b.st.Send(m)
}

// closeRequest ends the stream's request body. connect's Send and
// CloseRequest meet only at the body's io.Pipe, whose Close is safe
// alongside a Write and unblocks one waiting on flow control, so it does
// not wait for sendMu.
func (b *bidiStream[Req, Res]) closeRequest() {
	b.closeOnce.Do(func() { _ = b.st.CloseRequest() })
}

// bidi opens a bidi stream on the preferred replica and runs serve with
// it; serve receives until the stream ends. As with stream, the stream
// ends when ctx is done or the Client moves to another replica, a stream
// that fails with ErrUnavailable (or that serve aborts) makes the next
// replica the preferred one, and bidi returns serve's error translated.
// The stream's request body ends when the stream does: an HTTP/2
// transport that is still reading it sees no cancelled context, so
// Receive would not return.
func bidi[S, Req, Res any](ctx context.Context, c *Client, f func(S, context.Context) *connect.BidiStreamForClient[Req, Res], serve func(*bidiStream[Req, Res]) error) error {
	n, moved := c.preferred()
	return bidiOn(ctx, c, n, moved, f, serve)
}

// bidiOn is bidi on replica eps[n], which was the preferred one while
// moved was live.
func bidiOn[S, Req, Res any](ctx context.Context, c *Client, n int, moved context.Context, f func(S, context.Context) *connect.BidiStreamForClient[Req, Res], serve func(*bidiStream[Req, Res]) error) error {
	return onReplica(ctx, c, n, moved, func(sctx context.Context, abort context.CancelCauseFunc, e *endpoint) error {
		b := &bidiStream[Req, Res]{st: f(service[S](e), sctx), abort: abort}
		if c.authz != "" {
			b.st.RequestHeader().Set("Authorization", c.authz)
		}
		stop := context.AfterFunc(sctx, b.closeRequest)
		err := serve(b)
		stop()
		b.closeRequest()
		_ = b.st.CloseResponse()
		return err
	})
}

// onPreferred runs open, a stream on replica e (the preferred one), with
// sctx: cancelled when ctx ends, when the Client moves to another replica
// (cause errMoved), or by abort(cause). A stream ended by a move or an
// abort returns ErrUnavailable wrapping the cause; other errors are
// translated. ErrUnavailable, unless the Client moved already, makes the
// next replica the preferred one, so that the next stream opens there.
func onPreferred(ctx context.Context, c *Client, open func(sctx context.Context, abort context.CancelCauseFunc, e *endpoint) error) error {
	n, moved := c.preferred()
	return onReplica(ctx, c, n, moved, open)
}

// onReplica is onPreferred on replica eps[n], which was the preferred
// one while moved was live: a stream opened after the Client moved on
// ends at once (errMoved).
func onReplica(ctx context.Context, c *Client, n int, moved context.Context, open func(sctx context.Context, abort context.CancelCauseFunc, e *endpoint) error) error {
	if c.closed() {
		return ErrClosed
	}
	ctx, cancel := c.bind(ctx)
	defer cancel()
	e := c.eps[n]
	sctx, scancel := context.WithCancelCause(ctx)
	defer scancel(nil)
	stop := context.AfterFunc(moved, func() { scancel(errMoved) })
	defer stop()
	err := open(sctx, scancel, e)
	if err != nil && ctx.Err() == nil && sctx.Err() != nil {
		cause := context.Cause(sctx)
		err = fmt.Errorf("%w: stream from %s ended: %w", ErrUnavailable, e.url, cause)
		if errors.Is(cause, errMoved) {
			return err
		}
	} else {
		err = c.translate(err)
	}
	if len(c.eps) > 1 && ctx.Err() == nil && errors.Is(err, ErrUnavailable) {
		c.prefer((n+1)%len(c.eps), moved)
	}
	return err
}

func (c *Client) translate(err error) error {
	if err == nil {
		return nil
	}
	if c.closed() && errors.Is(err, context.Canceled) {
		return ErrClosed
	}
	return fromConnect(err)
}
