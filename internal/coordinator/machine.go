package coordinator

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/placement"
)

// Machine is the leader's state machine. It holds the last observed state
// of every keyspace and returns the writes that move the store towards
// the balanced, fully granted map. A Machine lives for one term of
// leadership: the leader's loop makes one once it is elected and drops it
// when the term ends.
//
// Machine is not safe for concurrent use; internal/server owns it from one
// goroutine. It reads no clock and does no IO: time comes in with every
// step.
type Machine struct {
	keyspaces map[string]*keyspace
	// dirty are the keyspaces an event touched since they were last
	// planned; a Tick (drain timeouts) or a Reset marks all.
	dirty    map[string]bool
	allDirty bool
	// epochGap is the least time between two maps of a keyspace that only
	// rebalance onto members that are all still there (joins, weights):
	// see SetEpochGap. 0: no gap.
	epochGap time.Duration
}

// keyspace is everything observed about one keyspace.
type keyspace struct {
	cfg      shard.Keyspace
	known    bool // a KeyspacePut was seen
	members  map[string]shard.Member
	drains   map[string]drain
	m        shard.Map
	mapRev   Rev
	hasMap   bool
	grants   map[string]shard.Grants
	grantRev map[string]Rev
	releases map[string]map[int]uint64
	tokens   uint64
	tokenRev Rev
	quar     map[string][]int // quarantine id → buckets

	// Stream keyspaces: the members' commit records, the pieces of the
	// bucket positions, the final positions releases carry (member →
	// bucket → position), and the copies of the members' grants, which
	// outlive their sessions until the leader folds their commit records.
	commits   map[string]shard.Commit
	commitRev map[string]Rev
	chunks    map[int]shard.BucketPositions
	chunkRev  map[int]Rev
	relPos    map[string]map[int]uint64
	held      map[string]shard.Held
	heldRev   map[string]Rev

	// An import's reservation: the imported instances not joined yet, which
	// the balancer counts as members until res.Until (reserve.go).
	res         shard.Reservation
	resRev      Rev
	hasRes      bool
	resInflight bool

	// idx indexes grants and releases by bucket (index.go); ids interns
	// member ids for it.
	idx bucketIndex
	ids map[string]string
	// What changed since the index was last brought in step: the grants
	// and releases records before the changes, and whether the map did.
	pendGrants map[string]shard.Grants
	pendRel    map[string]map[int]uint64
	mapChanged bool
	// mapUnassigned counts the buckets the map gives nobody.
	mapUnassigned int
	// grew: a member joined, became active, changed weight or zone, or
	// stopped draining since the last Balance.
	grew bool
	// balanced: the last Balance over the current map and members moved
	// nothing, and nothing it reads has changed since (apply clears it).
	balanced bool

	// lastMapAt is when the machine last planned a map write; deferred,
	// when a rebalance waits for the epoch gap, is when it may be written
	// (zero: none waits).
	lastMapAt time.Time
	deferred  time.Time
	// moving is how many buckets the last drain scan found not held by
	// their target (handed over, or waiting for a grant).
	moving int

	mapInflight    uint64 // epoch written, awaiting its echo; 0 = none
	grantsInflight uint64 // token written, awaiting its echo; 0 = none
	revokeInflight map[shard.LeaseID]bool
	revoked        map[string]shard.LeaseID // member id → its last session seen revoked
}

// drain is a member's drain request as the machine keeps it: whether the
// member leaves, and the session the request is bound to (0: its current
// one).
type drain struct {
	leave   bool
	session shard.LeaseID
}

// New returns a Machine that knows nothing yet. Feed it the store's state
// (a Reset, then every record, in one StepAll) before acting on what it
// returns.
func New() *Machine {
	return &Machine{keyspaces: map[string]*keyspace{}, dirty: map[string]bool{}, allDirty: true}
}

