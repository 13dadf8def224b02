package server

import (
	"errors"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/internal/shard"
)

// FuzzCreateKeyspaceRequest decodes arbitrary JSON as a CreateKeyspace
// request, as the API does, and validates it: nothing panics, and every
// refusal is an invalid-argument error that names a field.
func FuzzCreateKeyspaceRequest(f *testing.F) {
	f.Add([]byte(`{"keyspace":{"name":"rooms","buckets":1024,"leaseTtl":"10s"}}`))
	f.Add([]byte(`{"keyspace":{"name":"","buckets":70000,"hash":"md5","mode":7,"drainTimeout":"-1s"}}`))
	f.Add([]byte(`{"keyspace":{"name":"a b","leaseTtl":"1.5s"}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var req v1.CreateKeyspaceRequest
		if err := protojson.Unmarshal(body, &req); err != nil {
			return // connect answers invalid_argument for undecodable JSON
		}
		c, err := keyspaceConfig(req.GetKeyspace())
		if err != nil {
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("code %v for %s: %v", connect.CodeOf(err), body, err)
			}
			if !strings.Contains(err.Error(), "keyspace") {
				t.Fatalf("error names no field: %v", err)
			}
			return
		}
		if c.Buckets < 1 || c.Buckets > 65536 || c.LeaseTTL < MinLeaseTTL || c.Hash.Validate() != nil {
			t.Fatalf("accepted an invalid keyspace: %+v", c)
		}
	})
}

// FuzzSessionToken checks that any string either parses to the session
// it was minted for or is refused with a clear code, never a panic.
func FuzzSessionToken(f *testing.F) {
	s := sessions{secret: []byte("0123456789abcdef0123456789abcdef")}
	f.Add(s.token("rooms", "w1", 0x2fd5a22a3009f90d))
	f.Add("rooms/w1/zz/00")
	f.Add("")
	f.Add("a/b/c/d/e")
	f.Fuzz(func(t *testing.T, tok string) {
		sess, err := s.parse(tok)
		if err != nil {
			if c := connect.CodeOf(err); c != connect.CodeInvalidArgument && c != connect.CodeUnauthenticated {
				t.Fatalf("code %v for %q", c, tok)
			}
			return
		}
		if s.token(sess.keyspace, sess.member, sess.lease) != tok {
			t.Fatalf("%q parsed to %+v, which mints another token", tok, sess)
		}
	})
}

func TestSessionTokenForgery(t *testing.T) {
	s := sessions{secret: []byte("0123456789abcdef0123456789abcdef")}
	tok := s.token("rooms", "w1", shard.LeaseID(0x1234))
	if got, err := s.parse(tok); err != nil || got.member != "w1" || got.lease != 0x1234 {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	other := sessions{secret: []byte("another cluster's secret, 32 by.")}
	if _, err := other.parse(tok); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("a token of another cluster: %v", err)
	}
	forged := strings.Replace(tok, "/w1/", "/w2/", 1)
	if _, err := s.parse(forged); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("a token for another member: %v", err)
	}
}

func TestWaitOf(t *testing.T) {
	if w, err := waitOf(nil); err != nil || w != 0 {
		t.Fatalf("nil wait: %v %v", w, err)
	}
	if w, _ := waitOf(durationpb.New(maxWait * 2)); w != maxWait {
		t.Fatalf("wait not capped: %v", w)
	}
	if _, err := waitOf(&durationpb.Duration{Seconds: -1}); !errors.Is(err, errInvalid) && connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("negative wait: %v", err)
	}
}
