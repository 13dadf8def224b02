package coordinator

// The records the machine decides over (keyspaces, members, maps, grants,
// releases, quarantines, drain requests) are internal/shard's, as the
// store keeps them. What follows is the coordinator's own: how its writes
// name the values they were planned from.

// Rev is the etcd modification revision at which a value was read; the
// leader's writes expect the values it read to be unchanged.
type Rev = int64

// KeyKind names which of a keyspace's keys an Expect refers to.
type KeyKind string

// Key kinds, mirroring the store's layout (see design.md).
const (
	KeyMap      KeyKind = "map"
	KeyGrants   KeyKind = "grants"
	KeyReleases KeyKind = "releases"
	KeyTokens   KeyKind = "tokens"
	// KeyCommit is a member's commit record of stream positions; KeyBucketPos
	// a piece of the keyspace's bucket positions (Expect.Chunk).
	KeyCommit    KeyKind = "positions"
	KeyBucketPos KeyKind = "bucketpos"
	// KeyHeld is the copy of a member's grants in a stream keyspace.
	KeyHeld KeyKind = "held"
	// KeyReserved is the keyspace's reservation (an import's instances
	// that have not joined yet).
	KeyReserved KeyKind = "reserved"
)

// Expect says that a key must still be at revision Rev (0: must not exist)
// for a write to apply.
type Expect struct {
	Kind  KeyKind
	ID    string // member id for grants, releases, commit records and copies of grants
	Chunk int    // the piece, for bucket positions
	Rev   Rev
}