// SetEpochGap sets the least time between two maps of one keyspace when
// the newer one only moves buckets between members that are all still
// there and not draining: joins and weight changes. Such a map then waits
// until gap has passed since the last one, and gathers every join in
// between: a storm of 1,000 joins becomes a few epochs rather than one
// per join, each moving buckets the next moves again. A map that places
// unassigned buckets, or moves them off a member that crashed, left or
// is draining, is written at once (and takes the waiting joins with it).
// Grants, releases and revocations go on over the current map meanwhile.
// Wake says when to step again. 0, the default, writes every map at once.
func (m *Machine) SetEpochGap(gap time.Duration) { m.epochGap = gap }

// Wake returns the earliest time a keyspace's deferred map may be
// written, and false if none waits. The caller steps the machine (a Tick
// will do) at that time.
func (m *Machine) Wake() (time.Time, bool) {
	var at time.Time
	for _, k := range m.keyspaces {
		if !k.deferred.IsZero() && (at.IsZero() || k.deferred.Before(at)) {
			at = k.deferred
		}
	}
	return at, !at.IsZero()
}

func (m *Machine) ks(name string) *keyspace {
	k := m.keyspaces[name]
	if k == nil {
		k = &keyspace{
			members:        map[string]shard.Member{},
			drains:         map[string]drain{},
			grants:         map[string]shard.Grants{},
			grantRev:       map[string]Rev{},
			releases:       map[string]map[int]uint64{},
			quar:           map[string][]int{},
			revokeInflight: map[shard.LeaseID]bool{},
			revoked:        map[string]shard.LeaseID{},
			commits:        map[string]shard.Commit{},
			commitRev:      map[string]Rev{},
			chunks:         map[int]shard.BucketPositions{},
			chunkRev:       map[int]Rev{},
			relPos:         map[string]map[int]uint64{},
			held:           map[string]shard.Held{},
			heldRev:        map[string]Rev{},
		}
		m.keyspaces[name] = k
	}
	return k
}

// MinLeaseTTL returns the shortest member lease TTL of the keyspaces the
// machine knows, or 0 while it knows none. The server bounds each of its
// writes by a fraction of it, so that no write outlasts a member's lease.
func (m *Machine) MinLeaseTTL() time.Duration {
	var ttl time.Duration
	for _, k := range m.keyspaces {
		if k.known && (ttl == 0 || k.cfg.LeaseTTL < ttl) {
			ttl = k.cfg.LeaseTTL
		}
	}
	return ttl
}

// Step applies one event and returns the actions to take now.
func (m *Machine) Step(ev Event, now time.Time) []Action {
	return m.StepAll([]Event{ev}, now)
}

// StepAll applies several events observed together (for example one watch
// response, whose changes share a revision) and then plans once, so no
// action is computed from half of an atomic change.
func (m *Machine) StepAll(evs []Event, now time.Time) []Action {
	for _, ev := range evs {
		m.apply(ev)
	}
	var acts []Action
	names := make([]string, 0, len(m.keyspaces))
	for name := range m.keyspaces {
		if m.allDirty || m.dirty[name] {
			names = append(names, name)
		}
	}
	m.allDirty = false
	clear(m.dirty)
	sort.Strings(names)
	for _, name := range names {
		acts = append(acts, m.plan(name, m.keyspaces[name], now)...)
	}
	return acts
}

