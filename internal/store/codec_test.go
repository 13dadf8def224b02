package store

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/placement"
)

var (
	testTime = time.Date(2026, 3, 4, 5, 6, 7, 890000000, time.UTC)

	sampleKeyspace = testKeyspace("rooms")
	sampleMember   = shard.Member{
		ID: "w-1", Address: "10.0.0.1:8080", Weight: 1.5, Zone: "eu-1a",
		Metadata: map[string]string{"version": "1.2.3"}, Session: 0x694d7b3c5a1e2f01, JoinedAt: testTime,
	}
	sampleDrain  = shard.Drain{RequestedAt: testTime, By: "admin"}
	sampleMap    = shard.Map{Epoch: 7, Hash: placement.HashXXH64, Assignment: placement.Assignment{Members: []string{"a", "b"}, Owners: []int32{0, 1, placement.Unassigned, 0, 1}}}
	sampleGrants = shard.Grants{Session: 0x694d7b3c5a1e2f01, Buckets: []shard.BucketToken{{Bucket: 0, Token: 1}, {Bucket: 3, Token: 9}, {Bucket: 4, Token: 1<<53 + 1}}}
	sampleRel    = shard.Releases{Buckets: []shard.BucketToken{{Bucket: 1, Token: 2}, {Bucket: 65535, Token: 3}}}
)

func TestCodecRoundTrip(t *testing.T) {
	opts := cmp.Options{cmpopts.EquateEmpty()}
	t.Run("keyspace", func(t *testing.T) {
		for _, k := range []shard.Keyspace{
			sampleKeyspace,
			{Name: "a", Buckets: 1, Hash: placement.HashSynapse, Mode: shard.ModeStream, LeaseTTL: time.Second},
			{Name: strings.Repeat("z", 128), Buckets: placement.MaxBuckets, Hash: placement.HashXXH64, Mode: shard.ModeExclusive, LeaseTTL: 24 * time.Hour, DrainTimeout: 1500 * time.Millisecond},
		} {
			b, err := EncodeKeyspace(k)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeKeyspace(KeyspaceKey(k.Name), b)
			if err != nil {
				t.Fatalf("decode %s: %v", b, err)
			}
			if diff := cmp.Diff(k, got); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
		}
	})
	t.Run("member", func(t *testing.T) {
		for _, m := range []shard.Member{sampleMember, {ID: "x", Session: 1, JoinedAt: testTime.In(time.FixedZone("x", 3600))}, {ID: "y", Session: 9, JoinedAt: testTime, Pending: true, Replaces: 7}, {ID: "z", Session: 9, JoinedAt: testTime, Replaces: 7, ReplacesFenced: true}} {
			b, err := EncodeMember(m)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeMember(MemberKey("ks", m.ID), b)
			if err != nil {
				t.Fatalf("decode %s: %v", b, err)
			}
			if diff := cmp.Diff(m, got, opts); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
		}
	})
	t.Run("member before pending", func(t *testing.T) {
		// A record written before "pending" and "replaces" existed is an
		// active member that replaced nobody.
		got, err := DecodeMember(MemberKey("ks", "x"), []byte(`{"id":"x","address":"","weight":1,"zone":"","session":5,"joined_at":"2026-01-01T00:00:00Z"}`))
		if err != nil || got.Pending || got.Replaces != 0 {
			t.Fatalf("decode: %+v, %v; want active, replacing nobody", got, err)
		}
	})
	t.Run("drain", func(t *testing.T) {
		leave := shard.Drain{RequestedAt: testTime, By: "member", Leave: true}
		for _, d := range []shard.Drain{sampleDrain, leave} {
			b, err := EncodeDrain(d)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeDrain(DrainKey("ks", "w"), b)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(d, got); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
		}
		b, _ := EncodeDrain(sampleDrain)
		if want := `{"requested_at":"2026-03-04T05:06:07.89Z","by":"admin"}`; string(b) != want {
			t.Errorf("wire form %s, want %s", b, want)
		}
	})
	t.Run("quarantine", func(t *testing.T) {
		for _, q := range []shard.Quarantine{{Session: 9, Buckets: []int{0, 5, 65535}}, {Session: 1}} {
			b, err := EncodeQuarantine(q)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeQuarantine(QuarantineKey("ks", "w"), b)
			if err != nil {
				t.Fatalf("decode %s: %v", b, err)
			}
			if diff := cmp.Diff(q, got, opts); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
		}
		b, _ := EncodeQuarantine(shard.Quarantine{Session: 9, Buckets: []int{1, 2}})
		if want := `{"session":9,"buckets":[1,2]}`; string(b) != want {
			t.Errorf("wire form %s, want %s", b, want)
		}
	})
	t.Run("map", func(t *testing.T) {
		for _, m := range []shard.Map{sampleMap, {Epoch: 1, Hash: placement.HashSynapse, Assignment: placement.NewAssignment(3)}} {
			b, err := EncodeMap(m)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeMap(MapKey("ks"), b)
			if err != nil {
				t.Fatalf("decode %s: %v", b, err)
			}
			if diff := cmp.Diff(m, got, opts); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
		}
	})
	t.Run("map wire form", func(t *testing.T) {
		b, err := EncodeMap(sampleMap)
		if err != nil {
			t.Fatal(err)
		}
		// owner indexes 0,1,-1,0,1 are stored as members[i-1] (0:
		// unassigned) in little-endian uint16: 1,2,0,1,2 = 01 00 02 00 00 00 01 00 02 00
		want := `{"epoch":7,"buckets":5,"hash":"xxh64","members":["a","b"],"owners":"AQACAAAAAQACAA=="}`
		if string(b) != want {
			t.Errorf("EncodeMap = %s\nwant        %s", b, want)
		}
	})
	t.Run("grants", func(t *testing.T) {
		for _, g := range []shard.Grants{sampleGrants, {Session: 1}} {
			b, err := EncodeGrants(g)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeGrants(GrantsKey("ks", "w"), b)
			if err != nil {
				t.Fatalf("decode %s: %v", b, err)
			}
			if diff := cmp.Diff(g, got, opts); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
		}
		b, _ := EncodeGrants(shard.Grants{Session: 5, Buckets: []shard.BucketToken{{Bucket: 2, Token: 3}}})
		if want := `{"session":5,"buckets":[[2,3]]}`; string(b) != want {
			t.Errorf("wire form %s, want %s", b, want)
		}
	})
	t.Run("releases", func(t *testing.T) {
		b, err := EncodeReleases(sampleRel)
		if err != nil {
			t.Fatal(err)
		}
		if want := `{"buckets":[[1,2],[65535,3]]}`; string(b) != want {
			t.Errorf("wire form %s, want %s", b, want)
		}
		got, err := DecodeReleases(ReleasesKey("ks", "w"), b)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(sampleRel, got, opts); diff != "" {
			t.Errorf("round trip (-want +got):\n%s", diff)
		}
	})
	t.Run("tokens", func(t *testing.T) {
		for _, n := range []uint64{0, 1, 42, 1<<64 - 1} {
			got, err := DecodeTokens(TokensKey("ks"), EncodeTokens(n))
			if err != nil || got != n {
				t.Errorf("tokens %d: got %d, %v", n, got, err)
			}
		}
	})
}

