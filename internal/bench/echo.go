package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/internal/grpcbridge"
	"github.com/keyshard/keyshard/internal/store"
)

// echoService is the member API with nothing behind it: Join hands out a
// session, KeepAlive answers in the next batch (echoBatch), a Session
// stream sends one empty grants message and answers every keep-alive in
// the next batch, WatchGrants sends one empty grants message and waits. `keyshard bench echo` serves it
// for bench scale's live-floor scenario, whose simulated members are the
// live scenario's: the CPU and memory it takes are what HTTP/2 and
// connect alone cost for the live scenario's traffic, the floor under
// serve's figures.
type echoService struct {
	keyshardv1connect.UnimplementedMemberServiceHandler
	ttl      *durationpb.Duration
	sessions atomic.Int64
	batch    echoBatch
}

// echoBatch holds keep-alive answers back until the next batch goes, as
// serve answers keep-alives in batches (store.RenewBatchWindow): the first
// keep-alive of a batch waits that long, the others join it. Answers
// that go together leave in fewer writes than answers sent one by one,
// so the floor is measured with serve's pattern, not a costlier one.
type echoBatch struct {
	mu   sync.Mutex
	next chan struct{} // closed when the batch goes; nil: none waiting
}

// wait returns when the batch it joined goes.
func (b *echoBatch) wait(ctx context.Context) {
	b.mu.Lock()
	if b.next == nil {
		next := make(chan struct{})
		b.next = next
		time.AfterFunc(store.RenewBatchWindow, func() {
			b.mu.Lock()
			b.next = nil
			b.mu.Unlock()
			close(next)
		})
	}
	next := b.next
	b.mu.Unlock()
	select {
	case <-next:
	case <-ctx.Done():
	}
}

func (e *echoService) Join(_ context.Context, req *connect.Request[keyshardv1.JoinRequest]) (*connect.Response[keyshardv1.JoinResponse], error) {
	if req.Msg.GetKeyspace() == "" || req.Msg.GetMember().GetId() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("keyspace and member.id: both are needed"))
	}
	n := e.sessions.Add(1)
	return connect.NewResponse(&keyshardv1.JoinResponse{Session: "echo-" + strconv.FormatInt(n, 10), LeaseTtl: e.ttl}), nil
}

func (e *echoService) KeepAlive(ctx context.Context, req *connect.Request[keyshardv1.KeepAliveRequest]) (*connect.Response[keyshardv1.KeepAliveResponse], error) {
	if req.Msg.GetSession() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("session: missing"))
	}
	e.batch.wait(ctx)
	return connect.NewResponse(&keyshardv1.KeepAliveResponse{Ttl: e.ttl}), nil
}

func (e *echoService) WatchGrants(ctx context.Context, req *connect.Request[keyshardv1.WatchGrantsRequest], st *connect.ServerStream[keyshardv1.GetGrantsResponse]) error {
	if req.Msg.GetSession() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("session: missing"))
	}
	if err := st.Send(&keyshardv1.GetGrantsResponse{}); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

func (e *echoService) Session(ctx context.Context, st *connect.BidiStream[keyshardv1.SessionRequest, keyshardv1.SessionResponse]) error {
	return e.session(ctx, st)
}

// grpcSession serves a Session stream over gRPC in protobuf on grpc-go's
// stream, as serve does (grpcbridge.Options.Streams).
func (e *echoService) grpcSession(gs *grpcbridge.Stream) error {
	return e.session(gs.Context(), grpcEchoStream{gs})
}

// echoStream is a Session stream as the echo server uses it: connect's
// or grpc-go's.
type echoStream interface {
	Receive() (*keyshardv1.SessionRequest, error)
	Send(*keyshardv1.SessionResponse) error
}

type grpcEchoStream struct{ gs *grpcbridge.Stream }

func (s grpcEchoStream) Receive() (*keyshardv1.SessionRequest, error) {
	m := new(keyshardv1.SessionRequest)
	if err := s.gs.Receive(m, 0); err != nil {
		return nil, err
	}
	return m, nil
}

func (s grpcEchoStream) Send(m *keyshardv1.SessionResponse) error { return s.gs.Send(m) }

func (e *echoService) session(ctx context.Context, st echoStream) error {
	first, err := st.Receive()
	if err != nil {
		return err
	}
	if first.GetSession() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("session: missing in the first message"))
	}
	if err := st.Send(&keyshardv1.SessionResponse{Grants: &keyshardv1.GetGrantsResponse{}}); err != nil {
		return err
	}
	for msg := first; ; {
		if n := msg.GetKeepAlive(); n != 0 {
			e.batch.wait(ctx)
			if err := st.Send(&keyshardv1.SessionResponse{KeepAlive: &keyshardv1.KeepAliveAnswer{KeepAlive: n, Ttl: e.ttl}}); err != nil {
				return err
			}
		}
		if msg, err = st.Receive(); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// RunEcho serves the member API with nothing behind it (see
// echoService) on addr, as serve does (gRPC connections by grpc-go's
// HTTP/2 server through grpcbridge, Session streams in protobuf on
// grpc-go's stream, the other connections by net/http's: HTTP/1.1, and
// HTTP/2 with and without TLS's negotiation), until ctx ends:
// `keyshard bench echo`.
// Sessions have lease TTL ttl. It prints "listening <addr>" on out once
// it accepts connections.
func RunEcho(ctx context.Context, addr string, ttl time.Duration, out io.Writer) error {
	if ttl <= 0 {
		return fmt.Errorf("bench echo: lease TTL %v; want more than 0", ttl)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("bench echo: %w", err)
	}
	mux := http.NewServeMux()
	echo := &echoService{ttl: durationpb.New(ttl)}
	mux.Handle(keyshardv1connect.NewMemberServiceHandler(echo))
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetHTTP2(true)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, Protocols: protocols}
	grpcLn, httpLn := grpcbridge.Split(ln, grpcbridge.SplitOptions{})
	bridge := grpcbridge.New(mux, grpcbridge.Options{Streams: map[string]grpcbridge.StreamHandler{
		keyshardv1connect.MemberServiceSessionProcedure: echo.grpcSession,
	}})
	done := make(chan error, 2)
	go func() { done <- bridge.Serve(grpcLn) }() // exits when the listener closes
	go func() { done <- srv.Serve(httpLn) }()    // exits when the server closes
	running := 2
	err = nil
	if _, perr := fmt.Fprintf(out, "listening %s\n", ln.Addr()); perr != nil {
		err = fmt.Errorf("bench echo: print the address: %w", perr)
	} else {
		select {
		case <-ctx.Done():
		case serr := <-done:
			running--
			err = fmt.Errorf("bench echo: serve: %w", serr)
		}
	}
	srv.Close()
	bridge.Stop()
	for ; running > 0; running-- {
		<-done
	}
	return err
}
