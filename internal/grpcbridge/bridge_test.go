package grpcbridge

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
)

// testService is a connect handler of the member API whose answers tell
// which server served them: "bridge" when the call came through a
// Server, "http" when through the http.Server.
type testService struct {
	keyshardv1connect.UnimplementedMemberServiceHandler
	panics   atomic.Int64
	recvErrs chan error
}

func servedBy(ctx context.Context) string {
	if ctx.Value(callKey{}) != nil {
		return "bridge"
	}
	return "http"
}

type writerKey struct{}

func (*testService) Join(ctx context.Context, req *connect.Request[keyshardv1.JoinRequest]) (*connect.Response[keyshardv1.JoinResponse], error) {
	if req.Msg.GetKeyspace() == "fail" {
		err := connect.NewError(connect.CodeFailedPrecondition, errors.New("keyspace fail: refused, 100% on purpose"))
		if d, derr := connect.NewErrorDetail(&keyshardv1.Member{Id: "detail"}); derr == nil {
			err.AddDetail(d)
		}
		err.Meta().Set("X-Why", "asked")
		return nil, err
	}
	res := connect.NewResponse(&keyshardv1.JoinResponse{Session: servedBy(ctx) + ":" + req.Msg.GetMember().GetId()})
	res.Header().Set("X-Served-By", servedBy(ctx))
	res.Header().Set("X-Token-Seen", req.Header().Get("X-Token"))
	if raw := req.Header().Get("X-Raw-Bin"); raw != "" {
		b, err := connect.DecodeBinaryHeader(raw)
		if err != nil {
			return nil, connect.NewError(connect.CodeInvalidArgument, err)
		}
		res.Trailer().Set("X-Raw-Len-Bin", connect.EncodeBinaryHeader([]byte{byte(len(b))}))
	}
	res.Trailer().Set("X-Done", "yes")
	return res, nil
}

func (s *testService) KeepAlive(ctx context.Context, req *connect.Request[keyshardv1.KeepAliveRequest]) (*connect.Response[keyshardv1.KeepAliveResponse], error) {
	if req.Msg.GetSession() == "panic" {
		s.panics.Add(1)
		panic("the handler fails")
	}
	return connect.NewResponse(&keyshardv1.KeepAliveResponse{}), nil
}

// Session answers every keep-alive n with n. Keep-alive 99 asks it to cut
// its own next receive short, through the read deadline, from another
// goroutine, as serve's Session does when a session ends. The error that
// ends a receive goes to s.recvErrs.
func (s *testService) Session(ctx context.Context, st *connect.BidiStream[keyshardv1.SessionRequest, keyshardv1.SessionResponse]) error {
	w, _ := ctx.Value(writerKey{}).(http.ResponseWriter)
	for {
		msg, err := st.Receive()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			s.recvErrs <- err
			return connect.NewError(connect.CodeAborted, errors.New("receive failed"))
		}
		n := msg.GetKeepAlive()
		if err := st.Send(&keyshardv1.SessionResponse{KeepAlive: &keyshardv1.KeepAliveAnswer{KeepAlive: n, ErrorMessage: servedBy(ctx)}}); err != nil {
			return err
		}
		if n == 99 {
			go func() { _ = http.NewResponseController(w).SetReadDeadline(time.Unix(1, 0)) }() // exits at once
		}
	}
}

type harness struct {
	url    string
	svc    *testService
	base   context.CancelFunc
	routed [2]atomic.Int64 // [0] http, [1] bridge
}

// start serves testService on loopback as serve does: Split, a Server for
// the gRPC connections, an http.Server (HTTP/1.1 and h2c) for the others.
func start(t *testing.T) *harness {
	t.Helper()
	return startWith(t, nil)
}

