package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/client/stream"
)

// ErrOffsetOutOfRange: a PartitionReader was asked to read at an offset
// the partition does not have (below its log start, after retention or
// deletion, or above its end, after the topic was recreated). Positions
// committed for that partition point at records that no longer exist:
// an operator decides where to resume (keyshard positions reset).
var ErrOffsetOutOfRange = errors.New("kafka: offset out of range")

// PartitionReader reads one partition of a topic as the shared stream of
// a stream keyspace's workers (a client/stream.Reader): a record's
// position is its offset, so a bucket's committed position is the next
// offset to read for it, exactly what a Kafka consumer group commits.
//
// Each Read is one Fetch request to the partition's leader at the offset
// asked for: the two lanes of a stream.Consumer (the main one and a
// catch-up one further back) read through one PartitionReader without
// disturbing each other. At the end of the partition a Read waits up to
// MaxWait for new records, then returns none.
type PartitionReader struct {
	cl        *kgo.Client
	topic     string
	partition int32
	maxWait   time.Duration
	maxBytes  int32
	decomp    kgo.Decompressor

	// Where the partition lives, from the last metadata answer; Read is
	// called one call at a time, so these need no lock.
	known   bool
	leader  int32
	topicID [16]byte
}

// PartitionReaderConfig tunes a PartitionReader. Zero values take the
// defaults.
type PartitionReaderConfig struct {
	// MaxWait is how long a Read at the end of the partition waits for
	// new records (default 200ms, at most 30s).
	MaxWait time.Duration
	// MaxBytes bounds the records one Read returns (default 1 MiB). A
	// single record larger than this is still returned whole.
	MaxBytes int32
}

// NewPartitionReader returns a reader of partition of topic through cl.
// It does no IO: the partition's leader is looked up on the first Read.
// A nil client, an empty topic, a negative partition or an out-of-range
// setting is a *client.ArgError.
func NewPartitionReader(cl *kgo.Client, topic string, partition int32, cfg PartitionReaderConfig) (*PartitionReader, error) {
	fail := func(arg, reason string) error {
		return &client.ArgError{Func: "kafka.NewPartitionReader", Arg: arg, Reason: reason}
	}
	switch {
	case cl == nil:
		return nil, fail("cl", "is nil")
	case topic == "":
		return nil, fail("topic", "is empty")
	case partition < 0:
		return nil, fail("partition", fmt.Sprintf("%d is negative", partition))
	case cfg.MaxWait < 0 || cfg.MaxWait > 30*time.Second:
		return nil, fail("MaxWait", fmt.Sprintf("%v is outside [0, 30s]", cfg.MaxWait))
	case cfg.MaxBytes < 0:
		return nil, fail("MaxBytes", fmt.Sprintf("%d is negative", cfg.MaxBytes))
	}
	if cfg.MaxWait == 0 {
		cfg.MaxWait = 200 * time.Millisecond
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = 1 << 20
	}
	return &PartitionReader{cl: cl, topic: topic, partition: partition, maxWait: cfg.MaxWait, maxBytes: cfg.MaxBytes, decomp: kgo.DefaultDecompressor()}, nil
}

var _ stream.Reader = (*PartitionReader)(nil)

// locate looks up the partition's leader and the topic's id.
func (r *PartitionReader) locate(ctx context.Context) error {
	req := kmsg.NewPtrMetadataRequest()
	t := kmsg.NewMetadataRequestTopic()
	t.Topic = kmsg.StringPtr(r.topic)
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, r.cl)
	if err != nil {
		return fmt.Errorf("kafka: look up topic %q: %w", r.topic, err)
	}
	// A topic or partition that does not exist, or that the client may not
	// read, does not appear by reading again: a *ConfigError, as for
	// Router.Start. Errors Kafka calls retriable (a leader election) are
	// returned as they are.
	final := func(field, reason string, err error) error {
		var ke *kerr.Error
		if errors.Is(err, kerr.UnknownTopicOrPartition) || (errors.As(err, &ke) && !ke.Retriable) {
			return &ConfigError{Func: "PartitionReader.Read", Field: field, Reason: reason, Err: err}
		}
		return fmt.Errorf("kafka: %s: %w", reason, err)
	}
	for _, mt := range resp.Topics {
		if mt.Topic == nil || *mt.Topic != r.topic {
			continue
		}
		if err := kerr.ErrorForCode(mt.ErrorCode); err != nil {
			if errors.Is(err, kerr.UnknownTopicOrPartition) {
				return final("topic", fmt.Sprintf("%q: topic not found; create it or fix the name", r.topic), err)
			}
			return final("topic", fmt.Sprintf("%q", r.topic), err)
		}
		for _, mp := range mt.Partitions {
			if mp.Partition != r.partition {
				continue
			}
			if err := kerr.ErrorForCode(mp.ErrorCode); err != nil {
				return final("partition", fmt.Sprintf("%d of topic %q", r.partition, r.topic), err)
			}
			r.known, r.leader, r.topicID = true, mp.Leader, mt.TopicID
			return nil
		}
		return final("partition", fmt.Sprintf("%d: topic %q has %d partition(s); fix the partition or add partitions to the topic",
			r.partition, r.topic, len(mt.Partitions)), kerr.UnknownTopicOrPartition)
	}
	return final("topic", fmt.Sprintf("%q: topic not found; create it or fix the name", r.topic), kerr.UnknownTopicOrPartition)
}

