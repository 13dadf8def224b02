package coordinator

import (
	"time"

	"github.com/keyshard/keyshard/internal/shard"
)

// Action is a write the leader must make, or something to report. The
// server applies each write as one store transaction fenced by the
// leader's election key and the Expects it carries, then feeds the result
// back: the changes arrive through the watch, or a WriteFailed event.
type Action interface{ isAction() }

// WriteMap writes a new map epoch (with the keyspace's hash mode).
type WriteMap struct {
	Keyspace string
	Map      shard.Map
	Expect   Expect
	// Moves is how many buckets changed target owner.
	Moves int
	// Why the epoch: the reason, the members whose event caused it (for
	// join, leave, crash, drain and import), the moved buckets per (from,
	// to) pair, and a sentence for people, which says when the reason is a
	// best guess. The server records them in the map history.
	Reason  MapReason
	Members []string
	Pairs   []MovePair
	Detail  string
}

// WriteGrants is one grant round: the full new grants of every member
// touched (buckets released by one member and granted to another) and the
// new token counter, in one transaction. A member's grants are written
// with its session's lease, so a grant to a dead session fails.
type WriteGrants struct {
	Keyspace string
	Grants   map[string]shard.Grants
	Token    uint64
	Expects  []Expect
	// Granted and Released count the buckets the round moves.
	Granted, Released int

	// Stream keyspaces only (zero elsewhere). A bucket that leaves its
	// holder has its position folded into the keyspace's bucket
	// positions, and a grant's From (BucketToken.Position) is the bucket's
	// position after that. Positions is the bucket positions the round
	// writes in place of WasPositions, as read (only the pieces that
	// differ); Folded are the members whose commit records, of a session
	// that has ended, the round folded and deletes. Held are the copies of
	// grants the round writes (without a lease), Unheld the members whose
	// copies it deletes: it writes a copy with every member's grants it
	// writes, and deletes one once its session has ended (with the
	// session's commit record, if any) or holds nothing and never
	// committed. Expects covers the commit records, the copies and the
	// pieces of the bucket positions read.
	Positions, WasPositions shard.BucketPositions
	Folded                  []string
	Held                    map[string]shard.Held
	Unheld                  []string
}

// RevokeSession ends a member's session (etcd lease revoke): its member
// record and grants vanish. The member may still act on its buckets until
// its own lease deadline, so first the server writes a quarantine key for
// Quarantine (bound to a new lease of that TTL) naming those buckets; they
// are not granted again until etcd has expired it. Quarantine is empty
// when the member holds nothing.
//
// Superseded says that the member's record is already on a newer session
// (Join with replace), so the server accepts no keep-alive of this one any
// more: the member's own deadline can be no later than the remaining time
// of the session's lease, and the server may shorten the quarantine to
// that (never beyond TTL).
type RevokeSession struct {
	Keyspace, ID string
	Session      shard.LeaseID
	Quarantine   []int
	TTL          time.Duration
	Superseded   bool
	Reason       string
}

// WriteReservation replaces the keyspace's reservation with Reservation,
// or deletes it if Reservation.Members is empty: an imported instance
// joined, or the wait for them is over. Expect is the reservation as
// read.
type WriteReservation struct {
	Keyspace    string
	Reservation shard.Reservation
	Expect      Expect
	// Joined are the instances that left the reservation because they
	// joined; Expired those still absent when it ended.
	Joined, Expired []string
}

// Report is something an operator should know: a drain that timed out, a
// quarantined bucket, a failed write.
type Report struct {
	Keyspace string
	Kind     ReportKind
	Message  string
}

// ReportKind classifies a Report.
type ReportKind string

// Report kinds.
const (
	ReportDrainTimeout ReportKind = "drain-timeout"
	ReportReplaced     ReportKind = "session-replaced"
	ReportLeft         ReportKind = "member-left"
	// ReportReservationExpired: imported instances did not join before
	// their reservation's deadline; their buckets are placed elsewhere.
	ReportReservationExpired ReportKind = "reservation-expired"
)

func (WriteMap) isAction()         {}
func (WriteGrants) isAction()      {}
func (RevokeSession) isAction()    {}
func (Report) isAction()           {}
func (WriteReservation) isAction() {}
