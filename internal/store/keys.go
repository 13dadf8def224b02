package store

import (
	"fmt"
	"strconv"
	"strings"
)

// Prefix is the root of every key Keyshard writes to etcd. The version in it
// changes only with an incompatible layout.
const Prefix = "/keyshard/v1/"

// ElectionPrefix is the concurrency.Election prefix the serve replicas
// campaign on; each candidate's key is ElectionPrefix + "/" + its lease id
// in hex.
const ElectionPrefix = Prefix + "leader"

// Kind says what a key holds.
type Kind int

// The kinds of key in the layout (see the package documentation).
const (
	KindUnknown  Kind = iota
	KindKeyspace      // keyspaces/<ks>: Keyspace
	KindMember        // members/<ks>/<id>: Member, on the member's lease
	KindDrain         // drain/<ks>/<id>: Drain, on the member's lease
	KindMap           // map/<ks>: Map
	KindGrants        // grants/<ks>/<id>: Grants, on the member's lease
	KindReleases      // releases/<ks>/<id>: Releases, on the member's lease
	KindTokens        // tokens/<ks>: the last fencing token issued (uint64)
	KindLeader        // leader/<lease hex>: a campaigner's election key
	// KindQuarantine: quarantine/<ks>/<id>: Quarantine, on a lease of its
	// own that lasts one member lease TTL.
	KindQuarantine
	// The hot-key kinds (Kind.HotKey) belong to a pool, not a keyspace;
	// they live in Snapshot.Pools.
	KindHotPool   // hotpools/<pool>: HotPool
	KindHotReport // hotreports/<pool>/<producer>: hotkey.Report
	KindOverflow  // overflow/<pool>: hotkey.OverflowSet
	// KindPositions: positions/<ks>/<id>: shard.Commit, a member's
	// committed stream positions, without a lease (they outlive the
	// session until the leader folds them into bucketpos).
	KindPositions
	// KindBucketPos: bucketpos/<ks>/<chunk>: shard.BucketPositions for the
	// PositionChunk buckets from chunk*PositionChunk on. The second name is
	// the chunk's index in decimal, not a member id.
	KindBucketPos
	// KindHeld: held/<ks>/<id>: shard.Held, the copy of member id's
	// grants in a stream keyspace, without a lease: it outlives the
	// session until the leader folds the session's commit record.
	KindHeld
	// KindReserved: reserved/<ks>: shard.Reservation, the imported
	// instances of keyspace ks that the leader still waits for, without a
	// lease. ImportKeyspace creates it; the leader shrinks and deletes it.
	KindReserved
	// The tenant-pool kinds (Kind.TenantPool) belong to a tenant pool;
	// they live in Snapshot.TenantPools.
	KindTenantPool   // tpools/<pool>: TenantPool
	KindTenantMember // tpmembers/<pool>/<id>: TenantMember, on the member's lease
	// KindTenantState: tpstate/<pool>/meta (TenantMeta) and
	// tpstate/<pool>/t/<chunk> (TenantChunk): the pool's published state.
	// The second name is "meta" or "t/<chunk>".
	KindTenantState
	// KindReplica: replicas/<replica>: the replica's advertised API URL,
	// on the replica's lease.
	KindReplica
)

var kindSegs = [...]string{
	KindKeyspace:   "keyspaces",
	KindMember:     "members",
	KindDrain:      "drain",
	KindMap:        "map",
	KindGrants:     "grants",
	KindReleases:   "releases",
	KindTokens:     "tokens",
	KindLeader:     "leader",
	KindQuarantine: "quarantine",
	KindHotPool:    "hotpools",
	KindHotReport:  "hotreports",
	KindOverflow:   "overflow",
	KindPositions:  "positions",
	KindBucketPos:  "bucketpos",
	KindHeld:       "held",
	KindReserved:   "reserved",

	KindTenantPool:   "tpools",
	KindTenantMember: "tpmembers",
	KindTenantState:  "tpstate",
	KindReplica:      "replicas",
}

