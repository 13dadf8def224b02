package grpcbridge

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	_ "google.golang.org/grpc/encoding/gzip" // requests a client compressed with gzip
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/proto"
)

// Options configure a Server.
type Options struct {
	// BaseContext ends every call's context when it ends, as
	// http.Server's BaseContext does: a shutdown ends long-lived streams
	// with it. Nil: context.Background().
	BaseContext context.Context
	// MaxConcurrentStreams a connection may open at once (0: 250, as
	// net/http's HTTP/2 server allows); a client opens another connection
	// for more.
	MaxConcurrentStreams uint32
	// MaxRecvMsgSize is the largest message a call may receive (0: no
	// limit beyond the handler's own). The handler's limits still apply.
	MaxRecvMsgSize int
	// Log gets a handler's panic. Nil: slog.Default().
	Log *slog.Logger
	// Streams serves the methods it names (full methods,
	// "/package.Service/Method") on grpc-go's stream itself rather than
	// through the http.Handler, when the call's messages are protobuf.
	// For long-lived streams held by many clients at once: a call on the
	// http.Handler keeps an http.Request and connect's stream state for
	// as long as it lasts, and a deeper stack. The handler must then do
	// what the http.Handler's middleware and interceptors do for the
	// method (tokens, limits).
	Streams map[string]StreamHandler
}

// Server serves gRPC calls with grpc-go's HTTP/2 server and hands each to
// an http.Handler (see the package's doc).
type Server struct {
	h       http.Handler
	base    context.Context
	log     *slog.Logger
	g       *grpc.Server
	streams map[string]StreamHandler
}

