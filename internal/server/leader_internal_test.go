package server

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/keyshard/keyshard/clock/clocktest"
	"github.com/keyshard/keyshard/internal/coordinator"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/placement"
)

func TestWriteDeadline(t *testing.T) {
	for _, tc := range []struct{ ttl, want time.Duration }{
		{0, 500 * time.Millisecond}, // no keyspace yet
		{time.Second, 500 * time.Millisecond},
		{1500 * time.Millisecond, 500 * time.Millisecond},
		{2 * time.Second, 2 * time.Second / 3},
		{3 * time.Second, time.Second},
		{6 * time.Second, 2 * time.Second},
		{time.Hour, 2 * time.Second},
	} {
		if got := writeDeadline(tc.ttl); got != tc.want {
			t.Errorf("writeDeadline(%v) = %v, want %v", tc.ttl, got, tc.want)
		}
	}
}

func TestWriteBackoff(t *testing.T) {
	for failures, want := range map[int]time.Duration{
		0: 50 * time.Millisecond, 1: 50 * time.Millisecond, 2: 100 * time.Millisecond, 3: 200 * time.Millisecond,
		5: 800 * time.Millisecond, 6: time.Second, 1000: time.Second,
	} {
		if got := writeBackoff(failures); got != want {
			t.Errorf("writeBackoff(%d) = %v, want %v", failures, got, want)
		}
	}
}

// TestOwnWritesDropOlderEchoes: once the leader has committed a key, the
// watch's older changes of it (echoes of its earlier writes), and the echo
// of the commit itself, do not reach the machine; other keys' changes and
// later changes of the key do. A resync to a snapshot older than a commit
// is followed by that commit again.
func TestOwnWritesDropOlderEchoes(t *testing.T) {
	grants := func(rev int64, buckets ...int) store.Change {
		g := shard.Grants{Session: testLease}
		for _, b := range buckets {
			g.Buckets = append(g.Buckets, bt(b, uint64(rev)))
		}
		return store.Change{Kind: store.KindGrants, Keyspace: "rooms", ID: "a", Key: store.GrantsKey("rooms", "a"), Value: g, Lease: testLease, ModRevision: rev}
	}
	tokens := func(rev int64, token uint64) store.Change {
		return store.Change{Kind: store.KindTokens, Keyspace: "rooms", Key: store.TokensKey("rooms"), Value: token, ModRevision: rev}
	}
	own := newOwnWrites()
	round := coordinator.WriteGrants{Keyspace: "rooms", Token: 7, Grants: map[string]shard.Grants{
		"a": {Session: testLease, Buckets: []shard.BucketToken{{Bucket: 0, Token: 7}}},
	}}
	committed := own.committed(round, 40, time.Time{})
	wantCommitted := []coordinator.Event{
		coordinator.GrantsPut{Keyspace: "rooms", ID: "a", Grants: round.Grants["a"], Rev: 40},
		coordinator.TokensPut{Keyspace: "rooms", Token: 7, Rev: 40},
	}
	if diff := cmp.Diff(wantCommitted, committed); diff != "" {
		t.Fatalf("committed events (-want +got):\n%s", diff)
	}

	// The watch is at revision 31: the echo of an earlier round, and a
	// release (not a key the leader writes).
	rel := releaseChange(33)
	got := own.events(nil, store.Update{Changes: []store.Change{grants(31, 0, 1), tokens(31, 6)}, Rev: 31})
	got = own.events(got, store.Update{Changes: []store.Change{rel}, Rev: 33})
	if diff := cmp.Diff([]coordinator.Event{changeEvent(rel)}, got); diff != "" {
		t.Fatalf("older echoes reached the machine (-want +got):\n%s", diff)
	}
	// A resync at 35 rebuilds the machine's state, then restores the
	// commit it has not reached.
	got = own.events(nil, store.Update{Resync: &store.Resync{Snapshot: store.NewSnapshot(35), Rev: 35}, Rev: 35})
	if diff := cmp.Diff(append([]coordinator.Event{coordinator.Reset{}}, wantCommitted...), got); diff != "" {
		t.Fatalf("resync to before the commit (-want +got):\n%s", diff)
	}
	// The commit's own echo changes nothing; after it, the keys are
	// forgotten and later changes pass.
	if got := own.events(nil, store.Update{Changes: []store.Change{grants(40, 0), tokens(40, 7)}, Rev: 40}); len(got) != 0 {
		t.Fatalf("the commit's echo reached the machine: %v", got)
	}
	if len(own.keys) != 0 || len(own.order) != 0 {
		t.Fatalf("keys the watch has passed are still remembered: %v, %v", own.keys, own.order)
	}
	gone := store.Change{Kind: store.KindGrants, Keyspace: "rooms", ID: "a", Key: store.GrantsKey("rooms", "a"), Deleted: true, ModRevision: 41}
	got = own.events(nil, store.Update{Changes: []store.Change{gone}, Rev: 41})
	if diff := cmp.Diff([]coordinator.Event{coordinator.GrantsDeleted{Keyspace: "rooms", ID: "a"}}, got); diff != "" {
		t.Fatalf("a later change (-want +got):\n%s", diff)
	}
	// A resync past a commit needs nothing more.
	own.committed(round, 50, time.Time{})
	got = own.events(nil, store.Update{Resync: &store.Resync{Snapshot: store.NewSnapshot(52), Rev: 52}, Rev: 52})
	if diff := cmp.Diff([]coordinator.Event{coordinator.Reset{}}, got); diff != "" {
		t.Fatalf("resync past the commit (-want +got):\n%s", diff)
	}

	// A key committed twice is remembered until the watch passes the
	// later commit: the echo of the first does not forget it.
	own.committed(round, 60, time.Time{})
	own.committed(round, 62, time.Time{})
	if got := own.events(nil, store.Update{Changes: []store.Change{grants(60, 0), tokens(60, 7)}, Rev: 60}); len(got) != 0 {
		t.Fatalf("the first commit's echo reached the machine: %v", got)
	}
	if got := own.events(nil, store.Update{Changes: []store.Change{grants(61, 0, 1)}, Rev: 61}); len(got) != 0 {
		t.Fatalf("a change older than the second commit reached the machine: %v", got)
	}
	if _, ok := own.keys[store.GrantsKey("rooms", "a")]; !ok {
		t.Fatal("the key was forgotten before the watch passed its second commit")
	}
	var lags []time.Time
	own.echoed(61, func(at time.Time) { lags = append(lags, at) })
	if len(lags) != 3 || own.behind(61) != 1 {
		t.Fatalf("echoed up to 61: %d commits, %d behind; want the 3 commits up to 60 (at 40, 50, 60), and 1 revision behind", len(lags), own.behind(61))
	}
	own.events(nil, store.Update{Rev: 62})
	if len(own.keys) != 0 || len(own.order) != 0 {
		t.Fatalf("after the second commit's echo: %v, %v; want nothing remembered", own.keys, own.order)
	}
}

