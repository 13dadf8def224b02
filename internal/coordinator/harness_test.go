package coordinator_test

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/keyshard/keyshard/internal/coordinator"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/placement"
)

// world plays the store and the server around a Machine: it applies the
// machine's actions as fenced writes would land, feeds the resulting
// changes back as events, and checks the safety invariants after every
// change.
type world struct {
	m       *coordinator.Machine // the leader's; nil while no leader runs
	gap     time.Duration        // the machines' epoch gap (SetEpochGap)
	now     time.Time
	rev     coordinator.Rev
	pending []coordinator.Action

	// The store, as etcd would hold it.
	keyspaces map[string]shard.Keyspace
	members   map[string]map[string]shard.Member
	maps      map[string]shard.Map
	mapRev    map[string]coordinator.Rev
	grants    map[string]map[string]shard.Grants
	grantRev  map[string]map[string]coordinator.Rev
	releases  map[string]map[string][]shard.BucketToken
	// relSess is, per "ks/id", the session whose lease the member's
	// releases record is on: the one that wrote it. It goes with that
	// lease, not with the member record's.
	relSess map[string]shard.LeaseID
	// fencedSess are the sessions whose holder fenced itself and said so
	// when it replaced them: it acts on nothing any more.
	fencedSess map[shard.LeaseID]bool
	tokens     map[string]uint64
	tokenRev   map[string]coordinator.Rev
	quar       map[string]map[string][]int
	quarUntil  map[string]map[string]time.Time            // when each quarantine's lease expires
	drains     map[string]map[string]coordinator.DrainPut // each on the session it is bound to
	nextSess   shard.LeaseID
	// Stream keyspaces: members' commit records and the bucket positions
	// (one piece, chunk 0: a test keyspace has at most
	// shard.PositionChunk buckets).
	commits   map[string]map[string]shard.Commit
	commitRev map[string]map[string]coordinator.Rev
	bpos      map[string]shard.BucketPositions
	bposRev   map[string]coordinator.Rev
	// held are the copies of the members' grants (no lease: they outlive
	// the session).
	held    map[string]map[string]shard.Held
	heldRev map[string]map[string]coordinator.Rev
	// lastGrants are, per member, the grants its session held when etcd
	// deleted them with its lease: what a fold of its commit record must
	// cover.
	lastGrants map[string]map[string]shard.Grants
	// lateFolds are the "ks/id" whose commit records a leader loaded
	// after their session's grants were gone.
	lateFolds map[string]bool
	// Imports: each keyspace's reservation (absent: none).
	res    map[string]shard.Reservation
	resRev map[string]coordinator.Rev

	// The record the invariants are checked against.
	lastToken map[string]map[int]uint64 // highest token ever granted per bucket
	// replacedAt is when a Join with replace superseded a session: no
	// keep-alive of it is acknowledged after that.
	replacedAt map[shard.LeaseID]time.Time
	// mayAct is, per bucket of a revoked session that it had not
	// released, until when that session's holder may still act on it: its
	// last acknowledged keep-alive + TTL. Nobody may be granted the bucket
	// before then.
	mayAct map[string]map[int]revokedHold
	// floor is, per bucket of a stream keyspace, the position its next
	// grant must start at or above: the highest effective position its
	// holders committed (see posFloor).
	floor     map[string]map[int]posFloor
	noFinal   bool // releases give no final positions: the committed ones count
	stats     streamStats
	violation []string
	// revokedSess are the sessions a RevokeSession ended: their grants
	// key went with them, and no later grant round may write it.
	revokedSess map[shard.LeaseID]bool
	reports     []string
}

