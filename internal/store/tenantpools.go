package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/tenantpool"
	"github.com/keyshard/keyshard/placement"
)

// Tenant pools. A pool's settings live at tpools/<pool>, its members at
// tpmembers/<pool>/<id> (each on its session's lease), and the state the
// leader publishes at tpstate/<pool>/meta (version, members, policy, when
// published) and tpstate/<pool>/t/<chunk> (the tenants whose
// TenantChunkOf is chunk). A round rewrites meta only when it changed and
// only the chunks that hold a changed tenant.
//
// A round that rewrites many chunks is larger than etcd takes in one
// request, so it is published in several transactions (StateWrites): the
// chunks first, in batches under a byte budget, then the meta last. Each
// chunk records the version it was written for; a reader applies a chunk
// whose version is above the meta's only once a meta of that version or
// above arrives (TenantPoolState.State), so that readers never see a
// version half applied.

// TenantChunks is the number of chunks a pool's tenants are spread over.
const TenantChunks = 256

// MaxTenantChunkBytes bounds one encoded chunk, far below etcd's default
// 1.5 MiB request limit. With TenantChunks chunks a pool holds millions of
// tenants before a chunk reaches it.
const MaxTenantChunkBytes = 1 << 20

// Bounds of a tenant pool's durations.
const (
	MinTenantLeaseTTL   = 2 * time.Second
	MaxTenantLeaseTTL   = 10 * time.Minute
	MinTenantWindow     = 2 * time.Second
	MaxTenantPoolPeriod = 7 * 24 * time.Hour // cooldown, lookback, warm-up, forget_after, window
	MaxTenantLen        = 256                // bytes of one tenant id
)

// TenantChunkOf returns the chunk tenant is stored in: xxh64(tenant) mod
// TenantChunks.
func TenantChunkOf(tenant string) int { return int(xxhash.Sum64String(tenant) % TenantChunks) }

// TenantPool is a tenant pool's settings, stored at tpools/<pool>. Every
// field is explicit: the API fills in the defaults before storing.
type TenantPool struct {
	Name   string
	Policy tenantpool.Policy
	// Window is the span load is measured over.
	Window time.Duration
	// LeaseTTL is the members' session TTL.
	LeaseTTL time.Duration
}

// Validate checks p as PutTenantPool does; the error wraps ErrInvalid and
// names the field.
func (p TenantPool) Validate() error {
	if e := checkName("name", KindTenantPool, p.Name); e != nil {
		return e.invalid("tenant pool")
	}
	if err := p.Policy.Validate(); err != nil {
		return fmt.Errorf("%w: tenant pool %q: policy: %w", ErrInvalid, p.Name, err)
	}
	switch {
	case p.Window < MinTenantWindow || p.Window > MaxTenantPoolPeriod:
		return ferr("window", "%v is outside [%v, %v]", p.Window, MinTenantWindow, MaxTenantPoolPeriod).invalid("tenant pool")
	case p.LeaseTTL < MinTenantLeaseTTL || p.LeaseTTL > MaxTenantLeaseTTL:
		return ferr("lease_ttl", "%v is outside [%v, %v]", p.LeaseTTL, MinTenantLeaseTTL, MaxTenantLeaseTTL).invalid("tenant pool")
	}
	return nil
}

// TenantMember is a member of a tenant pool, stored at
// tpmembers/<pool>/<id> on its session's lease.
type TenantMember struct {
	ID       string
	Address  string
	Zone     string
	Weight   float64
	Metadata map[string]string
	JoinedAt time.Time
	// Active is set by the session's first keep-alive: only active
	// members are placed.
	Active bool
	// Leaving is set by a graceful leave (MarkTenantMemberLeaving): the
	// leader places the member with weight 0 (draining) while its session
	// lives. A new session (a re-join) starts without it.
	Leaving bool
	Session shard.LeaseID
}

// TenantMeta is the pool-wide part of a published state.
type TenantMeta struct {
	Version   uint64
	Members   []placement.Member
	Policy    tenantpool.Policy
	Published time.Time // when the leader last published a new version
}

// TenantChunk is the tenants of one chunk of a pool's state.
type TenantChunk struct {
	// Version is the State.Version of the round that wrote the chunk: the
	// chunk belongs to the published state once the meta's version is at
	// least Version. 0 for a chunk stored before chunks carried their
	// version (it was written with its meta, in one transaction).
	Version uint64
	Tenants map[string]tenantpool.TenantState
}

// TenantPoolState is every key of one tenant pool, as of one revision.
type TenantPoolState struct {
	Name    string
	Config  Entry[TenantPool]
	Members map[string]Entry[TenantMember]
	Meta    Entry[TenantMeta]
	Chunks  map[int]Entry[TenantChunk]
	// Prev holds, for chunks ahead of the meta when LoadAll read the
	// store, their value as of the meta's revision: what is published of
	// them (absent: the chunk did not exist then). An entry is dropped
	// when its chunk or the meta changes.
	Prev map[int]TenantChunk
}

func newTenantPoolState(pool string) *TenantPoolState {
	return &TenantPoolState{Name: pool, Members: map[string]Entry[TenantMember]{}, Chunks: map[int]Entry[TenantChunk]{}}
}

func (p *TenantPoolState) empty() bool {
	return !p.Config.Exists() && !p.Meta.Exists() && len(p.Members) == 0 && len(p.Chunks) == 0
}