// New returns a Server handing every gRPC call it serves to h, which must
// speak the gRPC protocol (HTTP/2 framing of messages, grpc-status in the
// trailers): connect's handlers do.
func New(h http.Handler, o Options) *Server {
	s := &Server{h: h, base: o.BaseContext, log: o.Log, streams: o.Streams}
	if s.base == nil {
		s.base = context.Background()
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	streams := o.MaxConcurrentStreams
	if streams == 0 {
		streams = 250
	}
	most := o.MaxRecvMsgSize
	if most <= 0 {
		most = math.MaxInt32
	}
	s.g = grpc.NewServer(
		grpc.UnknownServiceHandler(s.handle),
		grpc.ForceServerCodecV2(rawCodec{}),
		grpc.InTapHandle(s.tap),
		grpc.MaxConcurrentStreams(streams),
		grpc.MaxRecvMsgSize(most),
		grpc.ReadBufferSize(readBufferSize),
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		// net/http answers every ping; a client's keep-alive pings are
		// answered here too, down to one a second.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
	)
	return s
}

// readBufferSize is how much of a connection grpc-go reads at most in one
// read: its default, 32 KB, is held by every connection for its whole
// life, about half of serve's memory for a member on a connection of its
// own (a fleet of separate processes). A member's messages are a few
// dozen bytes (keep-alives) to a few KB (a Release of many buckets); a
// longer frame's payload is read past the buffer, straight into the
// frame.
const readBufferSize = 4 << 10

// Flow-control windows of what a client sends, fixed. Left to grpc-go,
// they follow its estimate of the connection's bandwidth-delay product,
// which sends a window update and a ping each time data arrives after the
// previous ping's answer: about one per keep-alive, a read and a write
// more for serve on each (29 % fewer reads and 40 % fewer writes without
// them, at 2,000 members on shared connections). What a client sends is
// small; a 1 MB window per stream still lets a Release of 65,536 buckets
// through in one round trip.
const (
	streamWindow = 1 << 20
	connWindow   = 4 << 20
)

// Serve serves the connections ln accepts until ln closes or Stop.
func (s *Server) Serve(ln net.Listener) error {
	err := s.g.Serve(ln)
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// Shutdown stops accepting calls and waits for the running ones until ctx
// ends, then closes every connection. Long-lived streams end once
// BaseContext ends.
func (s *Server) Shutdown(ctx context.Context) error {
	done := make(chan struct{})
	go func() { s.g.GracefulStop(); close(done) }() // exits once every call ended, or Stop below
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.g.Stop()
		<-done
		return ctx.Err()
	}
}

// Stop closes every connection at once.
func (s *Server) Stop() { s.g.Stop() }

// call is one call's state shared by the transport's context and the
// handler: cutting the call short (the handler's read deadline) cancels
// the context its pending receive waits on.
type call struct {
	cancel context.CancelFunc
	cut    atomic.Bool // the handler set a read deadline that passed
	stop   func() bool // ends the BaseContext registration

	mu    sync.Mutex
	timer *time.Timer // a read deadline in the future
}

type callKey struct{}

// tap gives every call a context of its own to cancel: grpc-go's
// receive waits on it, so cancelling it ends a pending receive, the only
// way to end one. It runs on the connection's reader, under its lock.
func (s *Server) tap(ctx context.Context, _ *tap.Info) (context.Context, error) {
	c := &call{}
	ctx, c.cancel = context.WithCancel(ctx)
	c.stop = context.AfterFunc(s.base, c.cancel)
	return context.WithValue(ctx, callKey{}, c), nil
}

func (c *call) cutNow() {
	c.cut.Store(true)
	c.cancel()
}

// handle serves one call: it builds the http.Request and ResponseWriter
// the handler sees, and turns the trailers the handler wrote into the
// call's status.
func (s *Server) handle(_ any, ss grpc.ServerStream) (err error) {
	ctx := ss.Context()
	c, _ := ctx.Value(callKey{}).(*call)
	if c == nil { // every call goes through tap
		return status.Error(codes.Internal, "grpcbridge: a call without its context")
	}
	defer c.stop()
	defer c.cancel()
	method, ok := grpc.MethodFromServerStream(ss)
	if !ok {
		return status.Error(codes.Internal, "grpcbridge: a call without a method")
	}
	if h := s.streams[method]; h != nil && protoCodec(ctx) {
		return s.native(h, &Stream{ss: ss, c: c, method: method})
	}
	md, _ := metadata.FromIncomingContext(ctx)
	r, rerr := http.NewRequestWithContext(ctx, http.MethodPost, method, &body{ss: ss, c: c})
	if rerr != nil {
		return status.Errorf(codes.Unimplemented, "method %q: %v", method, rerr)
	}
	r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/2.0", 2, 0
	r.RequestURI = method
	r.ContentLength = -1
	r.Header = requestHeader(md)
	if a := md[":authority"]; len(a) > 0 {
		r.Host = a[0]
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		r.RemoteAddr = p.Addr.String()
	}
	w := &writer{ss: ss, c: c, header: make(http.Header)}
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler {
				s.log.Error("grpcbridge: the handler panicked", "method", method, "panic", fmt.Sprint(p))
			}
			err = status.Error(codes.Internal, "the server failed serving the call")
		}
	}()
	s.h.ServeHTTP(w, r)
	return w.finish()
}

// requestHeader makes the request's header from the call's metadata.
// grpc-accept-encoding stays out: the handler then sends its messages
// uncompressed, and grpc-go frames them as they are.
func requestHeader(md metadata.MD) http.Header {
	h := make(http.Header, len(md)+1)
	for k, vs := range md {
		if strings.HasPrefix(k, ":") || strings.HasPrefix(k, "grpc-") {
			continue
		}
		key := http.CanonicalHeaderKey(k)
		if strings.HasSuffix(k, "-bin") { // grpc-go decoded them
			for _, v := range vs {
				h.Add(key, connect.EncodeBinaryHeader([]byte(v)))
			}
			continue
		}
		h[key] = vs
	}
	if h.Get("Content-Type") == "" {
		h.Set("Content-Type", "application/grpc")
	}
	h.Set("Te", "trailers")
	return h
}