func newWorld() *world {
	return &world{
		now:         time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		keyspaces:   map[string]shard.Keyspace{},
		members:     map[string]map[string]shard.Member{},
		maps:        map[string]shard.Map{},
		mapRev:      map[string]coordinator.Rev{},
		grants:      map[string]map[string]shard.Grants{},
		grantRev:    map[string]map[string]coordinator.Rev{},
		releases:    map[string]map[string][]shard.BucketToken{},
		relSess:     map[string]shard.LeaseID{},
		fencedSess:  map[shard.LeaseID]bool{},
		revokedSess: map[shard.LeaseID]bool{},
		tokens:      map[string]uint64{},
		tokenRev:    map[string]coordinator.Rev{},
		quar:        map[string]map[string][]int{},
		drains:      map[string]map[string]coordinator.DrainPut{},
		lastToken:   map[string]map[int]uint64{},
		quarUntil:   map[string]map[string]time.Time{},
		mayAct:      map[string]map[int]revokedHold{},
		commits:     map[string]map[string]shard.Commit{},
		commitRev:   map[string]map[string]coordinator.Rev{},
		bpos:        map[string]shard.BucketPositions{},
		bposRev:     map[string]coordinator.Rev{},
		held:        map[string]map[string]shard.Held{},
		heldRev:     map[string]map[string]coordinator.Rev{},
		lastGrants:  map[string]map[string]shard.Grants{},
		lateFolds:   map[string]bool{},
		res:         map[string]shard.Reservation{},
		resRev:      map[string]coordinator.Rev{},
		floor:       map[string]map[int]posFloor{},

		replacedAt: map[shard.LeaseID]time.Time{},
		nextSess:   0x100,
	}
}

// step feeds events to the machine, if a leader runs, and queues what it
// asks for.
func (w *world) step(evs ...coordinator.Event) []coordinator.Action {
	if w.m == nil {
		return nil
	}
	acts := w.m.StepAll(evs, w.now)
	if err := coordinator.CheckIndex(w.m); err != nil {
		w.violation = append(w.violation, err.Error())
	}
	w.pending = append(w.pending, acts...)
	for _, a := range acts {
		if r, ok := a.(coordinator.Report); ok {
			w.reports = append(w.reports, fmt.Sprintf("%s: %s", r.Kind, r.Message))
		}
	}
	return acts
}

func (w *world) createKeyspace(ks shard.Keyspace) []coordinator.Action {
	w.keyspaces[ks.Name] = ks
	for _, m := range []any{w.members, w.grants, w.grantRev, w.releases, w.quar} {
		switch mm := m.(type) {
		case map[string]map[string]shard.Member:
			mm[ks.Name] = map[string]shard.Member{}
		case map[string]map[string]shard.Grants:
			mm[ks.Name] = map[string]shard.Grants{}
		case map[string]map[string]coordinator.Rev:
			mm[ks.Name] = map[string]coordinator.Rev{}
		case map[string]map[string][]shard.BucketToken:
			mm[ks.Name] = map[string][]shard.BucketToken{}
		case map[string]map[string][]int:
			mm[ks.Name] = map[string][]int{}
		}
	}
	w.lastToken[ks.Name] = map[int]uint64{}
	w.quarUntil[ks.Name] = map[string]time.Time{}
	w.mayAct[ks.Name] = map[int]revokedHold{}
	w.drains[ks.Name] = map[string]coordinator.DrainPut{}
	w.commits[ks.Name] = map[string]shard.Commit{}
	w.commitRev[ks.Name] = map[string]coordinator.Rev{}
	w.held[ks.Name] = map[string]shard.Held{}
	w.heldRev[ks.Name] = map[string]coordinator.Rev{}
	w.lastGrants[ks.Name] = map[string]shard.Grants{}
	w.floor[ks.Name] = map[int]posFloor{}
	return w.step(coordinator.KeyspacePut{Keyspace: ks})
}

// join writes a member record on a new session, as the store's Join does:
// pending until its first keep-alive if pending is set (else active at
// once, as a member that keeps alive promptly), and naming the session it
// replaces if the id was held.
func (w *world) join(ks, id string, weight float64, pending bool) []coordinator.Action {
	return w.joinAs(ks, id, weight, pending, false)
}

