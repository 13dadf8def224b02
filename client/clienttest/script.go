package clienttest

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
)

// Defaults of keyshard serve that the fake gives what the test leaves
// out.
const (
	defaultBuckets      = 4096
	defaultHash         = "xxh64"
	defaultLeaseTTL     = 10 * time.Second
	defaultDrainTimeout = 30 * time.Second
)

// ReleaseRevisionBase is added to the revision with which the fake
// answers a Release. A store's revision is global, so the revision of a
// Release can be above every revision the session's grants answers showed
// so far. The fake makes it so, to let a test check that a worker carries
// it as min_revision in its later grants requests (which the fake, always
// up to date, does not need).
const ReleaseRevisionBase = 1000

// AddKeyspace creates keyspace name with buckets buckets (0: 4096) and a
// lease TTL of leaseTTL (0: 10 s), hashed with xxh64, exclusive, as
// Admin.CreateKeyspace does. Like a keyspace that no member has joined
// yet, it has no map until SetMap or Assign publishes its first epoch
// (keyshard serve publishes an empty map at epoch 1 soon after it creates
// a keyspace; SetMap(name, nil, nil) does the same here). A keyspace that
// exists takes this configuration and keeps its map.
func (s *Server) AddKeyspace(name string, buckets int, leaseTTL time.Duration) {
	s.PutKeyspace(&keyshardv1.Keyspace{Name: name, Buckets: uint32(buckets), LeaseTtl: durationpb.New(leaseTTL)})
}

// PutKeyspace creates or replaces a keyspace as given, for what
// AddKeyspace does not cover: any hash (one the client does not know, to
// test how it refuses it), mode or drain timeout. Zero fields take
// keyshard serve's defaults. The keyspace's map, if it has one, is kept.
func (s *Server) PutKeyspace(k *keyshardv1.Keyspace) {
	if s.tb != nil {
		s.tb.Helper()
	}
	k = proto.Clone(k).(*keyshardv1.Keyspace)
	if k.GetName() == "" {
		s.fatalf("PutKeyspace: the keyspace has no name")
	}
	withKeyspaceDefaults(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.keyspaces[k.Name]; old != nil {
		old.cfg = k
	} else {
		s.keyspaces[k.Name] = &keyspace{cfg: k}
	}
	s.notifyLocked()
}

func withKeyspaceDefaults(k *keyshardv1.Keyspace) {
	if k.Buckets == 0 {
		k.Buckets = defaultBuckets
	}
	if k.Hash == "" {
		k.Hash = defaultHash
	}
	if k.Mode == keyshardv1.KeyspaceMode_KEYSPACE_MODE_UNSPECIFIED {
		k.Mode = keyshardv1.KeyspaceMode_KEYSPACE_MODE_EXCLUSIVE
	}
	if k.GetLeaseTtl().AsDuration() <= 0 {
		k.LeaseTtl = durationpb.New(defaultLeaseTTL)
	}
	if k.GetDrainTimeout().AsDuration() <= 0 {
		k.DrainTimeout = durationpb.New(defaultDrainTimeout)
	}
}

// keyspaceLocked returns keyspace name, or an error if it does not exist.
func (s *Server) keyspaceLocked(name string) (*keyspace, error) {
	k := s.keyspaces[name]
	if k == nil {
		return nil, fmt.Errorf("keyspace %q does not exist; create it with AddKeyspace", name)
	}
	return k, nil
}

// Member is a member as a map names it.
type Member struct {
	ID      string
	Address string
}

// SetMap publishes a new map of keyspace at the next epoch and returns the
// epoch: owner(b) is the id of bucket b's owner, one of members, or ""
// for an unassigned bucket (a nil owner leaves every bucket unassigned).
// The members need not have joined: SetMap is what routers see, and
// grants nothing (Grant and AskRelease script the workers' side; Assign
// does both).
func (s *Server) SetMap(keyspace string, members []Member, owner func(bucket int) string) uint64 {
	if s.tb != nil {
		s.tb.Helper()
	}
	pm := make([]*keyshardv1.Member, len(members))
	for i, m := range members {
		pm[i] = &keyshardv1.Member{Id: m.ID, Address: m.Address}
	}
	epoch, err := s.setMap(keyspace, pm, owner)
	if err != nil {
		s.fatalf("SetMap: %v", err)
	}
	return epoch
}

func (s *Server) setMap(keyspace string, members []*keyshardv1.Member, owner func(int) string) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, err := s.keyspaceLocked(keyspace)
	if err != nil {
		return 0, err
	}
	return s.publishLocked(k, members, owner)
}

