package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
)

type sessionsClient = connect.BidiStreamForClient[v1.SessionsRequest, v1.SessionsResponse]

// sessionsStream opens a Sessions stream over HTTP/2 to ts, in protocol p
// (streamProtocols), and sends first.
func sessionsStream(t *testing.T, ctx context.Context, ts *testServer, p []connect.ClientOption, first *v1.SessionsRequest) *sessionsClient {
	t.Helper()
	members := keyshardv1connect.NewMemberServiceClient(h2cClient(), ts.url, append([]connect.ClientOption{connect.WithInterceptors(bearerToken(memberToken))}, p...)...)
	st := members.Sessions(ctx)
	if err := st.Send(first); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("send the first message: %v", err)
	}
	t.Cleanup(func() { _ = st.CloseRequest(); _ = st.CloseResponse() })
	return st
}

// sessionsState is what a process has read from its Sessions stream:
// each id's latest grants, the answers by keep-alive, and the ids ended.
type sessionsState struct {
	// release, if set, is called with each grants message that asks a
	// session to release buckets.
	release func(id uint32, g *v1.GetGrantsResponse)
	grants  map[uint32]*v1.GetGrantsResponse
	answers map[uint64]*v1.SessionsKeepAliveAnswer
	ended   map[uint32]*v1.SessionEnded
	msgs    int
}

// receiveSessions receives from st, folding each message into s, until
// cond holds; any error fails the test.
func receiveSessions(t *testing.T, st *sessionsClient, s *sessionsState, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		msg, err := st.Receive()
		if err != nil {
			var got []string
			for id, g := range s.grants {
				got = append(got, fmt.Sprintf("id %d: %d grants, %d to release, revision %d", id, len(g.GetGrants()), len(g.GetRelease()), g.GetRevision()))
			}
			t.Fatalf("waiting for %s: %v (after %d messages; %v)", what, err, s.msgs, got)
		}
		s.msgs++
		for _, g := range msg.GetGrants() {
			if prev := s.grants[g.GetId()]; prev != nil && g.GetGrants().GetRevision() < prev.GetRevision() {
				t.Fatalf("id %d: grants at revision %d after %d", g.GetId(), g.GetGrants().GetRevision(), prev.GetRevision())
			}
			s.grants[g.GetId()] = g.GetGrants()
			if s.release != nil && len(g.GetGrants().GetRelease()) > 0 {
				s.release(g.GetId(), g.GetGrants())
			}
		}
		if a := msg.GetKeepAlive(); a != nil {
			if s.answers[a.GetKeepAlive()] != nil {
				t.Fatalf("keep-alive %d answered twice", a.GetKeepAlive())
			}
			s.answers[a.GetKeepAlive()] = a
		}
		for _, e := range msg.GetEnded() {
			s.ended[e.GetId()] = e
		}
	}
}

func newSessionsState() *sessionsState {
	return &sessionsState{grants: map[uint32]*v1.GetGrantsResponse{}, answers: map[uint64]*v1.SessionsKeepAliveAnswer{}, ended: map[uint32]*v1.SessionEnded{}}
}

// totalGrants is the number of buckets the ids hold, by their latest
// grants.
func (s *sessionsState) totalGrants(ids ...uint32) int {
	n := 0
	for _, id := range ids {
		n += len(s.grants[id].GetGrants())
	}
	return n
}

