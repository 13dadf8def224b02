package store

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/keyshard/keyshard/internal/shard"
)

// fuzzDecoder checks that decode never panics, that every error wraps
// ErrCorrupt, and that whatever decodes re-encodes to a value that decodes
// to the same thing.
func fuzzDecoder[T any](f *testing.F, key string, seeds []string, dec func(string, []byte) (T, error), enc func(T) ([]byte, error)) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := dec(key, data)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Key != key {
				t.Fatalf("error %v does not name key %q", err, key)
			}
			return
		}
		b, err := enc(v)
		if err != nil {
			t.Fatalf("decoded %+v from %q, which does not encode: %v", v, data, err)
		}
		v2, err := dec(key, b)
		if err != nil {
			t.Fatalf("re-encoded %q does not decode: %v", b, err)
		}
		if diff := cmp.Diff(v, v2, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("round trip of %q changed the value (-first +second):\n%s", data, diff)
		}
	})
}

func must(b []byte, err error) string {
	if err != nil {
		panic(err)
	}
	return string(b)
}

func FuzzDecodeKeyspace(f *testing.F) {
	fuzzDecoder(f, KeyspaceKey("rooms"), []string{
		must(EncodeKeyspace(sampleKeyspace)),
		`{"name":"rooms","buckets":4096,"hash":"synapse-sha256","mode":"stream","lease_ttl_ms":1000,"drain_timeout_ms":5}`,
		`{"name":"rooms"}`, `{}`, `null`, `{"name":"rooms","name":"rooms"}`,
	}, DecodeKeyspace, EncodeKeyspace)
}

func FuzzDecodeMember(f *testing.F) {
	fuzzDecoder(f, MemberKey("ks", "w-1"), []string{
		must(EncodeMember(sampleMember)),
		`{"id":"w-1","address":"","weight":0,"zone":"","metadata":{},"session":1,"joined_at":"2026-01-02T03:04:05.5+01:00"}`,
		`{"id":"w-1","weight":1e308,"session":9223372036854775807,"joined_at":"9999-12-31T23:59:59Z"}`,
	}, DecodeMember, EncodeMember)
}

func FuzzDecodeDrain(f *testing.F) {
	fuzzDecoder(f, DrainKey("ks", "w-1"), []string{
		must(EncodeDrain(sampleDrain)),
		`{"requested_at":"2026-01-02T03:04:05Z","by":"\u00e9"}`,
		`{"requested_at":"2026-01-02T03:04:05Z","by":"member","leave":true}`,
	}, DecodeDrain, EncodeDrain)
}

func FuzzDecodeMap(f *testing.F) {
	fuzzDecoder(f, MapKey("ks"), []string{
		must(EncodeMap(sampleMap)),
		`{"epoch":1,"buckets":1,"hash":"xxh64","members":[],"owners":"AAA="}`,
		`{"epoch":1,"buckets":2,"hash":"xxh64","members":null,"owners":"AAAAAA=="}`,
	}, DecodeMap, EncodeMap)
}

func FuzzDecodeGrants(f *testing.F) {
	fuzzDecoder(f, GrantsKey("ks", "w-1"), []string{
		must(EncodeGrants(sampleGrants)),
		`{"session":1,"buckets":[]}`, `{"session":1,"buckets":null}`,
		`{"session":1,"buckets":[[0,1],[65535,18446744073709551615]]}`,
	}, DecodeGrants, EncodeGrants)
}

func FuzzDecodeReleases(f *testing.F) {
	fuzzDecoder(f, ReleasesKey("ks", "w-1"), []string{
		must(EncodeReleases(sampleRel)), `{"buckets":[]}`, `{}`,
	}, DecodeReleases, EncodeReleases)
}

func FuzzDecodeQuarantine(f *testing.F) {
	fuzzDecoder(f, QuarantineKey("ks", "w-1"), []string{
		must(EncodeQuarantine(shard.Quarantine{Session: 3, Buckets: []int{0, 7}})), `{"session":1,"buckets":[]}`, `{"session":1}`,
	}, DecodeQuarantine, EncodeQuarantine)
}

func FuzzDecodeTokens(f *testing.F) {
	fuzzDecoder(f, TokensKey("ks"), []string{"0", "1", "18446744073709551615", "007", "-1"},
		DecodeTokens, func(n uint64) ([]byte, error) { return EncodeTokens(n), nil })
}

func FuzzParseKey(f *testing.F) {
	for _, k := range []string{KeyspaceKey("a"), MemberKey("a", "b"), ElectionPrefix + "/1", Prefix + "x/y", "/", ""} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		kind, ks, id, err := ParseKey(key)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("ParseKey(%q) error %v does not wrap ErrCorrupt", key, err)
			}
			return
		}
		if kind == KindLeader {
			return
		}
		if got := Key(kind, ks, id); got != key {
			t.Fatalf("ParseKey(%q) = %v %q %q, which builds %q", key, kind, ks, id, got)
		}
	})
}

func FuzzDecodeCommit(f *testing.F) {
	fuzzDecoder(f, PositionsKey("ks", "w-1"), []string{
		must(EncodeCommit(shard.Commit{Session: 3, MaxToken: 9, Default: 100, Exceptions: []shard.BucketPosition{{Bucket: 1, Token: 2, Position: 3}}})),
		`{"session":1,"max_token":0,"default":0}`, `{"session":1,"max_token":0,"default":0,"exceptions":[]}`,
		`{"session":1,"max_token":18446744073709551615,"default":18446744073709551615,"exceptions":[[0,1,0],[65535,1,18446744073709551615]]}`,
	}, DecodeCommit, EncodeCommit)
}

func FuzzDecodeBucketPositions(f *testing.F) {
	enc := func(p shard.BucketPositions) ([]byte, error) { return EncodeBucketPositions(1, p) }
	fuzzDecoder(f, BucketPosKey("ks", 1), []string{
		must(enc(shard.BucketPositions{Runs: []shard.PositionRun{{First: 4096, Count: 2, Position: 5}, {First: 4098, Count: 1, Position: 6}}})),
		`{"runs":[]}`, `{"runs":null}`, `{"runs":[[4096,4096,18446744073709551615]]}`,
	}, DecodeBucketPositions, enc)
}

func FuzzDecodeGrantsFrom(f *testing.F) {
	fuzzDecoder(f, GrantsKey("ks", "w-1"), []string{
		`{"session":5,"buckets":[[2,3],[4,3]],"from":[[2,70]]}`, `{"session":1,"buckets":[[0,1]],"from":[]}`,
		`{"session":1,"buckets":[[0,1],[65535,2]],"from":[[0,1],[65535,18446744073709551615]]}`,
	}, DecodeGrants, EncodeGrants)
}

func FuzzDecodeReleasesPositions(f *testing.F) {
	fuzzDecoder(f, ReleasesKey("ks", "w-1"), []string{
		`{"buckets":[[1,2],[9,3]],"positions":[[9,12]]}`, `{"buckets":[],"positions":null}`,
	}, DecodeReleases, EncodeReleases)
}
