package grpcbridge

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"connectrpc.com/connect"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
)

// nativeSession serves Session on grpc-go's stream: it answers keep-alive
// n with n and "native:" and the token the call carried; keep-alive 7
// ends the call with a connect error carrying a detail and metadata; 99
// cuts its own next receive short, from another goroutine; 66 panics.
// Messages over 64 bytes are refused. The error that ends a receive goes
// to recvErrs.
type nativeSession struct {
	recvErrs chan error
}

func (n *nativeSession) serve(s *Stream) error {
	if s.Method() != keyshardv1connect.MemberServiceSessionProcedure {
		return errors.New("wrong method " + s.Method())
	}
	token := s.Header().Get("X-Token")
	for {
		var msg keyshardv1.SessionRequest
		err := s.Receive(&msg, 64)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			n.recvErrs <- err
			return connect.NewError(connect.CodeAborted, errors.New("receive failed"))
		}
		k := msg.GetKeepAlive()
		switch k {
		case 7:
			cerr := connect.NewError(connect.CodeFailedPrecondition, errors.New("keep-alive 7: refused, 100% on purpose"))
			if d, derr := connect.NewErrorDetail(&keyshardv1.Member{Id: "detail"}); derr == nil {
				cerr.AddDetail(d)
			}
			cerr.Meta().Set("X-Why", "asked")
			return cerr
		case 66:
			panic("the stream handler fails")
		}
		if err := s.Send(&keyshardv1.SessionResponse{KeepAlive: &keyshardv1.KeepAliveAnswer{KeepAlive: k, ErrorMessage: "native:" + token}}); err != nil {
			return err
		}
		if k == 99 {
			go s.Cut() // exits at once
		}
	}
}

func startNative(t *testing.T) (*harness, *nativeSession) {
	t.Helper()
	n := &nativeSession{recvErrs: make(chan error, 1)}
	h := startWith(t, map[string]StreamHandler{keyshardv1connect.MemberServiceSessionProcedure: n.serve})
	return h, n
}

func nativeClient(h *harness, opts ...connect.ClientOption) keyshardv1connect.MemberServiceClient {
	return keyshardv1connect.NewMemberServiceClient(h2cClient(), h.url, append([]connect.ClientOption{connect.WithGRPC()}, opts...)...)
}

