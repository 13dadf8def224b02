package kafka

import (
	"context"
	"errors"
	"fmt"
	"net"
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
//
// A Read that fails in a way reading again may fix (a leader election, a
// leader that moved, a broker restarting or unreachable, a request that
// timed out) returns an error wrapping stream.ErrTransient, so that a
// stream.Consumer or stream.Worker backs off and reads again instead of
// stopping; a topic or partition that does not exist or may not be read
// (a *ConfigError) and ErrOffsetOutOfRange stop it at once. See Read.
type PartitionReader struct {
	cl        *kgo.Client
	topic     string
	partition int32
	maxWait   time.Duration
	maxBytes  int32
	decomp    kgo.Decompressor

	// Where the partition lives, from the last metadata answer, and
	// whether Kafka answered a request of the reader yet; Read is called
	// one call at a time, so these need no lock.
	known    bool
	leader   int32
	topicID  [16]byte
	answered bool
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
		return r.requestFailed(fmt.Errorf("kafka: look up %s/%d: %w", r.topic, r.partition, err))
	}
	r.answered = true
	// A topic or partition that does not exist, or that the client may not
	// read, does not appear by reading again: a *ConfigError, as for
	// Router.Start. Errors Kafka calls retriable (a leader election) are
	// transient: the stream.Consumer reads again after a pause.
	final := func(field, reason string, err error) error {
		var ke *kerr.Error
		if errors.Is(err, kerr.UnknownTopicOrPartition) || (errors.As(err, &ke) && !ke.Retriable) {
			return &ConfigError{Func: "PartitionReader.Read", Field: field, Reason: reason, Err: err}
		}
		return stream.Transient(fmt.Errorf("kafka: look up %s/%d: %w", r.topic, r.partition, err))
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
			if mp.Leader < 0 { // no leader, and no error said so
				return final("partition", "", kerr.LeaderNotAvailable)
			}
			r.known, r.leader, r.topicID = true, mp.Leader, mt.TopicID
			return nil
		}
		return final("partition", fmt.Sprintf("%d: topic %q has %d partition(s); fix the partition or add partitions to the topic",
			r.partition, r.topic, len(mt.Partitions)), kerr.UnknownTopicOrPartition)
	}
	return final("topic", fmt.Sprintf("%q: topic not found; create it or fix the name", r.topic), kerr.UnknownTopicOrPartition)
}

// requestFailed returns err, the error of a request that got no answer,
// marked transient (stream.ErrTransient) when sending it again may get
// one: a broker that is down, restarting or unreachable (a connection
// refused, reset or closed, a name that does not resolve yet), a request
// that timed out, a retriable Kafka error. A closed client, a Kafka error
// that is not retriable (a SASL authentication that failed) and anything
// else the client does not call retriable are not. A connection closed
// as soon as a request was sent (kgo.ErrFirstReadEOF) is transient once
// the cluster has answered the reader: before, it is more likely the
// SASL or TLS configuration kgo's message suspects.
func (r *PartitionReader) requestFailed(err error) error {
	if retriableRequestErr(err) {
		return stream.Transient(err)
	}
	if _, ok := errors.AsType[*kgo.ErrFirstReadEOF](err); ok && r.answered {
		return stream.Transient(err)
	}
	return err
}

func retriableRequestErr(err error) bool {
	if errors.Is(err, kgo.ErrClientClosed) || errors.Is(err, context.Canceled) {
		return false
	}
	if ke, ok := errors.AsType[*kerr.Error](err); ok {
		return ke.Retriable
	}
	if kgo.IsRetryableBrokerErr(err) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	_, ok := errors.AsType[net.Error](err) // a dial refused, a timeout, a name not resolved: a broker down or restarting
	return ok
}

// Read returns the partition's records from offset from on, in offset
// order, and the offset to read next. At the end of the partition it
// waits up to MaxWait and returns no records and next == from.
//
// Errors that reading again may fix wrap stream.ErrTransient, so a
// stream.Consumer (and a stream.Worker) backs off and reads again instead
// of stopping: a partition without a leader (an election), a leader that
// moved (the next Read looks it up again), a broker that cannot be
// reached or dropped the connection, a request that timed out, and every
// other error Kafka calls retriable (kerr.IsRetriable). The others stop
// the Consumer, whose Run returns them wrapped: ErrOffsetOutOfRange (an
// operator decides where to resume), a *ConfigError (ErrBadConfig, and
// kerr.UnknownTopicOrPartition or the broker's final error, such as
// kerr.TopicAuthorizationFailed) for a topic or partition that does not
// exist or may not be read, a closed client, records that cannot be
// decoded, and ctx's.
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

	failed := func(err error) error {
		return fmt.Errorf("kafka: fetch %s/%d at %d from broker %d: %w", r.topic, r.partition, from, r.leader, err)
	}
	kresp, err := r.cl.Broker(int(r.leader)).Request(ctx, req)
	if err != nil {
		r.known = false // the broker may be gone: look the leader up again
		if err.Error() == "unknown broker" {
			// kgo's errUnknownBroker, which it does not export: the
			// cluster's metadata no longer has the leader we found.
			return nil, from, stream.Transient(failed(err))
		}
		return nil, from, r.requestFailed(failed(err))
	}
	r.answered = true
	resp := kresp.(*kmsg.FetchResponse)
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		if kerr.IsRetriable(err) {
			r.known = false
			return nil, from, stream.Transient(failed(err))
		}
		return nil, from, failed(err)
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
			case kerr.IsRetriable(err):
				// The leader moved (NOT_LEADER_FOR_PARTITION, a fenced
				// epoch), is being elected, or the topic was recreated
				// (UNKNOWN_TOPIC_ID): look it up again, after a pause. A
				// topic or partition that is gone is a *ConfigError then.
				r.known = false
				return nil, from, stream.Transient(failed(err))
			case errors.Is(err, kerr.TopicAuthorizationFailed):
				return nil, from, &ConfigError{Func: "PartitionReader.Read", Field: "topic", Reason: fmt.Sprintf("%q", r.topic), Err: err}
			default:
				return nil, from, failed(err)
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
