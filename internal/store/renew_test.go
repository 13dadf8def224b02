package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/keyshard/keyshard/internal/shard"
)

// Concurrent renewals of live and revoked leases each get their own
// lease's answer, over one stream.
func TestRenewSharedStream(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 30*time.Second)
	const n = 64
	ids := make([]shard.LeaseID, n)
	for i := range ids {
		id, _, err := s.Grant(ctx, time.Duration(5+i%3)*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
		if i%4 == 3 {
			if err := s.Revoke(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, n*4)
	for round := range 4 {
		for i, id := range ids {
			wg.Go(func() {
				ttl, err := s.KeepAliveOnce(ctx, id)
				switch {
				case i%4 == 3 && !errors.Is(err, ErrLeaseNotFound):
					errs <- fmt.Errorf("round %d: revoked lease %v: %v, %v; want ErrLeaseNotFound", round, id, ttl, err)
				case i%4 != 3 && (err != nil || ttl != time.Duration(5+i%3)*time.Second):
					errs <- fmt.Errorf("round %d: lease %v of %ds: %v, %v", round, id, 5+i%3, ttl, err)
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := s.renewer.opened.Load(); got != 1 {
		t.Errorf("%d streams opened for %d renewals; want 1", got, 4*n)
	}
}

// A stream that ends under its waiters (dropped here, as after a
// deadline) costs them nothing: they retry on a new stream.
func TestRenewStreamDropped(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 30*time.Second)
	id, granted, err := s.Grant(ctx, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.KeepAliveOnce(ctx, id); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		rs, err := s.renewer.stream()
		if err != nil {
			t.Fatal(err)
		}
		s.renewer.drop(rs)
		if ttl, err := s.KeepAliveOnce(ctx, id); err != nil || ttl != granted {
			t.Fatalf("after drop %d: %v, %v; want %v", i, ttl, err, granted)
		}
	}
	if got := s.renewer.opened.Load(); got != 4 {
		t.Errorf("%d streams opened; want 4 (one, then one after each of 3 drops)", got)
	}
	// A closed Store answers at once.
	s.Close()
	if _, err := s.KeepAliveOnce(ctx, id); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v; want ErrClosed", err)
	}
}

// staleTermLeases answers every keep-alive as from the raft term before
// the one etcd is in: what an etcd leader that was paused answers from its
// own lessor when it resumes, before it learns that the others elected a
// new leader meanwhile.
type staleTermLeases struct{ pb.LeaseClient }

func (c staleTermLeases) LeaseKeepAlive(ctx context.Context, opts ...grpc.CallOption) (pb.Lease_LeaseKeepAliveClient, error) {
	st, err := c.LeaseClient.LeaseKeepAlive(ctx, opts...)
	if err != nil {
		return nil, err
	}
	return staleTermStream{st}, nil
}

type staleTermStream struct{ pb.Lease_LeaseKeepAliveClient }

func (s staleTermStream) Recv() (*pb.LeaseKeepAliveResponse, error) {
	resp, err := s.Lease_LeaseKeepAliveClient.Recv()
	if resp != nil && resp.Header != nil {
		resp.Header.RaftTerm--
	}
	return resp, err
}

// A renewal answered at another raft term than the read after it is not
// taken as a renewal (ErrUnavailable: renew again), on every path: the
// renewal of a lease, a member's renewal checked in etcd, and one checked
// by the caller's copy. The same renewals at the term the read confirms
// stand.
func TestRenewalAtAnotherTermFails(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	createKeyspace(t, s, "renew-term")
	sess := newSession(t, s, 10*time.Second)
	if _, _, err := s.Join(ctx, "renew-term", member("w1"), sess.LeaseID(), false); err != nil {
		t.Fatal(err)
	}
	copyChecks := func(on bool) {
		if on {
			s.SetRenewCheck(func(context.Context, int64, []MemberLease) bool { return true })
		} else {
			s.SetRenewCheck(nil)
		}
	}
	paths := map[string]func() (time.Duration, error){
		"KeepAliveOnce": func() (time.Duration, error) { return s.KeepAliveOnce(ctx, sess.LeaseID()) },
		"RenewMember checked in etcd": func() (time.Duration, error) {
			copyChecks(false)
			return s.RenewMember(ctx, "renew-term", "w1", sess.LeaseID(), 0)
		},
		"RenewMember checked by the copy": func() (time.Duration, error) {
			copyChecks(true)
			return s.RenewMember(ctx, "renew-term", "w1", sess.LeaseID(), 0)
		},
	}
	real := s.renewer.remote
	s.renewer.remote = staleTermLeases{real}
	for name, renew := range paths {
		ttl, err := renew()
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "leader changed") {
			t.Errorf("%s answered at the term before: %v, %v; want ErrUnavailable, the leader changed", name, ttl, err)
		}
	}
	s.renewer.remote = real
	s.renewer.mu.Lock()
	cur := s.renewer.cur
	s.renewer.mu.Unlock()
	s.renewer.drop(cur)
	for name, renew := range paths {
		if ttl, err := renew(); err != nil || ttl != sess.TTL() {
			t.Errorf("%s at etcd's term: %v, %v; want %v", name, ttl, err, sess.TTL())
		}
	}
}