func (m *Machine) apply(ev Event) {
	name := eventKeyspace(ev)
	if name != "" {
		m.dirty[name] = true
	} else {
		m.allDirty = true // Tick, Reset
	}
	switch ev.(type) {
	case KeyspacePut, MemberPut, MemberDeleted, DrainPut, DrainDeleted, MapPut, ReservationPut, ReservationDeleted, WriteFailed:
		// What Balance reads changed: plan balances again.
		if k := m.keyspaces[name]; k != nil {
			k.balanced = false
		}
	}
	switch e := ev.(type) {
	case KeyspacePut:
		k := m.ks(e.Keyspace.Name)
		k.cfg, k.known = e.Keyspace, true // the bucket count may have changed: index() checks
	case KeyspaceDeleted:
		delete(m.keyspaces, e.Name)
	case MemberPut:
		k := m.ks(e.Keyspace)
		if prev, ok := k.members[e.Member.ID]; !ok || prev.Weight != e.Member.Weight || prev.Pending != e.Member.Pending || prev.Zone != e.Member.Zone {
			k.grew = true
		}
		k.members[e.Member.ID] = e.Member
	case MemberDeleted:
		k := m.ks(e.Keyspace)
		delete(k.members, e.ID)
		delete(k.revoked, e.ID)
		k.forget(e.ID)
	case DrainPut:
		m.ks(e.Keyspace).drains[e.ID] = drain{leave: e.Drain.Leave, session: e.Session}
	case DrainDeleted:
		k := m.ks(e.Keyspace)
		delete(k.drains, e.ID)
		k.grew = true
	case MapPut:
		k := m.ks(e.Keyspace)
		k.m, k.mapRev, k.hasMap = k.internMap(e.Map), e.Rev, true
		k.mapUnassigned = 0
		for b := range k.m.Assignment.Buckets() {
			if k.m.Assignment.Owner(b) == "" {
				k.mapUnassigned++
			}
		}
		k.mapChanged = true
		if k.mapInflight != 0 && e.Map.Epoch >= k.mapInflight {
			k.mapInflight = 0
		}
	case GrantsPut:
		k := m.ks(e.Keyspace)
		k.grantsChanged(e.ID, k.grants[e.ID])
		k.grants[e.ID], k.grantRev[e.ID] = e.Grants, e.Rev
	case GrantsDeleted:
		k := m.ks(e.Keyspace)
		if g, ok := k.grants[e.ID]; ok {
			if k.revokeInflight[g.Session] {
				k.revoked[e.ID] = g.Session
			}
			delete(k.revokeInflight, g.Session)
			k.grantsChanged(e.ID, g)
		}
		delete(k.grants, e.ID)
		delete(k.grantRev, e.ID)
		k.forget(e.ID)
	case ReleasesPut:
		rel := make(map[int]uint64, len(e.Releases.Buckets))
		pos := map[int]uint64{}
		for _, bt := range e.Releases.Buckets {
			rel[bt.Bucket] = bt.Token
			if bt.Position > 0 {
				pos[bt.Bucket] = bt.Position
			}
		}
		k := m.ks(e.Keyspace)
		old := k.releases[e.ID]
		k.releases[e.ID], k.relPos[e.ID] = rel, pos
		k.releasesChanged(e.ID, old)
	case ReleasesDeleted:
		k := m.ks(e.Keyspace)
		old := k.releases[e.ID]
		delete(k.releases, e.ID)
		delete(k.relPos, e.ID)
		k.releasesChanged(e.ID, old)
	case CommitPut:
		k := m.ks(e.Keyspace)
		k.commits[e.ID], k.commitRev[e.ID] = e.Commit, e.Rev
	case CommitDeleted:
		k := m.ks(e.Keyspace)
		delete(k.commits, e.ID)
		delete(k.commitRev, e.ID)
	case HeldPut:
		k := m.ks(e.Keyspace)
		k.held[e.ID], k.heldRev[e.ID] = e.Held, e.Rev
	case HeldDeleted:
		k := m.ks(e.Keyspace)
		delete(k.held, e.ID)
		delete(k.heldRev, e.ID)
	case BucketPosPut:
		k := m.ks(e.Keyspace)
		k.chunks[e.Chunk], k.chunkRev[e.Chunk] = e.Positions, e.Rev
	case BucketPosDeleted:
		k := m.ks(e.Keyspace)
		delete(k.chunks, e.Chunk)
		delete(k.chunkRev, e.Chunk)
	case TokensPut:
		k := m.ks(e.Keyspace)
		k.tokens, k.tokenRev = e.Token, e.Rev
		if k.grantsInflight != 0 && e.Token >= k.grantsInflight {
			k.grantsInflight = 0
		}
	case QuarantinePut:
		m.ks(e.Keyspace).quar[e.ID] = slices.Clone(e.Quarantine.Buckets)
	case QuarantineDeleted:
		delete(m.ks(e.Keyspace).quar, e.ID)
	case ReservationPut:
		k := m.ks(e.Keyspace)
		k.res, k.resRev, k.hasRes, k.resInflight = e.Reservation, e.Rev, true, false
	case ReservationDeleted:
		k := m.ks(e.Keyspace)
		k.res, k.resRev, k.hasRes, k.resInflight = shard.Reservation{}, 0, false, false
	case Reset:
		gap := m.epochGap
		*m = *New()
		m.epochGap = gap
	case WriteFailed:
		switch a := e.Action.(type) {
		case WriteMap:
			m.ks(a.Keyspace).mapInflight = 0
		case WriteGrants:
			m.ks(a.Keyspace).grantsInflight = 0
		case RevokeSession:
			delete(m.ks(a.Keyspace).revokeInflight, a.Session)
		case WriteReservation:
			m.ks(a.Keyspace).resInflight = false
		}
	case Tick:
	}
}

