package server

import (
	"context"
	"errors"
	"io"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
)

// Session serves a member's Session stream: its grants, as WatchGrants
// sends them, and its keep-alives, as KeepAlive answers them, on one
// HTTP/2 stream. A keep-alive on a stream the member already holds costs
// one small message each way, where a KeepAlive call costs a request of
// its own (headers, a new stream, a goroutine, connect's handler chain):
// at 10,000 members, 3,000 of them a second.
//
// Two goroutines serve a stream. The handler's sends (the grants when
// they change, each keep-alive's answer), renews, and ends the stream; a
// reader receives the member's messages and hands each keep-alive to it.
// The reader exits when the stream's body ends: the member half-closed
// it, or the handler returned and net/http reset it.
func (m *memberService) Session(ctx context.Context, stream *connect.BidiStream[v1.SessionRequest, v1.SessionResponse]) error {
	first, err := stream.Receive()
	if errors.Is(err, io.EOF) {
		return invalid("no message: open a Session stream with {\"session\": ...} from Join")
	}
	if err != nil {
		return err
	}
	token := first.GetSession()
	if token == "" {
		return invalid("session: missing in the first message; send the session from Join")
	}
	sess, err := m.s.sessions.parse(token)
	if err != nil {
		return err
	}
	release, err := m.s.polls.hold()
	if err != nil {
		return err
	}
	defer release()
	if err := m.s.catchUp(ctx, first.GetMinRevision()); err != nil {
		return err
	}

	keepAlives := make(chan uint64) // unbuffered: the reader takes no message ahead of the handler
	read := make(chan error, 1)
	done := make(chan struct{})
	defer close(done)
	go func() { read <- readSession(stream, token, keepAlives, done) }() // exits when the body ends or the handler returns

	pending := first.GetKeepAlive()
	var news grantsNews
	for {
		changed := m.s.view.keyspaceChanged(sess.keyspace)
		if pending != 0 {
			// Answered before the grants: the first keep-alive activates
			// the session, and the grants sent next then show it.
			answer, err := m.keepAliveAnswer(ctx, sess, pending)
			if err != nil {
				if ctx.Err() != nil {
					return nil // as below: the replica stops serving the stream
				}
				return err
			}
			if err := stream.Send(&v1.SessionResponse{KeepAlive: answer}); err != nil {
				return err
			}
			pending = 0
			continue
		}
		resp, err := news.next(ctx, m.s, sess)
		if err != nil {
			return err
		}
		if resp != nil {
			if err := stream.Send(&v1.SessionResponse{Grants: resp}); err != nil {
				return err
			}
			news.sent(resp)
		}
		select {
		case <-changed:
		case pending = <-keepAlives:
		case err := <-read:
			if errors.Is(err, io.EOF) {
				return nil // the member half-closed; every keep-alive it sent is answered
			}
			return err
		case <-ctx.Done():
			return nil
		}
	}
}

// readSession receives a Session stream's messages after the first, and
// hands each keep-alive's number to the handler, until the body ends (an
// error; io.EOF when the member half-closed) or done closes.
func readSession(stream *connect.BidiStream[v1.SessionRequest, v1.SessionResponse], token string, keepAlives chan<- uint64, done <-chan struct{}) error {
	for {
		msg, err := stream.Receive()
		if err != nil {
			return err
		}
		if s := msg.GetSession(); s != "" && s != token {
			return invalid("session: a message names another session than the stream's first; open a stream per session")
		}
		n := msg.GetKeepAlive()
		if n == 0 {
			return invalid("keep_alive: 0 in a message after the first; number keep-alives from 1")
		}
		select {
		case keepAlives <- n:
		case <-done:
			return nil
		}
	}
}

// keepAliveAnswer renews session sess for keep-alive n of its stream. A
// session that has ended or was replaced ends the stream (NOT_FOUND, the
// error returned); any other failure is answered on the stream, which
// goes on.
func (m *memberService) keepAliveAnswer(ctx context.Context, sess session, n uint64) (*v1.KeepAliveAnswer, error) {
	ttl, err := m.keepAlive(ctx, sess)
	switch {
	case err == nil:
		return &v1.KeepAliveAnswer{KeepAlive: n, Ttl: durationpb.New(ttl)}, nil
	case connect.CodeOf(err) == connect.CodeNotFound, ctx.Err() != nil:
		return nil, err
	}
	msg := err.Error()
	var ce *connect.Error
	if errors.As(err, &ce) {
		msg = ce.Message()
	}
	return &v1.KeepAliveAnswer{KeepAlive: n, ErrorCode: connect.CodeOf(err).String(), ErrorMessage: msg}, nil
}
