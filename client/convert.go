package client

import (
	"fmt"
	"math"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/hotkey"
	"github.com/keyshard/keyshard/placement"
)

// This file is the one place that converts between the package's Go types
// and the keyshard.v1 protos.

// Keyspace modes, for KeyspaceConfig.Mode.
const (
	// ModeExclusive: a moved bucket is granted to its new owner only after
	// the old owner released it or its session ended. The default.
	ModeExclusive = "exclusive"
	// ModeStream: as ModeExclusive, plus a committed stream position per
	// bucket.
	ModeStream = "stream"
)

// KeyspaceConfig is a keyspace's configuration. Zero fields take the
// server's defaults on create (4096 buckets, xxh64, exclusive, a 10 s lease
// and a 30 s drain timeout) and mean "unchanged" on update.
type KeyspaceConfig struct {
	// Name is 1-128 characters of [A-Za-z0-9._:@-].
	Name string
	// Buckets is the bucket count, 1..65536. Cannot change.
	Buckets int
	// Hash maps keys to buckets. Cannot change.
	Hash placement.HashMode
	// Mode is ModeExclusive or ModeStream. Cannot change.
	Mode string
	// LeaseTTL is how long a member's session lives without a keep-alive
	// (at least 2 s).
	LeaseTTL time.Duration
	// DrainTimeout is how long a member may take to release a bucket that
	// moved away before its session is revoked.
	DrainTimeout time.Duration
}

// Member is a worker process as it joins a keyspace.
type Member struct {
	// ID is 1-128 characters of [A-Za-z0-9._:@-], unique in the keyspace.
	ID string
	// Address is where routers send the member's work (host:port, URL...).
	Address string
	// Weight is the member's relative share of buckets; 0 means 1.
	Weight float64
	// Zone is the member's failure domain, if any.
	Zone     string
	Metadata map[string]string
}

// MemberStatus is a member as the control plane sees it.
type MemberStatus struct {
	Member
	// TargetBuckets is how many buckets the current map assigns to it.
	TargetBuckets int
	// GrantedBuckets is how many buckets it holds a grant for.
	GrantedBuckets int
	// ReleasingBuckets is how many buckets are moving away from it and
	// awaiting its release.
	ReleasingBuckets int
	// Draining is true once DrainMember or Leave was called for it.
	Draining bool
	// LeaseLeft is the time until its session lease expires unless
	// renewed, as etcd told the answering replica (whole seconds); 0 if
	// the replica could not read it, or ListMembers was called without
	// WithLeaseLeft.
	LeaseLeft time.Duration
}

// Members is the answer of Admin.ListMembers.
type Members struct {
	// Epoch is the epoch of the map the target counts come from.
	Epoch   uint64
	Members []MemberStatus
}

// Status is the answer of Admin.Status.
type Status struct {
	// Replica is the serve replica that answered; Leader the one leading.
	Replica   string
	Leader    string
	Keyspaces []KeyspaceStatus
	// Replicas are the serve replicas that advertise an API URL, sorted,
	// the leader marked.
	Replicas []ReplicaInfo
	// Store is the answering replica's bounded health read of etcd.
	Store StoreHealth
}

// ReplicaInfo is one serve replica in a Status.
type ReplicaInfo struct {
	ID     string
	URL    string
	Leader bool
}

// StoreHealth is a replica's bounded status read of every etcd endpoint.
type StoreHealth struct {
	// Healthy: every endpoint answered in time, with no alarm; else Error
	// names the endpoint and what is wrong.
	Healthy   bool
	Error     string
	Endpoints []string
	// DBSizeBytes and Revision are the first answering endpoint's.
	DBSizeBytes int64
	Revision    int64
	// Latency is how long the whole read took.
	Latency time.Duration
}

// KeyspaceStatus is one keyspace in a Status.
type KeyspaceStatus struct {
	Keyspace          KeyspaceConfig
	Epoch             uint64
	Members           int
	UnassignedBuckets int
	// HandoffsInFlight is the number of buckets whose target owner has no
	// grant yet.
	HandoffsInFlight int
	// DrainingMembers are the members draining or leaving whose session
	// is still on; ReleasingBuckets the buckets held by a member that is
	// no longer their target (a release awaited).
	DrainingMembers  int
	ReleasingBuckets int
	// MembersWithoutBuckets are the active members (kept alive once, not
	// draining) to which the current map gives no bucket. While the
	// keyspace has at least as many buckets as such members, nonzero means
	// a map the leader has not written yet: a join held back by the
	// rebalance gap, or waiting for the last map's handoffs. The keyspace
	// has settled when UnassignedBuckets, HandoffsInFlight,
	// ReleasingBuckets and MembersWithoutBuckets are all 0 (with more
	// active members than buckets, MembersWithoutBuckets stays at the
	// surplus).
	MembersWithoutBuckets int
}