// body is the request body: the messages the client sends, each framed
// as gRPC frames them on the wire (a flag byte and a length).
type body struct {
	ss  grpc.ServerStream
	c   *call
	buf []byte // the rest of the message being read
	err error  // after the last message
}

func (b *body) Read(p []byte) (int, error) {
	for len(b.buf) == 0 {
		if b.err != nil {
			return 0, b.err
		}
		var f frame
		if err := b.ss.RecvMsg(&f); err != nil {
			switch {
			case errors.Is(err, io.EOF):
				b.err = io.EOF
			case b.c.cut.Load():
				b.err = os.ErrDeadlineExceeded // as net/http's body reports a read deadline
			default:
				b.err = err
			}
			continue
		}
		b.buf = f.data
	}
	n := copy(p, b.buf)
	b.buf = b.buf[n:]
	return n, nil
}

func (b *body) Close() error { return nil }

// writer is the call's http.ResponseWriter: it sends each whole message
// the handler writes, and keeps the trailers for finish.
type writer struct {
	ss     grpc.ServerStream
	c      *call
	header http.Header
	code   int    // the HTTP status; 0 until the handler writes
	sent   bool   // the header metadata went
	pend   []byte // a message not yet whole
	errMsg []byte // the start of a non-200 response's body
	err    error  // a send failed: the call is over
}

func (w *writer) Header() http.Header { return w.header }

func (w *writer) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}

// Flush: every whole message already went.
func (w *writer) Flush() {}

func (w *writer) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	if w.code != http.StatusOK {
		if room := 512 - len(w.errMsg); room > 0 {
			w.errMsg = append(w.errMsg, p[:min(room, len(p))]...)
		}
		return len(p), nil
	}
	if w.err != nil {
		return 0, w.err
	}
	if !w.sent {
		w.sent = true
		if md := responseMD(w.header); len(md) > 0 {
			if err := w.ss.SetHeader(md); err != nil {
				w.err = err
				return 0, err
			}
		}
	}
	src := p
	if len(w.pend) > 0 {
		src = append(w.pend, p...)
	}
	for len(src) >= 5 {
		n := binary.BigEndian.Uint32(src[1:5])
		if uint64(len(src)-5) < uint64(n) {
			break
		}
		if src[0] != 0 {
			w.err = status.Error(codes.Internal, "grpcbridge: the handler sent a compressed or unknown frame")
			return 0, w.err
		}
		// grpc-go may write the message after SendMsg returns: it gets a
		// copy, the handler reuses its buffer.
		msg := make([]byte, n)
		copy(msg, src[5:5+n])
		src = src[5+n:]
		if err := w.ss.SendMsg(&frame{data: msg}); err != nil {
			w.err = err
			return 0, err
		}
	}
	w.pend = append(w.pend[:0], src...)
	if len(w.pend) == 0 {
		w.pend = nil
	}
	return len(p), nil
}

// SetReadDeadline cuts the call's pending and later receives short once
// t passes (http.ResponseController): the handler's read fails with
// os.ErrDeadlineExceeded, as with net/http. Unlike net/http's, it also
// ends the request's context, and the call ends CANCELED whatever the
// handler returns then: grpc-go ends a pending receive no other way, and
// writes that status itself when it does. A client learns why on its
// next call.
func (w *writer) SetReadDeadline(t time.Time) error {
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	if w.c.timer != nil {
		w.c.timer.Stop()
		w.c.timer = nil
	}
	if t.IsZero() {
		return nil
	}
	if d := time.Until(t); d > 0 {
		w.c.timer = time.AfterFunc(d, w.c.cutNow)
		return nil
	}
	w.c.cutNow()
	return nil
}

