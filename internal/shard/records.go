package shard

import (
	"slices"
	"strconv"
	"time"

	"github.com/keyshard/keyshard/placement"
)

// LeaseID is an etcd lease id: a member's session, a quarantine's lease or
// a replica's election session. Zero means "no lease".
type LeaseID int64

// String formats id in hex, as etcdctl does.
func (id LeaseID) String() string { return strconv.FormatInt(int64(id), 16) }

// Mode is how a keyspace hands buckets over.
type Mode string

// The keyspace modes.
const (
	// ModeExclusive: a moved bucket is granted to its new owner only after
	// the old owner released it or lost its session.
	ModeExclusive Mode = "exclusive"
	// ModeStream: like exclusive, and every bucket has a committed stream
	// position its next owner resumes from.
	ModeStream Mode = "stream"
)

// Keyspace is a keyspace's configuration. Buckets, Hash and Mode never
// change once it is created.
type Keyspace struct {
	Name    string
	Buckets int                // 1 to placement.MaxBuckets
	Hash    placement.HashMode // explicit: "" is not a mode
	Mode    Mode
	// LeaseTTL is the TTL of each member's session: whole seconds (etcd
	// leases have second granularity).
	LeaseTTL time.Duration
	// DrainTimeout is how long the leader waits for a release before it
	// revokes the holder's session: whole milliseconds, 0 for no limit.
	DrainTimeout time.Duration
}

// Member is a joined member's record, kept alive by its session (an etcd
// lease): the record vanishes when the session ends.
type Member struct {
	ID       string
	Address  string            // where routers send work
	Weight   float64           // finite, >= 0; 0 means draining
	Zone     string            // the balancer spreads buckets over zones
	Metadata map[string]string // the member's own labels, for routers
	Session  LeaseID           // the lease the record is attached to; Join sets it
	JoinedAt time.Time
	// Pending is true from Join until the session's first keep-alive: the
	// leader grants a pending member nothing, and the balancer gives it a
	// share only if the map already names it (a restarted process that
	// replaced its session keeps its place). So a Join that arrives late
	// (delayed by a partition, its caller gone) takes no bucket away from
	// anyone; a new member enters the map once it is active.
	Pending bool
	// Replaces is the session this one took the id over from (Join with
	// replace), or 0. The leader revokes it, after quarantining what it
	// held.
	Replaces LeaseID
	// ReplacesFenced: the process that joined this session held Replaces
	// and fenced itself (it no longer acts on it), so the leader revokes
	// Replaces without quarantine.
	ReplacesFenced bool
}

// Drain is a request that a member hand over its buckets. It is bound to
// the member's session when it is made and vanishes with it, so a request
// made of a session the member has since replaced does not apply to the
// new one.
type Drain struct {
	RequestedAt time.Time
	By          string // who asked ("admin", "member", a user name)
	// Leave: the member's session ends once it holds nothing (a member's
	// Leave); otherwise it stays joined with nothing (an admin drain).
	Leave bool
}

// Map is the target owner of every bucket of a keyspace at one epoch.
// Epochs start at 1 and rise by one with every new map. Hash is the
// keyspace's, kept with the map so that a router needs nothing else to
// place a key.
type Map struct {
	Epoch      uint64
	Hash       placement.HashMode
	Assignment placement.Assignment
}

// BucketToken is a bucket with the fencing token it was granted (or
// released) at. Tokens start at 1 and strictly increase per bucket.
//
// Position is for stream keyspaces (0 elsewhere): in a grant, the bucket's
// committed position when it was granted, where the new holder starts
// ("from"); in a release, the holder's final position for the bucket,
// handed over so that its next holder reprocesses nothing (0: none given).
// Either way it is the position of the next event to read.
type BucketToken struct {
	Bucket   int
	Token    uint64
	Position uint64
}

// SortPairs sorts pairs by bucket in place, as Grants and Releases keep
// them.
func SortPairs(pairs []BucketToken) {
	slices.SortFunc(pairs, func(a, b BucketToken) int { return a.Bucket - b.Bucket })
}

// Grants is what one member holds: the session the grants are bound to
// (they vanish with it) and the granted buckets, sorted by bucket, without
// duplicates.
type Grants struct {
	Session LeaseID
	Buckets []BucketToken
}

// Releases lists the (bucket, token) pairs a member has released, sorted
// by bucket, without duplicates, each with its final position in a stream
// keyspace. They are bound to the member's session.
type Releases struct {
	Buckets []BucketToken
}

// Quarantine is the buckets a revoked session held, which must not be
// granted again while the quarantine lasts. It lives on a lease that
// etcd, not a local timer, ends once the session's holder can no longer
// act on them. Session is the revoked session. Buckets is sorted, without
// duplicates.
type Quarantine struct {
	Session LeaseID
	Buckets []int
}

// Reservation is what remains of a keyspace's import (a static mapping
// taken over as its first map): the imported instances that have not
// joined yet, each still owning its imported buckets in the map, and the
// time until which the leader waits for them. Until then it plans as if
// they were members, granting them nothing, so that nothing moves when
// they join; an instance leaves the reservation once it is an active
// member, and at Until the leader places the buckets of those still
// absent over the members present and deletes the reservation. Members is
// in the import's order, without duplicates.
type Reservation struct {
	Members []string
	Until   time.Time
}
