package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/keyshardtest"
)

// post sends body as JSON to procedure of ts with token, as curl does,
// and decodes a 200 answer into out. It returns the status and the JSON
// error body's code and message otherwise.
func post(t *testing.T, ts *testServer, token, procedure, body string, out proto.Message) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, ts.url+procedure, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK {
		var e struct{ Code, Message string }
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatalf("%s: status %d, body %q: %v", procedure, res.StatusCode, raw, err)
		}
		return res.StatusCode, e.Code, e.Message
	}
	if out != nil {
		if err := protojson.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s: answer %q: %v", procedure, raw, err)
		}
	}
	return res.StatusCode, "", ""
}

// mustPost is post that fails t unless the answer is 200.
func mustPost(t *testing.T, ts *testServer, token, procedure, body string, out proto.Message) {
	t.Helper()
	if status, code, msg := post(t, ts, token, procedure, body, out); status != http.StatusOK {
		t.Fatalf("%s %s: %d %s %s", procedure, body, status, code, msg)
	}
}

// commitRecord returns member id's commit record in ks as ts's view has
// it once cond holds on it.
func commitRecord(t *testing.T, ctx context.Context, ts *testServer, ks, id string, cond func(store.Entry[shard.Commit]) bool) store.Entry[shard.Commit] {
	t.Helper()
	var e store.Entry[shard.Commit]
	if err := ts.srv.WaitView(ctx, func(snap *store.Snapshot) bool {
		if k := snap.Keyspaces[ks]; k != nil {
			e = k.Commits[id]
		}
		return cond(e)
	}); err != nil {
		t.Fatalf("commit record of %s: %+v: %v", id, e, err)
	}
	return e
}

func createStream(t *testing.T, ctx context.Context, ts *testServer, name string, buckets uint32) {
	t.Helper()
	if _, err := ts.admin.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: &v1.Keyspace{Name: name, Buckets: buckets, Mode: v1.KeyspaceMode_KEYSPACE_MODE_STREAM}})); err != nil {
		t.Fatal(err)
	}
}

func maxToken(gs []*v1.BucketGrant) uint64 {
	var m uint64
	for _, g := range gs {
		m = max(m, g.Token)
	}
	return m
}

func commit(ctx context.Context, ts *testServer, req *v1.CommitRequest) (uint64, error) {
	r, err := ts.member.Commit(ctx, connect.NewRequest(req))
	if err != nil {
		return 0, err
	}
	return r.Msg.Revision, nil
}