// State joins the stored meta and the chunks it publishes into a
// tenantpool.State (version 0 and no tenants when nothing was published):
// a chunk ahead of the meta (Ahead) is left out, and the previous value
// of its tenants is not known here (a reader keeps what it applied). The
// tenants map is new; the TenantStates share storage with the snapshot's.
func (p *TenantPoolState) State() tenantpool.State {
	m := p.Meta.Value
	st := tenantpool.State{Version: m.Version, Members: m.Members, Policy: m.Policy, Tenants: map[string]tenantpool.TenantState{}}
	for c := range p.Chunks {
		if pc, ok := p.Published(c); ok {
			maps.Copy(st.Tenants, pc.Tenants)
		}
	}
	return st
}

// Published returns chunk as the meta publishes it: the stored chunk, or
// for one ahead of the meta its value as of the meta's revision when
// LoadAll found it (Prev). ok false: the chunk is not published, or it is
// ahead and its published value is unknown (then a reader keeps what it
// had applied).
func (p *TenantPoolState) Published(chunk int) (TenantChunk, bool) {
	e, ok := p.Chunks[chunk]
	if !ok {
		return TenantChunk{}, false
	}
	if e.Value.Version <= p.Meta.Value.Version {
		return e.Value, true
	}
	pc, ok := p.Prev[chunk]
	return pc, ok
}

// Ahead reports whether chunk is stored for a version above the meta's:
// written by a round whose meta is not written yet.
func (p *TenantPoolState) Ahead(chunk int) bool {
	c, ok := p.Chunks[chunk]
	return ok && c.Value.Version > p.Meta.Value.Version
}

// stored joins the meta and every stored chunk, ahead of the meta or
// not, at the version of the latest of them: see LoadTenantState.
func (p *TenantPoolState) stored() (tenantpool.State, bool) {
	m := p.Meta.Value
	st := tenantpool.State{Version: m.Version, Members: m.Members, Policy: m.Policy, Tenants: map[string]tenantpool.TenantState{}}
	ahead := false
	for _, c := range p.Chunks {
		maps.Copy(st.Tenants, c.Value.Tenants)
		if c.Value.Version > st.Version {
			st.Version, ahead = c.Value.Version, true
		}
	}
	return st, ahead
}

// TenantMetaKey returns the key of pool's published meta.
func TenantMetaKey(pool string) string { return Prefix + "tpstate/" + pool + "/meta" }

// TenantChunkKey returns the key of chunk of pool's published tenants.
func TenantChunkKey(pool string, chunk int) string {
	return Prefix + "tpstate/" + pool + "/t/" + strconv.Itoa(chunk)
}

// TenantPoolKey returns the key of tenant pool's settings.
func TenantPoolKey(pool string) string { return Prefix + "tpools/" + pool }

// TenantMemberKey returns the key of member id of tenant pool.
func TenantMemberKey(pool, id string) string { return Prefix + "tpmembers/" + pool + "/" + id }

// ReplicaKey returns the key of replica's advertised URL.
func ReplicaKey(replica string) string { return Prefix + "replicas/" + replica }

