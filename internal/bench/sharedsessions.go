package bench

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
)

// sharedWindow is how often a Sessions stream of the simulated members
// sends the keep-alives that fell due: each member's keep-alive goes at
// most that long after its due time (lease TTL / 3 after its previous
// one), in one message with every other member's due by then.
const sharedWindow = 100 * time.Millisecond

// sessionGroup is perStream simulated members of a process sharing one
// Sessions stream (ScaleOptions.SessionsPerStream): one message per
// window carries all their keep-alives that fell due, and their grants
// come on it. Its runner goroutine owns the stream: it opens it, sends
// on it, and opens a new one when it breaks; the stream's receive
// goroutine hands the answers to the runner and the grants to the
// members.
type sessionGroup struct {
	f   *fleet
	api keyshardv1connect.MemberServiceClient

	mu      sync.Mutex
	members map[uint32]*groupMember // by id on the stream
	nextID  uint32
	opens   []uint32 // ids to open on the stream (all, after a new one)
	started bool     // the runner runs
}

// groupMember is one member of a sessionGroup.
type groupMember struct {
	m   *simMember
	id  uint32
	ctx context.Context // ends when the member stops

	// (the group's mu)
	due    time.Time // when its next keep-alive is due
	sentAt time.Time // when its keep-alive in flight went; zero: none

	applying sync.Mutex     // one release at a time
	g        grantsFollower // (applying)
	minRev   atomic.Uint64  // the newest revision it has seen
}

// group returns the group the next member joins: a new one every
// perStream members, its stream on the connection of its first member
// (every member counts towards perConn, as without groups).
func (f *fleet) group() *sessionGroup {
	api := f.client()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.joinedShared%f.perStream == 0 {
		f.groups = append(f.groups, &sessionGroup{f: f, api: api, members: map[uint32]*groupMember{}})
	}
	f.joinedShared++
	return f.groups[len(f.groups)-1]
}

// joinShared joins a member whose session goes on a shared Sessions
// stream.
func (f *fleet) joinShared(ctx context.Context, ks, id string) (*simMember, error) {
	g := f.group()
	m := &simMember{keyspace: ks, id: id, api: g.api}
	if err := f.session(ctx, m); err != nil {
		return nil, err
	}
	mctx, cancel := context.WithCancel(ctx)
	m.stop = cancel
	g.add(ctx, mctx, m)
	return m, nil
}

// add puts m, joined and activated, on the group's stream; it leaves
// when mctx ends (the member stops). fctx is the fleet's: the group's
// stream runs until it ends.
func (g *sessionGroup) add(fctx, mctx context.Context, m *simMember) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.nextID++
	gm := &groupMember{m: m, id: g.nextID, ctx: mctx, due: time.Now().Add(m.ttl / 3)}
	gm.g = grantsFollower{f: g.f, m: m, released: map[[2]uint64]bool{}}
	g.members[gm.id] = gm
	g.opens = append(g.opens, gm.id)
	context.AfterFunc(mctx, func() { g.leave(gm) })
	if !g.started {
		g.started = true
		g.f.wg.Go(func() { g.run(fctx) }) // exits when the fleet stops
	}
}

// leave takes gm off the stream: its member stopped, or lost its
// session.
func (g *sessionGroup) leave(gm *groupMember) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.members[gm.id] == gm {
		delete(g.members, gm.id)
	}
}

// groupAnswer is what the runner learns from its stream: a keep-alive's
// answer, or the stream's end.
type groupAnswer struct {
	ka  *keyshardv1.SessionsKeepAliveAnswer
	err error // the stream ended
}

// run keeps the group's stream open and sends the due keep-alives and
// opens once per sharedWindow, until ctx (the fleet's) ends.
func (g *sessionGroup) run(ctx context.Context) {
	for ctx.Err() == nil {
		err := g.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			g.f.streamErrs.Add(1)
		}
		pause(ctx, 100*time.Millisecond)
	}
}

// stream serves one Sessions stream until it breaks or ctx ends.
func (g *sessionGroup) stream(ctx context.Context) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st := g.api.Sessions(sctx)
	defer func() { _ = st.CloseResponse() }()
	g.mu.Lock()
	g.opens = g.opens[:0]
	for id := range g.members {
		g.opens = append(g.opens, id) // every session, on the new stream
	}
	for _, gm := range g.members {
		gm.sentAt = time.Time{}
	}
	g.mu.Unlock()

	answers := make(chan groupAnswer, 16)
	var recv sync.WaitGroup
	defer recv.Wait()
	defer cancel()
	recv.Go(func() { g.receive(sctx, st, answers) }) // exits when the stream ends
	tick := time.NewTicker(sharedWindow)
	defer tick.Stop()
	var n uint64
	for {
		select {
		case <-ctx.Done():
			_ = st.CloseRequest()
			return ctx.Err()
		case a := <-answers:
			if a.err != nil {
				_ = st.CloseRequest()
				return a.err
			}
			g.answered(ctx, a.ka)
			continue
		case <-tick.C:
		}
		msg := g.due(&n)
		if msg == nil {
			continue
		}
		if err := st.Send(msg); err != nil {
			_ = st.CloseRequest()
			return err
		}
	}
}