// TestStreamGracefulMoveOverHTTP: a stream worker speaking plain
// HTTP/JSON (as curl does) joins, keeps alive, reads grants carrying
// from, commits, and hands the buckets that move to a second member over
// with its final positions, which the second member's grants start from.
// A release position below the committed one is refused, releasing
// nothing.
func TestStreamGracefulMoveOverHTTP(t *testing.T) {
	ts := startServer(t, nil)
	ctx := ctxT(t)
	var ks v1.CreateKeyspaceResponse
	mustPost(t, ts, adminToken, "/keyshard.v1.AdminService/CreateKeyspace", `{"keyspace":{"name":"ev","buckets":8,"mode":"KEYSPACE_MODE_STREAM"}}`, &ks)
	if ks.Keyspace.Mode != v1.KeyspaceMode_KEYSPACE_MODE_STREAM {
		t.Fatalf("created %v", ks.Keyspace)
	}
	var join v1.JoinResponse
	mustPost(t, ts, memberToken, "/keyshard.v1.MemberService/Join", `{"keyspace":"ev","member":{"id":"a","address":"10.0.0.1:8000"}}`, &join)
	sess := `"session":"` + join.Session + `"`
	keep := func() { mustPost(t, ts, memberToken, "/keyshard.v1.MemberService/KeepAlive", `{`+sess+`}`, nil) }
	keep()
	grants := func(cond func(*v1.GetGrantsResponse) bool) *v1.GetGrantsResponse {
		for {
			var r v1.GetGrantsResponse
			mustPost(t, ts, memberToken, "/keyshard.v1.MemberService/GetGrants", `{`+sess+`,"wait":"1s"}`, &r)
			if cond(&r) {
				return &r
			}
			keep()
		}
	}
	held := grants(func(r *v1.GetGrantsResponse) bool { return len(r.Grants) == 8 })
	for _, g := range held.Grants {
		if g.From != 0 {
			t.Fatalf("first grant %v starts at %d; want 0, the start of the stream", g, g.From)
		}
	}
	var c v1.CommitResponse
	mustPost(t, ts, memberToken, "/keyshard.v1.MemberService/Commit", `{`+sess+`,"max_token":"`+u64(maxToken(held.Grants))+`","position":"100"}`, &c)
	if c.Revision == 0 {
		t.Fatal("commit answered revision 0")
	}
	commitRecord(t, ctx, ts, "ev", "a", func(e store.Entry[shard.Commit]) bool { return e.Value.Default == 100 })

	b := joinMember(t, ts, "ev", "b")
	asked := grants(func(r *v1.GetGrantsResponse) bool { return len(r.Release) > 0 })
	var rel, pos, low []string
	moved := map[uint32]bool{}
	for _, g := range asked.Grants {
		if slices.Contains(asked.Release, g.Bucket) {
			moved[g.Bucket] = true
			bt := `{"bucket":` + u64(uint64(g.Bucket)) + `,"token":"` + u64(g.Token) + `"`
			rel = append(rel, bt+`}`)
			pos = append(pos, bt+`,"position":"150"}`)
			low = append(low, bt+`,"position":"99"}`)
		}
	}
	release := `{` + sess + `,"buckets":[` + strings.Join(rel, ",") + `],"positions":[`
	status, code, msg := post(t, ts, memberToken, "/keyshard.v1.MemberService/Release", release+strings.Join(low, ",")+`]}`, nil)
	if status != http.StatusBadRequest || code != "failed_precondition" || !strings.Contains(msg, "backwards") || !strings.Contains(msg, "positions[0]") {
		t.Fatalf("release below the committed position: %d %s %q", status, code, msg)
	}
	if again := grants(func(*v1.GetGrantsResponse) bool { return true }); len(again.Grants) != len(asked.Grants) {
		t.Fatalf("a refused release released something: %v", again)
	}
	var rr v1.ReleaseResponse
	mustPost(t, ts, memberToken, "/keyshard.v1.MemberService/Release", release+strings.Join(pos, ",")+`]}`, &rr)

	// b starts the moved buckets where a stopped.
	got := pollGrants(t, ctx, ts, b.sess, rr.Revision, nil, func(r *v1.GetGrantsResponse) bool { return len(r.Grants) == len(moved) })
	for _, g := range got.Grants {
		if !moved[g.Bucket] || g.From != 150 {
			t.Errorf("b's grant %v; want the moved buckets from a's final position 150", g)
		}
	}
	// a's remaining buckets are at its commit.
	for _, g := range grants(func(r *v1.GetGrantsResponse) bool { return len(r.Release) == 0 }).Grants {
		if moved[g.Bucket] || g.From != 0 {
			t.Errorf("a's grant %v after the move; want only unmoved buckets, from 0 (granted before the commit)", g)
		}
	}
}

func u64(v uint64) string { return strconv.FormatUint(v, 10) }