// startWith is start with streams served on grpc-go's stream
// (Options.Streams).
func startWith(t *testing.T, streams map[string]StreamHandler) *harness {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{url: "http://" + ln.Addr().String(), svc: &testService{recvErrs: make(chan error, 1)}}
	mux := http.NewServeMux()
	mux.Handle(keyshardv1connect.NewMemberServiceHandler(h.svc))
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), writerKey{}, w)))
	})
	base, cancel := context.WithCancel(context.Background())
	h.base = cancel
	grpcLn, httpLn := Split(ln, SplitOptions{OnRoute: func(toGRPC bool) {
		if toGRPC {
			h.routed[1].Add(1)
		} else {
			h.routed[0].Add(1)
		}
	}})
	b := New(handler, Options{BaseContext: base, Streams: streams})
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	hs := &http.Server{Handler: handler, Protocols: p, BaseContext: func(net.Listener) context.Context { return base }}
	bdone, hdone := make(chan error, 1), make(chan error, 1)
	go func() { bdone <- b.Serve(grpcLn) }()  // exits when the listener closes
	go func() { hdone <- hs.Serve(httpLn) }() // exits when the listener closes
	t.Cleanup(func() {
		cancel()
		hs.Close()
		b.Stop()
		if err := <-bdone; err != nil && !errors.Is(err, net.ErrClosed) {
			t.Errorf("bridge Serve: %v", err)
		}
		if err := <-hdone; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("http Serve: %v", err)
		}
	})
	return h
}

// grpcGoClient is a grpc-go client of h, closed when the test ends.
func (h *harness) grpcGoClient(t *testing.T) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(strings.TrimPrefix(h.url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func h2cClient() *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: tr}
}

func TestEachProtocolGoesToItsServer(t *testing.T) {
	h := start(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		hc   *http.Client
		opts []connect.ClientOption
		want string
	}{
		{"gRPC over h2c", h2cClient(), []connect.ClientOption{connect.WithGRPC()}, "bridge"},
		{"Connect over h2c", h2cClient(), nil, "http"},
		{"Connect over HTTP/1.1", &http.Client{}, nil, "http"},
		{"gRPC-Web over h2c", h2cClient(), []connect.ClientOption{connect.WithGRPCWeb()}, "http"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := keyshardv1connect.NewMemberServiceClient(tc.hc, h.url, tc.opts...)
			req := connect.NewRequest(&keyshardv1.JoinRequest{Keyspace: "ks", Member: &keyshardv1.Member{Id: "m1"}})
			req.Header().Set("X-Token", "t0k")
			res, err := c.Join(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Msg.GetSession(); got != tc.want+":m1" {
				t.Errorf("session %q; want %q", got, tc.want+":m1")
			}
			if got := res.Header().Get("X-Served-By"); got != tc.want {
				t.Errorf("header X-Served-By %q; want %q", got, tc.want)
			}
			if got := res.Header().Get("X-Token-Seen"); got != "t0k" {
				t.Errorf("the handler saw X-Token %q; want t0k", got)
			}
			if got := res.Trailer().Get("X-Done"); got != "yes" {
				t.Errorf("trailer X-Done %q; want yes", got)
			}
			// Errors keep their code, message, details and metadata.
			_, err = c.Join(ctx, connect.NewRequest(&keyshardv1.JoinRequest{Keyspace: "fail"}))
			var ce *connect.Error
			if !errors.As(err, &ce) || ce.Code() != connect.CodeFailedPrecondition || ce.Message() != "keyspace fail: refused, 100% on purpose" {
				t.Fatalf("error %v; want failed_precondition with the handler's message", err)
			}
			if got := ce.Meta().Get("X-Why"); got != "asked" {
				t.Errorf("error metadata X-Why %q; want asked", got)
			}
			if ds := ce.Details(); len(ds) != 1 {
				t.Errorf("error details %v; want one", ds)
			} else if m, err := ds[0].Value(); err != nil || m.(*keyshardv1.Member).GetId() != "detail" {
				t.Errorf("error detail %v (%v); want member detail", m, err)
			}
			tc.hc.CloseIdleConnections()
		})
	}
	if got := h.routed[1].Load(); got != 1 {
		t.Errorf("%d connections went to the bridge; want 1", got)
	}
}

