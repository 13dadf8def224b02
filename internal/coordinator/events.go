package coordinator

import "github.com/keyshard/keyshard/internal/shard"

// Event is an observed change of the store, or the passing of time. The
// server feeds events in the order the store's watch delivered them.
type Event interface{ isEvent() }

// KeyspacePut: a keyspace was created or its configuration changed.
type KeyspacePut struct{ Keyspace shard.Keyspace }

// KeyspaceDeleted: a keyspace is gone, with everything in it.
type KeyspaceDeleted struct{ Name string }

// MemberPut: a member joined, or its record changed (a re-join under the
// same id has a new Session).
type MemberPut struct {
	Keyspace string
	Member   shard.Member
}

// MemberDeleted: a member's record is gone: it left, or its session ended.
type MemberDeleted struct{ Keyspace, ID string }

// DrainPut: a drain request for a member. Session is the session the
// request is bound to (the lease of its key; it vanishes with it), or 0
// for the member's current one: a request of a session the member has
// replaced does not apply to the new one.
type DrainPut struct {
	Keyspace, ID string
	Drain        shard.Drain
	Session      shard.LeaseID
}

// DrainDeleted: a drain request was withdrawn.
type DrainDeleted struct{ Keyspace, ID string }

// MapPut: a map was written.
type MapPut struct {
	Keyspace string
	Map      shard.Map
	Rev      Rev
}

// GrantsPut: a member's grants were written.
type GrantsPut struct {
	Keyspace, ID string
	Grants       shard.Grants
	Rev          Rev
}

// GrantsDeleted: a member's grants are gone, because its session ended
// (etcd deleted the lease) or the leader cleared them.
type GrantsDeleted struct{ Keyspace, ID string }

// ReleasesPut: a member released buckets (at the tokens it held them by).
type ReleasesPut struct {
	Keyspace, ID string
	Releases     shard.Releases
	Rev          Rev
}

// ReleasesDeleted: a member's releases are gone.
type ReleasesDeleted struct{ Keyspace, ID string }

// TokensPut: the keyspace's token counter was written.
type TokensPut struct {
	Keyspace string
	Token    uint64
	Rev      Rev
}

// QuarantinePut: buckets of a revoked session that must not be granted
// while the quarantine key lives (it is bound to its own lease of one
// lease TTL, so etcd, not a local timer, decides when it ends).
type QuarantinePut struct {
	Keyspace, ID string
	Quarantine   shard.Quarantine
}

// QuarantineDeleted: a quarantine ended.
type QuarantineDeleted struct{ Keyspace, ID string }

// CommitPut: a member's commit record of stream positions was written
// (stream keyspaces only). The record outlives the session that wrote it.
type CommitPut struct {
	Keyspace, ID string
	Commit       shard.Commit
	Rev          Rev
}

// CommitDeleted: a member's commit record is gone (the leader folded it).
type CommitDeleted struct{ Keyspace, ID string }

// BucketPosPut: piece Chunk of a stream keyspace's bucket positions (the
// buckets [Chunk*shard.PositionChunk, (Chunk+1)*shard.PositionChunk)) was
// written.
type BucketPosPut struct {
	Keyspace  string
	Chunk     int
	Positions shard.BucketPositions
	Rev       Rev
}

// BucketPosDeleted: piece Chunk of the bucket positions is gone: all its
// buckets are at 0.
type BucketPosDeleted struct {
	Keyspace string
	Chunk    int
}

// HeldPut: the copy of a member's grants in a stream keyspace was
// written (by the leader, with the grants). It has no lease: it outlives
// the session whose grants it copies.
type HeldPut struct {
	Keyspace, ID string
	Held         shard.Held
	Rev          Rev
}

// HeldDeleted: the copy of a member's grants is gone (the leader folded
// its session's commit record, or the session ended or holds nothing).
type HeldDeleted struct{ Keyspace, ID string }

// ReservationPut: a keyspace's reservation, the imported instances the
// leader still waits for, was written (by the import, or by the leader
// as instances join).
type ReservationPut struct {
	Keyspace    string
	Reservation shard.Reservation
	Rev         Rev
}

// ReservationDeleted: a keyspace's reservation is over.
type ReservationDeleted struct{ Keyspace string }

// Tick: time passed; deadlines (drain timeouts, quarantines,
// reservations) are checked.
type Tick struct{}

// Reset replaces everything the machine knows, after a (re)load of the
// store at one revision, as after a watch was compacted or restarted.
type Reset struct{}

// WriteFailed: the server could not apply an action: a key it expects
// moved (a conflict), a put is bound to a lease that is gone, or the store
// did not answer in time (the write may still apply). A fenced write is
// not reported: it ends the term. The machine forgets the action was in
// flight and plans again, in the same step, from what it knows.
//
// Nothing is reloaded. The watch delivers whatever changed, including the
// failed write should it apply after all, and a write planned while the
// watch is behind expects revisions that have moved, so it conflicts
// instead of applying. The server steps WriteFailed after a backoff, which
// gives the watch time to catch up.
type WriteFailed struct {
	Action Action
	Err    error
}

func (KeyspacePut) isEvent()        {}
func (KeyspaceDeleted) isEvent()    {}
func (MemberPut) isEvent()          {}
func (MemberDeleted) isEvent()      {}
func (DrainPut) isEvent()           {}
func (DrainDeleted) isEvent()       {}
func (MapPut) isEvent()             {}
func (GrantsPut) isEvent()          {}
func (GrantsDeleted) isEvent()      {}
func (ReleasesPut) isEvent()        {}
func (ReleasesDeleted) isEvent()    {}
func (TokensPut) isEvent()          {}
func (Tick) isEvent()               {}
func (CommitPut) isEvent()          {}
func (CommitDeleted) isEvent()      {}
func (BucketPosPut) isEvent()       {}
func (BucketPosDeleted) isEvent()   {}
func (HeldPut) isEvent()            {}
func (HeldDeleted) isEvent()        {}
func (QuarantinePut) isEvent()      {}
func (QuarantineDeleted) isEvent()  {}
func (Reset) isEvent()              {}
func (WriteFailed) isEvent()        {}
func (ReservationPut) isEvent()     {}
func (ReservationDeleted) isEvent() {}
