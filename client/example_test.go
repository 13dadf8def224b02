package client_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sync/errgroup"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/hotkey"
)

func ExampleDial() {
	_, err := client.Dial("127.0.0.1:7400")
	fmt.Println(errors.Is(err, client.ErrInvalid))
	fmt.Println(err)
	// Output:
	// true
	// keyshard: invalid argument: Dial: server URL "127.0.0.1:7400" must start with http:// or https://, for example http://127.0.0.1:7400
}

// A worker's own RPC server answers a misrouted request with WrongOwner;
// the caller decodes the owner with AsWrongOwner and retries there.
func ExampleWrongOwner() {
	owns := &client.WrongOwnerError{Bucket: 17, Owner: "writer-2", Address: "10.0.0.8:8080", Epoch: 42}
	answer := client.WrongOwner(fmt.Errorf("send to room !abc: %w", owns)) // return this from the handler

	wo, ok := client.AsWrongOwner(answer) // on the caller's side
	fmt.Println(connect.CodeOf(answer), ok)
	fmt.Printf("retry at %s once the map reaches epoch %d\n", wo.Address, wo.Epoch)
	// Output:
	// failed_precondition true
	// retry at 10.0.0.8:8080 once the map reaches epoch 42
}

// rooms is an application's Handler: it serves the rooms whose keys hash
// into the buckets it holds, writing with the bucket's fencing token.
type rooms struct {
	db *sql.DB
}

func (r *rooms) Acquire(ctx context.Context, g client.Grant) error {
	// Load what the bucket needs; run its work under ctx, which is
	// cancelled when the grant ends. Every write carries g.Token:
	//
	//	UPDATE rooms SET state = $1, fence = $2 WHERE id = $3 AND fence <= $2
	//
	// and "0 rows updated" means another worker owns the room now.
	return nil
}

func (r *rooms) Release(ctx context.Context, bucket int) error {
	// Finish in-flight work of the bucket; return when done.
	return nil
}

func ExampleNewWorker() {
	c, err := client.Dial("http://127.0.0.1:7400", client.Token(os.Getenv("KEYSHARD_TOKEN")))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	w, err := client.NewWorker(c, "rooms", client.Member{ID: "writer-1", Address: "10.0.0.7:8080"}, &rooms{},
		client.FenceMargin(2*time.Second),
		client.OnEvent(func(ev client.Event) { log.Printf("keyshard: %s %+v %v", ev.Kind, ev.Grant, ev.Err) }))
	if err != nil {
		log.Fatal(err) // a bad argument or option; nothing was sent
	}
	errc := make(chan error, 1)
	go func() { errc <- w.Run(context.Background()) }()

	<-ctx.Done() // SIGINT: hand every bucket over, then stop
	drain, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Close(drain); err != nil {
		log.Printf("drain incomplete: %v", err)
	}
	if err := <-errc; err != nil {
		log.Print(err)
	}
}

func ExampleWorker_Owns() {
	var w *client.Worker // running
	serve := func(ctx context.Context, room string) error {
		g, err := w.OwnsString(room)
		if errors.Is(err, client.ErrNotGranted) {
			g, err = w.WaitGrant(ctx, []byte(room)) // the map names us; the grant is on its way
		}
		if err != nil {
			return client.WrongOwner(err) // tells the caller where to go
		}
		_ = g.Token // write with it
		return nil
	}
	_ = serve
}

func ExampleNewRouter() {
	c, err := client.Dial("http://127.0.0.1:7400", client.Token(os.Getenv("KEYSHARD_TOKEN")))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	r, err := client.NewRouter(c, "rooms")
	if err != nil {
		log.Fatal(err) // a bad keyspace name
	}
	defer r.Close()
	ctx := context.Background()
	start, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.Start(start); err != nil { // returns once the router has the map
		log.Fatal(err) // for example ErrNotFound: no such keyspace
	}

	member, ok := r.OwnerString("!room:example.org")
	if !ok {
		log.Print("the room's bucket is unassigned; retry shortly")
		return
	}
	addr := r.Address(member)
	err = send(ctx, addr)
	if wo, ok := client.AsWrongOwner(err); ok {
		_ = r.WaitEpoch(ctx, wo.Epoch) // our map was behind: catch up, then retry at wo.Address
	}
}

func send(context.Context, string) error { return nil }

// A Router whose goroutine runs in the caller's errgroup: Run blocks, and
// WaitReady waits for the first map.
func ExampleRouter_Run() {
	var r *client.Router // from NewRouter, not started
	defer r.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.Run(ctx) }) // until SIGINT; retries while the server is unreachable
	g.Go(func() error {
		if err := r.WaitReady(ctx); err != nil {
			return err
		}
		member, _ := r.OwnerString("!room:example.org")
		return send(ctx, r.Address(member))
	})
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		log.Print(err)
	}
}

