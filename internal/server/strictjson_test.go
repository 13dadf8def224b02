package server

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
)

// TestStrictJSON: unknown fields, unknown enum names and malformed values
// are refused, with errors that name the field path and say what it
// accepts; both name styles are accepted.
func TestStrictJSON(t *testing.T) {
	for _, tc := range []struct {
		msg  proto.Message
		body string
		want string // "" means accepted
	}{
		{&v1.CreateKeyspaceRequest{}, `{"keyspace":{"name":"rooms","buckets":16,"leaseTtl":"10s","drain_timeout":"30s","mode":"KEYSPACE_MODE_EXCLUSIVE"}}`, ""},
		{&v1.CreateKeyspaceRequest{}, `{"keyspace":{"name":"rooms","lease_ttl":"1.5s","drainTimeout":null,"mode":1}}`, ""},
		{&v1.CreateKeyspaceRequest{}, `{"keyspace":{"name":"rooms","bucket":16}}`, `keyspace.bucket: unknown field; did you mean "buckets"? (Keyspace has name, buckets, hash, mode, lease_ttl, drain_timeout)`},
		{&v1.CreateKeyspaceRequest{}, `{"keyspace":{"name":"rooms","leaseTTL":"10s"}}`, `keyspace.leaseTTL: unknown field; did you mean "leaseTtl"?`},
		{&v1.CreateKeyspaceRequest{}, `{"keyspace":{"name":"rooms","color":"red"}}`, `keyspace.color: unknown field; Keyspace has name, buckets, hash, mode, lease_ttl, drain_timeout`},
		{&v1.CreateKeyspaceRequest{}, `{"keyspac":{}}`, `keyspac: unknown field; did you mean "keyspace"?`},
		{&v1.CreateKeyspaceRequest{}, `{"keyspace":{"mode":"NOPE"}}`, `keyspace.mode: "NOPE" is not a KeyspaceMode; want one of KEYSPACE_MODE_UNSPECIFIED, KEYSPACE_MODE_EXCLUSIVE, KEYSPACE_MODE_STREAM`},
		{&v1.CreateKeyspaceRequest{}, `{"keyspace":{"mode":"exclusive"}}`, `keyspace.mode: "exclusive" is not a KeyspaceMode (did you mean "KEYSPACE_MODE_EXCLUSIVE"?)`},
		{&v1.CreateKeyspaceRequest{}, `{"keyspace":{"name":"rooms","leaseTtl":"1000h"}}`, `keyspace.lease_ttl: "1000h" is not accepted (1000h is "3600000s"); want a duration in seconds with an "s" suffix, like "10s" or "1.5s"`},
		{&v1.CreateKeyspaceRequest{}, `{"keyspace":{"leaseTtl":"3"}}`, `keyspace.lease_ttl: "3" is not accepted; want a duration in seconds`},
		{&v1.CreateKeyspaceRequest{}, `{"keyspace":{"leaseTtl":5}}`, `keyspace.lease_ttl: 5 is not accepted; want a duration in seconds`},
		{&v1.CreateKeyspaceRequest{}, `{"keyspace":{"drain_timeout":"abc"}}`, `keyspace.drain_timeout: "abc" is not accepted; want a duration`},
		{&v1.CreateKeyspaceRequest{}, `{"keyspace":{"buckets":"many"}}`, `keyspace.buckets: "many" is not accepted; want a whole number from 0 to 4294967295`},
		{&v1.CreateKeyspaceRequest{}, `{"keyspace":{"buckets":-1}}`, `keyspace.buckets: -1 is not accepted`},
		{&v1.CreateKeyspaceRequest{}, `{"keyspace":{"name":7}}`, `keyspace.name: 7 is not accepted; want a JSON string`},
		{&v1.CreateKeyspaceRequest{}, `{"keyspace":"rooms"}`, `keyspace: "rooms" is not a Keyspace; want a JSON object`},
		{&v1.CreateKeyspaceRequest{}, `{"keyspace":{"name":"a","name":"b"}}`, `keyspace.name: set twice`},
		{&v1.CreateKeyspaceRequest{}, `{"keyspace":{"leaseTtl":"1s","lease_ttl":"2s"}}`, `keyspace.lease_ttl: set twice (as "leaseTtl" and "lease_ttl")`},
		{&v1.CreateKeyspaceRequest{}, `[]`, `the body: [] is not a CreateKeyspaceRequest; want a JSON object`},
		{&v1.CreateKeyspaceRequest{}, `{"keyspace":`, `the body is not valid JSON`},
		{&v1.CreateKeyspaceRequest{}, ``, `empty body`},
		{&v1.ListKeyspacesRequest{}, `{"all":true}`, `all: unknown field; ListKeyspacesRequest has no fields: send {}`},
		{&v1.GetGrantsRequest{}, `{"session":"s","wait":"30s","sinceRevision":"12","min_revision":3}`, ""},
		{&v1.GetGrantsRequest{}, `{"session":"s","sinceRevision":"twelve"}`, `since_revision: "twelve" is not accepted; want a whole number >= 0`},
		{&v1.ReleaseRequest{}, `{"session":"s","buckets":[{"bucket":1,"token":"2"},{"bucket":2,"tokn":"3"}]}`, `buckets[1].tokn: unknown field; did you mean "token"?`},
		{&v1.ReleaseRequest{}, `{"session":"s","buckets":[null]}`, `buckets[0]: null in a list`},
		{&v1.ReleaseRequest{}, `{"session":"s","buckets":{"bucket":1}}`, `buckets: {"bucket":1} is not a list`},
		{&v1.LookupRequest{}, `{"keyspace":"k","keys":["a",2]}`, `keys[1]: 2 is not accepted; want a JSON string`},
		{&v1.JoinRequest{}, `{"keyspace":"k","member":{"id":"m","metadata":{"a":"b","c":1}}}`, `member.metadata["c"]: 1 is not accepted; want a JSON string`},
		{&v1.ReportHotKeysRequest{}, `{"pool":"p","keys":[{"key":"k","rate":"fast"}]}`, `keys[0].rate: "fast" is not accepted; want a number`},
	} {
		err := decodeStrict([]byte(tc.body), tc.msg)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.body, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s:\n got  %v\n want %s", tc.body, err, tc.want)
		}
	}
}

