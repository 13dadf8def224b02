package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/client/clienttest"
	"github.com/keyshard/keyshard/placement"
)

// newRouter starts a Router of keyspace "rooms" on c; the test's cleanup
// closes it.
func newRouter(t *testing.T, c *Client) *Router {
	t.Helper()
	r, err := NewRouter(c, "rooms")
	if err != nil {
		t.Fatalf("NewRouter: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	if err := r.Start(context.Background()); err != nil {
		t.Fatalf("Router.Start: %v", err)
	}
	return r
}

func TestRouterFollowsMap(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 64, 10*time.Second)
	ctx := context.Background()
	r := newRouter(t, f.dial(t))
	if r.Epoch() != 0 {
		t.Errorf("Epoch() = %d before any map, want 0", r.Epoch())
	}
	if m, ok := r.OwnerString("room-1"); ok || m != "" {
		t.Errorf("Owner before any map = %q, %v; want unassigned", m, ok)
	}
	if b := r.Bucket([]byte("room-1")); b != -1 {
		t.Errorf("Bucket before any map = %d, want -1 (bucket count unknown)", b)
	}
	f.MapWatches().Next(t)

	// Epoch 1: buckets alternate between a and b, bucket 0 unassigned.
	owner1 := func(b int) string {
		switch {
		case b == 0:
			return ""
		case b%2 == 0:
			return "a"
		}
		return "b"
	}
	f.SetMap("rooms", members("a", "b"), owner1)
	if err := r.WaitEpoch(ctx, 1); err != nil {
		t.Fatal(err)
	}
	h, _ := placement.NewHasher(placement.HashXXH64, 64)
	check := func(owner func(int) string) {
		t.Helper()
		for i := range 500 {
			key := fmt.Sprintf("room-%d", i)
			b := h.BucketString(key)
			if got := r.Bucket([]byte(key)); got != b {
				t.Fatalf("Bucket(%q) = %d, want %d", key, got, b)
			}
			want := owner(b)
			got, ok := r.Owner([]byte(key))
			got2, ok2 := r.OwnerString(key)
			if got != want || ok != (want != "") || got2 != got || ok2 != ok {
				t.Fatalf("Owner(%q) (bucket %d) = %q, %v / %q, %v; want %q", key, b, got, ok, got2, ok2, want)
			}
		}
	}
	check(owner1)
	if got := r.Address("a"); got != "a.internal:9000" {
		t.Errorf("Address(a) = %q", got)
	}
	if got := r.Address("nobody"); got != "" {
		t.Errorf("Address(nobody) = %q, want empty", got)
	}

	// Epoch 2: c takes everything.
	f.SetMap("rooms", members("c"), func(int) string { return "c" })
	if err := r.WaitEpoch(ctx, 2); err != nil {
		t.Fatal(err)
	}
	check(func(int) string { return "c" })
	if r.Epoch() != 2 {
		t.Errorf("Epoch() = %d, want 2", r.Epoch())
	}
	if got, ok := r.BucketOwner(64); ok || got != "" {
		t.Errorf("BucketOwner(out of range) = %q, %v", got, ok)
	}
}

func TestRouterBadInput(t *testing.T) {
	f := newFake(t)
	c := f.dial(t)
	for _, tc := range []struct {
		keyspace string
		text     string // in the *ArgError's Reason
	}{
		{"", "is empty"},
		{"rooms/1", `has '/' at byte 5`},
		{strings.Repeat("x", 129), "the limit is 128"},
	} {
		_, err := NewRouter(c, tc.keyspace)
		checkArgError(t, fmt.Sprintf("NewRouter(%.20q)", tc.keyspace), err, "NewRouter", "keyspace name", tc.text)
	}
	_, err := NewRouter(nil, "rooms")
	checkArgError(t, "NewRouter(nil)", err, "NewRouter", "client", "is nil")
	if n := f.CallCount("/keyshard.v1.MapService/GetMap"); n != 0 {
		t.Errorf("GetMap calls = %d; NewRouter must do no IO", n)
	}

	// A keyspace that does not exist is found out by Start and Run.
	r, err := NewRouter(c, "missing")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), `keyspace "missing" does not exist`) {
		t.Errorf("Start(missing keyspace) = %v; want ErrNotFound naming it", err)
	}
	if err := r.WaitReady(context.Background()); !errors.Is(err, ErrNotFound) {
		t.Errorf("WaitReady after a failed Start = %v; want ErrNotFound", err)
	}
	r, err = NewRouter(c, "missing")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(context.Background()); !errors.Is(err, ErrNotFound) {
		t.Errorf("Run(missing keyspace) = %v; want ErrNotFound", err)
	}
	if err := r.WaitReady(context.Background()); !errors.Is(err, ErrNotFound) {
		t.Errorf("WaitReady after Run failed = %v; want Run's error", err)
	}
	if n := f.CallCount("/keyshard.v1.MapService/GetMap"); n != 2 {
		t.Errorf("GetMap calls = %d, want 2: a missing keyspace is not retried", n)
	}
}