// TestStreamStaleWorkerCommit: a worker whose session was replaced (it
// paused, and its process restarted) commits: refused NOT_FOUND, and the
// committed positions do not move; the new session starts from them. A
// commit naming a bucket that moved away is refused naming it, and the
// bucket's next holder starts from the released position, not the stale
// commit's.
func TestStreamStaleWorkerCommit(t *testing.T) {
	ts := startServer(t, nil)
	ctx := ctxT(t)
	createStream(t, ctx, ts, "ev", 4)
	old, held := holdAll(t, ctx, ts, "ev", "a", 4)
	top := maxToken(held.Grants)
	if _, err := commit(ctx, ts, &v1.CommitRequest{Session: old, MaxToken: top, Position: 100}); err != nil {
		t.Fatal(err)
	}
	// The process restarts while the old one is paused.
	sess := rawJoin(t, ctx, ts, "ev", "a", true)
	keepAlive(t, ctx, ts, sess)
	_, err := commit(ctx, ts, &v1.CommitRequest{Session: old, MaxToken: top, Position: 500})
	wantCode(t, err, connect.CodeNotFound, "replaced")
	// The new session starts from the old one's commit, not the stale 500.
	got := pollGrants(t, ctx, ts, sess, 0, nil, func(r *v1.GetGrantsResponse) bool {
		keepAlive(t, ctx, ts, sess)
		return len(r.Grants) == 4
	})
	for _, g := range got.Grants {
		if g.From != 100 {
			t.Errorf("new session's grant %v; want from 100, the last acknowledged commit", g)
		}
	}
	_, err = commit(ctx, ts, &v1.CommitRequest{Session: old, MaxToken: top, Position: 500})
	wantCode(t, err, connect.CodeNotFound, `session of member "a"`)

	// A bucket moves to b; a releases it at 150 and then, stale, commits
	// it at 900 with the token it held it at.
	b := joinMember(t, ts, "ev", "b")
	asked := pollGrants(t, ctx, ts, sess, 0, nil, func(r *v1.GetGrantsResponse) bool {
		keepAlive(t, ctx, ts, sess)
		return len(r.Release) > 0
	})
	var gone *v1.BucketGrant
	for _, g := range asked.Grants {
		if g.Bucket == asked.Release[0] {
			gone = g
		}
	}
	rr, err := ts.member.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{Session: sess, Buckets: []*v1.BucketGrant{gone},
		Positions: []*v1.BucketPosition{{Bucket: gone.Bucket, Token: gone.Token, Position: 150}}}))
	if err != nil {
		t.Fatal(err)
	}
	bg := pollGrants(t, ctx, ts, b.sess, rr.Msg.Revision, nil, func(r *v1.GetGrantsResponse) bool { return len(r.Grants) > 0 })
	_, err = commit(ctx, ts, &v1.CommitRequest{Session: sess, MaxToken: maxToken(asked.Grants), Position: 100,
		Exceptions: []*v1.BucketPosition{{Bucket: gone.Bucket, Token: gone.Token, Position: 900}}})
	wantCode(t, err, connect.CodeFailedPrecondition, "exceptions[0]: bucket")
	for _, g := range bg.Grants {
		if g.Bucket == gone.Bucket && g.From != 150 {
			t.Errorf("b's grant %v; want from 150, a's final position", g)
		}
	}
	// The refused commits left no trace: the old session's record was
	// folded (and deleted) by the leader, the new session has not
	// committed.
	if e := commitRecord(t, ctx, ts, "ev", "a", func(store.Entry[shard.Commit]) bool { return true }); e.Exists() {
		t.Errorf("commit record %+v; want none", e)
	}
}