// eventKeyspace returns the keyspace an event concerns, or "" for events
// that concern all of them.
func eventKeyspace(ev Event) string {
	switch e := ev.(type) {
	case KeyspacePut:
		return e.Keyspace.Name
	case KeyspaceDeleted:
		return e.Name
	case MemberPut:
		return e.Keyspace
	case MemberDeleted:
		return e.Keyspace
	case DrainPut:
		return e.Keyspace
	case DrainDeleted:
		return e.Keyspace
	case MapPut:
		return e.Keyspace
	case GrantsPut:
		return e.Keyspace
	case GrantsDeleted:
		return e.Keyspace
	case ReleasesPut:
		return e.Keyspace
	case ReleasesDeleted:
		return e.Keyspace
	case TokensPut:
		return e.Keyspace
	case QuarantinePut:
		return e.Keyspace
	case QuarantineDeleted:
		return e.Keyspace
	case CommitPut:
		return e.Keyspace
	case CommitDeleted:
		return e.Keyspace
	case HeldPut:
		return e.Keyspace
	case HeldDeleted:
		return e.Keyspace
	case BucketPosPut:
		return e.Keyspace
	case BucketPosDeleted:
		return e.Keyspace
	case ReservationPut:
		return e.Keyspace
	case ReservationDeleted:
		return e.Keyspace
	case WriteFailed:
		switch a := e.Action.(type) {
		case WriteMap:
			return a.Keyspace
		case WriteGrants:
			return a.Keyspace
		case RevokeSession:
			return a.Keyspace
		case WriteReservation:
			return a.Keyspace
		}
	}
	return ""
}

// effectiveMembers are the members that the balancer sees: joined members,
// with weight 0 while draining. Members that are leaving are left out, so
// their buckets move even when nobody can take them (they become
// unassigned), while a drained member that stays keeps its buckets if it is
// the last one.
//
// A pending member (its session has not kept alive yet) is left out too,
// unless the map already gives it buckets: a Join that arrives late, from
// a process that is gone, then moves nothing, while a restarted process
// that replaced its session keeps its place.
//
// An imported instance that has not joined yet counts as a member of
// weight 1 until the reservation's deadline (reserve.go), so its buckets
// stay where the import put them, granted to nobody.
func (k *keyspace) effectiveMembers(now time.Time) []placement.Member {
	out := make([]placement.Member, 0, len(k.members))
	var counts map[string]int
	for id, mem := range k.members {
		if mem.Pending {
			if counts == nil {
				counts = k.m.Assignment.Counts()
			}
			if counts[id] == 0 {
				continue
			}
		}
		w := mem.Weight
		if d, draining := k.drainOf(id); draining {
			if d.leave {
				continue
			}
			w = 0
		}
		out = append(out, placement.Member{ID: id, Weight: w, Zone: mem.Zone})
	}
	for _, id := range k.reserved(now) {
		out = append(out, placement.Member{ID: id, Weight: 1})
	}
	return out
}