// TestSessionsStream: five members of two keyspaces on one Sessions
// stream, over both protocols. One keep-alive message renews all five
// (one answer, a renewal per id in order, each with a TTL) and activates
// them, after which the grants of every session come on the stream, each
// bucket to exactly one of them; a member that left is answered not_found
// and listed in ended, while the others go on; a closed id is no longer
// renewed; a keep-alive naming an id never opened is answered not_found
// without ending the stream; a half-close ends it cleanly after the last
// answer. serve counts each renewal (via="shared").
func TestSessionsStream(t *testing.T) {
	ts := startServer(t, nil)
	ctx := ctxT(t)
	for _, p := range streamProtocols {
		t.Run(p.name, func(t *testing.T) {
			kss := []string{"rooms-" + p.name, "users-" + p.name}
			for _, ks := range kss {
				if _, err := ts.admin.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: &v1.Keyspace{Name: ks, Buckets: 12}})); err != nil {
					t.Fatal(err)
				}
			}
			// ids 1-3 in rooms, 4-5 in users.
			var open []*v1.SessionsOpen
			tokens := map[uint32]string{}
			for id := uint32(1); id <= 5; id++ {
				ks := kss[0]
				if id > 3 {
					ks = kss[1]
				}
				tokens[id] = rawJoin(t, ctx, ts, ks, fmt.Sprintf("m%d", id), false)
				open = append(open, &v1.SessionsOpen{Id: id, Session: tokens[id]})
			}
			all := []uint32{1, 2, 3, 4, 5}
			st := sessionsStream(t, ctx, ts, p.opts, &v1.SessionsRequest{Open: open, KeepAlive: 1, Renew: all})
			s := newSessionsState()
			// Each session hands over what it is asked to release, as a
			// worker does.
			released := map[[3]uint64]bool{} // id, bucket, token
			s.release = func(id uint32, g *v1.GetGrantsResponse) {
				asked := map[uint32]bool{}
				for _, b := range g.GetRelease() {
					asked[b] = true
				}
				var rel []*v1.BucketGrant
				for _, bg := range g.GetGrants() {
					if key := [3]uint64{uint64(id), uint64(bg.GetBucket()), bg.GetToken()}; asked[bg.GetBucket()] && !released[key] {
						released[key] = true
						rel = append(rel, bg)
					}
				}
				if len(rel) == 0 {
					return
				}
				if _, err := ts.member.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{Session: tokens[id], Buckets: rel})); err != nil {
					t.Fatalf("release %v of id %d: %v", rel, id, err)
				}
			}
			receiveSessions(t, st, s, "keep-alive 1's answer", func() bool { return s.answers[1] != nil })
			checkRenewed(t, s.answers[1], all)
			// Active: the leader spreads each keyspace's 12 buckets over
			// its members, and every session's grants come on the stream.
			receiveSessions(t, st, s, "every bucket granted", func() bool {
				return s.totalGrants(1, 2, 3) == 12 && s.totalGrants(4, 5) == 12 && len(s.grants[1].GetGrants()) == 4 && len(s.grants[4].GetGrants()) == 6 &&
					len(s.grants[1].GetRelease())+len(s.grants[2].GetRelease())+len(s.grants[3].GetRelease()) == 0
			})
			checkDisjoint(t, s, []uint32{1, 2, 3})
			checkDisjoint(t, s, []uint32{4, 5})

			// m2 leaves: it hands its buckets to m1 and m3, then its
			// session ends and the stream lists it in ended, while the
			// others go on.
			if _, err := ts.member.Leave(ctx, connect.NewRequest(&v1.LeaveRequest{Session: tokens[2]})); err != nil {
				t.Fatal(err)
			}
			receiveSessions(t, st, s, "m2 ended, its buckets with m1 and m3", func() bool { return s.ended[2] != nil && s.totalGrants(1, 3) == 12 })
			if e := s.ended[2]; e.GetErrorCode() != "not_found" {
				t.Fatalf("m2 ended with %v; want not_found", e)
			}
			if err := st.Send(&v1.SessionsRequest{KeepAlive: 2, Renew: all}); err != nil {
				t.Fatal(err)
			}
			receiveSessions(t, st, s, "keep-alive 2's answer", func() bool { return s.answers[2] != nil })
			rs := s.answers[2].GetRenewals()
			if len(rs) != 5 || rs[1].GetId() != 2 || rs[1].GetErrorCode() != "not_found" {
				t.Fatalf("renewals %v; want m2's not_found", rs)
			}
			checkRenewed(t, &v1.SessionsKeepAliveAnswer{Renewals: []*v1.SessionRenewal{rs[0], rs[2], rs[3], rs[4]}}, []uint32{1, 3, 4, 5})

			// Close id 5, then renew it and id 9 (never opened): both
			// not_found, the stream goes on; id 4 renews.
			if err := st.Send(&v1.SessionsRequest{Close: []uint32{5}}); err != nil {
				t.Fatal(err)
			}
			if err := st.Send(&v1.SessionsRequest{KeepAlive: 100, Renew: []uint32{4, 5, 9}}); err != nil {
				t.Fatal(err)
			}
			receiveSessions(t, st, s, "keep-alive 100's answer", func() bool { return s.answers[100] != nil })
			rs = s.answers[100].GetRenewals()
			if len(rs) != 3 || rs[0].GetErrorCode() != "" || rs[0].GetTtl().AsDuration() <= 0 || rs[1].GetErrorCode() != "not_found" || rs[2].GetErrorCode() != "not_found" || !strings.Contains(rs[2].GetErrorMessage(), "id 9") {
				t.Fatalf("renewals %v; want 4 renewed, 5 and 9 not_found", rs)
			}

			// A closed id may name a session again: id 5 opens m5 anew
			// and renews in the same message.
			if err := st.Send(&v1.SessionsRequest{Open: []*v1.SessionsOpen{{Id: 5, Session: tokens[5]}}, KeepAlive: 99, Renew: []uint32{5}}); err != nil {
				t.Fatal(err)
			}
			receiveSessions(t, st, s, "keep-alive 99's answer", func() bool { return s.answers[99] != nil })
			checkRenewed(t, s.answers[99], []uint32{5})

			// Half-closed after keep-alive 101: its answer comes, then a
			// clean end.
			if err := st.Send(&v1.SessionsRequest{KeepAlive: 101, Renew: []uint32{1}}); err != nil {
				t.Fatal(err)
			}
			if err := st.CloseRequest(); err != nil {
				t.Fatal(err)
			}
			receiveSessions(t, st, s, "keep-alive 101's answer", func() bool { return s.answers[101] != nil })
			var err error
			for err == nil {
				var msg *v1.SessionsResponse
				if msg, err = st.Receive(); err == nil && msg.GetKeepAlive() != nil {
					t.Fatalf("answer %v after the last keep-alive", msg)
				}
			}
			if !errors.Is(err, io.EOF) {
				t.Fatalf("stream ended with %v; want a clean end", err)
			}
		})
	}
	if got := metricLine(t, ts, `keyshard_member_keepalives_total{result="renewed",via="shared"}`); got < 2*(5+4+1+1) {
		t.Errorf("renewals on Sessions streams: %v; want at least %d", got, 2*(5+4+1+1))
	}
}

