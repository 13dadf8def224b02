package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestRenewMember(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	createKeyspace(t, s, "renew")
	a, b := newSession(t, s, 10*time.Second), newSession(t, s, 10*time.Second)
	if _, _, err := s.Join(ctx, "renew", member("w1"), a.LeaseID(), false); err != nil {
		t.Fatal(err)
	}
	if ttl, err := s.RenewMember(ctx, "renew", "w1", a.LeaseID(), 0); err != nil || ttl != a.TTL() {
		t.Fatalf("on its session: %v, %v; want %v", ttl, err, a.TTL())
	}
	if reads := s.renewals.readsMade(); reads != 0 {
		t.Fatalf("a record on its session was read %d times; want 0 (the compare answers)", reads)
	}
	if _, err := s.RenewMember(ctx, "renew", "w2", a.LeaseID(), 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("no such member: %v, want ErrNotFound", err)
	}
	if _, _, err := s.Join(ctx, "renew", member("w1"), b.LeaseID(), true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RenewMember(ctx, "renew", "w1", a.LeaseID(), 0); !errors.Is(err, ErrFenced) {
		t.Fatalf("replaced session: %v, want ErrFenced", err)
	}
	if _, err := s.RenewMember(ctx, "renew", "w1", b.LeaseID(), 0); err != nil {
		t.Fatalf("the replacing session: %v", err)
	}
	if err := s.Revoke(ctx, b.LeaseID()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RenewMember(ctx, "renew", "w1", b.LeaseID(), 0); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("revoked session: %v, want ErrLeaseNotFound", err)
	}
	if _, err := s.RenewMember(ctx, "renew", "bad/id", b.LeaseID(), 0); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("bad id: %v, want ErrInvalidName", err)
	}
}

// Keep-alives that queue while a batch is in flight make one batch, and
// each gets its own member's answer: renewed, fenced, or gone.
func TestRenewMemberBatches(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	createKeyspace(t, s, "renew-batch")
	a, b := newSession(t, s, 10*time.Second), newSession(t, s, 10*time.Second)
	gone, _, err := s.Grant(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Revoke(ctx, gone); err != nil {
		t.Fatal(err)
	}
	const n = 60
	for i := range n {
		if _, _, err := s.Join(ctx, "renew-batch", member(fmt.Sprintf("w%d", i)), a.LeaseID(), false); err != nil {
			t.Fatal(err)
		}
	}
	// Pretend a batch is in flight, so that every keep-alive queues.
	holdBatch(s)
	var wg sync.WaitGroup
	errs := make([]error, n)
	ttls := make([]time.Duration, n)
	for i := range n {
		lease := a.LeaseID()
		switch i % 3 {
		case 1:
			lease = b.LeaseID() // alive, but not the holder
		case 2:
			lease = gone
		}
		wg.Go(func() { ttls[i], errs[i] = s.RenewMember(ctx, "renew-batch", fmt.Sprintf("w%d", i), lease, 0) })
	}
	waitQueued(ctx, t, s, n)
	go s.renewals.run(s) // the "batch in flight" ends: the queue goes at once
	wg.Wait()
	for i, err := range errs {
		switch i % 3 {
		case 0:
			if err != nil || ttls[i] != a.TTL() {
				t.Errorf("w%d on its session: %v, %v", i, ttls[i], err)
			}
		case 1:
			if !errors.Is(err, ErrFenced) {
				t.Errorf("w%d on another live session: %v, want ErrFenced", i, err)
			}
		case 2:
			if !errors.Is(err, ErrLeaseNotFound) {
				t.Errorf("w%d on a revoked session: %v, want ErrLeaseNotFound", i, err)
			}
		}
	}
	s.renewals.mu.Lock()
	batches := s.renewals.batches
	s.renewals.mu.Unlock()
	if batches != 1 {
		t.Errorf("%d batches for %d queued keep-alives; want 1", batches, n)
	}
	if reads := s.renewals.readsMade(); reads != 1 {
		t.Errorf("the batch's check read the records %d times; want 1 (some records moved)", reads)
	}
	if got := s.renewer.opened.Load(); got != 1 {
		t.Errorf("%d renewal streams opened; want 1", got)
	}
}

// A batch ends with its callers' deadlines, not renewBatchTimeout later:
// a keep-alive whose deadline has passed gets its error at once, and the
// next one is made.
func TestRenewMemberDeadline(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	createKeyspace(t, s, "renew-deadline")
	a := newSession(t, s, 10*time.Second)
	if _, _, err := s.Join(ctx, "renew-deadline", member("w1"), a.LeaseID(), false); err != nil {
		t.Fatal(err)
	}
	past, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	if _, err := s.RenewMember(past, "renew-deadline", "w1", a.LeaseID(), 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("past deadline: %v; want context.DeadlineExceeded", err)
	}
	if ttl, err := s.RenewMember(ctx, "renew-deadline", "w1", a.LeaseID(), 0); err != nil || ttl != a.TTL() {
		t.Fatalf("the next keep-alive: %v, %v", ttl, err)
	}
}

// A keep-alive given a time to answer within (RenewMember's within, what
// keyshard serve's keep-alives pass instead of a context of their own)
// gets ErrUnavailable wrapping context.DeadlineExceeded by then when etcd
// does not answer, and so does every keep-alive of its batch, whose
// renewals share its stream; the next keep-alive makes a batch of its own.
func TestRenewMemberWithin(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	createKeyspace(t, s, "renew-within")
	a := newSession(t, s, 10*time.Second)
	for _, id := range []string{"w1", "w2"} {
		if _, _, err := s.Join(ctx, "renew-within", member(id), a.LeaseID(), false); err != nil {
			t.Fatal(err)
		}
	}
	// The check after the renewals hangs, as a paused etcd endpoint would,
	// until its batch ends.
	var hang atomic.Bool
	hang.Store(true)
	s.SetRenewCheck(func(ctx context.Context, _ int64, _ []MemberLease) bool {
		if hang.Load() {
			<-ctx.Done()
			return false
		}
		return true
	})
	holdBatch(s) // one batch for both
	errs := make(chan error, 2)
	// The callers would give up at 5 s, with their context's own error,
	// if the batch did not end at the first keep-alive's time (300 ms).
	wait, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	go func() {
		_, err := s.RenewMember(wait, "renew-within", "w1", a.LeaseID(), 300*time.Millisecond)
		errs <- err
	}()
	go func() { _, err := s.RenewMember(wait, "renew-within", "w2", a.LeaseID(), time.Hour); errs <- err }()
	waitQueued(ctx, t, s, 2)
	go s.renewals.run(s)
	for range 2 {
		if err := <-errs; !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("etcd hangs past the first keep-alive's time: %v; want ErrUnavailable wrapping context.DeadlineExceeded", err)
		}
	}
	hang.Store(false)
	if ttl, err := s.RenewMember(ctx, "renew-within", "w2", a.LeaseID(), time.Hour); err != nil || ttl != a.TTL() {
		t.Fatalf("the next keep-alive: %v, %v", ttl, err)
	}

	// A keep-alive whose time has passed before its batch starts gets the
	// same error, and does not hold up the others of its batch.
	holdBatch(s)
	late := &renewal{key: MemberKey("renew-within", "w1"), ks: "renew-within", id: "w1", lease: a.LeaseID(), done: make(chan renewResult, 1)}
	late.by = time.Now().Add(-time.Millisecond)
	late.deadline = late.by
	s.renewals.add(s, late)
	go func() { _, err := s.RenewMember(ctx, "renew-within", "w2", a.LeaseID(), time.Hour); errs <- err }()
	waitQueued(ctx, t, s, 2)
	go s.renewals.run(s)
	if r := <-late.done; !errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("a keep-alive past its time: %v, %v; want context.DeadlineExceeded", r.ttl, r.err)
	}
	if err := <-errs; err != nil {
		t.Fatalf("the keep-alive batched with it: %v", err)
	}
}

