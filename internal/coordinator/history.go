package coordinator

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/keyshard/keyshard/placement"
)

// MapReason is why the machine wrote a new epoch of a keyspace's map.
type MapReason string

// Map reasons, as the map history records them.
const (
	ReasonCreate MapReason = "create" // the keyspace's first map
	ReasonJoin   MapReason = "join"   // members joined
	ReasonLeave  MapReason = "leave"  // members left (Leave)
	// ReasonCrash: members' sessions ended without a Leave (their lease
	// expired, or was revoked).
	ReasonCrash MapReason = "crash"
	ReasonDrain MapReason = "drain" // members drained (DrainMember)
	// ReasonLoad: the same members with other weights or zones, or a
	// rebalance.
	ReasonLoad   MapReason = "load"
	ReasonUpdate MapReason = "update" // the keyspace's settings changed
	// ReasonImport: an import wrote the first map, or its reservation
	// ended and the buckets of instances that never joined were placed.
	ReasonImport MapReason = "import"
)

// MovePair is how many buckets a new epoch moved from one target owner to
// another ("" is none).
type MovePair struct {
	From, To string
	Buckets  int
}

// Pairs aggregates moves per (from, to) pair, most buckets first, then by
// from and to.
func Pairs(moves []placement.Move) []MovePair {
	idx := map[[2]string]int{}
	var out []MovePair
	for _, mv := range moves {
		key := [2]string{mv.From, mv.To}
		i, ok := idx[key]
		if !ok {
			i = len(out)
			idx[key] = i
			out = append(out, MovePair{From: mv.From, To: mv.To})
		}
		out[i].Buckets++
	}
	slices.SortFunc(out, func(a, b MovePair) int {
		return cmp.Or(cmp.Compare(b.Buckets, a.Buckets), cmp.Compare(a.From, b.From), cmp.Compare(a.To, b.To))
	})
	return out
}

// why is the reason of a new epoch: the reason, the members whose event
// caused it, and a sentence for people.
type why struct {
	reason  MapReason
	members []string
	detail  string
}

// explain says why plan moves the buckets it does from the map the
// machine last saw. The machine sees states, not the events between them:
// it tells a member's event from the members and drains it knows now.
// Buckets moved away from a member that is still joined and draining are
// a drain (a leave if it asked to leave); away from a member no longer
// joined, a crash (its session ended without a Leave: a member that left
// had its buckets moved while still joined), or an import's end for an
// imported instance that never joined; to a member that owned nothing, a
// join (a bucket can count for both). When one epoch folds several kinds
// of event, the kind that moved the most buckets is the reason (a member
// going away before a join on a tie), and the detail says it is a best
// guess and names the others.
func (k *keyspace) explain(cur placement.Assignment, moves []placement.Move) why {
	if !k.hasMap {
		// The members the first map places buckets on are named: a worker
		// that joined before the first map never gets a join record.
		seen := map[string]bool{}
		var members []string
		for _, mv := range moves {
			if mv.To != "" && !seen[mv.To] {
				seen[mv.To] = true
				members = append(members, mv.To)
			}
		}
		slices.Sort(members)
		return why{reason: ReasonCreate, members: members, detail: fmt.Sprintf("first map of %d buckets over %d members", k.cfg.Buckets, len(members))}
	}
	if cur.Buckets() != k.m.Assignment.Buckets() {
		return why{reason: ReasonUpdate, detail: fmt.Sprintf("the bucket count changed from %d to %d: every bucket placed again", k.m.Assignment.Buckets(), k.cfg.Buckets)}
	}
	reserved := map[string]bool{}
	for _, id := range k.res.Members {
		reserved[id] = true
	}
	owned := cur.Counts()
	type kind struct {
		reason  MapReason
		members map[string]bool
		buckets int
	}
	kinds := map[MapReason]*kind{}
	add := func(r MapReason, id string) {
		kd := kinds[r]
		if kd == nil {
			kd = &kind{reason: r, members: map[string]bool{}}
			kinds[r] = kd
		}
		kd.members[id] = true
		kd.buckets++
	}
	for _, mv := range moves {
		if mv.From != "" {
			if _, joined := k.members[mv.From]; !joined {
				if reserved[mv.From] {
					add(ReasonImport, mv.From)
				} else {
					add(ReasonCrash, mv.From)
				}
			} else if d, draining := k.drainOf(mv.From); draining && d.leave {
				add(ReasonLeave, mv.From)
			} else if draining {
				add(ReasonDrain, mv.From)
			}
		}
		// A bucket moved from a member that went away to one that joined
		// counts for both.
		if mv.To != "" && owned[mv.To] == 0 {
			add(ReasonJoin, mv.To)
		}
	}
	if len(kinds) == 0 {
		if allFromNone(moves) {
			return why{reason: ReasonLoad, detail: fmt.Sprintf("%d unassigned buckets placed over the members", len(moves))}
		}
		return why{reason: ReasonLoad, detail: fmt.Sprintf("rebalanced %d buckets over the same members (weights or zones changed)", len(moves))}
	}
	ranked := make([]*kind, 0, len(kinds))
	for _, kd := range kinds {
		ranked = append(ranked, kd)
	}
	slices.SortFunc(ranked, func(a, b *kind) int {
		return cmp.Or(cmp.Compare(b.buckets, a.buckets), cmp.Compare(precedence[a.reason], precedence[b.reason]))
	})
	top := ranked[0]
	w := why{reason: top.reason, members: sortedKeys(top.members)}
	w.detail = describe(top.reason, w.members)
	if len(ranked) > 1 {
		var others []string
		for _, kd := range ranked[1:] {
			others = append(others, describe(kd.reason, sortedKeys(kd.members)))
		}
		w.detail += fmt.Sprintf("; best guess: this epoch also folds %s (the reason given moved the most buckets)", strings.Join(others, "; "))
	}
	return w
}

// precedence breaks ties between kinds of event that moved as many
// buckets: a member going away forces its buckets to move, a join only
// invites them.
var precedence = map[MapReason]int{ReasonCrash: 0, ReasonLeave: 1, ReasonDrain: 2, ReasonImport: 3, ReasonJoin: 4}

func allFromNone(moves []placement.Move) bool {
	for _, mv := range moves {
		if mv.From != "" {
			return false
		}
	}
	return true
}

func sortedKeys(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for id := range set {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// describe is a sentence for reason r caused by members.
func describe(r MapReason, members []string) string {
	who := strings.Join(members, ", ")
	switch r {
	case ReasonJoin:
		return who + " joined"
	case ReasonLeave:
		return who + " left (Leave): buckets moved away"
	case ReasonCrash:
		return who + ": session ended without a Leave (lease expired or revoked): buckets moved away"
	case ReasonDrain:
		return who + " drained: buckets moved away"
	case ReasonImport:
		return who + ": imported instances that never joined before the import's wait ended: buckets placed over the members present"
	}
	return string(r) + " " + who
}