// parseTenantStateID parses the second name of a tpstate key: -1 for
// "meta", the chunk for "t/<chunk>".
func parseTenantStateID(id string) (int, error) {
	if id == "meta" {
		return -1, nil
	}
	rest, ok := strings.CutPrefix(id, "t/")
	if !ok {
		return 0, fmt.Errorf("%.24q is neither meta nor t/<chunk>", id)
	}
	if rest == "" || len(rest) > 3 || (len(rest) > 1 && rest[0] == '0') {
		return 0, fmt.Errorf("%.24q is not a canonical chunk", id)
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 || n >= TenantChunks {
		return 0, fmt.Errorf("chunk %.24q is outside [0, %d)", rest, TenantChunks)
	}
	return n, nil
}

// applyTenantPool applies a change of a tenant-pool kind; c.Keyspace is
// the pool.
func (s *Snapshot) applyTenantPool(c Change) {
	p := s.TenantPools[c.Keyspace]
	if p == nil {
		if c.Deleted {
			return
		}
		p = newTenantPoolState(c.Keyspace)
		s.TenantPools[c.Keyspace] = p
	}
	switch c.Kind {
	case KindTenantPool:
		p.Config = entry[TenantPool](c)
	case KindTenantMember:
		setEntry(p.Members, c, c.Lease)
	case KindTenantState:
		chunk, _ := parseTenantStateID(c.ID) // ParseKey checked it
		if chunk < 0 {
			p.Prev = nil
		} else {
			delete(p.Prev, chunk)
		}
		switch {
		case chunk < 0:
			p.Meta = entry[TenantMeta](c)
		case c.Deleted:
			delete(p.Chunks, chunk)
		default:
			p.Chunks[chunk] = entry[TenantChunk](c)
		}
	}
	if c.Deleted && p.empty() {
		delete(s.TenantPools, c.Keyspace)
	}
}

func (s *Snapshot) applyReplica(c Change) {
	if c.Deleted {
		delete(s.Replicas, c.Keyspace)
		return
	}
	s.Replicas[c.Keyspace] = entry[string](c)
}

// Wire forms. Times are Unix nanoseconds (0: unset), durations
// milliseconds.

type policyWire struct {
	Capacity       float64                 `json:"capacity_per_member"`
	Headroom       float64                 `json:"headroom,omitempty"`
	MinSize        int                     `json:"min_size,omitempty"`
	MaxSize        int                     `json:"max_size,omitempty"`
	ShrinkCooldown int64                   `json:"shrink_cooldown_ms,omitempty"`
	MaxShrinkStep  int                     `json:"max_shrink_step,omitempty"`
	Lookback       int64                   `json:"lookback_ms,omitempty"`
	WarmUp         int64                   `json:"warm_up_ms,omitempty"`
	ZoneAware      bool                    `json:"zone_aware,omitempty"`
	Overrides      map[string]overrideWire `json:"overrides,omitempty"`
	Tolerance      float64                 `json:"tolerance,omitempty"`
	RebalanceMoves int                     `json:"rebalance_moves,omitempty"`
	ForgetAfter    int64                   `json:"forget_after_ms,omitempty"`
}

type overrideWire struct {
	Size    int `json:"size,omitempty"`
	MinSize int `json:"min_size,omitempty"`
	MaxSize int `json:"max_size,omitempty"`
}

func ms(d time.Duration) int64     { return d.Milliseconds() }
func fromMs(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
func finiteNonNeg(f float64) bool  { return !math.IsNaN(f) && !math.IsInf(f, 0) && f >= 0 }

func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func policyToWire(p tenantpool.Policy) policyWire {
	w := policyWire{
		Capacity: p.CapacityPerMember, Headroom: p.Headroom, MinSize: p.MinSize, MaxSize: p.MaxSize,
		ShrinkCooldown: ms(p.ShrinkCooldown), MaxShrinkStep: p.MaxShrinkStep, Lookback: ms(p.Lookback), WarmUp: ms(p.WarmUp),
		ZoneAware: p.ZoneAware, Tolerance: p.Tolerance, RebalanceMoves: p.RebalanceMoves, ForgetAfter: ms(p.ForgetAfter),
	}
	if len(p.Overrides) > 0 {
		w.Overrides = make(map[string]overrideWire, len(p.Overrides))
		for id, o := range p.Overrides {
			w.Overrides[id] = overrideWire(o)
		}
	}
	return w
}

func policyFromWire(w policyWire) tenantpool.Policy {
	p := tenantpool.Policy{
		CapacityPerMember: w.Capacity, Headroom: w.Headroom, MinSize: w.MinSize, MaxSize: w.MaxSize,
		ShrinkCooldown: fromMs(w.ShrinkCooldown), MaxShrinkStep: w.MaxShrinkStep, Lookback: fromMs(w.Lookback), WarmUp: fromMs(w.WarmUp),
		ZoneAware: w.ZoneAware, Tolerance: w.Tolerance, RebalanceMoves: w.RebalanceMoves, ForgetAfter: fromMs(w.ForgetAfter),
	}
	if len(w.Overrides) > 0 {
		p.Overrides = make(map[string]tenantpool.Override, len(w.Overrides))
		for id, o := range w.Overrides {
			p.Overrides[id] = tenantpool.Override(o)
		}
	}
	return p
}

type tenantPoolWire struct {
	Name     string     `json:"name"`
	Policy   policyWire `json:"policy"`
	Window   int64      `json:"window_ms"`
	LeaseTTL int64      `json:"lease_ttl_ms"`
}

// EncodeTenantPool returns the stored form of p; ErrInvalid if p does not
// validate.
func EncodeTenantPool(p TenantPool) ([]byte, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(tenantPoolWire{Name: p.Name, Policy: policyToWire(p.Policy), Window: ms(p.Window), LeaseTTL: ms(p.LeaseTTL)})
}

// DecodeTenantPool decodes the value stored at key.
func DecodeTenantPool(key string, data []byte) (TenantPool, error) {
	var w tenantPoolWire
	if err := json.Unmarshal(data, &w); err != nil {
		return TenantPool{}, corruptf(key, "", "%v", err)
	}
	p := TenantPool{Name: w.Name, Policy: policyFromWire(w.Policy), Window: fromMs(w.Window), LeaseTTL: fromMs(w.LeaseTTL)}
	if err := p.Validate(); err != nil {
		return TenantPool{}, corruptf(key, "", "%v", err)
	}
	if _, pool, _, err := ParseKey(key); err == nil && pool != p.Name {
		return TenantPool{}, corruptf(key, "name", "%q does not match the key", p.Name)
	}
	return p, nil
}

type tenantMemberWire struct {
	ID       string            `json:"id"`
	Address  string            `json:"address,omitempty"`
	Zone     string            `json:"zone,omitempty"`
	Weight   float64           `json:"weight"`
	Metadata map[string]string `json:"metadata,omitempty"`
	JoinedAt int64             `json:"joined_at"`
	Active   bool              `json:"active,omitempty"`
	Leaving  bool              `json:"leaving,omitempty"`
	Session  int64             `json:"session"`
}

// EncodeTenantMember returns the stored form of m.
func EncodeTenantMember(m TenantMember) ([]byte, error) {
	if e := checkName("id", KindTenantMember, m.ID); e != nil {
		return nil, e.invalid("tenant pool member")
	}
	if !finiteNonNeg(m.Weight) {
		return nil, ferr("weight", "%v is not a finite number >= 0", m.Weight).invalid("tenant pool member")
	}
	return json.Marshal(tenantMemberWire{ID: m.ID, Address: m.Address, Zone: m.Zone, Weight: m.Weight, Metadata: m.Metadata,
		JoinedAt: nanos(m.JoinedAt), Active: m.Active, Leaving: m.Leaving, Session: int64(m.Session)})
}

// DecodeTenantMember decodes the value stored at key.
func DecodeTenantMember(key string, data []byte) (TenantMember, error) {
	var w tenantMemberWire
	if err := json.Unmarshal(data, &w); err != nil {
		return TenantMember{}, corruptf(key, "", "%v", err)
	}
	if _, _, id, err := ParseKey(key); err == nil && id != w.ID {
		return TenantMember{}, corruptf(key, "id", "%q does not match the key", w.ID)
	}
	if !finiteNonNeg(w.Weight) {
		return TenantMember{}, corruptf(key, "weight", "%v is not a finite number >= 0", w.Weight)
	}
	return TenantMember{ID: w.ID, Address: w.Address, Zone: w.Zone, Weight: w.Weight, Metadata: w.Metadata,
		JoinedAt: fromNanos(w.JoinedAt), Active: w.Active, Leaving: w.Leaving, Session: shard.LeaseID(w.Session)}, nil
}

type memberWire struct {
	ID     string  `json:"id"`
	Weight float64 `json:"w"`
	Zone   string  `json:"z,omitempty"`
}

type tenantMetaWire struct {
	Version   uint64       `json:"version"`
	Members   []memberWire `json:"members"`
	Policy    policyWire   `json:"policy"`
	Published int64        `json:"published"`
}

// EncodeTenantMeta returns the stored form of m.
func EncodeTenantMeta(m TenantMeta) ([]byte, error) {
	w := tenantMetaWire{Version: m.Version, Policy: policyToWire(m.Policy), Published: nanos(m.Published), Members: make([]memberWire, len(m.Members))}
	for i, mem := range m.Members {
		w.Members[i] = memberWire{ID: mem.ID, Weight: mem.Weight, Zone: mem.Zone}
	}
	return json.Marshal(w)
}

// DecodeTenantMeta decodes the value stored at key.
func DecodeTenantMeta(key string, data []byte) (TenantMeta, error) {
	var w tenantMetaWire
	if err := json.Unmarshal(data, &w); err != nil {
		return TenantMeta{}, corruptf(key, "", "%v", err)
	}
	m := TenantMeta{Version: w.Version, Policy: policyFromWire(w.Policy), Published: fromNanos(w.Published), Members: make([]placement.Member, len(w.Members))}
	for i, mem := range w.Members {
		m.Members[i] = placement.Member{ID: mem.ID, Weight: mem.Weight, Zone: mem.Zone}
	}
	return m, nil
}

type placementWire struct {
	ID    string `json:"id"`
	Added int64  `json:"a,omitempty"`
	Ready bool   `json:"r,omitempty"`
}

type removalWire struct {
	ID        string `json:"id"`
	At        int64  `json:"at"`
	ServeOnly bool   `json:"so,omitempty"`
	ReadUntil int64  `json:"ru,omitempty"`
}

type tenantStateWire struct {
	Size       int             `json:"s"`
	Wanted     int             `json:"w,omitempty"`
	BelowSince int64           `json:"b,omitempty"`
	Members    []placementWire `json:"m"`
	Removed    []removalWire   `json:"x,omitempty"`
	Why        string          `json:"why,omitempty"`
	When       int64           `json:"when,omitempty"`
	IdleSince  int64           `json:"idle,omitempty"`
}

func tenantToWire(ts tenantpool.TenantState) tenantStateWire {
	w := tenantStateWire{Size: ts.Size.Size, Wanted: ts.Size.Wanted, BelowSince: nanos(ts.Size.BelowSince), Why: ts.Why, When: nanos(ts.When), IdleSince: nanos(ts.IdleSince),
		Members: make([]placementWire, len(ts.Members))}
	for i, m := range ts.Members {
		w.Members[i] = placementWire{ID: m.ID, Added: nanos(m.Added), Ready: m.Ready}
	}
	for _, r := range ts.Removed {
		w.Removed = append(w.Removed, removalWire{ID: r.ID, At: nanos(r.At), ServeOnly: r.ServeOnly, ReadUntil: nanos(r.ReadUntil)})
	}
	return w
}

func tenantFromWire(w tenantStateWire) tenantpool.TenantState {
	ts := tenantpool.TenantState{
		Size: placement.SizeState{Size: w.Size, Wanted: w.Wanted, BelowSince: fromNanos(w.BelowSince)},
		Why:  w.Why, When: fromNanos(w.When), IdleSince: fromNanos(w.IdleSince),
		Members: make([]tenantpool.Placement, len(w.Members)),
	}
	for i, m := range w.Members {
		ts.Members[i] = tenantpool.Placement{ID: m.ID, Added: fromNanos(m.Added), Ready: m.Ready}
	}
	for _, r := range w.Removed {
		ts.Removed = append(ts.Removed, tenantpool.Removal{ID: r.ID, At: fromNanos(r.At), ServeOnly: r.ServeOnly, ReadUntil: fromNanos(r.ReadUntil)})
	}
	return ts
}

// tenantChunkWire is a chunk's stored form: {"v":<version>,"t":{<tenant>:
// <state>,...}}. A chunk stored before chunks carried their version is the
// bare map of tenants; DecodeTenantChunk reads it as version 0. The two
// cannot be mistaken: in the bare map every value is an object, where "v"
// here is a number.
type tenantChunkWire struct {
	Version uint64                     `json:"v"`
	Tenants map[string]tenantStateWire `json:"t"`
}

// EncodeTenantChunk returns the stored form of c: ErrTooLarge past
// MaxTenantChunkBytes.
func EncodeTenantChunk(c TenantChunk) ([]byte, error) {
	w := tenantChunkWire{Version: c.Version, Tenants: make(map[string]tenantStateWire, len(c.Tenants))}
	for id, ts := range c.Tenants {
		w.Tenants[id] = tenantToWire(ts)
	}
	b, err := json.Marshal(w)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxTenantChunkBytes {
		return nil, fmt.Errorf("%w: a chunk of %d tenants is %d bytes, above the %d bytes one chunk may hold: the pool has too many tenants (about %d); set forget_after so that idle tenants leave the state",
			ErrTooLarge, len(c.Tenants), len(b), MaxTenantChunkBytes, len(c.Tenants)*TenantChunks)
	}
	return b, nil
}

// DecodeTenantChunk decodes the value stored at key, in either form (see
// tenantChunkWire).
func DecodeTenantChunk(key string, data []byte) (TenantChunk, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return TenantChunk{}, corruptf(key, "", "%v", err)
	}
	var w tenantChunkWire
	if v, ok := raw["v"]; ok && len(v) > 0 && v[0] != '{' {
		if err := json.Unmarshal(data, &w); err != nil {
			return TenantChunk{}, corruptf(key, "", "%v", err)
		}
	} else if err := json.Unmarshal(data, &w.Tenants); err != nil {
		return TenantChunk{}, corruptf(key, "", "%v", err)
	}
	_, _, id, _ := ParseKey(key)
	chunk, _ := parseTenantStateID(id)
	c := TenantChunk{Version: w.Version, Tenants: make(map[string]tenantpool.TenantState, len(w.Tenants))}
	for t, tw := range w.Tenants {
		if t == "" || len(t) > MaxTenantLen {
			return TenantChunk{}, corruptf(key, "tenant", "%.40q is not 1-%d bytes", t, MaxTenantLen)
		}
		if chunk >= 0 && TenantChunkOf(t) != chunk {
			return TenantChunk{}, corruptf(key, "tenant", "%.40q belongs to chunk %d", t, TenantChunkOf(t))
		}
		c.Tenants[t] = tenantFromWire(tw)
	}
	return c, nil
}

// DefaultTenantTxnBytes is the default budget of one transaction of a
// tenant pool's publication (keys and values), below etcd's default 1.5
// MiB request limit.
const DefaultTenantTxnBytes = 1 << 20

// StateBudget bounds each transaction of a publication.
type StateBudget struct {
	// Bytes of keys and values; 0: DefaultTenantTxnBytes. A chunk larger
	// than Bytes on its own still goes, alone (up to
	// MaxTenantChunkBytes).
	Bytes int
	// Writes per transaction; 0: no bound beyond Bytes. Use
	// Store.MaxTxnWrites.
	Writes int
}

// Publication is the writes that publish a round's state, in the order
// they must be committed, each slice one transaction: Batches (the
// rewritten chunks, each recording the round's version), then Last (the
// meta if it changed, and the deletes of chunks left empty). Readers apply
// a chunk ahead of the meta only with a meta of its version, which Last
// carries, so the publication is atomic for them however many
// transactions it takes.
type Publication struct {
	Batches [][]Write
	Last    []Write
	Bytes   int // keys and values of every write
	Writes  int // keys written or deleted
}

// StateWrites returns the writes that persist st after a round whose
// changed tenants are tenants (Changes.Tenants plus any MarkReady applied),
// with chunks the index of st's tenants by chunk (ChunkIndex). meta is
// written only if it differs from prev (nil: not stored yet). The chunks
// are split into batches under budget.
func StateWrites(pool string, st tenantpool.State, published time.Time, prev *TenantMeta, tenants []string, chunks *ChunkIndex, budget StateBudget) (Publication, error) {
	var pub Publication
	if err := ValidateName(KindTenantPool, pool); err != nil {
		return pub, err
	}
	if budget.Bytes <= 0 {
		budget.Bytes = DefaultTenantTxnBytes
	}
	meta := TenantMeta{Version: st.Version, Members: st.Members, Policy: st.Policy, Published: published}
	if prev != nil && prev.Version == st.Version {
		meta.Published = prev.Published
	}
	if prev == nil || !metaEqual(*prev, meta) {
		b, err := EncodeTenantMeta(meta)
		if err != nil {
			return pub, err
		}
		pub.Last = append(pub.Last, Write{key: TenantMetaKey(pool), val: b})
		pub.Bytes += len(TenantMetaKey(pool)) + len(b)
	}
	touched := map[int]bool{}
	for _, t := range tenants {
		touched[TenantChunkOf(t)] = true
	}
	var batch []Write
	batchBytes := 0
	for _, c := range slices.Sorted(maps.Keys(touched)) {
		ids := chunks.Tenants(c)
		key := TenantChunkKey(pool, c)
		if len(ids) == 0 {
			// Deleted with the meta: a delete carries no version, so it
			// must not reach readers before the meta does.
			pub.Last = append(pub.Last, Write{key: key, del: true})
			pub.Bytes += len(key)
			continue
		}
		chunk := TenantChunk{Version: st.Version, Tenants: make(map[string]tenantpool.TenantState, len(ids))}
		for id := range ids {
			chunk.Tenants[id] = st.Tenants[id]
		}
		b, err := EncodeTenantChunk(chunk)
		if err != nil {
			return Publication{}, fmt.Errorf("store: tenant pool %q: chunk %d: %w", pool, c, err)
		}
		n := len(key) + len(b)
		if len(batch) > 0 && (batchBytes+n > budget.Bytes || (budget.Writes > 0 && len(batch) >= budget.Writes)) {
			pub.Batches = append(pub.Batches, batch)
			batch, batchBytes = nil, 0
		}
		batch = append(batch, Write{key: key, val: b})
		batchBytes += n
		pub.Bytes += n
	}
	if len(batch) > 0 {
		pub.Batches = append(pub.Batches, batch)
	}
	pub.Writes = len(pub.Last)
	for _, b := range pub.Batches {
		pub.Writes += len(b)
	}
	return pub, nil
}

func metaEqual(a, b TenantMeta) bool {
	ab, _ := EncodeTenantMeta(a)
	bb, _ := EncodeTenantMeta(b)
	return string(ab) == string(bb)
}

// ChunkIndex is the tenants of a state by chunk, kept up to date by the
// leader as tenants come and go, so a round finds a chunk's tenants
// without scanning the state.
type ChunkIndex struct {
	chunks [TenantChunks]map[string]struct{}
}

// NewChunkIndex indexes st's tenants.
func NewChunkIndex(st tenantpool.State) *ChunkIndex {
	ix := &ChunkIndex{}
	for id := range st.Tenants {
		ix.Set(id, true)
	}
	return ix
}

// Set adds (present) or removes tenant.
func (ix *ChunkIndex) Set(tenant string, present bool) {
	c := TenantChunkOf(tenant)
	if present {
		if ix.chunks[c] == nil {
			ix.chunks[c] = map[string]struct{}{}
		}
		ix.chunks[c][tenant] = struct{}{}
		return
	}
	delete(ix.chunks[c], tenant)
}

// Tenants returns chunk's tenants; read-only.
func (ix *ChunkIndex) Tenants(chunk int) map[string]struct{} { return ix.chunks[chunk] }

// PutTenantPool creates tenant pool p or replaces its settings; its
// members and state are kept. Errors: ErrInvalid, ErrInvalidName,
// ErrUnavailable.
func (s *Store) PutTenantPool(ctx context.Context, p TenantPool) (int64, error) {
	if s.closed() {
		return 0, errClosed("put tenant pool")
	}
	val, err := EncodeTenantPool(p)
	if err != nil {
		return 0, err
	}
	resp, err := s.client.Put(ctx, TenantPoolKey(p.Name), string(val))
	if err != nil {
		return 0, s.err(fmt.Sprintf("put tenant pool %q", p.Name), err)
	}
	return resp.Header.Revision, nil
}

// CreateTenantPool stores p only if no pool of that name exists.
// Errors: ErrExists, ErrInvalid, ErrInvalidName, ErrUnavailable.
func (s *Store) CreateTenantPool(ctx context.Context, p TenantPool) (int64, error) {
	if s.closed() {
		return 0, errClosed("create tenant pool")
	}
	val, err := EncodeTenantPool(p)
	if err != nil {
		return 0, err
	}
	return s.create(ctx, fmt.Sprintf("create tenant pool %q", p.Name), TenantPoolKey(p.Name), val)
}

// GetTenantPool returns a tenant pool's settings and the ModRevision of
// its key. Errors: ErrNotFound, ErrCorrupt, ErrInvalidName, ErrUnavailable.
func (s *Store) GetTenantPool(ctx context.Context, pool string) (TenantPool, int64, error) {
	if s.closed() {
		return TenantPool{}, 0, errClosed("get tenant pool")
	}
	if err := ValidateName(KindTenantPool, pool); err != nil {
		return TenantPool{}, 0, err
	}
	return getRecord(ctx, s, fmt.Sprintf("get tenant pool %q", pool), TenantPoolKey(pool), DecodeTenantPool)
}

// ListTenantPools returns every tenant pool's settings, sorted by name.
// Values that do not decode are skipped.
func (s *Store) ListTenantPools(ctx context.Context) ([]TenantPool, error) {
	if s.closed() {
		return nil, errClosed("list tenant pools")
	}
	resp, err := s.client.Get(ctx, Prefix+"tpools/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, s.err("list tenant pools", err)
	}
	var out []TenantPool
	for _, kv := range resp.Kvs {
		if p, err := DecodeTenantPool(string(kv.Key), kv.Value); err == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// DeleteTenantPool deletes tenant pool's settings, members and state in
// one transaction. The members' sessions end at their next keep-alive.
// Errors: ErrNotFound, ErrInvalidName, ErrUnavailable.
func (s *Store) DeleteTenantPool(ctx context.Context, pool string) (int64, error) {
	if s.closed() {
		return 0, errClosed("delete tenant pool")
	}
	if err := ValidateName(KindTenantPool, pool); err != nil {
		return 0, err
	}
	resp, err := s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(TenantPoolKey(pool)), ">", 0)).
		Then(
			clientv3.OpDelete(TenantPoolKey(pool)),
			clientv3.OpDelete(Prefix+"tpmembers/"+pool+"/", clientv3.WithPrefix()),
			clientv3.OpDelete(Prefix+"tpstate/"+pool+"/", clientv3.WithPrefix()),
		).Commit()
	if err != nil {
		return 0, s.err(fmt.Sprintf("delete tenant pool %q", pool), err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("store: delete tenant pool %q: %w", pool, ErrNotFound)
	}
	return resp.Header.Revision, nil
}

// JoinTenantPool writes member m of pool on lease, inactive until
// ActivateTenantMember. If the id is held by another live session it
// fails with ErrExists unless replace is set: then it takes the id over
// and returns the old session's lease, which the caller revokes (the new
// record is not leaving). Joining again on the same lease updates the
// record and keeps it active and leaving as it was.
// Errors: ErrNotFound (no such pool), ErrExists, ErrLeaseNotFound,
// ErrInvalid, ErrInvalidName, ErrUnavailable.
func (s *Store) JoinTenantPool(ctx context.Context, pool string, m TenantMember, lease shard.LeaseID, replace bool) (old shard.LeaseID, rev int64, err error) {
	if s.closed() {
		return 0, 0, errClosed("join tenant pool")
	}
	if err := ValidateName(KindTenantPool, pool); err != nil {
		return 0, 0, err
	}
	m.Session = lease
	op := fmt.Sprintf("join tenant pool %s as %s", pool, m.ID)
	poolKey, key := TenantPoolKey(pool), TenantMemberKey(pool, m.ID)
	for range maxRetries {
		resp, err := s.client.Txn(ctx).Then(clientv3.OpGet(poolKey, clientv3.WithKeysOnly()), clientv3.OpGet(key)).Commit()
		if err != nil {
			return 0, 0, s.err(op, err)
		}
		pkv := resp.Responses[0].GetResponseRange().Kvs
		if len(pkv) == 0 {
			return 0, 0, fmt.Errorf("store: %s: tenant pool %q: %w", op, pool, ErrNotFound)
		}
		var curRev int64
		old, m.Active, m.Leaving = 0, false, false
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
			curRev = kvs[0].ModRevision
			switch cur := shard.LeaseID(kvs[0].Lease); {
			case cur == lease:
				if prev, err := DecodeTenantMember(key, kvs[0].Value); err == nil {
					m.Active, m.Leaving = prev.Active, prev.Leaving
				}
			case !replace:
				return 0, 0, fmt.Errorf("store: %s: %w: member id %q is held by live session %v", op, ErrExists, m.ID, cur)
			default:
				old = cur
			}
		}
		val, err := EncodeTenantMember(m)
		if err != nil {
			return 0, 0, err
		}
		tr, err := s.client.Txn(ctx).If(
			clientv3.Compare(clientv3.CreateRevision(poolKey), "=", pkv[0].CreateRevision),
			clientv3.Compare(clientv3.ModRevision(key), "=", curRev),
		).Then(clientv3.OpPut(key, string(val), clientv3.WithLease(clientv3.LeaseID(lease)))).Commit()
		if err != nil {
			return 0, 0, s.err(op, err)
		}
		if tr.Succeeded {
			return old, tr.Header.Revision, nil
		}
	}
	return 0, 0, fmt.Errorf("store: %s: %w: the member key kept changing", op, ErrConflict)
}

// ActivateTenantMember marks member id of pool, held by lease, active. It
// returns the revision of the write, or 0 if it was already active.
// Errors: ErrNotFound (no record), ErrFenced (another session holds the
// id), ErrConflict, ErrUnavailable.
func (s *Store) ActivateTenantMember(ctx context.Context, pool, id string, lease shard.LeaseID) (int64, error) {
	return s.updateTenantMember(ctx, "activate", pool, id, lease, func(m *TenantMember) bool {
		if m.Active {
			return false
		}
		m.Active = true
		return true
	})
}

// MarkTenantMemberLeaving marks member id of pool, held by lease, leaving
// (see TenantMember.Leaving); the record stays on the lease. It returns
// the revision of the write, or 0 if it was already leaving. Errors as
// ActivateTenantMember.
func (s *Store) MarkTenantMemberLeaving(ctx context.Context, pool, id string, lease shard.LeaseID) (int64, error) {
	return s.updateTenantMember(ctx, "mark leaving", pool, id, lease, func(m *TenantMember) bool {
		if m.Leaving {
			return false
		}
		m.Leaving = true
		return true
	})
}

// updateTenantMember rewrites member id of pool if it is held by lease
// and change reports a change; it returns the revision of the write, or 0
// if nothing changed.
func (s *Store) updateTenantMember(ctx context.Context, what, pool, id string, lease shard.LeaseID, change func(*TenantMember) bool) (int64, error) {
	if s.closed() {
		return 0, errClosed(what + " tenant pool member")
	}
	op := fmt.Sprintf("%s tenant pool member %s/%s", what, pool, id)
	key := TenantMemberKey(pool, id)
	for range maxRetries {
		resp, err := s.client.Get(ctx, key)
		if err != nil {
			return 0, s.err(op, err)
		}
		if len(resp.Kvs) == 0 {
			return 0, fmt.Errorf("store: %s: %w", op, ErrNotFound)
		}
		kv := resp.Kvs[0]
		if shard.LeaseID(kv.Lease) != lease {
			return 0, fmt.Errorf("store: %s: %w: member id %q is now held by session %v, not %v", op, ErrFenced, id, shard.LeaseID(kv.Lease), lease)
		}
		m, err := DecodeTenantMember(key, kv.Value)
		if err != nil {
			return 0, err
		}
		if !change(&m) {
			return 0, nil
		}
		val, err := EncodeTenantMember(m)
		if err != nil {
			return 0, err
		}
		tr, err := s.client.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).
			Then(clientv3.OpPut(key, string(val), clientv3.WithLease(clientv3.LeaseID(lease)))).
			Commit()
		if err != nil {
			return 0, s.err(op, err)
		}
		if tr.Succeeded {
			return tr.Header.Revision, nil
		}
	}
	return 0, fmt.Errorf("store: %s: %w: the member key kept changing", op, ErrConflict)
}