// publishLocked publishes the next map of k.
func (s *Server) publishLocked(k *keyspace, members []*keyshardv1.Member, owner func(int) string) (uint64, error) {
	idx := map[string]uint32{}
	for i, m := range members {
		idx[m.GetId()] = uint32(i + 1)
	}
	m := &keyshardv1.Map{Keyspace: k.cfg.Name, Epoch: k.m.GetEpoch() + 1, Buckets: k.cfg.Buckets, Hash: k.cfg.Hash,
		Members: members, Owners: make([]uint32, k.cfg.Buckets)}
	for b := range m.Owners {
		if owner == nil {
			continue
		}
		id := owner(b)
		if id == "" {
			continue
		}
		i, ok := idx[id]
		if !ok {
			return 0, fmt.Errorf("keyspace %q: owner(%d) = %q is not among the members", k.cfg.Name, b, id)
		}
		m.Owners[b] = i
	}
	k.m = m
	s.notifyLocked()
	return m.Epoch, nil
}

// Assign plays the leader: it publishes a new map of keyspace in which
// owner(b) owns bucket b ("" = unassigned), naming every member that has
// a live session, and moves the grants to match, as keyshard serve hands
// buckets over. A bucket no session holds is granted to its owner's
// session once the session has had a keep-alive answered (at once if it
// has), as keyshard serve grants nothing before; one that another session
// holds is asked back (listed for release) and granted to its owner once
// released or once that session ends. Every owner must have a live session (workers join
// by themselves; see WaitSession). It returns the map's epoch.
//
// From then on the fake keeps moving the keyspace's buckets to their
// owners after every release, session end and new session of an owner
// (a worker that re-joined gets its buckets back), until the next Assign;
// an owner that left or was drained (Leave, DrainMember) owns nothing;
// Grant, AskRelease and Revoke still script single changes.
func (s *Server) Assign(keyspace string, owner func(bucket int) string) uint64 {
	if s.tb != nil {
		s.tb.Helper()
	}
	epoch, err := s.assign(keyspace, owner)
	if err != nil {
		s.fatalf("Assign: %v", err)
	}
	return epoch
}

func (s *Server) assign(keyspace string, owner func(bucket int) string) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, err := s.keyspaceLocked(keyspace)
	if err != nil {
		return 0, err
	}
	var members []*keyshardv1.Member
	joined := map[string]bool{}
	for _, x := range s.sortedSessionsLocked(keyspace) {
		if !x.leaving {
			members = append(members, x.member)
			joined[x.member.GetId()] = true
		}
	}
	target := make([]string, k.cfg.Buckets)
	for b := range target {
		target[b] = owner(b)
		if id := target[b]; id != "" && !joined[id] {
			return 0, fmt.Errorf("keyspace %q: owner(%d) = %q has no live session", keyspace, b, id)
		}
	}
	epoch, err := s.publishLocked(k, members, func(b int) string { return target[b] })
	if err != nil {
		return 0, err
	}
	k.target = target
	s.settleLocked(k)
	return epoch, nil
}

// AssignAll is Assign of every bucket of keyspace to member, which must
// have joined: the one-member keyspace a handler's test usually starts
// with.
func (s *Server) AssignAll(keyspace, member string) uint64 {
	if s.tb != nil {
		s.tb.Helper()
	}
	return s.Assign(keyspace, func(int) string { return member })
}

// settleLocked moves k's grants toward the owners of its last Assign.
func (s *Server) settleLocked(k *keyspace) {
	if k.target == nil {
		return
	}
	holder := map[uint32]*sessionState{}
	for _, x := range s.sortedSessionsLocked(k.cfg.Name) {
		for b := range x.grants {
			holder[b] = x
		}
	}
	changed := false
	for b, id := range k.target {
		bb := uint32(b)
		var want *sessionState
		if id != "" {
			want = s.liveSessionLocked(k.cfg.Name, id)
		}
		if want != nil && (want.leaving || want.draining) {
			// A member that leaves or is drained owns nothing: its
			// buckets stay asked back until it released them.
			want = nil
		}
		switch h := holder[bb]; {
		case h == want && h != nil:
			if h.release[bb] {
				delete(h.release, bb) // it stays
				h.rev++
				changed = true
			}
		case h != nil:
			if !h.release[bb] {
				h.release[bb] = true
				h.rev++
				changed = true
			}
		case want != nil && want.active:
			s.grantLocked(want, bb)
			changed = true
		}
	}
	if changed {
		s.notifyLocked()
	}
}

