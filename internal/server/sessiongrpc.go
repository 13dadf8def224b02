package server

import (
	"context"
	"errors"

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
	conn := grpcSessionConn{gs: gs, most: most, lim: lim}
	// The call's context ends the wait for the member's next message
	// itself; etcd becoming unreachable cuts it (a context of the
	// stream's own, and a callback on it, would cost each member's
	// stream about 0.6 KB).
	return s.gateStream(gs.Context(), procedure, gs.Cut, func(ctx context.Context) error {
		return (&memberService{s: s}).session(ctx, conn, gs.Cut, true)
	})
}

// grpcSessionConn is a Session stream on grpc-go's stream.
type grpcSessionConn struct {
	gs   *grpcbridge.Stream
	most int
	lim  Limit
}

func (c grpcSessionConn) Receive() (*v1.SessionRequest, error) {
	m := new(v1.SessionRequest)
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

func (c grpcSessionConn) Send(m *v1.SessionResponse) error { return c.gs.Send(m) }