// LoadTenantState reads pool's stored state at one revision, for a new
// leader: meta is the stored meta (ok false if there is none yet: version
// 0) and st joins it with every stored chunk.
//
// A leader stopped part way through a publication leaves chunks ahead of
// the meta (TenantPoolState.Ahead), which readers do not apply yet. st
// takes them as they are, at the version of the latest of them, above
// meta.Version: the leader's next round then writes a meta of that
// version or above, which publishes them. That is safe because every
// chunk holds whole tenants, each tenant's state is independent of the
// others', and each was a Plan output from the published state: a state
// where only some tenants moved on is one that Plan could have produced
// from the same input had fewer of them changed, and the next round
// plans from it as from any other (members gone since are removed from
// the subsets that name them). Chunks that the stopped round would have
// deleted (left empty) are still there, with tenants the next rounds
// forget again.
//
// Errors: ErrCorrupt (a chunk or the meta does not decode),
// ErrInvalidName, ErrUnavailable.
func (s *Store) LoadTenantState(ctx context.Context, pool string) (st tenantpool.State, meta TenantMeta, ok bool, err error) {
	if s.closed() {
		return st, meta, false, errClosed("load tenant state")
	}
	if err := ValidateName(KindTenantPool, pool); err != nil {
		return st, meta, false, err
	}
	resp, err := s.client.Get(ctx, Prefix+"tpstate/"+pool+"/", clientv3.WithPrefix())
	if err != nil {
		return st, meta, false, s.err(fmt.Sprintf("load tenant state of %q", pool), err)
	}
	ps := newTenantPoolState(pool)
	for _, kv := range resp.Kvs {
		c := decodeKV(kv)
		if c.Err != nil {
			return st, meta, false, c.Err
		}
		snap := &Snapshot{TenantPools: map[string]*TenantPoolState{pool: ps}}
		snap.applyTenantPool(c)
	}
	st, _ = ps.stored()
	return st, ps.Meta.Value, ps.Meta.Exists(), nil
}