func TestEncodeRejectsInvalid(t *testing.T) {
	bad := []struct {
		name string
		enc  func() error
	}{
		{"keyspace name", func() error { k := sampleKeyspace; k.Name = "a/b"; _, err := EncodeKeyspace(k); return err }},
		{"keyspace buckets", func() error { k := sampleKeyspace; k.Buckets = 0; _, err := EncodeKeyspace(k); return err }},
		{"keyspace hash", func() error { k := sampleKeyspace; k.Hash = "md5"; _, err := EncodeKeyspace(k); return err }},
		{"keyspace empty hash", func() error { k := sampleKeyspace; k.Hash = ""; _, err := EncodeKeyspace(k); return err }},
		{"keyspace mode", func() error { k := sampleKeyspace; k.Mode = "shared"; _, err := EncodeKeyspace(k); return err }},
		{"keyspace ttl fraction", func() error {
			k := sampleKeyspace
			k.LeaseTTL = 1500 * time.Millisecond
			_, err := EncodeKeyspace(k)
			return err
		}},
		{"keyspace drain negative", func() error { k := sampleKeyspace; k.DrainTimeout = -1; _, err := EncodeKeyspace(k); return err }},
		{"member weight", func() error { m := sampleMember; m.Weight = -1; _, err := EncodeMember(m); return err }},
		{"member session", func() error { m := sampleMember; m.Session = 0; _, err := EncodeMember(m); return err }},
		{"member joined", func() error { m := sampleMember; m.JoinedAt = time.Time{}; _, err := EncodeMember(m); return err }},
		{"member replaces itself", func() error { m := sampleMember; m.Replaces = m.Session; _, err := EncodeMember(m); return err }},
		{"member replaces a fenced nothing", func() error { m := sampleMember; m.ReplacesFenced = true; _, err := EncodeMember(m); return err }},
		{"member metadata key", func() error {
			m := sampleMember
			m.Metadata = map[string]string{"": "x"}
			_, err := EncodeMember(m)
			return err
		}},
		{"drain by", func() error { _, err := EncodeDrain(shard.Drain{RequestedAt: testTime}); return err }},
		{"map epoch", func() error { m := sampleMap; m.Epoch = 0; _, err := EncodeMap(m); return err }},
		{"map owner", func() error {
			m := sampleMap
			m.Assignment.Owners = []int32{0, 1, 2, -1, -1}
			_, err := EncodeMap(m)
			return err
		}},
		{"map no buckets", func() error { m := sampleMap; m.Assignment.Owners = nil; _, err := EncodeMap(m); return err }},
		{"map dup member", func() error {
			m := sampleMap
			m.Assignment.Members = []string{"a", "a"}
			_, err := EncodeMap(m)
			return err
		}},
		{"grants unsorted", func() error {
			_, err := EncodeGrants(shard.Grants{Session: 1, Buckets: []shard.BucketToken{{Bucket: 2, Token: 1}, {Bucket: 1, Token: 1}}})
			return err
		}},
		{"grants dup", func() error {
			_, err := EncodeGrants(shard.Grants{Session: 1, Buckets: []shard.BucketToken{{Bucket: 2, Token: 1}, {Bucket: 2, Token: 2}}})
			return err
		}},
		{"grants token 0", func() error {
			_, err := EncodeGrants(shard.Grants{Session: 1, Buckets: []shard.BucketToken{{Bucket: 2, Token: 0}}})
			return err
		}},
		{"grants no session", func() error { _, err := EncodeGrants(shard.Grants{}); return err }},
		{"quarantine unsorted", func() error {
			_, err := EncodeQuarantine(shard.Quarantine{Session: 1, Buckets: []int{3, 1}})
			return err
		}},
		{"quarantine no session", func() error { _, err := EncodeQuarantine(shard.Quarantine{Buckets: []int{1}}); return err }},
		{"releases range", func() error {
			_, err := EncodeReleases(shard.Releases{Buckets: []shard.BucketToken{{Bucket: 65536, Token: 1}}})
			return err
		}},
	}
	for _, tc := range bad {
		if err := tc.enc(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", tc.name, err)
		}
	}
}

