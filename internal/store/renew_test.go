package store

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

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