// PutReplica advertises replica's API URL on lease (the replica's
// session), so that other replicas can forward calls to it when it leads.
func (s *Store) PutReplica(ctx context.Context, replica, url string, lease shard.LeaseID) error {
	if s.closed() {
		return errClosed("put replica")
	}
	if err := ValidateName(KindReplica, replica); err != nil {
		return err
	}
	_, err := s.client.Put(ctx, ReplicaKey(replica), url, clientv3.WithLease(clientv3.LeaseID(lease)))
	return s.err(fmt.Sprintf("advertise replica %q", replica), err)
}

// ReplicaURL returns replica's advertised API URL. Errors: ErrNotFound,
// ErrInvalidName, ErrUnavailable.
func (s *Store) ReplicaURL(ctx context.Context, replica string) (string, error) {
	if s.closed() {
		return "", errClosed("get replica")
	}
	if err := ValidateName(KindReplica, replica); err != nil {
		return "", err
	}
	resp, err := s.client.Get(ctx, ReplicaKey(replica))
	if err != nil {
		return "", s.err(fmt.Sprintf("get replica %q", replica), err)
	}
	if len(resp.Kvs) == 0 {
		return "", fmt.Errorf("store: replica %q has no advertised URL: %w", replica, ErrNotFound)
	}
	return string(resp.Kvs[0].Value), nil
}

