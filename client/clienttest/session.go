package clienttest

import (
	"context"
	"errors"
	"io"
	"net/http"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
)

// streamKeepAlive is a keep-alive that arrived on a Session stream, with
// the faults it took then.
type streamKeepAlive struct {
	n       uint64
	a       arrival
	refused error // a Fail or FailNext of KeepAlive, or the fake cut off
}

// Session serves a member's Session stream as keyshard serve does: the
// session's grants (always in the first message, then whenever they
// change) and its keep-alives, answered in the order they arrived, each
// renewed as a KeepAlive call is, with the keep-alive faults in force when
// it arrived. A keep-alive that fails while the session lives is answered
// on the stream (error_code); a session that ended ends the stream
// not_found. The stream ends unavailable when the fake is cut off
// (SetUnavailable) or EndStreams ends it.
func (m memberService) Session(ctx context.Context, st *connect.BidiStream[keyshardv1.SessionRequest, keyshardv1.SessionResponse]) error {
	s := m.s
	first, err := st.Receive()
	if errors.Is(err, io.EOF) {
		return invalidArg("no message: open a Session stream with {\"session\": ...} from Join")
	}
	if err != nil {
		return err
	}
	id := first.GetSession()
	if id == "" {
		return invalidArg("session: missing in the first message; send the session from Join")
	}
	s.mu.Lock()
	_, err = s.liveLocked(id)
	ended := s.faults.streams
	s.mu.Unlock()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(ended, func() { cancel(errStreamsEnded()) })
	defer stop()

	arrivals := make(chan streamKeepAlive) // unbuffered: the reader takes no message ahead of the handler
	read := make(chan error, 1)
	done := make(chan struct{})
	defer close(done)
	go func() { read <- s.readSession(st, id, arrivals, done) }() // exits when the body ends or the handler returns

	var pending *streamKeepAlive
	if n := first.GetKeepAlive(); n != 0 {
		k := s.keepAliveArrived(id, n)
		pending = &k
	}
	var sent uint64 // the revision of the grants sent last
	started := false
	for {
		if pending != nil {
			// Answered before the grants, as keyshard serve does: the
			// first keep-alive activates the session.
			answer, err := s.answerKeepAlive(ctx, id, *pending)
			if err != nil {
				return endedBy(ctx, err)
			}
			pending = nil
			if err := st.Send(&keyshardv1.SessionResponse{KeepAlive: answer}); err != nil {
				return err
			}
			continue
		}
		s.mu.Lock()
		if s.downLocked("") {
			s.mu.Unlock()
			return errUnreachable()
		}
		x, err := s.liveLocked(id)
		var grants *keyshardv1.GetGrantsResponse
		if err == nil && (!started || x.rev > sent) {
			grants = s.grantsMsgLocked(x)
			sent, started = x.rev, true
		}
		changed := s.changed
		s.mu.Unlock()
		if err != nil {
			return err
		}
		if grants != nil {
			if err := st.Send(&keyshardv1.SessionResponse{Grants: grants}); err != nil {
				return err
			}
			continue
		}
		select {
		case <-changed:
		case k := <-arrivals:
			pending = &k
		case err := <-read:
			if errors.Is(err, io.EOF) {
				return nil // the member half-closed; every keep-alive it sent is answered
			}
			return err
		case <-ctx.Done():
			return endedBy(ctx, nil)
		case <-s.quit:
			return nil
		}
	}
}

// readSession receives a Session stream's messages after the first, and
// hands each keep-alive to the handler, until the body ends (io.EOF when
// the member half-closed) or done closes. A keep-alive is recorded, and
// takes its faults, when it arrives.
func (s *Server) readSession(st *connect.BidiStream[keyshardv1.SessionRequest, keyshardv1.SessionResponse], id string, arrivals chan<- streamKeepAlive, done <-chan struct{}) error {
	for {
		msg, err := st.Receive()
		if err != nil {
			return err
		}
		if other := msg.GetSession(); other != "" && other != id {
			return invalidArg("session: a message names another session than the stream's first; open a stream per session")
		}
		n := msg.GetKeepAlive()
		if n == 0 {
			return invalidArg("keep_alive: 0 in a message after the first; number keep-alives from 1")
		}
		select {
		case arrivals <- s.keepAliveArrived(id, n):
		case <-done:
			return nil
		}
	}
}

// keepAliveArrived records keep-alive n of session id's stream, as
// KeepAlives and StreamKeepAlives count it, and takes the faults that
// answer it.
func (s *Server) keepAliveArrived(id string, n uint64) streamKeepAlive {
	const p = keyshardv1connect.MemberServiceKeepAliveProcedure
	s.mu.Lock()
	defer s.mu.Unlock()
	s.streamKeepAlives++
	s.observers[p](&keyshardv1.KeepAliveRequest{Session: id})
	return streamKeepAlive{n: n, refused: s.faults.refuseLocked(p), a: s.faults.arrivalLocked(p)}
}

// answerKeepAlive renews session id for keep-alive k of its stream. A
// session that ended, and a stream that is over, end the stream (the
// error returned); any other failure is answered on the stream.
func (s *Server) answerKeepAlive(ctx context.Context, id string, k streamKeepAlive) (*keyshardv1.KeepAliveAnswer, error) {
	err := k.refused
	var ttl *durationpb.Duration
	if err == nil {
		ttl, err = s.keepAlive(ctx, id, k.a)
	}
	switch {
	case err == nil:
		return &keyshardv1.KeepAliveAnswer{KeepAlive: k.n, Ttl: ttl}, nil
	case connect.CodeOf(err) == connect.CodeNotFound, ctx.Err() != nil, isClosed(s.quit):
		return nil, err
	}
	return &keyshardv1.KeepAliveAnswer{KeepAlive: k.n, ErrorCode: connect.CodeOf(err).String(), ErrorMessage: errorMessage(err)}, nil
}

// endedBy returns what a Session stream whose handler stops with err
// ends with: EndStreams's error if that ended it, nothing if the member
// went away, err otherwise.
func endedBy(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); ctx.Err() != nil {
		var ce *connect.Error
		if errors.As(cause, &ce) {
			return cause
		}
		return nil
	}
	return err
}

// errStreamsEnded is what the streams that EndStreams ends end with.
func errStreamsEnded() error {
	return connect.NewError(connect.CodeUnavailable, errors.New("the stream was cut (clienttest EndStreams)"))
}

// http2Only answers a Session or Sessions stream over HTTP/1.1
// UNIMPLEMENTED, as keyshard serve does, so that a member knows to use
// WatchGrants and KeepAlive instead (connect's own answer, HTTP 505,
// reaches clients as UNKNOWN). Such a call is counted (CallCount) but not
// admitted: its token is not checked.
func (s *Server) http2Only(next http.Handler) http.Handler {
	errs := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if p != keyshardv1connect.MemberServiceSessionProcedure && p != sessionsProcedure || r.ProtoMajor >= 2 || !errs.IsSupported(r) {
			next.ServeHTTP(w, r)
			return
		}
		s.mu.Lock()
		s.calls[p]++
		s.mu.Unlock()
		w.Header().Set("Connection", "close") // not waiting for the rest of a body that may never end
		_ = errs.Write(w, r, connect.NewError(connect.CodeUnimplemented, errors.New("Session and Sessions streams need HTTP/2 (gRPC, or Connect over HTTP/2); over HTTP/1.1 use WatchGrants or GetGrants, and KeepAlive")))
	})
}
