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

// With SharedSessionStreams, the Workers of a Client follow their
// sessions on shared Sessions streams (MemberService.Sessions): one per
// replica, owned by the Client, each carrying many sessions' grants and
// keep-alives. A session's part of one (a sessionSub) stands in for its
// Session stream: the Worker's grants follower opens it, takes its grants
// and ends with its error, and while it is open keep sends keep-alives on
// it (see keepAliveOnce).
//
// A shared stream has two goroutines. The receiver (run, then serve)
// owns the stream: it opens it on the replica the Client prefers, hands
// each message to the sessions it names, and ends every session's part
// with the stream's error when the stream ends; it exits then. The
// sender (send), started and waited for by the receiver, writes the
// opens, keep-alives and closes that pile up meanwhile, each batch in
// one message, and exits when the receiver stops it. The receiver never
// waits for a Worker: a session's grants wait in its part, the newest
// replacing older ones (each message carries all of them), and a
// keep-alive's answer goes to a buffered channel.

// sessionsWindow is the least time between two keep-alive messages on
// a shared Sessions stream: keep-alives that fall due meanwhile wait and
// go together in the next. The fence deadline counts from when the
// keep-alive was asked for, so waiting here makes it earlier, never
// later; the wait is small next to the keep-alive's bound and the fence
// margin (at least 500ms). It sets how much rides in one message: 250
// sessions at a TTL of 10s ask for 75 keep-alives a second, about 8 in
// each of at most 10 messages (at 20ms, 50 messages of 1 or 2, and
// serve's work per message is most of what a keep-alive costs it).
const sessionsWindow = 100 * time.Millisecond

// sharedStreams are a Client's shared Sessions streams.
type sharedStreams struct {
	// window is the least time between two keep-alive messages on a
	// stream (sessionsWindow). Tests set it before the first stream.
	window time.Duration

	mu     sync.Mutex
	closed bool                  // (mu) the Client closed: no stream opens
	byEp   map[int]*sharedStream // (mu) replica (index in eps) → the stream that takes new sessions there
	wg     sync.WaitGroup        // the streams' receivers
}

func (m *sharedStreams) init() {
	m.window = sessionsWindow
	m.byEp = map[int]*sharedStream{}
}

// close stops new streams and waits for the receivers of the open ones,
// which end as the Client's context is cancelled.
func (m *sharedStreams) close() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.wg.Wait()
}

// sharedStream is one Sessions stream, on replica eps[n], from its
// opening to its end. Fields marked (mu) are guarded by mu, as are the
// (sh.mu) fields of its sessions' parts.
type sharedStream struct {
	c      *Client
	clock  clock.Clock
	window time.Duration
	n      int
	moved  context.Context // the Client's preference when the stream was opened
	ctx    context.Context // the stream's; cancelled when the last session leaves
	cancel context.CancelCauseFunc
	kick   chan struct{} // cap 1: there is something to send

	mu    sync.Mutex
	abort context.CancelCauseFunc // (mu) ends the stream as a failure (the replica did not answer)
	ended bool                    // (mu)
	subs  map[uint32]*sessionSub  // (mu) the sessions followed, by id
	last  uint32                  // (mu) the newest id
	// opens, renews and closes are to be sent, in the order they came.
	opens  []*keyshardv1.SessionsOpen // (mu)
	renews []*renewal                 // (mu)
	closes []uint32                   // (mu)
	ka     uint64                     // (mu) the number of the newest keep-alive sent
	kaSent time.Time                  // (mu) when it was sent
	// inflight: (mu) keep-alive number → its renewals, until answered.
	inflight map[uint64][]*renewal
}

// renewal is one session's keep-alive on a shared stream.
type renewal struct {
	sub    *sessionSub
	answer chan *keyshardv1.SessionRenewal // cap 1
	sent   bool                            // (sh.mu) it went in a keep-alive message
}

// sessionSub is one session's part of a shared stream, from its open to
// its end.
type sessionSub struct {
	sh     *sharedStream
	id     uint32
	s      *session
	notify chan struct{} // cap 1: grants came, or it ended
	done   chan struct{} // closed when it ends

	grants *keyshardv1.GetGrantsResponse // (sh.mu) the newest grants, not taken yet
	ended  bool                          // (sh.mu)
	// err: (sh.mu) why it ended, set before done is closed; nil if the
	// server ended the stream cleanly.
	err error
	// stopped: (sh.mu) the server stopped following it (ended): no close
	// is sent for it.
	stopped bool
}