// TestStreamCommitAfterRelease: a worker releases the buckets that move
// without final positions, then commits a higher default over every
// bucket, before or after the hand-over: the next holder starts the moved
// buckets at the worker's commit before the release, not at the default
// it handled none of them to; the worker's other buckets are at it.
func TestStreamCommitAfterRelease(t *testing.T) {
	ts := startServer(t, nil)
	ctx := ctxT(t)
	createStream(t, ctx, ts, "ev", 8)
	a, held := holdAll(t, ctx, ts, "ev", "a", 8)
	top := maxToken(held.Grants)
	if _, err := commit(ctx, ts, &v1.CommitRequest{Session: a, MaxToken: top, Position: 100}); err != nil {
		t.Fatal(err)
	}
	b := joinMember(t, ts, "ev", "b")
	asked := pollGrants(t, ctx, ts, a, 0, nil, func(r *v1.GetGrantsResponse) bool {
		keepAlive(t, ctx, ts, a)
		return len(r.Release) > 0
	})
	var rel []*v1.BucketGrant
	for _, g := range asked.Grants {
		if slices.Contains(asked.Release, g.Bucket) {
			rel = append(rel, g)
		}
	}
	rr, err := ts.member.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{Session: a, Buckets: rel}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := commit(ctx, ts, &v1.CommitRequest{Session: a, MaxToken: top, Position: 900}); err != nil {
		t.Fatal(err)
	}
	got := pollGrants(t, ctx, ts, b.sess, rr.Msg.Revision, nil, func(r *v1.GetGrantsResponse) bool { return len(r.Grants) == len(rel) })
	for _, g := range got.Grants {
		if g.From != 100 {
			t.Errorf("b's grant %v; want from 100, a's commit before it released the bucket", g)
		}
	}
	pos, err := ts.admin.GetPositions(ctx, connect.NewRequest(&v1.GetPositionsRequest{Keyspace: "ev"}))
	if err != nil {
		t.Fatal(err)
	}
	moved := map[uint32]bool{}
	for _, g := range rel {
		moved[g.Bucket] = true
	}
	for _, r := range pos.Msg.Runs {
		for bk := r.First; bk < r.First+r.Count; bk++ {
			if want := map[bool]uint64{true: 100, false: 900}[moved[bk]]; r.Position != want {
				t.Errorf("bucket %d (moved: %v) at %d; want %d", bk, moved[bk], r.Position, want)
			}
		}
	}
}

// TestStreamCommitRacesHandoff: commits naming a moving bucket race its
// release (without final positions) and hand-over: the new holder starts
// it exactly at the highest commit of it acknowledged before the release,
// whatever commits landed after it (they pin the released bucket: the
// worker handles nothing of it after the release).
func TestStreamCommitRacesHandoff(t *testing.T) {
	ts := startServer(t, nil)
	ctx := ctxT(t)
	createStream(t, ctx, ts, "ev", 8)
	a, _ := holdAll(t, ctx, ts, "ev", "a", 8)
	b := joinMember(t, ts, "ev", "b")
	keepAliveUntilCleanup(t, ctx, ts, a, b.sess)
	asked := pollGrants(t, ctx, ts, a, 0, nil, func(r *v1.GetGrantsResponse) bool {
		return len(r.Release) > 0
	})
	var rel []*v1.BucketGrant
	for _, g := range asked.Grants {
		if slices.Contains(asked.Release, g.Bucket) {
			rel = append(rel, g)
		}
	}
	top := maxToken(asked.Grants)

	// Committers: each commit names every moving bucket at its token, so
	// an acknowledged one was applied while a still held them.
	var next atomic.Uint64
	var mu sync.Mutex
	type ack struct{ rev, pos uint64 }
	var acks []ack
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				p := next.Add(10)
				req := &v1.CommitRequest{Session: a, MaxToken: top, Position: p}
				for _, g := range rel {
					req.Exceptions = append(req.Exceptions, &v1.BucketPosition{Bucket: g.Bucket, Token: g.Token, Position: p + 5})
				}
				rev, err := commit(ctx, ts, req)
				switch {
				case err == nil:
					mu.Lock()
					acks = append(acks, ack{rev: rev, pos: p + 5})
					mu.Unlock()
				case connect.CodeOf(err) == connect.CodeFailedPrecondition && strings.Contains(err.Error(), "not held"):
					return // handed over
				case connect.CodeOf(err) == connect.CodeFailedPrecondition && strings.Contains(err.Error(), "backwards"):
					// overtaken by a concurrent, higher commit
				default:
					t.Errorf("commit at %d: %v", p, err)
					return
				}
			}
		}()
	}
	// Let some commits land, then release without positions (the
	// committed ones count) while they go on.
	commitRecord(t, ctx, ts, "ev", "a", func(e store.Entry[shard.Commit]) bool { return e.Value.Default >= 50 })
	rr, err := ts.member.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{Session: a, Buckets: rel}))
	if err != nil {
		close(stop)
		wg.Wait()
		t.Fatal(err)
	}
	got := pollGrants(t, ctx, ts, b.sess, rr.Msg.Revision, nil, func(r *v1.GetGrantsResponse) bool { return len(r.Grants) == len(rel) })
	wg.Wait() // every committer has seen the hand-over
	close(stop)
	var before uint64 // the highest position acknowledged before the release
	for _, a := range acks {
		if a.rev < uint64(rr.Msg.Revision) {
			before = max(before, a.pos)
		}
	}
	if before == 0 {
		t.Fatal("no commit was acknowledged before the release")
	}
	for _, g := range got.Grants {
		if g.From != before {
			t.Errorf("b's grant %v; want from %d, acknowledged for it before the release (acknowledged: %v)", g, before, acks)
		}
	}
}

