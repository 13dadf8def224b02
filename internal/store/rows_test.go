package store

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/placement"
)

// plainCase is one record shape decodeStrict serves: its fields and a
// fresh value to decode into.
type plainCase struct {
	name   string
	fields []string
	fresh  func() any
}

var plainCases = []plainCase{
	{"keyspace", keyspaceFields, func() any { return new(keyspaceJSON) }},
	{"member", memberFields, func() any { return new(memberJSON) }},
	{"drain", drainFields, func() any { return new(drainJSON) }},
	{"map", mapFields, func() any { return new(mapJSON) }},
	{"grants", grantsFields, func() any { return new(grantsIn) }},
	{"releases", releasesFields, func() any { return new(releasesIn) }},
	{"quarantine", quarantineFields, func() any { return new(quarantineIn) }},
	{"held", heldFields, func() any { return new(heldIn) }},
	{"commit", commitFields, func() any { return new(commitIn) }},
	{"bucket positions", bucketPosFields, func() any { return new(bucketPosIn) }},
	{"hot pool", hotPoolFields, func() any { return new(hotPoolJSON) }},
	{"hot report", hotReportFields, func() any { return new(hotReportIn) }},
	{"overflow", overflowFields, func() any { return new(overflowIn) }},
	{"reservation", reservationFields, func() any { return new(reservationJSON) }},
}

// plainSeeds are records the one-pass path must take or refuse exactly as
// the token stream judges them.
var plainSeeds = []string{
	must(EncodeGrants(sampleGrants)), must(EncodeReleases(sampleRel)), must(EncodeMap(sampleMap)),
	must(EncodeKeyspace(sampleKeyspace)), must(EncodeMember(sampleMember)), must(EncodeDrain(sampleDrain)),
	must(EncodeCommit(sampleCommit)), must(EncodeBucketPositions(1, samplePositions)),
	must(EncodeHeld(shard.Held{Session: 7, Buckets: []shard.BucketToken{{Bucket: 1, Token: 3}, {Bucket: 4, Token: 3}, {Bucket: 9, Token: 5}}})),
	`{"session":5,"buckets":[[2,3],[4,3]],"from":[[2,70]]}`,
	` { "session" : 5 , "buckets" : [ [ 2 , 3 ] , [4,3] ] } `,
	`{"session":5,"buckets":[[2,3]],"session":5}`, // repeated
	`{"session":5,"Buckets":[[2,3]]}`,             // case only
	`{"sess\u0069on":5,"buckets":[[2,3]]}`,        // escaped key
	`{"session":5,"buckets":[[2,3]],"other":1}`,   // unknown
	`{"session":5,"buckets":[[2,3]]} x`,           // trailing
	`{"session":5,"buckets":[[2,3]]}{}`,           // trailing object
	`{"session":5,"buckets":[[02,3]]}`,            // leading zero
	`{"session":5,"buckets":[[2,-3]]}`,            // sign
	`{"session":5,"buckets":[[2,3.0]]}`,           // fraction
	`{"session":5,"buckets":[[2,3e2]]}`,           // exponent
	`{"session":5,"buckets":[[2,"3"]]}`,           // quoted
	`{"session":5,"buckets":[[2,18446744073709551615]]}`,
	`{"session":5,"buckets":[[2,18446744073709551616]]}`, // overflow
	`{"session":5,"buckets":[[2,3,4]]}`,                  // triple
	`{"session":5,"buckets":[[2]]}`,                      // single
	`{"session":5,"buckets":[null,[1,2]]}`,               // null row
	`{"session":5,"buckets":null}`,
	`{"session":5,"buckets":[]}`,
	`{"session":5,"buckets":[[]]}`,
	`{"session":5,"buckets":[3]}`,      // a row that is a number
	`{"session":5,"buckets":[[2,3],]}`, // trailing comma
	`{"session":5,"buckets":[[2,3]`,    // cut short
	`{"session":5,"buckets":[[2 3]]}`,  // no comma
	`{"session":"5","buckets":[[2,3]]}`,
	`{"session":5 6,"buckets":[[2,3]]}`,
	`{"session":tru,"buckets":[[2,3]]}`,
	`{"held":[[3,1,3],[5,9]],"session":7}`,
	`{"held":[[3,1,"x"]],"session":7}`,
	`{"runs":[[4096,3,7],[4099,1,9]]}`,
	`{"name":"a\"b","buckets":8}`, `{"hash":"xx\u0068","owners":"AAA=","epoch":1}`, `{"owners":"AA` + "\t" + `A="}`,
	`{"name":"a` + "\x01" + `b"}`,
	"{\"by\":\"\u00e9\",\"requested_at\":\"2026-01-02T03:04:05Z\"}",
	`{}`, ` {} `, `{,}`, `[]`, `null`, ``, `"x"`,
}