// TestGRPCGoClient: grpc-go's client waits for the server's SETTINGS
// before its first request; Split sends them.
func TestGRPCGoClient(t *testing.T) {
	h := start(t)
	cc := h.grpcGoClient(t)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-token", "abc", "x-raw-bin", string([]byte{0, 1, 2}))
	var header, trailer metadata.MD
	out := new(keyshardv1.JoinResponse)
	if err := cc.Invoke(ctx, keyshardv1connect.MemberServiceJoinProcedure, &keyshardv1.JoinRequest{Keyspace: "ks", Member: &keyshardv1.Member{Id: "g"}}, out, grpc.Header(&header), grpc.Trailer(&trailer)); err != nil {
		t.Fatal(err)
	}
	if out.GetSession() != "bridge:g" {
		t.Errorf("session %q; want bridge:g", out.GetSession())
	}
	if got := header.Get("x-token-seen"); len(got) != 1 || got[0] != "abc" {
		t.Errorf("header x-token-seen %q; want abc", got)
	}
	if got := trailer.Get("x-raw-len-bin"); len(got) != 1 || got[0] != "\x03" {
		t.Errorf("trailer x-raw-len-bin %q; want one byte, 3", got)
	}
	err := cc.Invoke(context.Background(), keyshardv1connect.MemberServiceJoinProcedure, &keyshardv1.JoinRequest{Keyspace: "fail"}, out)
	st, _ := status.FromError(err)
	if st.Code() != codes.FailedPrecondition || st.Message() != "keyspace fail: refused, 100% on purpose" {
		t.Fatalf("status %v; want FailedPrecondition with the handler's message", st)
	}
	if ds := st.Details(); len(ds) != 1 || !proto.Equal(ds[0].(proto.Message), &keyshardv1.Member{Id: "detail"}) {
		t.Errorf("status details %v; want the member detail", ds)
	}
	err = cc.Invoke(context.Background(), "/keyshard.v1.NoService/Nothing", &keyshardv1.JoinRequest{}, out)
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("unknown method: %v; want Unimplemented", err)
	}
}

func TestSessionStream(t *testing.T) {
	h := start(t)
	c := keyshardv1connect.NewMemberServiceClient(h2cClient(), h.url, connect.WithGRPC())
	st := c.Session(context.Background())
	for n := uint64(1); n <= 3; n++ {
		if err := st.Send(&keyshardv1.SessionRequest{Session: "s", KeepAlive: n}); err != nil {
			t.Fatal(err)
		}
		res, err := st.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if a := res.GetKeepAlive(); a.GetKeepAlive() != n || a.GetErrorMessage() != "bridge" {
			t.Fatalf("answer %v; want keep-alive %d from the bridge", a, n)
		}
	}
	if err := st.CloseRequest(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Receive(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the member ended its messages: %v; want the stream's end", err)
	}
	if err := st.CloseResponse(); err != nil {
		t.Fatal(err)
	}
}

// TestReadDeadlineEndsReceive: a handler cuts its own pending receive
// short through the read deadline, as serve's Session does when its
// session ends; the receive fails with os.ErrDeadlineExceeded, as with
// net/http, and the call ends CANCELED (see writer.SetReadDeadline).
func TestReadDeadlineEndsReceive(t *testing.T) {
	h := start(t)
	c := keyshardv1connect.NewMemberServiceClient(h2cClient(), h.url, connect.WithGRPC())
	st := c.Session(context.Background())
	defer st.CloseResponse()
	if err := st.Send(&keyshardv1.SessionRequest{Session: "s", KeepAlive: 99}); err != nil {
		t.Fatal(err)
	}
	if res, err := st.Receive(); err != nil || res.GetKeepAlive().GetKeepAlive() != 99 {
		t.Fatalf("answer %v, %v; want keep-alive 99", res, err)
	}
	// The handler now waits for a message that never comes, until its
	// read deadline cuts the wait.
	if err := <-h.svc.recvErrs; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the handler's receive failed with %v; want os.ErrDeadlineExceeded", err)
	}
	if _, err := st.Receive(); connect.CodeOf(err) != connect.CodeCanceled {
		t.Fatalf("stream ended with %v; want canceled", err)
	}
}

