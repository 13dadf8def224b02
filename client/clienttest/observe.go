package clienttest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
)

// Requests are the requests of one kind that the fake received, in the
// order they arrived, for the test to take one at a time. A request is
// recorded when its call is admitted (its token checked), before the
// fake's faults or state answer it: a call that then fails, hangs or is
// held is recorded too. It is recorded in the same step in which the
// call takes the faults in force (the fault switches of Server), which
// answer it: once the test has taken a request, switching a fault changes
// the answers of later calls only. Nothing is dropped and the fake never
// waits for the test. Its methods are safe for concurrent use.
type Requests[T any] struct {
	mu      sync.Mutex
	queue   []T
	changed chan struct{} // closed and replaced on every add
}

func newRequests[T any]() *Requests[T] { return &Requests[T]{changed: make(chan struct{})} }

func (r *Requests[T]) add(v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queue = append(r.queue, v)
	close(r.changed)
	r.changed = make(chan struct{})
}

// Next returns the oldest request not taken yet, waiting for one if none
// is. It fails tb if none arrives within a minute of real time (a guard
// against a hang, never a pace) or when tb's context ends. Call it from
// the test's goroutine.
func (r *Requests[T]) Next(tb testing.TB) T {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), stuckAfter)
	defer cancel()
	v, err := r.Wait(ctx)
	if err != nil {
		var zero T
		tb.Fatalf("clienttest: waiting for a %T: %v", zero, err)
	}
	return v
}

// Wait is Next bounded by ctx, for code without a testing.TB: it returns
// the oldest request not taken yet, or ctx's error.
func (r *Requests[T]) Wait(ctx context.Context) (T, error) {
	for {
		r.mu.Lock()
		if len(r.queue) > 0 {
			v := r.queue[0]
			r.queue = r.queue[1:]
			r.mu.Unlock()
			return v, nil
		}
		ch := r.changed
		r.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			var zero T
			return zero, fmt.Errorf("no %T arrived: %w", zero, ctx.Err())
		}
	}
}

// Len returns how many requests arrived that were not taken yet.
func (r *Requests[T]) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queue)
}

type observations struct {
	joins          *Requests[*keyshardv1.JoinRequest]
	keepAlives     *Requests[*keyshardv1.KeepAliveRequest]
	releases       *Requests[*keyshardv1.ReleaseRequest]
	commits        *Requests[*keyshardv1.CommitRequest]
	leaves         *Requests[*keyshardv1.LeaveRequest]
	grantPolls     *Requests[*keyshardv1.GetGrantsRequest]
	mapPolls       *Requests[*keyshardv1.GetMapRequest]
	mapWatches     *Requests[*keyshardv1.WatchMapRequest]
	sessionStreams *Requests[*keyshardv1.SessionRequest]
	reports        *Requests[*keyshardv1.ReportHotKeysRequest]
	setPolls       *Requests[*keyshardv1.GetOverflowSetRequest]
	setWatches     *Requests[*keyshardv1.WatchOverflowSetRequest]
	delays         *Requests[string]
	poolJoins      *Requests[*keyshardv1.JoinPoolRequest]
	poolKeepAlives *Requests[*keyshardv1.PoolKeepAliveRequest]
	loadReports    *Requests[*keyshardv1.ReportLoadRequest]
	readies        *Requests[*keyshardv1.MarkReadyRequest]
	poolPolls      *Requests[*keyshardv1.GetPoolSnapshotRequest]
	poolWatches    *Requests[*keyshardv1.WatchPoolSnapshotRequest]

	// sessionsStreams are the first messages of Sessions streams (the
	// interceptor records them); sessionsMessages all of their messages
	// (their readers record them).
	sessionsStreams  *Requests[*keyshardv1.SessionsRequest]
	sessionsMessages *Requests[*keyshardv1.SessionsRequest]
}

