package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyshard/keyshard/hotkey"
	"github.com/keyshard/keyshard/kafka"
)

// KeyPartition is where Kafka's Java client puts a key; the router's
// client must agree (NewRouter checks it). Java: murmur2("foobar") is
// -790332482, and toPositive(-790332482) % 12 = 1357151166 % 12 = 6.
func ExampleKeyPartition() {
	for _, key := range []string{"foobar", "abc", "user:42"} {
		fmt.Println(key, kafka.KeyPartition([]byte(key), 12))
	}
	// Output:
	// foobar 6
	// abc 3
	// user:42 1
}

func ExampleParsePosition() {
	p, off, err := kafka.ParsePosition([]byte("3:1200"))
	fmt.Println(p, off, err)
	_, _, err = kafka.ParsePosition([]byte("3"))
	fmt.Println(errors.Is(err, kafka.ErrBadHeader))
	// Output:
	// 3 1200 <nil>
	// true
}

// A router in front of a main and an overflow topic: NewRouter checks the
// arguments, Start loads the topics and starts the router. Compiled, not
// run: it needs a broker.
func ExampleNewRouter() {
	ctx := context.Background()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers("localhost:9092"),
		kgo.RecordDeliveryTimeout(10*time.Second), // the client gives up too
	)
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	rules, err := hotkey.ParseRules("drop token:abusive\njunk anonymous,null,undefined")
	if err != nil {
		log.Fatal(err)
	}
	r, err := kafka.NewRouter(cl, kadm.NewClient(cl), kafka.Config{
		MainTopic:     "events",
		OverflowTopic: "events-overflow",
		OverflowGroup: "ingest-overflow",
		Policy: hotkey.PolicyConfig{
			Detector: hotkey.DetectorConfig{Threshold: 1000, MaxTotalRate: 200_000},
			Rules:    rules,
		},
		KeyFunc: func(r *kgo.Record) ([]byte, error) {
			return nil, errors.New("events must carry a distinct id") // or compute one
		},
	})
	if err != nil {
		log.Fatal(err) // wraps kafka.ErrBadConfig and names the field; nothing was sent
	}
	defer r.Close()
	// Start waits for the brokers (retrying) until its ctx ends, and fails
	// at once for a missing topic.
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := r.Start(startCtx); err != nil {
		log.Fatal(err) // a missing topic: wraps kafka.ErrBadConfig and names it
	}

	r.Produce(ctx, &kgo.Record{Key: []byte("user:42"), Value: []byte(`{"event":"pageview"}`)},
		func(rec *kgo.Record, err error) {
			switch {
			case err == nil:
				fmt.Println("written to", rec.Topic, rec.Partition, rec.Offset)
			case errors.Is(err, kafka.ErrDropped):
				// a drop rule matched; counted
			default:
				log.Print(err) // ErrMissingKey, ErrTimeout, or the client's error
			}
		})
}

// The overflow lane's consumer honours the entry barrier. Compiled, not
// run: it needs a broker.
func ExampleBarrier() {
	ctx := context.Background()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers("localhost:9092"),
		kgo.ConsumerGroup("ingest-overflow"),
		kgo.ConsumeTopics("events-overflow"),
		kgo.DisableAutoCommit(), // commit after processing: committed means processed
	)
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	b, err := kafka.NewBarrier(kadm.NewClient(cl), kafka.BarrierConfig{
		Lane:  kafka.Overflow,
		Topic: "events", // the other lane: main, and its group
		Group: "ingest",
	})
	if err != nil {
		log.Fatal(err)
	}
	for {
		fs := cl.PollFetches(ctx)
		if fs.IsClientClosed() || ctx.Err() != nil {
			return
		}
		for _, rec := range fs.Records() {
			// A key's first overflow records wait until the main group
			// has processed the key's earlier main records.
			if err := b.Wait(ctx, rec); err != nil {
				log.Fatal(err)
			}
			// process(rec)
		}
		if err := cl.CommitRecords(ctx, fs.Records()...); err != nil {
			log.Print(err)
		}
	}
}