// TestStreamCommitsCoalesce: many concurrent commits of one session share
// store writes, and every acknowledged commit is durable: the record ends
// at or above the highest acknowledged position.
func TestStreamCommitsCoalesce(t *testing.T) {
	ts := startServer(t, nil)
	ctx := ctxT(t)
	createStream(t, ctx, ts, "ev", 16)
	a, held := holdAll(t, ctx, ts, "ev", "a", 16)
	top := maxToken(held.Grants)
	var next, acked, refused atomic.Uint64
	var wg sync.WaitGroup
	const workers, each = 32, 20
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				p := next.Add(1)
				_, err := commit(ctx, ts, &v1.CommitRequest{Session: a, MaxToken: top, Position: p})
				switch {
				case err == nil:
					for {
						was := acked.Load()
						if p <= was || acked.CompareAndSwap(was, p) {
							break
						}
					}
				case connect.CodeOf(err) == connect.CodeFailedPrecondition && strings.Contains(err.Error(), "backwards"):
					refused.Add(1) // overtaken by a higher commit: fine
				default:
					t.Errorf("commit at %d: %v", p, err)
				}
			}
		}()
	}
	wg.Wait()
	calls := keyshardtest.Metric(t, ts.url, `keyshard_commits_total{keyspace="ev"}`)
	writes := keyshardtest.Metric(t, ts.url, `keyshard_commit_writes_total{keyspace="ev"}`)
	if calls != workers*each || writes >= calls {
		t.Errorf("%v calls made %v store writes; want %d calls, fewer writes", calls, writes, workers*each)
	}
	t.Logf("%v calls, %v writes, %d refused as overtaken, highest acknowledged %d", calls, writes, refused.Load(), acked.Load())
	// Durable: a fresh read of etcd has at least the highest acknowledged
	// position (the view follows etcd).
	commitRecord(t, ctx, ts, "ev", "a", func(e store.Entry[shard.Commit]) bool { return e.Value.Default >= acked.Load() })
}