// init makes the queues and returns, by procedure, the function that
// records a request of it.
func (o *observations) init() map[string]func(any) {
	o.joins = newRequests[*keyshardv1.JoinRequest]()
	o.keepAlives = newRequests[*keyshardv1.KeepAliveRequest]()
	o.releases = newRequests[*keyshardv1.ReleaseRequest]()
	o.commits = newRequests[*keyshardv1.CommitRequest]()
	o.leaves = newRequests[*keyshardv1.LeaveRequest]()
	o.grantPolls = newRequests[*keyshardv1.GetGrantsRequest]()
	o.mapPolls = newRequests[*keyshardv1.GetMapRequest]()
	o.mapWatches = newRequests[*keyshardv1.WatchMapRequest]()
	o.sessionStreams = newRequests[*keyshardv1.SessionRequest]()
	o.sessionsStreams = newRequests[*keyshardv1.SessionsRequest]()
	o.sessionsMessages = newRequests[*keyshardv1.SessionsRequest]()
	o.reports = newRequests[*keyshardv1.ReportHotKeysRequest]()
	o.setPolls = newRequests[*keyshardv1.GetOverflowSetRequest]()
	o.setWatches = newRequests[*keyshardv1.WatchOverflowSetRequest]()
	o.delays = newRequests[string]()
	o.poolJoins = newRequests[*keyshardv1.JoinPoolRequest]()
	o.poolKeepAlives = newRequests[*keyshardv1.PoolKeepAliveRequest]()
	o.loadReports = newRequests[*keyshardv1.ReportLoadRequest]()
	o.readies = newRequests[*keyshardv1.MarkReadyRequest]()
	o.poolPolls = newRequests[*keyshardv1.GetPoolSnapshotRequest]()
	o.poolWatches = newRequests[*keyshardv1.WatchPoolSnapshotRequest]()
	return map[string]func(any){
		keyshardv1connect.MemberServiceJoinProcedure:                  recorder(o.joins),
		keyshardv1connect.MemberServiceKeepAliveProcedure:             recorder(o.keepAlives),
		keyshardv1connect.MemberServiceReleaseProcedure:               recorder(o.releases),
		keyshardv1connect.MemberServiceCommitProcedure:                recorder(o.commits),
		keyshardv1connect.MemberServiceLeaveProcedure:                 recorder(o.leaves),
		keyshardv1connect.MemberServiceGetGrantsProcedure:             recorder(o.grantPolls),
		keyshardv1connect.MemberServiceSessionProcedure:               recorder(o.sessionStreams),
		keyshardv1connect.MemberServiceSessionsProcedure:              recorder(o.sessionsStreams),
		keyshardv1connect.MapServiceGetMapProcedure:                   recorder(o.mapPolls),
		keyshardv1connect.MapServiceWatchMapProcedure:                 recorder(o.mapWatches),
		keyshardv1connect.HotKeyServiceReportHotKeysProcedure:         recorder(o.reports),
		keyshardv1connect.HotKeyServiceGetOverflowSetProcedure:        recorder(o.setPolls),
		keyshardv1connect.HotKeyServiceWatchOverflowSetProcedure:      recorder(o.setWatches),
		keyshardv1connect.TenantPoolServiceJoinPoolProcedure:          recorder(o.poolJoins),
		keyshardv1connect.TenantPoolServicePoolKeepAliveProcedure:     recorder(o.poolKeepAlives),
		keyshardv1connect.TenantPoolServiceReportLoadProcedure:        recorder(o.loadReports),
		keyshardv1connect.TenantPoolServiceMarkReadyProcedure:         recorder(o.readies),
		keyshardv1connect.TenantPoolServiceGetPoolSnapshotProcedure:   recorder(o.poolPolls),
		keyshardv1connect.TenantPoolServiceWatchPoolSnapshotProcedure: recorder(o.poolWatches),
	}
}

func recorder[T any](r *Requests[T]) func(any) { return func(m any) { r.add(m.(T)) } }

// Joins are the Join requests received.
func (s *Server) Joins() *Requests[*keyshardv1.JoinRequest] { return s.obs.joins }

// KeepAlives are the keep-alives received: KeepAlive calls, the
// keep-alives of Session streams, each recorded as the KeepAliveRequest
// of its stream's session, and the renewals of Sessions streams'
// keep-alives, one for each session a keep-alive lists. All take the
// keep-alive faults (SetKeepAlives, DelayKeepAlives, HoldKeepAlives, and
// Fail or FailNext of MemberServiceKeepAliveProcedure), each on its own;
// CallCount of that procedure counts the calls, StreamKeepAlives the
// others.
func (s *Server) KeepAlives() *Requests[*keyshardv1.KeepAliveRequest] { return s.obs.keepAlives }

