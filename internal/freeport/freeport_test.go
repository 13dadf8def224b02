package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestAddrsAreDistinctAndBindable(t *testing.T) {
	addrs, err := Addrs(8)
	if err != nil {
		t.Fatal(err)
	}
	low, high, ok := span()
	seen := map[string]bool{}
	for _, a := range addrs {
		if seen[a] {
			t.Fatalf("%s picked twice in %v", a, addrs)
		}
		seen[a] = true
		host, p, err := net.SplitHostPort(a)
		if err != nil || host != "127.0.0.1" {
			t.Fatalf("address %q: want 127.0.0.1:port (%v)", a, err)
		}
		port, _ := strconv.Atoi(p)
		if ok && (port < low || port >= high) {
			t.Errorf("port %d outside [%d, %d), below the ephemeral range", port, low, high)
		}
		l, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("bind %s after Addrs: %v", a, err)
		}
		l.Close()
	}
}

func TestParseRange(t *testing.T) {
	for in, want := range map[string]int{"32768\t60999\n": 32768, "1024 65535": 1024} {
		got, err := parseRange(in)
		if err != nil || got != want {
			t.Errorf("parseRange(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "32768", "a b"} {
		if _, err := parseRange(in); err == nil {
			t.Errorf("parseRange(%q): no error", in)
		}
	}
}
