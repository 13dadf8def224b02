package faulttest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/keyshard/keyshard/internal/freeport"
	"github.com/keyshard/keyshard/internal/store"
)

var etcdReady = regexp.MustCompile(`msg="etcd member ready"`)

// TestRenewalThroughResumedEtcdLeader: the etcd leader is paused
// (SIGSTOP) for less than a lease's TTL and resumes with a keep-alive of
// that lease waiting on its socket. Meanwhile the other two elected a new
// leader, whose copy of the lease runs out from its election on. For a
// moment after it resumes, the old leader sees itself active and answers
// the keep-alive from its own lessor, as a renewal, at its old raft term;
// the new leader never sees it. The store must not take that for a
// renewal: a renewal KeepAliveOnce acknowledges keeps the lease alive for
// its TTL from when it was sent (the member's fence deadline counts from
// there), which the new leader must show. (It fails with ErrUnavailable
// when the renewal was not confirmed at the current term.) Whether the
// old leader renews in its window, or steps down first and forwards the
// keep-alive, is a race inside etcd: without the term check, this test
// caught a false renewal in three of four trial runs, in one round each,
// so it runs four rounds. TestRenewalAtAnotherTermFails, in
// internal/store, checks the term check itself on every run.
func TestRenewalThroughResumedEtcdLeader(t *testing.T) {
	bin := binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	addrs, err := freeport.Addrs(6)
	if err != nil {
		t.Fatal(err)
	}
	var clientURLs, initial []string
	for i := range 3 {
		clientURLs = append(clientURLs, "http://"+addrs[2*i])
		initial = append(initial, fmt.Sprintf("e%d=http://%s", i, addrs[2*i+1]))
	}
	dir := t.TempDir()
	procs := make([]*proc, 3)
	for i := range 3 {
		name := fmt.Sprintf("e%d", i)
		procs[i] = startProc(t, name, bin, "chaos", "etcd", "--name", name, "--dir", dir+"/"+name,
			"--client-url", clientURLs[i], "--peer-url", "http://"+addrs[2*i+1], "--initial-cluster", strings.Join(initial, ","),
			"--cluster-token", "keyshard-stale-leader", "--election-timeout", "500ms")
	}
	for _, p := range procs {
		if _, err := p.await(ctx, etcdReady); err != nil {
			t.Fatal(err)
		}
	}
	// One client per member, to ask each about itself.
	members := make([]*clientv3.Client, 3)
	for i, u := range clientURLs {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{u}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		members[i] = c
	}
	const (
		ttl = 5 * time.Second
		// The pause: shorter than ttl, so that the old leader's lessor
		// still holds the lease live when it resumes; the keep-alive goes
		// just before its end, seconds after the new leader's election,
		// so that a renewal the old leader makes would claim seconds more
		// than the new leader's copy has left.
		pause = 4400 * time.Millisecond
	)
	for round := range 4 {
		leader := waitEtcdLeader(t, ctx, members, clientURLs, -1)
		st, err := store.Open(ctx, store.Config{Endpoints: []string{clientURLs[leader]}, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		lease, _, err := st.Grant(ctx, ttl)
		if err != nil {
			t.Fatal(err)
		}
		// The renewals' stream is open to the leader, and the lease fresh.
		if _, err := st.KeepAliveOnce(ctx, lease); err != nil {
			t.Fatalf("round %d: renewal before the pause: %v", round, err)
		}
		procs[leader].signal(t, syscall.SIGSTOP)
		stopped := time.Now()
		next := waitEtcdLeader(t, ctx, members, clientURLs, leader)
		// The fault's shape, not a wait for a condition: the keep-alive
		// goes near the pause's end.
		select {
		case <-time.After(time.Until(stopped.Add(pause))):
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
		type result struct {
			ttl time.Duration
			err error
		}
		res := make(chan result, 1)
		sent := time.Now()
		go func() { // exits once the keep-alive is answered or its context ends
			kctx, kcancel := context.WithTimeout(ctx, 30*time.Second)
			defer kcancel()
			got, err := st.KeepAliveOnce(kctx, lease)
			res <- result{got, err}
		}()
		waitQueued(t, ctx, clientURLs[leader])
		procs[leader].signal(t, syscall.SIGCONT)
		r := <-res
		switch {
		case r.err == nil:
			// Acknowledged: etcd renewed the lease after the send, so
			// it has at least ttl − (now − sent) left, less a second
			// for TimeToLive's rounding down.
			lctx, lcancel := context.WithTimeout(ctx, 5*time.Second)
			tl, err := members[next].TimeToLive(lctx, clientv3.LeaseID(lease))
			lcancel()
			want := ttl - time.Since(sent) - time.Second
			switch left := time.Duration(tl.TTL) * time.Second; {
			case err != nil:
				t.Fatalf("round %d: time to live: %v", round, err)
			case left < want:
				t.Errorf("round %d: a renewal acknowledged through the resumed leader (e%d; answered TTL %v) was not one etcd made: the new leader (e%d) gives the lease %v, less than the %v it would have left", round, leader, r.ttl, next, left, want)
			default:
				t.Logf("round %d: renewed: %v left on the new leader", round, left)
			}
		case errors.Is(r.err, store.ErrUnavailable), errors.Is(r.err, store.ErrLeaseNotFound):
			t.Logf("round %d: the renewal through the resumed leader failed: %v", round, r.err)
		default:
			t.Errorf("round %d: the renewal through the resumed leader: %v; want a renewal, ErrUnavailable or ErrLeaseNotFound", round, r.err)
		}
		st.Close()
	}
}

// waitEtcdLeader waits until a member other than not (-1: any) says it
// leads, and returns its index.
func waitEtcdLeader(t *testing.T, ctx context.Context, members []*clientv3.Client, urls []string, not int) int {
	t.Helper()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		for i, c := range members {
			if i == not {
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			s, err := c.Status(sctx, urls[i])
			cancel()
			if err == nil && s.Leader == s.Header.MemberId {
				return i
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no etcd member other than e%d leads", not)
		case <-tick.C:
		}
	}
}

// waitQueued waits until a connection to the paused member at url has
// bytes it has not read (/proc/net/tcp's rx_queue on its side): the
// keep-alive sent to it waits there.
func waitQueued(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	_, portStr, _ := strings.Cut(strings.TrimPrefix(url, "http://"), ":")
	port, err := strconv.Atoi(portStr)
	if err != nil {
		t.Fatal(err)
	}
	local := fmt.Sprintf(":%04X", port)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		b, err := os.ReadFile("/proc/net/tcp")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			// sl local_address rem_address st tx_queue:rx_queue ...
			if len(f) < 5 || !strings.HasSuffix(f[1], local) || f[3] != "01" {
				continue
			}
			if _, rx, ok := strings.Cut(f[4], ":"); ok && strings.Trim(rx, "0") != "" {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatal("the keep-alive never reached the paused member's socket")
		case <-tick.C:
		}
	}
}