// joinAs is join; fenced says that the process joining held the member's
// current session and fenced itself (it acts on none of its buckets any
// more), as the SDK's re-join after a self-fence says.
func (w *world) joinAs(ks, id string, weight float64, pending, fenced bool) []coordinator.Action {
	w.nextSess++
	mem := shard.Member{ID: id, Weight: weight, Session: w.nextSess, Address: id + ":7000", Pending: pending}
	if old, ok := w.members[ks][id]; ok {
		mem.Replaces = old.Session
		if _, seen := w.replacedAt[old.Session]; !seen {
			w.replacedAt[old.Session] = w.now
		}
		if fenced {
			mem.ReplacesFenced = true
			w.fencedSess[old.Session] = true
		}
	}
	w.members[ks][id] = mem
	return w.step(coordinator.MemberPut{Keyspace: ks, Member: mem})
}

// keepAlive activates a pending member, as its first keep-alive does.
func (w *world) keepAlive(ks, id string) []coordinator.Action {
	mem, ok := w.members[ks][id]
	if !ok || !mem.Pending {
		return nil
	}
	mem.Pending = false
	w.members[ks][id] = mem
	return w.step(coordinator.MemberPut{Keyspace: ks, Member: mem})
}

// releaseBucket makes a member release one bucket it holds, asked or not.
func (w *world) releaseBucket(ks, id string, b int) []coordinator.Action {
	if !w.mayRelease(ks, id) {
		return nil
	}
	for _, bt := range w.grants[ks][id].Buckets {
		if bt.Bucket == b {
			w.rev++
			w.releases[ks][id] = append(w.releases[ks][id], w.finalPositions(ks, id, []shard.BucketToken{bt})...)
			w.relSess[ks+"/"+id] = w.grants[ks][id].Session
			return w.step(coordinator.ReleasesPut{Keyspace: ks, ID: id, Releases: shard.Releases{Buckets: slices.Clone(w.releases[ks][id])}, Rev: w.rev})
		}
	}
	return nil
}

// expire ends a member's session as etcd would: every key bound to its
// lease goes in one revision.
func (w *world) expire(ks, id string, session shard.LeaseID) []coordinator.Action {
	var evs []coordinator.Event
	if mem, ok := w.members[ks][id]; ok && mem.Session == session {
		delete(w.members[ks], id)
		evs = append(evs, coordinator.MemberDeleted{Keyspace: ks, ID: id})
	}
	if d, ok := w.drains[ks][id]; ok && d.Session == session {
		delete(w.drains[ks], id)
		evs = append(evs, coordinator.DrainDeleted{Keyspace: ks, ID: id})
	}
	if _, ok := w.releases[ks][id]; ok && w.relSess[ks+"/"+id] == session {
		delete(w.releases[ks], id)
		delete(w.relSess, ks+"/"+id)
		evs = append(evs, coordinator.ReleasesDeleted{Keyspace: ks, ID: id})
	}
	if g, ok := w.grants[ks][id]; ok && g.Session == session {
		w.lastGrants[ks][id] = g
		delete(w.grants[ks], id)
		delete(w.grantRev[ks], id)
		evs = append(evs, coordinator.GrantsDeleted{Keyspace: ks, ID: id})
	}
	if len(evs) == 0 {
		return nil
	}
	w.rev++
	return w.step(evs...)
}

// drain records a drain request, bound to the member's session as the
// store binds it to the member's lease.
func (w *world) drain(ks, id string, d shard.Drain) []coordinator.Action {
	if _, ok := w.members[ks][id]; !ok {
		return nil // the API refuses to drain a member that is not joined
	}
	put := coordinator.DrainPut{Keyspace: ks, ID: id, Drain: d, Session: w.members[ks][id].Session}
	w.drains[ks][id] = put
	return w.step(put)
}

// mayRelease reports whether the store takes a release from the session
// holding member id's grants: only while the member record is on that
// session (a replaced session is fenced).
func (w *world) mayRelease(ks, id string) bool {
	mem, ok := w.members[ks][id]
	return ok && mem.Session == w.grants[ks][id].Session
}