// Read returns the partition's records from offset from on, in offset
// order, and the offset to read next. At the end of the partition it
// waits up to MaxWait and returns no records and next == from. A leader
// that moved is looked up again and the Read answers no records, so the
// caller simply reads again. Errors: ErrOffsetOutOfRange (an operator
// decides where to resume), a *ConfigError (ErrBadConfig, and
// kerr.UnknownTopicOrPartition or the broker's final error) for a topic or
// partition that does not exist or may not be read, ctx's, and the
// broker's others (reading again may pass). A stream.Consumer's Run
// returns them, wrapped.
func (r *PartitionReader) Read(ctx context.Context, from uint64) ([]stream.Record, uint64, error) {
	if from > 1<<63-1 {
		return nil, from, fmt.Errorf("%w: position %d is not a Kafka offset", ErrOffsetOutOfRange, from)
	}
	if !r.known {
		if err := r.locate(ctx); err != nil {
			return nil, from, err
		}
	}
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = int32(r.maxWait / time.Millisecond)
	req.MinBytes = 1
	req.MaxBytes = r.maxBytes
	req.IsolationLevel = 1 // read committed: never a record of an aborted transaction
	req.SessionEpoch = -1  // no fetch session
	t := kmsg.NewFetchRequestTopic()
	t.Topic, t.TopicID = r.topic, r.topicID
	p := kmsg.NewFetchRequestTopicPartition()
	p.Partition = r.partition
	p.FetchOffset = int64(from)
	p.PartitionMaxBytes = r.maxBytes
	p.CurrentLeaderEpoch = -1
	p.LogStartOffset = -1
	t.Partitions = append(t.Partitions, p)
	req.Topics = append(req.Topics, t)

	kresp, err := r.cl.Broker(int(r.leader)).Request(ctx, req)
	if err != nil {
		r.known = false // the broker may be gone: look the leader up again
		return nil, from, fmt.Errorf("kafka: fetch %s/%d at %d: %w", r.topic, r.partition, from, err)
	}
	resp := kresp.(*kmsg.FetchResponse)
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, from, fmt.Errorf("kafka: fetch %s/%d at %d: %w", r.topic, r.partition, from, err)
	}
	for _, rt := range resp.Topics {
		for i := range rt.Partitions {
			rp := &rt.Partitions[i]
			if rp.Partition != r.partition {
				continue
			}
			switch err := kerr.ErrorForCode(rp.ErrorCode); {
			case err == nil:
			case errors.Is(err, kerr.OffsetOutOfRange):
				return nil, from, fmt.Errorf("%w: %s/%d has offsets [%d, %d), not %d", ErrOffsetOutOfRange, r.topic, r.partition, rp.LogStartOffset, rp.HighWatermark, from)
			case errors.Is(err, kerr.NotLeaderForPartition), errors.Is(err, kerr.UnknownTopicID),
				errors.Is(err, kerr.FencedLeaderEpoch), errors.Is(err, kerr.UnknownLeaderEpoch),
				errors.Is(err, kerr.LeaderNotAvailable), errors.Is(err, kerr.UnknownTopicOrPartition):
				r.known = false
				return nil, from, nil
			default:
				return nil, from, fmt.Errorf("kafka: fetch %s/%d at %d: %w", r.topic, r.partition, from, err)
			}
			fp, next := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{
				Offset: int64(from), IsolationLevel: kgo.ReadCommitted(), Topic: r.topic, Partition: r.partition,
			}, rp, r.decomp, nil)
			if fp.Err != nil {
				return nil, from, fmt.Errorf("kafka: decode %s/%d at %d: %w", r.topic, r.partition, from, fp.Err)
			}
			recs := make([]stream.Record, 0, len(fp.Records))
			for _, kr := range fp.Records {
				if kr.Offset < int64(from) {
					continue
				}
				recs = append(recs, stream.Record{Key: kr.Key, Position: uint64(kr.Offset), Payload: kr.Value})
			}
			return recs, max(from, uint64(next)), nil
		}
	}
	return nil, from, nil
}