// followShared follows session s's grants on the Client's shared
// Sessions stream to the preferred replica (opening one if there is
// none), calling yield for each message of grants, and carries keep's
// keep-alives while its part is open (from its first grants on). It
// returns when its part ends, with the error that ended it (the
// stream's, or the server's for this session: NOT_FOUND once the session
// ended), or when ctx ends; it leaves the stream then.
func (w *Worker) followShared(ctx context.Context, s *session, minRev uint64, yield func(*keyshardv1.GetGrantsResponse)) error {
	sub, err := w.c.shared.follow(w.c, s, minRev)
	if err != nil {
		return err
	}
	defer sub.leave()
	open := false
	for {
		select {
		case <-sub.notify:
		case <-ctx.Done():
			return ctx.Err()
		}
		g, ended, err := sub.take()
		if g != nil {
			if !open && !ended {
				open = true
				s.setStream(sub)
			}
			yield(g)
		}
		if ended {
			return err
		}
	}
}

// follow adds session s to the stream that takes new sessions at the
// preferred replica, opening one if there is none.
func (m *sharedStreams) follow(c *Client, s *session, minRev uint64) (*sessionSub, error) {
	n, moved := c.preferred()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || c.closed() {
		return nil, ErrClosed
	}
	sh := m.byEp[n]
	if sh == nil || sh.moved != moved {
		// None, or one opened before the Client moved away from the
		// replica and back: that one is ending.
		sh = &sharedStream{
			c: c, clock: c.opts.clock, window: m.window, n: n, moved: moved,
			kick: make(chan struct{}, 1), subs: map[uint32]*sessionSub{}, inflight: map[uint64][]*renewal{},
		}
		sh.ctx, sh.cancel = context.WithCancelCause(context.Background())
		sh.abort = sh.cancel
		m.byEp[n] = sh
		m.wg.Go(sh.run) // exits when the stream ended: it failed, the last session left it, or the Client moved on or closed
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.last++
	sub := &sessionSub{sh: sh, id: sh.last, s: s, notify: make(chan struct{}, 1), done: make(chan struct{})}
	sh.subs[sub.id] = sub
	sh.opens = append(sh.opens, &keyshardv1.SessionsOpen{Id: sub.id, Session: s.id, MinRevision: minRev})
	sh.wake()
	return sub, nil
}

// take returns the newest grants not taken yet (nil if none), whether
// the part ended, and why.
func (sub *sessionSub) take() (*keyshardv1.GetGrantsResponse, bool, error) {
	sub.sh.mu.Lock()
	defer sub.sh.mu.Unlock()
	g := sub.grants
	sub.grants = nil
	return g, sub.ended, sub.err
}

// leave ends the part, if it has not ended, and takes it off the
// stream: the server is told to stop following the session, unless it
// did already. The stream closes when its last session leaves.
func (sub *sessionSub) leave() {
	sh := sub.sh
	m := &sh.c.shared
	m.mu.Lock()
	sh.mu.Lock()
	if sh.subs[sub.id] == sub {
		delete(sh.subs, sub.id)
	}
	if !sub.ended {
		sub.endLocked(errors.New("the session left the Sessions stream"))
	}
	if !sub.stopped && !sh.ended {
		sh.closes = append(sh.closes, sub.id)
		sh.wake()
	}
	kept := sh.renews[:0]
	for _, r := range sh.renews {
		if r.sub != sub {
			kept = append(kept, r)
		}
	}
	sh.renews = kept
	last := len(sh.subs) == 0 && !sh.ended
	if last && m.byEp[sh.n] == sh {
		delete(m.byEp, sh.n)
	}
	sh.mu.Unlock()
	m.mu.Unlock()
	if last {
		sh.cancel(errors.New("no session follows the Sessions stream any more"))
	}
}

// endLocked ends the part with err: no keep-alive goes on it any more,
// and those waiting for an answer fail. It is called with sh.mu held.
func (sub *sessionSub) endLocked(err error) {
	if sub.ended {
		return
	}
	sub.ended, sub.err = true, err
	s := sub.s
	s.streamMu.Lock()
	if s.stream == sub {
		s.stream = nil
	}
	s.streamMu.Unlock()
	close(sub.done)
	sub.wakeLocked()
}

func (sub *sessionSub) wakeLocked() {
	select {
	case sub.notify <- struct{}{}:
	default:
	}
}

// keepAlive asks for a keep-alive of the session on the shared stream
// and returns the TTL its answer gives. It goes in the stream's next
// keep-alive message (see send). One not answered within limit, counted
// from now, ends the whole stream, as on a Session stream: the stream is
// stuck, and its answers come in order. It returns errNotSent if the
// part ended before the keep-alive went out, an error wrapping
// errStreamEnded if it ended before the answer, or the error the answer
// carries.
func (sub *sessionSub) keepAlive(ctx context.Context, limit time.Duration) (time.Duration, error) {
	sh := sub.sh
	r := &renewal{sub: sub, answer: make(chan *keyshardv1.SessionRenewal, 1)}
	sh.mu.Lock()
	if sub.ended {
		sh.mu.Unlock()
		return 0, errNotSent
	}
	sh.renews = append(sh.renews, r)
	abort := sh.abort
	sh.wake()
	sh.mu.Unlock()
	t := sh.clock.AfterFunc(limit, func() {
		abort(fmt.Errorf("the keep-alive of session %s not answered within %v", sub.s.id, limit))
	})
	defer t.Stop()
	select {
	case a := <-r.answer:
		return sh.result(a)
	case <-sub.done:
		select {
		case a := <-r.answer:
			return sh.result(a)
		default:
		}
		sh.mu.Lock()
		sent, err := r.sent, sub.err
		sh.mu.Unlock()
		if !sent {
			return 0, errNotSent
		}
		if err == nil {
			err = errors.New("the server ended the Sessions stream")
		}
		return 0, fmt.Errorf("%w: %w", errStreamEnded, err)
	case <-ctx.Done():
		sh.mu.Lock()
		for i, p := range sh.renews {
			if p == r {
				sh.renews = append(sh.renews[:i], sh.renews[i+1:]...)
				break
			}
		}
		sh.mu.Unlock()
		return 0, ctx.Err()
	}
}

// result is what renewal a says: the TTL left, or the error that it
// carries, as the KeepAlive call would have returned it.
func (sh *sharedStream) result(a *keyshardv1.SessionRenewal) (time.Duration, error) {
	return keepAliveResult(sh.c, a.GetErrorCode(), a.GetErrorMessage(), a.GetTtl().AsDuration(), "Sessions")
}

// wake tells the sender there is something to send.
func (sh *sharedStream) wake() {
	select {
	case sh.kick <- struct{}{}:
	default:
	}
}

// run opens the stream on replica eps[n] and serves it until it ends,
// then ends every session's part with its error.
func (sh *sharedStream) run() {
	err := bidiOn(sh.ctx, sh.c, sh.n, sh.moved, memberAPI.Sessions, sh.serve)
	sh.end(err)
}

// end ends the stream with err: no session joins it any more, and every
// part ends with err.
func (sh *sharedStream) end(err error) {
	m := &sh.c.shared
	m.mu.Lock()
	if m.byEp[sh.n] == sh {
		delete(m.byEp, sh.n)
	}
	m.mu.Unlock()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.ended = true
	for id, sub := range sh.subs {
		sub.endLocked(err)
		delete(sh.subs, id)
	}
	sh.opens, sh.renews, sh.closes = nil, nil, nil
}

// serve receives the stream's messages and hands each to the sessions it
// names, while the sender writes; it returns when the stream ends.
func (sh *sharedStream) serve(b *bidiStream[keyshardv1.SessionsRequest, keyshardv1.SessionsResponse]) error {
	sh.mu.Lock()
	sh.abort = b.abort
	sh.mu.Unlock()
	stop := make(chan struct{})
	var sending sync.WaitGroup
	sending.Go(func() { sh.send(b, stop) }) // exits when stop closes, or a send fails
	defer func() {
		b.closeRequest() // unblocks a send waiting on flow control
		close(stop)
		sending.Wait()
	}()
	for {
		msg, err := b.st.Receive()
		if errors.Is(err, io.EOF) {
			return nil // the server ended the stream
		}
		if err != nil {
			return err
		}
		sh.dispatch(msg)
	}
}

// send writes what the sessions ask for, as it comes: opens and closes
// at once, keep-alives at most one message per window (those asked for
// meanwhile wait for the next), each message with everything pending.
// It returns when stop closes or a send fails (the receiver then learns
// why the stream ended).
func (sh *sharedStream) send(b *bidiStream[keyshardv1.SessionsRequest, keyshardv1.SessionsResponse], stop <-chan struct{}) {
	var hold clock.Timer // running while keep-alives wait for the window
	defer func() {
		if hold != nil {
			hold.Stop()
		}
	}()
	for {
		var holdC <-chan time.Time
		if hold != nil {
			holdC = hold.C()
		}
		select {
		case <-stop:
			return
		case <-sh.kick:
		case <-holdC:
			hold = nil
		}
		msg, wait := sh.next()
		if wait > 0 && hold == nil {
			hold = sh.clock.NewTimer(wait)
		}
		if msg == nil {
			continue
		}
		if err := b.send(msg); err != nil {
			if !errors.Is(err, io.EOF) { // io.EOF: the stream failed, and Receive says why
				b.abort(fmt.Errorf("send on the Sessions stream: %w", err))
			}
			return
		}
	}
}

// next takes what is to be sent now, as one message (nil if nothing),
// and returns how long the keep-alives left waiting must wait for the
// window (0: none wait).
func (sh *sharedStream) next() (*keyshardv1.SessionsRequest, time.Duration) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	msg := &keyshardv1.SessionsRequest{Open: sh.opens, Close: sh.closes}
	sh.opens, sh.closes = nil, nil
	var wait time.Duration
	if len(sh.renews) > 0 {
		now := sh.clock.Now()
		if sh.ka > 0 {
			wait = sh.kaSent.Add(sh.window).Sub(now)
		}
		if wait <= 0 {
			wait = 0
			listed := map[uint32]bool{}
			var batch, rest []*renewal
			for _, r := range sh.renews {
				if listed[r.sub.id] { // the stream lists a session once per keep-alive
					rest = append(rest, r)
					continue
				}
				listed[r.sub.id] = true
				r.sent = true
				batch = append(batch, r)
				msg.Renew = append(msg.Renew, r.sub.id)
			}
			sh.ka++
			sh.kaSent = now
			msg.KeepAlive = sh.ka
			sh.inflight[sh.ka] = batch
			sh.renews = rest
			if len(rest) > 0 {
				wait = sh.window
			}
		}
	}
	if len(msg.Open) == 0 && len(msg.Close) == 0 && msg.KeepAlive == 0 {
		return nil, wait
	}
	return msg, wait
}

