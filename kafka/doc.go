// Package kafka is Keyshard's Kafka adapter. The overflow router routes
// keyed records to a main or an overflow topic by a hotkey.Policy and
// produces them with a franz-go client, and its Barrier lets consumers of
// either lane honour the order of a key that moves between lanes. A
// PartitionReader reads one partition as the shared stream of a stream
// keyspace's workers (client/stream): a record's position is its offset,
// and a bucket's committed position is the next offset to read for it.
//
// It is a module of its own, github.com/keyshard/keyshard/kafka, so that
// programs using the SDK (package client) do not depend on franz-go or
// the Prometheus client; it depends on the SDK, never on the server.
//
// # Guarantees
//
//   - The key is kept. Records are partitioned the way Kafka's Java client
//     does it by default, toPositive(murmur2(key)) % partitions (see
//     KeyPartition), so producers in any language agree on where a key
//     lives, and a hot key lands on one overflow partition rather than all
//     of them. NewRouter checks the client's partitioner: franz-go's
//     default and kgo.StickyKeyPartitioner(nil) qualify. Only a "spread"
//     rule (or PolicyConfig.SpreadDetected) sends a key to random
//     partitions; its Kafka key is then moved to the HeaderKey header.
//   - Nothing is dropped silently. A record without a key fails with
//     ErrMissingKey, or gets a key from Config.KeyFunc. A record a drop rule
//     matches fails with ErrDropped and is counted. A record sent before
//     Start or after Close fails with ErrNotStarted or ErrClosed.
//   - Every send resolves, exactly once, within Config.SendTimeout: with
//     nil once the broker acknowledged it, or with an error. A broker that
//     never answers yields ErrTimeout (the record may still be written
//     later; Stats.LateAcks counts those).
//   - Per-key order holds across lanes, and main and overflow consumers
//     never process one key at the same time, through two drain barriers:
//     a key entering overflow waits until the main records of that key
//     already sent are acknowledged, and its first overflow records carry
//     HeaderWaitMain, the main position the overflow consumer must wait
//     for; a key leaves overflow only once the overflow consumer group
//     (Config.OverflowGroup) has committed past its last overflow record,
//     read with the Kafka admin API, and its first main record carries
//     HeaderWaitOverflow when that record's decision releases it (a key
//     that Refresh releases needs none: every overflow record of it is
//     committed by then). Consumers honour both headers with a Barrier,
//     and must commit an offset only after processing the records before
//     it.
//   - Every outcome is counted (Stats, and Prometheus metrics through
//     Config.Registerer), and the overflow backlog is exported per
//     partition (keyshard_overflow_backlog_messages{partition}), with a
//     logged warning when a partition's unconsumed bytes approach the
//     topic's retention.bytes.
//
// The barriers cover the records this router produced: producers that
// route the same keys should share one router, or accept that a key hot in
// several processes is ordered per process. The kill switch
// (Router.SetEnabled(false)) sends everything to main at once and waives
// the barriers, as hotkey.Policy.SetEnabled documents. Keys beyond
// hotkey.PolicyConfig.MaxOverflowKeys that a rule forces to overflow pass
// no barrier (Stats.Untracked).
//
// # Usage
//
//	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...),
//		kgo.RecordDeliveryTimeout(10*time.Second)) // the default partitioner is murmur2
//	if err != nil { return err }
//	defer cl.Close()
//	r, err := kafka.NewRouter(cl, kadm.NewClient(cl), kafka.Config{
//		MainTopic: "events", OverflowTopic: "events-overflow", OverflowGroup: "ingest-overflow",
//		Policy: hotkey.PolicyConfig{Detector: hotkey.DetectorConfig{Threshold: 1000, MaxTotalRate: 200_000}},
//	})
//	if err != nil { return err } // a *ConfigError (ErrBadConfig) naming the field; nothing was sent
//	defer r.Close()
//	if err := r.Start(ctx); err != nil { return err } // loads the topics; a missing one: a *ConfigError naming it
//	r.Produce(ctx, &kgo.Record{Key: distinctID, Value: event}, func(rec *kgo.Record, err error) {
//		// exactly once: nil, ErrMissingKey, ErrDropped, ErrTimeout or the client's error
//	})
//
// and in the overflow lane's consumer (the main lane's is symmetrical):
//
//	b, err := kafka.NewBarrier(adm, kafka.BarrierConfig{Lane: kafka.Overflow, Topic: "events", Group: "ingest"})
//	for _, rec := range fetches.Records() {
//		if err := b.Wait(ctx, rec); err != nil { return err } // until main has committed past its header
//		process(rec)
//	}
//	cl.CommitRecords(ctx, fetches.Records()...) // after processing
//
// # Cluster-wide hot keys
//
// A key spread evenly over many producers may be hot in total while no
// producer sees it hot. With Config.ClusterHotKeys the router takes part
// in cluster-wide detection through Keyshard's control plane: a goroutine
// it owns reports, every Interval, the detector's keys whose local rate
// (its upper bound: hotkey.Detector.AppendAbove) is at or above the
// pool's report threshold, and follows the pool's cluster overflow set,
// which the control plane's leader computes from every producer's
// reports. Each newer set is installed with ApplyClusterSet (which tests,
// and other sources of sets, may call directly): its keys go to overflow
// with every guarantee above (key kept, one overflow partition, both drain
// barriers, nothing lost), and a key that leaves the set returns to main
// only once its overflow records are committed.
//
//	kc, err := client.Dial("http://keyshard:7400", client.Token(token))
//	r, err := kafka.NewRouter(cl, adm, kafka.Config{
//		...,
//		ClusterHotKeys: &kafka.ClusterHotKeysConfig{Client: kc, Pool: "events", Producer: hostname},
//	})
//	err = r.Start(ctx) // the sync starts with the router; it does not delay Start
//
// It fails open: sends never wait for the control plane, only for the
// router's lock, which the sync holds to scan the detector and to install
// a set; while the control plane is unreachable, or the pool is unknown,
// the set in force stays, the sync logs what to do and retries with
// backoff, and Stats().Cluster and the keyshard_router_cluster_* metrics
// count the failures. Keys longer than the detector's MaxKeyLen cannot be
// reported by name (Stats().Cluster.TruncatedKeys counts them). The kill
// switch sends the set's keys to main like every other overflow key.
//
// # Errors
//
// Every error the package returns that a caller may act on wraps one of
// its sentinels; test with errors.Is. Messages say what is wrong and what
// to do; do not parse them.
//
//   - ErrBadConfig: retrying cannot fix it; fix the configuration or the
//     cluster. The error is a *ConfigError: errors.As gives the function
//     (Func) and the argument or field as the caller writes it (Field:
//     "Config.OverflowTopic", "BarrierConfig.Group",
//     "kgo.RecordPartitioner", or a PartitionReader's "topic" or
//     "partition"). It also wraps its cause: kerr.UnknownTopicOrPartition
//     for a topic or partition that does not exist (from Router.Start, or
//     from PartitionReader.Read, so a stream.Consumer's Run returns it),
//     kerr's error for one the client may not read, hotkey.ErrBadConfig
//     for Config.Policy, the SDK's *client.ArgError for
//     Config.ClusterHotKeys, the registry's error for Config.Registerer.
//   - ErrNotStarted, ErrClosed: a send, Refresh or Start came before
//     Start or after Close; nothing was produced. Router.Start called
//     again after it succeeded, or while another Start runs, returns an
//     error wrapping client.ErrInvalid, as the SDK's Run called twice.
//   - ErrMissingKey, ErrDropped, ErrNoDeadLetterTopic: that record was
//     not produced, by the policy or for want of a key; the router goes
//     on.
//   - ErrTimeout: no answer within Config.SendTimeout; the record may
//     still be written (Stats.LateAcks).
//   - ErrBadHeader: Barrier.Wait met a barrier header it cannot parse.
//   - ErrOffsetOutOfRange: a PartitionReader was asked for an offset the
//     partition no longer (or not yet) has; an operator decides where to
//     resume (keyshard positions reset).
//   - stream.ErrTransient (the SDK's): PartitionReader.Read failed in a
//     way reading again may fix, such as a leader election or a broker
//     restart; a stream.Consumer or stream.Worker waits and reads again
//     instead of stopping (see "Reading a partition through a broker
//     fault").
//
// Anything else comes from the Kafka client or a broker (kerr's errors,
// with kerr.IsRetriable), or is ctx's: Start retries what may pass by
// waiting until its ctx ends, then wraps ctx.Err() and the last failure.
// Keyspace membership is the SDK's business, not this package's: a lost
// session, a bucket not held at a commit's token, or a commit that would
// move a position backwards come back from stream.Worker.Commit (and
// WorkerOptions.OnCommit) as the client package's ErrSessionLost,
// ErrNotHeld and ErrBackwards, whatever its Reader.
//
// # Reading a partition through a broker fault
//
// A PartitionReader marks the errors that reading again may fix with
// stream.ErrTransient, the one rule of every stream.Reader, and a
// stream.Consumer (so a stream.Worker) rides them out: it keeps its
// buckets, waits with capped exponential backoff on its clock
// (stream.Retry: up to 100ms after a first failure, doubling to 10s by
// default), and reads again at the same position, for as long as the
// fault lasts, so nothing is skipped or handled twice. Transient are: no
// leader (LEADER_NOT_AVAILABLE, an election), a leader that moved
// (NOT_LEADER_FOR_PARTITION, FENCED_LEADER_EPOCH, UNKNOWN_TOPIC_ID: the
// next Read looks it up again, and a topic or partition found gone then
// is a *ConfigError), every other error kerr calls retriable
// (REQUEST_TIMED_OUT, ...), at the top level of a Fetch or for the
// partition, and a request that got no answer because the broker is
// down, restarting or unreachable (a connection refused, reset or closed,
// a timeout). A connection closed as soon as the request was sent
// (kgo.ErrFirstReadEOF) is transient only once Kafka has answered the
// reader: before, it more likely means the SASL or TLS configuration is
// wrong. What stops Run at once, with the error it had before, is what
// reading again cannot fix: a *ConfigError for a topic or partition that
// does not exist (kerr.UnknownTopicOrPartition, Field "topic" or
// "partition") or that the client may not read
// (kerr.TopicAuthorizationFailed, Field "topic"), ErrOffsetOutOfRange, a
// closed kgo client, records that cannot be decoded, and ctx's error.
//
// Every retry is counted (stream.ConsumerStats.ReadRetries, through
// Consumer.Stats or Worker.Stats) and logged at warn level with the lane,
// the position, the failures in a row so far, how long the streak has
// lasted and the error; a streak that ends is logged once at info level.
// Stats also has the current streak (Streak, FailingSince) and the last
// error, for an alert on a partition that cannot be read for long. To
// export the count to Prometheus:
//
//	prometheus.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
//		Name: "keyshard_stream_read_retries_total",
//		Help: "Reads of the stream that failed with a transient error and were tried again.",
//	}, func() float64 { return float64(w.Stats().ReadRetries) }))
//
// # Lifecycle and threading
//
// A Router has the shape of the SDK's long-lived types (see "Lifecycle"
// in the client package). NewRouter checks its arguments and the
// configuration; it does no IO and starts no goroutine. Start loads the
// topics' metadata, retrying while Kafka cannot be reached until its ctx
// ends but failing at once for a missing topic, registers the metrics and
// starts two goroutines: the refresh loop (every Config.RefreshInterval it
// runs Refresh: committed offsets, drain, sweep, backlog, partition count)
// and the one that times out sends; with Config.ClusterHotKeys, a third
// runs the cluster hot-key sync. Start returns once the router routes;
// until then Produce resolves with ErrNotStarted. Unlike the SDK's
// Router.Start, a failed Start leaves the router as NewRouter returned it,
// to be started again. Produce, ProduceSync, Flush, Refresh, Stats,
// SetEnabled, SetRules, ApplyClusterSet and WaitClusterVersion are safe
// for concurrent use. A promise is called from Produce's own goroutine
// (errors found before producing), from the client's promise goroutine,
// or from the router's timeout goroutine; it must not block, nor call
// ProduceSync, Flush or Close. Close stops accepting sends, waits until
// every accepted send has resolved (at most SendTimeout), stops the
// goroutines and unregisters the metrics; it is idempotent and needs no
// Start (Start after Close returns ErrClosed). The router does not own the
// Kafka clients, nor the Keyshard client: close them after the router.
package kafka