// TestRouterRun: Run blocks, WaitReady returns once it has the first map,
// and Run returns ctx's error when ctx ends, nil after Close.
func TestRouterRun(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, 10*time.Second)
	f.SetMap("rooms", members("a"), func(int) string { return "a" })
	c := f.dial(t)
	for _, stop := range []string{"ctx", "Close"} {
		t.Run(stop, func(t *testing.T) {
			r, err := NewRouter(c, "rooms")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }() // exits when ctx ends or Close
			if err := r.WaitReady(context.Background()); err != nil {
				t.Fatalf("WaitReady = %v", err)
			}
			if m, ok := r.OwnerString("k"); !ok || m != "a" || r.Epoch() != 1 {
				t.Errorf("after WaitReady: Owner = %q, %v at epoch %d; want a at epoch 1", m, ok, r.Epoch())
			}
			if err := r.Run(ctx); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "called twice") {
				t.Errorf("second Run = %v, want ErrInvalid", err)
			}
			if err := r.Start(ctx); !errors.Is(err, ErrInvalid) {
				t.Errorf("Start while Run runs = %v, want ErrInvalid", err)
			}
			if stop == "ctx" {
				cancel()
				if err := recv(t, done, "Run to return"); !errors.Is(err, context.Canceled) {
					t.Errorf("Run = %v, want context.Canceled", err)
				}
				r.Close()
			} else {
				r.Close() // cancels Run and waits for it
				if err := recv(t, done, "Run to return"); err != nil {
					t.Errorf("Run after Close = %v, want nil", err)
				}
			}
			if err := r.WaitEpoch(context.Background(), 2); !errors.Is(err, ErrClosed) {
				t.Errorf("WaitEpoch after Run returned = %v, want ErrClosed", err)
			}
		})
	}
}

// TestRouterWaitReadyRetries: while the server cannot serve, Run retries
// the first fetch with backoff; WaitReady says why it has no map when its
// ctx ends, and returns once a fetch succeeded.
func TestRouterWaitReadyRetries(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, 10*time.Second)
	fr := f.AddReplica()
	fr.Refuse()
	r, err := NewRouter(dialReplicas(t, f, []*clienttest.Replica{fr}), "rooms")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }() // exits when Close ends it
	defer func() {
		r.Close()
		if err := recv(t, done, "Run to return"); err != nil {
			t.Errorf("Run = %v", err)
		}
	}()

	f.Clock().MustBlockUntil(t, 1) // the backoff after the first failed fetch
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.WaitReady(ctx); !errors.Is(err, context.Canceled) || !errors.Is(err, ErrUnavailable) {
		t.Errorf("WaitReady(cancelled) = %v; want context.Canceled and the fetch's ErrUnavailable", err)
	}
	fr.Serve()
	ready := make(chan error, 1)
	go func() { ready <- r.WaitReady(context.Background()) }()
	f.Clock().Advance(backoffCap)
	if err := recv(t, ready, "WaitReady"); err != nil {
		t.Errorf("WaitReady = %v", err)
	}
	if n := fr.CallCount(keyshardv1connect.MapServiceGetMapProcedure); n != 2 {
		t.Errorf("GetMap calls = %d, want 2", n)
	}
}

