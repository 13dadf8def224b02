package store

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/keyshard/keyshard/hotkey"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/placement"
)

// Limits on the values stored. They keep each key far below etcd's request
// size limit and make a corrupt or hostile value easy to spot.
const (
	MaxLeaseTTL       = 24 * time.Hour
	MaxDrainTimeout   = 24 * time.Hour
	MaxAddressLen     = 1024
	MaxZoneLen        = 128
	MaxMetadata       = 64 // entries
	MaxMetadataKeyLen = 128
	MaxMetadataValLen = 1024
	MaxDrainByLen     = 256
	MaxMapMembers     = math.MaxUint16 // stored owner indexes are uint16, 0 = unassigned
)

// The records of a keyspace (internal/shard) are stored as JSON, each at
// its key (see the package documentation for the layout). Encoding checks
// a record against the limits above as well as its own rules; decoding
// checks the same and that the value agrees with its key.

// fieldError is a validation failure of one field, turned into ErrInvalid
// (encoding) or a *CorruptError (decoding) by the caller.
type fieldError struct {
	field, reason string
}

func ferr(field, format string, args ...any) *fieldError {
	return &fieldError{field: field, reason: fmt.Sprintf(format, args...)}
}

func (e *fieldError) invalid(what string) error {
	return fmt.Errorf("%w: %s: field %q: %s", ErrInvalid, what, e.field, e.reason)
}

func (e *fieldError) corrupt(key string) error {
	return &CorruptError{Key: key, Field: e.field, Reason: e.reason}
}

func checkText(field, s string, min, max int) *fieldError {
	if len(s) < min || len(s) > max {
		return ferr(field, "length %d is outside [%d, %d]", len(s), min, max)
	}
	if !utf8.ValidString(s) {
		return ferr(field, "not valid UTF-8")
	}
	return nil
}

func checkTime(field string, t time.Time) *fieldError {
	if t.IsZero() {
		return ferr(field, "not set")
	}
	if y := t.UTC().Year(); y < 1 || y > 9999 {
		return ferr(field, "year %d is outside [1, 9999]", y)
	}
	return nil
}

func checkName(field string, kind Kind, s string) *fieldError {
	if err := ValidateName(kind, s); err != nil {
		return ferr(field, "%v", err)
	}
	return nil
}

// validateKeyspace checks k as CreateKeyspace and EncodeKeyspace do: a
// valid name, 1 to placement.MaxBuckets buckets, an explicit hash mode, a
// known mode, a lease TTL of whole seconds in [1 s, MaxLeaseTTL] and a
// drain timeout of whole milliseconds in [0, MaxDrainTimeout].
func validateKeyspace(k shard.Keyspace) *fieldError {
	if e := checkName("name", KindKeyspace, k.Name); e != nil {
		return e
	}
	if k.Buckets < placement.MinBuckets || k.Buckets > placement.MaxBuckets {
		return ferr("buckets", "%d is outside [%d, %d]", k.Buckets, placement.MinBuckets, placement.MaxBuckets)
	}
	if k.Hash == "" {
		return ferr("hash", "empty; use %q or %q", placement.HashXXH64, placement.HashSynapse)
	}
	if err := k.Hash.Validate(); err != nil {
		return ferr("hash", "%v", err)
	}
	switch k.Mode {
	case shard.ModeExclusive, shard.ModeStream:
	default:
		return ferr("mode", "%q is unknown; use %q or %q", string(k.Mode), shard.ModeExclusive, shard.ModeStream)
	}
	if k.LeaseTTL < time.Second || k.LeaseTTL > MaxLeaseTTL || k.LeaseTTL%time.Second != 0 {
		return ferr("lease_ttl_ms", "%v is not a whole number of seconds in [1s, %v]", k.LeaseTTL, MaxLeaseTTL)
	}
	if k.DrainTimeout < 0 || k.DrainTimeout > MaxDrainTimeout || k.DrainTimeout%time.Millisecond != 0 {
		return ferr("drain_timeout_ms", "%v is not a whole number of milliseconds in [0, %v]", k.DrainTimeout, MaxDrainTimeout)
	}
	return nil
}

// validateMember checks m as Join and EncodeMember do: a valid id, an
// address, zone and metadata within the limits, a finite weight >= 0, a
// session, a replaced session other than it, and a join time.
func validateMember(m shard.Member) *fieldError {
	if e := checkName("id", KindMember, m.ID); e != nil {
		return e
	}
	if e := checkText("address", m.Address, 0, MaxAddressLen); e != nil {
		return e
	}
	if math.IsNaN(m.Weight) || math.IsInf(m.Weight, 0) || m.Weight < 0 {
		return ferr("weight", "%v is not a finite number >= 0", m.Weight)
	}
	if e := checkText("zone", m.Zone, 0, MaxZoneLen); e != nil {
		return e
	}
	if len(m.Metadata) > MaxMetadata {
		return ferr("metadata", "%d entries; the limit is %d", len(m.Metadata), MaxMetadata)
	}
	for k, v := range m.Metadata {
		if e := checkText("metadata", k, 1, MaxMetadataKeyLen); e != nil {
			return ferr("metadata", "key %q: %s", k, e.reason)
		}
		if e := checkText("metadata", v, 0, MaxMetadataValLen); e != nil {
			return ferr("metadata", "value of %q: %s", k, e.reason)
		}
	}
	if m.Session <= 0 {
		return ferr("session", "%d is not a lease id", int64(m.Session))
	}
	if m.Replaces < 0 || m.Replaces == m.Session {
		return ferr("replaces", "%d is not a lease id other than the session's", int64(m.Replaces))
	}
	if m.ReplacesFenced && m.Replaces == 0 {
		return ferr("replaces_fenced", "set without a session it replaces")
	}
	if e := checkTime("joined_at", m.JoinedAt); e != nil {
		return e
	}
	return nil
}

// validateDrain checks d as PutDrain and EncodeDrain do: a request time
// and who asked.
func validateDrain(d shard.Drain) *fieldError {
	if e := checkTime("requested_at", d.RequestedAt); e != nil {
		return e
	}
	return checkText("by", d.By, 1, MaxDrainByLen)
}

