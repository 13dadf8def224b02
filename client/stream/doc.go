// Package stream holds the building blocks of a stream worker: a worker
// that reads one shared, ordered stream (a Kafka partition, a Postgres
// table ordered by a stream id, Synapse's events by stream_ordering) and
// handles the records whose key falls in the buckets it holds. In a
// stream keyspace the position belongs to the bucket: a grant carries the
// bucket's last committed position (from), and a commit sends a default
// position for the buckets that are caught up plus exceptions for those
// that are not.
//
// Flow, Consumer and Waker do no IO of their own and do not know the
// server: the stream is read through a Reader the caller provides, time
// through a clock.Clock. Worker joins a keyspace through a
// client.Client.
//
// # Catch-up, then merge
//
// A worker reads the stream at its position. A bucket it gains usually
// comes with an older from: a Flow then reads a second lane, from the
// oldest such from, that delivers only the records of the buckets still
// behind, and merges them into the main lane once it reaches the main
// position. Each key's records are delivered in stream order, none of a
// held bucket after its from is skipped and none is delivered twice:
//
//	h, _ := placement.NewHasher(placement.HashXXH64, 4096) // the keyspace's
//	f, err := stream.NewFlow(h, mainPos)                      // no IO
//	f.Gain(stream.BucketPosition{Bucket: 7, Position: grantFrom})
//	err = f.Main(from, recs, next, deliver)         // a batch of the main lane
//	merged, err := f.Catchup(from, recs, next, deliver) // of the catch-up lane
//	def, except := f.Progress()                     // what to commit
//
// Flow is the pure state; Consumer runs it with a Reader and a handler,
// on one goroutine, and is safe to Gain, Lose and Progress from others.
//
// # A stream worker
//
// Worker puts it together: a client.Worker in a stream keyspace whose
// Handler gains each granted bucket into a Consumer at its grant's From,
// loses each bucket asked back and releases it with its final position,
// commits Progress every CommitInterval and once more at Close, and runs
// the wake hook after gains. The user writes a Reader and a function
// that handles one record:
//
//	w, err := stream.NewWorker(c, "federation", client.Member{ID: "sender-1"},
//		reader, func(ctx context.Context, r stream.Record) error {
//			return send(ctx, r) // once it returns nil, r counts as processed
//		}, stream.WorkerOptions{})
//	go w.Run(ctx)
//	...
//	w.Close(ctx) // commit, hand every bucket over at its final position, leave
//
// A commit never covers a bucket at a position past a record of it that
// was not handled: a granted bucket not gained yet, one catching up or
// one just lost is listed with its own position (see Worker).
//
// # Transient read errors
//
// A Reader says that an error of Read may pass by reading again (a
// broker in a leader election, a connection that broke, a request that
// timed out, a database failing over) by wrapping ErrTransient, with
// Transient or fmt.Errorf's %w; it is the one rule for every Reader, and
// kafka.PartitionReader follows it. A Consumer, and so a Worker, then
// keeps its buckets, waits with capped exponential backoff on its clock
// (Retry: by default up to 100ms after a first failure, doubling to 10s)
// and reads again at the position it needs then, for as long as the
// errors last: nothing is skipped or handled twice, and a stream down for
// minutes does not stop the worker. Each retry is counted
// (ConsumerStats.ReadRetries, Consumer.Stats, Worker.Stats) and logged at
// warn level with the failures in a row so far, how long they have
// lasted, and the error; the current streak and the last error are in
// the stats too. Any other Read error stops Run, as does any error of
// the handle function, whatever it wraps:
//
//	func (e *events) Read(ctx context.Context, from uint64) ([]stream.Record, uint64, error) {
//		rows, err := e.db.QueryContext(ctx, query, from)
//		if isConnectionError(err) {
//			return nil, from, stream.Transient(err) // the Consumer waits and reads again
//		}
//		...
//	}
//
// # Waking pending work
//
// After gaining buckets a sender must wake the work that was pending for
// their keys (Synapse's _wake_destinations_needing_catchup). A Waker
// pages through candidates, keeps those of the gained buckets and calls
// a wake function at a configured rate. Its cursor always moves past
// every candidate it read, kept or not, so a page that is filtered out
// whole is never read again.
//
// # Lifecycle
//
// Constructors (NewFlow, NewConsumer, NewWaker, NewWorker) check their
// arguments, do no IO and start no goroutine; a bad one is a
// *client.ArgError, which wraps client.ErrInvalid. Run does the work on
// the caller's goroutine and returns when done, when ctx ends
// (ctx.Err()) or on Close (client.ErrClosed), which also end a wait
// between two Reads at once. Close stops Run, waits until it has
// returned, and is idempotent. Worker follows client.Worker instead: its
// Close(ctx) drains gracefully and Run then returns nil.
package stream