// TestNativeStream: a gRPC call in protobuf of a method in Streams goes
// to its StreamHandler, which sees the call's metadata and reads even a
// message the client compressed; the client's half-close ends the call
// OK. Other methods on the same connection go to the http.Handler.
func TestNativeStream(t *testing.T) {
	h, _ := startNative(t)
	ctx := context.Background()
	c := nativeClient(h, connect.WithSendGzip())
	st := c.Session(ctx)
	st.RequestHeader().Set("X-Token", "t0k")
	for k := uint64(1); k <= 3; k++ {
		if err := st.Send(&keyshardv1.SessionRequest{Session: "s", KeepAlive: k}); err != nil {
			t.Fatal(err)
		}
		got, err := st.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if got.GetKeepAlive().GetKeepAlive() != k || got.GetKeepAlive().GetErrorMessage() != "native:t0k" {
			t.Fatalf("answer %v; want keep-alive %d from the stream handler, with the token", got, k)
		}
	}
	if err := st.CloseRequest(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Receive(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the half-close: %v; want the call's clean end", err)
	}
	if err := st.CloseResponse(); err != nil {
		t.Fatal(err)
	}
	res, err := c.Join(ctx, connect.NewRequest(&keyshardv1.JoinRequest{Member: &keyshardv1.Member{Id: "m"}}))
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Msg.GetSession(); got != "bridge:m" {
		t.Errorf("Join served as %q; want the http.Handler through the bridge", got)
	}
}

// TestNativeStreamJSONGoesToHandler: a call of the same method in another
// codec (gRPC with JSON) is the http.Handler's, which knows every codec.
func TestNativeStreamJSONGoesToHandler(t *testing.T) {
	h, _ := startNative(t)
	st := nativeClient(h, connect.WithProtoJSON()).Session(context.Background())
	t.Cleanup(func() { _ = st.CloseRequest(); _ = st.CloseResponse() })
	if err := st.Send(&keyshardv1.SessionRequest{Session: "s", KeepAlive: 1}); err != nil {
		t.Fatal(err)
	}
	got, err := st.Receive()
	if err != nil {
		t.Fatal(err)
	}
	if got.GetKeepAlive().GetErrorMessage() != "bridge" {
		t.Fatalf("answer %v; want the http.Handler's through the bridge", got)
	}
}

// TestNativeStreamErrors: a connect error a StreamHandler returns reaches
// the client whole (code, message, detail, metadata), as connect's
// handler would send it; a panic ends the call INTERNAL and the server
// goes on.
func TestNativeStreamErrors(t *testing.T) {
	h, _ := startNative(t)
	c := nativeClient(h)
	for _, tc := range []struct {
		keepAlive uint64
		code      connect.Code
		msg       string
	}{
		{7, connect.CodeFailedPrecondition, "keep-alive 7: refused, 100% on purpose"},
		{66, connect.CodeInternal, "the server failed serving the call"},
	} {
		st := c.Session(context.Background())
		if err := st.Send(&keyshardv1.SessionRequest{KeepAlive: tc.keepAlive}); err != nil {
			t.Fatal(err)
		}
		_, err := st.Receive()
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != tc.code || ce.Message() != tc.msg {
			t.Fatalf("keep-alive %d ended the call with %v; want %v %q", tc.keepAlive, err, tc.code, tc.msg)
		}
		if tc.keepAlive == 7 {
			if got := ce.Meta().Get("X-Why"); got != "asked" {
				t.Errorf("trailer X-Why %q; want the handler's", got)
			}
			ds := ce.Details()
			if len(ds) != 1 {
				t.Fatalf("details %v; want the handler's one", ds)
			}
			v, err := ds[0].Value()
			if m, ok := v.(*keyshardv1.Member); err != nil || !ok || m.GetId() != "detail" {
				t.Errorf("detail %v, %v; want the handler's Member", v, err)
			}
		}
		_ = st.CloseResponse()
	}
}

// TestNativeStreamCut: Cut ends the handler's pending receive with
// os.ErrDeadlineExceeded, and the call ends CANCELED.
func TestNativeStreamCut(t *testing.T) {
	h, n := startNative(t)
	st := nativeClient(h).Session(context.Background())
	t.Cleanup(func() { _ = st.CloseRequest(); _ = st.CloseResponse() })
	if err := st.Send(&keyshardv1.SessionRequest{KeepAlive: 99}); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Receive(); err != nil || got.GetKeepAlive().GetKeepAlive() != 99 {
		t.Fatalf("answer %v, %v; want 99's", got, err)
	}
	if err := <-n.recvErrs; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the cut receive failed with %v; want os.ErrDeadlineExceeded", err)
	}
	if _, err := st.Receive(); connect.CodeOf(err) != connect.CodeCanceled {
		t.Fatalf("the cut call ended with %v; want CANCELED", err)
	}
}

// TestNativeStreamTooLarge: a message over the handler's limit is refused
// by Receive with its size, before it is decoded.
func TestNativeStreamTooLarge(t *testing.T) {
	h, n := startNative(t)
	st := nativeClient(h).Session(context.Background())
	t.Cleanup(func() { _ = st.CloseRequest(); _ = st.CloseResponse() })
	big := &keyshardv1.SessionRequest{Session: strings.Repeat("s", 100), KeepAlive: 1}
	if err := st.Send(big); err != nil {
		t.Fatal(err)
	}
	err := <-n.recvErrs
	var tl *TooLargeError
	if !errors.As(err, &tl) || tl.Most != 64 || tl.Size < 100 {
		t.Fatalf("receive failed with %v; want a TooLargeError of over 100 bytes against 64", err)
	}
	if _, err := st.Receive(); connect.CodeOf(err) != connect.CodeAborted {
		t.Fatalf("call ended with %v; want the handler's ABORTED", err)
	}
}

// TestNativeStreamBaseContext: when the base context ends (serve's
// shutdown), a native stream waiting for the client's next message ends.
func TestNativeStreamBaseContext(t *testing.T) {
	h, n := startNative(t)
	st := nativeClient(h).Session(context.Background())
	t.Cleanup(func() { _ = st.CloseRequest(); _ = st.CloseResponse() })
	if err := st.Send(&keyshardv1.SessionRequest{KeepAlive: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Receive(); err != nil {
		t.Fatal(err)
	}
	h.base()
	if err := <-n.recvErrs; err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("receive after the base context ended: %v; want it to fail", err)
	}
	if _, err := st.Receive(); connect.CodeOf(err) != connect.CodeCanceled {
		t.Fatalf("call ended with %v; want CANCELED", err)
	}
}
