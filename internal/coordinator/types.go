package coordinator

import (
	"time"

	"github.com/keyshard/keyshard/placement"
)

// Mode is how a keyspace hands buckets over.
type Mode string

// Keyspace modes.
const (
	ModeExclusive Mode = "exclusive"
	ModeStream    Mode = "stream"
)

// Keyspace is a keyspace's configuration as the coordinator needs it.
type Keyspace struct {
	Name         string
	Buckets      int
	Hash         placement.HashMode
	Mode         Mode
	LeaseTTL     time.Duration
	DrainTimeout time.Duration
}

// Member is a joined member: its record and the session (etcd lease) that
// keeps it alive.
type Member struct {
	ID      string
	Address string
	Weight  float64
	Zone    string
	Session int64
	// Pending: the session has not kept alive once yet. It is granted
	// nothing, and the balancer gives it a share only if the map already
	// names the member (a restarted process that replaced its session);
	// a new member enters the map once it is active.
	Pending bool
	// Replaces is the superseded session this one took the id over from,
	// or 0; the leader revokes it.
	Replaces int64
	// ReplacesFenced: the process that joined this session held Replaces
	// and fenced itself, so Replaces is revoked without quarantine.
	ReplacesFenced bool
}

// BucketToken is a bucket and the fencing token it was granted with.
type BucketToken struct {
	Bucket int
	Token  uint64
}

// Grants is what one member holds: the session the grants are bound to
// and the granted buckets, sorted by bucket.
type Grants struct {
	Session int64
	Buckets []BucketToken
}

// Map is the target owner of every bucket at one epoch.
type Map struct {
	Epoch      uint64
	Assignment placement.Assignment
}

// Drain is a request to move every bucket away from a member. Leave means
// the member's session ends once it holds nothing. Session is the session
// the request is attached to (it vanishes with it); 0 means the member's
// current one. A request of a session the member has replaced does not
// apply to the new one.
type Drain struct {
	Leave   bool
	Session int64
}

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
)

// Expect says that a key must still be at revision Rev (0: must not exist)
// for a write to apply.
type Expect struct {
	Kind KeyKind
	ID   string // member id for grants and releases
	Rev  Rev
}