// Grant is the right to act on one bucket, from Acquire until Release (or
// until the grant's context is cancelled). Token is the grant's fencing
// token: it strictly increases per bucket, so storage that keeps the
// highest token it has seen can refuse a stale owner's writes.
//
// A Grant handed out by a Worker also knows whether it is still valid
// (Valid, Deadline). Two Grants are == only if they come from the same
// session; compare Bucket and Token to compare grants made elsewhere.
type Grant struct {
	Bucket int
	Token  uint64
	// From is, in a stream keyspace, the bucket's committed position when
	// it was granted: the position of the next event to read for it (0 is
	// the start of the stream). It may be older than the worker's own
	// position (read this bucket's events again from there, so nothing is
	// skipped) or newer (skip its events below it). Always 0 in an
	// exclusive keyspace.
	From uint64

	life *grantLife // nil for a Grant not made by a Worker
}

// grantLife is what a Grant needs to say whether it is still valid.
type grantLife struct {
	done <-chan struct{} // the grant's context's Done
	s    *session
}

// Valid reports whether the worker may still act on the bucket under g,
// judged now by the Worker's clock: the grant has not ended (its context
// is not cancelled) and its session's fence deadline (Deadline) has not
// passed. Once false it stays false. A process that was paused (GC,
// SIGSTOP, a VM migration) past the deadline sees false at once when it
// resumes, even before the Worker's timers have run, so call Valid right
// before acting on the bucket; storage must still check g.Token, since a
// pause can also fall between Valid and the write. A Grant not made by a
// Worker is never valid.
func (g Grant) Valid() bool {
	if g.life == nil {
		return false
	}
	select {
	case <-g.life.done:
		return false
	default:
	}
	return g.life.s.valid()
}

// Deadline returns the time, on the Worker's clock, at which g stops
// being valid unless a keep-alive is acknowledged before: the send time of
// the session's newest acknowledged keep-alive plus the lease TTL minus
// the fence margin. It moves later as keep-alives succeed; a write begun
// now must end before it. It returns the zero time if g is not valid.
func (g Grant) Deadline() time.Time {
	if !g.Valid() {
		return time.Time{}
	}
	return g.life.s.fenceDeadline()
}

// validName checks a name argument of fn (a keyspace, member, pool or
// producer name): 1-128 characters of [A-Za-z0-9._:@-].
func validName(fn, what, s string) error {
	if s == "" {
		return argError(fn, what, "is empty")
	}
	if len(s) > 128 {
		return argError(fn, what, "%.20q... is %d characters long; the limit is 128", s, len(s))
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if 'a' <= ch && ch <= 'z' || 'A' <= ch && ch <= 'Z' || '0' <= ch && ch <= '9' || ch == '.' || ch == '_' || ch == ':' || ch == '@' || ch == '-' {
			continue
		}
		return argError(fn, what, "%q has %q at byte %d; use only [A-Za-z0-9._:@-]", s, rune(ch), i)
	}
	return nil
}

func modeToProto(fn, m string) (keyshardv1.KeyspaceMode, error) {
	switch m {
	case "":
		return keyshardv1.KeyspaceMode_KEYSPACE_MODE_UNSPECIFIED, nil
	case ModeExclusive:
		return keyshardv1.KeyspaceMode_KEYSPACE_MODE_EXCLUSIVE, nil
	case ModeStream:
		return keyshardv1.KeyspaceMode_KEYSPACE_MODE_STREAM, nil
	}
	return 0, argError(fn, "KeyspaceConfig.Mode", "%q is unknown; use %q or %q", m, ModeExclusive, ModeStream)
}

func modeFromProto(m keyshardv1.KeyspaceMode) string {
	switch m {
	case keyshardv1.KeyspaceMode_KEYSPACE_MODE_EXCLUSIVE, keyshardv1.KeyspaceMode_KEYSPACE_MODE_UNSPECIFIED:
		return ModeExclusive
	case keyshardv1.KeyspaceMode_KEYSPACE_MODE_STREAM:
		return ModeStream
	}
	return m.String()
}

