package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"connectrpc.com/connect"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/clock"
)

// A Worker's Session stream (MemberService.Session) carries its grants,
// as WatchGrants does, and its keep-alives, each one small message on the
// stream instead of a KeepAlive call of its own. The grants follower owns
// the stream: it opens it, receives on it, and ends it. While it is open,
// keep sends its keep-alives on it (see keepAliveOnce); otherwise (not
// open yet, reconnecting, long polls, or no Session streams at all) it
// calls KeepAlive. With SharedSessionStreams, a session's part of a
// shared Sessions stream (sessionSub, in sessionmux.go) stands in for its
// Session stream, with the same semantics.

// keepAliveStream is a stream that carries a session's keep-alives: its
// Session stream, or its part of a shared Sessions stream.
type keepAliveStream interface {
	// keepAlive makes one keep-alive on the stream, abandoning the
	// stream if it is not answered within limit, and returns the TTL
	// its answer gives; errNotSent if it could not be sent, an error
	// wrapping errStreamEnded if the stream ended before the answer.
	keepAlive(ctx context.Context, limit time.Duration) (time.Duration, error)
}

var (
	// errStreamEnded: a keep-alive was sent on a Session stream (or
	// Sessions stream) that ended before its answer came. keep makes it
	// again at once.
	errStreamEnded = errors.New("the Session stream ended before the keep-alive's answer")
	// errNotSent: the Session stream (or the session's part of a
	// Sessions stream) ended before the keep-alive could be sent on it;
	// keepAliveOnce calls KeepAlive instead.
	errNotSent = errors.New("the Session stream ended")
)

// sessionStream is a session's Session stream, from its opening to its
// end.
type sessionStream struct {
	c     *Client
	clock clock.Clock
	b     *bidiStream[keyshardv1.SessionRequest, keyshardv1.SessionResponse]
	done  chan struct{} // closed by end

	mu      sync.Mutex
	ended   bool
	err     error  // (mu) why it ended, set before done is closed
	n       uint64 // (mu) the number of the newest keep-alive
	waiting map[uint64]chan *keyshardv1.KeepAliveAnswer
}

// followSession follows session s's grants on a Session stream, calling
// yield for each message of grants, and carries keep's keep-alives while
// it is open (from its first answer on: the server serves it). It
// returns when the stream ends; an in-flight keep-alive fails then, with
// errStreamEnded.
func (w *Worker) followSession(ctx context.Context, s *session, minRev uint64, yield func(*keyshardv1.GetGrantsResponse)) error {
	ss := &sessionStream{c: w.c, clock: w.clock, done: make(chan struct{}), waiting: map[uint64]chan *keyshardv1.KeepAliveAnswer{}}
	err := bidi(ctx, w.c, memberAPI.Session, func(b *bidiStream[keyshardv1.SessionRequest, keyshardv1.SessionResponse]) error {
		ss.b = b
		// The first keep-alive went as a KeepAlive call, at once after
		// the Join; the stream carries the next ones.
		if err := b.send(&keyshardv1.SessionRequest{Session: s.id, MinRevision: minRev}); err != nil && !errors.Is(err, io.EOF) {
			return err // io.EOF: the stream failed, and Receive says why
		}
		open := false
		for {
			msg, err := b.st.Receive()
			if errors.Is(err, io.EOF) {
				return nil // the server ended the stream
			}
			if err != nil {
				return err
			}
			if !open {
				open = true
				s.setStream(ss)
			}
			if a := msg.GetKeepAlive(); a != nil {
				ss.answered(a)
			}
			if g := msg.GetGrants(); g != nil {
				yield(g)
			}
		}
	})
	// Ended after bidi returned: a keep-alive that failed with the stream
	// is made again after the Client moved on from a replica that failed.
	ss.end(s, err)
	return err
}

// setStream makes ss the stream keep-alives of s go on.
func (s *session) setStream(ss keepAliveStream) {
	s.streamMu.Lock()
	defer s.streamMu.Unlock()
	s.stream = ss
}

// openStream returns the Session stream keep-alives of s go on, or nil.
func (s *session) openStream() keepAliveStream {
	s.streamMu.Lock()
	defer s.streamMu.Unlock()
	return s.stream
}

// end ends ss with err: no keep-alive goes on it any more, and those in
// flight fail.
func (ss *sessionStream) end(s *session, err error) {
	s.streamMu.Lock()
	if s.stream == ss {
		s.stream = nil
	}
	s.streamMu.Unlock()
	if err == nil {
		err = errors.New("the server ended the stream")
	}
	ss.mu.Lock()
	ss.ended, ss.err = true, err
	ss.mu.Unlock()
	close(ss.done)
}

// answered hands keep-alive answer a to the keep-alive it answers, if it
// is still waiting.
func (ss *sessionStream) answered(a *keyshardv1.KeepAliveAnswer) {
	ss.mu.Lock()
	ch := ss.waiting[a.GetKeepAlive()]
	ss.mu.Unlock()
	if ch != nil {
		select {
		case ch <- a:
		default: // answered already
		}
	}
}

// keepAlive sends a keep-alive on the stream and returns the TTL its
// answer gives. A keep-alive not answered within limit ends the stream,
// as a call that a replica does not answer in time is abandoned: the
// stream is stuck (a paused replica, a black-holed connection), and its
// answers come in order. It returns errNotSent if the stream had ended
// already, an error wrapping errStreamEnded if the stream ended before
// the answer, or the error the answer carries.
func (ss *sessionStream) keepAlive(ctx context.Context, limit time.Duration) (time.Duration, error) {
	ss.mu.Lock()
	if ss.ended {
		ss.mu.Unlock()
		return 0, errNotSent
	}
	ss.n++
	n := ss.n
	answer := make(chan *keyshardv1.KeepAliveAnswer, 1)
	ss.waiting[n] = answer
	ss.mu.Unlock()
	defer func() {
		ss.mu.Lock()
		delete(ss.waiting, n)
		ss.mu.Unlock()
	}()
	t := ss.clock.AfterFunc(limit, func() {
		ss.b.abort(fmt.Errorf("keep-alive %d not answered within %v", n, limit))
	})
	defer t.Stop()
	_ = ss.b.send(&keyshardv1.SessionRequest{KeepAlive: n}) // a failed send ends the stream: done follows
	select {
	case a := <-answer:
		return ss.result(a)
	case <-ss.done:
		select {
		case a := <-answer:
			return ss.result(a)
		default:
		}
		return 0, fmt.Errorf("%w: %w", errStreamEnded, ss.err)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// result is what keep-alive answer a says: the TTL left, or the error
// that it carries, as the KeepAlive call would have returned it.
func (ss *sessionStream) result(a *keyshardv1.KeepAliveAnswer) (time.Duration, error) {
	return keepAliveResult(ss.c, a.GetErrorCode(), a.GetErrorMessage(), a.GetTtl().AsDuration(), "Session")
}

// keepAliveResult is what a keep-alive answered on a stream of rpc
// (Session or Sessions) says: ttl, or, if the answer carries the name of
// an error code, that error, as the KeepAlive call would have returned
// it.
func keepAliveResult(c *Client, name, message string, ttl time.Duration, rpc string) (time.Duration, error) {
	if name == "" {
		return ttl, nil
	}
	var code connect.Code
	if err := code.UnmarshalText([]byte(name)); err != nil {
		code = connect.CodeUnknown
	}
	return 0, c.translate(connect.NewError(code, fmt.Errorf("%s (answered on the %s stream)", message, rpc)))
}
