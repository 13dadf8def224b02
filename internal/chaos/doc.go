// Package chaos is Keyshard's chaos suite: real processes on one machine,
// random faults on a replayable schedule, and a checker over everything
// that happened. `keyshard chaos` runs it; internal/faulttest reuses its
// pieces for targeted fault tests, and `keyshard bench clients` its sink
// and workers.
//
// Workers come in every client language (Workers, Lang): the Go worker
// (`keyshard chaos worker`, RunWorker) and the Python and Node.js
// clients' worker scripts, which take the same flags and send the same
// records, stamped with the machine's monotonic clock (MonoNow), so that
// one record can hold workers of all three.
//
// The world of a run (Run):
//
//   - three etcd members, each its own process (`keyshard chaos etcd`, an
//     embedded etcd member), so that kill -9 of one is real;
//   - two `keyshard serve` replicas on that etcd, each reaching every etcd
//     member through its own fault Proxy (to cut a replica off from etcd);
//   - workers (`keyshard chaos worker`, RunWorker): each a client.Worker
//     that reaches the replicas through its own fault Proxy, claims every
//     bucket it is granted at the sink with the grant's fencing token and
//     writes to the sink with that token while it holds the bucket;
//   - the fenced Sink in the runner's process: it accepts a write only if
//     its token is at least the highest the bucket has seen (as `UPDATE
//     ... WHERE fence <= $token` would) and records every grant, release,
//     write and fault marker with its own clock.
//
// Faults come one at a time, drawn from the seed (the same seed draws the
// same kinds, targets and durations): kill -9 and SIGSTOP/SIGCONT of
// workers, replicas and etcd members, the etcd leader killed while a
// worker's drain hands buckets over, partitions, connection resets and
// latency through the proxies, and, as root, a worker's veth link taken
// down in its own network namespace. Each fault is proven to have taken
// effect (the process died of SIGKILL or is in state T, the member was
// the etcd leader and a handoff was in flight, the proxy held, delayed or
// reset connections, the link is down), healed, and then the runner waits
// until every bucket is served again.
//
// Analyze checks the whole record (Check: no overlapping holdings unless
// the earlier holder was stopped or killed, tokens strictly rising, late
// writes refused, writes only by the holder) and measures, per fault, the
// longest time a bucket went without an accepted write, against a bound
// (TTL + 1 s by default: every fault keeps an etcd quorum and one
// replica).
//
// Usage:
//
//	cfg := chaos.DefaultConfig()
//	cfg.Binary, cfg.Dir, cfg.Seed = keyshardBinary, tmpDir, 42
//	cfg.Progress = os.Stdout
//	rep, err := chaos.Run(ctx, cfg) // every process is gone when it returns
//	if err != nil { ... }           // the cluster could not run
//	rep.WriteText(os.Stdout)        // per fault kind: injected, proven, violations, unserved p50/p99
//	if !rep.OK() { ... }            // a safety violation
//
// Hand-made histories (ParseHistory, testdata/histories) pin down what
// the checker must reject and accept.
package chaos