// dispatch hands message msg to the sessions it names: grants to their
// parts, a keep-alive's answer to its renewals, and the end of the
// sessions the server stopped following.
func (sh *sharedStream) dispatch(msg *keyshardv1.SessionsResponse) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for _, g := range msg.GetGrants() {
		if sub := sh.subs[g.GetId()]; sub != nil && g.GetGrants() != nil {
			sub.grants = g.GetGrants()
			sub.wakeLocked()
		}
	}
	if a := msg.GetKeepAlive(); a != nil {
		sh.answeredLocked(a)
	}
	for _, e := range msg.GetEnded() {
		sub := sh.subs[e.GetId()]
		if sub == nil {
			continue
		}
		delete(sh.subs, sub.id)
		sub.stopped = true
		sub.endLocked(sh.c.endedError(sub.s.id, e))
	}
}

// answeredLocked hands each renewal of keep-alive answer a to the
// keep-alive it answers. A renewal the answer lacks fails.
func (sh *sharedStream) answeredLocked(a *keyshardv1.SessionsKeepAliveAnswer) {
	batch := sh.inflight[a.GetKeepAlive()]
	delete(sh.inflight, a.GetKeepAlive())
	byID := make(map[uint32]*keyshardv1.SessionRenewal, len(a.GetRenewals()))
	for _, rn := range a.GetRenewals() {
		byID[rn.GetId()] = rn
	}
	for _, r := range batch {
		rn := byID[r.sub.id]
		if rn == nil {
			rn = &keyshardv1.SessionRenewal{Id: r.sub.id, ErrorCode: connect.CodeInternal.String(),
				ErrorMessage: fmt.Sprintf("the answer to keep-alive %d of the Sessions stream lacks session %s (id %d)", a.GetKeepAlive(), r.sub.s.id, r.sub.id)}
		}
		r.answer <- rn // cap 1, and each renewal is answered once
	}
}

// endedError is the error of session sid's part of a Sessions stream
// that the server stopped following, as e says: wrapping ErrNotFound if
// the session ended or was replaced.
func (c *Client) endedError(sid string, e *keyshardv1.SessionEnded) error {
	var code connect.Code
	if err := code.UnmarshalText([]byte(e.GetErrorCode())); err != nil {
		code = connect.CodeUnknown
	}
	return c.translate(connect.NewError(code, fmt.Errorf("%s (the Sessions stream stopped following session %s)", e.GetErrorMessage(), sid)))
}
