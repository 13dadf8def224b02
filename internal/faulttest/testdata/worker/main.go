// Command worker is the fault tests' worker process: a client.Worker that
// joins a keyspace, reports every grant and release to the fenced test
// sink, and writes to the sink for every bucket it holds, passing the
// grant's fencing token, until the bucket is released. It leaves
// gracefully (Close) on SIGTERM and exits.
//
// The tests in internal/faulttest build it with
//
//	go build -o <tmp>/worker ./internal/faulttest/testdata/worker
//
// and start it with -server, -sink and -id. Exit status: 0 after a complete
// drain, 1 on a bad flag or if Run failed, 2 if the drain did not finish
// within -drain-timeout.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/keyshard/keyshard/client"
)

func main() {
	var (
		serverURL    = flag.String("server", "", "Keyshard server URL (http://host:port)")
		sinkURL      = flag.String("sink", "", "fenced test sink URL")
		keyspace     = flag.String("keyspace", "faults", "keyspace to join")
		id           = flag.String("id", "", "member id")
		interval     = flag.Duration("interval", 20*time.Millisecond, "time between two writes of one held bucket")
		releaseDelay = flag.Duration("release-delay", 0, "how long a handoff's Release keeps finishing in-flight work (writing) before it returns")
		blockRelease = flag.Bool("block-release", false, "make a handoff's Release hang, still writing, until the grant's context is cancelled (a stuck handler)")
		drainTimeout = flag.Duration("drain-timeout", 30*time.Second, "how long Close may take to drain on SIGTERM")
		logLevel     = flag.String("log-level", "info", "debug, info, warn or error")
	)
	flag.Parse()
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil || *serverURL == "" || *sinkURL == "" || *id == "" || *interval <= 0 {
		fmt.Fprintln(os.Stderr, "worker: -server, -sink and -id are required; -interval must be positive; -log-level must be a slog level")
		os.Exit(1)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})).With("worker", *id)

	rep := newReporter(*sinkURL, *id, log)
	c, err := client.Dial(*serverURL, client.Logger(log))
	if err != nil {
		log.Error("dial", "err", err)
		os.Exit(1)
	}
	h := &handler{rep: rep, log: log, interval: *interval, releaseDelay: *releaseDelay, blockRelease: *blockRelease, buckets: map[int]*bucketWork{}}
	w := client.NewWorker(c, *keyspace, client.Member{ID: *id, Address: fmt.Sprintf("pid-%d", os.Getpid())}, h,
		client.OnEvent(rep.workerEvent))

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(context.Background()) }() // exits after Close, or on a permanent error

	select {
	case err := <-ran:
		log.Error("worker stopped by itself", "err", err)
		rep.flush()
		os.Exit(1)
	case <-sigs:
	}
	log.Info("SIGTERM: draining")
	rep.post("/event", report{Kind: "draining"})
	ctx, cancel := context.WithTimeout(context.Background(), *drainTimeout)
	err = w.Close(ctx)
	cancel()
	if rerr := <-ran; rerr != nil {
		log.Error("Run", "err", rerr)
	}
	c.Close()
	rep.flush()
	if err != nil {
		log.Error("drain did not finish", "err", err)
		os.Exit(2)
	}
	log.Info("drained; exiting")
}

// handler implements client.Handler: one writer goroutine per held bucket.
type handler struct {
	rep          *reporter
	log          *slog.Logger
	interval     time.Duration
	releaseDelay time.Duration
	blockRelease bool

	mu      sync.Mutex
	buckets map[int]*bucketWork
}

// bucketWork is one grant's work: its writer runs from Acquire until
// Release stops it (or the grant's context is cancelled).
type bucketWork struct {
	g    client.Grant
	gctx context.Context
	stop chan struct{} // closed by Release: write no more
	done chan struct{} // closed when the writer has exited: no write in flight
}

// Acquire first claims the bucket at the sink with the grant's token (as an
// application would raise the fence of the bucket's rows), then starts
// writing.
func (h *handler) Acquire(ctx context.Context, g client.Grant) error {
	if code := h.rep.post("/event", report{Kind: "acquire", Bucket: g.Bucket, Token: g.Token}); code == http.StatusConflict {
		h.log.Error("the sink refused the claim of a new grant: it has seen a higher token", "bucket", g.Bucket, "token", g.Token)
	}
	bw := &bucketWork{g: g, gctx: ctx, stop: make(chan struct{}), done: make(chan struct{})}
	h.mu.Lock()
	h.buckets[g.Bucket] = bw
	h.mu.Unlock()
	go h.write(bw) // exits when Release closes bw.stop or the grant's context ends
	return nil
}

// write writes to the sink every interval with the grant's token. A write
// in flight is always finished (it is not bound to the grant's context), so
// that once done is closed the sink has answered every write of the grant.
// A refused write (409: a newer owner exists) makes it stop, as an
// application that sees "0 rows updated" must.
func (h *handler) write(bw *bucketWork) {
	defer close(bw.done)
	t := time.NewTicker(h.interval)
	defer t.Stop()
	for n := uint64(1); ; n++ {
		select {
		case <-bw.gctx.Done():
			return
		case <-bw.stop:
			return
		case <-t.C:
		}
		select { // a stop that raced with the tick wins
		case <-bw.gctx.Done():
			return
		case <-bw.stop:
			return
		default:
		}
		if code := h.rep.post("/write", report{Kind: "write", Bucket: bw.g.Bucket, Token: bw.g.Token, N: n}); code == http.StatusConflict {
			h.log.Warn("write refused: a newer owner exists; stopping work on the bucket", "bucket", bw.g.Bucket, "token", bw.g.Token)
			return
		}
	}
}

