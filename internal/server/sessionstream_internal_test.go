package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
)

// h2cServer serves s's API over HTTP/2 without TLS, as keyshard serve
// does, and returns a member client of it.
func h2cServer(t *testing.T, s *Server) keyshardv1connect.MemberServiceClient {
	t.Helper()
	hs, err := s.httpServer()
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(hs.Handler)
	ts.Config.Protocols = hs.Protocols
	ts.Start()
	t.Cleanup(ts.Close)
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(tr.CloseIdleConnections)
	return keyshardv1connect.NewMemberServiceClient(&http.Client{Transport: tr}, ts.URL)
}

// TestSessionStreamPushesGrants: a Session stream's handler waits for the
// member's next message while the grants are pushed to it as the view
// changes; when the session ends, the stream ends NOT_FOUND without the
// member sending anything (its handler's wait is cut short).
func TestSessionStreamPushesGrants(t *testing.T) {
	ctx, s, _ := fakeReplica(t)
	withStore(t, s) // where the ended session's lease is looked up
	s.view.apply(store.Update{Resync: &store.Resync{Snapshot: store.NewSnapshot(0)}})
	apply(s, 5, roomsChanges()...)
	members := h2cServer(t, s)

	st := members.Session(ctx)
	defer func() { _ = st.CloseRequest(); _ = st.CloseResponse() }()
	if err := st.Send(&v1.SessionRequest{Session: s.sessions.token("rooms", "a", testLease)}); err != nil {
		t.Fatal(err)
	}
	msg, err := st.Receive()
	if err != nil {
		t.Fatal(err)
	}
	if g := msg.GetGrants(); len(g.GetGrants()) != 4 || g.GetRevision() != 5 || msg.GetKeepAlive() != nil {
		t.Fatalf("first message %v; want a's 4 grants at revision 5", msg)
	}

	// A change to b only sends a nothing; a's own release (bucket 2 at
	// its token) sends its grants without bucket 2.
	apply(s, 6, store.Change{Kind: store.KindMember, Keyspace: "rooms", ID: "b", Key: store.MemberKey("rooms", "b"), Value: roomsChanges()[3].Value, Lease: testLease + 1, ModRevision: 6})
	apply(s, 7, releaseChange(7))
	msg, err = st.Receive()
	if err != nil {
		t.Fatal(err)
	}
	if g := msg.GetGrants(); g.GetRevision() != 7 || len(g.GetGrants()) != 3 {
		t.Fatalf("after a's release: %v; want its 3 other grants at revision 7 (and nothing for b's change)", msg)
	}
	for _, g := range msg.GetGrants().GetGrants() {
		if g.GetBucket() == 2 {
			t.Fatalf("released bucket 2 shown back: %v", msg)
		}
	}

	// The session ends (its records go with its lease, which etcd does
	// not know): the stream ends though the member sends nothing.
	apply(s, 8,
		store.Change{Kind: store.KindMember, Keyspace: "rooms", ID: "a", Key: store.MemberKey("rooms", "a"), Deleted: true, ModRevision: 8},
		store.Change{Kind: store.KindGrants, Keyspace: "rooms", ID: "a", Key: store.GrantsKey("rooms", "a"), Deleted: true, ModRevision: 8},
		store.Change{Kind: store.KindReleases, Keyspace: "rooms", ID: "a", Key: store.ReleasesKey("rooms", "a"), Deleted: true, ModRevision: 8})
	for {
		msg, err := st.Receive()
		if err != nil {
			if connect.CodeOf(err) != connect.CodeNotFound {
				t.Fatalf("ended session's stream: %v; want NOT_FOUND", err)
			}
			break
		}
		if msg.GetKeepAlive() != nil {
			t.Fatalf("unasked keep-alive answer %v", msg)
		}
	}
}

