package server_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/keyshardtest"
	"github.com/keyshard/keyshard/placement"
)

// owners reads keyspace ks's map: its epoch and the owner of each bucket.
func owners(t *testing.T, ctx context.Context, ts *testServer, ks string, sinceEpoch uint64) (uint64, []string) {
	t.Helper()
	r, err := ts.maps.GetMap(ctx, connect.NewRequest(&v1.GetMapRequest{Keyspace: ks, SinceEpoch: sinceEpoch, Wait: durationpb.New(time.Second)}))
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(r.Msg.Map.Owners))
	for b, o := range r.Msg.Map.Owners {
		if o > 0 {
			out[b] = r.Msg.Map.Members[o-1].Id
		}
	}
	return r.Msg.Map.Epoch, out
}

// grantsOf waits until member m holds n buckets and returns its grants.
func grantsOf(t *testing.T, ctx context.Context, ts *testServer, m *member, n int) []*v1.BucketGrant {
	t.Helper()
	r := pollGrants(t, ctx, ts, m.sess, 0, nil, func(r *v1.GetGrantsResponse) bool { return len(r.Grants) >= n })
	if len(r.Grants) != n {
		t.Fatalf("%d grants, want %d", len(r.Grants), n)
	}
	return r.Grants
}

// TestImportJoinsMoveNothing: an import of Synapse's sha256 mod N, stream
// (with positions) and exclusive, on the real server. The instances join
// in a shuffled order: each is granted exactly its imported buckets (b
// mod N), from its position, and the map stays the import's throughout.
// A fifth member then takes the minimum, a fifth of the buckets.
func TestImportJoinsMoveNothing(t *testing.T) {
	for _, tc := range []struct {
		mode      v1.KeyspaceMode
		instances []string
		positions []uint64
		buckets   uint32 // 0: the default
		want      int    // buckets of the keyspace
	}{
		{v1.KeyspaceMode_KEYSPACE_MODE_STREAM, []string{"sender1", "sender2", "sender3", "sender4"}, []uint64{1000, 1200, 900, 1500}, 0, 4096},
		{v1.KeyspaceMode_KEYSPACE_MODE_EXCLUSIVE, []string{"persister1", "persister2", "persister3", "persister4"}, nil, 256, 256},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			ts := startServer(t, nil)
			ctx := ctxT(t)
			n := len(tc.instances)
			req := &v1.ImportKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "fed", Mode: tc.mode, Buckets: tc.buckets}}
			for i, id := range tc.instances {
				inst := &v1.ImportInstance{Member: id}
				if tc.positions != nil {
					inst.Position = tc.positions[i]
				}
				req.Instances = append(req.Instances, inst)
			}
			resp, err := ts.admin.ImportKeyspace(ctx, connect.NewRequest(req))
			if err != nil {
				t.Fatal(err)
			}
			k := resp.Msg.Keyspace
			if int(k.Buckets) != tc.want || k.Hash != string(placement.HashSynapse) || k.Mode != tc.mode || resp.Msg.Epoch != 1 {
				t.Fatalf("imported %v epoch %d", k, resp.Msg.Epoch)
			}
			per := tc.want / n
			if want := slices.Repeat([]uint32{uint32(per)}, n); !slices.Equal(resp.Msg.Buckets, want) {
				t.Fatalf("buckets per instance %v, want %v", resp.Msg.Buckets, want)
			}
			epoch, first := owners(t, ctx, ts, "fed", 0)
			for b, o := range first {
				if o != tc.instances[b%n] {
					t.Fatalf("epoch %d: bucket %d owned by %q, want %q", epoch, b, o, tc.instances[b%n])
				}
			}

			order := slices.Clone(tc.instances)
			rand.New(rand.NewPCG(uint64(tc.mode), 7)).Shuffle(n, func(i, j int) { order[i], order[j] = order[j], order[i] })
			for _, id := range order {
				i := slices.Index(tc.instances, id)
				m := joinMember(t, ts, "fed", id)
				for _, g := range grantsOf(t, ctx, ts, m, per) {
					if int(g.Bucket)%n != i {
						t.Fatalf("%s granted bucket %d, imported as %s's", id, g.Bucket, tc.instances[int(g.Bucket)%n])
					}
					if want := uint64(0); tc.positions != nil && g.From != tc.positions[i] || tc.positions == nil && g.From != want {
						t.Fatalf("%s granted bucket %d from %d, want its position", id, g.Bucket, g.From)
					}
				}
				if e, now := owners(t, ctx, ts, "fed", 0); e != 1 || !slices.Equal(now, first) {
					t.Fatalf("after %s joined: map epoch %d, want the import's, unchanged", id, e)
				}
			}
			waitConverged(t, ctx, ts, "fed", n)
			if e, _ := owners(t, ctx, ts, "fed", 0); e != 1 {
				t.Fatalf("all joined: map epoch %d; something moved", e)
			}

			// A fifth member: the minimum moves, all of it to the newcomer.
			joinMember(t, ts, "fed", "newcomer")
			e, after := owners(t, ctx, ts, "fed", 1)
			moved := 0
			for b := range after {
				if after[b] != first[b] {
					moved++
					if after[b] != "newcomer" {
						t.Fatalf("bucket %d moved from %s to %s", b, first[b], after[b])
					}
				}
			}
			if lo := tc.want / (n + 1); e != 2 || moved < lo || moved > lo+1 {
				t.Fatalf("epoch %d: %d buckets moved; want %d or %d in one map", e, moved, lo, lo+1)
			}
			waitConverged(t, ctx, ts, "fed", n+1)
		})
	}
}

