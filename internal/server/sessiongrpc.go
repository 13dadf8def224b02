package server

import (
	"context"
	"errors"

	"google.golang.org/protobuf/proto"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/internal/grpcbridge"
)

// grpcSession serves a Session stream a member opened over gRPC in
// protobuf (the Go SDK's client.GRPC(), grpcio, grpc-js) on grpc-go's
// stream itself, without the http.Request and connect's stream state the
// bridge keeps per call for as long as the stream lives: a replica holds
// one such stream per live member. It checks what the http.Handler's
// gates check for a Session stream (the token, etcd's reachability, the
// size of each message) and then serves it as Session does.
func (s *Server) grpcSession(gs *grpcbridge.Stream) error {
	const procedure = keyshardv1connect.MemberServiceSessionProcedure
	if err := s.auth.check(procedure, gs.Header()); err != nil {
		return err
	}
	most, lim := s.cfg.Limits.readMax(procedure)
	conn := grpcConn[v1.SessionRequest, *v1.SessionRequest, *v1.SessionResponse]{gs: gs, most: most, lim: lim}
	// The call's context ends the wait for the member's next message
	// itself; etcd becoming unreachable cuts it (a context of the
	// stream's own, and a callback on it, would cost each member's
	// stream about 0.6 KB).
	return s.gateStream(gs.Context(), procedure, gs.Cut, func(ctx context.Context) error {
		return (&memberService{s: s}).session(ctx, conn, gs.Cut, true)
	})
}

// grpcConn is a Session or Sessions stream on grpc-go's stream: requests
// of type Req (through its pointer type PReq), responses of type Resp.
type grpcConn[Req any, PReq interface {
	*Req
	proto.Message
}, Resp proto.Message] struct {
	gs   *grpcbridge.Stream
	most int
	lim  Limit
}

func (c grpcConn[Req, PReq, Resp]) Receive() (PReq, error) {
	m := PReq(new(Req))
	err := c.gs.Receive(m, c.most)
	var big *grpcbridge.TooLargeError
	if errors.As(err, &big) {
		return nil, tooLarge(c.gs.Method(), int64(big.Size), c.most, c.lim)
	}
	if err != nil {
		return nil, err
	}
	return m, nil
}

func (c grpcConn[Req, PReq, Resp]) Send(m Resp) error { return c.gs.Send(m) }

// grpcSessions serves a Sessions stream opened over gRPC in protobuf on
// grpc-go's stream itself, as grpcSession does a Session stream.
func (s *Server) grpcSessions(gs *grpcbridge.Stream) error {
	const procedure = keyshardv1connect.MemberServiceSessionsProcedure
	if err := s.auth.check(procedure, gs.Header()); err != nil {
		return err
	}
	most, lim := s.cfg.Limits.readMax(procedure)
	conn := grpcConn[v1.SessionsRequest, *v1.SessionsRequest, *v1.SessionsResponse]{gs: gs, most: most, lim: lim}
	return s.gateStream(gs.Context(), procedure, gs.Cut, func(ctx context.Context) error {
		return (&memberService{s: s}).sessions(ctx, conn, gs.Cut, true)
	})
}
