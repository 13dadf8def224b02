package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

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
// A stream costs one goroutine, as a WatchGrants stream does: the
// handler's, which receives the member's messages and answers each
// keep-alive. The grants are sent by a short-lived goroutine when they
// change, started by the keyspace's watcher in sessionHub, which wakes
// for every change of the keyspace and checks each of its streams. A
// stream that must end while its handler waits for the member's next
// message (the session ended, shutdown, etcd unreachable) ends that wait
// through the response's read deadline (on grpc-go's stream, through
// grpcbridge.Stream.Cut).
func (m *memberService) Session(ctx context.Context, stream *connect.BidiStream[v1.SessionRequest, v1.SessionResponse]) error {
	return m.session(ctx, stream, readDeadlineCut(ctx), false)
}

// readDeadlineCut ends a stream handler's wait for the member's next
// message, through the response's read deadline, which limitBodies passes
// in ctx; nil if it did not.
func readDeadlineCut(ctx context.Context) func() {
	w, ok := ctx.Value(responseWriterKey{}).(http.ResponseWriter)
	if !ok {
		return nil
	}
	rc := http.NewResponseController(w)
	return func() { _ = rc.SetReadDeadline(time.Unix(1, 0)) } // in the past: at once
}

// sessionConn is a Session stream as its handler uses it: connect's
// stream (the Connect protocol, gRPC-Web, gRPC in JSON) or grpc-go's
// (gRPC in protobuf, see grpcSession).
type sessionConn interface {
	Receive() (*v1.SessionRequest, error)
	Send(*v1.SessionResponse) error
}

// session serves a Session stream on conn. cut ends the handler's wait
// for the member's next message (nil: the stream cannot be cut short);
// ctxCuts says that ctx ending ends that wait already (grpc-go's
// stream), else the end of ctx calls cut.
func (m *memberService) session(ctx context.Context, stream sessionConn, cut func(), ctxCuts bool) error {
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
	sess, release, err := m.openGrants(ctx, token, first.GetMinRevision())
	if err != nil {
		return err
	}
	defer release()

	st := &sessionStream{m: m, ctx: ctx, sess: sess, stream: stream, streamEnd: streamEnd{cut: cut}}
	defer st.close() // first of the deferred: nothing sends on the stream after the handler
	if !ctxCuts {
		stop := context.AfterFunc(ctx, st.unblock)
		defer stop()
	}
	// The first keep-alive is answered before the grants go: it activates
	// the session, and the grants sent next then show it.
	if n := first.GetKeepAlive(); n != 0 {
		if err := st.answer(n); err != nil {
			return st.end(st.ctx, err)
		}
	}
	m.s.sessionHub.add(st)
	defer m.s.sessionHub.remove(st)
	st.poke(true)
	for {
		msg, err := stream.Receive()
		if err != nil {
			return st.end(st.ctx, err)
		}
		if s := msg.GetSession(); s != "" && s != token {
			return invalid("session: a message names another session than the stream's first; open a stream per session")
		}
		n := msg.GetKeepAlive()
		if n == 0 {
			return invalid("keep_alive: 0 in a message after the first; number keep-alives from 1")
		}
		if err := st.answer(n); err != nil {
			return st.end(st.ctx, err)
		}
	}
}

// responseWriterKey is the context key under which limitBodies passes a
// Session stream's http.ResponseWriter to its handler, whose read deadline
// ends a wait for the member's next message.
type responseWriterKey struct{}

// sessionStream is one Session stream: its handler receives and answers
// keep-alives; a goroutine of its own, started by poke, sends the grants
// when they change.
type sessionStream struct {
	m      *memberService
	ctx    context.Context
	sess   session
	stream sessionConn
	streamEnd
	news grantsNews // (sendMu)

	// sentRev and started mirror news, for poke's check without sendMu.
	sentRev atomic.Uint64
	started atomic.Bool
	// sending: a goroutine sends the grants; dirty: the grants may have
	// changed since it looked.
	sending, dirty atomic.Bool
}

// streamEnd is how a member's stream (Session, Sessions) ends: its
// handler returns (close), a send fails (err), or the wait for the
// member's next message is cut short (unblock).
type streamEnd struct {
	cut func() // ends the handler's wait for a message; nil: it cannot

	sendMu sync.Mutex // serializes Send; guards closed and err
	closed bool       // the handler is returning: nothing may send
	err    error      // why the stream must end, set by a sender

	endMu sync.Mutex // guards ended and every call of cut
	ended bool       // the handler has returned
}

// unblock ends the handler's wait for the member's next message, if the
// handler still runs.
func (e *streamEnd) unblock() {
	e.endMu.Lock()
	defer e.endMu.Unlock()
	if !e.ended && e.cut != nil {
		e.cut()
	}
}

// close stops every use of the stream: the handler is returning.
func (e *streamEnd) close() {
	e.endMu.Lock()
	e.ended = true
	e.endMu.Unlock()
	e.sendMu.Lock()
	e.closed = true
	e.sendMu.Unlock()
}

// end is what the handler returns when err ended it: why a sender ended
// the stream if one did; nothing when the replica stops serving it (ctx
// ended: shutdown, or etcd unreachable, which reachGate answers) or the
// member half-closed it; err otherwise.
func (e *streamEnd) end(ctx context.Context, err error) error {
	e.sendMu.Lock()
	cause := e.err
	e.sendMu.Unlock()
	switch {
	case cause != nil:
		return cause
	case ctx.Err() != nil, errors.Is(err, io.EOF):
		return nil
	}
	return err
}