// TestImportDeadline: an imported instance that never joins has its
// buckets placed over the members present once wait_for_instances has
// passed (by the server's clock), from its imported position.
func TestImportDeadline(t *testing.T) {
	t0 := time.Date(2026, 5, 6, 7, 0, 0, 0, time.UTC)
	clk := keyshardtest.NewFakeClock(t0)
	ts := startServerWith(t, nil, clk)
	ctx := ctxT(t)
	if err := ts.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := ts.admin.ImportKeyspace(ctx, connect.NewRequest(&v1.ImportKeyspaceRequest{
		Keyspace:         &v1.Keyspace{Name: "fed", Buckets: 64, Mode: v1.KeyspaceMode_KEYSPACE_MODE_STREAM, LeaseTtl: durationpb.New(time.Minute)},
		Instances:        []*v1.ImportInstance{{Member: "a", Position: 50}, {Member: "b", Position: 70}},
		WaitForInstances: durationpb.New(2 * time.Second),
	}))
	if err != nil {
		t.Fatal(err)
	}
	a := joinMember(t, ts, "fed", "a")
	grantsOf(t, ctx, ts, a, 32)
	clk.Advance(time.Second)
	if e, _ := owners(t, ctx, ts, "fed", 0); e != 1 {
		t.Fatalf("before the deadline: epoch %d; b's buckets moved", e)
	}
	clk.Advance(time.Second) // the deadline: the leader's next tick places b's buckets
	e, all := owners(t, ctx, ts, "fed", 1)
	if e != 2 || slices.ContainsFunc(all, func(o string) bool { return o != "a" }) {
		t.Fatalf("after the deadline: epoch %d, owners %v; want every bucket on a", e, all)
	}
	for _, g := range grantsOf(t, ctx, ts, a, 64) {
		if want := []uint64{50, 70}[g.Bucket%2]; g.From != want {
			t.Fatalf("bucket %d granted from %d, want %d", g.Bucket, g.From, want)
		}
	}
}

