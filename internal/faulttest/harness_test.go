package faulttest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/internal/chaos"
)

const (
	keyspace = "faults"
	// buckets is the keyspace's bucket count unless a test sets
	// harness.buckets before connect.
	buckets = 16
	// drainTimeout is the keyspace's drain timeout unless a test needs a
	// short one: long, so that a takeover within a few lease TTLs shows
	// the lease (not the drain timeout) ended the old grants.
	drainTimeout = 20 * time.Second
)

// harness is one fault test's world: the sink, the child processes, and an
// admin client and router on the server URL the workers use.
type harness struct {
	t        *testing.T
	ctx      context.Context // bounds the whole test
	sink     *sink
	keyshard string // the binary: serve, and chaos worker for the workers
	buckets  int    // in the keyspace connect creates

	url      string // where workers and the admin client reach the control plane
	admin    *client.Admin
	router   *client.Router
	replicas map[string]*proc // serve processes by replica name, the newest of each
}

func newHarness(t *testing.T, limit time.Duration) *harness {
	t.Helper()
	if testing.Short() {
		t.Skip("fault tests run real processes for tens of seconds")
	}
	keyshard := binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	return &harness{t: t, ctx: ctx, sink: newSink(t), keyshard: keyshard, buckets: buckets, replicas: map[string]*proc{}}
}

// serve starts a `keyshard serve` replica named name and waits until it
// serves. It returns the process and its API address (host:port).
func (h *harness) serve(name string, args ...string) (*proc, string) {
	h.t.Helper()
	p := startProc(h.t, name, h.keyshard, append([]string{"serve", "--replica", name}, args...)...)
	h.replicas[name] = p
	ctx, cancel := context.WithTimeout(h.ctx, 30*time.Second)
	defer cancel()
	m, err := p.await(ctx, chaos.ServingRE)
	if err != nil {
		h.t.Fatal(err)
	}
	addr := m[1]
	h.retry("GET /readyz of "+name, 10*time.Second, func(ctx context.Context) string {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err.Error()
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return resp.Status
		}
		return ""
	})
	return p, addr
}

// connect points the harness at url, creates the keyspace with lease TTL
// ttl and the drain timeout drain (unless it exists), and starts the
// router the checks read the map from.
func (h *harness) connect(url string, ttl, drain time.Duration) {
	h.t.Helper()
	h.url = url
	cl, err := client.Dial(url)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { cl.Close() })
	h.admin = cl.Admin()
	h.retry("create keyspace", 20*time.Second, func(ctx context.Context) string {
		_, err := h.admin.CreateKeyspace(ctx, client.KeyspaceConfig{Name: keyspace, Buckets: h.buckets, LeaseTTL: ttl, DrainTimeout: drain})
		if err != nil && !errors.Is(err, client.ErrExists) {
			return err.Error()
		}
		return ""
	})
	ctx, cancel := context.WithTimeout(h.ctx, 10*time.Second)
	defer cancel()
	if h.router, err = client.NewRouter(cl, keyspace); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { h.router.Close() })
	if err := h.router.Start(ctx); err != nil {
		h.t.Fatal(err)
	}
}

// startWorker starts a worker process with member id id.
func (h *harness) startWorker(id string, extra ...string) *proc {
	h.t.Helper()
	args := append([]string{"chaos", "worker", "--server", h.url, "--sink", h.sink.URL(), "--keyspace", keyspace, "--id", id}, extra...)
	return startProc(h.t, id, h.keyshard, args...)
}

// retry is the tests' one bounded poll, for state that lives in the
// server processes: it calls f (with a context bounding that attempt to
// 3 s) until f returns "", waiting 50 ms, doubling up to 500 ms, between
// attempts. After limit it fails the test with f's last answer.
func (h *harness) retry(what string, limit time.Duration, f func(ctx context.Context) string) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.ctx, limit)
	defer cancel()
	delay := 50 * time.Millisecond
	for {
		actx, acancel := context.WithTimeout(ctx, 3*time.Second)
		why := f(actx)
		acancel()
		if why == "" {
			return
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			h.t.Fatalf("%s: still not after %v: %s", what, limit, why)
		}
		delay = min(2*delay, 500*time.Millisecond)
	}
}

// awaitSink waits, event-driven, until cond (called with the sink
// locked, after every new record) returns "", or fails the test after
// limit.
func (h *harness) awaitSink(what string, limit time.Duration, cond func(s *chaos.History) string) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.ctx, limit)
	defer cancel()
	if err := h.sink.Await(ctx, what, cond); err != nil {
		h.t.Fatal(err)
	}
}

// status returns the server's status and the keyspace's part of it.
func (h *harness) status(ctx context.Context) (client.Status, client.KeyspaceStatus, error) {
	st, err := h.admin.Status(ctx)
	if err != nil {
		return st, client.KeyspaceStatus{}, err
	}
	for _, k := range st.Keyspaces {
		if k.Keyspace.Name == keyspace {
			return st, k, nil
		}
	}
	return st, client.KeyspaceStatus{}, fmt.Errorf("status lists no keyspace %q", keyspace)
}

