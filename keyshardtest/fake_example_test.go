package keyshardtest_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/keyshardtest"
)

// handler is the application's client.Handler under test: it notes which
// buckets it serves, and how each one ended.
type handler struct {
	mu       sync.Mutex
	serving  map[int]context.Context // bucket → its grant's context
	released []string
}

func newHandler() *handler { return &handler{serving: map[int]context.Context{}} }

func (h *handler) Acquire(ctx context.Context, g client.Grant) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.serving[g.Bucket] = ctx
	return nil
}

func (h *handler) Release(_ context.Context, bucket int) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	how := "handed over"
	if h.serving[bucket].Err() != nil {
		how = "stopped" // the grant was cancelled first: a self-fence
	}
	h.released = append(h.released, fmt.Sprintf("%d %s", bucket, how))
	delete(h.serving, bucket)
	return nil
}

// releases returns what Release was called with, sorted.
func (h *handler) releases() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Sorted(slices.Values(h.released))
}

// tokens returns the buckets and fencing tokens of gs.
func tokens(gs []client.Grant) []string {
	var out []string
	for _, g := range gs {
		out = append(out, fmt.Sprintf("%d@%d", g.Bucket, g.Token))
	}
	return out
}

// eventLog follows a Worker's events; next returns the next one of kind k.
type eventLog chan client.Event

func (e eventLog) next(k client.EventKind) client.Event {
	for ev := range e {
		if ev.Kind == k {
			return ev
		}
	}
	panic("unreachable")
}

// runHandler runs the handler under test in a client.Worker of keyspace
// "rooms", as member w1, and follows its events.
func runHandler(ctx context.Context, f *keyshardtest.Fake) (*client.Worker, *handler, eventLog) {
	h, ev := newHandler(), make(eventLog, 256)
	w, err := client.NewWorker(f.Client(), "rooms", client.Member{ID: "w1"}, h,
		client.OnEvent(func(e client.Event) { ev <- e }))
	if err != nil {
		log.Fatal(err)
	}
	go w.Run(ctx) // returns once the caller's Close has stopped the worker
	return w, h, ev
}

// A worker whose keep-alives hang stops serving its buckets before its
// lease can expire at the server: the fake makes keep-alives hang on
// cue, and the test moves the fake clock to the fence deadline, the
// newest acknowledged keep-alive's send time + lease TTL − fence margin
// (max(TTL/10, 500ms)), here 0 + 9s − 0.9s.
func ExampleFake_hangingKeepAlive() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a guard, never a pace
	defer cancel()
	f := keyshardtest.StartFake() // in a test: keyshardtest.NewFake(t)
	defer f.Close()
	clk := f.Clock()
	start := clk.Now()
	f.AddKeyspace("rooms", 4, 9*time.Second)

	w, h, ev := runHandler(ctx, f)
	defer w.Close(ctx)
	session := ev.next(client.EventJoined).Session
	ev.next(client.EventRenewed) // the first keep-alive went at once, at +0s
	f.AssignAll("rooms", "w1")
	for range 4 {
		ev.next(client.EventAcquired)
	}

	f.SetKeepAlives(keyshardtest.KeepAliveHang)
	if err := clk.BlockUntilContext(ctx, 2); err != nil { // the worker's next keep-alive and its fence deadline
		log.Fatal(err)
	}
	clk.Advance(9*time.Second - 900*time.Millisecond - time.Nanosecond)
	fmt.Printf("at +%v: %d buckets held, %d released\n", clk.Since(start), len(w.Held()), len(h.releases()))

	clk.Advance(time.Nanosecond)
	fenced := ev.next(client.EventFenced)
	ev.next(client.EventSessionLost) // every Release has returned
	fmt.Printf("at +%v: fenced (%v); %d buckets held\n", fenced.Time.Sub(start), errors.Is(fenced.Err, client.ErrSessionLost), len(w.Held()))
	fmt.Println("released:", h.releases())
	fmt.Printf("the lease would expire at the server at +%v\n", f.LeaseExpiry(session).Sub(start))
	// Output:
	// at +8.099999999s: 4 buckets held, 0 released
	// at +8.1s: fenced (true); 0 buckets held
	// released: [0 stopped 1 stopped 2 stopped 3 stopped]
	// the lease would expire at the server at +9s
}

// A control plane cut off from etcd until just before the fence
// deadline: the worker's keep-alives fail, its next retry would come
// after the deadline, so it fences itself at the deadline; it re-joins
// at once, naming the session it fenced, and gets its buckets back at
// new fencing tokens.
func ExampleFake_unavailable() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a guard, never a pace
	defer cancel()
	f := keyshardtest.StartFake()
	defer f.Close()
	clk := f.Clock()
	f.AddKeyspace("rooms", 2, 9*time.Second)

	w, h, ev := runHandler(ctx, f)
	defer w.Close(ctx)
	first := ev.next(client.EventJoined).Session
	ev.next(client.EventRenewed)                        // the first keep-alive, answered at +0s
	if _, err := f.KeepAlives().Wait(ctx); err != nil { // ... and taken
		log.Fatal(err)
	}
	f.AssignAll("rooms", "w1")
	for range 2 {
		ev.next(client.EventAcquired)
	}
	fmt.Println("held:", tokens(w.Held()))

	f.SetUnavailable(true)
	if err := clk.BlockUntilContext(ctx, 2); err != nil { // the worker's next keep-alive and its fence deadline
		log.Fatal(err)
	}
	clk.Advance(9*time.Second - 900*time.Millisecond - time.Nanosecond)
	if _, err := f.KeepAlives().Wait(ctx); err != nil { // the keep-alive due at +3s went, and failed
		log.Fatal(err)
	}
	f.SetUnavailable(false) // back, 1ns before the fence deadline
	clk.Advance(time.Nanosecond)
	ev.next(client.EventFenced)
	ev.next(client.EventSessionLost) // every Release has returned
	fmt.Println("released:", h.releases())

	again := ev.next(client.EventRejoined).Session
	for range 2 {
		ev.next(client.EventAcquired)
	}
	fmt.Println("held:", tokens(w.Held()))
	fmt.Printf("%s live: %v, %s live: %v\n", first, f.Live(first), again, f.Live(again))
	// Output:
	// held: [0@1 1@2]
	// released: [0 stopped 1 stopped]
	// held: [0@3 1@4]
	// s1 live: false, s2 live: true
}

// In a test, NewFake ties the fake to t, and its requests and the fake
// clock's waits fail the test instead of hanging.
func ExampleNewFake() {
	testRooms := func(t *testing.T) {
		f := keyshardtest.NewFake(t)
		f.AddKeyspace("rooms", 64, 9*time.Second)
		w, err := client.NewWorker(f.Client(), "rooms", client.Member{ID: "w1"}, newHandler())
		if err != nil {
			t.Fatal(err)
		}
		go w.Run(t.Context())
		f.WaitSession(t, "rooms", "w1") // it joined
		f.AssignAll("rooms", "w1")
		// ... check what the handler serves

		f.SetKeepAlives(keyshardtest.KeepAliveHang)
		f.Clock().MustBlockUntil(t, 2)     // the worker's keep-alive and fence timers
		f.Clock().Advance(9 * time.Second) // past TTL − margin
		// ... check that the handler stopped every bucket
	}
	_ = testRooms
}
