package client

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/client/clienttest"
)

// dialReplicas dials replicas as the replicas of one cluster.
func dialReplicas(t *testing.T, f fake, replicas []*clienttest.Replica, opts ...Option) *Client {
	t.Helper()
	var urls []string
	for _, r := range replicas {
		urls = append(urls, r.URL())
	}
	c, err := Dial(strings.Join(urls, ","), append([]Option{Clock(f.Clock())}, opts...)...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestClientMovesOnFromHungReplica: a call that a paused replica holds is
// abandoned after ReplicaTimeout and made at the next replica, which then
// gets the next calls first.
func TestClientMovesOnFromHungReplica(t *testing.T) {
	f := newFake(t)
	a, b := f.AddReplica(), f.AddReplica()
	c := dialReplicas(t, f, []*clienttest.Replica{a, b}, ReplicaTimeout(2*time.Second))
	if got := c.URLs(); len(got) != 2 || got[0] != a.URL() || got[1] != b.URL() {
		t.Fatalf("URLs() = %v", got)
	}
	a.Pause()
	type result struct {
		st  Status
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := c.Admin().Status(context.Background())
		done <- result{st, err}
	}()
	a.Blocked().Next(t)
	f.Clock().Advance(2*time.Second - time.Nanosecond)
	if len(done) != 0 {
		t.Fatalf("the call returned before ReplicaTimeout")
	}
	f.Clock().Advance(time.Nanosecond)
	if r := recv(t, done, "Status"); r.err != nil || r.st.Leader != "clienttest" {
		t.Fatalf("Status = %+v, %v; want the answer of the healthy replica", r.st, r.err)
	}
	if c.URL() != b.URL() {
		t.Errorf("URL() = %q, want the replica that answered, %q", c.URL(), b.URL())
	}
	// The next call goes to the healthy replica first.
	if _, err := c.Admin().Status(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := a.CallCount(keyshardv1connect.AdminServiceStatusProcedure); n != 1 {
		t.Errorf("the paused replica got %d calls, want 1", n)
	}
}

// TestClientMovesOnFromUnavailableReplica: a replica that answers
// Unavailable (it cannot reach etcd) costs no time; when every replica
// fails, the error says so and is still ErrUnavailable.
func TestClientMovesOnFromUnavailableReplica(t *testing.T) {
	f := newFake(t)
	a, b := f.AddReplica(), f.AddReplica()
	c := dialReplicas(t, f, []*clienttest.Replica{a, b})
	a.Refuse()
	if _, err := c.Admin().Status(context.Background()); err != nil {
		t.Fatalf("Status with one replica unavailable = %v", err)
	}
	a.Blocked().Next(t)
	b.Refuse()
	_, err := c.Admin().Status(context.Background())
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "all 2 replicas failed") || !strings.Contains(err.Error(), "cannot reach etcd") {
		t.Errorf("Status with every replica unavailable = %v", err)
	}
}

// TestDialReplicaList: bad replica lists are refused.
func TestDialReplicaList(t *testing.T) {
	for _, tc := range []struct{ urls, want string }{
		{"http://a:7400,", "empty entry"},
		{"http://a:7400,,http://b:7400", "empty entry"},
		{"http://a:7400,http://a:7400/", "given twice"},
		{"http://a:7400,b:7400", "must start with http://"},
	} {
		c, err := Dial(tc.urls)
		if err == nil {
			c.Close()
			t.Errorf("Dial(%q) succeeded", tc.urls)
			continue
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Dial(%q) = %v; want ErrInvalid mentioning %q", tc.urls, err, tc.want)
		}
	}
	c, err := Dial(" http://a:7400 , http://b:7400/ ")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.URLs(); len(got) != 2 || got[0] != "http://a:7400" || got[1] != "http://b:7400" {
		t.Errorf("URLs() = %q", got)
	}
}

// TestWorkerSurvivesPausedReplica: a worker whose replica is paused
// renews its lease through the other replica before its fence deadline,
// and its grant and map streams reopen there.
func TestWorkerSurvivesPausedReplica(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	f.SetMap("rooms", members("w1"), func(int) string { return "w1" })
	a, b := f.AddReplica(), f.AddReplica()
	c := dialReplicas(t, f, []*clienttest.Replica{a, b})
	h := newRecHandler(t)
	logs := make(chan string, 1024)
	w := newTestWorkerOn(t, c, h, Logger(slog.New(msgHandler(logs))))
	t0 := f.Clock().Now()
	w.start(t)
	sid := w.waitEvent(t, EventJoined).Session
	recv(t, w.renewed, "the first keep-alive")
	f.KeepAlives().Next(t).GetSession()
	tok := f.Grant(sid, 3)
	recv(t, h.acquires, "Acquire")
	// The grant stream is open at the first replica (it delivered the
	// grant); wait for the map stream to be open there too, as the
	// worker's router opens it after its first read, concurrently with
	// the Join: a stream that reaches the replica only once it is paused
	// is never recorded by the fake.
	f.MapWatches().Next(t)
	if n := a.CallCount(keyshardv1connect.MapServiceWatchMapProcedure); n != 1 {
		t.Fatalf("WatchMap calls at the first replica = %d, want 1", n)
	}

	a.Pause() // the replica everything went to is paused
	f.Clock().MustBlockUntil(t, 2)
	f.Clock().Advance(testTTL / 3) // the keep-alive at t0+3s goes to the paused replica ...
	if p := a.Blocked().Next(t); p != keyshardv1connect.MemberServiceKeepAliveProcedure {
		t.Fatalf("the paused replica got %s, want a keep-alive", p)
	}
	// ... and is abandoned after half the time left to the deadline
	// (t0+8.1s), to be made at the other replica in time.
	margin := testTTL / 10
	f.Clock().Advance((testTTL - margin - testTTL/3) / 2)
	d := recv(t, w.renewed, "the renewal through the other replica")
	if want := t0.Add(testTTL/3 + testTTL - margin); !d.Equal(want) {
		t.Errorf("deadline after the renewal = t0+%v, want t0+%v", d.Sub(t0), want.Sub(t0))
	}
	if c.URL() != b.URL() {
		t.Errorf("URL() = %q, want %q", c.URL(), b.URL())
	}
	// The grant and map streams of the paused replica end; they reopen
	// on the other one after their backoff.
	for n := 0; n < 2; {
		if strings.HasPrefix(recv(t, logs, "the streams to end"), "keyshard: watch failed; reconnecting") {
			n++
		}
	}
	f.Clock().MustBlockUntil(t, 4) // fence, next keep-alive, and both streams' backoff
	f.Clock().Advance(backoffBase)
	tok2 := f.Grant(sid, 4)
	if got := recv(t, h.acquires, "Acquire through the other replica"); got.g != (Grant{Bucket: 4, Token: tok2}) {
		t.Errorf("Acquire(%+v), want bucket 4 at %d", got.g, tok2)
	}
	f.MapWatches().Next(t) // the map stream, reopened
	if b.CallCount(keyshardv1connect.MemberServiceWatchGrantsProcedure) == 0 || b.CallCount(keyshardv1connect.MapServiceWatchMapProcedure) == 0 {
		t.Errorf("the streams did not reopen on the healthy replica")
	}
	if g, err := w.OwnsString(keyInBucket(t, 3, 16)); err != nil || g.Token != tok || !g.Valid() {
		t.Errorf("Owns(bucket 3) = %+v, %v", g, err)
	}
	w.noLoss(t)
}

// TestRouterMovesOnFromUnavailableReplica: a Router's first read and its
// map stream go to the replica that can serve.
func TestRouterMovesOnFromUnavailableReplica(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, testTTL)
	a, b := f.AddReplica(), f.AddReplica()
	c := dialReplicas(t, f, []*clienttest.Replica{a, b})
	a.Refuse()
	r := newRouter(t, c)
	f.MapWatches().Next(t)
	f.SetMap("rooms", members("w1"), func(int) string { return "w1" })
	if err := r.WaitEpoch(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if n := b.CallCount(keyshardv1connect.MapServiceWatchMapProcedure); n != 1 {
		t.Errorf("WatchMap calls at the healthy replica = %d, want 1", n)
	}
	if n := a.CallCount(keyshardv1connect.MapServiceWatchMapProcedure); n != 0 {
		t.Errorf("WatchMap calls at the unavailable replica = %d, want 0", n)
	}
}
