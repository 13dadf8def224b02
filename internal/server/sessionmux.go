package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
)

// Sessions serves a Sessions stream: many sessions' Session streams on
// one HTTP/2 stream. Each session on it is served as on a Session stream
// of its own (the same grants news, the same renewal); what a replica
// saves is the stream, its goroutine and its message per keep-alive: a
// process running 250 members holds one stream and sends one message per
// keep-alive tick for all of them.
//
// A stream costs one goroutine, its handler's, which receives the
// process's messages and applies each in turn: opens, then the
// keep-alive (its renewals run side by side, and one message answers
// them all), then closes. Grants go out from a short-lived goroutine of
// the stream's, started when any of its sessions' grants change (the
// keyspaces' watchers in sessionHub poke each session), which sends the
// grants of every session that changed in as few messages as it can.
func (m *memberService) Sessions(ctx context.Context, stream *connect.BidiStream[v1.SessionsRequest, v1.SessionsResponse]) error {
	return m.sessions(ctx, stream, readDeadlineCut(ctx), false)
}

// sessionsConn is a Sessions stream as its handler uses it: connect's
// stream or grpc-go's (see grpcSessions).
type sessionsConn interface {
	Receive() (*v1.SessionsRequest, error)
	Send(*v1.SessionsResponse) error
}

// grantsPerMessage bounds the sessions' grants one message carries, so
// that a keyspace change that touches every session on a stream goes out
// in messages of bounded size.
const grantsPerMessage = 256

// sessions serves a Sessions stream on conn; cut and ctxCuts as for
// session.
func (m *memberService) sessions(ctx context.Context, conn sessionsConn, cut func(), ctxCuts bool) error {
	mx := &sessionMux{m: m, ctx: ctx, conn: conn, streamEnd: streamEnd{cut: cut}, subs: map[uint32]*muxSession{}, tokens: map[string]uint32{}}
	defer mx.drain() // first of the deferred: nothing sends on the stream after the handler
	if !ctxCuts {
		stop := context.AfterFunc(ctx, mx.unblock)
		defer stop()
	}
	for {
		msg, err := conn.Receive()
		if err != nil {
			return mx.end(mx.ctx, err)
		}
		if err := mx.apply(msg); err != nil {
			return mx.end(mx.ctx, err)
		}
	}
}

// sessionMux is one Sessions stream.
type sessionMux struct {
	m    *memberService
	ctx  context.Context
	conn sessionsConn
	streamEnd

	// subs and tokens are the sessions followed, by id and by token;
	// only the handler reads and changes them, under mu when it changes
	// them.
	mu     sync.Mutex
	subs   map[uint32]*muxSession
	tokens map[string]uint32
	queue  []*muxSession // (mu) sessions whose grants may have changed
	// gone: (mu) sessions the sender found ended, which the handler
	// drops before it applies the next message.
	gone []*muxSession

	// sending: a goroutine sends the grants; pending: queue may have
	// grown since it looked.
	sending, pending atomic.Bool
}

// muxSession is one session followed on a Sessions stream.
type muxSession struct {
	mx      *sessionMux
	id      uint32
	token   string
	sess    session
	release func() // its long-poll slot

	news    grantsNews // (the sender's) what was sent
	sentRev atomic.Uint64
	started atomic.Bool
	queued  atomic.Bool // in mx.queue
	gone    atomic.Bool // closed or ended: sends nothing more
	dropped bool        // (the handler's) no longer followed
}

func (ms *muxSession) keyspace() string { return ms.sess.keyspace }

// poke queues the session's grants to be sent if they changed since they
// last went (always, with force).
func (ms *muxSession) poke(force bool) {
	if ms.gone.Load() || !force && ms.started.Load() && ms.mx.m.s.grantsUnchanged(ms.sess, ms.sentRev.Load()) {
		return
	}
	if ms.queued.CompareAndSwap(false, true) {
		ms.mx.mu.Lock()
		ms.mx.queue = append(ms.mx.queue, ms)
		ms.mx.mu.Unlock()
	}
	ms.mx.kick()
}

// apply applies one message of the process: opens, the keep-alive, then
// closes. An error ends the stream.
func (mx *sessionMux) apply(msg *v1.SessionsRequest) error {
	mx.mu.Lock()
	gone := mx.gone
	mx.gone = nil
	mx.mu.Unlock()
	for _, ms := range gone {
		mx.drop(ms)
	}
	if err := mx.check(msg); err != nil {
		return err
	}
	if err := mx.open(msg.GetOpen()); err != nil {
		return err
	}
	if len(msg.GetRenew()) > 0 {
		if err := mx.renew(msg.GetKeepAlive(), msg.GetRenew()); err != nil {
			return err
		}
	}
	for _, id := range msg.GetClose() {
		if ms := mx.subs[id]; ms != nil {
			mx.drop(ms)
		}
	}
	return nil
}