// readsMade is how many batch checks read the records back.
func (q *renewals) readsMade() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.reads
}

// With a RenewCheck set, a batch whose records the copy shows on their
// leases is answered without the transaction, at a revision read after
// the renewals; when the copy cannot tell, the transaction checks, and
// says which member moved.
func TestRenewMemberCopyCheck(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	createKeyspace(t, s, "renew-copy")
	a, b := newSession(t, s, 10*time.Second), newSession(t, s, 10*time.Second)
	_, rev, err := s.Join(ctx, "renew-copy", member("w1"), a.LeaseID(), false)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		asked  []int64
		answer = true
	)
	s.SetRenewCheck(func(_ context.Context, r int64, ms []MemberLease) bool {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, r)
		if len(ms) != 1 || ms[0] != (MemberLease{Keyspace: "renew-copy", ID: "w1", Lease: ms[0].Lease}) {
			t.Errorf("members to check: %+v", ms)
		}
		return answer
	})
	if ttl, err := s.RenewMember(ctx, "renew-copy", "w1", a.LeaseID(), 0); err != nil || ttl != a.TTL() {
		t.Fatalf("the copy holds: %v, %v", ttl, err)
	}
	if reads, oks := s.renewals.readsMade(), s.renewals.copyChecks(); reads != 0 || oks != 1 {
		t.Errorf("the check read the records %d times and the copy answered %d; want 0 and 1", reads, oks)
	}
	if len(asked) != 1 || asked[0] < rev {
		t.Errorf("the copy was asked at revisions %v; want one, at least %d (the join)", asked, rev)
	}

	// Replaced: a copy that cannot tell (behind, or showing the record
	// elsewhere) leaves it to etcd, which finds the member fenced.
	if _, _, err := s.Join(ctx, "renew-copy", member("w1"), b.LeaseID(), true); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	answer = false
	mu.Unlock()
	if _, err := s.RenewMember(ctx, "renew-copy", "w1", a.LeaseID(), 0); !errors.Is(err, ErrFenced) {
		t.Fatalf("replaced session, the copy unsure: %v; want ErrFenced", err)
	}
	if reads, oks := s.renewals.readsMade(), s.renewals.copyChecks(); reads != 1 || oks != 1 {
		t.Errorf("the check read the records %d times and the copy answered %d; want 1 and 1", reads, oks)
	}
}

// copyChecks is how many batch checks the RenewCheck answered.
func (q *renewals) copyChecks() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.copyOKs
}

// holdBatch makes s's keep-alives queue as if a batch were in flight,
// until the test runs s.renewals.run.
func holdBatch(s *Store) {
	s.renewals.mu.Lock()
	s.renewals.running = true
	s.renewals.mu.Unlock()
}

// waitQueued waits until n keep-alives are queued for s's next batch.
func waitQueued(ctx context.Context, t *testing.T, s *Store, n int) {
	t.Helper()
	for queued := 0; queued < n; {
		s.renewals.mu.Lock()
		queued = len(s.renewals.queue)
		s.renewals.mu.Unlock()
		if ctx.Err() != nil {
			t.Fatalf("only %d of %d keep-alives queued", queued, n)
		}
		time.Sleep(time.Millisecond) // polls a condition; the answers do not depend on it
	}
}