// loadPublished fills the Prev of snap's tenant pools whose chunks are
// ahead of their meta, reading those chunks at the meta's revision. A
// revision compacted away leaves them unknown: logged, and left out of
// State.
func (s *Store) loadPublished(ctx context.Context, snap *Snapshot) error {
	for name, ps := range snap.TenantPools {
		for c := range ps.Chunks {
			if !ps.Ahead(c) || !ps.Meta.Exists() {
				continue
			}
			key := TenantChunkKey(name, c)
			resp, err := s.client.Get(ctx, key, clientv3.WithRev(ps.Meta.ModRevision))
			if err != nil {
				if errors.Is(err, rpctypes.ErrCompacted) {
					s.log.Warn("store: a chunk ahead of its tenant pool's meta has no published value left (compacted); its tenants are left out until the next meta", "key", key, "meta_revision", ps.Meta.ModRevision)
					continue
				}
				return s.err("load the published chunks of tenant pool "+name, err)
			}
			if ps.Prev == nil {
				ps.Prev = map[int]TenantChunk{}
			}
			if len(resp.Kvs) == 0 {
				ps.Prev[c] = TenantChunk{}
				continue
			}
			pc, err := DecodeTenantChunk(key, resp.Kvs[0].Value)
			if err != nil {
				return err
			}
			ps.Prev[c] = pc
		}
	}
	return nil
}

// MaxTxnWrites is the most writes one Commit of this store takes
// (Config.MaxTxnOps - 1): a StateBudget's Writes.
func (s *Store) MaxTxnWrites() int { return s.maxOps - 1 }