// check refuses a message that the process got wrong, before any of it is
// applied.
func (mx *sessionMux) check(msg *v1.SessionsRequest) error {
	if msg.GetKeepAlive() == 0 && len(msg.GetRenew()) > 0 {
		return invalid("keep_alive: 0 with renew set; number keep-alives from 1")
	}
	if msg.GetKeepAlive() != 0 && len(msg.GetRenew()) == 0 {
		return invalid("keep_alive: %d with renew empty; list the ids of the sessions it renews", msg.GetKeepAlive())
	}
	opening := map[uint32]bool{}
	for i, o := range msg.GetOpen() {
		switch {
		case o.GetId() == 0:
			return invalid("open[%d].id: 0; number sessions from 1", i)
		case mx.subs[o.GetId()] != nil || opening[o.GetId()]:
			return invalid("open[%d].id: %d is followed on this stream already; give each session an id not in use", i, o.GetId())
		case o.GetSession() == "":
			return invalid("open[%d].session: empty; pass the session that Join returned", i)
		}
		if id, dup := mx.tokens[o.GetSession()]; dup {
			return invalid("open[%d].session is followed on this stream already, as id %d", i, id)
		}
		opening[o.GetId()] = true
	}
	renewing := map[uint32]bool{}
	for i, id := range msg.GetRenew() {
		if renewing[id] {
			return invalid("renew[%d]: id %d is listed twice; list each session once", i, id)
		}
		renewing[id] = true
	}
	return nil
}

// open follows the sessions opens names: each takes a long-poll slot, as
// a Session stream does, and its grants go out once this replica's copy
// of the store has reached its min_revision. A session whose token is
// malformed ends the stream; one that finds no slot, or a copy that
// stays behind, is listed in ended.
func (mx *sessionMux) open(opens []*v1.SessionsOpen) error {
	if len(opens) == 0 {
		return nil
	}
	var ended []*v1.SessionEnded
	var minRev uint64
	var added []*muxSession
	for i, o := range opens {
		sess, err := mx.m.s.sessions.parse(o.GetSession())
		if err != nil {
			for _, ms := range added {
				mx.drop(ms)
			}
			return invalid("open[%d] (id %d): %s", i, o.GetId(), strings.TrimPrefix(connectMessage(err), errInvalid.Error()+": "))
		}
		release, err := mx.m.s.polls.hold()
		if err != nil {
			ended = append(ended, endedOf(o.GetId(), err))
			continue
		}
		ms := &muxSession{mx: mx, id: o.GetId(), token: o.GetSession(), sess: sess, release: release}
		mx.mu.Lock()
		mx.subs[ms.id] = ms
		mx.tokens[o.GetSession()] = ms.id
		mx.mu.Unlock()
		added = append(added, ms)
		minRev = max(minRev, o.GetMinRevision())
	}
	if err := mx.m.s.catchUp(mx.ctx, minRev); err != nil {
		if mx.ctx.Err() != nil {
			return err
		}
		for _, ms := range added {
			mx.drop(ms)
			ended = append(ended, endedOf(ms.id, err))
		}
		added = nil
	}
	if len(ended) > 0 {
		if err := mx.send(&v1.SessionsResponse{Ended: ended}); err != nil {
			return err
		}
	}
	for _, ms := range added {
		mx.m.s.sessionHub.add(ms)
		ms.poke(true)
	}
	return nil
}

// renew renews the sessions ids name for keep-alive n, side by side (the
// store renews them in its batches), and answers with one message. A
// session that ended or was replaced is answered not_found and no longer
// followed.
func (mx *sessionMux) renew(n uint64, ids []uint32) error {
	renewals := make([]*v1.SessionRenewal, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		ms := mx.subs[id]
		if ms == nil {
			renewals[i] = &v1.SessionRenewal{Id: id, ErrorCode: connect.CodeNotFound.String(), ErrorMessage: fmt.Sprintf("no session is followed as id %d on this stream (closed, ended, or never opened); open it again", id)}
			continue
		}
		wg.Go(func() { // exits once the renewal is done; bounded by the stream's context
			ttl, err := mx.m.keepAlive(mx.ctx, ms.sess)
			mx.m.s.metrics.keepAlives.WithLabelValues("shared", keepAliveResult(err)).Inc()
			r := &v1.SessionRenewal{Id: id}
			if err == nil {
				r.Ttl = durationpb.New(ttl)
			} else {
				r.ErrorCode, r.ErrorMessage = connect.CodeOf(err).String(), connectMessage(err)
			}
			renewals[i] = r
		})
	}
	wg.Wait()
	if err := mx.ctx.Err(); err != nil {
		return err
	}
	resp := &v1.SessionsResponse{KeepAlive: &v1.SessionsKeepAliveAnswer{KeepAlive: n, Renewals: renewals}}
	for _, r := range renewals {
		if r.GetErrorCode() != connect.CodeNotFound.String() {
			continue
		}
		if ms := mx.subs[r.GetId()]; ms != nil {
			mx.drop(ms)
			resp.Ended = append(resp.Ended, &v1.SessionEnded{Id: r.GetId(), ErrorCode: r.GetErrorCode(), ErrorMessage: r.GetErrorMessage()})
		}
	}
	return mx.send(resp)
}

