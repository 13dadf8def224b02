package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/keyshardtest"
)

// nopHandler acquires and releases at once.
type nopHandler struct{}

func (nopHandler) Acquire(context.Context, client.Grant) error { return nil }
func (nopHandler) Release(context.Context, int) error          { return nil }

// TestTopCLI runs `top` against a real server with two workers: two
// frames with the keyspace, its members and its latest epochs; then
// against nothing, where it says so and what to do; then bad flags.
func TestTopCLI(t *testing.T) {
	ts := keyshardtest.NewServer(t, keyshardtest.Options{Keyspaces: []client.KeyspaceConfig{{Name: "rooms", Buckets: 64}}})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	// One after the other, so that each join is an epoch of its own.
	for i, id := range []string{"w1", "w2"} {
		w, err := client.NewWorker(ts.Client(), "rooms", client.Member{ID: id, Zone: "z-" + id}, nopHandler{})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); w.Run(ctx) }() // returns at Close
		t.Cleanup(func() { w.Close(context.Background()); <-done })
		if _, err := ts.WaitEpoch(ctx, "rooms", uint64(i+2)); err != nil { // epoch 1 is the empty map
			t.Fatal(err)
		}
	}
	out, _, err := runCLI(t, "top", "--server", ts.URL(), "--count", "2", "--interval", "100ms")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("top:\n%s", out)
	if n := strings.Count(out, "keyshard top — "); n != 2 {
		t.Errorf("%d frames, want 2:\n%s", n, out)
	}
	for _, want := range []string{"replica ", "store healthy", "KEYSPACE", "RELEASING  WAITING", "rooms", "  MEMBER", "  w1  ", "  w2  ", "z-w1", ": join w1, ", ": join w2, ", ": create, 0 buckets moved"} {
		if !strings.Contains(out, want) {
			t.Errorf("top lacks %q:\n%s", want, out)
		}
	}

	out, _, err = runCLI(t, "top", "--server", "http://127.0.0.1:9", "--count", "1")
	if err != nil || !strings.Contains(out, "cannot read the control plane") || !strings.Contains(out, "is `keyshard serve` running there?") {
		t.Errorf("top against nothing: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--interval", "1ms"}, "--interval 1ms: want at least 100ms"},
		{[]string{"--count", "-1"}, "--count -1"},
		{[]string{"--members", "-2"}, "--members -2"},
	} {
		_, _, err := runCLI(t, append([]string{"top", "--server", ts.URL()}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("top %v: %v; want an error naming %q", tc.args, err, tc.want)
		}
	}
}