// hangingCommitter is the store, except that the first grant round hangs
// until its context ends, as a write to an etcd member whose leader was
// killed does.
type hangingCommitter struct {
	*store.Store
	once   sync.Once
	hung   chan context.Context // receives the hanging write's context
	landed chan int64           // revisions of the grant rounds committed
}

func (c *hangingCommitter) Commit(ctx context.Context, f store.Fence, writes []store.Write, expects []store.Expect) (int64, error) {
	round := false
	for _, w := range writes {
		round = round || w.Key() == store.TokensKey("rooms")
	}
	if round {
		first := false
		c.once.Do(func() { first = true })
		if first {
			c.hung <- ctx
			<-ctx.Done()
			return 0, fmt.Errorf("store: commit: %w: %w", store.ErrUnavailable, ctx.Err())
		}
	}
	rev, err := c.Store.Commit(ctx, f, writes, expects)
	if err == nil && round {
		c.landed <- rev
	}
	return rev, err
}

// TestLeaderWriteDeadline: a grant round that hangs (etcd lost its leader)
// is abandoned at its deadline, a third of the keyspace's lease TTL, by
// the server's clock; the failure is counted, and the round is replanned
// and lands once the backoff has passed.
func TestLeaderWriteDeadline(t *testing.T) {
	clk := clocktest.NewFake(time.Unix(1_700_000_000, 0))
	s := detached(t, clk)
	st := withStore(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const ttl = 2 * time.Second
	if _, err := st.CreateKeyspace(ctx, shard.Keyspace{Name: "rooms", Buckets: 4, Hash: placement.HashXXH64, Mode: shard.ModeExclusive, LeaseTTL: ttl}); err != nil {
		t.Fatal(err)
	}
	lease, _, err := st.Grant(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Join(ctx, "rooms", shard.Member{ID: "a", Weight: 1, JoinedAt: clk.Now()}, lease, false); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Activate(ctx, "rooms", "a", lease); err != nil {
		t.Fatal(err)
	}
	hc := &hangingCommitter{Store: st, hung: make(chan context.Context, 1), landed: make(chan int64, 16)}
	sess, err := st.NewSession(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	fence, err := st.NewElection(sess).Campaign(ctx, "test")
	if err != nil {
		t.Fatal(err)
	}
	lctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.lead(lctx, hc, fence) }() // exits when stop is called
	defer func() { stop(); <-done }()

	var wctx context.Context
	select {
	case wctx = <-hc.hung:
	case <-ctx.Done():
		t.Fatal("no grant round was written")
	}
	d := writeDeadline(ttl)
	clk.Advance(d - time.Nanosecond)
	if wctx.Err() != nil {
		t.Fatalf("the write was abandoned before its deadline %v", d)
	}
	clk.Advance(time.Nanosecond)
	// The abandoned round is counted, and its retry waits for the backoff
	// (the leader's ticker is the other timer).
	clk.MustBlockUntil(t, 2)
	if by := writeFailuresBy(t, s); len(by) != 1 || by["grants/deadline"] != 1 {
		t.Fatalf("write failures by action/cause = %v, want grants/deadline: 1", by)
	}
	clk.Advance(writeBackoff(1))
	select {
	case <-hc.landed:
	case <-ctx.Done():
		t.Fatal("the replanned grant round did not land")
	}
	snap, err := st.LoadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if g := snap.Keyspaces["rooms"].Grants["a"].Value; len(g.Buckets) != 4 {
		t.Fatalf("a holds %v, want all 4 buckets", g.Buckets)
	}
	if n := writeFailures(t, s); n != 1 {
		t.Fatalf("write failures = %v, want 1", n)
	}
}

// writeFailures is keyshard_leader_write_failures_total of s, summed
// over actions and causes.
func writeFailures(t *testing.T, s *Server) float64 {
	t.Helper()
	var n float64
	for _, by := range writeFailuresBy(t, s) {
		n += by
	}
	return n
}

// writeFailuresBy is keyshard_leader_write_failures_total of s by
// "action/cause", the pairs counted so far only.
func writeFailuresBy(t *testing.T, s *Server) map[string]float64 {
	t.Helper()
	mfs, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "keyshard_leader_write_failures_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if v := m.GetCounter().GetValue(); v != 0 {
				out[labels["action"]+"/"+labels["cause"]] += v
			}
		}
	}
	return out
}

// reports returns keyshard_reports_total of kind (summed over keyspaces).
func reports(t *testing.T, s *Server, kind string) float64 {
	t.Helper()
	mfs, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "keyshard_reports_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}
