package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/clock"
	"github.com/keyshard/keyshard/clock/clocktest"
	"github.com/keyshard/keyshard/internal/coordinator"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/placement"
)

// These tests drive a server whose view does not follow the store: it
// holds only what the test applies, so it is exactly as stale as the test
// wants.

const testLease shard.LeaseID = 0x51

// detached returns a server that has started nothing: no etcd (until
// withStore), no watch, no API.
func detached(t *testing.T, clk clock.Clock) *Server {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Etcd.DataDir = t.TempDir()
	s, err := New(cfg, Options{Logger: slog.New(slog.DiscardHandler), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	s.sessions = sessions{secret: []byte("test secret")}
	return s
}

// withStore gives s a store on a fresh embedded etcd.
func withStore(t *testing.T, s *Server) *store.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	emb, err := store.StartEmbedded(ctx, store.EmbeddedConfig{Dir: t.TempDir(), Logger: slog.New(slog.DiscardHandler), UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Close)
	st, err := store.Open(ctx, store.Config{Endpoints: emb.Endpoints(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	s.store = st
	return st
}

// withRooms returns a detached server on the real clock with a store
// holding keyspace "rooms" (4 buckets, lease TTL 10s).
func withRooms(t *testing.T) (*Server, *store.Store) {
	t.Helper()
	s := detached(t, clock.Real{})
	st := withStore(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := st.CreateKeyspace(ctx, shard.Keyspace{Name: "rooms", Buckets: 4, Hash: placement.HashXXH64, Mode: shard.ModeExclusive, LeaseTTL: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	return s, st
}

// memberHolding joins member "a" to "rooms" on a new session and, as a
// leader elected meanwhile, grants it buckets 0 and 1 at token 1.
func memberHolding(ctx context.Context, t *testing.T, st *store.Store) (shard.LeaseID, store.Fence) {
	t.Helper()
	old, _, err := st.Grant(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Join(ctx, "rooms", shard.Member{ID: "a", Weight: 1, JoinedAt: time.Now()}, old, false); err != nil {
		t.Fatal(err)
	}
	leader, err := st.NewSession(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { leader.Close() })
	fence, err := st.NewElection(leader).Campaign(ctx, "leader")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Commit(ctx, fence, []store.Write{store.PutGrants("rooms", "a", shard.Grants{Session: old, Buckets: []shard.BucketToken{bt(0, 1), bt(1, 1)}})}, nil); err != nil {
		t.Fatal(err)
	}
	return old, fence
}

// roomsChanges is keyspace "rooms" (4 buckets) at revisions 1-5: members
// a (session testLease) and b, a map that targets buckets 0-1 at a and 2-3
// at b, and a holding all four.
func roomsChanges() []store.Change {
	ks := shard.Keyspace{Name: "rooms", Buckets: 4, Hash: placement.HashXXH64, Mode: shard.ModeExclusive, LeaseTTL: 10 * time.Second}
	m := shard.Map{Epoch: 2, Hash: placement.HashXXH64, Assignment: placement.Assignment{Members: []string{"a", "b"}, Owners: []int32{0, 0, 1, 1}}}
	joined := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return []store.Change{
		{Kind: store.KindKeyspace, Keyspace: "rooms", Key: store.KeyspaceKey("rooms"), Value: ks, ModRevision: 1},
		{Kind: store.KindMap, Keyspace: "rooms", Key: store.MapKey("rooms"), Value: m, ModRevision: 2},
		{Kind: store.KindMember, Keyspace: "rooms", ID: "a", Key: store.MemberKey("rooms", "a"), Value: shard.Member{ID: "a", Weight: 1, Session: testLease, JoinedAt: joined}, Lease: testLease, ModRevision: 3},
		{Kind: store.KindMember, Keyspace: "rooms", ID: "b", Key: store.MemberKey("rooms", "b"), Value: shard.Member{ID: "b", Weight: 1, Session: testLease + 1, JoinedAt: joined}, Lease: testLease + 1, ModRevision: 4},
		{Kind: store.KindGrants, Keyspace: "rooms", ID: "a", Key: store.GrantsKey("rooms", "a"), Value: shard.Grants{Session: testLease, Buckets: []shard.BucketToken{bt(0, 1), bt(1, 1), bt(2, 1), bt(3, 3)}}, Lease: testLease, ModRevision: 5},
	}
}

// releaseChange is a's release record at rev: bucket 2 at the token it
// holds it by, and bucket 3 at an older token (a grant since replaced).
func releaseChange(rev int64) store.Change {
	return store.Change{Kind: store.KindReleases, Keyspace: "rooms", ID: "a", Key: store.ReleasesKey("rooms", "a"), Value: shard.Releases{Buckets: []shard.BucketToken{bt(2, 1), bt(3, 2)}}, Lease: testLease, ModRevision: rev}
}

func bt(b int, token uint64) shard.BucketToken { return shard.BucketToken{Bucket: b, Token: token} }

func apply(s *Server, rev int64, cs ...store.Change) {
	s.view.apply(store.Update{Changes: cs, Rev: rev})
}

// timerSet closes once the code under test waits on a timer of clk. Its
// goroutine exits then, or when the test ends if the code under test
// answers instead.
func timerSet(t *testing.T, clk *clocktest.Fake) <-chan struct{} {
	ch := make(chan struct{})
	go func() { // exits once a timer waits, or when the test ends
		if clk.BlockUntilContext(t.Context(), 1) == nil {
			close(ch)
		}
	}()
	return ch
}

func grantsOf(r *v1.GetGrantsResponse) (grants []shard.BucketToken, release []uint32) {
	for _, g := range r.Grants {
		grants = append(grants, shard.BucketToken{Bucket: int(g.Bucket), Token: g.Token})
	}
	return grants, r.Release
}

// TestGetGrantsLeavesOutReleased: once a member released a bucket, its
// answers no longer list it, in grants or in release, although the grants
// record still does until the leader hands it over; a release at an older
// token does not hide the current grant.
func TestGetGrantsLeavesOutReleased(t *testing.T) {
	s := detached(t, clocktest.NewFake(time.Unix(0, 0)))
	apply(s, 6, append(roomsChanges(), releaseChange(6))...)
	ms := &memberService{s}
	r, err := ms.GetGrants(context.Background(), connect.NewRequest(&v1.GetGrantsRequest{Session: s.sessions.token("rooms", "a", testLease)}))
	if err != nil {
		t.Fatal(err)
	}
	grants, release := grantsOf(r.Msg)
	if want := []shard.BucketToken{bt(0, 1), bt(1, 1), bt(3, 3)}; !slices.Equal(grants, want) {
		t.Errorf("grants %v, want %v", grants, want)
	}
	if want := []uint32{3}; !slices.Equal(release, want) {
		t.Errorf("release %v, want %v", release, want)
	}
	if r.Msg.Revision != 6 {
		t.Errorf("revision %d, want 6 (the release record's)", r.Msg.Revision)
	}
}

// TestGetGrantsWaitsForMinRevision: a replica whose view is behind the
// revision the member has seen (its release, written through another
// replica) waits for it before answering, and gives up with UNAVAILABLE
// rather than answer from the past.
func TestGetGrantsWaitsForMinRevision(t *testing.T) {
	clk := clocktest.NewFake(time.Unix(0, 0))
	s := detached(t, clk)
	apply(s, 5, roomsChanges()...)
	ms := &memberService{s}
	sess := s.sessions.token("rooms", "a", testLease)

	type answer struct {
		r   *connect.Response[v1.GetGrantsResponse]
		err error
	}
	got := make(chan answer, 1)
	go func() { // exits after one answer
		r, err := ms.GetGrants(context.Background(), connect.NewRequest(&v1.GetGrantsRequest{Session: sess, MinRevision: 6}))
		got <- answer{r, err}
	}()
	select {
	case <-timerSet(t, clk): // waiting for revision 6
	case a := <-got:
		t.Fatalf("answered from revision 5, behind min_revision 6: %v %v", a.r, a.err)
	}
	apply(s, 6, releaseChange(6))
	a := <-got
	if a.err != nil {
		t.Fatal(a.err)
	}
	if grants, _ := grantsOf(a.r.Msg); slices.Contains(grants, shard.BucketToken{Bucket: 2, Token: 1}) {
		t.Fatalf("grants %v list bucket 2, released at revision 6", grants)
	}

	go func() { // exits after one answer
		r, err := ms.GetGrants(context.Background(), connect.NewRequest(&v1.GetGrantsRequest{Session: sess, MinRevision: 99}))
		got <- answer{r, err}
	}()
	select {
	case <-timerSet(t, clk):
	case a := <-got:
		t.Fatalf("answered from revision 6, behind min_revision 99: %v %v", a.r, a.err)
	}
	clk.Advance(maxLag)
	if a := <-got; connect.CodeOf(a.err) != connect.CodeUnavailable {
		t.Fatalf("behind for %v: %v %v, want UNAVAILABLE", maxLag, a.r, a.err)
	}
}

// TestJoinReplaceLeavesRevocationToLeader: a Join with replace through a
// replica whose view has not seen the old session's grants (written
// through another replica) must not revoke the old session at once, which
// would free its buckets without quarantine; the record names it for the
// leader, and the old session's keep-alives fail from then on.
func TestJoinReplaceLeavesRevocationToLeader(t *testing.T) {
	s, st := withRooms(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	old, _ := memberHolding(ctx, t, st)

	ms := &memberService{s}
	if _, err := ms.Join(ctx, connect.NewRequest(&v1.JoinRequest{Keyspace: "rooms", Member: &v1.Member{Id: "a"}, Replace: true})); err != nil {
		t.Fatal(err)
	}
	if _, err := st.TimeToLive(ctx, old); err != nil {
		t.Fatalf("the old session holding buckets was revoked by the joining replica, without quarantine: %v", err)
	}
	snap, _, err := st.LoadKeyspace(ctx, "rooms")
	if err != nil {
		t.Fatal(err)
	}
	if m := snap.Keyspaces["rooms"].Members["a"].Value; m.Replaces != old || !m.Pending {
		t.Fatalf("record replaces %v, pending %v; want replacing %v, pending", m.Replaces, m.Pending, old)
	}
	_, err = ms.KeepAlive(ctx, connect.NewRequest(&v1.KeepAliveRequest{Session: s.sessions.token("rooms", "a", old)}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("keep-alive of the replaced session: %v, want NOT_FOUND", err)
	}
}

// TestQuarantineTTL: a superseded session's buckets are quarantined for
// what remains of its lease (rounded up), not a fresh full TTL; other
// revocations of a live session keep the full TTL; a lease already gone,
// superseded or not, needs none.
func TestQuarantineTTL(t *testing.T) {
	s := detached(t, clock.Real{})
	st := withStore(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lease, granted, err := st.Grant(ctx, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	a := coordinator.RevokeSession{Keyspace: "rooms", ID: "a", Session: lease, Quarantine: []int{0}, TTL: time.Minute, Superseded: true}
	got, err := quarantineTTL(ctx, st, a)
	if err != nil || got <= 0 || got > granted+time.Second {
		t.Fatalf("superseded session with %v left: quarantine %v, %v; want (0, %v]", granted, got, err, granted+time.Second)
	}
	a.Superseded = false
	if got, err := quarantineTTL(ctx, st, a); err != nil || got != time.Minute {
		t.Fatalf("session revoked for a drain timeout: quarantine %v, %v; want the full %v", got, err, time.Minute)
	}
	if err := st.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	for _, superseded := range []bool{true, false} {
		a.Superseded = superseded
		if got, err := quarantineTTL(ctx, st, a); err != nil || got != 0 {
			t.Fatalf("session already gone (superseded %v): quarantine %v, %v; want none", superseded, got, err)
		}
	}
}

// TestMemberStoreDeadline: a member call's store operation that etcd does
// not answer (a write sent as its leader died, or to a paused member) is
// tried again after a third of the keyspace's write deadline (TTL/3), and
// the call answers Unavailable at the deadline, so that the member retries
// at once instead of waiting out etcd's request timeout.
func TestMemberStoreDeadline(t *testing.T) {
	clk := clocktest.NewFake(time.Unix(0, 0))
	s := detached(t, clk)
	apply(s, 5, roomsChanges()...) // rooms: lease TTL 10s, so a deadline of 2s (the most)
	for _, tc := range []struct {
		ks   string
		want time.Duration
	}{{"rooms", 2 * time.Second}, {"unknown", maxWriteDeadline}} {
		attempts := make(chan struct{}, 8)
		done := make(chan error, 1)
		go func() { // exits when memberStore returns
			done <- s.memberStore(t.Context(), tc.ks, func(ctx context.Context) error {
				attempts <- struct{}{}
				<-ctx.Done() // etcd never answers
				return ctx.Err()
			})
		}()
		// Each attempt gets an equal share of what is left.
		a1 := tc.want / 3
		a2 := (tc.want - a1) / 2
		for _, step := range []time.Duration{a1, a2, tc.want - a1 - a2 - time.Nanosecond} {
			<-attempts
			clk.MustBlockUntil(t, 1)
			clk.Advance(step)
		}
		select {
		case err := <-done:
			t.Fatalf("%s: gave up before its deadline %v: %v", tc.ks, tc.want, err)
		default:
		}
		clk.Advance(time.Nanosecond)
		err := <-done
		if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "no answer within "+tc.want.String()) {
			t.Fatalf("%s: %v; want Unavailable after %v", tc.ks, err, tc.want)
		}
		if n := len(attempts); n != 0 {
			t.Fatalf("%s: %d attempts more than 3", tc.ks, n)
		}
	}

	// An answer in time, or an error of its own, passes through; an attempt
	// that times out is followed by one that answers.
	if err := s.memberStore(t.Context(), "rooms", func(context.Context) error { return nil }); err != nil {
		t.Fatalf("answer in time: %v", err)
	}
	if err := s.memberStore(t.Context(), "rooms", func(context.Context) error { return store.ErrFenced }); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("an error of its own: %v", err)
	}
	second := make(chan error, 1)
	var n atomic.Int32
	go func() { // exits when memberStore returns
		second <- s.memberStore(t.Context(), "rooms", func(ctx context.Context) error {
			if n.Add(1) == 1 {
				<-ctx.Done() // the first attempt is stuck on a paused member
				return ctx.Err()
			}
			return nil
		})
	}()
	clk.MustBlockUntil(t, 1)
	clk.Advance(2 * time.Second / 3)
	if err := <-second; err != nil || n.Load() != 2 {
		t.Fatalf("after a stuck attempt: %v after %d attempts; want success on the second", err, n.Load())
	}
}

// TestMemberStoreWithin: an operation that bounds its own wait (the
// keep-alive of an active member, store.RenewMember) gets the same three
// shares of the deadline as memberStore's, and is tried again when it
// reports that its share passed (an error wrapping
// context.DeadlineExceeded), not when its caller has gone.
func TestMemberStoreWithin(t *testing.T) {
	clk := clocktest.NewFake(time.Unix(0, 0))
	s := detached(t, clk)
	apply(s, 5, roomsChanges()...) // rooms: a deadline of 2s
	timedOut := fmt.Errorf("store: keep member alive: %w: %w", store.ErrUnavailable, context.DeadlineExceeded)
	if _, _, d := s.sessionState(session{keyspace: "unknown", member: "a"}); d != maxWriteDeadline {
		t.Errorf("the deadline of an unknown keyspace's keep-alive: %v; want %v", d, maxWriteDeadline)
	}
	_, _, d := s.sessionState(session{keyspace: "rooms", member: "a"})
	if d != 2*time.Second {
		t.Fatalf("the deadline of a keep-alive in rooms: %v; want 2s", d)
	}
	var shares []time.Duration
	err := s.memberStoreWithin(t.Context(), d, func(within time.Duration) error {
		shares = append(shares, within)
		clk.Advance(within) // etcd never answers
		return timedOut
	})
	a1 := 2 * time.Second / 3
	a2 := (2*time.Second - a1) / 2
	if want := []time.Duration{a1, a2, 2*time.Second - a1 - a2}; !slices.Equal(shares, want) {
		t.Errorf("shares %v; want %v", shares, want)
	}
	if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "no answer within 2s") {
		t.Fatalf("%v; want Unavailable after 2s", err)
	}

	n := 0
	if err := s.memberStoreWithin(t.Context(), d, func(time.Duration) error {
		if n++; n == 1 {
			return timedOut
		}
		return nil
	}); err != nil || n != 2 {
		t.Fatalf("after an attempt that timed out: %v after %d attempts; want success on the second", err, n)
	}
	n = 0
	if err := s.memberStoreWithin(t.Context(), d, func(time.Duration) error { n++; return store.ErrFenced }); !errors.Is(err, store.ErrFenced) || n != 1 {
		t.Fatalf("an error of its own: %v after %d attempts", err, n)
	}
	gone, cancel := context.WithCancel(t.Context())
	cancel()
	n = 0
	if err := s.memberStoreWithin(gone, d, func(time.Duration) error { n++; return timedOut }); !errors.Is(err, context.DeadlineExceeded) || n != 1 {
		t.Fatalf("the caller gone: %v after %d attempts; want the attempt's error, not retried", err, n)
	}
}

// TestJoinFencedSession: a process that fenced itself re-joins naming the
// session it held; the record says so, for the leader to revoke that
// session without quarantine. A fenced_session of another member, a forged
// one, or one without replace is refused, naming the field.
func TestJoinFencedSession(t *testing.T) {
	s, st := withRooms(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ms := &memberService{s}
	first, err := ms.Join(ctx, connect.NewRequest(&v1.JoinRequest{Keyspace: "rooms", Member: &v1.Member{Id: "a"}}))
	if err != nil {
		t.Fatal(err)
	}
	old, err := s.sessions.parse(first.Msg.Session)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		req     *v1.JoinRequest
		wantErr string
	}{
		{"without replace", &v1.JoinRequest{Keyspace: "rooms", Member: &v1.Member{Id: "a"}, FencedSession: first.Msg.Session}, "fenced_session: set, but replace is not"},
		{"of another member", &v1.JoinRequest{Keyspace: "rooms", Member: &v1.Member{Id: "a"}, Replace: true, FencedSession: s.sessions.token("rooms", "b", old.lease)}, `fenced_session: a session of member "b"`},
		{"forged", &v1.JoinRequest{Keyspace: "rooms", Member: &v1.Member{Id: "a"}, Replace: true, FencedSession: "rooms/a/51/00"}, "fenced_session: session token does not verify"},
	} {
		if _, err := ms.Join(ctx, connect.NewRequest(tc.req)); connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: %v; want invalid_argument mentioning %q", tc.name, err, tc.wantErr)
		}
	}
	if _, err := ms.Join(ctx, connect.NewRequest(&v1.JoinRequest{Keyspace: "rooms", Member: &v1.Member{Id: "a"}, Replace: true, FencedSession: first.Msg.Session})); err != nil {
		t.Fatal(err)
	}
	snap, _, err := st.LoadKeyspace(ctx, "rooms")
	if err != nil {
		t.Fatal(err)
	}
	if m := snap.Keyspaces["rooms"].Members["a"].Value; m.Replaces != old.lease || !m.ReplacesFenced {
		t.Fatalf("record %+v; want replacing %v, fenced", m, old.lease)
	}
}

// TestReplacedSessionQuarantinedOnItsLease: the leader ends a replaced
// session that holds buckets by putting their quarantine on the session's
// own lease and deleting its grants, without revoking it, so that the
// quarantine ends exactly when etcd expires that lease; KeepAlive does not
// renew a session the replica knows was replaced.
func TestReplacedSessionQuarantinedOnItsLease(t *testing.T) {
	s, st := withRooms(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	old, fence := memberHolding(ctx, t, st)
	cur, _, err := st.Grant(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Join(ctx, "rooms", shard.Member{ID: "a", Weight: 1, JoinedAt: time.Now()}, cur, true); err != nil {
		t.Fatal(err)
	}

	if err := s.revoke(ctx, st, fence, coordinator.RevokeSession{Keyspace: "rooms", ID: "a", Session: old, Quarantine: []int{0, 1}, TTL: 10 * time.Second, Superseded: true}); err != nil {
		t.Fatal(err)
	}
	snap, _, err := st.LoadKeyspace(ctx, "rooms")
	if err != nil {
		t.Fatal(err)
	}
	ks := snap.Keyspaces["rooms"]
	if q := ks.Quarantines["a"]; q.Lease != old || !slices.Equal(q.Value.Buckets, []int{0, 1}) {
		t.Fatalf("quarantine %+v; want buckets [0 1] on the replaced session's lease %v", q, old)
	}
	if g, ok := ks.Grants["a"]; ok {
		t.Fatalf("grants %+v of the replaced session still there", g)
	}
	if _, err := st.TimeToLive(ctx, old); err != nil {
		t.Fatalf("the replaced session's lease was revoked: %v", err)
	}
	// A new leader, which sees the replaced session holding nothing, plans
	// its revocation again: it must not revoke the lease, which carries
	// the quarantine.
	if err := s.revoke(ctx, st, fence, coordinator.RevokeSession{Keyspace: "rooms", ID: "a", Session: old, TTL: 10 * time.Second, Superseded: true}); err != nil {
		t.Fatal(err)
	}
	if qi, err := st.QuarantineOf(ctx, "rooms", "a"); err != nil || qi.Lease != old {
		t.Fatalf("quarantine after a second revocation: %+v, %v; want it still on lease %v", qi, err, old)
	}
	// The lease expires (here: at once): the quarantine ends with it.
	if err := st.Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	if qi, err := st.QuarantineOf(ctx, "rooms", "a"); err != nil || qi.Lease != 0 {
		t.Fatalf("quarantine after the lease ended: %+v, %v", qi, err)
	}

	// A replica that knows of the replacement does not renew the old
	// session; one that does not know it yet lets the renewal through.
	apply(s, 9, store.Change{Kind: store.KindMember, Keyspace: "rooms", ID: "a", Key: store.MemberKey("rooms", "a"), Value: shard.Member{ID: "a", Weight: 1, Session: cur, JoinedAt: time.Now()}, Lease: cur, ModRevision: 9})
	if !s.replaced(session{keyspace: "rooms", member: "a", lease: old}) || s.replaced(session{keyspace: "rooms", member: "a", lease: cur}) || s.replaced(session{keyspace: "rooms", member: "b", lease: old}) {
		t.Fatal("replaced() does not follow the view's member record")
	}
	// With the member record gone (the new session ended too), the
	// quarantine on the old session's lease still marks it replaced.
	apply(s, 10,
		store.Change{Kind: store.KindMember, Keyspace: "rooms", ID: "a", Key: store.MemberKey("rooms", "a"), Deleted: true, ModRevision: 10},
		store.Change{Kind: store.KindQuarantine, Keyspace: "rooms", ID: "a", Key: store.QuarantineKey("rooms", "a"), Value: shard.Quarantine{Session: old, Buckets: []int{0, 1}}, Lease: old, ModRevision: 10})
	if !s.replaced(session{keyspace: "rooms", member: "a", lease: old}) || s.replaced(session{keyspace: "rooms", member: "a", lease: cur}) {
		t.Fatal("replaced() does not follow the quarantine's lease")
	}
}

// TestJoinAttemptRepeats: memberStore repeats a Join's store operation
// when an attempt misses its share of the deadline, though that attempt
// may have landed. A repeat must then succeed on the same session, not
// find the id held by the first attempt's live session and refuse the
// join; another process joining the same id is still refused.
func TestJoinAttemptRepeats(t *testing.T) {
	s, st := withRooms(t)
	ctx := t.Context()
	ks, err := s.keyspace(ctx, "rooms")
	if err != nil {
		t.Fatal(err)
	}
	rec := shard.Member{ID: "a", Weight: 1, JoinedAt: time.Now()}
	j := &joinOp{s: s, ks: ks, rec: rec}
	if err := j.attempt(ctx); err != nil { // lands; its answer is lost
		t.Fatal(err)
	}
	first := j.lease
	if err := j.attempt(ctx); err != nil {
		t.Fatalf("repeated join attempt: %v; want success on the first attempt's session", err)
	}
	if j.lease != first {
		t.Fatalf("the repeat joined on session %v, want the first attempt's %v", j.lease, first)
	}
	snap, err := st.LoadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m := snap.Keyspaces["rooms"].Members["a"]; m.Value.Session != first {
		t.Fatalf("member a is on session %v, want %v", m.Value.Session, first)
	}
	other := &joinOp{s: s, ks: ks, rec: rec}
	if err := other.attempt(ctx); !errors.Is(err, store.ErrExists) {
		t.Fatalf("another process joining a: %v, want ErrExists", err)
	}
}