func (m *Machine) plan(name string, k *keyspace, now time.Time) []Action {
	// A held-back map is planned again now, or when the map in flight
	// comes back (its echo is an event of this keyspace).
	k.deferred = time.Time{}
	if !k.known || k.mapInflight != 0 {
		return nil
	}
	// 1. The map: rebalance over the live members.
	cur := k.m.Assignment
	if !k.hasMap || cur.Buckets() != k.cfg.Buckets {
		cur = placement.NewAssignment(k.cfg.Buckets)
	}
	// Balance is skipped when it found nothing to move and nothing it
	// reads has changed since: most steps only carry releases and grants.
	// (Not with a reservation: its deadline changes the members by time.)
	var p placement.Plan
	if k.balanced && k.hasMap && !k.hasRes && cur.Buckets() == k.cfg.Buckets {
		p.Assignment = cur
	} else if due, ok := k.holdWithoutBalance(m.epochGap, now); ok {
		// Whatever Balance would move now only rebalances, and waits
		// until due: a storm of joins is not balanced at every step.
		p.Assignment = cur
		k.deferred = due
	} else {
		var err error
		k.grew = false
		if p, err = placement.Balance(cur, k.effectiveMembers(now)); err != nil {
			return []Action{Report{Keyspace: name, Kind: "invalid-state", Message: err.Error()}}
		}
		k.balanced = k.hasMap && len(p.Moves) == 0
	}
	if k.hasMap && len(p.Moves) > 0 && m.epochGap > 0 && k.onlyRebalances(p.Moves) {
		if due := k.heldUntil(m.epochGap); now.Before(due) {
			k.deferred = due
			p.Moves = nil // the current map stays until due
		}
	}
	if !k.hasMap || len(p.Moves) > 0 {
		epoch := k.m.Epoch + 1
		k.mapInflight = epoch
		k.lastMapAt = now
		w := k.explain(cur, p.Moves)
		return []Action{WriteMap{
			Keyspace: name,
			Map:      shard.Map{Epoch: epoch, Hash: k.cfg.Hash, Assignment: p.Assignment},
			Expect:   Expect{Kind: KeyMap, Rev: k.mapRev},
			Moves:    len(p.Moves),
			Reason:   w.reason,
			Members:  w.members,
			Pairs:    Pairs(p.Moves),
			Detail:   w.detail,
		}}
	}

	var acts []Action
	// An import's reservation: drop the instances that joined, or all of
	// it once its deadline has passed (the map above no longer counts the
	// absent ones).
	acts = append(acts, k.reservationRound(name, now)...)

	// 2. Sessions to end: superseded sessions, drains past their timeout,
	// members that asked to leave and hold nothing.
	acts = append(acts, m.revocations(name, k, now)...)

	// A map held back for the last one's handoffs is due once they are
	// done (the scan above counted them).
	if !k.deferred.IsZero() && k.moving == 0 {
		k.deferred = maxTime(k.lastMapAt.Add(m.epochGap), now)
	}

	// 3. Grants: release what was released, grant what is free.
	if k.grantsInflight == 0 {
		if a, ok := k.grantRound(name); ok {
			k.grantsInflight = a.Token
			acts = append(acts, a)
		}
	}
	return acts
}

// holdFactor bounds how long a map that only rebalances waits for the
// last map's handoffs: holdFactor epoch gaps after the last map (2 s with
// the default 250 ms), so that a member slow to release does not hold up
// joins until its drain timeout.
const holdFactor = 8

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// holdWithoutBalance returns when a map may next be written, and true,
// if members joined or changed weight since the last Balance and any map
// planned now would only rebalance (every member the current
// map names is still joined and not draining, and it leaves no bucket
// unassigned) and so would be held back until then: Balance need not run
// before.
func (k *keyspace) holdWithoutBalance(gap time.Duration, now time.Time) (time.Time, bool) {
	if !k.grew || gap <= 0 || !k.hasMap || k.hasRes || k.mapUnassigned != 0 || k.m.Assignment.Buckets() != k.cfg.Buckets {
		return time.Time{}, false
	}
	due := k.heldUntil(gap)
	if !now.Before(due) {
		return time.Time{}, false
	}
	for _, id := range k.m.Assignment.Members {
		if !k.stays(id) {
			return time.Time{}, false
		}
	}
	return due, true
}

