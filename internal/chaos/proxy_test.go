package chaos

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// echoServer echoes every connection until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { // exits when the listener closes
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }() // exits when the peer closes
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

func dialProxy(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes b and reads it back, within limit.
func roundTrip(c net.Conn, b string, limit time.Duration) (string, error) {
	c.SetDeadline(time.Now().Add(limit))
	if _, err := c.Write([]byte(b)); err != nil {
		return "", err
	}
	buf := make([]byte, len(b))
	_, err := io.ReadFull(c, buf)
	return string(buf), err
}

// TestProxyFaults shows each fault of the proxy: a partition holds bytes
// until it heals and then delivers them, a delay holds each chunk at
// least that long, a reset breaks open connections with ECONNRESET, and
// the counters prove each.
func TestProxyFaults(t *testing.T) {
	p, err := NewProxy("127.0.0.1:0", "127.0.0.1:1", echoServer(t)) // the first backend refuses: the proxy moves on
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := dialProxy(t, p)
	if got, err := roundTrip(c, "hello", 5*time.Second); err != nil || got != "hello" {
		t.Fatalf("through the proxy: %q, %v", got, err)
	}

	p.Partition()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := c.Read(make([]byte, 4)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read during a partition: %d bytes, %v; want nothing", n, err)
	}
	if s := p.Stats(); s.Held == 0 {
		t.Errorf("stats during a partition: %+v; want held chunks", s)
	}
	p.Heal()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "held" {
		t.Fatalf("after healing: %q, %v; want the held bytes", buf, err)
	}

	const delay = 150 * time.Millisecond
	p.SetDelay(delay)
	start := time.Now()
	if got, err := roundTrip(c, "slow", 5*time.Second); err != nil || got != "slow" {
		t.Fatalf("with a delay: %q, %v", got, err)
	}
	if took := time.Since(start); took < 2*delay {
		t.Errorf("round trip took %v with %v each way", took, delay)
	}
	if s := p.Stats(); s.Delayed < 2 {
		t.Errorf("stats with a delay: %+v; want 2 delayed chunks", s)
	}
	p.SetDelay(0)

	if n := p.Reset(); n < 2 { // the client's connection and the one to the backend
		t.Errorf("reset %d connections, want 2", n)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read after a reset: %v; want ECONNRESET", err)
	}
	if got, err := roundTrip(dialProxy(t, p), "again", 5*time.Second); err != nil || got != "again" {
		t.Fatalf("a new connection after the reset: %q, %v", got, err)
	}
}