func TestDecodeRejectsCorrupt(t *testing.T) {
	ks, mk, dk, gk, rk, mapk, tk := KeyspaceKey("rooms"), MemberKey("ks", "w-1"), DrainKey("ks", "w"), GrantsKey("ks", "w"), ReleasesKey("ks", "w"), MapKey("ks"), TokensKey("ks")
	qk := QuarantineKey("ks", "w")
	goodKS := `{"name":"rooms","buckets":64,"hash":"xxh64","mode":"exclusive","lease_ttl_ms":5000,"drain_timeout_ms":0}`
	goodMember := `{"id":"w-1","address":"","weight":1,"zone":"","session":3,"joined_at":"2026-01-02T03:04:05Z"}`
	cases := []struct {
		name, key, val, field string
		dec                   func(key string, b []byte) error
	}{
		{"keyspace unknown field", ks, strings.Replace(goodKS, `"name"`, `"nam"`, 1), "nam", decKS},
		{"keyspace field case", ks, strings.Replace(goodKS, `"name"`, `"Name"`, 1), "Name", decKS},
		{"keyspace dup field", ks, strings.Replace(goodKS, `}`, `,"buckets":3}`, 1), "buckets", decKS},
		{"keyspace name mismatch", KeyspaceKey("other"), goodKS, "name", decKS},
		{"keyspace buckets type", ks, strings.Replace(goodKS, `64`, `"64"`, 1), "buckets", decKS},
		{"keyspace buckets range", ks, strings.Replace(goodKS, `64`, `65537`, 1), "buckets", decKS},
		{"keyspace float", ks, strings.Replace(goodKS, `64`, `6.4`, 1), "buckets", decKS},
		{"keyspace ttl", ks, strings.Replace(goodKS, `5000`, `-5`, 1), "lease_ttl_ms", decKS},
		{"keyspace hash", ks, strings.Replace(goodKS, `xxh64`, `crc`, 1), "hash", decKS},
		{"keyspace trailing", ks, goodKS + `{}`, "", decKS},
		{"keyspace array", ks, `[1]`, "", decKS},
		{"keyspace null", ks, `null`, "", decKS},
		{"keyspace empty", ks, ``, "", decKS},
		{"keyspace bad utf8", ks, strings.Replace(goodKS, `rooms`, "ro\xffms", 1), "", decKS},
		{"member id mismatch", MemberKey("ks", "w-2"), goodMember, "id", decMember},
		{"member weight", mk, strings.Replace(goodMember, `"weight":1`, `"weight":-1`, 1), "weight", decMember},
		{"member session", mk, strings.Replace(goodMember, `"session":3`, `"session":0`, 1), "session", decMember},
		{"member joined_at", mk, strings.Replace(goodMember, `2026-01-02T03:04:05Z`, `yesterday`, 1), "joined_at", decMember},
		{"member no joined_at", mk, strings.Replace(goodMember, `,"joined_at":"2026-01-02T03:04:05Z"`, ``, 1), "joined_at", decMember},
		{"member bad id", MemberKey("ks", "w-1"), strings.Replace(goodMember, `"w-1"`, `"w 1"`, 1), "id", decMember},
		{"drain by empty", dk, `{"requested_at":"2026-01-02T03:04:05Z","by":""}`, "by", decDrain},
		{"drain extra", dk, `{"requested_at":"2026-01-02T03:04:05Z","by":"x","why":"y"}`, "why", decDrain},
		{"map owners base64", mapk, `{"epoch":1,"buckets":1,"hash":"xxh64","members":[],"owners":"!!"}`, "owners", decMap},
		{"map owners non-strict base64", mapk, `{"epoch":1,"buckets":1,"hash":"xxh64","members":[],"owners":"AAB="}`, "owners", decMap},
		{"map owners odd", mapk, `{"epoch":1,"buckets":1,"hash":"xxh64","members":[],"owners":"AAAA"}`, "owners", decMap},
		{"map owners count", mapk, `{"epoch":1,"buckets":1,"hash":"xxh64","members":[],"owners":"AAAAAA=="}`, "owners", decMap},
		{"map owner index", mapk, `{"epoch":1,"buckets":1,"hash":"xxh64","members":["a"],"owners":"AgA="}`, "owners", decMap},
		{"map epoch 0", mapk, `{"epoch":0,"buckets":1,"hash":"xxh64","members":[],"owners":"AAA="}`, "epoch", decMap},
		{"map hash", mapk, `{"epoch":1,"buckets":1,"hash":"","members":[],"owners":"AAA="}`, "hash", decMap},
		{"map member dup", mapk, `{"epoch":1,"buckets":1,"hash":"xxh64","members":["a","a"],"owners":"AAA="}`, "members", decMap},
		{"grants unsorted", gk, `{"session":1,"buckets":[[2,1],[1,1]]}`, "buckets", decGrants},
		{"grants duplicate", gk, `{"session":1,"buckets":[[2,1],[2,1]]}`, "buckets", decGrants},
		{"grants range", gk, `{"session":1,"buckets":[[65536,1]]}`, "buckets", decGrants},
		{"grants negative", gk, `{"session":1,"buckets":[[-1,1]]}`, "buckets", decGrants},
		{"grants triple", gk, `{"session":1,"buckets":[[1,1,1]]}`, "buckets", decGrants},
		{"grants single", gk, `{"session":1,"buckets":[[1]]}`, "buckets", decGrants},
		{"grants quoted", gk, `{"session":1,"buckets":[["1",1]]}`, "buckets", decGrants},
		{"grants fraction", gk, `{"session":1,"buckets":[[1,1.5]]}`, "buckets", decGrants},
		{"grants exponent", gk, `{"session":1,"buckets":[[1,1e3]]}`, "buckets", decGrants},
		{"grants token 0", gk, `{"session":1,"buckets":[[1,0]]}`, "buckets", decGrants},
		{"grants token overflow", gk, `{"session":1,"buckets":[[1,18446744073709551616]]}`, "buckets", decGrants},
		{"grants no session", gk, `{"buckets":[]}`, "session", decGrants},
		{"grants pair object", gk, `{"session":1,"buckets":[{"b":1}]}`, "buckets", decGrants},
		{"releases unsorted", rk, `{"buckets":[[3,1],[1,1]]}`, "buckets", decReleases},
		{"releases session", rk, `{"session":1,"buckets":[]}`, "session", decReleases},
		{"drain leave type", dk, `{"requested_at":"2026-01-02T03:04:05Z","by":"x","leave":1}`, "leave", decDrain},
		{"quarantine dup", qk, `{"session":1,"buckets":[1,1]}`, "buckets", decQuarantine},
		{"quarantine range", qk, `{"session":1,"buckets":[65536]}`, "buckets", decQuarantine},
		{"quarantine pair", qk, `{"session":1,"buckets":[[1,2]]}`, "buckets", decQuarantine},
		{"quarantine no session", qk, `{"buckets":[1]}`, "session", decQuarantine},
		{"tokens sign", tk, `+1`, "", decTokens},
		{"tokens leading zero", tk, `01`, "", decTokens},
		{"tokens space", tk, `1 `, "", decTokens},
		{"tokens empty", tk, ``, "", decTokens},
		{"tokens overflow", tk, `18446744073709551616`, "", decTokens},
	}
	for _, tc := range cases {
		err := tc.dec(tc.key, []byte(tc.val))
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: got %v, want ErrCorrupt", tc.name, err)
			continue
		}
		var ce *CorruptError
		if !errors.As(err, &ce) {
			t.Errorf("%s: %v is not a *CorruptError", tc.name, err)
			continue
		}
		if ce.Key != tc.key || ce.Field != tc.field {
			t.Errorf("%s: error names key %q field %q, want %q %q (%v)", tc.name, ce.Key, ce.Field, tc.key, tc.field, err)
		}
		if !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%s: %q does not name the key", tc.name, err)
		}
	}
}

