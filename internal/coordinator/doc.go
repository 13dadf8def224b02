// Package coordinator is the control plane's state machine: membership in,
// map epochs, grants and revocations out. It is pure, like etcd's raft:
// the leader's loop in internal/server owns one Machine, feeds it every
// change it observes in the store (as Events, with the current time) and
// applies the Actions it returns as fenced store transactions. Events and
// actions carry internal/shard's records, the values the store encodes, so
// nothing translates between the two. The machine reads no clock, does no
// IO and starts no goroutines, so the protocol is tested
// deterministically: testdata/*.txt are scripts run with datadriven
// (refresh with -rewrite and review the diff), and a random history test
// checks the guarantees under crashes, lost writes and leader failovers.
//
//	m := coordinator.New() // once elected
//	acts := m.StepAll([]coordinator.Event{coordinator.Reset{}, coordinator.KeyspacePut{...}, ...}, now)
//	for _, a := range acts { /* commit a; on failure Step(WriteFailed{a, err}) after a backoff */ }
//
// The protocol, the store layout and the reasoning behind them are in
// design.md beside this file.
//
// # Guarantees the machine keeps
//
//   - A bucket leaves a live holder only after that holder released it at
//     the token it holds, or after its session ended (etcd deleted the
//     lease) — never on a local timer. A session the machine revokes (drain
//     timeout, replaced by a re-join) leaves its buckets quarantined under a
//     lease of one TTL, so they move only once the old holder has fenced
//     itself.
//   - Every grant round takes a new token from the keyspace's counter, so a
//     bucket's tokens strictly increase.
//   - Each map is the placement.Balance of the previous one: minimal moves.
//     The instances of an import that have not joined yet count as members
//     until the import's deadline (reserve.go), so that their joining moves
//     nothing.
//   - In a stream keyspace, the round that takes a bucket from its holder
//     folds the bucket's position (the release's final one, or the
//     holder's committed one) into the keyspace's bucket positions, and a
//     grant starts at them, so a position moves with its bucket and never
//     back. A commit record of an ended session is folded and deleted
//     before its member's new session is granted anything, from the
//     unleased copy of the session's grants, so exactly even when this
//     machine never saw the grants (positions.go).
//
// # Lifecycle
//
// A Machine lives for one term of leadership: it acts on whatever it is
// fed. The leader's loop makes one once it is elected, steps it with a
// Reset and everything it loaded from the store in one StepAll (so that it
// plans from the whole state), then with every change; when the term ends
// it drops the Machine, and the store's fence rejects the writes that were
// still in flight. Reset clears the state before a reload, as after a
// resync of the watch.
package coordinator