// FuzzStrictJSON decodes arbitrary bodies as a few requests: nothing
// panics, the codec accepts exactly what protojson accepts without
// DiscardUnknown, into the same message, and every refusal says something.
func FuzzStrictJSON(f *testing.F) {
	for _, seed := range []string{
		`{"keyspace":{"name":"rooms","buckets":16,"leaseTtl":"10s","mode":"KEYSPACE_MODE_EXCLUSIVE"}}`,
		`{"keyspace":{"bucket":16,"mode":"NOPE","lease_ttl":"1000h"}}`,
		`{"session":"s","buckets":[{"bucket":1,"token":"2"},null]}`,
		`{"keyspace":"k","member":{"id":"m","metadata":{"a":"b","c":1}}}`,
		`{"pool":"p","keys":[{"key":"k","rate":"NaN"}],"wait":"1.5s"}`,
		`{"a":{"b":[1,2,{"c":null}]},"a":1}`,
		`[]`, `null`, `"x"`, `{`, ``, `{"keyspace":{"name":"\ud800"}}`,
	} {
		f.Add([]byte(seed))
	}
	types := []func() proto.Message{
		func() proto.Message { return &v1.CreateKeyspaceRequest{} },
		func() proto.Message { return &v1.ReleaseRequest{} },
		func() proto.Message { return &v1.JoinRequest{} },
		func() proto.Message { return &v1.ReportHotKeysRequest{} },
		func() proto.Message { return &v1.GetOverflowSetRequest{} },
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, newMsg := range types {
			got, ref := newMsg(), newMsg()
			err := decodeStrict(body, got)
			refErr := protojson.Unmarshal(body, ref)
			if (err == nil) != (refErr == nil) {
				t.Fatalf("%T %q: strict %v, protojson %v", got, body, err, refErr)
			}
			if err == nil && !proto.Equal(got, ref) {
				t.Fatalf("%T %q: decoded %v, protojson %v", got, body, got, ref)
			}
			if err != nil && len(err.Error()) < 10 {
				t.Fatalf("%T %q: terse error %q", got, body, err)
			}
		}
	})
}