// drop stops following ms: the handler's.
func (mx *sessionMux) drop(ms *muxSession) {
	if ms.dropped {
		return
	}
	ms.dropped = true
	ms.gone.Store(true)
	mx.mu.Lock()
	delete(mx.subs, ms.id)
	delete(mx.tokens, ms.token)
	mx.mu.Unlock()
	mx.m.s.sessionHub.remove(ms)
	ms.release()
}

// kick makes the stream send the queued sessions' grants, in a goroutine
// of its own, so that the keyspaces' watchers never wait on a stream.
func (mx *sessionMux) kick() {
	mx.pending.Store(true)
	if mx.sending.CompareAndSwap(false, true) {
		go mx.flush() // exits once the queue is sent and nothing was queued meanwhile
	}
}

func (mx *sessionMux) flush() {
	for {
		mx.pending.Store(false)
		ok := mx.sendGrants()
		mx.sending.Store(false)
		if !ok || !mx.pending.Load() || !mx.sending.CompareAndSwap(false, true) {
			return
		}
	}
}

// sendGrants sends the grants of every queued session that has yet to
// see them; false once the stream is closing or must end.
func (mx *sessionMux) sendGrants() bool {
	mx.mu.Lock()
	queue := mx.queue
	mx.queue = nil
	mx.mu.Unlock()
	var resp v1.SessionsResponse
	var sent []*muxSession
	flushMsg := func() bool {
		if len(resp.Grants) == 0 && len(resp.Ended) == 0 {
			return true
		}
		if err := mx.send(&resp); err != nil {
			return false
		}
		for i, ms := range sent {
			g := resp.Grants[i].GetGrants()
			ms.news.sent(g)
			ms.sentRev.Store(g.GetRevision())
			ms.started.Store(true)
		}
		resp, sent = v1.SessionsResponse{}, sent[:0]
		return true
	}
	for _, ms := range queue {
		ms.queued.Store(false) // a change from here on queues it again
		if ms.gone.Load() {
			continue
		}
		g, err := ms.news.next(mx.ctx, mx.m.s, ms.sess)
		switch {
		case err != nil && mx.ctx.Err() != nil:
			return false
		case connect.CodeOf(err) == connect.CodeNotFound:
			ms.gone.Store(true)
			mx.mu.Lock()
			mx.gone = append(mx.gone, ms) // dropped by the handler, before its next message
			mx.mu.Unlock()
			resp.Ended = append(resp.Ended, endedOf(ms.id, err))
		case err != nil:
			// Not the session's end (etcd slow to answer whether it
			// lives): tried again at the keyspace's next change.
			mx.m.s.log.Warn("keyshard: Sessions stream: could not read a session's grants; trying again at the next change", "session", ms.sess.member, "keyspace", ms.sess.keyspace, "err", err)
			continue
		case g != nil:
			resp.Grants = append(resp.Grants, &v1.SessionGrants{Id: ms.id, Grants: g})
			sent = append(sent, ms)
		}
		if len(resp.Grants)+len(resp.Ended) >= grantsPerMessage && !flushMsg() {
			return false
		}
	}
	return flushMsg()
}

// send sends resp, unless the stream is closing or a send failed; a
// failed send ends the stream.
func (mx *sessionMux) send(resp *v1.SessionsResponse) error {
	mx.sendMu.Lock()
	defer mx.sendMu.Unlock()
	if mx.closed {
		return errors.New("the stream is closing")
	}
	if mx.err != nil {
		return mx.err
	}
	if err := mx.conn.Send(resp); err != nil {
		mx.err = err
		mx.unblock()
		return err
	}
	return nil
}

// drain stops every use of the stream and drops its sessions: the
// handler is returning.
func (mx *sessionMux) drain() {
	mx.close()
	subs := make([]*muxSession, 0, len(mx.subs))
	for _, ms := range mx.subs {
		subs = append(subs, ms)
	}
	for _, ms := range subs {
		mx.drop(ms)
	}
}

// endedOf is the entry saying the stream stopped following session id
// because of err.
func endedOf(id uint32, err error) *v1.SessionEnded {
	return &v1.SessionEnded{Id: id, ErrorCode: connect.CodeOf(err).String(), ErrorMessage: connectMessage(err)}
}

// connectMessage is err's message without connect's code prefix.
func connectMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}
