package stream_test

import (
	"context"
	"fmt"
	"log"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/client/clienttest"
	"github.com/keyshard/keyshard/client/stream"
)

// memStream is an in-memory stream: record i is at position i. At the
// head, Read waits a little for new records and returns empty, so that a
// bucket gained meanwhile starts catching up.
type memStream struct{ recs []stream.Record }

func (m *memStream) Read(ctx context.Context, from uint64) ([]stream.Record, uint64, error) {
	if from >= uint64(len(m.recs)) {
		select {
		case <-time.After(10 * time.Millisecond): // a real stream would wake on an append
		case <-ctx.Done():
		}
		return nil, from, ctx.Err()
	}
	return m.recs[from:], uint64(len(m.recs)), nil
}

// A stream worker: the user writes a Reader and a function that handles
// one record; the worker gains and loses buckets, reads each from its
// committed position, commits, and hands positions over on release.
func ExampleNewWorker() {
	// A fake keyshard serve, with a stream keyspace of 4 buckets.
	f := clienttest.Start(clienttest.Options{})
	defer f.Close()
	f.PutKeyspace(&keyshardv1.Keyspace{Name: "events", Buckets: 4, LeaseTtl: durationpb.New(10 * time.Second), Mode: keyshardv1.KeyspaceMode_KEYSPACE_MODE_STREAM})
	c, err := client.Dial(f.URL(), client.Clock(f.Clock()))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	s := &memStream{}
	for i, room := range []string{"a", "b", "c", "a", "d", "b", "a"} {
		s.recs = append(s.recs, stream.Record{Key: []byte("!" + room), Position: uint64(i), Payload: fmt.Appendf(nil, "event %d", i)})
	}
	var mu sync.Mutex
	byRoom := map[string][]string{}
	all := make(chan struct{})
	handle := func(_ context.Context, r stream.Record) error {
		mu.Lock()
		defer mu.Unlock()
		byRoom[string(r.Key)] = append(byRoom[string(r.Key)], string(r.Payload))
		if n := len(byRoom["!a"]) + len(byRoom["!b"]) + len(byRoom["!c"]) + len(byRoom["!d"]); n == len(s.recs) {
			close(all)
		}
		return nil
	}

	joined := make(chan struct{}, 1)
	w, err := stream.NewWorker(c, "events", client.Member{ID: "sender-1"}, s, handle, stream.WorkerOptions{
		Worker: []client.WorkerOption{client.OnEvent(func(ev client.Event) {
			if ev.Kind == client.EventJoined {
				joined <- struct{}{}
			}
		})},
	})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background()) }()
	<-joined
	f.AssignAll("events", "sender-1") // the fake plays the leader
	<-all
	if err := w.Close(context.Background()); err != nil {
		log.Fatal(err)
	}
	if err := <-done; err != nil {
		log.Fatal(err)
	}

	for _, room := range slices.Sorted(maps.Keys(byRoom)) {
		fmt.Printf("%s: %s\n", room, strings.Join(byRoom[room], ", "))
	}
	// Output:
	// !a: event 0, event 3, event 6
	// !b: event 1, event 5
	// !c: event 2
	// !d: event 4
}