// release makes a member release every bucket it holds whose target is
// another member, as the SDK does after its handler's Release returns.
func (w *world) release(ks, id string) []coordinator.Action {
	g, ok := w.grants[ks][id]
	if !ok || !w.mayRelease(ks, id) {
		return nil
	}
	m := w.maps[ks]
	var rel []shard.BucketToken
	for _, bt := range g.Buckets {
		if m.Assignment.Owner(bt.Bucket) != id {
			rel = append(rel, bt)
		}
	}
	if len(rel) == 0 {
		return nil
	}
	w.rev++
	rel = w.finalPositions(ks, id, rel)
	w.releases[ks][id] = rel
	w.relSess[ks+"/"+id] = g.Session
	return w.step(coordinator.ReleasesPut{Keyspace: ks, ID: id, Releases: shard.Releases{Buckets: rel}, Rev: w.rev})
}

// apply lands every pending action, as the server's fenced writes would,
// and feeds the changes back. It returns what the machine asked next.
func (w *world) apply() []coordinator.Action {
	acts := w.pending
	w.pending = nil
	var next []coordinator.Action
	for _, a := range acts {
		switch a := a.(type) {
		case coordinator.WriteMap:
			if a.Expect.Rev != w.mapRev[a.Keyspace] {
				next = append(next, w.step(coordinator.WriteFailed{Action: a, Err: fmt.Errorf("conflict")})...)
				continue
			}
			w.rev++
			w.maps[a.Keyspace], w.mapRev[a.Keyspace] = a.Map, w.rev
			next = append(next, w.step(coordinator.MapPut{Keyspace: a.Keyspace, Map: a.Map, Rev: w.rev})...)
		case coordinator.WriteGrants:
			for _, id := range slices.Sorted(maps.Keys(a.Grants)) {
				if s := a.Grants[id].Session; w.revokedSess[s] {
					w.violation = append(w.violation, fmt.Sprintf("grant round writes the grants of %s's session %v, which the leader revoked", id, s))
				}
			}
			if !w.expectsHold(a) {
				next = append(next, w.step(coordinator.WriteFailed{Action: a, Err: fmt.Errorf("conflict")})...)
				continue
			}
			w.rev++
			var evs []coordinator.Event
			for id, g := range a.Grants {
				if mem, ok := w.members[a.Keyspace][id]; !ok || mem.Session != g.Session {
					if _, held := w.grants[a.Keyspace][id]; !held || w.grants[a.Keyspace][id].Session != g.Session {
						// etcd refuses a put bound to a lease that is gone.
						evs = nil
						next = append(next, w.step(coordinator.WriteFailed{Action: a, Err: fmt.Errorf("lease not found")})...)
						goto nextAction
					}
				}
			}
			w.checkFrom(a)
			for id, g := range a.Grants {
				// A bucket leaves a live holder only after it released it
				// at the token it held.
				kept := map[int]bool{}
				for _, bt := range g.Buckets {
					kept[bt.Bucket] = true
				}
				for _, had := range w.grants[a.Keyspace][id].Buckets {
					if !kept[had.Bucket] && !w.released(a.Keyspace, id, had) {
						w.violation = append(w.violation, fmt.Sprintf("bucket %d taken from %s (token %d) before it released it", had.Bucket, id, had.Token))
					}
				}
				// (A grant to the session a pending one replaces is a
				// grant to an active session.)
				if mem := w.members[a.Keyspace][id]; mem.Pending && g.Session == mem.Session && len(g.Buckets) > len(w.grants[a.Keyspace][id].Buckets) {
					w.violation = append(w.violation, fmt.Sprintf("buckets granted to %s before its first keep-alive", id))
				}
				for _, bt := range g.Buckets {
					if h, ok := w.mayAct[a.Keyspace][bt.Bucket]; ok && !w.heldAt(a.Keyspace, id, bt) && w.now.Before(h.until) {
						w.violation = append(w.violation, fmt.Sprintf("bucket %d granted to %s at %v while revoked session %v of %s may act on it until %v", bt.Bucket, id, w.now.Format(time.TimeOnly), h.session, h.id, h.until.Format(time.TimeOnly)))
					}
					if last := w.lastToken[a.Keyspace][bt.Bucket]; bt.Token > last {
						w.lastToken[a.Keyspace][bt.Bucket] = bt.Token
					} else if !w.heldAt(a.Keyspace, id, bt) {
						w.violation = append(w.violation, fmt.Sprintf("bucket %d granted to %s with token %d, not above %d", bt.Bucket, id, bt.Token, last))
					}
				}
				w.grants[a.Keyspace][id], w.grantRev[a.Keyspace][id] = g, w.rev
				evs = append(evs, coordinator.GrantsPut{Keyspace: a.Keyspace, ID: id, Grants: g, Rev: w.rev})
			}
			evs = append(evs, w.writePositions(a)...)
			evs = append(evs, w.writeHeld(a)...)
			w.tokens[a.Keyspace], w.tokenRev[a.Keyspace] = a.Token, w.rev
			evs = append(evs, coordinator.TokensPut{Keyspace: a.Keyspace, Token: a.Token, Rev: w.rev})
			w.checkExclusive(a.Keyspace)
			next = append(next, w.step(evs...)...)
		case coordinator.WriteReservation:
			if a.Expect.Rev != w.resRev[a.Keyspace] {
				next = append(next, w.step(coordinator.WriteFailed{Action: a, Err: fmt.Errorf("conflict")})...)
				continue
			}
			w.rev++
			if len(a.Reservation.Members) == 0 {
				delete(w.res, a.Keyspace)
				delete(w.resRev, a.Keyspace)
				next = append(next, w.step(coordinator.ReservationDeleted{Keyspace: a.Keyspace})...)
				continue
			}
			w.res[a.Keyspace], w.resRev[a.Keyspace] = a.Reservation, w.rev
			next = append(next, w.step(coordinator.ReservationPut{Keyspace: a.Keyspace, Reservation: a.Reservation, Rev: w.rev})...)
		case coordinator.RevokeSession:
			w.revokedSess[a.Session] = true
			qttl := w.checkRevoke(a)
			if len(a.Quarantine) > 0 && qttl > 0 {
				w.rev++
				until := w.now.Add(qttl)
				if _, ok := w.quar[a.Keyspace][a.ID]; ok {
					// The server keeps the expiry of the quarantine it
					// replaces if that is later.
					until = maxTime(until, w.quarUntil[a.Keyspace][a.ID])
				}
				w.quar[a.Keyspace][a.ID] = slices.Clone(a.Quarantine)
				w.quarUntil[a.Keyspace][a.ID] = until
				next = append(next, w.step(coordinator.QuarantinePut{Keyspace: a.Keyspace, ID: a.ID, Quarantine: shard.Quarantine{Session: a.Session, Buckets: a.Quarantine}})...)
			}
			next = append(next, w.expire(a.Keyspace, a.ID, a.Session)...)
		}
	nextAction:
	}
	w.pending = append(w.pending[:0], next...)
	return next
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// revokedHold is a bucket a revoked session held without releasing it.
type revokedHold struct {
	id      string
	session shard.LeaseID
	until   time.Time // its last acknowledged keep-alive + TTL
}

// checkRevoke checks a revocation against the quarantine invariants and
// returns the quarantine's TTL as the server computes it (0: none). Every
// bucket the session holds and has not released must be quarantined, the
// TTL must not exceed the keyspace's lease TTL, and the quarantine must
// last until the session's holder can no longer act (its last
// acknowledged keep-alive + TTL) but never beyond the old lease's
// remaining time + TTL. A member that is not superseded keeps alive
// promptly here: its last acknowledged keep-alive is now.
func (w *world) checkRevoke(a coordinator.RevokeSession) time.Duration {
	ttl := w.keyspaces[a.Keyspace].LeaseTTL
	lastAck := w.now
	if at, ok := w.replacedAt[a.Session]; ok {
		lastAck = at
	}
	remaining := max(lastAck.Add(ttl).Sub(w.now), 0)
	qttl := a.TTL
	if a.Superseded {
		// The server reads what remains of the lease from etcd, which
		// rounds down to whole seconds, and adds a second.
		qttl = min(a.TTL, remaining.Truncate(time.Second)+time.Second)
		if remaining == 0 {
			qttl = 0 // the lease is gone, and with it the session's keys
		}
	}
	if a.TTL > ttl {
		w.violation = append(w.violation, fmt.Sprintf("revoke of %s: quarantine TTL %v above the lease TTL %v", a.ID, a.TTL, ttl))
	}
	if qttl > remaining+ttl {
		w.violation = append(w.violation, fmt.Sprintf("revoke of %s: quarantine of %v outlasts the old lease's remaining %v + TTL %v", a.ID, qttl, remaining, ttl))
	}
	g, held := w.grants[a.Keyspace][a.ID]
	if !held || g.Session != a.Session {
		return qttl
	}
	quarantined := map[int]bool{}
	for _, b := range a.Quarantine {
		quarantined[b] = true
	}
	for _, bt := range g.Buckets {
		if w.released(a.Keyspace, a.ID, bt) || w.fencedSess[a.Session] {
			continue
		}
		if !quarantined[bt.Bucket] {
			w.violation = append(w.violation, fmt.Sprintf("revoke of %s session %v: bucket %d held and not released, but not quarantined", a.ID, a.Session, bt.Bucket))
		}
		if until := lastAck.Add(ttl); w.now.Before(until) {
			if qttl > 0 && w.now.Add(qttl).Before(until) {
				w.violation = append(w.violation, fmt.Sprintf("revoke of %s session %v: quarantine of %v ends before its holder's deadline %v", a.ID, a.Session, qttl, until.Format(time.TimeOnly)))
			}
			w.mayAct[a.Keyspace][bt.Bucket] = revokedHold{id: a.ID, session: a.Session, until: until}
		}
	}
	return qttl
}

// expireQuarantines deletes, as etcd would, every quarantine whose lease
// has run out by now.
func (w *world) expireQuarantines(ks string) []coordinator.Action {
	var acts []coordinator.Action
	ids := make([]string, 0, len(w.quar[ks]))
	for id := range w.quar[ks] {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if w.now.Before(w.quarUntil[ks][id]) {
			continue
		}
		delete(w.quar[ks], id)
		delete(w.quarUntil[ks], id)
		acts = append(acts, w.step(coordinator.QuarantineDeleted{Keyspace: ks, ID: id})...)
	}
	return acts
}

// settle applies actions until the machine asks for nothing more.
func (w *world) settle() {
	for range 100 {
		if len(w.apply()) == 0 && len(w.pending) == 0 {
			return
		}
	}
	w.violation = append(w.violation, "did not settle in 100 rounds")
}

func (w *world) released(ks, id string, bt shard.BucketToken) bool {
	for _, r := range w.releases[ks][id] {
		if r.Bucket == bt.Bucket && r.Token == bt.Token {
			return true
		}
	}
	return false
}

func (w *world) heldAt(ks, id string, bt shard.BucketToken) bool {
	for _, have := range w.grants[ks][id].Buckets {
		if have == bt {
			return true
		}
	}
	return false
}

func (w *world) expectsHold(a coordinator.WriteGrants) bool {
	for _, e := range a.Expects {
		switch e.Kind {
		case coordinator.KeyGrants:
			if w.grantRev[a.Keyspace][e.ID] != e.Rev {
				return false
			}
		case coordinator.KeyTokens:
			if w.tokenRev[a.Keyspace] != e.Rev {
				return false
			}
		case coordinator.KeyCommit:
			if w.commitRev[a.Keyspace][e.ID] != e.Rev {
				return false
			}
		case coordinator.KeyBucketPos:
			if e.Chunk != 0 && e.Rev != 0 || e.Chunk == 0 && w.bposRev[a.Keyspace] != e.Rev {
				return false
			}
		case coordinator.KeyHeld:
			if w.heldRev[a.Keyspace][e.ID] != e.Rev {
				return false
			}
		}
	}
	return true
}

// checkExclusive records a violation if two members hold one bucket.
func (w *world) checkExclusive(ks string) {
	seen := map[int]string{}
	for id, g := range w.grants[ks] {
		for _, bt := range g.Buckets {
			if other, ok := seen[bt.Bucket]; ok {
				w.violation = append(w.violation, fmt.Sprintf("bucket %d held by %s and %s", bt.Bucket, other, id))
			}
			seen[bt.Bucket] = id
		}
	}
}

// converged reports whether every bucket is granted to its target owner.
func (w *world) converged(ks string) bool {
	m := w.maps[ks]
	if m.Assignment.Buckets() == 0 {
		return false
	}
	holder := map[int]string{}
	for id, g := range w.grants[ks] {
		for _, bt := range g.Buckets {
			holder[bt.Bucket] = id
		}
	}
	for b := range m.Assignment.Buckets() {
		if t := m.Assignment.Owner(b); t != "" && holder[b] != t {
			return false
		}
	}
	return true
}

func formatActions(acts []coordinator.Action) string {
	var sb strings.Builder
	for _, a := range acts {
		switch a := a.(type) {
		case coordinator.WriteMap:
			fmt.Fprintf(&sb, "write-map %s epoch=%d moves=%d owners=%s\n", a.Keyspace, a.Map.Epoch, a.Moves, formatCounts(a.Map.Assignment))
		case coordinator.WriteGrants:
			fmt.Fprintf(&sb, "write-grants %s token=%d granted=%d released=%d\n", a.Keyspace, a.Token, a.Granted, a.Released)
			ids := make([]string, 0, len(a.Grants))
			for id := range a.Grants {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			for _, id := range ids {
				fmt.Fprintf(&sb, "  %s: %s\n", id, formatBuckets(a.Grants[id].Buckets))
			}
		case coordinator.WriteReservation:
			fmt.Fprintf(&sb, "write-reservation %s members=%v joined=%v expired=%v\n", a.Keyspace, a.Reservation.Members, a.Joined, a.Expired)
		case coordinator.RevokeSession:
			fmt.Fprintf(&sb, "revoke %s %s session=%v quarantine=%v superseded=%v reason=%q\n", a.Keyspace, a.ID, a.Session, a.Quarantine, a.Superseded, a.Reason)
		case coordinator.Report:
			fmt.Fprintf(&sb, "report %s %s: %s\n", a.Keyspace, a.Kind, a.Message)
		}
	}
	if sb.Len() == 0 {
		return "ok\n"
	}
	return sb.String()
}

func formatCounts(a placement.Assignment) string {
	c := a.Counts()
	ids := make([]string, 0, len(c))
	for id := range c {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var parts []string
	for _, id := range ids {
		parts = append(parts, fmt.Sprintf("%s:%d", id, c[id]))
	}
	return strings.Join(parts, ",")
}

// formatBuckets prints buckets as ranges with their token: 0-3@1 4@2.
func formatBuckets(bts []shard.BucketToken) string {
	if len(bts) == 0 {
		return "-"
	}
	var parts []string
	for i := 0; i < len(bts); {
		j := i
		for j+1 < len(bts) && bts[j+1].Bucket == bts[j].Bucket+1 && bts[j+1].Token == bts[i].Token {
			j++
		}
		if j == i {
			parts = append(parts, fmt.Sprintf("%d@%d", bts[i].Bucket, bts[i].Token))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d@%d", bts[i].Bucket, bts[j].Bucket, bts[i].Token))
		}
		i = j + 1
	}
	return strings.Join(parts, " ")
}