// finish turns what the handler wrote into the call's end: its trailers'
// grpc-status, grpc-message and details, or, for a response that is not
// gRPC (an HTTP error), the code gRPC gives that HTTP status.
func (w *writer) finish() error {
	w.c.mu.Lock()
	if w.c.timer != nil {
		w.c.timer.Stop()
	}
	w.c.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	if w.code != 0 && w.code != http.StatusOK {
		msg := strings.TrimSpace(string(w.errMsg))
		if msg == "" {
			msg = http.StatusText(w.code)
		}
		return status.Errorf(httpCode(w.code), "HTTP %d: %s", w.code, msg)
	}
	if len(w.pend) > 0 {
		return status.Errorf(codes.Internal, "grpcbridge: the handler ended within a message (%d bytes)", len(w.pend))
	}
	trailer := make(http.Header)
	for k, vs := range w.header {
		if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok {
			trailer[http.CanonicalHeaderKey(name)] = vs
		}
	}
	if trailer.Get("Grpc-Status") == "" && w.header.Get("Grpc-Status") != "" { // trailers-only, in the header
		for k, vs := range w.header {
			trailer[k] = vs
		}
	}
	if !w.sent {
		if md := responseMD(w.header); len(md) > 0 {
			_ = w.ss.SetHeader(md) // fails only once the header went
		}
	}
	if md := responseMD(trailer); len(md) > 0 {
		w.ss.SetTrailer(md)
	}
	raw := trailer.Get("Grpc-Status")
	if raw == "" {
		return status.Error(codes.Unknown, "grpcbridge: the handler ended without a gRPC status")
	}
	code, err := strconv.ParseUint(raw, 10, 32)
	if err != nil {
		return status.Errorf(codes.Unknown, "grpcbridge: the handler's grpc-status %q is not a number", raw)
	}
	if code == 0 {
		return nil
	}
	if bin := trailer.Get("Grpc-Status-Details-Bin"); bin != "" {
		if b, err := connect.DecodeBinaryHeader(bin); err == nil {
			p := new(spb.Status)
			if proto.Unmarshal(b, p) == nil && p.GetCode() == int32(code) {
				return status.FromProto(p).Err()
			}
		}
	}
	msg := trailer.Get("Grpc-Message")
	if m, err := url.PathUnescape(msg); err == nil {
		msg = m
	}
	return status.Error(codes.Code(code), msg)
}

// responseMD is the metadata grpc-go sends for header h: what the handler
// set, less what grpc-go writes itself.
func responseMD(h http.Header) metadata.MD {
	var md metadata.MD
	for k, vs := range h {
		lk := strings.ToLower(k)
		switch {
		case strings.HasPrefix(k, http.TrailerPrefix), strings.HasPrefix(lk, "grpc-"),
			lk == "content-type", lk == "content-length", lk == "trailer", lk == "te",
			lk == "connection", lk == "transfer-encoding", lk == "date":
			continue
		}
		if md == nil {
			md = make(metadata.MD, len(h))
		}
		if strings.HasSuffix(lk, "-bin") {
			for _, v := range vs {
				if b, err := connect.DecodeBinaryHeader(v); err == nil {
					md[lk] = append(md[lk], string(b))
				}
			}
			continue
		}
		md[lk] = append(md[lk], vs...)
	}
	return md
}

// httpCode is the code gRPC gives a response's HTTP status when it is not
// a gRPC response (the gRPC spec's HTTP-to-gRPC mapping).
func httpCode(s int) codes.Code {
	switch s {
	case http.StatusBadRequest:
		return codes.Internal
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusNotFound:
		return codes.Unimplemented
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return codes.Unavailable
	default:
		return codes.Unknown
	}
}

// frame is one message as the handler reads and writes it: with the
// 5-byte gRPC prefix when received, without it when sent.
type frame struct{ data []byte }

// rawCodec hands messages through as bytes: the handler decodes and
// encodes them itself.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(*frame)
	if !ok {
		return nil, fmt.Errorf("grpcbridge: cannot send a %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(f.data)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return fmt.Errorf("grpcbridge: cannot receive into a %T", v)
	}
	n := data.Len()
	f.data = make([]byte, 5+n)
	binary.BigEndian.PutUint32(f.data[1:5], uint32(n))
	data.CopyTo(f.data[5:])
	return nil
}

func (rawCodec) Name() string { return "proto" }
