package server

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyshard/keyshard/clock/clocktest"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
)

// metricValue reads an unlabelled series of s's registry (0 if absent).
func metricValue(t *testing.T, s *Server, name string) float64 {
	t.Helper()
	mfs, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			return m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return 0
}

// fakeReplica is a detached server on a fake clock, with a context that
// bounds the test.
func fakeReplica(t *testing.T) (context.Context, *Server, *clocktest.Fake) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	clk := clocktest.NewFake(time.Unix(1000, 0))
	return ctx, detached(t, clk), clk
}

// startTerm runs s.term on its own store until it leads with every timer
// of the term set: the coordinator's and the hot-key aggregation's
// tickers, and holdLease's renewal and deadline timers.
func startTerm(t *testing.T, ctx context.Context, s *Server, clk *clocktest.Fake) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.term(ctx) }() // exits when the term ends
	if err := clk.BlockUntilContext(ctx, 4); err != nil {
		t.Fatalf("term not leading with its timers set: %v", err)
	}
	if got := metricValue(t, s, "keyshard_leader"); got != 1 {
		t.Fatalf("keyshard_leader = %v while leading", got)
	}
	return done
}

// TestTermEndsAtLeaseDeadline: a leader whose renewals go unanswered (etcd
// unreachable from it) stops leading at its own lease deadline, the last
// acknowledged renewal's send time + TTL − margin, although its session
// has not ended; keyshard_leader is 0 before it resigns. The election
// lease has the configured TTL.
func TestTermEndsAtLeaseDeadline(t *testing.T) {
	ctx, s, clk := fakeReplica(t)
	st := withStore(t, s)
	s.cfg.ElectionTTL = 3 * time.Second
	var calls atomic.Int32
	var lease atomic.Int64
	s.seams.renew = func(ctx context.Context, id shard.LeaseID) (time.Duration, error) {
		if calls.Add(1) == 1 { // the renewal right after winning
			lease.Store(int64(id))
			return st.KeepAliveOnce(ctx, id)
		}
		<-ctx.Done() // etcd unreachable: no answer
		return 0, ctx.Err()
	}
	atResign := make(chan float64, 1)
	s.seams.resign = func(ctx context.Context, el *store.Election) error {
		atResign <- metricValue(t, s, "keyshard_leader")
		return el.Resign(ctx)
	}
	done := startTerm(t, ctx, s, clk)
	info, err := st.TimeToLive(ctx, shard.LeaseID(lease.Load()))
	if err != nil || info.Granted != 3*time.Second {
		t.Fatalf("election lease %v, %v; want the configured 3s", info, err)
	}

	clk.Advance(3*time.Second - leaseMargin(3*time.Second) - time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("term ended before its deadline: %v", err)
	default:
	}
	clk.Advance(time.Millisecond)
	select {
	case err := <-done:
		if !errors.Is(err, errLeaseDeadline) {
			t.Fatalf("term ended with %v, want errLeaseDeadline", err)
		}
	case <-ctx.Done():
		t.Fatal("still leading after the lease deadline, with no renewal acknowledged")
	}
	if got := <-atResign; got != 0 {
		t.Fatalf("keyshard_leader = %v when resigning, want 0", got)
	}
}

// TestTermAbandonsStuckRenewal: a renewal that etcd does not answer (sent
// to a paused member whose connection looks alive) is abandoned when the
// next one is due, and the next one is sent, so that one stuck call does
// not end the term while other members answer.
func TestTermAbandonsStuckRenewal(t *testing.T) {
	ctx, s, clk := fakeReplica(t)
	st := withStore(t, s)
	s.cfg.ElectionTTL = 3 * time.Second
	var calls atomic.Int32
	stuck, abandoned, next := make(chan struct{}), make(chan struct{}), make(chan struct{}, 8)
	s.seams.renew = func(ctx context.Context, id shard.LeaseID) (time.Duration, error) {
		switch calls.Add(1) {
		case 1: // the renewal right after winning
		case 2:
			close(stuck)
			<-ctx.Done()
			close(abandoned)
			return 0, ctx.Err()
		default:
			next <- struct{}{}
		}
		return st.KeepAliveOnce(ctx, id)
	}
	done := startTerm(t, ctx, s, clk)
	wait := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("no %s", what)
		}
	}
	clk.Advance(time.Second) // TTL/3: the second renewal is sent, and sticks
	wait(stuck, "second renewal")
	clk.Advance(time.Second) // the next renewal is due
	wait(abandoned, "abandoning of the stuck renewal")
	wait(next, "renewal sent in its place")
	select {
	case err := <-done:
		t.Fatalf("term ended: %v", err)
	default:
	}
}

// TestTermWaitsForItsWatch: once term returns, the store watch its
// coordinator followed has exited. The watch here is slow to exit: after
// its ctx ends it still sends one last update before it closes its
// channel, so a term that merely cancels it returns while it runs.
func TestTermWaitsForItsWatch(t *testing.T) {
	ctx, s, clk := fakeReplica(t)
	st := &slowWatchStore{Store: withStore(t, s), watches: make(chan chan store.Update, 1)}
	s.seams.leader = st
	tctx, end := context.WithCancel(ctx)
	done := startTerm(t, tctx, s, clk)
	end()
	if err := <-done; err != nil && !errors.Is(err, errNotLeader) && !errors.Is(err, context.Canceled) {
		t.Fatalf("term: %v", err)
	}
	var ch chan store.Update
	select {
	case ch = <-st.watches:
	default:
		return // the term ended before it started its watch: nothing runs
	}
	select {
	case _, open := <-ch:
		if open {
			for range ch { // let it exit
			}
			t.Fatal("term returned while its watch goroutine was still running")
		}
	default:
		t.Fatal("term returned while its watch goroutine was still running")
	}
}

// slowWatchStore is the store, except that its watch is slow to exit:
// after its ctx ends it still sends one last update before it closes its
// channel. watches receives each watch's channel.
type slowWatchStore struct {
	*store.Store
	watches chan chan store.Update
}

func (st *slowWatchStore) Watch(ctx context.Context, fromRev int64) <-chan store.Update {
	ch := make(chan store.Update)
	st.watches <- ch
	go func() { // exits once its last update is received
		<-ctx.Done()
		ch <- store.Update{Rev: fromRev}
		close(ch)
	}()
	return ch
}