func decKS(k string, b []byte) error       { _, err := DecodeKeyspace(k, b); return err }
func decMember(k string, b []byte) error   { _, err := DecodeMember(k, b); return err }
func decDrain(k string, b []byte) error    { _, err := DecodeDrain(k, b); return err }
func decMap(k string, b []byte) error      { _, err := DecodeMap(k, b); return err }
func decGrants(k string, b []byte) error   { _, err := DecodeGrants(k, b); return err }
func decReleases(k string, b []byte) error { _, err := DecodeReleases(k, b); return err }
func decQuarantine(k string, b []byte) error {
	_, err := DecodeQuarantine(k, b)
	return err
}
func decTokens(k string, b []byte) error { _, err := DecodeTokens(k, b); return err }

// TestMapOwners: a map's assignment is stored as one uint16 per bucket,
// the owner's index + 1 (0: unassigned), and reads back as it was; an
// assignment that is not a valid map does not encode.
func TestMapOwners(t *testing.T) {
	a := placement.Assignment{Members: []string{"a", "b", "c"}, Owners: []int32{0, 2, placement.Unassigned, 1, 1}}
	b, err := EncodeMap(shard.Map{Epoch: 3, Hash: placement.HashXXH64, Assignment: a})
	if err != nil {
		t.Fatal(err)
	}
	var w mapJSON
	if err := json.Unmarshal(b, &w); err != nil {
		t.Fatal(err)
	}
	raw, err := base64.StdEncoding.DecodeString(w.Owners)
	if err != nil {
		t.Fatal(err)
	}
	if want := []byte{1, 0, 3, 0, 0, 0, 2, 0, 2, 0}; !cmp.Equal(raw, want) {
		t.Errorf("stored owners %v, want %v", raw, want)
	}
	m, err := DecodeMap(MapKey("ks"), b)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(a, m.Assignment); diff != "" {
		t.Errorf("Assignment (-want +got):\n%s", diff)
	}
	for _, bad := range []placement.Assignment{
		{Members: []string{"a"}, Owners: []int32{1}},
		{Members: []string{"a/b"}, Owners: []int32{0}},
		{Members: []string{"a", "a"}, Owners: []int32{0}},
		{},
	} {
		if _, err := EncodeMap(shard.Map{Epoch: 1, Hash: placement.HashXXH64, Assignment: bad}); !errors.Is(err, ErrInvalid) {
			t.Errorf("EncodeMap of %+v = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"a", "A-z_0.9:x@y", strings.Repeat("x", 128), "!room"[1:]} {
		if err := ValidateName(KindMember, ok); err != nil {
			t.Errorf("ValidateName(%q) = %v", ok, err)
		}
	}
	for _, tc := range []struct {
		kind    Kind
		s, want string
	}{
		{KindKeyspace, "", "keyspace name is empty"},
		{KindMember, strings.Repeat("x", 129), "129 bytes"},
		{KindMember, "a/b", `member id "a/b" has '/' at byte 1`},
		{KindKeyspace, "ü", `keyspace name "ü" has 'ü' at byte 0`},
		{KindMember, "a b", `' ' at byte 1`},
	} {
		err := ValidateName(tc.kind, tc.s)
		if !errors.Is(err, ErrInvalidName) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ValidateName(%q) = %v, want ErrInvalidName mentioning %q", tc.s, err, tc.want)
		}
	}
}

func TestKeys(t *testing.T) {
	for _, tc := range []struct {
		key    string
		kind   Kind
		ks, id string
	}{
		{KeyspaceKey("rooms"), KindKeyspace, "rooms", ""},
		{MemberKey("rooms", "w1"), KindMember, "rooms", "w1"},
		{DrainKey("rooms", "w1"), KindDrain, "rooms", "w1"},
		{MapKey("rooms"), KindMap, "rooms", ""},
		{GrantsKey("rooms", "w1"), KindGrants, "rooms", "w1"},
		{ReleasesKey("rooms", "w1"), KindReleases, "rooms", "w1"},
		{TokensKey("rooms"), KindTokens, "rooms", ""},
		{QuarantineKey("rooms", "w1"), KindQuarantine, "rooms", "w1"},
		{ElectionPrefix + "/694d7b3c5a1e2f01", KindLeader, "", "694d7b3c5a1e2f01"},
	} {
		kind, ks, id, err := ParseKey(tc.key)
		if err != nil || kind != tc.kind || ks != tc.ks || id != tc.id {
			t.Errorf("ParseKey(%q) = %v %q %q %v, want %v %q %q", tc.key, kind, ks, id, err, tc.kind, tc.ks, tc.id)
		}
		if tc.kind != KindLeader {
			if k := Key(tc.kind, tc.ks, tc.id); k != tc.key {
				t.Errorf("Key(%v, %q, %q) = %q, want %q", tc.kind, tc.ks, tc.id, k, tc.key)
			}
		}
	}
	if MemberKey("ks", "a") != "/keyshard/v1/members/ks/a" {
		t.Errorf("MemberKey = %q", MemberKey("ks", "a"))
	}
	for _, bad := range []string{
		"/other/keyspaces/a", Prefix + "keyspaces", Prefix + "keyspaces/", Prefix + "keyspaces/a/b",
		Prefix + "members/ks", Prefix + "members/ks/", Prefix + "members/ks/a/b", Prefix + "widgets/a",
		Prefix + "map/a b", Prefix + "leader/",
	} {
		if _, _, _, err := ParseKey(bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("ParseKey(%q) = %v, want ErrCorrupt", bad, err)
		}
	}
	if _, _, _, err := ParseKey(Prefix + "members/ks/a b"); !errors.Is(err, ErrInvalidName) {
		t.Errorf("ParseKey with a bad id = %v, want ErrInvalidName too", err)
	}
}

// TestWriteChange: a Write's change is what Watch delivers once a Commit
// applies it: decoded, on the write's lease, at the commit's revision; a
// Write that failed to encode gives Commit's error.
func TestWriteChange(t *testing.T) {
	got, err := PutGrants("rooms", "a", sampleGrants).Change(12)
	if err != nil {
		t.Fatal(err)
	}
	want := Change{Kind: KindGrants, Keyspace: "rooms", ID: "a", Key: GrantsKey("rooms", "a"), Value: sampleGrants, Lease: sampleGrants.Session, ModRevision: 12}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("put (-want +got):\n%s", diff)
	}
	got, err = Delete(GrantsKey("rooms", "a")).Change(13)
	if err != nil {
		t.Fatal(err)
	}
	want = Change{Kind: KindGrants, Keyspace: "rooms", ID: "a", Key: GrantsKey("rooms", "a"), ModRevision: 13, Deleted: true}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("delete (-want +got):\n%s", diff)
	}
	if _, err := PutGrants("rooms", "a", shard.Grants{}).Change(14); !errors.Is(err, ErrInvalid) {
		t.Errorf("invalid grants: %v, want ErrInvalid", err)
	}
	if _, err := (Write{}).Change(14); !errors.Is(err, ErrInvalid) {
		t.Errorf("zero Write: %v, want ErrInvalid", err)
	}
}