// running reports whether replica is the name of a serve process that is
// still running.
func (h *harness) running(replica string) bool {
	p := h.replicas[replica]
	if p == nil {
		return false
	}
	return !p.Exited()
}

// waitConverged waits until the faults have stopped mattering: a running
// replica leads, the server has exactly the members live, each with its share of the
// buckets as target, every bucket granted to its target with no handoff
// in flight; the router's map is current; and, in
// the sink, every bucket is held by its map owner at its newest token,
// which has been writing since the wait began. It returns how long that
// took.
func (h *harness) waitConverged(limit time.Duration, live ...string) time.Duration {
	h.t.Helper()
	start, from := time.Now(), h.sink.seq()
	h.retry(fmt.Sprintf("convergence on %v", live), limit, func(ctx context.Context) string {
		st, ks, err := h.status(ctx)
		switch {
		case err != nil:
			return err.Error()
		case !h.running(st.Leader):
			return fmt.Sprintf("leader %q is not a running replica", st.Leader)
		case ks.Members != len(live) || ks.UnassignedBuckets != 0 || ks.HandoffsInFlight != 0 || ks.ReleasingBuckets != 0 ||
			ks.MembersWithoutBuckets > max(ks.Members-h.buckets, 0): // a join held back for the rebalance gap
			return fmt.Sprintf("keyspace status %+v", ks)
		}
		ms, err := h.admin.ListMembers(ctx, keyspace)
		if err != nil {
			return err.Error()
		}
		var ids []string
		granted := 0
		for _, m := range ms.Members {
			ids = append(ids, m.ID)
			// Equal weights: every member's target is its share, rounded
			// down or up.
			if share := h.buckets / len(live); m.TargetBuckets < share || m.TargetBuckets > share+1 ||
				m.GrantedBuckets != m.TargetBuckets || m.ReleasingBuckets != 0 || m.Draining {
				return fmt.Sprintf("member %s: target %d (share %d..%d), granted %d, releasing %d, draining %v", m.ID, m.TargetBuckets, share, share+1, m.GrantedBuckets, m.ReleasingBuckets, m.Draining)
			}
			granted += m.GrantedBuckets
		}
		sort.Strings(ids)
		if want := slices.Sorted(slices.Values(live)); !slices.Equal(ids, want) {
			return fmt.Sprintf("members %v, want %v", ids, want)
		}
		if granted != h.buckets {
			return fmt.Sprintf("%d of %d buckets granted", granted, h.buckets)
		}
		if e := h.router.Epoch(); e != ms.Epoch {
			return fmt.Sprintf("router at epoch %d, members at %d", e, ms.Epoch)
		}
		why := ""
		h.sink.View(func(s *chaos.History) { why = h.servedByOwners(s, from) })
		return why
	})
	d := time.Since(start)
	h.t.Logf("converged on %v in %v", live, d.Round(time.Millisecond))
	return d
}

// servedByOwners returns "" if every bucket is held by its map owner at
// its newest token, which has had a write accepted after record from.
func (h *harness) servedByOwners(s *chaos.History, from int) string {
	for b := range h.buckets {
		owner, _ := h.router.BucketOwner(b)
		switch g := s.Cur[b]; {
		case g == nil:
			return fmt.Sprintf("bucket %d: never acquired", b)
		case g.Worker != owner || g.Released != 0:
			return fmt.Sprintf("bucket %d: map owner %q, newest grant %s@%d (released: %v)", b, owner, g.Worker, g.Token, g.Released != 0)
		case g.LastWrite <= from:
			return fmt.Sprintf("bucket %d: no accepted write by %s@%d yet", b, g.Worker, g.Token)
		}
	}
	return ""
}

// check runs checkHistory over everything the sink recorded and fails the
// test with each violation; it logs what the record holds.
func (h *harness) check() {
	h.t.Helper()
	recs := h.sink.records()
	bad := checkHistory(recs)
	for i, v := range bad {
		if i == 30 {
			h.t.Errorf("... and %d more violations", len(bad)-i)
			break
		}
		h.t.Errorf("violation: %s", v)
	}
	type counts struct{ acquires, releases, fenced, writes, refused int }
	per := map[string]*counts{}
	for _, r := range recs {
		if strings.HasPrefix(r.Kind, "fault:") || r.Kind == note {
			continue
		}
		c := per[r.Worker]
		if c == nil {
			c = &counts{}
			per[r.Worker] = c
		}
		switch r.Kind {
		case kindAcquire:
			c.acquires++
		case kindRelease:
			c.releases++
			if r.Fenced {
				c.fenced++
			}
		case kindWrite:
			c.writes++
			if r.Refused {
				c.refused++
			}
		}
	}
	var lines []string
	for _, w := range slices.Sorted(maps.Keys(per)) {
		c := per[w]
		lines = append(lines, fmt.Sprintf("%s: %d acquires, %d releases (%d fenced), %d writes (%d refused)", w, c.acquires, c.releases, c.fenced, c.writes, c.refused))
	}
	h.t.Logf("record: %d entries, %d violations; %s", len(recs), len(bad), strings.Join(lines, "; "))
}
