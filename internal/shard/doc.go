// Package shard is the vocabulary of Keyshard's control plane: the records
// the coordinator decides over and the store persists. A keyspace's
// configuration, a member's record, a drain request, a map epoch, a
// member's grants and releases, a quarantine: each is declared once here,
// and both sides use it, the way etcd-raft's raftpb serves raft and its
// storage alike.
//
// The package is pure: plain values and their modes, no IO, no clock reads,
// no goroutines (a dependency test keeps it so). How a record is encoded,
// validated against the store's limits and laid out under keys is
// internal/store's business; how records change is internal/coordinator's.
// A new kind of record (a stream position, a tenant pool) is added here
// once, then encoded by the store and observed by the coordinator.
//
//	k := shard.Keyspace{Name: "rooms", Buckets: 4096, Hash: placement.HashXXH64, Mode: shard.ModeExclusive, LeaseTTL: 10 * time.Second}
//	b, err := store.EncodeKeyspace(k)                   // the stored form
//	acts := m.Step(coordinator.KeyspacePut{Keyspace: k}, now) // the coordinator's input
//
// # Lifecycle
//
// Records are values: nothing here starts, owns or closes anything. Many
// hold slices or maps, so treat a record you did not build as read-only:
// the store's snapshots and the coordinator's events may share them.
package shard