// answer renews the session for keep-alive n and sends the answer, on a
// goroutine of its own that it waits for: the handler's stack, parked in
// Receive between keep-alives for the session's whole life, then never
// grows to the depth of a renewal and a Send. A stack the size of a
// renewal's on every live member's handler (16 KB, not 8) would cost
// serve about twice that in memory, as Go sizes the heap it allows by the
// stacks too.
func (st *sessionStream) answer(n uint64) error {
	done := make(chan error, 1)
	go func() { done <- st.renew(n) }() // exits once the answer is sent or fails
	return <-done
}

// renew renews the session for keep-alive n and sends the answer.
func (st *sessionStream) renew(n uint64) error {
	a, err := st.m.keepAliveAnswer(st.ctx, st.sess, n)
	if err != nil {
		return err
	}
	st.sendMu.Lock()
	defer st.sendMu.Unlock()
	if st.err != nil {
		return st.err
	}
	if err := st.stream.Send(&v1.SessionResponse{KeepAlive: a}); err != nil {
		st.err = err
		return err
	}
	return nil
}

// poke makes the stream send its grants if they changed since it last
// sent them (always, with force): in a goroutine of the stream's own, so
// that the keyspace's watcher never waits on a member's stream. A stream
// woken by a change to its keyspace that is not its own learns that from
// the revision alone, without a goroutine (a join storm wakes 1,000
// streams per change).
func (st *sessionStream) poke(force bool) {
	if !force && st.started.Load() && st.m.s.grantsUnchanged(st.sess, st.sentRev.Load()) {
		return
	}
	st.dirty.Store(true)
	if st.sending.CompareAndSwap(false, true) {
		go st.flush() // exits once the grants are sent and no change came meanwhile
	}
}

// flush sends the grants until no change came while it did.
func (st *sessionStream) flush() {
	for {
		st.dirty.Store(false)
		ok := st.sendGrants()
		st.sending.Store(false)
		if !ok || !st.dirty.Load() || !st.sending.CompareAndSwap(false, true) {
			return
		}
	}
}

// sendGrants sends the session's grants if the stream has yet to; false
// once the stream is closing or must end.
func (st *sessionStream) sendGrants() bool {
	st.sendMu.Lock()
	defer st.sendMu.Unlock()
	if st.closed || st.err != nil {
		return false
	}
	resp, err := st.news.next(st.ctx, st.m.s, st.sess)
	if err == nil && resp != nil {
		if err = st.stream.Send(&v1.SessionResponse{Grants: resp}); err == nil {
			st.news.sent(resp)
			st.sentRev.Store(resp.Revision)
			st.started.Store(true)
		}
	}
	if err != nil {
		st.err = err
		st.unblock()
		return false
	}
	return true
}

// keepAliveAnswer renews session sess for keep-alive n of its stream. A
// session that has ended or was replaced ends the stream (NOT_FOUND, the
// error returned), as does the stream's context ending; any other failure
// is answered on the stream, which goes on.
func (m *memberService) keepAliveAnswer(ctx context.Context, sess session, n uint64) (*v1.KeepAliveAnswer, error) {
	ttl, err := m.keepAlive(ctx, sess)
	m.s.metrics.keepAlives.WithLabelValues("stream", keepAliveResult(err)).Inc()
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

// sessionHub wakes the Session streams of each keyspace when the
// keyspace changes: one watcher goroutine per keyspace with streams,
// rather than a goroutine per stream waiting for changes.
type sessionHub struct {
	s  *Server
	mu sync.Mutex
	ks map[string]*keyspaceStreams
}

// hubStream is a session followed on a stream: a Session stream, or one
// session of a Sessions stream.
type hubStream interface {
	keyspace() string
	// poke sends the session's grants if they changed since they last
	// went (always, with force), without waiting on the stream.
	poke(force bool)
}

// keyspaceStreams are the followed sessions of one keyspace; its watcher
// runs while there are any.
type keyspaceStreams struct {
	streams map[hubStream]struct{}
	empty   chan struct{} // closed when the last stream leaves
}

func (st *sessionStream) keyspace() string { return st.sess.keyspace }

func (h *sessionHub) add(st hubStream) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ks == nil {
		h.ks = map[string]*keyspaceStreams{}
	}
	ks := st.keyspace()
	k := h.ks[ks]
	if k == nil {
		k = &keyspaceStreams{streams: map[hubStream]struct{}{}, empty: make(chan struct{})}
		h.ks[ks] = k
		// The first wait is for a change after now: st reads its first
		// grants after add returns.
		changed := h.s.view.keyspaceChanged(ks)
		go h.watch(ks, k, changed) // exits when k's last stream leaves
	}
	k.streams[st] = struct{}{}
}

func (h *sessionHub) remove(st hubStream) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ks := st.keyspace()
	k := h.ks[ks]
	if k == nil {
		return
	}
	delete(k.streams, st)
	if len(k.streams) == 0 {
		close(k.empty)
		delete(h.ks, ks)
	}
}

// watch pokes every stream of keyspace ks at each change of it, from the
// change that closes changed on, until k has no stream left.
func (h *sessionHub) watch(ks string, k *keyspaceStreams, changed <-chan struct{}) {
	var list []hubStream
	for {
		select {
		case <-changed:
		case <-k.empty:
			return
		}
		// Taken before the pokes read anything: a change while they run
		// wakes the next round.
		changed = h.s.view.keyspaceChanged(ks)
		h.mu.Lock()
		list = list[:0]
		for st := range k.streams {
			list = append(list, st)
		}
		h.mu.Unlock()
		for _, st := range list {
			st.poke(false)
		}
		clear(list)
	}
}