// heldUntil is when a map that only rebalances may be written: gap after
// the last map, or, while the last map's handoffs are still going (a new
// map now would move some of their buckets again), once they are done or
// holdFactor gaps have passed.
func (k *keyspace) heldUntil(gap time.Duration) time.Time {
	if k.moving > 0 {
		return k.lastMapAt.Add(holdFactor * gap)
	}
	return k.lastMapAt.Add(gap)
}

// stays reports whether member id is joined and not draining: a move off
// it only rebalances.
func (k *keyspace) stays(id string) bool {
	if _, joined := k.members[id]; !joined {
		return false
	}
	_, draining := k.drainOf(id)
	return !draining
}

// onlyRebalances reports whether every move takes a bucket from a member
// that is still joined and not draining: nothing is unassigned or
// orphaned, so the move may wait.
func (k *keyspace) onlyRebalances(moves []placement.Move) bool {
	for i, mv := range moves {
		if i > 0 && mv.From == moves[i-1].From { // moves come in runs from one member
			continue
		}
		if !k.stays(mv.From) {
			return false
		}
	}
	return true
}

// replacedReason says why session was revoked: mem replaced it.
func replacedReason(mem shard.Member, session shard.LeaseID) string {
	if mem.ReplacesFenced && mem.Replaces == session {
		return fmt.Sprintf("replaced by session %v; its holder had fenced itself", mem.Session)
	}
	return fmt.Sprintf("replaced by session %v", mem.Session)
}

// forget drops member id's interned name once nothing of it is left.
func (k *keyspace) forget(id string) {
	if _, ok := k.members[id]; !ok {
		if _, ok := k.grants[id]; !ok {
			delete(k.ids, id)
		}
	}
}

// drainOf returns member id's drain request, if one applies to its
// current session.
func (k *keyspace) drainOf(id string) (drain, bool) {
	d, ok := k.drains[id]
	if !ok || (d.session != 0 && d.session != k.members[id].Session) {
		return drain{}, false
	}
	return d, true
}