// validateMap checks m as EncodeMap does: epoch >= 1, bucket count and
// hash mode valid, at most MaxMapMembers members, their ids valid and
// distinct, and each bucket unassigned or owned by one of them.
func validateMap(m shard.Map) *fieldError {
	a := m.Assignment
	if m.Epoch == 0 {
		return ferr("epoch", "0; epochs start at 1")
	}
	if b := a.Buckets(); b < placement.MinBuckets || b > placement.MaxBuckets {
		return ferr("buckets", "%d is outside [%d, %d]", b, placement.MinBuckets, placement.MaxBuckets)
	}
	if m.Hash == "" {
		return ferr("hash", "empty")
	}
	if err := m.Hash.Validate(); err != nil {
		return ferr("hash", "%v", err)
	}
	if len(a.Members) > MaxMapMembers {
		return ferr("members", "%d members; the limit is %d", len(a.Members), MaxMapMembers)
	}
	seen := make(map[string]bool, len(a.Members))
	for i, id := range a.Members {
		if err := ValidateName(KindMember, id); err != nil {
			return ferr("members", "member %d: %v", i, err)
		}
		if seen[id] {
			return ferr("members", "member %q appears twice", id)
		}
		seen[id] = true
	}
	for b, o := range a.Owners {
		if o != placement.Unassigned && (o < 0 || int(o) >= len(a.Members)) {
			return ferr("owners", "bucket %d has owner index %d; there are %d members", b, o, len(a.Members))
		}
	}
	return nil
}

func validatePairs(field string, pairs []shard.BucketToken) *fieldError {
	for i, p := range pairs {
		if p.Bucket < 0 || p.Bucket >= placement.MaxBuckets {
			return ferr(field, "entry %d: bucket %d is outside [0, %d)", i, p.Bucket, placement.MaxBuckets)
		}
		if p.Token == 0 {
			return ferr(field, "entry %d: bucket %d has token 0; tokens start at 1", i, p.Bucket)
		}
		if i > 0 && pairs[i-1].Bucket >= p.Bucket {
			if pairs[i-1].Bucket == p.Bucket {
				return ferr(field, "entry %d: bucket %d appears twice", i, p.Bucket)
			}
			return ferr(field, "entry %d: bucket %d follows %d; want ascending order", i, p.Bucket, pairs[i-1].Bucket)
		}
	}
	return nil
}

func checkPairsIn(field string, pairs []shard.BucketToken, buckets int) *fieldError {
	for _, p := range pairs {
		if p.Bucket >= buckets {
			return ferr(field, "bucket %d is outside the keyspace's %d buckets", p.Bucket, buckets)
		}
	}
	return nil
}

// validateGrants checks g: a session and sorted, distinct buckets with
// tokens >= 1.
func validateGrants(g shard.Grants) *fieldError {
	if g.Session <= 0 {
		return ferr("session", "%d is not a lease id", int64(g.Session))
	}
	return validatePairs("buckets", g.Buckets)
}

// validateQuarantine checks q: a session and sorted, distinct buckets in
// range.
func validateQuarantine(q shard.Quarantine) *fieldError {
	if q.Session <= 0 {
		return ferr("session", "%d is not a lease id", int64(q.Session))
	}
	for i, b := range q.Buckets {
		if b < 0 || b >= placement.MaxBuckets {
			return ferr("buckets", "entry %d: bucket %d is outside [0, %d)", i, b, placement.MaxBuckets)
		}
		if i > 0 && q.Buckets[i-1] >= b {
			if q.Buckets[i-1] == b {
				return ferr("buckets", "entry %d: bucket %d appears twice", i, b)
			}
			return ferr("buckets", "entry %d: bucket %d follows %d; want ascending order", i, b, q.Buckets[i-1])
		}
	}
	return nil
}

// Wire forms. Encoding and decoding use separate structs so that decoding
// can see each pair's raw JSON and reject anything but two non-negative
// integers.

type keyspaceJSON struct {
	Name           string `json:"name"`
	Buckets        int    `json:"buckets"`
	Hash           string `json:"hash"`
	Mode           string `json:"mode"`
	LeaseTTLMs     int64  `json:"lease_ttl_ms"`
	DrainTimeoutMs int64  `json:"drain_timeout_ms"`
}

var keyspaceFields = []string{"name", "buckets", "hash", "mode", "lease_ttl_ms", "drain_timeout_ms"}

