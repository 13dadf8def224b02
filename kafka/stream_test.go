package kafka

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/client/stream"
	"github.com/keyshard/keyshard/placement"
)

// streamEnv starts a one-broker kfake cluster with a one-partition topic
// holding n keyed records, key i%10, value i.
func streamEnv(t *testing.T, n int) *kgo.Client {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "events"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("events"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Key: fmt.Appendf(nil, "k%d", i%10), Value: fmt.Appendf(nil, "%d", i)}
	}
	if err := cl.ProduceSync(testCtx(t), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return cl
}

func TestPartitionReaderReadsOffsetsAsPositions(t *testing.T) {
	ctx := testCtx(t)
	cl := streamEnv(t, 500)
	r, err := NewPartitionReader(cl, "events", 0, PartitionReaderConfig{MaxWait: 10 * time.Millisecond, MaxBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	var got []stream.Record
	for pos := uint64(0); pos < 500; {
		recs, next, err := r.Read(ctx, pos)
		if err != nil {
			t.Fatal(err)
		}
		if next < pos || (len(recs) > 0 && next != recs[len(recs)-1].Position+1) {
			t.Fatalf("Read(%d) = %d records, next %d", pos, len(recs), next)
		}
		got = append(got, recs...)
		pos = next
	}
	if len(got) != 500 {
		t.Fatalf("read %d records, want 500", len(got))
	}
	for i, rec := range got {
		if rec.Position != uint64(i) || string(rec.Key) != fmt.Sprintf("k%d", i%10) || string(rec.Payload) != fmt.Sprint(i) {
			t.Fatalf("record %d = %d %q %q", i, rec.Position, rec.Key, rec.Payload)
		}
	}

	// Reads go back and forth, as a main and a catch-up lane do.
	recs, _, err := r.Read(ctx, 123)
	if err != nil || len(recs) == 0 || recs[0].Position != 123 {
		t.Fatalf("Read(123) = %d records, first %v, %v", len(recs), recs, err)
	}
	recs, next, err := r.Read(ctx, 500)
	if err != nil || len(recs) != 0 || next != 500 {
		t.Fatalf("Read at the end = %d records, next %d, %v; want none, 500", len(recs), next, err)
	}
	if _, _, err := r.Read(ctx, 10_000); !errors.Is(err, ErrOffsetOutOfRange) {
		t.Fatalf("Read past the end: %v, want ErrOffsetOutOfRange", err)
	}
}

func TestPartitionReaderErrors(t *testing.T) {
	ctx := testCtx(t)
	cl := streamEnv(t, 1)
	for _, tc := range []struct {
		name      string
		cl        *kgo.Client
		topic     string
		partition int32
		cfg       PartitionReaderConfig
		arg       string
	}{
		{"nil client", nil, "events", 0, PartitionReaderConfig{}, "cl"},
		{"empty topic", cl, "", 0, PartitionReaderConfig{}, "topic"},
		{"negative partition", cl, "events", -1, PartitionReaderConfig{}, "partition"},
		{"long wait", cl, "events", 0, PartitionReaderConfig{MaxWait: time.Minute}, "MaxWait"},
	} {
		_, err := NewPartitionReader(tc.cl, tc.topic, tc.partition, tc.cfg)
		var ae *client.ArgError
		if !errors.As(err, &ae) || ae.Arg != tc.arg || !errors.Is(err, client.ErrInvalid) {
			t.Errorf("%s: %v, want an ArgError naming %s", tc.name, err, tc.arg)
		}
	}
	r, _ := NewPartitionReader(cl, "events", 3, PartitionReaderConfig{})
	if _, _, err := r.Read(ctx, 0); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), `partition 3: topic "events" has 1 partition(s)`) {
		t.Errorf("Read of a missing partition: %v", err)
	}
}

// A stream.Consumer on a PartitionReader: a bucket gained behind the main
// position is caught up from its from and merged, each key in order.
func TestPartitionReaderUnderConsumer(t *testing.T) {
	cl := streamEnv(t, 400)
	r, err := NewPartitionReader(cl, "events", 0, PartitionReaderConfig{MaxWait: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	h, err := placement.NewHasher(placement.HashXXH64, 8)
	if err != nil {
		t.Fatal(err)
	}
	flow, err := stream.NewFlow(h, 200)
	if err != nil {
		t.Fatal(err)
	}
	bucketOf := func(k string) int { return h.Bucket([]byte(k)) }
	gained := bucketOf("k3")
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	last := map[string]uint64{}
	var handled int
	c, err := stream.NewConsumer(flow, r, func(_ context.Context, rec stream.Record) error {
		k := string(rec.Key)
		if p, ok := last[k]; ok && rec.Position <= p {
			return fmt.Errorf("key %s at %d after %d", k, rec.Position, p)
		}
		last[k] = rec.Position
		if bucketOf(k) != gained {
			return fmt.Errorf("record of bucket %d, not gained", bucketOf(k))
		}
		if handled++; handled == 40*countIn(gained, bucketOf) {
			cancel()
		}
		return nil
	}, stream.ConsumerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Gain(stream.BucketPosition{Bucket: gained, Position: 0}); err != nil {
		t.Fatal(err)
	}
	if err := c.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	for i := range 10 {
		k := fmt.Sprintf("k%d", i)
		if bucketOf(k) == gained && last[k] != uint64(390+i) {
			t.Errorf("key %s: last handled %d, want %d", k, last[k], 390+i)
		}
	}
}

// countIn counts the keys k0..k9 in bucket b.
func countIn(b int, bucketOf func(string) int) int {
	n := 0
	for i := range 10 {
		if bucketOf(fmt.Sprintf("k%d", i)) == b {
			n++
		}
	}
	return n
}
