package server_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/internal/server"
	"github.com/keyshard/keyshard/internal/store"
)

// grantLog records every Acquire and Release of every SDK worker in a test
// and checks, as they happen, that no bucket is held twice and that tokens
// rise per bucket.
type grantLog struct {
	t       *testing.T
	mu      sync.Mutex
	holder  map[int]string
	token   map[int]uint64
	changed chan struct{}
}

func newGrantLog(t *testing.T) *grantLog {
	return &grantLog{t: t, holder: map[int]string{}, token: map[int]uint64{}, changed: make(chan struct{})}
}

// handler is one worker's view of the log.
type handler struct {
	log  *grantLog
	name string
}

func (h handler) Acquire(_ context.Context, g client.Grant) error {
	l := h.log
	l.mu.Lock()
	defer l.mu.Unlock()
	if other, ok := l.holder[g.Bucket]; ok && other != h.name {
		l.t.Errorf("bucket %d granted to %s while %s holds it", g.Bucket, h.name, other)
	}
	if g.Token <= l.token[g.Bucket] {
		l.t.Errorf("bucket %d granted to %s at token %d, not above %d", g.Bucket, h.name, g.Token, l.token[g.Bucket])
	}
	l.holder[g.Bucket], l.token[g.Bucket] = h.name, g.Token
	l.notify()
	return nil
}

func (h handler) Release(_ context.Context, bucket int) error {
	l := h.log
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.holder[bucket] == h.name {
		delete(l.holder, bucket)
	}
	l.notify()
	return nil
}

func (l *grantLog) notify() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// waitHeld waits until every one of buckets is held and the holders are
// exactly the given workers, each with a fair share.
func (l *grantLog) waitHeld(ctx context.Context, buckets int, workers ...string) {
	l.t.Helper()
	for {
		l.mu.Lock()
		counts := map[string]int{}
		for _, w := range l.holder {
			counts[w]++
		}
		ok := len(l.holder) == buckets && len(counts) == len(workers)
		for _, w := range workers {
			if n := counts[w]; n < buckets/len(workers) || n > buckets/len(workers)+1 {
				ok = false
			}
		}
		ch := l.changed
		l.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			l.t.Fatalf("buckets never settled on %v: %v", workers, counts)
		}
	}
}

type sdkWorker struct {
	w    *client.Worker
	kill context.CancelFunc
	done chan struct{} // closed when Run returned
}

func startWorker(t *testing.T, c *client.Client, log *grantLog, name string, opts ...client.WorkerOption) *sdkWorker {
	ctx, kill := context.WithCancel(context.Background())
	if os.Getenv("KEYSHARD_TEST_LOG") != "" {
		opts = append(opts, client.Logger(slog.New(slog.NewTextHandler(os.Stderr, nil)).With("worker", name)), client.OnEvent(func(e client.Event) {
			fmt.Fprintf(os.Stderr, "worker %s: %v bucket=%d token=%d err=%v\n", name, e.Kind, e.Grant.Bucket, e.Grant.Token, e.Err)
		}))
	}
	w, err := client.NewWorker(c, "rooms", client.Member{ID: name}, handler{log, name}, opts...)
	if err != nil {
		t.Fatalf("worker %s: %v", name, err)
	}
	sw := &sdkWorker{w: w, kill: kill, done: make(chan struct{})}
	go func() { // exits when the worker is closed or killed
		defer close(sw.done)
		if err := w.Run(ctx); err != nil && ctx.Err() == nil {
			t.Errorf("worker %s stopped: %v", name, err)
		}
	}()
	t.Cleanup(func() { kill(); <-sw.done })
	return sw
}