// TestStreamCommitBadInput: bad commits and release positions are refused
// naming the field, and apply nothing.
func TestStreamCommitBadInput(t *testing.T) {
	ts := startServer(t, nil)
	ctx := ctxT(t)
	createStream(t, ctx, ts, "ev", 8)
	if _, err := ts.admin.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "ex", Buckets: 4}})); err != nil {
		t.Fatal(err)
	}
	a, held := holdAll(t, ctx, ts, "ev", "a", 8)
	top := maxToken(held.Grants)
	g0, g1 := held.Grants[0], held.Grants[1]
	rev, err := commit(ctx, ts, &v1.CommitRequest{Session: a, MaxToken: top, Position: 100,
		Exceptions: []*v1.BucketPosition{{Bucket: g0.Bucket, Token: g0.Token, Position: 150}}})
	if err != nil {
		t.Fatal(err)
	}
	want := commitRecord(t, ctx, ts, "ev", "a", func(e store.Entry[shard.Commit]) bool { return e.ModRevision == int64(rev) })

	exc := func(es ...*v1.BucketPosition) []*v1.BucketPosition { return es }
	for _, tc := range []struct {
		name string
		req  *v1.CommitRequest
		code connect.Code
		msg  []string
	}{
		{"bucket outside", &v1.CommitRequest{MaxToken: top, Position: 100, Exceptions: exc(&v1.BucketPosition{Bucket: 8, Token: 1})},
			connect.CodeInvalidArgument, []string{"exceptions[0].bucket: 8 is out of range"}},
		{"duplicate", &v1.CommitRequest{MaxToken: top, Position: 100, Exceptions: exc(&v1.BucketPosition{Bucket: g0.Bucket, Token: g0.Token, Position: 60}, &v1.BucketPosition{Bucket: g0.Bucket, Token: g0.Token, Position: 60})},
			connect.CodeInvalidArgument, []string{"exceptions[0] and exceptions[1] both name bucket"}},
		{"token 0", &v1.CommitRequest{MaxToken: top, Position: 100, Exceptions: exc(&v1.BucketPosition{Bucket: g1.Bucket, Position: 60})},
			connect.CodeInvalidArgument, []string{"exceptions[0].token"}},
		{"not held at that token", &v1.CommitRequest{MaxToken: top, Position: 100, Exceptions: exc(&v1.BucketPosition{Bucket: g0.Bucket, Token: g0.Token, Position: 150}, &v1.BucketPosition{Bucket: g1.Bucket, Token: g1.Token + 100, Position: 60})},
			connect.CodeFailedPrecondition, []string{"exceptions[1]", "bucket"}},
		{"position backwards", &v1.CommitRequest{MaxToken: top, Position: 99, Exceptions: exc(&v1.BucketPosition{Bucket: g0.Bucket, Token: g0.Token, Position: 150})},
			connect.CodeFailedPrecondition, []string{"position", "backwards"}},
		{"exception backwards", &v1.CommitRequest{MaxToken: top, Position: 100, Exceptions: exc(&v1.BucketPosition{Bucket: g0.Bucket, Token: g0.Token, Position: 149})},
			connect.CodeFailedPrecondition, []string{"exceptions[0]", "backwards"}},
		{"exception dropped behind the position", &v1.CommitRequest{MaxToken: top, Position: 100},
			connect.CodeFailedPrecondition, []string{"position", "backwards"}},
		{"max_token backwards", &v1.CommitRequest{MaxToken: top - 1, Position: 100, Exceptions: exc(&v1.BucketPosition{Bucket: g0.Bucket, Token: g0.Token, Position: 150})},
			connect.CodeFailedPrecondition, []string{"max_token", "backwards"}},
		{"max_token above the last token", &v1.CommitRequest{MaxToken: top + 1000, Position: 100, Exceptions: exc(&v1.BucketPosition{Bucket: g0.Bucket, Token: g0.Token, Position: 150})},
			connect.CodeInvalidArgument, []string{"max_token"}},
	} {
		tc.req.Session = a
		_, err := commit(ctx, ts, tc.req)
		if connect.CodeOf(err) != tc.code {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.code)
			continue
		}
		for _, m := range tc.msg {
			if !strings.Contains(err.Error(), m) {
				t.Errorf("%s: %v, want it to mention %q", tc.name, err, m)
			}
		}
	}
	// Exceptions in any order are taken (sorted), and an equal commit
	// succeeds again (a retry).
	unsorted := &v1.CommitRequest{Session: a, MaxToken: top, Position: 100, Exceptions: exc(
		&v1.BucketPosition{Bucket: g1.Bucket, Token: g1.Token, Position: 120}, &v1.BucketPosition{Bucket: g0.Bucket, Token: g0.Token, Position: 150})}
	for range 2 {
		if _, err := commit(ctx, ts, unsorted); err != nil {
			t.Fatalf("commit with exceptions out of order: %v", err)
		}
	}

	// Release positions.
	for _, tc := range []struct {
		name string
		req  *v1.ReleaseRequest
		code connect.Code
		msg  string
	}{
		{"bucket not released", &v1.ReleaseRequest{Buckets: []*v1.BucketGrant{g1}, Positions: []*v1.BucketPosition{{Bucket: g0.Bucket, Token: g0.Token, Position: 200}}},
			connect.CodeInvalidArgument, "positions[0]: bucket"},
		{"other token", &v1.ReleaseRequest{Buckets: []*v1.BucketGrant{g1}, Positions: []*v1.BucketPosition{{Bucket: g1.Bucket, Token: g1.Token + 1, Position: 200}}},
			connect.CodeInvalidArgument, "positions[0]: bucket"},
		{"twice", &v1.ReleaseRequest{Buckets: []*v1.BucketGrant{g1}, Positions: []*v1.BucketPosition{{Bucket: g1.Bucket, Token: g1.Token, Position: 200}, {Bucket: g1.Bucket, Token: g1.Token, Position: 200}}},
			connect.CodeInvalidArgument, "positions[0] and positions[1] both name bucket"},
		{"backwards", &v1.ReleaseRequest{Buckets: []*v1.BucketGrant{g0, g1}, Positions: []*v1.BucketPosition{{Bucket: g0.Bucket, Token: g0.Token, Position: 160}, {Bucket: g1.Bucket, Token: g1.Token, Position: 119}}},
			connect.CodeFailedPrecondition, "positions[1]: bucket"},
	} {
		tc.req.Session = a
		_, err := ts.member.Release(ctx, connect.NewRequest(tc.req))
		if connect.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("release, %s: %v, want %v mentioning %q", tc.name, err, tc.code, tc.msg)
		}
	}
	// Nothing was applied: the record is the last good commit's, and
	// every bucket is still held.
	last := commitRecord(t, ctx, ts, "ev", "a", func(e store.Entry[shard.Commit]) bool { return e.ModRevision > want.ModRevision })
	if wantC := (shard.Commit{Session: want.Value.Session, MaxToken: top, Default: 100, Exceptions: []shard.BucketPosition{
		{Bucket: int(g0.Bucket), Token: g0.Token, Position: 150}, {Bucket: int(g1.Bucket), Token: g1.Token, Position: 120}}}); !commitEqual(last.Value, wantC) {
		t.Errorf("record %+v, want %+v", last.Value, wantC)
	}
	if r, err := ts.member.GetGrants(ctx, connect.NewRequest(&v1.GetGrantsRequest{Session: a})); err != nil || len(r.Msg.Grants) != 8 {
		t.Fatalf("after refused releases: %v %v; want all 8 held", r, err)
	}

	// Exclusive keyspaces have no positions.
	x, xg := holdAll(t, ctx, ts, "ex", "x", 4)
	_, err = commit(ctx, ts, &v1.CommitRequest{Session: x, MaxToken: 1, Position: 1})
	wantCode(t, err, connect.CodeInvalidArgument, "exclusive")
	_, err = ts.member.Release(ctx, connect.NewRequest(&v1.ReleaseRequest{Session: x, Buckets: xg.Grants[:1],
		Positions: []*v1.BucketPosition{{Bucket: xg.Grants[0].Bucket, Token: xg.Grants[0].Token, Position: 5}}}))
	wantCode(t, err, connect.CodeInvalidArgument, "positions: keyspace")
	for _, g := range xg.Grants {
		if g.From != 0 {
			t.Errorf("exclusive grant %v has a from", g)
		}
	}
}

func commitEqual(a, b shard.Commit) bool {
	return a.Session == b.Session && a.MaxToken == b.MaxToken && a.Default == b.Default && slices.Equal(a.Exceptions, b.Exceptions)
}

// holdAll joins member id to keyspace ks, activates its session, and
// waits until it holds n buckets: it returns the session and its grants.
func holdAll(t *testing.T, ctx context.Context, ts *testServer, ks, id string, n int) (string, *v1.GetGrantsResponse) {
	t.Helper()
	sess := rawJoin(t, ctx, ts, ks, id, false)
	keepAlive(t, ctx, ts, sess)
	return sess, pollGrants(t, ctx, ts, sess, 0, nil, func(r *v1.GetGrantsResponse) bool { return len(r.Grants) == n })
}
