package clienttest_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/client/clienttest"
	"github.com/keyshard/keyshard/hotkey"
)

// grants is a Handler that sends what it is called with.
type grants struct {
	acquired chan client.Grant
	released chan int
}

func newGrants() grants { return grants{make(chan client.Grant, 64), make(chan int, 64)} }

func (g grants) Acquire(_ context.Context, gr client.Grant) error { g.acquired <- gr; return nil }
func (g grants) Release(_ context.Context, b int) error           { g.released <- b; return nil }

func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for a %T", *new(T))
		panic("unreachable")
	}
}

func dial(t *testing.T, f *clienttest.Server) *client.Client {
	t.Helper()
	c, err := client.Dial(f.URL(), client.Clock(f.Clock()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// startWorker runs a worker of keyspace "rooms" as member id until the
// test ends, and returns its session once it joined.
func startWorker(t *testing.T, f *clienttest.Server, id string, h client.Handler, opts ...client.WorkerOption) (*client.Worker, string) {
	t.Helper()
	joined := make(chan string, 1)
	opts = append(opts, client.OnEvent(func(ev client.Event) {
		if ev.Kind == client.EventJoined {
			joined <- ev.Session
		}
	}))
	w, err := client.NewWorker(dial(t, f), "rooms", client.Member{ID: id, Address: id + ":9000"}, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	go w.Run(context.Background()) // returns once the cleanup closes it
	t.Cleanup(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		w.Close(ctx)
	})
	return w, recv(t, joined)
}

// TestAssignHandsOver: Assign grants what nobody holds at once, and a
// bucket another session holds once that session released it.
func TestAssignHandsOver(t *testing.T) {
	f := clienttest.NewServer(t, clienttest.Options{})
	f.AddKeyspace("rooms", 4, 9*time.Second)
	h1, h2 := newGrants(), newGrants()
	_, s1 := startWorker(t, f, "w1", h1)
	_, s2 := startWorker(t, f, "w2", h2)
	if got := f.Session("rooms", "w2"); got != s2 {
		t.Errorf("Session(rooms, w2) = %q, want %q", got, s2)
	}

	if epoch := f.AssignAll("rooms", "w1"); epoch != 1 {
		t.Errorf("AssignAll: epoch %d, want 1", epoch)
	}
	first := map[int]uint64{}
	for range 4 {
		g := recv(t, h1.acquired)
		first[g.Bucket] = g.Token
	}
	f.Assign("rooms", func(b int) string { return []string{"w1", "w2"}[b%2] })
	for range 2 {
		if b := recv(t, h1.released); b%2 != 1 {
			t.Errorf("w1 released bucket %d, want the odd ones", b)
		}
	}
	for range 2 {
		g := recv(t, h2.acquired)
		if g.Bucket%2 != 1 || g.Token <= first[g.Bucket] {
			t.Errorf("w2 acquired %+v; want an odd bucket above w1's token %d", g, first[g.Bucket])
		}
	}
	f.WaitFor(t, "the grants to settle", func() bool { return len(f.Grants(s1)) == 2 && len(f.Grants(s2)) == 2 })
	for b := range 4 {
		if _, ok := f.Grants([]string{s1, s2}[b%2])[b]; !ok {
			t.Errorf("bucket %d is not held by its owner", b)
		}
	}
}

// TestJoinReplace: a member's second Join fails while its first session
// lives, unless it asks to replace it, which ends the first session.
func TestJoinReplace(t *testing.T) {
	f := clienttest.NewServer(t, clienttest.Options{})
	f.AddKeyspace("rooms", 4, 9*time.Second)
	_, s1 := startWorker(t, f, "w1", newGrants())
	w, err := client.NewWorker(dial(t, f), "rooms", client.Member{ID: "w1"}, newGrants())
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(context.Background()); !errors.Is(err, client.ErrExists) {
		t.Errorf("Run of a second w1 = %v, want ErrExists", err)
	}
	_, s2 := startWorker(t, f, "w1", newGrants(), client.Replace(true))
	if f.Live(s1) || !f.Live(s2) || f.Session("rooms", "w1") != s2 {
		t.Errorf("after the replacing Join: %s live %v, %s live %v", s1, f.Live(s1), s2, f.Live(s2))
	}
}

// TestSetUnavailable: while the control plane is cut off, calls fail with
// ErrUnavailable and a Router keeps its map; once it is back, the Router
// follows again.
func TestSetUnavailable(t *testing.T) {
	f := clienttest.NewServer(t, clienttest.Options{})
	f.AddKeyspace("rooms", 4, 9*time.Second)
	f.SetMap("rooms", []clienttest.Member{{ID: "a"}}, func(int) string { return "a" })
	c := dial(t, f)
	r, err := client.NewRouter(c, "rooms")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.MapWatches().Next(t)

	f.SetUnavailable(true)
	if _, err := c.Admin().Status(context.Background()); !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), "unreachable") {
		t.Errorf("Status while unavailable = %v", err)
	}
	f.Clock().MustBlockUntil(t, 1) // the stream ended: the Router's backoff
	if owner, ok := r.OwnerString("k"); !ok || owner != "a" {
		t.Errorf("Owner while unavailable = %q, %v; want the last map's", owner, ok)
	}
	f.SetMap("rooms", []clienttest.Member{{ID: "b"}}, func(int) string { return "b" })
	f.SetUnavailable(false)
	f.Clock().Advance(10 * time.Second) // past any backoff
	if err := r.WaitEpoch(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	if n := f.CallCount(keyshardv1connect.MapServiceWatchMapProcedure); n < 2 {
		t.Errorf("%d WatchMap calls; want the stream reopened", n)
	}
}

// TestHoldHotKeys: the hot-key service's calls, a watch included, wait at
// the gate until the test lets them through, while the other services
// serve; a watch that went through is not held again.
func TestHoldHotKeys(t *testing.T) {
	f := clienttest.NewServer(t, clienttest.Options{})
	f.AddHotKeyPool("events", 640)
	f.SetOverflow("events", "a")
	c := dial(t, f)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := f.HoldHotKeys()

	read, watched := make(chan uint64, 1), make(chan uint64, 2)
	go func() { // returns once the gate lets the read through
		s, err := c.OverflowSet(ctx, "events")
		if err != nil {
			t.Errorf("OverflowSet = %v", err)
		}
		read <- s.Version
	}()
	watchDone := make(chan struct{})
	go func() { // returns once the test cancels ctx
		defer close(watchDone)
		c.WatchOverflowSet(ctx, "events", 0, func(s hotkey.OverflowSet) { watched <- s.Version })
	}()
	defer func() { cancel(); <-watchDone }()
	f.SetPolls().Next(t)
	f.SetWatches().Next(t)
	if pools, err := c.Admin().ListHotKeyPools(ctx); err != nil || len(pools) != 1 {
		t.Errorf("ListHotKeyPools while the hot-key calls are held = %v, %v", pools, err)
	}
	select {
	case v := <-read:
		t.Fatalf("the read answered version %d through a shut gate", v)
	case v := <-watched:
		t.Fatalf("the watch sent version %d through a shut gate", v)
	default:
	}
	g.Pass()
	g.Pass()
	if v := recv(t, read); v != 1 {
		t.Errorf("read version %d, want 1", v)
	}
	if v := recv(t, watched); v != 1 {
		t.Errorf("watched version %d, want 1", v)
	}
	f.SetOverflow("events", "b")
	if v := recv(t, watched); v != 2 {
		t.Errorf("watched version %d, want 2 through the shut gate", v)
	}

	// A report waits too; Open lets it and every later call through.
	hk := keyshardv1connect.NewHotKeyServiceClient(http.DefaultClient, f.URL())
	reported := make(chan *keyshardv1.ReportHotKeysResponse, 1)
	go func() { // returns once the gate opens
		resp, err := hk.ReportHotKeys(ctx, connect.NewRequest(&keyshardv1.ReportHotKeysRequest{Pool: "events", Producer: "p1"}))
		if err != nil {
			t.Errorf("ReportHotKeys = %v", err)
			resp = connect.NewResponse(&keyshardv1.ReportHotKeysResponse{})
		}
		reported <- resp.Msg
	}()
	if r := f.Reports().Next(t); r.GetProducer() != "p1" {
		t.Errorf("report %v", r)
	}
	select {
	case r := <-reported:
		t.Fatalf("the report was answered (%v) through a shut gate", r)
	default:
	}
	g.Open()
	if r := recv(t, reported); r.GetPool().GetReportThreshold() != 10 || r.GetVersion() != 2 {
		t.Errorf("report answered %v, want report threshold 10 and version 2", r)
	}
	if s, err := c.OverflowSet(ctx, "events"); err != nil || s.Version != 2 {
		t.Errorf("OverflowSet after Open = version %d, %v", s.Version, err)
	}
}

// TestStartPanics: without a test, a scripting mistake panics, naming
// what is wrong.
func TestStartPanics(t *testing.T) {
	f := clienttest.Start(clienttest.Options{})
	defer f.Close()
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), `Grant: no session "s9"`) {
			t.Errorf("recovered %v", r)
		}
	}()
	f.Grant("s9", 1)
}

