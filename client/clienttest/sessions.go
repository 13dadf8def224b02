package clienttest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
)

// sessionsMsg is a message of a Sessions stream as its reader checked
// it, with the faults each of its keep-alive's renewals took when it
// arrived.
type sessionsMsg struct {
	open      []*keyshardv1.SessionsOpen
	keepAlive uint64
	renew     []sessionsRenewal
	close     []uint32
}

// sessionsRenewal is one session's keep-alive in a message of a Sessions
// stream.
type sessionsRenewal struct {
	id      uint32
	session string // "": the id names no session followed on the stream
	k       streamKeepAlive
}

// followedSession is a session a Sessions stream follows.
type followedSession struct {
	session string
	sent    uint64 // the revision of the grants sent last
	started bool   // its first grants were sent
}

// Sessions serves a Sessions stream as keyshard serve does: many
// sessions' Session streams on one. Each message is applied in the order
// open, keep-alive, close. Each session followed gets its grants in a
// first message after its open, then whenever they change; a session
// that ended (or never lived) is listed in ended with code not_found,
// and the stream goes on with the others. A keep-alive renews each
// session it lists as a Session stream's keep-alive does, each renewal
// with the keep-alive faults in force when it arrived (recorded in
// KeepAlives and counted by StreamKeepAlives, one per session listed);
// its answer carries every renewal, in the order listed, once all are
// done, and keep-alives are answered in the order they came. A renewal
// that fails is answered with its error code, not_found included, as is
// one of an id the stream does not follow (never opened, or closed). A
// malformed message (an id 0 or followed already, a session followed twice, a
// keep-alive number without renewals or the reverse, an id listed twice
// in renew) ends the stream invalid_argument. The stream ends
// unavailable when the fake is cut off (SetUnavailable) or EndStreams
// ends it.
func (m memberService) Sessions(ctx context.Context, st *connect.BidiStream[keyshardv1.SessionsRequest, keyshardv1.SessionsResponse]) error {
	s := m.s
	s.mu.Lock()
	ended := s.faults.streams
	s.mu.Unlock()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(ended, func() { cancel(errStreamsEnded()) })
	defer stop()

	msgs := make(chan sessionsMsg) // unbuffered: the reader takes no message ahead of the handler
	read := make(chan error, 1)
	done := make(chan struct{})
	defer close(done)
	go func() { read <- s.readSessions(st, msgs, done) }() // exits when the body ends or the handler returns

	followed := map[uint32]*followedSession{}
	var pending *sessionsMsg // a keep-alive to answer
	for {
		if pending != nil {
			answer, err := s.answerSessionsKeepAlive(ctx, pending)
			if err != nil {
				return endedBy(ctx, err)
			}
			pending = nil
			if err := st.Send(&keyshardv1.SessionsResponse{KeepAlive: answer}); err != nil {
				return err
			}
			continue
		}
		s.mu.Lock()
		if s.downLocked("") {
			s.mu.Unlock()
			return errUnreachable()
		}
		resp := &keyshardv1.SessionsResponse{}
		ids := make([]uint32, 0, len(followed))
		for id := range followed {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			f := followed[id]
			x, err := s.liveLocked(f.session)
			if err != nil {
				delete(followed, id)
				resp.Ended = append(resp.Ended, &keyshardv1.SessionEnded{Id: id, ErrorCode: connect.CodeOf(err).String(), ErrorMessage: errorMessage(err)})
				continue
			}
			if !f.started || x.rev > f.sent {
				resp.Grants = append(resp.Grants, &keyshardv1.SessionGrants{Id: id, Grants: s.grantsMsgLocked(x)})
				f.sent, f.started = x.rev, true
			}
		}
		changed := s.changed
		s.mu.Unlock()
		if len(resp.Grants) > 0 || len(resp.Ended) > 0 {
			if err := st.Send(resp); err != nil {
				return err
			}
			continue
		}
		select {
		case <-changed:
		case msg := <-msgs:
			for i, o := range msg.open {
				// An id closed, or ended by the stream, may be used again.
				if followed[o.GetId()] != nil {
					return invalidArg("open[%d]: id %d is followed on the stream already; give each session an id not in use", i, o.GetId())
				}
				for _, f := range followed {
					if f.session == o.GetSession() {
						return invalidArg("open[%d]: session %q is followed on the stream already", i, o.GetSession())
					}
				}
				followed[o.GetId()] = &followedSession{session: o.GetSession()}
			}
			if msg.keepAlive != 0 {
				pending = &msg
			}
			for _, id := range msg.close {
				delete(followed, id)
			}
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

// readSessions receives a Sessions stream's messages, checks each, and
// hands it to the handler, until the body ends (io.EOF when the member
// half-closed), a message is malformed, or done closes. Each message is
// recorded in SessionsMessages, and each renewal of its keep-alive is
// recorded and takes its faults, when it arrives.
func (s *Server) readSessions(st *connect.BidiStream[keyshardv1.SessionsRequest, keyshardv1.SessionsResponse], msgs chan<- sessionsMsg, done <-chan struct{}) error {
	opened := map[uint32]string{} // every id opened on the stream → its session
	closed := map[uint32]bool{}
	for {
		msg, err := st.Receive()
		if err != nil {
			return err
		}
		s.obs.sessionsMessages.add(msg)
		out := sessionsMsg{open: msg.GetOpen(), keepAlive: msg.GetKeepAlive(), close: msg.GetClose()}
		for i, o := range msg.GetOpen() {
			switch {
			case o.GetId() == 0:
				return invalidArg("open[%d]: id 0; number the sessions of a stream from 1", i)
			case o.GetSession() == "":
				return invalidArg("open[%d]: session is empty; send the session from Join", i)
			}
			opened[o.GetId()] = o.GetSession()
			delete(closed, o.GetId())
		}
		switch n := msg.GetKeepAlive(); {
		case n == 0 && len(msg.GetRenew()) > 0:
			return invalidArg("keep_alive: 0 with %d sessions in renew; number keep-alives from 1", len(msg.GetRenew()))
		case n != 0 && len(msg.GetRenew()) == 0:
			return invalidArg("keep_alive: %d with no session in renew", n)
		}
		listed := map[uint32]bool{}
		for i, id := range msg.GetRenew() {
			if listed[id] {
				return invalidArg("renew[%d]: id %d is listed twice; list each session once", i, id)
			}
			listed[id] = true
			sid := opened[id]
			if sid == "" || closed[id] {
				out.renew = append(out.renew, sessionsRenewal{id: id}) // renews nothing: not recorded
				continue
			}
			out.renew = append(out.renew, sessionsRenewal{id: id, session: sid, k: s.keepAliveArrived(sid, msg.GetKeepAlive())})
		}
		for _, id := range msg.GetClose() {
			closed[id] = true
		}
		select {
		case msgs <- out:
		case <-done:
			return nil
		}
	}
}

// answerSessionsKeepAlive renews the sessions keep-alive msg lists, each
// on a goroutine of its own, and returns its answer once all are done. A
// renewal that fails is answered with its error; the stream being over
// (ctx ended, the fake closed) is the error returned.
func (s *Server) answerSessionsKeepAlive(ctx context.Context, msg *sessionsMsg) (*keyshardv1.SessionsKeepAliveAnswer, error) {
	renewals := make([]*keyshardv1.SessionRenewal, len(msg.renew))
	errs := make([]error, len(msg.renew))
	var wg sync.WaitGroup
	for i, r := range msg.renew {
		wg.Go(func() { renewals[i], errs[i] = s.renewOnStream(ctx, r) }) // exits when the renewal is done, failed, or ctx ends
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &keyshardv1.SessionsKeepAliveAnswer{KeepAlive: msg.keepAlive, Renewals: renewals}, nil
}

// renewOnStream renews one session of a Sessions stream's keep-alive, as
// its faults say.
func (s *Server) renewOnStream(ctx context.Context, r sessionsRenewal) (*keyshardv1.SessionRenewal, error) {
	if r.session == "" {
		return &keyshardv1.SessionRenewal{Id: r.id, ErrorCode: connect.CodeNotFound.String(),
			ErrorMessage: fmt.Sprintf("no session is followed as id %d on this stream (closed, or never opened); open it again", r.id)}, nil
	}
	err := r.k.refused
	var ttl *durationpb.Duration
	if err == nil {
		ttl, err = s.keepAlive(ctx, r.session, r.k.a)
	}
	switch {
	case err == nil:
		return &keyshardv1.SessionRenewal{Id: r.id, Ttl: ttl}, nil
	case ctx.Err() != nil, isClosed(s.quit):
		return nil, err
	}
	return &keyshardv1.SessionRenewal{Id: r.id, ErrorCode: connect.CodeOf(err).String(), ErrorMessage: errorMessage(err)}, nil
}

// errorMessage is err's message without its code, as a stream's answer
// carries it.
func errorMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}

// SessionsStreams are the first messages of the Sessions streams
// received over HTTP/2: each opens a stream (many sessions' grants and
// keep-alives). Those refused over HTTP/1.1 are counted by CallCount
// only.
func (s *Server) SessionsStreams() *Requests[*keyshardv1.SessionsRequest] {
	return s.obs.sessionsStreams
}

// SessionsMessages are every message of the Sessions streams received,
// the first ones included, in the order they arrived: the opens,
// keep-alives and closes each carries. A keep-alive's renewals are also
// recorded in KeepAlives, one per session it lists.
func (s *Server) SessionsMessages() *Requests[*keyshardv1.SessionsRequest] {
	return s.obs.sessionsMessages
}

// sessionsProcedure is MemberService.Sessions, served over HTTP/2 only.
const sessionsProcedure = keyshardv1connect.MemberServiceSessionsProcedure
