package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/internal/kitseam"
	"github.com/keyshard/keyshard/internal/server"
	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/keyshardtest"
)

// streamAPIRuns times Commit calls through the API: a server on an
// embedded etcd of its own, one worker holding streamBuckets buckets of a
// stream keyspace that keeps streamInFlight calls in flight for
// streamAPIRun, runs times.
func streamAPIRuns(ctx context.Context, runs int, rep *StreamReport, progress io.Writer) (err error) {
	dir, err := os.MkdirTemp("", "keyshard-bench-stream-api-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	log := slog.New(slog.DiscardHandler)
	emb, err := store.StartEmbedded(ctx, store.EmbeddedConfig{Dir: filepath.Join(dir, "etcd"), Name: "bench", Logger: log})
	if err != nil {
		return err
	}
	defer emb.Close()
	st, err := store.Open(ctx, store.Config{Endpoints: emb.Endpoints(), Logger: log})
	if err != nil {
		return err
	}
	defer st.Close()
	const ks, id = "bench-stream", "sender-1"
	srv, err := keyshardtest.Start(ctx, keyshardtest.Options{
		Keyspaces: []client.KeyspaceConfig{{Name: ks, Buckets: streamBuckets, Mode: client.ModeStream}},
		Logger:    log,
		Internal: &kitseam.Options{Config: func(c *server.Config) {
			c.Replica = "bench"
			c.Etcd = server.EtcdConfig{Endpoints: emb.Endpoints()}
		}},
	})
	if err != nil {
		return fmt.Errorf("start the server: %w", err)
	}
	defer srv.Close()
	// One connection per call in flight, kept open (the default keeps 2).
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: streamInFlight}}
	defer hc.CloseIdleConnections()
	api := keyshardv1connect.NewMemberServiceClient(hc, srv.URL())

	j, err := api.Join(ctx, connect.NewRequest(&keyshardv1.JoinRequest{Keyspace: ks, Member: &keyshardv1.Member{Id: id}}))
	if err != nil {
		return fmt.Errorf("join: %w", err)
	}
	sess := j.Msg.Session
	keepAlive := func() error {
		_, err := api.KeepAlive(ctx, connect.NewRequest(&keyshardv1.KeepAliveRequest{Session: sess}))
		return err
	}
	if err := keepAlive(); err != nil {
		return fmt.Errorf("keep-alive: %w", err)
	}
	kctx, stopKeepAlive := context.WithCancel(ctx)
	kdone := make(chan struct{})
	go func() { // exits when stopKeepAlive is called
		defer close(kdone)
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-kctx.Done():
				return
			case <-t.C:
				api.KeepAlive(kctx, connect.NewRequest(&keyshardv1.KeepAliveRequest{Session: sess}))
			}
		}
	}()
	defer func() { stopKeepAlive(); <-kdone }()
	var since, top uint64
	for {
		g, err := api.GetGrants(ctx, connect.NewRequest(&keyshardv1.GetGrantsRequest{Session: sess, SinceRevision: since, Wait: durationpb.New(time.Second)}))
		if err != nil {
			return fmt.Errorf("get grants: %w", err)
		}
		if len(g.Msg.Grants) == streamBuckets {
			for _, gr := range g.Msg.Grants {
				top = max(top, gr.Token)
			}
			break
		}
		since = g.Msg.Revision
	}

	var (
		all       []time.Duration
		rates     []float64
		writes    int64
		calls     int64
		overtaken int
		pos       atomic.Uint64
	)
	for run := range runs {
		first, err := st.Rev(ctx)
		if err != nil {
			return err
		}
		var (
			mu       sync.Mutex
			acked    int
			lat      []time.Duration
			failed   error
			wg       sync.WaitGroup
			runCalls int64
		)
		start := time.Now()
		deadline := start.Add(streamAPIRun)
		for range streamInFlight {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var mine []time.Duration
				ok, over := 0, 0
				for time.Now().Before(deadline) {
					p := pos.Add(1)
					t0 := time.Now()
					_, err := api.Commit(ctx, connect.NewRequest(&keyshardv1.CommitRequest{Session: sess, MaxToken: top, Position: p}))
					mine = append(mine, time.Since(t0))
					switch {
					case err == nil:
						ok++
					case connect.CodeOf(err) == connect.CodeFailedPrecondition && strings.Contains(err.Error(), "backwards"):
						over++ // a higher commit was written first: covered
					default:
						mu.Lock()
						failed = errors.Join(failed, fmt.Errorf("commit at %d: %w", p, err))
						mu.Unlock()
						return
					}
				}
				mu.Lock()
				acked += ok
				overtaken += over
				lat = append(lat, mine...)
				runCalls += int64(len(mine))
				mu.Unlock()
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		if failed != nil {
			return failed
		}
		last, err := st.Rev(ctx)
		if err != nil {
			return err
		}
		all = append(all, lat...)
		writes += last - first
		calls += runCalls
		rates = append(rates, float64(acked)/elapsed.Seconds())
		fmt.Fprintf(progress, "stream 3/5  API, run %d/%d: %d commits acknowledged (%d calls, %d in flight) in %v (%.0f/s), %d etcd writes\n",
			run+1, runs, acked, runCalls, streamInFlight, elapsed.Round(time.Millisecond), rates[len(rates)-1], last-first)
	}
	rep.CommitsPerS = medianOf(rates)
	rep.CommitAPIP50Ms, rep.CommitAPIP99Ms = percentileMs(all, 50), percentileMs(all, 99)
	rep.CommitWritesPerCall = float64(writes) / float64(calls)
	rep.CommitsOvertaken = overtaken
	rep.CommitInFlight = streamInFlight
	return nil
}
