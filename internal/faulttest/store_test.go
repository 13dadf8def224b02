package faulttest

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/keyshard/keyshard/internal/store"
)

// TestStoreAvoidsStuckEndpoint: one of the store's etcd endpoints stops
// answering while its connection stays open (a paused member, here a
// partitioned proxy in front of it). Requests the client sends there would
// hang until the member resumes; the store stops sending requests there
// within about a second, so that a run of requests, each with a short
// timeout, all succeed while the endpoint is still stuck.
func TestStoreAvoidsStuckEndpoint(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	emb, err := store.StartEmbedded(ctx, store.EmbeddedConfig{Dir: t.TempDir(), Logger: slog.New(slog.DiscardHandler), UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Close)
	ep := strings.TrimPrefix(emb.Endpoints()[0], "http://")
	good, stuck := startProxy(t, ep), startProxy(t, ep)
	st, err := store.Open(ctx, store.Config{Endpoints: []string{good.URL(), stuck.URL()}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// Both connections carry requests first.
	for range 4 {
		if _, err := st.Rev(ctx); err != nil {
			t.Fatal(err)
		}
	}
	stuck.Partition()
	defer stuck.Heal()
	// The store should move off the stuck endpoint within about a second
	// (it checks every 500 ms, 400 ms patiently); gRPC's own keepalive
	// would notice it only after 15 s (10 s + 5 s), so 8 s tells the two
	// apart with room to spare on a busy machine.
	lctx, lcancel := context.WithTimeout(ctx, 8*time.Second)
	defer lcancel()
	const want = 20 // in a row; with both endpoints in use, half would hang
	ok, tries := 0, 0
	for ok < want {
		if lctx.Err() != nil {
			t.Fatalf("no %d requests in a row succeeded within 8s (%d tries) while one endpoint was stuck", want, tries)
		}
		tries++
		rctx, rcancel := context.WithTimeout(lctx, 300*time.Millisecond)
		_, err := st.Rev(rctx)
		rcancel()
		if err != nil {
			ok = 0
			continue
		}
		ok++
	}
	t.Logf("%d requests in a row succeeded after %d tries", want, tries)
}