func (m *Machine) revocations(name string, k *keyspace, now time.Time) []Action {
	x := k.index()
	var acts []Action
	revoke := func(id string, session shard.LeaseID, superseded bool, reason string, kind ReportKind) {
		if k.revokeInflight[session] {
			return
		}
		if k.grantsInflight != 0 {
			// A grants write in flight may still add buckets to this
			// session: revoke once it has landed or failed, so that the
			// quarantine covers everything the session holds.
			return
		}
		k.revokeInflight[session] = true
		// Quarantine what the session holds and has not released: a
		// released bucket is acted on by nobody, so its new owner need not
		// wait out the old lease. Nor does anything of a session whose
		// holder fenced itself and said so when it replaced it.
		var q []int
		mem := k.members[id]
		fenced := superseded && mem.Replaces == session && mem.ReplacesFenced
		if g, ok := k.grants[id]; ok && g.Session == session && !fenced {
			rel := k.releases[id]
			for _, bt := range g.Buckets {
				b := bt.Bucket
				if b >= 0 && b < len(x.holder) && x.holder[b] == id && x.token[b] == bt.Token {
					if !x.released[b] { // the index answers without a map lookup
						q = append(q, b)
					}
				} else if rel[b] != bt.Token {
					q = append(q, b)
				}
			}
		}
		// The member's quarantine key holds one quarantine: a second one
		// before the first is over must keep the first one's buckets (and
		// the server keeps its expiry if later), or they would be granted
		// while an earlier session of the member may still act on them.
		if len(q) > 0 && len(k.quar[id]) > 0 {
			q = append(q, k.quar[id]...)
			sort.Ints(q)
			q = slices.Compact(q)
		}
		acts = append(acts,
			RevokeSession{Keyspace: name, ID: id, Session: session, Quarantine: q, TTL: k.cfg.LeaseTTL, Superseded: superseded, Reason: reason},
			Report{Keyspace: name, Kind: kind, Message: fmt.Sprintf("member %s session %v: %s", id, session, reason)})
	}

	ids := make([]string, 0, len(k.grants))
	for id := range k.grants {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		g := k.grants[id]
		if mem, ok := k.members[id]; ok && mem.Session != g.Session {
			revoke(id, g.Session, true, replacedReason(mem, g.Session), ReportReplaced)
		}
	}
	// A replaced session that holds nothing (as far as the grants go: the
	// leader is their only writer) is revoked too, without quarantine.
	mids := make([]string, 0, len(k.members))
	for id, mem := range k.members {
		if mem.Replaces != 0 && mem.Replaces != mem.Session && k.grants[id].Session != mem.Replaces && k.revoked[id] != mem.Replaces {
			mids = append(mids, id)
		}
	}
	sort.Strings(mids)
	for _, id := range mids {
		mem := k.members[id]
		revoke(id, mem.Replaces, true, replacedReason(mem, mem.Replaces), ReportReplaced)
	}

	// Drain timeouts: a holder asked to release (target moved away) for
	// longer than the keyspace's drain timeout loses its session. The
	// scan visits the unsettled buckets only (index.go).
	late := map[string]int{}
	k.moving = 0
	x.eachUnsettled(func(b int) {
		h, owner := x.holder[b], k.m.Assignment.Owner(b)
		if h != owner {
			k.moving++
		}
		if h == "" || h == owner || x.released[b] {
			x.waitSince[b] = time.Time{}
			return
		}
		since := x.waitSince[b]
		if since.IsZero() {
			x.waitSince[b] = now
			return
		}
		if k.cfg.DrainTimeout > 0 && now.Sub(since) >= k.cfg.DrainTimeout {
			late[h]++
		}
	})
	lateIDs := make([]string, 0, len(late))
	for id := range late {
		lateIDs = append(lateIDs, id)
	}
	sort.Strings(lateIDs)
	for _, id := range lateIDs {
		if g, ok := k.grants[id]; ok {
			revoke(id, g.Session, false, fmt.Sprintf("%d buckets not released within the drain timeout %v", late[id], k.cfg.DrainTimeout), ReportDrainTimeout)
		}
	}

	// Members that asked to leave and hold and own nothing.
	leaving := make([]string, 0)
	for id := range k.drains {
		if d, ok := k.drainOf(id); ok && d.leave {
			leaving = append(leaving, id)
		}
	}
	sort.Strings(leaving)
	var counts map[string]int
	if len(leaving) > 0 {
		counts = k.m.Assignment.Counts() // a pass over every bucket: only when someone leaves
	}
	for _, id := range leaving {
		mem, ok := k.members[id]
		if !ok || counts[id] > 0 || len(k.grants[id].Buckets) > 0 {
			continue
		}
		if k.revokeInflight[mem.Session] {
			continue
		}
		k.revokeInflight[mem.Session] = true
		acts = append(acts,
			RevokeSession{Keyspace: name, ID: id, Session: mem.Session, TTL: k.cfg.LeaseTTL, Reason: "left after draining"},
			Report{Keyspace: name, Kind: ReportLeft, Message: fmt.Sprintf("member %s left after draining", id)})
	}
	return acts
}