type memberJSON struct {
	ID       string            `json:"id"`
	Address  string            `json:"address"`
	Weight   float64           `json:"weight"`
	Zone     string            `json:"zone"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Session  int64             `json:"session"`
	JoinedAt string            `json:"joined_at"` // RFC 3339
	Pending  bool              `json:"pending,omitempty"`
	Replaces int64             `json:"replaces,omitempty"`
	Fenced   bool              `json:"replaces_fenced,omitempty"`
}

var memberFields = []string{"id", "address", "weight", "zone", "metadata", "session", "joined_at", "pending", "replaces", "replaces_fenced"}

type drainJSON struct {
	RequestedAt string `json:"requested_at"` // RFC 3339
	By          string `json:"by"`
	Leave       bool   `json:"leave,omitempty"`
}

var drainFields = []string{"requested_at", "by", "leave"}

type mapJSON struct {
	Epoch   uint64   `json:"epoch"`
	Buckets int      `json:"buckets"`
	Hash    string   `json:"hash"`
	Members []string `json:"members"`
	Owners  string   `json:"owners"`
}

var mapFields = []string{"epoch", "buckets", "hash", "members", "owners"}

// Grants and releases keep their buckets' positions (stream keyspaces) in
// a field of their own, "from" and "positions", listing only the buckets
// at a position > 0 and omitted when there are none: an exclusive
// keyspace's records are the same bytes as before positions existed.

type grantsOut struct {
	Session int64       `json:"session"`
	Buckets [][2]uint64 `json:"buckets"`
	From    [][2]uint64 `json:"from,omitempty"`
}

type grantsIn struct {
	Session int64    `json:"session"`
	Buckets uintRows `json:"buckets"`
	From    uintRows `json:"from"`
}

var grantsFields = []string{"session", "buckets", "from"}

type releasesOut struct {
	Buckets   [][2]uint64 `json:"buckets"`
	Positions [][2]uint64 `json:"positions,omitempty"`
}

type releasesIn struct {
	Buckets   uintRows `json:"buckets"`
	Positions uintRows `json:"positions"`
}

var releasesFields = []string{"buckets", "positions"}

type quarantineOut struct {
	Session int64 `json:"session"`
	Buckets []int `json:"buckets"`
}

type quarantineIn struct {
	Session int64             `json:"session"`
	Buckets []json.RawMessage `json:"buckets"`
}

var quarantineFields = []string{"session", "buckets"}

func pairsOut(pairs []shard.BucketToken) [][2]uint64 {
	out := make([][2]uint64, len(pairs))
	for i, p := range pairs {
		out[i] = [2]uint64{uint64(p.Bucket), p.Token}
	}
	return out
}

// positionsOut returns the [bucket, position] pairs of the buckets of
// pairs at a position > 0, or nil.
func positionsOut(pairs []shard.BucketToken) [][2]uint64 {
	var out [][2]uint64
	for _, p := range pairs {
		if p.Position != 0 {
			out = append(out, [2]uint64{uint64(p.Bucket), p.Position})
		}
	}
	return out
}

// positionsIn sets the positions of pairs (sorted by bucket) from
// [[bucket, position], ...]: strictly ascending buckets, each one of
// pairs', each position > 0.
func positionsIn(key, field string, in uintRows, pairs []shard.BucketToken) error {
	j := 0
	for i := range in.Len() {
		e := in.Row(i)
		if len(e) != 2 {
			return corruptf(key, field, "entry %d has %d elements; want [bucket, position]", i, len(e))
		}
		if err := in.Err(i, 0); err != nil {
			return corruptf(key, field, "entry %d: bucket: %v", i, err)
		}
		if err := in.Err(i, 1); err != nil {
			return corruptf(key, field, "entry %d: position: %v", i, err)
		}
		b, pos := e[0], e[1]
		if pos == 0 {
			return corruptf(key, field, "entry %d: bucket %d at position 0; leave it out", i, b)
		}
		for j < len(pairs) && uint64(pairs[j].Bucket) < b {
			j++
		}
		if j == len(pairs) || uint64(pairs[j].Bucket) != b {
			return corruptf(key, field, "entry %d: bucket %d is not in \"buckets\", or is out of order or repeated", i, b)
		}
		pairs[j].Position = pos
		j++
	}
	return nil
}

// pairsIn parses [[bucket, token], ...] strictly: exactly two plain
// non-negative integers (no sign, fraction, exponent or quotes) per pair.
func pairsIn(key, field string, in uintRows) ([]shard.BucketToken, error) {
	if in.Len() == 0 {
		return nil, nil
	}
	out := make([]shard.BucketToken, in.Len())
	for i := range in.Len() {
		p := in.Row(i)
		if len(p) != 2 {
			return nil, corruptf(key, field, "entry %d has %d elements; want [bucket, token]", i, len(p))
		}
		if err := in.Err(i, 0); err != nil {
			return nil, corruptf(key, field, "entry %d: bucket: %v", i, err)
		}
		if err := in.Err(i, 1); err != nil {
			return nil, corruptf(key, field, "entry %d: token: %v", i, err)
		}
		b, t := p[0], p[1]
		if b >= placement.MaxBuckets {
			return nil, corruptf(key, field, "entry %d: bucket %d is outside [0, %d)", i, b, placement.MaxBuckets)
		}
		out[i] = shard.BucketToken{Bucket: int(b), Token: t}
	}
	return out, nil
}

func parseUint(raw json.RawMessage) (uint64, error) {
	s := string(bytes.TrimSpace(raw))
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%.20s is not a non-negative integer", s)
		}
	}
	return strconv.ParseUint(s, 10, 64)
}

func marshal(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return b, nil
}

// decodeStrict decodes the JSON object data into v, which must be a pointer
// to a struct whose JSON names are exactly fields. Unlike encoding/json it
// rejects unknown fields, fields that match only without regard to case,
// repeated fields, invalid UTF-8, a value that is not an object and
// trailing data.
func decodeStrict(key string, data []byte, fields []string, v any) error {
	if !utf8.Valid(data) {
		return corruptf(key, "", "value is not valid UTF-8")
	}
	// The common case in one pass; anything else takes the token stream,
	// which names what is wrong.
	if decodePlain(data, fields, v) {
		return nil
	}
	return decodeTokens(key, data, fields, v)
}

// decodeTokens is decodeStrict on valid UTF-8, through encoding/json's
// token stream.
func decodeTokens(key string, data []byte, fields []string, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return corruptf(key, "", "not JSON: %v", err)
	}
	if tok != json.Delim('{') {
		return corruptf(key, "", "not a JSON object")
	}
	seen := make([]bool, len(fields))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return corruptf(key, "", "not JSON: %v", err)
		}
		name, _ := tok.(string)
		i := slices.Index(fields, name)
		if i < 0 {
			return corruptf(key, name, "unknown field")
		}
		if seen[i] {
			return corruptf(key, name, "field appears twice")
		}
		seen[i] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return corruptf(key, name, "not JSON: %v", err)
		}
	}
	if _, err := dec.Token(); err != nil {
		return corruptf(key, "", "not JSON: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return corruptf(key, "", "trailing data after the JSON object")
	}
	if err := json.Unmarshal(data, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return corruptf(key, te.Field, "cannot hold %s: want %s", te.Value, te.Type)
		}
		return corruptf(key, "", "%v", err)
	}
	return nil
}

func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// parseTime parses an RFC 3339 time; "" is the zero time (which validation
// then reports as "not set").
func parseTime(key, field, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, corruptf(key, field, "%.40q is not an RFC 3339 time", s)
	}
	return t, nil
}

// EncodeKeyspace returns the stored form of k, stored at keyspaces/<ks>:
// {"name","buckets","hash","mode","lease_ttl_ms","drain_timeout_ms"}. It
// returns an error wrapping ErrInvalid, naming the field, if k has no
// valid name, bucket count, hash mode or mode, or a lease TTL or drain
// timeout out of range.
func EncodeKeyspace(k shard.Keyspace) ([]byte, error) {
	if e := validateKeyspace(k); e != nil {
		return nil, e.invalid("keyspace")
	}
	return marshal(keyspaceJSON{
		Name:           k.Name,
		Buckets:        k.Buckets,
		Hash:           string(k.Hash),
		Mode:           string(k.Mode),
		LeaseTTLMs:     k.LeaseTTL.Milliseconds(),
		DrainTimeoutMs: k.DrainTimeout.Milliseconds(),
	})
}

// DecodeKeyspace decodes the value stored at key. Errors wrap ErrCorrupt and
// name key and field; the name in the value must match the key's when key
// is a keyspace key.
func DecodeKeyspace(key string, data []byte) (shard.Keyspace, error) {
	var w keyspaceJSON
	if err := decodeStrict(key, data, keyspaceFields, &w); err != nil {
		return shard.Keyspace{}, err
	}
	const maxMs = math.MaxInt64 / int64(time.Millisecond)
	if w.LeaseTTLMs < 0 || w.LeaseTTLMs > maxMs {
		return shard.Keyspace{}, corruptf(key, "lease_ttl_ms", "%d is out of range", w.LeaseTTLMs)
	}
	if w.DrainTimeoutMs < 0 || w.DrainTimeoutMs > maxMs {
		return shard.Keyspace{}, corruptf(key, "drain_timeout_ms", "%d is out of range", w.DrainTimeoutMs)
	}
	k := shard.Keyspace{
		Name:         w.Name,
		Buckets:      w.Buckets,
		Hash:         placement.HashMode(w.Hash),
		Mode:         shard.Mode(w.Mode),
		LeaseTTL:     time.Duration(w.LeaseTTLMs) * time.Millisecond,
		DrainTimeout: time.Duration(w.DrainTimeoutMs) * time.Millisecond,
	}
	if e := validateKeyspace(k); e != nil {
		return shard.Keyspace{}, e.corrupt(key)
	}
	if kind, ks, _, err := ParseKey(key); err == nil && kind == KindKeyspace && ks != k.Name {
		return shard.Keyspace{}, corruptf(key, "name", "%q does not match the key", k.Name)
	}
	return k, nil
}

// EncodeMember returns the stored form of m, stored at members/<ks>/<id>
// on the member's lease: {"id","address","weight","zone","metadata",
// "session","joined_at","pending","replaces","replaces_fenced"}, where
// "pending" and "replaces_fenced" are omitted when false and "replaces"
// when 0, so records written before they existed read as active. It
// returns an error wrapping ErrInvalid, naming the field, if m breaks a
// limit or has no session or join time.
func EncodeMember(m shard.Member) ([]byte, error) {
	if e := validateMember(m); e != nil {
		return nil, e.invalid("member")
	}
	return marshal(memberJSON{
		ID:       m.ID,
		Address:  m.Address,
		Weight:   m.Weight,
		Zone:     m.Zone,
		Metadata: m.Metadata,
		Session:  int64(m.Session),
		JoinedAt: formatTime(m.JoinedAt),
		Pending:  m.Pending,
		Replaces: int64(m.Replaces),
		Fenced:   m.ReplacesFenced,
	})
}

// DecodeMember decodes the value stored at key; the id must match the key's
// when key is a member key. Errors wrap ErrCorrupt.
func DecodeMember(key string, data []byte) (shard.Member, error) {
	var w memberJSON
	if err := decodeStrict(key, data, memberFields, &w); err != nil {
		return shard.Member{}, err
	}
	joined, err := parseTime(key, "joined_at", w.JoinedAt)
	if err != nil {
		return shard.Member{}, err
	}
	m := shard.Member{
		ID:             w.ID,
		Address:        w.Address,
		Weight:         w.Weight,
		Zone:           w.Zone,
		Metadata:       w.Metadata,
		Session:        shard.LeaseID(w.Session),
		JoinedAt:       joined,
		Pending:        w.Pending,
		Replaces:       shard.LeaseID(w.Replaces),
		ReplacesFenced: w.Fenced,
	}
	if len(m.Metadata) == 0 {
		m.Metadata = nil
	}
	if e := validateMember(m); e != nil {
		return shard.Member{}, e.corrupt(key)
	}
	if kind, _, id, err := ParseKey(key); err == nil && kind == KindMember && id != m.ID {
		return shard.Member{}, corruptf(key, "id", "%q does not match the key", m.ID)
	}
	return m, nil
}

// EncodeDrain returns the stored form of d, stored at drain/<ks>/<id> on
// the member's lease: {"requested_at","by","leave"}, "leave" omitted when
// false. It returns an error wrapping ErrInvalid if d has no request time
// or no valid "by".
func EncodeDrain(d shard.Drain) ([]byte, error) {
	if e := validateDrain(d); e != nil {
		return nil, e.invalid("drain request")
	}
	return marshal(drainJSON{RequestedAt: formatTime(d.RequestedAt), By: d.By, Leave: d.Leave})
}

// DecodeDrain decodes the value stored at key. Errors wrap ErrCorrupt.
func DecodeDrain(key string, data []byte) (shard.Drain, error) {
	var w drainJSON
	if err := decodeStrict(key, data, drainFields, &w); err != nil {
		return shard.Drain{}, err
	}
	at, err := parseTime(key, "requested_at", w.RequestedAt)
	if err != nil {
		return shard.Drain{}, err
	}
	d := shard.Drain{RequestedAt: at, By: w.By, Leave: w.Leave}
	if e := validateDrain(d); e != nil {
		return shard.Drain{}, e.corrupt(key)
	}
	return d, nil
}

// EncodeMap returns the stored form of m, stored at map/<ks>:
// {"epoch":N,"buckets":B,"hash":"xxh64","members":["a","b"],"owners":"<base64>"},
// where owners is B little-endian uint16, one per bucket: 0 for
// unassigned, i > 0 for members[i-1]. It returns an error wrapping
// ErrInvalid if m does not validate (validateMap).
func EncodeMap(m shard.Map) ([]byte, error) {
	if e := validateMap(m); e != nil {
		return nil, e.invalid("map")
	}
	a := m.Assignment
	owners := make([]byte, 2*len(a.Owners))
	for i, o := range a.Owners {
		binary.LittleEndian.PutUint16(owners[2*i:], uint16(o+1)) // Unassigned (-1) is 0
	}
	members := a.Members
	if members == nil {
		members = []string{}
	}
	return marshal(mapJSON{
		Epoch:   m.Epoch,
		Buckets: len(a.Owners),
		Hash:    string(m.Hash),
		Members: members,
		Owners:  base64.StdEncoding.EncodeToString(owners),
	})
}

// DecodeMap decodes the value stored at key. Errors wrap ErrCorrupt.
func DecodeMap(key string, data []byte) (shard.Map, error) {
	var w mapJSON
	if err := decodeStrict(key, data, mapFields, &w); err != nil {
		return shard.Map{}, err
	}
	raw, err := base64.StdEncoding.Strict().DecodeString(w.Owners)
	if err != nil {
		return shard.Map{}, corruptf(key, "owners", "bad base64: %v", err)
	}
	if len(raw)%2 != 0 {
		return shard.Map{}, corruptf(key, "owners", "%d bytes; want 2 per bucket", len(raw))
	}
	if len(raw)/2 != w.Buckets {
		return shard.Map{}, corruptf(key, "owners", "%d owners for %d buckets", len(raw)/2, w.Buckets)
	}
	m := shard.Map{
		Epoch: w.Epoch,
		Hash:  placement.HashMode(w.Hash),
		Assignment: placement.Assignment{
			Members: w.Members,
			Owners:  make([]int32, len(raw)/2),
		},
	}
	if len(m.Assignment.Members) == 0 {
		m.Assignment.Members = nil
	}
	for i := range m.Assignment.Owners {
		m.Assignment.Owners[i] = int32(binary.LittleEndian.Uint16(raw[2*i:])) - 1 // 0 is Unassigned (-1)
	}
	if e := validateMap(m); e != nil {
		return shard.Map{}, e.corrupt(key)
	}
	return m, nil
}

// EncodeGrants returns the stored form of g, stored at grants/<ks>/<id>
// on the member's lease g.Session: {"session":L,"buckets":[[bucket,token],...]},
// plus "from":[[bucket,position],...] for the buckets granted at a
// position > 0 (stream keyspaces), omitted when there are none. It returns an error wrapping ErrInvalid if g has no session or its
// buckets are not sorted and distinct with tokens >= 1.
func EncodeGrants(g shard.Grants) ([]byte, error) {
	if e := validateGrants(g); e != nil {
		return nil, e.invalid("grants")
	}
	return marshal(grantsOut{Session: int64(g.Session), Buckets: pairsOut(g.Buckets), From: positionsOut(g.Buckets)})
}

// DecodeGrants decodes the value stored at key. Errors wrap ErrCorrupt.
func DecodeGrants(key string, data []byte) (shard.Grants, error) {
	var w grantsIn
	if err := decodeStrict(key, data, grantsFields, &w); err != nil {
		return shard.Grants{}, err
	}
	pairs, err := pairsIn(key, "buckets", w.Buckets)
	if err != nil {
		return shard.Grants{}, err
	}
	if e := validatePairs("buckets", pairs); e != nil {
		return shard.Grants{}, e.corrupt(key)
	}
	if err := positionsIn(key, "from", w.From, pairs); err != nil {
		return shard.Grants{}, err
	}
	g := shard.Grants{Session: shard.LeaseID(w.Session), Buckets: pairs}
	if e := validateGrants(g); e != nil {
		return shard.Grants{}, e.corrupt(key)
	}
	return g, nil
}

// EncodeReleases returns the stored form of r, stored at
// releases/<ks>/<id> on the member's lease: {"buckets":[[bucket,token],...]},
// plus "positions":[[bucket,position],...] for the buckets released with
// a final position > 0 (stream keyspaces), omitted when there are none. It
// returns an error wrapping ErrInvalid if the buckets are not sorted
// and distinct with tokens >= 1.
func EncodeReleases(r shard.Releases) ([]byte, error) {
	if e := validatePairs("buckets", r.Buckets); e != nil {
		return nil, e.invalid("releases")
	}
	return marshal(releasesOut{Buckets: pairsOut(r.Buckets), Positions: positionsOut(r.Buckets)})
}

// DecodeReleases decodes the value stored at key. Errors wrap ErrCorrupt.
func DecodeReleases(key string, data []byte) (shard.Releases, error) {
	var w releasesIn
	if err := decodeStrict(key, data, releasesFields, &w); err != nil {
		return shard.Releases{}, err
	}
	pairs, err := pairsIn(key, "buckets", w.Buckets)
	if err != nil {
		return shard.Releases{}, err
	}
	if e := validatePairs("buckets", pairs); e != nil {
		return shard.Releases{}, e.corrupt(key)
	}
	if err := positionsIn(key, "positions", w.Positions, pairs); err != nil {
		return shard.Releases{}, err
	}
	r := shard.Releases{Buckets: pairs}
	if e := validatePairs("buckets", r.Buckets); e != nil {
		return shard.Releases{}, e.corrupt(key)
	}
	return r, nil
}

// EncodeQuarantine returns the stored form of q, stored at
// quarantine/<ks>/<id> by the leader before it revokes member id's
// session: {"session":L,"buckets":[b,...]}. It returns an error wrapping
// ErrInvalid if q has no session or its buckets are not sorted, distinct
// and in range.
func EncodeQuarantine(q shard.Quarantine) ([]byte, error) {
	if e := validateQuarantine(q); e != nil {
		return nil, e.invalid("quarantine")
	}
	buckets := q.Buckets
	if buckets == nil {
		buckets = []int{}
	}
	return marshal(quarantineOut{Session: int64(q.Session), Buckets: buckets})
}

// DecodeQuarantine decodes the value stored at key. Errors wrap ErrCorrupt.
func DecodeQuarantine(key string, data []byte) (shard.Quarantine, error) {
	var w quarantineIn
	if err := decodeStrict(key, data, quarantineFields, &w); err != nil {
		return shard.Quarantine{}, err
	}
	q := shard.Quarantine{Session: shard.LeaseID(w.Session)}
	for i, raw := range w.Buckets {
		b, err := parseUint(raw)
		if err != nil {
			return shard.Quarantine{}, corruptf(key, "buckets", "entry %d: %v", i, err)
		}
		if b >= placement.MaxBuckets {
			return shard.Quarantine{}, corruptf(key, "buckets", "entry %d: bucket %d is outside [0, %d)", i, b, placement.MaxBuckets)
		}
		q.Buckets = append(q.Buckets, int(b))
	}
	if e := validateQuarantine(q); e != nil {
		return shard.Quarantine{}, e.corrupt(key)
	}
	return q, nil
}

// EncodeTokens returns the stored form of the token counter: decimal.
func EncodeTokens(last uint64) []byte { return strconv.AppendUint(nil, last, 10) }

// DecodeTokens decodes the token counter stored at key: a decimal without
// sign, spaces or leading zeros. Errors wrap ErrCorrupt.
func DecodeTokens(key string, data []byte) (uint64, error) {
	s := string(data)
	if s == "" || (len(s) > 1 && s[0] == '0') {
		return 0, corruptf(key, "", "%.24q is not a canonical decimal", s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, corruptf(key, "", "%.24q is not a canonical decimal", s)
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, corruptf(key, "", "%.24q: %v", s, err)
	}
	return n, nil
}

// Decode decodes the value stored at key according to the key's kind and
// returns the typed value: a shard.Keyspace, Member, Drain, Map, Grants,
// Releases, Quarantine, Commit (positions), BucketPositions (bucketpos) or
// Held (held),
// Reservation (reserved),
// a uint64 (tokens), or a HotPool, hotkey.Report or hotkey.OverflowSet. Leader keys decode to their value as a string (the
// leader's id). Errors wrap ErrCorrupt.
func Decode(key string, data []byte) (Kind, any, error) {
	kind, _, _, err := ParseKey(key)
	if err != nil {
		return KindUnknown, nil, err
	}
	var v any
	switch kind {
	case KindKeyspace:
		v, err = DecodeKeyspace(key, data)
	case KindMember:
		v, err = DecodeMember(key, data)
	case KindDrain:
		v, err = DecodeDrain(key, data)
	case KindMap:
		v, err = DecodeMap(key, data)
	case KindGrants:
		v, err = DecodeGrants(key, data)
	case KindReleases:
		v, err = DecodeReleases(key, data)
	case KindTokens:
		v, err = DecodeTokens(key, data)
	case KindQuarantine:
		v, err = DecodeQuarantine(key, data)
	case KindHotPool:
		v, err = DecodeHotPool(key, data)
	case KindHotReport:
		v, err = DecodeHotReport(key, data)
	case KindOverflow:
		v, err = DecodeOverflow(key, data)
	case KindPositions:
		v, err = DecodeCommit(key, data)
	case KindBucketPos:
		v, err = DecodeBucketPositions(key, data)
	case KindHeld:
		v, err = DecodeHeld(key, data)
	case KindReserved:
		v, err = DecodeReservation(key, data)
	case KindTenantPool:
		v, err = DecodeTenantPool(key, data)
	case KindTenantMember:
		v, err = DecodeTenantMember(key, data)
	case KindTenantState:
		_, _, id, _ := ParseKey(key)
		if chunk, _ := parseTenantStateID(id); chunk < 0 {
			v, err = DecodeTenantMeta(key, data)
		} else {
			v, err = DecodeTenantChunk(key, data)
		}
	case KindLeader, KindReplica:
		v = string(data)
	}
	if err != nil {
		return kind, nil, err
	}
	return kind, v, nil
}

// Limits on the hot-key values: a key, a report and an overflow set.
const (
	MaxHotKeyLen    = 512  // bytes of one key
	MaxReportKeys   = 1024 // keys in one producer's report
	MaxOverflowKeys = 2048 // keys in one overflow set; HotPool.MaxKeys is at most this
	// MinReportMaxAge and MaxHotPoolDuration bound HotPool.ReportMaxAge
	// (producers report about every second, so a shorter age would drop
	// reports that are merely late) and HotPool.Cooldown.
	MinReportMaxAge    = 2 * time.Second
	MaxHotPoolDuration = 24 * time.Hour
)

// HotPool is the configuration stored at hotpools/<pool>: a group of
// producers whose heavy hitters the leader sums into one overflow set.
// Rates are messages per second. Every field is explicit here: the API
// fills in the defaults before storing.
//
// JSON: {"name","threshold","low_threshold","cooldown_ms","report_threshold","report_max_age_ms","max_keys"}.
type HotPool struct {
	Name string
	// Threshold is the summed rate at which a key enters the set: finite,
	// > 0.
	Threshold float64
	// LowThreshold is the summed rate below which a key in the set starts
	// cooling down: finite, in (0, Threshold].
	LowThreshold float64
	// Cooldown is how long a key must stay below LowThreshold before it
	// leaves: whole milliseconds, in (0, MaxHotPoolDuration].
	Cooldown time.Duration
	// ReportThreshold is the local rate from which a producer reports a
	// key: finite, in (0, Threshold].
	ReportThreshold float64
	// ReportMaxAge is how long a report counts: whole milliseconds, in
	// [MinReportMaxAge, MaxHotPoolDuration].
	ReportMaxAge time.Duration
	// MaxKeys caps the set: 1 to MaxOverflowKeys.
	MaxKeys int
}

// Hot-key reports and overflow sets are hotkey's records (hotkey.Report,
// hotkey.KeyRate, hotkey.OverflowSet, hotkey.OverflowEntry): the leader's
// aggregation reads and writes them as they are stored.
//
// A report is one producer's latest heavy hitters, stored at
// hotreports/<pool>/<producer> without a lease; each report replaces the
// producer's previous one, and the leader deletes reports older than twice
// the pool's ReportMaxAge. Its producer must match the key, At (when the
// replica that received it stored it) must be set, and Keys are sorted by
// key, without duplicates, at most MaxReportKeys, each 1 to MaxHotKeyLen
// bytes of UTF-8 with a finite rate >= 0.
// JSON: {"producer","at","keys":[{"key","rate"},...]}.
//
// An overflow set is a pool's cluster-wide set, stored at overflow/<pool>
// by the leader only (a fenced Commit). Version rises by one whenever the
// keys change; a set that has ever had keys has a version >= 1. Entries
// are sorted by key, without duplicates, at most MaxOverflowKeys, each
// with a Since that is set.
// JSON: {"version":N,"entries":[{"key","rate","since","below_since"},...]};
// below_since is omitted while the key is above the low threshold.

// Validate checks p as PutHotPool and EncodeHotPool do. The error wraps
// ErrInvalid and names the field.
func (p HotPool) Validate() error {
	if e := p.validate(); e != nil {
		return e.invalid("hot-key pool")
	}
	return nil
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func (p HotPool) validate() *fieldError {
	if e := checkName("name", KindHotPool, p.Name); e != nil {
		return e
	}
	if !finite(p.Threshold) || p.Threshold <= 0 {
		return ferr("threshold", "%v is not a finite number > 0", p.Threshold)
	}
	if !finite(p.LowThreshold) || p.LowThreshold <= 0 || p.LowThreshold > p.Threshold {
		return ferr("low_threshold", "%v is outside (0, threshold %v]", p.LowThreshold, p.Threshold)
	}
	if p.Cooldown <= 0 || p.Cooldown > MaxHotPoolDuration || p.Cooldown%time.Millisecond != 0 {
		return ferr("cooldown_ms", "%v is not a whole number of milliseconds in (0, %v]", p.Cooldown, MaxHotPoolDuration)
	}
	if !finite(p.ReportThreshold) || p.ReportThreshold <= 0 || p.ReportThreshold > p.Threshold {
		return ferr("report_threshold", "%v is outside (0, threshold %v]", p.ReportThreshold, p.Threshold)
	}
	if p.ReportMaxAge < MinReportMaxAge || p.ReportMaxAge > MaxHotPoolDuration || p.ReportMaxAge%time.Millisecond != 0 {
		return ferr("report_max_age_ms", "%v is not a whole number of milliseconds in [%v, %v]", p.ReportMaxAge, MinReportMaxAge, MaxHotPoolDuration)
	}
	if p.MaxKeys < 1 || p.MaxKeys > MaxOverflowKeys {
		return ferr("max_keys", "%d is outside [1, %d]", p.MaxKeys, MaxOverflowKeys)
	}
	return nil
}

// checkHotKey checks entry i's key and rate, and that it sorts after the
// previous entry's key prev.
func checkHotKey(field string, i int, key string, rate float64, prev string) *fieldError {
	if len(key) < 1 || len(key) > MaxHotKeyLen {
		return ferr(field, "entry %d: key is %d bytes long; want 1 to %d", i, len(key), MaxHotKeyLen)
	}
	if !utf8.ValidString(key) {
		return ferr(field, "entry %d: key is not valid UTF-8", i)
	}
	if !finite(rate) || rate < 0 {
		return ferr(field, "entry %d: key %.40q has rate %v; want a finite number >= 0", i, key, rate)
	}
	if i > 0 && prev >= key {
		if prev == key {
			return ferr(field, "entry %d: key %.40q appears twice", i, key)
		}
		return ferr(field, "entry %d: key %.40q follows %.40q; want ascending order", i, key, prev)
	}
	return nil
}

// ValidateHotReport checks r as PutHotReport and EncodeHotReport do.
func ValidateHotReport(r hotkey.Report) error {
	if e := validateHotReport(r); e != nil {
		return e.invalid("hot-key report")
	}
	return nil
}

func validateHotReport(r hotkey.Report) *fieldError {
	if e := checkName("producer", KindHotReport, r.Producer); e != nil {
		return e
	}
	if e := checkTime("at", r.At); e != nil {
		return e
	}
	if len(r.Keys) > MaxReportKeys {
		return ferr("keys", "%d keys; the limit is %d", len(r.Keys), MaxReportKeys)
	}
	for i, kr := range r.Keys {
		prev := ""
		if i > 0 {
			prev = r.Keys[i-1].Key
		}
		if e := checkHotKey("keys", i, kr.Key, kr.Rate, prev); e != nil {
			return e
		}
	}
	return nil
}

// SortKeyRates sorts keys by key in place, as hotkey.Report requires.
func SortKeyRates(keys []hotkey.KeyRate) {
	slices.SortFunc(keys, func(a, b hotkey.KeyRate) int { return strings.Compare(a.Key, b.Key) })
}

// ValidateOverflowSet checks s as EncodeOverflow does.
func ValidateOverflowSet(s hotkey.OverflowSet) error {
	if e := validateOverflowSet(s); e != nil {
		return e.invalid("overflow set")
	}
	return nil
}

func validateOverflowSet(s hotkey.OverflowSet) *fieldError {
	if len(s.Entries) > MaxOverflowKeys {
		return ferr("entries", "%d entries; the limit is %d", len(s.Entries), MaxOverflowKeys)
	}
	if s.Version == 0 && len(s.Entries) > 0 {
		return ferr("version", "0 with %d entries; a set with keys has a version >= 1", len(s.Entries))
	}
	for i, e := range s.Entries {
		prev := ""
		if i > 0 {
			prev = s.Entries[i-1].Key
		}
		if fe := checkHotKey("entries", i, e.Key, e.Rate, prev); fe != nil {
			return fe
		}
		if fe := checkTime("since", e.Since); fe != nil {
			return ferr("entries", "entry %d: since: %s", i, fe.reason)
		}
		if !e.BelowSince.IsZero() {
			if fe := checkTime("below_since", e.BelowSince); fe != nil {
				return ferr("entries", "entry %d: below_since: %s", i, fe.reason)
			}
		}
	}
	return nil
}

type hotPoolJSON struct {
	Name            string  `json:"name"`
	Threshold       float64 `json:"threshold"`
	LowThreshold    float64 `json:"low_threshold"`
	CooldownMs      int64   `json:"cooldown_ms"`
	ReportThreshold float64 `json:"report_threshold"`
	ReportMaxAgeMs  int64   `json:"report_max_age_ms"`
	MaxKeys         int     `json:"max_keys"`
}

var hotPoolFields = []string{"name", "threshold", "low_threshold", "cooldown_ms", "report_threshold", "report_max_age_ms", "max_keys"}

type keyRateJSON struct {
	Key  string  `json:"key"`
	Rate float64 `json:"rate"`
}

var keyRateFields = []string{"key", "rate"}

type hotReportOut struct {
	Producer string        `json:"producer"`
	At       string        `json:"at"` // RFC 3339 with nanoseconds
	Keys     []keyRateJSON `json:"keys"`
}

type hotReportIn struct {
	Producer string            `json:"producer"`
	At       string            `json:"at"`
	Keys     []json.RawMessage `json:"keys"`
}

var hotReportFields = []string{"producer", "at", "keys"}

type overflowEntryJSON struct {
	Key        string  `json:"key"`
	Rate       float64 `json:"rate"`
	Since      string  `json:"since"`
	BelowSince string  `json:"below_since,omitempty"`
}

var overflowEntryFields = []string{"key", "rate", "since", "below_since"}

type overflowOut struct {
	Version uint64              `json:"version"`
	Entries []overflowEntryJSON `json:"entries"`
}

type overflowIn struct {
	Version uint64            `json:"version"`
	Entries []json.RawMessage `json:"entries"`
}

var overflowFields = []string{"version", "entries"}

// decodeEntry decodes element i of the array in field as decodeStrict
// does; a failure names field, the element and its own field.
func decodeEntry(key, field string, i int, raw json.RawMessage, fields []string, v any) error {
	err := decodeStrict(key, raw, fields, v)
	var ce *CorruptError
	if errors.As(err, &ce) {
		if ce.Field != "" {
			return corruptf(key, field, "entry %d: %s: %s", i, ce.Field, ce.Reason)
		}
		return corruptf(key, field, "entry %d: %s", i, ce.Reason)
	}
	return err
}

// EncodeHotPool returns the stored form of p. It returns an error wrapping
// ErrInvalid if p does not validate.
func EncodeHotPool(p HotPool) ([]byte, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return marshal(hotPoolJSON{
		Name:            p.Name,
		Threshold:       p.Threshold,
		LowThreshold:    p.LowThreshold,
		CooldownMs:      p.Cooldown.Milliseconds(),
		ReportThreshold: p.ReportThreshold,
		ReportMaxAgeMs:  p.ReportMaxAge.Milliseconds(),
		MaxKeys:         p.MaxKeys,
	})
}

// DecodeHotPool decodes the value stored at key; the name must match the
// key's when key is a pool key. Errors wrap ErrCorrupt and name key and
// field.
func DecodeHotPool(key string, data []byte) (HotPool, error) {
	var w hotPoolJSON
	if err := decodeStrict(key, data, hotPoolFields, &w); err != nil {
		return HotPool{}, err
	}
	const maxMs = math.MaxInt64 / int64(time.Millisecond)
	if w.CooldownMs < 0 || w.CooldownMs > maxMs {
		return HotPool{}, corruptf(key, "cooldown_ms", "%d is out of range", w.CooldownMs)
	}
	if w.ReportMaxAgeMs < 0 || w.ReportMaxAgeMs > maxMs {
		return HotPool{}, corruptf(key, "report_max_age_ms", "%d is out of range", w.ReportMaxAgeMs)
	}
	p := HotPool{
		Name:            w.Name,
		Threshold:       w.Threshold,
		LowThreshold:    w.LowThreshold,
		Cooldown:        time.Duration(w.CooldownMs) * time.Millisecond,
		ReportThreshold: w.ReportThreshold,
		ReportMaxAge:    time.Duration(w.ReportMaxAgeMs) * time.Millisecond,
		MaxKeys:         w.MaxKeys,
	}
	if e := p.validate(); e != nil {
		return HotPool{}, e.corrupt(key)
	}
	if kind, pool, _, err := ParseKey(key); err == nil && kind == KindHotPool && pool != p.Name {
		return HotPool{}, corruptf(key, "name", "%q does not match the key", p.Name)
	}
	return p, nil
}

// EncodeHotReport returns the stored form of r.
func EncodeHotReport(r hotkey.Report) ([]byte, error) {
	if err := ValidateHotReport(r); err != nil {
		return nil, err
	}
	keys := make([]keyRateJSON, len(r.Keys))
	for i, kr := range r.Keys {
		keys[i] = keyRateJSON(kr)
	}
	return marshal(hotReportOut{Producer: r.Producer, At: formatTime(r.At), Keys: keys})
}

// DecodeHotReport decodes the value stored at key; the producer must match
// the key's when key is a report key. Errors wrap ErrCorrupt.
func DecodeHotReport(key string, data []byte) (hotkey.Report, error) {
	var w hotReportIn
	if err := decodeStrict(key, data, hotReportFields, &w); err != nil {
		return hotkey.Report{}, err
	}
	at, err := parseTime(key, "at", w.At)
	if err != nil {
		return hotkey.Report{}, err
	}
	if len(w.Keys) > MaxReportKeys {
		return hotkey.Report{}, corruptf(key, "keys", "%d keys; the limit is %d", len(w.Keys), MaxReportKeys)
	}
	r := hotkey.Report{Producer: w.Producer, At: at}
	for i, raw := range w.Keys {
		var kr keyRateJSON
		if err := decodeEntry(key, "keys", i, raw, keyRateFields, &kr); err != nil {
			return hotkey.Report{}, err
		}
		r.Keys = append(r.Keys, hotkey.KeyRate(kr))
	}
	if e := validateHotReport(r); e != nil {
		return hotkey.Report{}, e.corrupt(key)
	}
	if kind, _, id, err := ParseKey(key); err == nil && kind == KindHotReport && id != r.Producer {
		return hotkey.Report{}, corruptf(key, "producer", "%q does not match the key", r.Producer)
	}
	return r, nil
}

// EncodeOverflow returns the stored form of s.
func EncodeOverflow(s hotkey.OverflowSet) ([]byte, error) {
	if err := ValidateOverflowSet(s); err != nil {
		return nil, err
	}
	entries := make([]overflowEntryJSON, len(s.Entries))
	for i, e := range s.Entries {
		entries[i] = overflowEntryJSON{Key: e.Key, Rate: e.Rate, Since: formatTime(e.Since)}
		if !e.BelowSince.IsZero() {
			entries[i].BelowSince = formatTime(e.BelowSince)
		}
	}
	return marshal(overflowOut{Version: s.Version, Entries: entries})
}

// DecodeOverflow decodes the value stored at key. Errors wrap ErrCorrupt.
func DecodeOverflow(key string, data []byte) (hotkey.OverflowSet, error) {
	var w overflowIn
	if err := decodeStrict(key, data, overflowFields, &w); err != nil {
		return hotkey.OverflowSet{}, err
	}
	if len(w.Entries) > MaxOverflowKeys {
		return hotkey.OverflowSet{}, corruptf(key, "entries", "%d entries; the limit is %d", len(w.Entries), MaxOverflowKeys)
	}
	s := hotkey.OverflowSet{Version: w.Version}
	for i, raw := range w.Entries {
		var ej overflowEntryJSON
		if err := decodeEntry(key, "entries", i, raw, overflowEntryFields, &ej); err != nil {
			return hotkey.OverflowSet{}, err
		}
		e := hotkey.OverflowEntry{Key: ej.Key, Rate: ej.Rate}
		var err error
		if e.Since, err = parseTime(key, "entries", ej.Since); err != nil {
			return hotkey.OverflowSet{}, corruptf(key, "entries", "entry %d: since: %.40q is not an RFC 3339 time", i, ej.Since)
		}
		if e.BelowSince, err = parseTime(key, "entries", ej.BelowSince); err != nil {
			return hotkey.OverflowSet{}, corruptf(key, "entries", "entry %d: below_since: %.40q is not an RFC 3339 time", i, ej.BelowSince)
		}
		s.Entries = append(s.Entries, e)
	}
	if e := validateOverflowSet(s); e != nil {
		return hotkey.OverflowSet{}, e.corrupt(key)
	}
	return s, nil
}