// due is the next message: the opens pending and the keep-alives due
// now, numbered n+1; nil when there are none.
func (g *sessionGroup) due(n *uint64) *keyshardv1.SessionsRequest {
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	msg := &keyshardv1.SessionsRequest{}
	for _, id := range g.opens {
		if gm := g.members[id]; gm != nil {
			msg.Open = append(msg.Open, &keyshardv1.SessionsOpen{Id: id, Session: gm.m.session, MinRevision: gm.minRev.Load()})
		}
	}
	g.opens = g.opens[:0]
	for id, gm := range g.members {
		if !gm.sentAt.IsZero() && now.Sub(gm.sentAt) > gm.m.ttl/3 {
			g.f.keepAliveFailed(connect.NewError(connect.CodeDeadlineExceeded, errors.New("keep-alive on the Sessions stream not answered within TTL/3")))
			gm.sentAt = time.Time{}
		}
		if gm.sentAt.IsZero() && !now.Before(gm.due) {
			msg.Renew = append(msg.Renew, id)
			gm.sentAt, gm.due = now, now.Add(gm.m.ttl/3)
		}
	}
	if len(msg.Renew) > 0 {
		*n++
		msg.KeepAlive = *n
	}
	if len(msg.Open) == 0 && len(msg.Renew) == 0 {
		return nil
	}
	return msg
}

// answered counts a keep-alive's renewals; a member whose session ended
// joins again.
func (g *sessionGroup) answered(ctx context.Context, a *keyshardv1.SessionsKeepAliveAnswer) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, r := range a.GetRenewals() {
		gm := g.members[r.GetId()]
		if gm == nil {
			continue // left meanwhile
		}
		gm.sentAt = time.Time{}
		switch r.GetErrorCode() {
		case "":
			g.f.keepAlivesOK.Add(1)
		case connect.CodeNotFound.String():
			g.lostLocked(ctx, gm)
		default:
			var code connect.Code
			if err := code.UnmarshalText([]byte(r.GetErrorCode())); err != nil {
				code = connect.CodeUnknown
			}
			g.f.keepAliveFailed(connect.NewError(code, errors.New(r.GetErrorMessage())))
		}
	}
}

// lostLocked takes gm, whose session ended, off the stream, and joins it
// again with a new session after 1 s (then every TTL), as run does for a
// member on a stream of its own. fctx is the fleet's.
func (g *sessionGroup) lostLocked(fctx context.Context, gm *groupMember) {
	if g.members[gm.id] != gm {
		return
	}
	delete(g.members, gm.id)
	g.f.sessionsLost.Add(1)
	ctx := gm.ctx
	g.f.wg.Go(func() { // exits once the member joined again or stopped
		for wait := time.Second; ; wait = gm.m.ttl {
			pause(ctx, wait)
			if ctx.Err() != nil {
				return
			}
			// A new simMember: releases of the old session may still run.
			m := &simMember{keyspace: gm.m.keyspace, id: gm.m.id, api: gm.m.api, stop: gm.m.stop}
			if err := g.f.session(ctx, m); err == nil {
				g.f.rejoins.Add(1)
				g.add(fctx, ctx, m)
				return
			}
			g.f.rejoinErrs.Add(1)
		}
	})
}

// receive reads st until it ends: grants go to their members (releasing
// what they are asked to, each member's in turn), ended sessions join
// again, and keep-alive answers and the end go to the runner.
func (g *sessionGroup) receive(ctx context.Context, st *connect.BidiStreamForClient[keyshardv1.SessionsRequest, keyshardv1.SessionsResponse], answers chan<- groupAnswer) {
	for {
		msg, err := st.Receive()
		if err != nil {
			select {
			case answers <- groupAnswer{err: err}:
			case <-ctx.Done():
			}
			return
		}
		for _, sg := range msg.GetGrants() {
			g.mu.Lock()
			gm := g.members[sg.GetId()]
			g.mu.Unlock()
			if gm == nil {
				continue
			}
			grants := sg.GetGrants()
			seen(&gm.minRev, grants.GetRevision())
			if len(grants.GetRelease()) == 0 {
				continue
			}
			g.f.wg.Go(func() { // exits once the release is answered
				gm.applying.Lock()
				defer gm.applying.Unlock()
				gm.g.apply(gm.ctx, grants)
				seen(&gm.minRev, gm.g.minRev)
			})
		}
		if len(msg.GetEnded()) > 0 {
			g.mu.Lock()
			for _, e := range msg.GetEnded() {
				if gm := g.members[e.GetId()]; gm != nil {
					g.lostLocked(ctx, gm)
				}
			}
			g.mu.Unlock()
		}
		if ka := msg.GetKeepAlive(); ka != nil {
			select {
			case answers <- groupAnswer{ka: ka}:
			case <-ctx.Done():
				return
			}
		}
	}
}

// seen raises rev to at least r.
func seen(rev *atomic.Uint64, r uint64) {
	for {
		cur := rev.Load()
		if r <= cur || rev.CompareAndSwap(cur, r) {
			return
		}
	}
}
