package keyshardtest_test

import (
	"context"
	"fmt"
	"log"
	"testing"
	"time"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/keyshardtest"
)

// acquired is a Handler that tells the test about every grant.
type acquired chan client.Grant

func (a acquired) Acquire(_ context.Context, g client.Grant) error { a <- g; return nil }
func (a acquired) Release(context.Context, int) error              { return nil }

// A server with a keyspace, a worker with a handler against it, and the
// first grant. Start is for code that is not a test; in a test, NewServer
// does the same and closes the server when the test ends.
func ExampleStart() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ts, err := keyshardtest.Start(ctx, keyshardtest.Options{
		Keyspaces: []client.KeyspaceConfig{{Name: "rooms", Buckets: 8}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer ts.Close()

	grants := make(acquired, 8)
	w, err := client.NewWorker(ts.Client(), "rooms", client.Member{ID: "w1", Address: "10.0.0.7:8080"}, grants)
	if err != nil {
		log.Fatal(err)
	}
	go w.Run(ctx) // returns once Close has drained the worker
	defer w.Close(ctx)

	g := <-grants
	fmt.Println("w1 acquired a bucket at token", g.Token)
	// Output:
	// w1 acquired a bucket at token 1
}

// In a test, NewServer ties the server to t: it fails the test if the
// server cannot start, and closes it when the test ends. WaitEpoch
// follows the map until a worker's join has reached it, and Restart
// stops the server and starts it again on the same data, as a deploy
// does.
func ExampleNewServer() {
	testRooms := func(t *testing.T) {
		ctx := t.Context()
		ts := keyshardtest.NewServer(t, keyshardtest.Options{
			Keyspaces: []client.KeyspaceConfig{{Name: "rooms", Buckets: 64}},
		})
		w, err := client.NewWorker(ts.Client(), "rooms", client.Member{ID: "w1"}, make(acquired, 64))
		if err != nil {
			t.Fatal(err)
		}
		go w.Run(ctx)
		m, err := ts.WaitEpoch(ctx, "rooms", 2) // epoch 1 is the empty map of a new keyspace
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("epoch %d: %d members", m.GetEpoch(), len(m.GetMembers()))

		ts.Restart() // the worker reconnects by itself
	}
	_ = testRooms
}