// TestSDKCluster runs SDK workers against two replicas on a 3-member etcd:
// concurrent joins, a graceful leave, a crash, a restarted process that
// re-joins under its id, and the leader replica stopping mid-rebalance.
// The grant log checks exclusivity and tokens throughout.
func TestSDKCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cluster, err := store.StartEmbeddedCluster(ctx, t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	eps := cluster.Endpoints()
	r1 := startServer(t, func(c *server.Config) {
		c.Etcd.Endpoints, c.Replica = eps, "r1"
		c.Keyspaces = []server.KeyspaceConfig{{Name: "rooms", Buckets: 64, LeaseTTL: 3 * time.Second}}
	})
	r2 := startServer(t, func(c *server.Config) { c.Etcd.Endpoints, c.Replica = eps, "r2" })
	dial := func(ts *testServer, opts ...client.Option) *client.Client {
		c, err := client.Dial(ts.url, append([]client.Option{client.Token(memberToken)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// The workers talk to r2; r1 leads first, having started first. Half
	// of them speak gRPC (Session streams on grpc-go's server, through
	// grpcbridge), half the Connect protocol over HTTP/1.1 (KeepAlive and
	// WatchGrants calls).
	c2 := dial(r2)
	c2g := dial(r2, client.GRPC())
	clientOf := func(name string) *client.Client {
		if name == "w1" || name == "w3" {
			return c2g
		}
		return c2
	}
	log := newGrantLog(t)

	// Four workers join at once.
	var g errgroup.Group
	workers := map[string]*sdkWorker{}
	var mu sync.Mutex
	for i := range 4 {
		name := fmt.Sprintf("w%d", i)
		g.Go(func() error {
			w := startWorker(t, clientOf(name), log, name)
			mu.Lock()
			workers[name] = w
			mu.Unlock()
			return nil
		})
	}
	g.Wait()
	log.waitHeld(ctx, 64, "w0", "w1", "w2", "w3")

	// A graceful leave.
	cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
	if err := workers["w0"].w.Close(cctx); err != nil {
		t.Fatalf("close w0: %v", err)
	}
	ccancel()
	log.waitHeld(ctx, 64, "w1", "w2", "w3")

	// A crash: w1 stops without leaving; etcd expires its lease.
	workers["w1"].kill()
	<-workers["w1"].done
	log.waitHeld(ctx, 64, "w2", "w3")

	// A restarted process takes over its id while the old session lives:
	// the old one is revoked and its buckets move after a quarantine.
	workers["w2"].kill() // the old process stops acting (it fences itself)
	<-workers["w2"].done
	startWorker(t, c2g, log, "w2", client.Replace(true)) // now over gRPC
	log.waitHeld(ctx, 64, "w2", "w3")

	// The leader replica stops while a new member joins.
	startWorker(t, c2, log, "w4")
	r1.Stop()
	log.waitHeld(ctx, 64, "w2", "w3", "w4")
}

// TestSDKSharedSessions runs SDK workers that share Sessions streams
// (client.SharedSessionStreams) against a real serve, over gRPC and over
// the Connect protocol on h2c: every worker gets its grants and renews
// its session on its Client's one stream (serve renews no keep-alive on a
// Session stream, and none by call after each session's first), a
// graceful leave hands its buckets over, and a crashed worker's buckets
// move once its lease expires while the others keep theirs alive on the
// shared streams. The grant log checks exclusivity and tokens throughout.
func TestSDKSharedSessions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ts := startServer(t, func(c *server.Config) {
		c.Keyspaces = []server.KeyspaceConfig{{Name: "rooms", Buckets: 64, LeaseTTL: 3 * time.Second}}
	})
	dial := func(opts ...client.Option) *client.Client {
		c, err := client.Dial(ts.url, append([]client.Option{client.Token(memberToken), client.SharedSessionStreams()}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	cg, ch := dial(client.GRPC()), dial(client.HTTPClient(h2cClient()))
	log := newGrantLog(t)
	workers := map[string]*sdkWorker{}
	var names []string
	for i := range 6 {
		name := fmt.Sprintf("w%d", i)
		c := cg
		if i%2 == 1 {
			c = ch
		}
		workers[name] = startWorker(t, c, log, name)
		names = append(names, name)
	}
	log.waitHeld(ctx, 64, names...)

	cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
	if err := workers["w0"].w.Close(cctx); err != nil {
		t.Fatalf("close w0: %v", err)
	}
	ccancel()
	log.waitHeld(ctx, 64, names[1:]...)

	// w1 crashes; its lease expires after 3 s, while the others renew
	// theirs on the shared streams.
	workers["w1"].kill()
	<-workers["w1"].done
	log.waitHeld(ctx, 64, names[2:]...)

	shared := metricLine(t, ts, `keyshard_member_keepalives_total{result="renewed",via="shared"}`)
	onStream := metricLine(t, ts, `keyshard_member_keepalives_total{result="renewed",via="stream"}`)
	calls := metricLine(t, ts, `keyshard_member_keepalives_total{result="renewed",via="call"}`)
	if shared < 4 || onStream != 0 || calls > 6 {
		t.Errorf("keep-alives renewed: %v on Sessions streams, %v on Session streams, %v by call; want the four survivors' renewals over the lease TTL on Sessions streams, none on Session streams, a session's first by call", shared, onStream, calls)
	}
}
