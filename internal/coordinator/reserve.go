package coordinator

import (
	"fmt"
	"strings"
	"time"

	"github.com/keyshard/keyshard/internal/shard"
)

// An import (AdminService.ImportKeyspace) creates a keyspace with a first
// map that reproduces a static mapping (placement.SynapseAssignment), and
// a reservation naming the imported instances and a deadline. Until an
// instance joins, the balancer counts it as a member of weight 1 even
// though it is absent: the map keeps its buckets on it, and the grant
// round grants them to nobody (it grants only to live sessions). So when
// the instances join, every one of them is already the target of exactly
// its imported buckets and nothing moves.
//
// An instance leaves the reservation once it is an active member (its
// session has kept alive), through a WriteReservation: from then on the
// ordinary rules apply to it, and if it later leaves or dies its buckets
// move like anyone's. At the deadline the reservation ends for every
// instance still absent: the balancer no longer counts them, so the next
// map places their buckets over the members present (placement.Balance,
// minimal moves), and the reservation is deleted. The deadline is checked
// whenever the keyspace is planned, and every Tick plans every keyspace.
//
// The reservation lives in the store (reserved/<ks>), so a new leader
// keeps waiting for the same instances until the same deadline.

// reserved returns the imported instances that the balancer counts as
// members at now: those in the reservation that have no member record,
// until the deadline.
func (k *keyspace) reserved(now time.Time) []string {
	if !k.hasRes || !now.Before(k.res.Until) {
		return nil
	}
	var out []string
	for _, id := range k.res.Members {
		if _, ok := k.members[id]; !ok {
			out = append(out, id)
		}
	}
	return out
}

// reservationRound returns the write that takes the instances that have
// joined out of the reservation, or deletes it once its deadline has
// passed, with a report of the instances that never joined; nothing if
// the reservation is unchanged or a write of it is in flight.
func (k *keyspace) reservationRound(name string, now time.Time) []Action {
	if !k.hasRes || k.resInflight {
		return nil
	}
	expired := !now.Before(k.res.Until)
	a := WriteReservation{Keyspace: name, Reservation: shard.Reservation{Until: k.res.Until}, Expect: Expect{Kind: KeyReserved, Rev: k.resRev}}
	for _, id := range k.res.Members {
		mem, ok := k.members[id]
		switch {
		case ok && !mem.Pending && mem.Session != 0:
			a.Joined = append(a.Joined, id)
		case expired:
			a.Expired = append(a.Expired, id)
		default:
			a.Reservation.Members = append(a.Reservation.Members, id)
		}
	}
	if len(a.Joined) == 0 && len(a.Expired) == 0 && len(k.res.Members) > 0 {
		return nil // unchanged (an empty one, never stored so, is deleted)
	}
	if len(a.Reservation.Members) == 0 {
		a.Reservation = shard.Reservation{}
	}
	k.resInflight = true
	acts := []Action{a}
	if len(a.Expired) > 0 {
		acts = append(acts, Report{Keyspace: name, Kind: ReportReservationExpired, Message: fmt.Sprintf(
			"imported instances %s did not join by %s; their buckets are placed over the members present",
			strings.Join(a.Expired, ", "), k.res.Until.UTC().Format(time.RFC3339))})
	}
	return acts
}