// String returns the key segment of k ("members", "map", ...).
func (k Kind) String() string {
	if k > KindUnknown && int(k) < len(kindSegs) {
		return kindSegs[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// perMember reports whether keys of kind k carry a member id.
func (k Kind) perMember() bool {
	switch k {
	case KindMember, KindDrain, KindGrants, KindReleases, KindQuarantine, KindPositions, KindHeld:
		return true
	}
	return false
}

// HotKey reports whether k is a hot-key kind (a pool's settings, a
// producer's report, a pool's overflow set). Such keys name a pool where
// the others name a keyspace (Change.Keyspace holds the pool's name), and
// keyspace code ignores them.
func (k Kind) HotKey() bool {
	switch k {
	case KindHotPool, KindHotReport, KindOverflow:
		return true
	}
	return false
}

// TenantPool reports whether k is a tenant-pool kind (a pool's settings,
// a member, the published state). Such keys name a tenant pool where the
// others name a keyspace (Change.Keyspace holds the pool's name), and
// keyspace code ignores them.
func (k Kind) TenantPool() bool {
	switch k {
	case KindTenantPool, KindTenantMember, KindTenantState:
		return true
	}
	return false
}

// hasID reports whether keys of kind k carry a second name after the
// first: a member id, or a producer id for reports.
func (k Kind) hasID() bool {
	return k.perMember() || k == KindHotReport || k == KindBucketPos || k == KindTenantMember || k == KindTenantState
}

// nameKinds returns the kinds ValidateName checks the first and second
// name of a key of kind k as.
func (k Kind) nameKinds() (first, second Kind) {
	switch {
	case k.HotKey():
		return KindHotPool, KindHotReport
	case k.TenantPool():
		return KindTenantPool, KindTenantMember
	case k == KindReplica:
		return KindReplica, KindUnknown
	}
	return KindKeyspace, KindMember
}

// Name limits: keyspace names, member ids, hot-key pool names and producer
// ids are 1 to MaxNameLen bytes of [A-Za-z0-9._:@-]. The set excludes '/', so keys parse unambiguously, and
// is safe in URLs, metrics labels and file names.
const MaxNameLen = 128

func nameField(k Kind) string {
	switch k {
	case KindKeyspace:
		return "keyspace name"
	case KindMember:
		return "member id"
	case KindHotPool:
		return "pool name"
	case KindHotReport:
		return "producer id"
	case KindTenantPool:
		return "tenant pool name"
	case KindTenantMember:
		return "member id"
	case KindReplica:
		return "replica id"
	}
	return "name"
}

func nameChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	case c == '.', c == '_', c == ':', c == '@', c == '-':
		return true
	}
	return false
}

// ValidateName returns nil if s is a valid keyspace name (kind
// KindKeyspace), member id (KindMember), hot-key pool name (KindHotPool)
// or producer id (KindHotReport): 1 to 128 characters of [A-Za-z0-9._:@-].
// Otherwise it returns an error wrapping ErrInvalidName that names the
// field and the offending character.
func ValidateName(kind Kind, s string) error {
	field := nameField(kind)
	if s == "" {
		return fmt.Errorf("%w: %s is empty; use 1-%d characters of A-Z a-z 0-9 . _ : @ -", ErrInvalidName, field, MaxNameLen)
	}
	if len(s) > MaxNameLen {
		return fmt.Errorf("%w: %s %.20q... is %d bytes long; the limit is %d", ErrInvalidName, field, s, len(s), MaxNameLen)
	}
	for i := 0; i < len(s); i++ {
		if !nameChar(s[i]) {
			r := []rune(s[i:])[0]
			return fmt.Errorf("%w: %s %q has %q at byte %d; use only A-Z a-z 0-9 . _ : @ -", ErrInvalidName, field, s, r, i)
		}
	}
	return nil
}

// KeyspaceKey returns the key of keyspace ks's configuration.
func KeyspaceKey(ks string) string { return Prefix + "keyspaces/" + ks }

// MemberKey returns the key of member id's record in keyspace ks.
func MemberKey(ks, id string) string { return Prefix + "members/" + ks + "/" + id }

// DrainKey returns the key of the drain request for member id in ks.
func DrainKey(ks, id string) string { return Prefix + "drain/" + ks + "/" + id }

// MapKey returns the key of keyspace ks's map.
func MapKey(ks string) string { return Prefix + "map/" + ks }

// GrantsKey returns the key of the grants of member id in ks.
func GrantsKey(ks, id string) string { return Prefix + "grants/" + ks + "/" + id }

// ReleasesKey returns the key of the releases of member id in ks.
func ReleasesKey(ks, id string) string { return Prefix + "releases/" + ks + "/" + id }

// QuarantineKey returns the key of the quarantine of member id's revoked
// session in ks.
func QuarantineKey(ks, id string) string { return Prefix + "quarantine/" + ks + "/" + id }

// TokensKey returns the key of the last fencing token issued in ks.
func TokensKey(ks string) string { return Prefix + "tokens/" + ks }

// PositionsKey returns the key of member id's committed positions in ks.
func PositionsKey(ks, id string) string { return Prefix + "positions/" + ks + "/" + id }

// HeldKey returns the key of the copy of member id's grants in stream
// keyspace ks.
func HeldKey(ks, id string) string { return Prefix + "held/" + ks + "/" + id }

// BucketPosKey returns the key of chunk chunk of keyspace ks's bucket
// positions: the PositionChunk buckets from chunk*PositionChunk on.
func BucketPosKey(ks string, chunk int) string {
	return Prefix + "bucketpos/" + ks + "/" + strconv.Itoa(chunk)
}

// ReservedKey returns the key of keyspace ks's reservation: the imported
// instances the leader still waits for.
func ReservedKey(ks string) string { return Prefix + "reserved/" + ks }

// HotPoolKey returns the key of hot-key pool's settings.
func HotPoolKey(pool string) string { return Prefix + "hotpools/" + pool }

// HotReportKey returns the key of producer's latest report to pool.
func HotReportKey(pool, producer string) string {
	return Prefix + "hotreports/" + pool + "/" + producer
}

// OverflowKey returns the key of pool's overflow set.
func OverflowKey(pool string) string { return Prefix + "overflow/" + pool }

// Key returns the key of the given kind; ks is the keyspace, or the pool
// for the hot-key kinds. id is ignored for kinds that have no second name.
// It does not validate the names.
func Key(kind Kind, ks, id string) string {
	if kind.hasID() {
		return Prefix + kind.String() + "/" + ks + "/" + id
	}
	return Prefix + kind.String() + "/" + ks
}

// keyspaceKinds are the kinds with many keys per keyspace, each under
// kindPrefix(kind, ks).
var keyspaceKinds = []Kind{KindMember, KindDrain, KindGrants, KindReleases, KindQuarantine, KindPositions, KindBucketPos, KindHeld}

// kindPrefix returns the prefix of every key of a per-member kind in ks.
func kindPrefix(kind Kind, ks string) string { return Prefix + kind.String() + "/" + ks + "/" }

// ParseKey splits a key of the layout into its kind, keyspace and member id
// (id is "" for per-keyspace kinds). For the hot-key kinds ks is the pool
// and id the producer (reports only). For KindLeader, ks is "" and id is the
// rest of the key (the campaigner's lease id in hex). A key outside the
// layout or with an invalid name returns an error wrapping ErrCorrupt (and
// ErrInvalidName for a bad name).
func ParseKey(k string) (kind Kind, ks, id string, err error) {
	rest, ok := strings.CutPrefix(k, Prefix)
	if !ok {
		return KindUnknown, "", "", corruptf(k, "", "key is not under %q", Prefix)
	}
	seg, rest, ok := strings.Cut(rest, "/")
	if !ok {
		return KindUnknown, "", "", corruptf(k, "", "key has no name after %q", seg)
	}
	for i, s := range kindSegs {
		if i != int(KindUnknown) && s == seg {
			kind = Kind(i)
			break
		}
	}
	switch {
	case kind == KindUnknown:
		return KindUnknown, "", "", corruptf(k, "", "unknown key kind %q", seg)
	case kind == KindLeader:
		if rest == "" {
			return KindUnknown, "", "", corruptf(k, "", "leader key has no candidate")
		}
		return kind, "", rest, nil
	case kind.hasID():
		first, second := kind.nameKinds()
		ks, id, ok = strings.Cut(rest, "/")
		if !ok {
			return KindUnknown, "", "", corruptf(k, "", "%s key has no %s", seg, nameField(second))
		}
		if err := ValidateName(first, ks); err != nil {
			return KindUnknown, "", "", fmt.Errorf("%w: %w", corruptf(k, "", "bad %s", nameField(first)), err)
		}
		if kind == KindTenantState {
			if _, err := parseTenantStateID(id); err != nil {
				return KindUnknown, "", "", corruptf(k, "", "bad tenant state key: %v", err)
			}
			return kind, ks, id, nil
		}
		if kind == KindBucketPos {
			if _, err := parseChunk(id); err != nil {
				return KindUnknown, "", "", corruptf(k, "", "bad chunk: %v", err)
			}
			return kind, ks, id, nil
		}
		if err := ValidateName(second, id); err != nil {
			return KindUnknown, "", "", fmt.Errorf("%w: %w", corruptf(k, "", "bad %s", nameField(second)), err)
		}
		return kind, ks, id, nil
	default:
		first, _ := kind.nameKinds()
		if err := ValidateName(first, rest); err != nil {
			return KindUnknown, "", "", fmt.Errorf("%w: %w", corruptf(k, "", "bad %s", nameField(first)), err)
		}
		return kind, rest, "", nil
	}
}