// checkRenewed fails unless a renews exactly ids, in order, each with a
// TTL and no error.
func checkRenewed(t *testing.T, a *v1.SessionsKeepAliveAnswer, ids []uint32) {
	t.Helper()
	rs := a.GetRenewals()
	if len(rs) != len(ids) {
		t.Fatalf("renewals %v; want one per id of %v", rs, ids)
	}
	for i, r := range rs {
		if r.GetId() != ids[i] || r.GetErrorCode() != "" || r.GetTtl().AsDuration() <= 0 {
			t.Fatalf("renewal %d: %v; want id %d renewed with a TTL", i, r, ids[i])
		}
	}
}

// checkDisjoint fails if two of ids hold one bucket.
func checkDisjoint(t *testing.T, s *sessionsState, ids []uint32) {
	t.Helper()
	held := map[uint32]uint32{}
	for _, id := range ids {
		for _, g := range s.grants[id].GetGrants() {
			if other, dup := held[g.GetBucket()]; dup {
				t.Fatalf("bucket %d granted to ids %d and %d", g.GetBucket(), other, id)
			}
			held[g.GetBucket()] = id
		}
	}
}

// TestSessionsStreamRefuses: messages a process got wrong end the stream
// INVALID_ARGUMENT naming the field, before any of the message is applied;
// over HTTP/1.1 the call is UNIMPLEMENTED; the member token is required.
func TestSessionsStreamRefuses(t *testing.T) {
	ts := startServer(t, nil)
	ctx := ctxT(t)
	if _, err := ts.admin.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "rooms", Buckets: 8}})); err != nil {
		t.Fatal(err)
	}
	a := rawJoin(t, ctx, ts, "rooms", "a", false)
	b := rawJoin(t, ctx, ts, "rooms", "b", false)
	for _, p := range streamProtocols {
		t.Run(p.name, func(t *testing.T) {
			for _, tc := range []struct {
				name        string
				first, next *v1.SessionsRequest
				want        string
			}{
				{"id 0", &v1.SessionsRequest{Open: []*v1.SessionsOpen{{Id: 0, Session: a}}}, nil, "open[0].id: 0"},
				{"id twice in a message", &v1.SessionsRequest{Open: []*v1.SessionsOpen{{Id: 1, Session: a}, {Id: 1, Session: b}}}, nil, "open[1].id: 1 is followed"},
				{"id in use", &v1.SessionsRequest{Open: []*v1.SessionsOpen{{Id: 1, Session: a}}}, &v1.SessionsRequest{Open: []*v1.SessionsOpen{{Id: 1, Session: b}}}, "open[0].id: 1 is followed"},
				{"session twice", &v1.SessionsRequest{Open: []*v1.SessionsOpen{{Id: 1, Session: a}}}, &v1.SessionsRequest{Open: []*v1.SessionsOpen{{Id: 2, Session: a}}}, "followed on this stream already, as id 1"},
				{"no session", &v1.SessionsRequest{Open: []*v1.SessionsOpen{{Id: 1}}}, nil, "open[0].session: empty"},
				{"malformed session", &v1.SessionsRequest{Open: []*v1.SessionsOpen{{Id: 3, Session: "x/y"}}}, nil, "open[0] (id 3): session \"x/y\" is malformed"},
				{"renew without a number", &v1.SessionsRequest{Open: []*v1.SessionsOpen{{Id: 1, Session: a}}, Renew: []uint32{1}}, nil, "keep_alive: 0 with renew set"},
				{"a number without renew", &v1.SessionsRequest{KeepAlive: 1}, nil, "keep_alive: 1 with renew empty"},
				{"an id renewed twice", &v1.SessionsRequest{Open: []*v1.SessionsOpen{{Id: 1, Session: a}}, KeepAlive: 1, Renew: []uint32{1, 1}}, nil, "renew[1]: id 1 is listed twice"},
			} {
				st := sessionsStream(t, ctx, ts, p.opts, tc.first)
				if tc.next != nil {
					if err := st.Send(tc.next); err != nil && !errors.Is(err, io.EOF) {
						t.Fatal(err)
					}
				}
				var err error
				for err == nil {
					var msg *v1.SessionsResponse
					if msg, err = st.Receive(); err == nil && msg.GetKeepAlive() != nil {
						t.Fatalf("%s: a keep-alive answered (%v) in a message refused whole", tc.name, msg)
					}
				}
				if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: stream ended with %v; want INVALID_ARGUMENT naming %q", tc.name, err, tc.want)
				}
			}
			st := keyshardv1connect.NewMemberServiceClient(h2cClient(), ts.url, p.opts...).Sessions(ctx)
			_ = st.Send(&v1.SessionsRequest{Open: []*v1.SessionsOpen{{Id: 1, Session: a}}})
			_, err := st.Receive()
			wantCode(t, err, connect.CodeUnauthenticated, "missing bearer token")
			_ = st.CloseRequest()
			_ = st.CloseResponse()
		})
	}
	http1 := keyshardv1connect.NewMemberServiceClient(&http.Client{Transport: &http.Transport{}}, ts.url, connect.WithInterceptors(bearerToken(memberToken)))
	st1 := http1.Sessions(ctx)
	_ = st1.Send(&v1.SessionsRequest{Open: []*v1.SessionsOpen{{Id: 1, Session: a}}})
	_, err := st1.Receive()
	if connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Fatalf("Sessions over HTTP/1.1: %v; want UNIMPLEMENTED", err)
	}
	_ = st1.CloseRequest()
	_ = st1.CloseResponse()
}