// grantRound computes one round of grant changes, or false if nothing can
// change now.
func (k *keyspace) grantRound(name string) (WriteGrants, bool) {
	x := k.index()
	quarantined := map[int]bool{}
	for _, bs := range k.quar {
		for _, b := range bs {
			quarantined[b] = true
		}
	}
	newToken := k.tokens + 1
	next := map[string]map[int]shard.BucketToken{} // touched member → bucket → grant
	touch := func(id string) map[int]shard.BucketToken {
		if g, ok := next[id]; ok {
			return g
		}
		g := map[int]shard.BucketToken{}
		for _, bt := range k.grants[id].Buckets {
			g[bt.Bucket] = bt
		}
		next[id] = g
		return g
	}
	f := k.newFold()
	canReceive := func(id string) bool {
		mem, ok := k.members[id]
		if !ok || mem.Session == 0 || mem.Pending || k.revokeInflight[mem.Session] {
			return false
		}
		if c, ok := k.commits[id]; ok && c.Session != mem.Session && !f.folds(id) {
			return false // an earlier session's positions are not folded yet
		}
		g, has := k.grants[id]
		return !has || g.Session == mem.Session
	}
	// revoking: holders whose session this leader is revoking. Their
	// grants key goes with the session (the lease's revocation deletes
	// it, or the quarantine's transaction does): a round that wrote it
	// would expect a revision etcd no longer has and fail as a whole,
	// holding up every other handoff of the keyspace until the deletion's
	// echo arrives. Their buckets wait for that echo (GrantsDeleted):
	// then the released ones are free and the rest quarantined.
	revoking := func(id string) bool {
		g, ok := k.grants[id]
		return ok && k.revokeInflight[g.Session]
	}
	// The loop visits the unsettled buckets (index.go): whether their
	// holder is being revoked is looked up once per run of its buckets,
	// and whether a target can receive once per
	// member of the map (not where commits are folded: that answer can
	// change within the round).
	var receive []int8 // per map member: 0 not asked yet, 1 can receive, 2 cannot
	if len(k.commits) == 0 {
		receive = make([]int8, len(k.m.Assignment.Members))
	}
	canReceiveIdx := func(o int32, target string) bool {
		if receive == nil || o < 0 || int(o) >= len(receive) {
			return canReceive(target)
		}
		if receive[o] == 0 {
			receive[o] = 2
			if canReceive(target) {
				receive[o] = 1
			}
		}
		return receive[o] == 1
	}
	owners := k.m.Assignment.Owners
	var lastH string
	var lastRevoking, seen bool
	granted, released := 0, 0
	x.eachUnsettled(func(b int) {
		target := k.m.Assignment.Owner(b)
		h := x.holder[b]
		if !seen || h != lastH {
			seen, lastH = true, h
			lastRevoking = h != "" && revoking(h)
		}
		if lastRevoking {
			return
		}
		// A holder that released a bucket it was not asked to (its target
		// is still the holder) gives it up all the same; it is granted
		// back at a new token below.
		if h != "" {
			if !x.released[b] {
				return // still waiting for the holder to release
			}
			delete(touch(h), b)
			f.release(h, b)
			released++
		}
		if target == "" || (len(quarantined) > 0 && quarantined[b]) {
			return
		}
		o := int32(-1)
		if b < len(owners) {
			o = owners[b]
		}
		if !canReceiveIdx(o, target) {
			return
		}
		touch(target)[b] = shard.BucketToken{Bucket: b, Token: newToken, Position: f.from(b)}
		granted++
	})
	if len(next) == 0 && !f.changes() {
		return WriteGrants{}, false
	}
	// Every round bumps the counter, even one that only releases, so that
	// its echo (the TokensPut) tells the machine the write landed.
	a := WriteGrants{Keyspace: name, Grants: map[string]shard.Grants{}, Token: newToken, Granted: granted, Released: released}
	ids := make([]string, 0, len(next))
	for id := range next {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		session := k.grants[id].Session
		if mem, ok := k.members[id]; ok && session == 0 {
			session = mem.Session
		}
		g := shard.Grants{Session: session}
		for _, bt := range next[id] {
			g.Buckets = append(g.Buckets, bt)
		}
		shard.SortPairs(g.Buckets)
		a.Grants[id] = g
		a.Expects = append(a.Expects, Expect{Kind: KeyGrants, ID: id, Rev: k.grantRev[id]})
	}
	a.Expects = append(a.Expects, Expect{Kind: KeyTokens, Rev: k.tokenRev})
	f.finish(&a)
	return a, true
}
