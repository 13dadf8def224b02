// Package faulttest holds Keyshard's fault tests with real processes and
// sockets: `keyshard serve` replicas and worker processes (`keyshard
// chaos worker`, a client.Worker writing to the sink) are started as
// child processes, paused with SIGSTOP, killed with SIGKILL and
// restarted, while every worker reports its grants and releases to a
// fenced test sink in the test process and writes to it with the grant's
// fencing token. The sink, its checker, process control and the proxy
// are internal/chaos's, which runs the same pieces as a random chaos
// suite (`keyshard chaos`).
//
// The sink behaves as a database guarded by `WHERE fence <= $token`: per
// bucket it keeps the highest token it has seen (from a new owner's claim
// at Acquire, or from a write) and refuses, with HTTP 409, anything older.
// After each fault the tests wait until the system has converged and check
// the whole record: grants of one bucket never overlap unless the previous
// holder was paused or killed (and then none of its late writes was
// accepted), tokens strictly increase per bucket, no write comes from a
// worker that does not hold the bucket at that token, and every bucket has
// a live holder that is writing.
//
// TestMixedLanguageCluster runs workers of every client language (see
// chaos.Workers: the Go worker and the Python and Node clients' worker
// scripts) on one keyspace through the same faults.
//
// The package has only tests; they take about a minute and are skipped
// with -short. Set KEYSHARD_TEST_LOG=1 to stream the children's logs.
package faulttest