// SessionStreams are the first messages of the Session streams received
// over HTTP/2: each opens a stream (a worker's grants and keep-alives).
// Those refused over HTTP/1.1 are counted by CallCount only.
func (s *Server) SessionStreams() *Requests[*keyshardv1.SessionRequest] {
	return s.obs.sessionStreams
}

// Releases are the Release requests received, recorded before a Gate
// from HoldReleases holds them.
func (s *Server) Releases() *Requests[*keyshardv1.ReleaseRequest] { return s.obs.releases }

// Commits are the Commit requests received, applied or refused (LastCommit
// says what the fake applied).
func (s *Server) Commits() *Requests[*keyshardv1.CommitRequest] { return s.obs.commits }

// Leaves are the Leave requests received.
func (s *Server) Leaves() *Requests[*keyshardv1.LeaveRequest] { return s.obs.leaves }

// GrantPolls are the GetGrants requests received: a worker's long polls
// when it cannot stream its grants, and its read of a fenced session's
// grants before it hands them back.
func (s *Server) GrantPolls() *Requests[*keyshardv1.GetGrantsRequest] { return s.obs.grantPolls }

// MapPolls are the GetMap requests received: a router's first read and
// long polls, and Admin.WaitDrained's.
func (s *Server) MapPolls() *Requests[*keyshardv1.GetMapRequest] { return s.obs.mapPolls }

// MapWatches are the WatchMap requests received: each opens a stream.
func (s *Server) MapWatches() *Requests[*keyshardv1.WatchMapRequest] { return s.obs.mapWatches }

// Reports are the ReportHotKeys requests received, recorded before a
// Gate from HoldHotKeys holds them.
func (s *Server) Reports() *Requests[*keyshardv1.ReportHotKeysRequest] { return s.obs.reports }

// SetPolls are the GetOverflowSet requests received, recorded before a
// Gate from HoldHotKeys holds them.
func (s *Server) SetPolls() *Requests[*keyshardv1.GetOverflowSetRequest] { return s.obs.setPolls }

// SetWatches are the WatchOverflowSet requests received: each opens a
// stream. They are recorded before a Gate from HoldHotKeys holds them.
func (s *Server) SetWatches() *Requests[*keyshardv1.WatchOverflowSetRequest] {
	return s.obs.setWatches
}

// Delays are the procedures of the calls that DelayJoins or
// DelayKeepAlives delayed, each recorded once its fake-clock timer is
// set: advancing the clock after taking one answers that call. A
// keep-alive of a Session stream, and each renewal of a Sessions
// stream's keep-alive, is recorded as MemberServiceKeepAliveProcedure, as
// a KeepAlive call is.
func (s *Server) Delays() *Requests[string] { return s.obs.delays }

// PoolJoins are the JoinPool requests received.
func (s *Server) PoolJoins() *Requests[*keyshardv1.JoinPoolRequest] { return s.obs.poolJoins }

// PoolKeepAlives are the PoolKeepAlive requests received.
func (s *Server) PoolKeepAlives() *Requests[*keyshardv1.PoolKeepAliveRequest] {
	return s.obs.poolKeepAlives
}

// LoadReports are the ReportLoad requests received, served, refused or
// failed (PoolLoad says what the fake counted).
func (s *Server) LoadReports() *Requests[*keyshardv1.ReportLoadRequest] { return s.obs.loadReports }

// Readies are the MarkReady requests received.
func (s *Server) Readies() *Requests[*keyshardv1.MarkReadyRequest] { return s.obs.readies }

// PoolPolls are the GetPoolSnapshot requests received: a follower's first
// read and its long polls.
func (s *Server) PoolPolls() *Requests[*keyshardv1.GetPoolSnapshotRequest] { return s.obs.poolPolls }

// PoolWatches are the WatchPoolSnapshot requests received: each opens a
// stream.
func (s *Server) PoolWatches() *Requests[*keyshardv1.WatchPoolSnapshotRequest] {
	return s.obs.poolWatches
}
