package grpcbridge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"connectrpc.com/connect"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// StreamHandler serves one call of a method named in Options.Streams,
// on grpc-go's stream itself. Its error ends the call: a *connect.Error
// becomes the call's status with its message, details and metadata, as
// connect's handlers would send it; a grpc-go status error goes as it is;
// any other error ends the call UNKNOWN.
type StreamHandler func(*Stream) error

// Stream is one call a StreamHandler serves. Receive and Send may run at
// the same time as each other, but neither at the same time as itself.
type Stream struct {
	ss     grpc.ServerStream
	c      *call
	method string
}

// Context is the call's: it ends when the call does, when Cut is called,
// and when Options.BaseContext ends.
func (s *Stream) Context() context.Context { return s.ss.Context() }

// Method is the call's full method, "/package.Service/Method".
func (s *Stream) Method() string { return s.method }

// Header is the call's request metadata as the bridge hands it to an
// http.Handler: canonical keys, binary values base64-encoded as connect
// encodes them. Each call builds it anew: a long-lived stream keeps
// no copy.
func (s *Stream) Header() http.Header {
	md, _ := metadata.FromIncomingContext(s.ss.Context())
	return requestHeader(md)
}

// Receive reads the client's next message into m. It returns io.EOF once
// the client has closed its side, os.ErrDeadlineExceeded once Cut ended
// the wait, and a *TooLargeError, without decoding it, for a message of
// more than most bytes (after decompression; most ≤ 0: no limit but
// Options.MaxRecvMsgSize).
func (s *Stream) Receive(m proto.Message, most int) error {
	var f frame
	if err := s.ss.RecvMsg(&f); err != nil {
		switch {
		case errors.Is(err, io.EOF):
			return io.EOF
		case s.c.cut.Load():
			return os.ErrDeadlineExceeded
		}
		return err
	}
	msg := f.data[5:]
	if most > 0 && len(msg) > most {
		return &TooLargeError{Size: len(msg), Most: most}
	}
	if err := proto.Unmarshal(msg, m); err != nil {
		return status.Errorf(codes.InvalidArgument, "%s: the message is not a valid %s: %v", s.method, m.ProtoReflect().Descriptor().FullName(), err)
	}
	return nil
}

// Send sends m to the client, uncompressed.
func (s *Stream) Send(m proto.Message) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return status.Errorf(codes.Internal, "%s: encode the response: %v", s.method, err)
	}
	return s.ss.SendMsg(&frame{data: b}) // b is not reused: grpc-go may write it after SendMsg returns
}

// Cut ends a pending Receive, and every later one, with
// os.ErrDeadlineExceeded, and ends the call's context. As with a read
// deadline on the http.Handler's side, the call then ends CANCELED
// whatever the handler returns: grpc-go writes that status itself.
func (s *Stream) Cut() { s.c.cutNow() }

// TooLargeError is Receive's refusal of a message over its limit.
type TooLargeError struct {
	Size int // the message's size, in bytes
	Most int // the limit Receive was given
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("a message of %d bytes, over the limit of %d", e.Size, e.Most)
}

// native serves a call with its StreamHandler h.
func (s *Server) native(h StreamHandler, st *Stream) (err error) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("grpcbridge: the stream handler panicked", "method", st.method, "panic", fmt.Sprint(p))
			err = status.Error(codes.Internal, "the server failed serving the call")
		}
	}()
	err = h(st)
	var ce *connect.Error
	if errors.As(err, &ce) {
		if md := responseMD(ce.Meta()); len(md) > 0 {
			st.ss.SetTrailer(md)
		}
	}
	return statusOf(err)
}

// protoCodec reports whether the call's content type names protobuf
// (application/grpc, or application/grpc+proto): the calls a
// StreamHandler serves. Others go to the http.Handler, which serves
// every codec connect knows.
func protoCodec(ctx context.Context) bool {
	ct := metadata.ValueFromIncomingContext(ctx, "content-type")
	if len(ct) == 0 {
		return true
	}
	sub, ok := strings.CutPrefix(strings.ToLower(ct[0]), "application/grpc")
	if !ok {
		return false
	}
	if i := strings.IndexByte(sub, ';'); i >= 0 {
		sub = sub[:i]
	}
	return sub == "" || sub == "+proto"
}

// statusOf is a StreamHandler's error as grpc-go sends it.
func statusOf(err error) error {
	var ce *connect.Error
	if err == nil || !errors.As(err, &ce) {
		if _, ok := status.FromError(err); ok || err == nil {
			return err
		}
		return status.Error(codes.Unknown, err.Error())
	}
	p := &spb.Status{Code: int32(ce.Code()), Message: ce.Message()}
	for _, d := range ce.Details() {
		p.Details = append(p.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
	}
	return status.FromProto(p).Err()
}