// sessionLocked returns session id, or an error if it is unknown.
func (s *Server) sessionLocked(id string) (*sessionState, error) {
	x := s.sessions[id]
	if x == nil {
		return nil, fmt.Errorf("no session %q (a worker's EventJoined names its session, and so does Session)", id)
	}
	return x, nil
}

// withSession calls f with session id under the lock, and fails the test
// naming fn if the session is unknown or f returns an error.
func (s *Server) withSession(fn, id string, f func(x *sessionState) error) {
	if s.tb != nil {
		s.tb.Helper()
	}
	err := func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		x, err := s.sessionLocked(id)
		if err != nil {
			return err
		}
		return f(x)
	}()
	if err != nil {
		s.fatalf("%s: %v", fn, err)
	}
}

// Grant grants bucket to session at a new fencing token, above every
// token the fake gave before, and returns the token. A grant the session
// holds already is replaced, as when the server takes a bucket back and
// grants it again. The session must be live; Grant takes nothing from
// another session that holds the bucket.
func (s *Server) Grant(session string, bucket int) uint64 {
	if s.tb != nil {
		s.tb.Helper()
	}
	var tok uint64
	s.withSession("Grant", session, func(x *sessionState) error {
		if x.gone {
			return fmt.Errorf("session %q has ended", session)
		}
		if err := s.checkBucketLocked(x.keyspace, bucket); err != nil {
			return err
		}
		tok = s.grantLocked(x, uint32(bucket))
		s.notifyLocked()
		return nil
	})
	return tok
}

func (s *Server) grantLocked(x *sessionState, b uint32) uint64 {
	return s.grantFromLocked(x, b, s.keyspaces[x.keyspace].pos[b])
}

func (s *Server) grantFromLocked(x *sessionState, b uint32, from uint64) uint64 {
	if _, ok := x.grants[b]; ok {
		s.foldLocked(x, b, 0) // taken back and granted again
	}
	s.lastToken++
	x.grants[b] = s.lastToken
	x.from[b] = from
	delete(x.release, b)
	x.rev++
	return s.lastToken
}

func (s *Server) checkBucketLocked(ks string, bucket int) error {
	k := s.keyspaces[ks]
	if bucket < 0 || k != nil && bucket >= int(k.cfg.Buckets) {
		return fmt.Errorf("bucket %d is out of range of keyspace %q", bucket, ks)
	}
	return nil
}

// AskRelease lists bucket for release in session's grants, as the server
// does when the bucket moves to another member: the worker finishes its
// work, calls Release, and the fake drops the grant. It does nothing if
// the session does not hold the bucket.
func (s *Server) AskRelease(session string, bucket int) {
	if s.tb != nil {
		s.tb.Helper()
	}
	s.withSession("AskRelease", session, func(x *sessionState) error {
		if _, ok := x.grants[uint32(bucket)]; ok && !x.release[uint32(bucket)] {
			x.release[uint32(bucket)] = true
			x.rev++
			s.notifyLocked()
		}
		return nil
	})
}

// Revoke takes bucket back from session without a release, as the leader
// does once a drain timed out: the worker stops it at once (its grant's
// context is cancelled before Release is called) and does not release it.
func (s *Server) Revoke(session string, bucket int) {
	if s.tb != nil {
		s.tb.Helper()
	}
	s.withSession("Revoke", session, func(x *sessionState) error {
		if _, ok := x.grants[uint32(bucket)]; ok {
			s.foldLocked(x, uint32(bucket), 0)
			delete(x.grants, uint32(bucket))
			delete(x.from, uint32(bucket))
			delete(x.release, uint32(bucket))
			x.rev++
			s.notifyLocked()
			s.settleLocked(s.keyspaces[x.keyspace])
		}
		return nil
	})
}

// EndSession ends session, as the expiry or revocation of its lease
// does: its grants go (to their owners, after Assign), its streams and
// long polls answer not_found, and so does every later call with it.
// Ending an ended session does nothing.
func (s *Server) EndSession(session string) {
	if s.tb != nil {
		s.tb.Helper()
	}
	s.withSession("EndSession", session, func(x *sessionState) error {
		s.endSessionLocked(x)
		return nil
	})
}