func durationToProto(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

// keyspaceToProto checks k, an argument of fn, and converts it.
func keyspaceToProto(fn string, k KeyspaceConfig) (*keyshardv1.Keyspace, error) {
	if err := validName(fn, "keyspace name", k.Name); err != nil {
		return nil, err
	}
	if k.Buckets < 0 || k.Buckets > placement.MaxBuckets {
		return nil, argError(fn, "KeyspaceConfig.Buckets", "%d is out of range [1, %d] (0 means the default %d)", k.Buckets, placement.MaxBuckets, placement.DefaultBuckets)
	}
	if k.Hash != "" {
		if err := k.Hash.Validate(); err != nil {
			return nil, argError(fn, "KeyspaceConfig.Hash", "is not usable: %v", err)
		}
	}
	mode, err := modeToProto(fn, k.Mode)
	if err != nil {
		return nil, err
	}
	if k.LeaseTTL < 0 {
		return nil, argError(fn, "KeyspaceConfig.LeaseTTL", "%v is negative (0 means the default)", k.LeaseTTL)
	}
	if k.DrainTimeout < 0 {
		return nil, argError(fn, "KeyspaceConfig.DrainTimeout", "%v is negative (0 means the default)", k.DrainTimeout)
	}
	return &keyshardv1.Keyspace{
		Name:         k.Name,
		Buckets:      uint32(k.Buckets),
		Hash:         string(k.Hash),
		Mode:         mode,
		LeaseTtl:     durationToProto(k.LeaseTTL),
		DrainTimeout: durationToProto(k.DrainTimeout),
	}, nil
}

func keyspaceFromProto(k *keyshardv1.Keyspace) KeyspaceConfig {
	return KeyspaceConfig{
		Name:         k.GetName(),
		Buckets:      int(k.GetBuckets()),
		Hash:         placement.HashMode(k.GetHash()),
		Mode:         modeFromProto(k.GetMode()),
		LeaseTTL:     k.GetLeaseTtl().AsDuration(),
		DrainTimeout: k.GetDrainTimeout().AsDuration(),
	}
}

// memberToProto checks m, an argument of fn, and converts it.
func memberToProto(fn string, m Member) (*keyshardv1.Member, error) {
	if err := validName(fn, "Member.ID", m.ID); err != nil {
		return nil, err
	}
	if m.Weight < 0 || math.IsNaN(m.Weight) || math.IsInf(m.Weight, 0) {
		return nil, argError(fn, "Member.Weight", "%v is not a finite number >= 0 (0 means 1)", m.Weight)
	}
	return &keyshardv1.Member{Id: m.ID, Address: m.Address, Weight: m.Weight, Zone: m.Zone, Metadata: m.Metadata}, nil
}

func memberFromProto(m *keyshardv1.Member) Member {
	return Member{ID: m.GetId(), Address: m.GetAddress(), Weight: m.GetWeight(), Zone: m.GetZone(), Metadata: m.GetMetadata()}
}

func memberStatusFromProto(s *keyshardv1.MemberStatus) MemberStatus {
	return MemberStatus{
		Member:           memberFromProto(s.GetMember()),
		TargetBuckets:    int(s.GetTargetBuckets()),
		GrantedBuckets:   int(s.GetGrantedBuckets()),
		ReleasingBuckets: int(s.GetReleasingBuckets()),
		Draining:         s.GetDraining(),
		LeaseLeft:        s.GetLeaseLeft().AsDuration(),
	}
}

func statusFromProto(s *keyshardv1.StatusResponse) Status {
	st := s.GetStore()
	out := Status{Replica: s.GetReplica(), Leader: s.GetLeader(), Store: StoreHealth{
		Healthy: st.GetHealthy(), Error: st.GetError(), Endpoints: st.GetEndpoints(),
		DBSizeBytes: st.GetDbSizeBytes(), Revision: st.GetRevision(), Latency: st.GetLatency().AsDuration(),
	}}
	for _, r := range s.GetReplicas() {
		out.Replicas = append(out.Replicas, ReplicaInfo{ID: r.GetId(), URL: r.GetUrl(), Leader: r.GetLeader()})
	}
	for _, k := range s.GetKeyspaces() {
		out.Keyspaces = append(out.Keyspaces, KeyspaceStatus{
			Keyspace:              keyspaceFromProto(k.GetKeyspace()),
			Epoch:                 k.GetEpoch(),
			Members:               int(k.GetMembers()),
			UnassignedBuckets:     int(k.GetUnassignedBuckets()),
			HandoffsInFlight:      int(k.GetHandoffsInFlight()),
			DrainingMembers:       int(k.GetDrainingMembers()),
			ReleasingBuckets:      int(k.GetReleasingBuckets()),
			MembersWithoutBuckets: int(k.GetMembersWithoutBuckets()),
		})
	}
	return out
}

// routing is one epoch of a keyspace's map, ready for lookups. It is
// immutable; next is closed when a newer routing replaces it.
type routing struct {
	epoch   uint64
	table   *placement.Table
	hasher  placement.Hasher
	buckets int
	hash    placement.HashMode
	addrs   map[string]string // member id → address
	next    chan struct{}
}

// emptyRouting is the routing before a keyspace's first map (GetMap
// answers without a map until a member has joined): every key is
// unassigned, and the bucket count is not known yet (buckets is 0).
func emptyRouting() *routing {
	t, err := placement.NewTable(placement.HashXXH64, placement.NewAssignment(1))
	if err != nil {
		panic("keyshard: building the empty routing table: " + err.Error()) // a constant input
	}
	return &routing{table: t, hasher: t.Hasher(), addrs: map[string]string{}, next: make(chan struct{})}
}

// routingFromProto validates m and builds its lookup table. A nil map
// (no map yet) gives the empty routing.
func routingFromProto(m *keyshardv1.Map) (*routing, error) {
	if m == nil {
		return emptyRouting(), nil
	}
	n := int(m.GetBuckets())
	owners := m.GetOwners()
	if n == 0 {
		n = len(owners)
	}
	if len(owners) != 0 && len(owners) != n {
		return nil, fmt.Errorf("map of keyspace %q at epoch %d has %d owners for %d buckets", m.GetKeyspace(), m.GetEpoch(), len(owners), n)
	}
	a := placement.Assignment{Members: make([]string, len(m.GetMembers())), Owners: make([]int32, n)}
	addrs := make(map[string]string, len(m.GetMembers()))
	for i, mem := range m.GetMembers() {
		a.Members[i] = mem.GetId()
		addrs[mem.GetId()] = mem.GetAddress()
	}
	for b := range a.Owners {
		a.Owners[b] = placement.Unassigned
		if len(owners) == 0 || owners[b] == 0 {
			continue
		}
		if int(owners[b]) > len(a.Members) {
			return nil, fmt.Errorf("map of keyspace %q at epoch %d: bucket %d has owner %d but the map lists %d members", m.GetKeyspace(), m.GetEpoch(), b, owners[b], len(a.Members))
		}
		a.Owners[b] = int32(owners[b] - 1)
	}
	mode := placement.HashMode(m.GetHash())
	if mode == "" {
		mode = placement.HashXXH64
	}
	t, err := placement.NewTable(mode, a)
	if err != nil {
		return nil, fmt.Errorf("map of keyspace %q at epoch %d: %w", m.GetKeyspace(), m.GetEpoch(), err)
	}
	return &routing{epoch: m.GetEpoch(), table: t, hasher: t.Hasher(), buckets: n, hash: mode, addrs: addrs, next: make(chan struct{})}, nil
}

func grantsToProto(gs []Grant) []*keyshardv1.BucketGrant {
	out := make([]*keyshardv1.BucketGrant, len(gs))
	for i, g := range gs {
		out[i] = &keyshardv1.BucketGrant{Bucket: uint32(g.Bucket), Token: g.Token}
	}
	return out
}

// HotKeyPool is a group of producers whose heavy hitters the control
// plane sums into one cluster-wide overflow set (see HotKeys). Rates are
// messages per second. Zero fields take the server's defaults.
type HotKeyPool struct {
	// Name is 1-128 characters of [A-Za-z0-9._:@-].
	Name string
	// Threshold is the summed rate over all producers at which a key
	// enters the overflow set. Required, > 0.
	Threshold float64
	// LowThreshold is the summed rate below which a key in the set starts
	// cooling down. Default Threshold/2; at most Threshold.
	LowThreshold float64
	// Cooldown is how long a key's summed rate must stay below
	// LowThreshold before it leaves the set. Default 30 s.
	Cooldown time.Duration
	// ReportThreshold is the local rate at or above which a producer
	// reports a key. Default Threshold/64.
	ReportThreshold float64
	// ReportMaxAge is how long a producer's report counts. Default 30 s,
	// at least 2 s.
	ReportMaxAge time.Duration
	// MaxKeys caps the set. Default 1024, at most 2048.
	MaxKeys int
}

// hotKeyPoolToProto checks p, an argument of fn, and converts it.
func hotKeyPoolToProto(fn string, p HotKeyPool) (*keyshardv1.HotKeyPool, error) {
	if err := validName(fn, "hot-key pool name", p.Name); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"Threshold", p.Threshold}, {"LowThreshold", p.LowThreshold}, {"ReportThreshold", p.ReportThreshold}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 {
			return nil, argError(fn, "HotKeyPool."+f.name, "%v is not a finite rate >= 0", f.v)
		}
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"Cooldown", p.Cooldown}, {"ReportMaxAge", p.ReportMaxAge}} {
		if f.v < 0 {
			return nil, argError(fn, "HotKeyPool."+f.name, "%v is negative (0 means the default)", f.v)
		}
	}
	if p.MaxKeys < 0 || p.MaxKeys > math.MaxUint32 {
		return nil, argError(fn, "HotKeyPool.MaxKeys", "%d is out of range (0 means the default)", p.MaxKeys)
	}
	return &keyshardv1.HotKeyPool{
		Name:            p.Name,
		Threshold:       p.Threshold,
		LowThreshold:    p.LowThreshold,
		Cooldown:        durationToProto(p.Cooldown),
		ReportThreshold: p.ReportThreshold,
		ReportMaxAge:    durationToProto(p.ReportMaxAge),
		MaxKeys:         uint32(p.MaxKeys),
	}, nil
}

