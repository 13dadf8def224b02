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

// SharedOption is an option that Dial, NewWorker, NewRouter and
// NewHotKeys all take. Given to Dial it sets the default for the Routers,
// Workers and HotKeys of the Client.
type SharedOption interface {
	Option
	WorkerOption
	RouterOption
	HotKeysOption
}

type clientOptions struct {
	token  string
	hc     *http.Client
	tls    *tls.Config
	clock  clock.Clock
	log    *slog.Logger
	grpc   bool
	hcSet  bool
	tlsSet bool
}

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

func (s sharedOpt) applyHotKeys(o *hotKeysOptions) {
	if s.clock != nil {
		o.clock = s.clock
	}
	if s.log != nil {
		o.log = s.log
	}
}

// Clock sets the clock used for keep-alives, self-fencing, backoff,
// polling and hot-key reports (default: the system clock). Tests pass a
// *keyshardtest.FakeClock.
func Clock(c clock.Clock) SharedOption { return sharedOpt{clock: c} }

// Logger sets the logger (default: discard). Reconnects and retried
// failures are logged at Warn, session loss at Error.
func Logger(l *slog.Logger) SharedOption { return sharedOpt{log: l} }

// Client is a connection to a Keyshard server: the four services of
// keyshard.v1 behind one URL. It is safe for concurrent use. Routers,
// Workers and HotKeys built on it take their defaults from it; close them
// before the Client.
type Client struct {
	url    string
	opts   clientOptions
	authz  string
	admin  keyshardv1connect.AdminServiceClient
	member keyshardv1connect.MemberServiceClient
	maps   keyshardv1connect.MapServiceClient
	hot    keyshardv1connect.HotKeyServiceClient

	ctx       context.Context // cancelled by Close; every call is bound to it
	cancel    context.CancelFunc
	closeOnce sync.Once
	ownHTTP   *http.Transport // closed by Close when Dial made it
}

// Dial returns a Client for the server at url, such as
// "http://127.0.0.1:7400" or "https://keyshard.internal". It does no IO:
// an unreachable server shows up as ErrUnavailable on the first call. It
// returns an error wrapping ErrInvalid if url is not an absolute http or
// https URL or the options contradict each other.
func Dial(rawURL string, opts ...Option) (*Client, error) {
	var o clientOptions
	for _, opt := range opts {
		if opt != nil {
			opt.applyClient(&o)
		}
	}
	base, err := parseServerURL(rawURL)
	if err != nil {
		return nil, err
	}
	if o.hcSet && o.tlsSet {
		return nil, fmt.Errorf("%w: TLSConfig and HTTPClient both given; set TLS on the http.Client's transport", ErrInvalid)
	}
	if o.tlsSet && base.Scheme != "https" {
		return nil, fmt.Errorf("%w: TLSConfig given for %q; use an https:// URL", ErrInvalid, rawURL)
	}
	if strings.ContainsAny(o.token, "\r\n") {
		return nil, fmt.Errorf("%w: token contains a line break", ErrInvalid)
	}
	o.clock = clock.Or(o.clock)
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	c := &Client{url: strings.TrimSuffix(base.String(), "/"), opts: o}
	if o.token != "" {
		c.authz = "Bearer " + o.token
		if base.Scheme == "http" && !isLoopback(base.Hostname()) {
			o.log.Warn("keyshard: sending a bearer token over plain http", "url", c.url)
		}
	}
	hc := o.hc
	if hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		switch {
		case base.Scheme == "https":
			tr.TLSClientConfig = o.tls
		case o.grpc: // gRPC needs HTTP/2; without TLS that is h2c with prior knowledge
			tr.Protocols = new(http.Protocols)
			tr.Protocols.SetUnencryptedHTTP2(true)
		}
		c.ownHTTP = tr
		hc = &http.Client{Transport: tr}
	}
	var copts []connect.ClientOption
	if o.grpc {
		copts = append(copts, connect.WithGRPC())
	}
	c.admin = keyshardv1connect.NewAdminServiceClient(hc, c.url, copts...)
	c.member = keyshardv1connect.NewMemberServiceClient(hc, c.url, copts...)
	c.maps = keyshardv1connect.NewMapServiceClient(hc, c.url, copts...)
	c.hot = keyshardv1connect.NewHotKeyServiceClient(hc, c.url, copts...)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c, nil
}

func parseServerURL(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, fmt.Errorf("%w: server URL is empty; want for example http://127.0.0.1:7400", ErrInvalid)
	}
	if !strings.Contains(raw, "://") {
		return nil, fmt.Errorf("%w: server URL %q must start with http:// or https://, for example http://%s", ErrInvalid, raw, raw)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: server URL %q: %v", ErrInvalid, raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%w: server URL %q must start with http:// or https://, for example http://127.0.0.1:7400", ErrInvalid, raw)
	}
	if u.Host == "" || u.Hostname() == "" {
		return nil, fmt.Errorf("%w: server URL %q has no host", ErrInvalid, raw)
	}
	if u.User != nil {
		return nil, fmt.Errorf("%w: server URL %q carries user info; pass credentials with Token", ErrInvalid, raw)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		return nil, fmt.Errorf("%w: server URL %q must not have a query or fragment", ErrInvalid, raw)
	}
	return u, nil
}

func isLoopback(host string) bool {
	return host == "localhost" || strings.HasPrefix(host, "127.") || host == "::1"
}

// URL returns the server URL the Client calls, without a trailing slash.
func (c *Client) URL() string { return c.url }

// Admin returns the admin API of the Client.
func (c *Client) Admin() *Admin { return &Admin{c: c} }

// Close cancels the Client's calls in flight, including the streams of
// its Routers and Workers, and closes idle connections. Later calls
// return ErrClosed. Close the Client's Workers (which leave gracefully)
// and Routers first. Close is idempotent and returns nil.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.cancel()
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

// call makes one unary call and translates its error.
func call[Req, Res any](ctx context.Context, c *Client, f func(context.Context, *connect.Request[Req]) (*connect.Response[Res], error), req *Req) (*Res, error) {
	if c.closed() {
		return nil, ErrClosed
	}
	ctx, cancel := c.bind(ctx)
	defer cancel()
	resp, err := f(ctx, newRequest(c, req))
	if err != nil {
		return nil, c.translate(err)
	}
	return resp.Msg, nil
}

// stream opens a server stream and calls yield for every message until
// the stream ends or ctx is done. A stream the server ends cleanly returns
// nil.
func stream[Req, Res any](ctx context.Context, c *Client, f func(context.Context, *connect.Request[Req]) (*connect.ServerStreamForClient[Res], error), req *Req, yield func(*Res)) error {
	if c.closed() {
		return ErrClosed
	}
	ctx, cancel := c.bind(ctx)
	defer cancel()
	s, err := f(ctx, newRequest(c, req))
	if err != nil {
		return c.translate(err)
	}
	defer s.Close()
	for s.Receive() {
		yield(s.Msg())
	}
	return c.translate(s.Err())
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