// TestImportBadInput: every bad request is refused naming the field, and
// creates nothing.
func TestImportBadInput(t *testing.T) {
	ts := startServer(t, nil)
	ctx := ctxT(t)
	insts := func(ids ...string) []*v1.ImportInstance {
		var out []*v1.ImportInstance
		for _, id := range ids {
			out = append(out, &v1.ImportInstance{Member: id})
		}
		return out
	}
	stream := v1.KeyspaceMode_KEYSPACE_MODE_STREAM
	if _, err := ts.admin.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "taken"}})); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		req  *v1.ImportKeyspaceRequest
		code connect.Code
		msg  string
	}{
		{"exists", &v1.ImportKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "taken"}, Instances: insts("a")}, connect.CodeAlreadyExists, `keyspace "taken" already exists`},
		{"no keyspace", &v1.ImportKeyspaceRequest{Instances: insts("a")}, connect.CodeInvalidArgument, "keyspace: missing"},
		{"bad name", &v1.ImportKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "a b"}, Instances: insts("a")}, connect.CodeInvalidArgument, "keyspace.name"},
		{"wrong hash", &v1.ImportKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "x", Hash: "xxh64"}, Instances: insts("a")}, connect.CodeInvalidArgument, "keyspace.hash"},
		{"no instances", &v1.ImportKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "x"}}, connect.CodeInvalidArgument, "instances: empty"},
		{"not a multiple", &v1.ImportKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "x", Buckets: 4096}, Instances: insts("a", "b", "c")}, connect.CodeInvalidArgument, "keyspace.buckets: bucket count 4096 is not a multiple of the 3 instances, so the Synapse mapping cannot be kept; use 4095 or 4098 buckets"},
		{"buckets out of range", &v1.ImportKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "x", Buckets: 70000}, Instances: insts("a")}, connect.CodeInvalidArgument, "keyspace.buckets"},
		{"duplicate", &v1.ImportKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "x"}, Instances: insts("a", "b", "a")}, connect.CodeInvalidArgument, `instances[2].member: "a" is also instances[0]`},
		{"bad member", &v1.ImportKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "x"}, Instances: insts("a", "b/c")}, connect.CodeInvalidArgument, "instances[1].member"},
		{"empty member", &v1.ImportKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "x"}, Instances: insts("")}, connect.CodeInvalidArgument, "instances[0].member"},
		{"position in exclusive", &v1.ImportKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "x"}, Instances: []*v1.ImportInstance{{Member: "a"}, {Member: "b", Position: 5}}}, connect.CodeInvalidArgument, "instances[1].position: 5, but keyspace.mode is exclusive"},
		{"wait too long", &v1.ImportKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "x", Mode: stream}, Instances: insts("a"), WaitForInstances: durationpb.New(25 * time.Hour)}, connect.CodeInvalidArgument, "wait_for_instances: 25h0m0s is out of range"},
		{"wait negative", &v1.ImportKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "x", Mode: stream}, Instances: insts("a"), WaitForInstances: durationpb.New(-time.Second)}, connect.CodeInvalidArgument, "wait_for_instances"},
		{"bad lease", &v1.ImportKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "x", LeaseTtl: durationpb.New(time.Second)}, Instances: insts("a")}, connect.CodeInvalidArgument, "keyspace.lease_ttl"},
	} {
		_, err := ts.admin.ImportKeyspace(ctx, connect.NewRequest(tc.req))
		if connect.CodeOf(err) != tc.code || err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v; want %v naming %q", tc.name, err, tc.code, tc.msg)
		}
	}
	list, err := ts.admin.ListKeyspaces(ctx, connect.NewRequest(&v1.ListKeyspacesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Msg.Keyspaces) != 1 {
		t.Fatalf("keyspaces after refused imports: %v; want only %q", list.Msg.Keyspaces, "taken")
	}
	// The existing keyspace is untouched: still xxh64, no map written.
	k, err := ts.admin.GetKeyspace(ctx, connect.NewRequest(&v1.GetKeyspaceRequest{Name: "taken"}))
	if err != nil || k.Msg.Keyspace.Hash != string(placement.HashXXH64) {
		t.Fatalf("taken after a refused import: %v, %v", k, err)
	}
}

// TestImportSDK: the Go SDK's Admin.ImportKeyspace against the real
// server: the default bucket count for 3 instances (4095), the buckets
// per instance, and the server's refusals as the SDK's sentinels.
func TestImportSDK(t *testing.T) {
	ts := startServer(t, nil)
	ctx := ctxT(t)
	a := ts.Client().Admin()
	got, err := a.ImportKeyspace(ctx, client.KeyspaceImport{
		Keyspace:  client.KeyspaceConfig{Name: "persisters"},
		Instances: []client.ImportInstance{{Member: "p1"}, {Member: "p2"}, {Member: "p3"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := client.ImportedKeyspace{
		Keyspace: client.KeyspaceConfig{Name: "persisters", Buckets: 4095, Hash: placement.HashSynapse, Mode: client.ModeExclusive, LeaseTTL: 10 * time.Second, DrainTimeout: 30 * time.Second},
		Epoch:    1,
		Buckets:  []int{1365, 1365, 1365},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ImportKeyspace = %+v, want %+v", got, want)
	}
	_, err = a.ImportKeyspace(ctx, client.KeyspaceImport{Keyspace: client.KeyspaceConfig{Name: "persisters"}, Instances: []client.ImportInstance{{Member: "p1"}}})
	if !errors.Is(err, client.ErrExists) {
		t.Fatalf("second import: %v, want ErrExists", err)
	}
	_, err = a.ImportKeyspace(ctx, client.KeyspaceImport{Keyspace: client.KeyspaceConfig{Name: "senders", Buckets: 100, Mode: client.ModeStream}, Instances: []client.ImportInstance{{Member: "s1", Position: 9}, {Member: "s2"}, {Member: "s3"}}})
	if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "keyspace.buckets: bucket count 100 is not a multiple of the 3 instances") {
		t.Fatalf("import of 100 buckets over 3: %v, want ErrInvalid naming keyspace.buckets", err)
	}
}