// Release finishes the bucket's in-flight work and returns once no write
// of the grant can still reach the sink. On a handoff it first keeps
// working for -release-delay (finishing in-flight work), or with
// -block-release until the grant's context is cancelled (the worker
// fenced itself, or is stopping); after a self-fence (the grant's context
// is already cancelled) it stops at once.
func (h *handler) Release(ctx context.Context, bucket int) error {
	h.mu.Lock()
	bw := h.buckets[bucket]
	delete(h.buckets, bucket)
	h.mu.Unlock()
	if bw == nil {
		h.rep.post("/event", report{Kind: "release", Bucket: bucket, Err: "Release without a preceding Acquire"})
		return nil
	}
	fenced := bw.gctx.Err() != nil
	h.rep.post("/event", report{Kind: "releasing", Bucket: bucket, Token: bw.g.Token, Fenced: fenced})
	if !fenced && h.blockRelease {
		h.log.Warn("Release is stuck until the grant's context ends", "bucket", bucket, "token", bw.g.Token)
		select {
		case <-bw.gctx.Done():
		case <-ctx.Done():
		}
	}
	if !fenced && h.releaseDelay > 0 {
		t := time.NewTimer(h.releaseDelay)
		select {
		case <-t.C:
		case <-bw.gctx.Done():
		case <-ctx.Done():
		}
		t.Stop()
	}
	close(bw.stop)
	<-bw.done
	h.rep.post("/event", report{Kind: "release", Bucket: bucket, Token: bw.g.Token, Fenced: fenced || bw.gctx.Err() != nil})
	return nil
}

// report is what the worker sends to the sink: a write (POST /write) or
// an event (POST /event). Mono is the worker's monotonic clock, in
// nanoseconds since it started.
type report struct {
	Kind    string `json:"kind"`
	Worker  string `json:"worker"`
	Pid     int    `json:"pid"`
	Session string `json:"session,omitempty"`
	Bucket  int    `json:"bucket"`
	Token   uint64 `json:"token,string"`
	N       uint64 `json:"n,omitempty"`
	Fenced  bool   `json:"fenced,omitempty"`
	Err     string `json:"err,omitempty"`
	Mono    int64  `json:"mono"`
}

// reporter posts reports to the sink. Handler reports are synchronous, so
// that the sink sees a grant's release before the next owner's acquire;
// SDK events (OnEvent must not block) go through a queue, in order.
type reporter struct {
	url    string
	worker string
	pid    int
	start  time.Time
	hc     *http.Client
	log    *slog.Logger

	queue chan report
	done  chan struct{} // closed when the queue's goroutine exits
	once  sync.Once
}

func newReporter(url, worker string, log *slog.Logger) *reporter {
	r := &reporter{
		url: url, worker: worker, pid: os.Getpid(), start: time.Now(), log: log,
		hc:    &http.Client{Timeout: 5 * time.Second},
		queue: make(chan report, 1024),
		done:  make(chan struct{}),
	}
	go func() { // exits when flush closes the queue
		defer close(r.done)
		for rep := range r.queue {
			r.post("/event", rep)
		}
	}()
	return r
}

// post sends one report and returns the sink's status code (0 if it could
// not be reached).
func (r *reporter) post(path string, rep report) int {
	rep.Worker, rep.Pid = r.worker, r.pid
	if rep.Mono == 0 {
		rep.Mono = time.Since(r.start).Nanoseconds()
	}
	body, _ := json.Marshal(rep)
	resp, err := r.hc.Post(r.url+path, "application/json", bytes.NewReader(body))
	if err != nil {
		r.log.Warn("report to the sink failed", "kind", rep.Kind, "err", err)
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// workerEvent is the Worker's OnEvent callback: it queues lifecycle
// events (Acquire and Release report themselves).
func (r *reporter) workerEvent(ev client.Event) {
	var kind string
	switch ev.Kind {
	case client.EventJoined:
		kind = "joined"
	case client.EventFenced:
		kind = "fenced"
	case client.EventSessionLost:
		kind = "session-lost"
	case client.EventRejoined:
		kind = "rejoined"
	case client.EventLeft:
		kind = "left"
	default:
		return
	}
	rep := report{Kind: kind, Session: ev.Session}
	if ev.Err != nil {
		rep.Err = ev.Err.Error()
	}
	rep.Mono = time.Since(r.start).Nanoseconds() // when it happened, not when it is sent
	select {
	case r.queue <- rep:
	default:
		r.log.Warn("event queue full; dropping", "kind", kind)
	}
}

// flush sends what is queued and stops the queue.
func (r *reporter) flush() {
	r.once.Do(func() { close(r.queue) })
	<-r.done
}