// TestLeaveAsksUntilReleased: after Leave, every bucket the member holds
// stays asked back until it is released, even when the member releases
// them one call at a time and the last Assign still names it their owner
// (a release makes the fake move buckets toward their owners, and a
// leaving member is owner of nothing); the session ends with the last
// release.
func TestLeaveAsksUntilReleased(t *testing.T) {
	f := clienttest.NewServer(t, clienttest.Options{})
	f.AddKeyspace("rooms", 3, 9*time.Second)
	ctx := t.Context()
	m := keyshardv1connect.NewMemberServiceClient(http.DefaultClient, f.URL())
	joined, err := m.Join(ctx, connect.NewRequest(&keyshardv1.JoinRequest{Keyspace: "rooms", Member: &keyshardv1.Member{Id: "w1"}}))
	if err != nil {
		t.Fatal(err)
	}
	sid := joined.Msg.GetSession()
	if _, err := m.KeepAlive(ctx, connect.NewRequest(&keyshardv1.KeepAliveRequest{Session: sid})); err != nil {
		t.Fatal(err)
	}
	f.AssignAll("rooms", "w1")
	held := f.Grants(sid)
	if len(held) != 3 {
		t.Fatalf("after AssignAll, w1 holds %v, want 3 buckets", held)
	}
	if _, err := m.Leave(ctx, connect.NewRequest(&keyshardv1.LeaveRequest{Session: sid})); err != nil {
		t.Fatal(err)
	}
	asked := func() []uint32 {
		t.Helper()
		resp, err := m.GetGrants(ctx, connect.NewRequest(&keyshardv1.GetGrantsRequest{Session: sid}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.GetRelease()
	}
	for b := range 3 {
		var want []uint32
		for o := b; o < 3; o++ {
			want = append(want, uint32(o))
		}
		if got := asked(); !slices.Equal(got, want) {
			t.Errorf("before releasing bucket %d: asked back %v, want %v", b, got, want)
		}
		rel := &keyshardv1.ReleaseRequest{Session: sid, Buckets: []*keyshardv1.BucketGrant{{Bucket: uint32(b), Token: held[b]}}}
		if _, err := m.Release(ctx, connect.NewRequest(rel)); err != nil {
			t.Fatalf("Release of bucket %d: %v", b, err)
		}
	}
	if f.Live(sid) {
		t.Error("the session lives on after its last bucket was released")
	}
}