func (s *Server) endSessionLocked(x *sessionState) {
	if x.gone {
		return
	}
	x.gone = true
	for b := range x.grants {
		s.foldLocked(x, b, 0)
	}
	x.grants = map[uint32]uint64{}
	x.from = map[uint32]uint64{}
	x.release = map[uint32]bool{}
	x.rev++
	s.notifyLocked()
	if k := s.keyspaces[x.keyspace]; k != nil {
		s.settleLocked(k)
	}
}

// Session returns the live session of member in keyspace, or "" if it
// has none.
func (s *Server) Session(keyspace, member string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if x := s.liveSessionLocked(keyspace, member); x != nil {
		return x.id
	}
	return ""
}

// WaitSession waits until member has a live session in keyspace (a
// worker's Join was served) and returns it, failing tb as WaitFor does.
func (s *Server) WaitSession(tb testing.TB, keyspace, member string) string {
	tb.Helper()
	var id string
	s.WaitFor(tb, fmt.Sprintf("member %q to join keyspace %q", member, keyspace), func() bool {
		id = s.Session(keyspace, member)
		return id != ""
	})
	return id
}

// Live reports whether session is live: joined, and not ended by
// EndSession, a completed Leave, a Join that replaced it, or a keep-alive
// answered not_found.
func (s *Server) Live(session string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	x := s.sessions[session]
	return x != nil && !x.gone
}

// Grants returns what the fake holds session to be granted, bucket to
// token: the server's side of the worker's grants.
func (s *Server) Grants(session string) map[int]uint64 {
	if s.tb != nil {
		s.tb.Helper()
	}
	out := map[int]uint64{}
	s.withSession("Grants", session, func(x *sessionState) error {
		for b, tok := range x.grants {
			out[int(b)] = tok
		}
		return nil
	})
	return out
}

// LeaseExpiry returns when session's lease would expire at keyshard
// serve: its keyspace's lease TTL after the fake last renewed it (at the
// Join, then at every keep-alive it answered). The fake does not expire
// it by itself; a worker must have fenced itself before then.
func (s *Server) LeaseExpiry(session string) time.Time {
	if s.tb != nil {
		s.tb.Helper()
	}
	var t time.Time
	s.withSession("LeaseExpiry", session, func(x *sessionState) error {
		t = x.renewed.Add(s.keyspaces[x.keyspace].cfg.GetLeaseTtl().AsDuration())
		return nil
	})
	return t
}

// AddHotKeyPool creates or replaces hot-key pool name with threshold
// (summed msg/s) and keyshard serve's defaults for the rest: low
// threshold threshold/2, report threshold threshold/64, 30 s cooldown and
// report age, at most 1024 keys. Admin.PutHotKeyPool sets any field.
func (s *Server) AddHotKeyPool(name string, threshold float64) {
	p := &keyshardv1.HotKeyPool{Name: name, Threshold: threshold}
	withPoolDefaults(p)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pools[name] = p
	s.notifyLocked()
}

func withPoolDefaults(p *keyshardv1.HotKeyPool) {
	if p.LowThreshold == 0 {
		p.LowThreshold = p.Threshold / 2
	}
	if p.ReportThreshold == 0 {
		p.ReportThreshold = p.Threshold / 64
	}
	if p.Cooldown == nil {
		p.Cooldown = durationpb.New(30 * time.Second)
	}
	if p.ReportMaxAge == nil {
		p.ReportMaxAge = durationpb.New(30 * time.Second)
	}
	if p.MaxKeys == 0 {
		p.MaxKeys = 1024
	}
}

// SetOverflow publishes the next version of pool's cluster-wide overflow
// set, with keys at the pool's threshold since now (none cooling), and
// returns the version. PutOverflowSet sets every field.
func (s *Server) SetOverflow(pool string, keys ...string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	set := &keyshardv1.OverflowSet{Pool: pool, Version: s.sets[pool].GetVersion() + 1}
	for _, k := range keys {
		set.Keys = append(set.Keys, &keyshardv1.OverflowKey{Key: k, Rate: s.pools[pool].GetThreshold(), Since: timestamppb.New(s.clock.Now())})
	}
	s.sets[pool] = set
	s.notifyLocked()
	return set.Version
}

// PutOverflowSet publishes set as its pool's overflow set, as given: any
// version (a set that outlived a producer's previous run), rates and
// cooling times. A set whose version is not above the current one is
// still published; followers ignore it.
func (s *Server) PutOverflowSet(set *keyshardv1.OverflowSet) {
	set = proto.Clone(set).(*keyshardv1.OverflowSet)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sets[set.GetPool()] = set
	s.notifyLocked()
}
