package bench

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// startEcho runs RunEcho in the test's process and returns its URL.
func startEcho(t *testing.T, ttl time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- RunEcho(ctx, "127.0.0.1:0", ttl, pw) }() // exits when ctx ends
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("RunEcho: %v", err)
		}
	})
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("the echo server's first line: %v", err)
	}
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if !ok {
		t.Fatalf("the echo server printed %q; want its address", line)
	}
	go io.Copy(io.Discard, pr) // nothing more is printed; exits when the pipe closes
	return "http://" + addr
}

// A simulated member against the echo server: it joins, keeps alive on
// its Session stream (each answer carrying the keep-alive's number), and
// stops when told to even though the server never ends its stream.
func TestEchoServesTheFleet(t *testing.T) {
	e := &scaleEnv{url: startEcho(t, 30*time.Second)}
	e.dialMembers()
	defer e.tr.CloseIdleConnections()
	f := &fleet{e: e}
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	m, err := f.join(ctx, "ks", "m1")
	if err != nil {
		t.Fatal(err)
	}
	if m.ttl != 30*time.Second || !strings.HasPrefix(m.session, "echo-") {
		t.Errorf("joined with session %q, TTL %v; want an echo session of 30s", m.session, m.ttl)
	}
	var c *sessionConn
	for c == nil { // the member's follow goroutine opens the stream
		if ctx.Err() != nil {
			t.Fatal("the member opened no Session stream")
		}
		time.Sleep(time.Millisecond) // polls a condition; nothing depends on how long
		c = m.conn()
	}
	for range 3 {
		if err := c.keepAlive(ctx); err != nil {
			t.Fatalf("keep-alive %d on the stream: %v", c.n, err)
		}
	}
	stop()
	ended := make(chan struct{})
	go func() { f.wg.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(time.Minute):
		t.Fatal("the member did not stop: its Session stream's Receive still waits")
	}
	if h := f.health(); h.KeepAliveErrors != 0 || h.SessionsLost != 0 {
		t.Errorf("health %+v; want no errors", h)
	}
}

func TestEchoRejectsBadTTL(t *testing.T) {
	if err := RunEcho(t.Context(), "127.0.0.1:0", 0, io.Discard); err == nil || !strings.Contains(err.Error(), "lease TTL") {
		t.Errorf("RunEcho with TTL 0: %v; want an error naming the lease TTL", err)
	}
}