func ExampleAdmin_WaitDrained() {
	c, err := client.Dial("http://127.0.0.1:7400", client.Token(os.Getenv("KEYSHARD_ADMIN_TOKEN")))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	a := c.Admin()
	if err := a.DrainMember(ctx, "rooms", "writer-1"); err != nil {
		log.Fatal(err)
	}
	err = a.WaitDrained(ctx, "rooms", "writer-1", func(left int) {
		fmt.Printf("\rwriter-1: %d buckets left", left)
	})
	if err != nil {
		log.Fatal(err)
	}
}

func ExampleAdmin_CreateKeyspace() {
	c, err := client.Dial("http://127.0.0.1:7400", client.Token(os.Getenv("KEYSHARD_ADMIN_TOKEN")))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ks, err := c.Admin().CreateKeyspace(context.Background(), client.KeyspaceConfig{Name: "rooms", Buckets: 4096, LeaseTTL: 10 * time.Second})
	switch {
	case errors.Is(err, client.ErrExists):
		log.Print("keyspace rooms exists already")
	case err != nil:
		log.Fatal(err)
	default:
		log.Printf("created %+v", ks)
	}
}

// A producer's part in cluster-wide hot-key detection, around a
// hotkey.Policy it decides under mu. (Package kafka's Router does this
// itself; see kafka.Config.ClusterHotKeys.)
func ExampleNewHotKeys() {
	c, err := client.Dial("http://127.0.0.1:7400", client.Token(os.Getenv("KEYSHARD_TOKEN")))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	policy, err := hotkey.NewPolicy(hotkey.PolicyConfig{Detector: hotkey.DetectorConfig{Threshold: 1000, MaxTotalRate: 200_000}})
	if err != nil {
		log.Fatal(err)
	}
	var mu sync.Mutex // held around policy.Decide too
	hk, err := client.NewHotKeys(c, client.HotKeysConfig{
		Pool:     "events",
		Producer: "ingest-7",
		Report: func(now time.Time, minRate float64) []hotkey.KeyRate {
			mu.Lock()
			hot := policy.Detector().AppendAbove(nil, minRate, now)
			mu.Unlock()
			keys := make([]hotkey.KeyRate, 0, len(hot))
			for _, h := range hot {
				if !h.Truncated { // a truncated key cannot be named
					keys = append(keys, hotkey.KeyRate{Key: h.Key, Rate: h.Rate})
				}
			}
			return keys
		},
		OnSet: func(s hotkey.OverflowSet) {
			mu.Lock()
			defer mu.Unlock()
			policy.SetClusterKeys(s.Keys())
		},
	})
	if err != nil {
		log.Fatal(err) // an *ArgError naming the field
	}
	defer hk.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	_ = hk.Run(ctx) // until SIGINT; control-plane errors never end it
	log.Printf("hot keys: %+v", hk.Stats())
}

// A client reads each tenant from its pool members; a server of the pool
// prefetches the tenants it serves and reports them ready; whoever takes
// requests in counts them per tenant.
func ExampleClient_FollowPool() {
	ctx := context.Background()
	c, err := client.Dial("http://keyshard.internal:7400", client.Token(os.Getenv("KEYSHARD_TOKEN")))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// A client of the pool: which members to read tenant "acme" from.
	f, err := c.FollowPool(ctx, "index-gateways", client.OnPoolEvent(func(e client.PoolEvent) {
		if e.Kind == client.PoolStale {
			log.Printf("tenant pool snapshot %d may be out of date: %v", e.Version, e.Err)
		}
	}))
	if err != nil {
		log.Fatal(err) // ErrNotFound: no such pool
	}
	defer f.Close()
	for _, member := range f.Targets("acme") { // read-only, no allocation
		fmt.Println("read acme from", member)
	}

	// A server of the pool: load what it serves, then say so.
	m, err := c.JoinPool(ctx, "index-gateways", client.Member{ID: "gw-3", Address: "10.0.0.3:9095", Zone: "eu-west-1a"})
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		// Drain: clients keep reading this member for the pool's lookback.
		lctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := m.Leave(lctx); err != nil {
			log.Print(err) // ended early: reads of its data may miss
		}
	}()
	tenants := m.Tenants()
	// ... load the recent data of tenants ...
	if _, err := m.MarkReady(ctx, tenants...); err != nil {
		log.Print(err)
	}

	// Where requests enter: count them per tenant.
	r, err := c.NewLoadReporter("index-gateways", "frontend-"+os.Getenv("HOSTNAME"))
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close() // sends the counts not reported yet
	_ = r.Add("acme", 1)
}