func hotKeyPoolFromProto(p *keyshardv1.HotKeyPool) HotKeyPool {
	return HotKeyPool{
		Name:            p.GetName(),
		Threshold:       p.GetThreshold(),
		LowThreshold:    p.GetLowThreshold(),
		Cooldown:        p.GetCooldown().AsDuration(),
		ReportThreshold: p.GetReportThreshold(),
		ReportMaxAge:    p.GetReportMaxAge().AsDuration(),
		MaxKeys:         int(p.GetMaxKeys()),
	}
}

// overflowSetFromProto converts a set; unset timestamps become zero times.
func overflowSetFromProto(m *keyshardv1.OverflowSet) hotkey.OverflowSet {
	s := hotkey.OverflowSet{Version: m.GetVersion(), Entries: make([]hotkey.OverflowEntry, 0, len(m.GetKeys()))}
	for _, k := range m.GetKeys() {
		s.Entries = append(s.Entries, hotkey.OverflowEntry{
			Key:        k.GetKey(),
			Rate:       k.GetRate(),
			Since:      timeFromProto(k.GetSince()),
			BelowSince: timeFromProto(k.GetCoolingSince()),
		})
	}
	return s
}

func timeFromProto(t *timestamppb.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.AsTime()
}

// Positions is the answer of Admin.Positions: a stream keyspace's
// committed positions. A position is the position of the next event to
// read for a bucket; a held bucket's is its holder's last commit, or its
// grant's from.
type Positions struct {
	Min, Max uint64
	Spread   uint64 // Max - Min
	// Runs cover every bucket, in bucket order.
	Runs []PositionRun
	// Behind are the buckets furthest behind, lowest position first.
	Behind []BucketBehind
	// Epoch is the epoch of the keyspace's map; Revision the store
	// revision the answer was read at.
	Epoch    uint64
	Revision uint64
}

// PositionRun says that the Count buckets from First on are at Position.
type PositionRun struct {
	First, Count int
	Position     uint64
}

// BucketBehind is a bucket among those furthest behind, with its holder:
// Member and Token are empty and 0 if nobody holds it.
type BucketBehind struct {
	Bucket   int
	Position uint64
	Member   string
	Token    uint64
}

// PositionsReset is the answer of Admin.ResetPositions: how many buckets
// were reset, at which store revision.
type PositionsReset struct {
	Buckets  int
	Revision uint64
}

func positionsFromProto(r *keyshardv1.GetPositionsResponse) Positions {
	p := Positions{Min: r.GetMin(), Max: r.GetMax(), Spread: r.GetSpread(), Epoch: r.GetEpoch(), Revision: r.GetRevision()}
	for _, run := range r.GetRuns() {
		p.Runs = append(p.Runs, PositionRun{First: int(run.GetFirst()), Count: int(run.GetCount()), Position: run.GetPosition()})
	}
	for _, b := range r.GetBehind() {
		p.Behind = append(p.Behind, BucketBehind{Bucket: int(b.GetBucket()), Position: b.GetPosition(), Member: b.GetMember(), Token: b.GetToken()})
	}
	return p
}