// checkPlain holds decodePlain to the token stream on data for every
// record shape: it takes data only where the token stream accepts it,
// with the same value, and leaves the value zero where it refuses.
func checkPlain(t *testing.T, data []byte) {
	t.Helper()
	if !utf8.Valid(data) {
		return // decodeStrict refuses it before either path
	}
	for _, c := range plainCases {
		fast, slow := c.fresh(), c.fresh()
		took := decodePlain(data, c.fields, fast)
		err := decodeTokens("k", data, c.fields, slow)
		if !took {
			if !reflect.ValueOf(fast).Elem().IsZero() {
				t.Fatalf("%s: %q: refused but left %+v", c.name, data, fast)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %q: the one-pass path took what the token stream refuses: %v", c.name, data, err)
		}
		if diff := cmp.Diff(slow, fast, cmp.AllowUnexported(uintRows{}), cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("%s: %q: the paths disagree (-tokens +one pass):\n%s", c.name, data, diff)
		}
	}
}

func TestDecodePlainAgreesWithTokens(t *testing.T) {
	for _, s := range plainSeeds {
		checkPlain(t, []byte(s))
	}
}

func FuzzDecodePlain(f *testing.F) {
	for _, s := range plainSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(checkPlain)
}

// TestDecodePlainTakesRecords: what the store writes takes the one-pass
// path (else every watcher pays the token stream again).
func TestDecodePlainTakesRecords(t *testing.T) {
	for _, c := range []struct {
		data string
		c    plainCase
	}{
		{must(EncodeGrants(sampleGrants)), plainCases[4]},
		{`{"session":5,"buckets":[[2,3],[4,3]],"from":[[2,70]]}`, plainCases[4]},
		{must(EncodeReleases(sampleRel)), plainCases[5]},
		{must(EncodeMap(sampleMap)), plainCases[3]},
		{must(EncodeMember(sampleMember)), plainCases[1]},
		{must(EncodeHeld(shard.Held{Session: 7, Buckets: []shard.BucketToken{{Bucket: 1, Token: 3}, {Bucket: 4, Token: 3}}})), plainCases[7]},
		{must(EncodeCommit(sampleCommit)), plainCases[8]},
	} {
		if !decodePlain([]byte(c.data), c.c.fields, c.c.fresh()) {
			t.Errorf("%s: %s takes the token stream", c.c.name, c.data)
		}
	}
}

// TestUintRowsErrors: an element that is not a plain non-negative
// integer is named with its entry, on either path.
func TestUintRowsErrors(t *testing.T) {
	for _, c := range []struct{ data, want string }{
		{`{"session":1,"buckets":[[1,-2]]}`, `field "buckets": entry 0: token: -2 is not a non-negative integer`},
		{`{"session":1,"buckets":[[1,2],["3",4]]}`, `field "buckets": entry 1: bucket: "3" is not a non-negative integer`},
		{`{"session":1,"buckets":[[1,2],[3,18446744073709551616]]}`, `field "buckets": entry 1: token: strconv.ParseUint: parsing "18446744073709551616": value out of range`},
		{`{"session":1,"buckets":[[1,2,3]]}`, `field "buckets": entry 0 has 3 elements; want [bucket, token]`},
		{`{"session":1,"buckets":[null]}`, `field "buckets": entry 0 has 0 elements; want [bucket, token]`},
		{`{"session":1,"buckets":[4]}`, `field "buckets": cannot hold number: want []uint64`},
	} {
		_, err := DecodeGrants("g", []byte(c.data))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error with %q", c.data, err, c.want)
		}
	}
}

// BenchmarkDecodeGrants decodes a member's grants of 128 buckets, as
// every watcher does for each grant round that changes them: one pass,
// and the token stream that judges anything unusual.
func BenchmarkDecodeGrants(b *testing.B) {
	g := shard.Grants{Session: 0x694d7b3c5a1e2f01}
	for i := range 128 {
		g.Buckets = append(g.Buckets, shard.BucketToken{Bucket: i * 2, Token: uint64(1000 + i)})
	}
	data := []byte(must(EncodeGrants(g)))
	b.Run("one-pass", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeGrants("g", data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("tokens", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		b.ReportAllocs()
		for b.Loop() {
			var w grantsIn
			if err := decodeTokens("g", data, grantsFields, &w); err != nil {
				b.Fatal(err)
			}
			if _, err := pairsIn("g", "buckets", w.Buckets); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkDecodeMap decodes a map of 65,536 buckets over 1,000 members,
// as every watcher does at each epoch: its owners are one base64 string
// of 175 KB.
func BenchmarkDecodeMap(b *testing.B) {
	m := shard.Map{Epoch: 7, Hash: placement.HashXXH64}
	for i := range 1000 {
		m.Assignment.Members = append(m.Assignment.Members, fmt.Sprintf("member-%04d", i))
	}
	for i := range 65536 {
		m.Assignment.Owners = append(m.Assignment.Owners, int32(i%1000))
	}
	data := []byte(must(EncodeMap(m)))
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeMap("m", data); err != nil {
			b.Fatal(err)
		}
	}
}