// TestRouterCloseWithoutRun: Close before Start or Run is fine and
// idempotent; they then return ErrClosed, and lookups answer from the
// empty map.
func TestRouterCloseWithoutRun(t *testing.T) {
	f := newFake(t)
	r, err := NewRouter(f.dial(t), "rooms")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	ctx := context.Background()
	if err := r.Run(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after Close = %v, want ErrClosed", err)
	}
	if err := r.Start(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Start after Close = %v, want ErrClosed", err)
	}
	if err := r.WaitReady(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("WaitReady after Close = %v, want ErrClosed", err)
	}
	if err := r.WaitEpoch(ctx, 1); !errors.Is(err, ErrClosed) {
		t.Errorf("WaitEpoch after Close = %v, want ErrClosed", err)
	}
	if m, ok := r.OwnerString("k"); ok || r.Bucket([]byte("k")) != -1 {
		t.Errorf("Owner of a Router that never ran = %q, %v", m, ok)
	}
	if n := f.CallCount("/keyshard.v1.MapService/GetMap"); n != 0 {
		t.Errorf("GetMap calls = %d, want none", n)
	}
}

// TestRouterReconnects: the stream fails; the Router retries it with
// backoff on its clock and picks up the newer map.
func TestRouterReconnects(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, 10*time.Second)
	f.FailNext(keyshardv1connect.MapServiceWatchMapProcedure, 2, connect.NewError(connect.CodeUnavailable, errors.New("stream refused")))
	r := newRouter(t, f.dial(t))
	for range 2 {
		f.MapWatches().Next(t) // refused at once

		f.Clock().MustBlockUntil(t, 1) // the backoff timer
		f.Clock().Advance(backoffCap)
	}
	req := f.MapWatches().Next(t)
	if req.GetSinceEpoch() != 0 {
		t.Errorf("since_epoch = %d, want 0", req.GetSinceEpoch())
	}
	f.SetMap("rooms", members("a"), func(int) string { return "a" })
	if err := r.WaitEpoch(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
}

// TestRouterFallsBackToLongPoll: after repeated stream failures the
// Router long-polls GetMap, and still sees new maps.
func TestRouterFallsBackToLongPoll(t *testing.T) {
	for _, unimpl := range []bool{false, true} {
		t.Run(fmt.Sprintf("unimplemented=%v", unimpl), func(t *testing.T) {
			f := newFake(t)
			f.AddKeyspace("rooms", 16, 10*time.Second)
			refusal := connect.NewError(connect.CodeUnavailable, errors.New("stream refused"))
			if unimpl {
				refusal = connect.NewError(connect.CodeUnimplemented, errors.New("no streams here"))
			}
			f.Fail(keyshardv1connect.MapServiceWatchMapProcedure, refusal)
			r := newRouter(t, f.dial(t))
			f.MapPolls().Next(t)
			attempts := streamFailuresBeforePoll
			if unimpl {
				attempts = 1
			}
			for range attempts {
				f.MapWatches().Next(t)
				f.Clock().MustBlockUntil(t, 1)
				f.Clock().Advance(backoffCap)
			}
			poll := f.MapPolls().Next(t)
			if poll.GetWait().AsDuration() != pollWait {
				t.Errorf("long poll wait = %v, want %v", poll.GetWait().AsDuration(), pollWait)
			}
			f.SetMap("rooms", members("a"), func(int) string { return "a" })
			if err := r.WaitEpoch(context.Background(), 1); err != nil {
				t.Fatal(err)
			}
			if got := f.MapPolls().Next(t); got.GetSinceEpoch() != 1 {
				t.Errorf("next poll since_epoch = %d, want 1", got.GetSinceEpoch())
			}
		})
	}
}

func TestRouterCloseAndWaitEpoch(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, 10*time.Second)
	r := newRouter(t, f.dial(t))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.WaitEpoch(ctx, 5); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitEpoch(cancelled ctx) = %v", err)
	}
	if err := r.WaitEpoch(ctx, 0); err != nil {
		t.Errorf("WaitEpoch(reached epoch) = %v, want nil", err)
	}
	r.Close()
	r.Close()
	if err := r.WaitEpoch(context.Background(), 5); !errors.Is(err, ErrClosed) {
		t.Errorf("WaitEpoch after Close = %v, want ErrClosed", err)
	}
	if _, ok := r.OwnerString("k"); ok {
		t.Errorf("Owner after Close answered from a map that has no owners")
	}
}