// TestSessionStreamEndsWhenUnreachable: an open Session stream whose
// member sends nothing ends UNAVAILABLE once the replica counts etcd
// unreachable, as WatchGrants streams do, so that the member moves to
// another replica.
func TestSessionStreamEndsWhenUnreachable(t *testing.T) {
	ctx, s, clk := fakeReplica(t)
	withStore(t, s)
	failing := failingProbe(s)
	s.view.apply(store.Update{Resync: &store.Resync{Snapshot: store.NewSnapshot(0)}})
	apply(s, 5, roomsChanges()...)
	s.checkStore(ctx)
	members := h2cServer(t, s)

	st := members.Session(ctx)
	defer func() { _ = st.CloseRequest(); _ = st.CloseResponse() }()
	if err := st.Send(&v1.SessionRequest{Session: s.sessions.token("rooms", "a", testLease)}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Receive(); err != nil {
		t.Fatal(err)
	}
	failing.Store(true)
	for range 3 { // 3 s without a successful probe: unreachable
		clk.Advance(1e9)
		s.checkStore(ctx)
	}
	_, err := st.Receive()
	if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "cannot reach etcd") {
		t.Fatalf("open Session stream: %v; want UNAVAILABLE naming etcd", err)
	}
}

// TestGrantsNewsAsksEtcdSparingly: a member stream whose session this
// replica's view does not show yet asks etcd whether it lives once, then
// at most once a second however often its keyspace changes, sending
// nothing in between; once the view has shown the session, a session
// gone from the view is asked about at once, and ends the stream.
func TestGrantsNewsAsksEtcdSparingly(t *testing.T) {
	ctx, s, clk := fakeReplica(t)
	s.view.apply(store.Update{Resync: &store.Resync{Snapshot: store.NewSnapshot(0)}})
	apply(s, 5, roomsChanges()...)
	asked := 0
	gone := false
	s.seams.sessionLease = func(context.Context, shard.LeaseID) (store.LeaseInfo, error) {
		asked++
		if gone {
			return store.LeaseInfo{}, store.ErrLeaseNotFound
		}
		return store.LeaseInfo{TTL: 10 * time.Second}, nil
	}
	const lease = testLease + 7
	sess := session{keyspace: "rooms", member: "c", lease: lease}
	var g grantsNews
	next := func(what string, wantAsked int, wantSend bool) {
		t.Helper()
		resp, err := g.next(ctx, s, sess)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if asked != wantAsked || (resp != nil) != wantSend {
			t.Fatalf("%s: etcd asked %d times, sent %v; want %d, %v", what, asked, resp, wantAsked, wantSend)
		}
		if resp != nil {
			g.sent(resp)
		}
	}
	next("first answer, c unknown to the view", 1, true)
	for rev := int64(6); rev <= 8; rev++ { // changes of the keyspace, not of c
		apply(s, rev, store.Change{Kind: store.KindMember, Keyspace: "rooms", ID: "b", Key: store.MemberKey("rooms", "b"), Value: roomsChanges()[3].Value, Lease: testLease + 1, ModRevision: rev})
		next("a change within the second", 1, false)
	}
	clk.Advance(unseenRecheck)
	next("a change a second later", 2, false)

	// The view shows c: no more asking; then c's record goes (its session
	// ended): asked at once, and the stream ends.
	apply(s, 9, store.Change{Kind: store.KindMember, Keyspace: "rooms", ID: "c", Key: store.MemberKey("rooms", "c"), Value: shard.Member{ID: "c", Weight: 1, Session: lease}, Lease: lease, ModRevision: 9})
	next("c joined in the view (its grants unchanged: none)", 2, false)
	gone = true
	apply(s, 10, store.Change{Kind: store.KindMember, Keyspace: "rooms", ID: "c", Key: store.MemberKey("rooms", "c"), Deleted: true, ModRevision: 10})
	if _, err := g.next(ctx, s, sess); connect.CodeOf(err) != connect.CodeNotFound || asked != 3 {
		t.Fatalf("c's record gone: %v after %d questions to etcd; want NOT_FOUND at the third", err, asked)
	}
}