// TestBaseContextEndsStreams: when the base context ends (serve's
// shutdown), a stream waiting for the client's next message ends.
func TestBaseContextEndsStreams(t *testing.T) {
	h := start(t)
	c := keyshardv1connect.NewMemberServiceClient(h2cClient(), h.url, connect.WithGRPC())
	st := c.Session(context.Background())
	defer st.CloseResponse()
	if err := st.Send(&keyshardv1.SessionRequest{Session: "s", KeepAlive: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Receive(); err != nil {
		t.Fatal(err)
	}
	h.base()
	if err := <-h.svc.recvErrs; connect.CodeOf(err) != connect.CodeCanceled {
		t.Errorf("the handler's receive failed with %v; want canceled", err)
	}
	if _, err := st.Receive(); connect.CodeOf(err) != connect.CodeCanceled {
		t.Fatalf("stream ended with %v; want canceled", err)
	}
}

func TestPanicIsInternal(t *testing.T) {
	h := start(t)
	c := keyshardv1connect.NewMemberServiceClient(h2cClient(), h.url, connect.WithGRPC())
	_, err := c.KeepAlive(context.Background(), connect.NewRequest(&keyshardv1.KeepAliveRequest{Session: "panic"}))
	if connect.CodeOf(err) != connect.CodeInternal || h.svc.panics.Load() != 1 {
		t.Fatalf("a panicking handler: %v (%d panics); want internal", err, h.svc.panics.Load())
	}
	if _, err := c.KeepAlive(context.Background(), connect.NewRequest(&keyshardv1.KeepAliveRequest{Session: "s"})); err != nil {
		t.Fatalf("the call after a panic: %v", err)
	}
}

// TestOneProtocolPerConnection: a connection's requests go where its first
// went. After a Connect request first, gRPC is served too (net/http
// serves both); after gRPC first, a Connect request fails instead of
// hanging.
func TestOneProtocolPerConnection(t *testing.T) {
	h := start(t)
	ctx := context.Background()
	join := connect.NewRequest(&keyshardv1.JoinRequest{Keyspace: "ks", Member: &keyshardv1.Member{Id: "m"}})

	hc := h2cClient()
	if _, err := keyshardv1connect.NewMemberServiceClient(hc, h.url).Join(ctx, join); err != nil {
		t.Fatal(err)
	}
	res, err := keyshardv1connect.NewMemberServiceClient(hc, h.url, connect.WithGRPC()).Join(ctx, join)
	if err != nil || res.Msg.GetSession() != "http:m" {
		t.Fatalf("gRPC after Connect on one connection: %v, %v; want served by http", res, err)
	}

	hc = h2cClient()
	if _, err := keyshardv1connect.NewMemberServiceClient(hc, h.url, connect.WithGRPC()).Join(ctx, join); err != nil {
		t.Fatal(err)
	}
	if _, err := keyshardv1connect.NewMemberServiceClient(hc, h.url).Join(ctx, join); err == nil {
		t.Fatal("Connect after gRPC on one connection succeeded; want an error")
	}
}

func TestAckFilterDropsTheFirstSettingsAck(t *testing.T) {
	frame := func(typ, flags byte, payload ...byte) []byte {
		return append([]byte{0, 0, byte(len(payload)), typ, flags, 0, 0, 0, 0}, payload...)
	}
	var in, want bytes.Buffer
	for _, part := range []struct {
		b    []byte
		pass bool
	}{
		{[]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), true},
		{frame(0x4, 0), true},                         // the client's SETTINGS
		{frame(0x8, 0, 0, 0, 0x10, 0), true},          // WINDOW_UPDATE
		{frame(0x0, 0x1, 0x4, 0x1, 0x0, 0x1), true},   // DATA whose payload looks like an ack
		{frame(0x4, 0x1), false},                      // the ack of Split's SETTINGS
		{frame(0x4, 0x1), true},                       // the ack of the server's own
		{frame(0x6, 0, 1, 2, 3, 4, 5, 6, 7, 8), true}, // PING
	} {
		in.Write(part.b)
		if part.pass {
			want.Write(part.b)
		}
	}
	// Read in small pieces, as a connection may deliver them.
	f := &ackFilter{r: &in, preface: 24}
	var got bytes.Buffer
	buf := make([]byte, 7)
	for {
		n, err := f.Read(buf)
		got.Write(buf[:n])
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatalf("filtered:\n%x\nwant:\n%x", got.Bytes(), want.Bytes())
	}
}

// flakyListener fails its first Accept as a process out of file
// descriptors would.
type flakyListener struct {
	net.Listener
	failed atomic.Bool
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.failed.CompareAndSwap(false, true) {
		return nil, errors.New("accept: too many open files")
	}
	return l.Listener.Accept()
}

// TestSplitOutlivesAcceptErrors: a failed Accept does not close the
// listener; Split goes on accepting, as net/http's server does.
func TestSplitOutlivesAcceptErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &flakyListener{Listener: ln}
	_, httpLn := Split(fl, SplitOptions{})
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })}
	done := make(chan error, 1)
	go func() { done <- hs.Serve(httpLn) }() // exits when the listener closes
	defer func() {
		hs.Close()
		<-done
	}()
	res, err := http.Get("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if string(body) != "ok" || !fl.failed.Load() {
		t.Fatalf("answer %q after a failed Accept (failed: %v); want ok", body, fl.failed.Load())
	}
}