func TestRouterIgnoresBadMaps(t *testing.T) {
	mapOf := func(epoch uint64, buckets int, ids []string, owner func(b int) uint32) *keyshardv1.Map {
		m := &keyshardv1.Map{Keyspace: "rooms", Epoch: epoch, Buckets: uint32(buckets), Hash: "xxh64", Members: protoMembers(ids...), Owners: make([]uint32, buckets)}
		for b := range m.Owners {
			m.Owners[b] = owner(b)
		}
		return m
	}
	r := idleRouter(t)
	r.apply(mapOf(1, 16, []string{"a"}, func(int) uint32 { return 1 }))
	tests := []struct {
		name string
		m    *keyshardv1.Map
	}{
		{"bucket count changed", mapOf(2, 32, []string{"x"}, func(int) uint32 { return 1 })},
		{"hash changed", func() *keyshardv1.Map {
			m := mapOf(2, 16, []string{"x"}, func(int) uint32 { return 1 })
			m.Hash = "synapse-sha256"
			return m
		}()},
		{"owner index out of range", mapOf(2, 16, []string{"x"}, func(int) uint32 { return 2 })},
		{"owners do not match buckets", func() *keyshardv1.Map {
			m := mapOf(2, 16, []string{"x"}, func(int) uint32 { return 1 })
			m.Owners = m.Owners[:3]
			return m
		}()},
		{"unknown hash", func() *keyshardv1.Map {
			m := mapOf(2, 16, []string{"x"}, func(int) uint32 { return 1 })
			m.Hash = "md5"
			return m
		}()},
		{"duplicate member", mapOf(2, 16, []string{"x", "x"}, func(int) uint32 { return 1 })},
		{"stale epoch", mapOf(1, 16, []string{"x"}, func(int) uint32 { return 1 })},
	}
	for _, tc := range tests {
		r.apply(tc.m)
		if m, _ := r.OwnerString("k"); r.Epoch() != 1 || m != "a" {
			t.Errorf("%s: the map was applied (epoch %d, owner %q)", tc.name, r.Epoch(), m)
		}
	}
	r.apply(mapOf(2, 16, []string{"x"}, func(int) uint32 { return 1 }))
	if m, _ := r.OwnerString("k"); r.Epoch() != 2 || m != "x" {
		t.Errorf("a good map was not applied (epoch %d, owner %q)", r.Epoch(), m)
	}
}

func protoMembers(ids ...string) []*keyshardv1.Member {
	out := make([]*keyshardv1.Member, len(ids))
	for i, m := range members(ids...) {
		out[i] = &keyshardv1.Member{Id: m.ID, Address: m.Address}
	}
	return out
}

func routerForBench(tb testing.TB) *Router {
	a := placement.NewAssignment(4096)
	a.Members = []string{"w1", "w2", "w3", "w4", "w5", "w6", "w7", "w8"}
	for b := range a.Owners {
		a.Owners[b] = int32(b % len(a.Members))
	}
	m := &keyshardv1.Map{Keyspace: "rooms", Epoch: 1, Buckets: 4096, Hash: "xxh64", Members: protoMembers(a.Members...), Owners: make([]uint32, 4096)}
	for b, o := range a.Owners {
		m.Owners[b] = uint32(o + 1)
	}
	r := idleRouter(tb)
	r.apply(m)
	if r.Epoch() != 1 {
		tb.Fatal("the map was not applied")
	}
	return r
}

// idleRouter returns a Router of keyspace "rooms" that is not running, on
// a Client of a server that is never called.
func idleRouter(tb testing.TB) *Router {
	c, err := Dial("http://127.0.0.1:1")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	r, err := NewRouter(c, "rooms")
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

func TestRouterOwnerDoesNotAllocate(t *testing.T) {
	r := routerForBench(t)
	key := []byte("!room-4242:matrix.example.org")
	skey := string(key)
	if n := testing.AllocsPerRun(1000, func() { r.Owner(key) }); n != 0 {
		t.Errorf("Owner allocates %v times per call, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() { r.OwnerString(skey) }); n != 0 {
		t.Errorf("OwnerString allocates %v times per call, want 0", n)
	}
}

func BenchmarkRouterOwner(b *testing.B) {
	r := routerForBench(b)
	keys := make([][]byte, 1024)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("!room-%d:matrix.example.org", i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		r.Owner(keys[i&1023])
		i++
	}
}

func BenchmarkRouterOwnerParallel(b *testing.B) {
	r := routerForBench(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		key := []byte("!room-4242:matrix.example.org")
		for pb.Next() {
			r.Owner(key)
		}
	})
}
