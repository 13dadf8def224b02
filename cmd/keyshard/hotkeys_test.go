package main

import (
	"bytes"
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/keyshardtest"
)

// syncBuffer is an output that a test can wait on while a command writes.
type syncBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.changed)
	b.changed = make(chan struct{})
	return b.buf.Write(p)
}

// waitFor waits until the output contains s.
func (b *syncBuffer) waitFor(ctx context.Context, s string) (string, bool) {
	return b.waitUntil(ctx, func(out string) bool { return strings.Contains(out, s) })
}

// waitUntil waits until done holds on the output.
func (b *syncBuffer) waitUntil(ctx context.Context, done func(out string) bool) (string, bool) {
	for {
		b.mu.Lock()
		out, changed := b.buf.String(), b.changed
		b.mu.Unlock()
		if done(out) {
			return out, true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return out, false
		}
	}
}

func TestHotKeysCLI(t *testing.T) {
	url := keyshardtest.NewServer(t, keyshardtest.Options{}).URL()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run := func(args ...string) (string, error) {
		t.Helper()
		out, _, err := runCLI(t, append(args, "--server", url)...)
		return out, err
	}

	out, err := run("hotkeys", "pool", "put", "ingest", "--threshold", "1600", "--cooldown", "10s")
	if err != nil {
		t.Fatal(err)
	}
	if want := "hot-key pool ingest: threshold 1600/s, low threshold 800/s, cooldown 10s, report threshold 25/s, report max age 30s, max keys 1024\n"; out != want {
		t.Errorf("pool put:\n%s\nwant\n%s", out, want)
	}
	if _, err := run("hotkeys", "pool", "put", "api", "--threshold", "200", "--low-threshold", "150", "--report-max-age", "5s", "--max-keys", "64"); err != nil {
		t.Fatal(err)
	}
	out, err = run("hotkeys", "pool", "list")
	if err != nil {
		t.Fatal(err)
	}
	want := `NAME    THRESHOLD  LOW THRESHOLD  COOLDOWN  REPORT THRESHOLD  REPORT MAX AGE  MAX KEYS
api     200        150            30s       3.125             5s              64
ingest  1600       800            10s       25                30s             1024
`
	if out != want {
		t.Errorf("pool list:\n%s\nwant\n%s", out, want)
	}
	// With several replicas' URLs, a verb moves past one that refuses.
	down := "http://127.0.0.1:1"
	if out, _, err := runCLI(t, "hotkeys", "pool", "list", "--server", down+","+url); err != nil || out != want {
		t.Errorf("pool list past a down replica:\n%s(%v)\nwant\n%s", out, err, want)
	}
	if out, err = run("hotkeys", "set", "ingest"); err != nil || out != "pool ingest: no overflow set yet (version 0)\n" {
		t.Errorf("set before any report: %q %v", out, err)
	}

	// Bad input: the server's message, or cobra's.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"hotkeys", "pool", "put", "x"}, `required flag(s) "threshold" not set`},
		{[]string{"hotkeys", "pool", "put", "x", "--threshold", "0"}, "pool.threshold: 0; want a number > 0"},
		{[]string{"hotkeys", "pool", "put", "x", "--threshold", "10", "--low-threshold", "20"}, "pool.low_threshold: 20 is above the threshold 10"},
		{[]string{"hotkeys", "pool", "put", "x", "--threshold", "10", "--max-keys", "-1"}, "--max-keys -1"},
		{[]string{"hotkeys", "set", "nope"}, "`keyshard hotkeys pool put nope --threshold N`"},
	} {
		if _, err := run(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error mentioning %q", tc.args, err, tc.want)
		}
	}
	if _, _, err := runCLI(t, "hotkeys", "set", "ingest", "--server", "http://127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "is `keyshard serve` running at http://127.0.0.1:1?") {
		t.Errorf("unreachable server: %v", err)
	}

	// --watch prints the current set, then every new version, from the
	// replica that answered.
	var watchOut syncBuffer
	watchOut.changed = make(chan struct{})
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watchDone := make(chan error, 1)
	go func() { // exits when stopWatch is called
		root := newRoot()
		root.SetOut(&watchOut)
		root.SetErr(&watchOut)
		root.SetArgs([]string{"hotkeys", "set", "ingest", "--watch", "--server", down + "," + url})
		watchDone <- root.ExecuteContext(wctx)
	}()
	if out, ok := watchOut.waitFor(ctx, "version 0"); !ok {
		t.Fatalf("watch printed no current set: %q", out)
	}
	hot := keyshardv1connect.NewHotKeyServiceClient(http.DefaultClient, url)
	for i := range 16 {
		req := &v1.ReportHotKeysRequest{Pool: "ingest", Producer: "p" + string(rune('a'+i)), Keys: []*v1.KeyRate{{Key: "user:42", Rate: 100}, {Key: "user 7", Rate: 100}, {Key: "user:8", Rate: 95}}}
		if _, err := hot.ReportHotKeys(ctx, connect.NewRequest(req)); err != nil {
			t.Fatal(err)
		}
	}
	// The table comes in several writes: wait for the whole of it, the
	// title line, the header and two rows.
	out, ok := watchOut.waitUntil(ctx, func(out string) bool {
		_, v1, ok := strings.Cut(out, "version 1")
		return ok && strings.Count(v1, "\n") >= 4
	})
	if !ok {
		t.Fatalf("watch did not print version 1: %q", out)
	}
	if !hasRow(out, "user:42", "1600") || !hasRow(out, `"user`, `7"`, "1600") || strings.Contains(out, "user:8") {
		t.Fatalf("watch output:\n%s", out)
	}
	stopWatch()
	if err := <-watchDone; err != nil {
		t.Fatalf("watch ended with %v", err)
	}
	out, err = run("hotkeys", "set", "ingest")
	if err != nil || !strings.HasPrefix(out, "pool ingest, version 1, 2 keys\n") || !hasRow(out, "KEY", "RATE", "SINCE", "COOLING", "SINCE") || !hasRow(out, "user:42", "1600") {
		t.Fatalf("set:\n%s(%v)", out, err)
	}
}

// hasRow reports whether a line of out starts with the given fields.
func hasRow(out string, fields ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= len(fields) && slices.Equal(f[:len(fields)], fields) {
			return true
		}
	}
	return false
}
