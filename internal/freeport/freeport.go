package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// rangeFile holds the kernel's ephemeral port range, "low high".
const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// below is how many ports under the ephemeral range are tried.
const below = 10000

// Addrs returns n distinct 127.0.0.1:port addresses, each free when
// chosen. It tries ports below the kernel's ephemeral range at random,
// and falls back to ports the kernel picks (127.0.0.1:0) where that range
// cannot be read or leaves no room under it.
func Addrs(n int) ([]string, error) {
	low, high, ok := span()
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	out := make([]string, 0, n)
	for len(out) < n {
		l, err := pick(low, high, ok)
		if err != nil {
			return nil, err
		}
		// Held until all n are chosen, so that the ports differ.
		ls = append(ls, l)
		out = append(out, l.Addr().String())
	}
	return out, nil
}

// pick binds one port in [low, high) at random, or one the kernel picks
// when ok is false or every try failed.
func pick(low, high int, ok bool) (net.Listener, error) {
	if ok {
		for range 64 {
			port := low + rand.IntN(high-low)
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err == nil {
				return l, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("pick a free loopback port: %w", err)
	}
	return l, nil
}

// span is the range ports are picked from: up to below ports under the
// ephemeral range, none under 1024.
func span() (low, high int, ok bool) {
	b, err := os.ReadFile(rangeFile)
	if err != nil {
		return 0, 0, false
	}
	start, err := parseRange(string(b))
	if err != nil {
		return 0, 0, false
	}
	low = max(1024, start-below)
	if start-low < 100 {
		return 0, 0, false
	}
	return low, start, true
}

// parseRange reads the first port of the kernel's "low\thigh" range.
func parseRange(s string) (int, error) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return 0, errors.New("want two ports")
	}
	return strconv.Atoi(f[0])
}
