package server_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/internal/server"
	"github.com/keyshard/keyshard/keyshardtest"
)

// keyspaceStatus reads keyspace ks's entry of Status through ts.
func keyspaceStatus(t *testing.T, ctx context.Context, ts *testServer, ks string) *v1.KeyspaceStatus {
	t.Helper()
	st, err := ts.admin.Status(ctx, connect.NewRequest(&v1.StatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range st.Msg.Keyspaces {
		if k.Keyspace.GetName() == ks {
			return k
		}
	}
	t.Fatalf("Status lists no keyspace %q: %v", ks, st.Msg)
	return nil
}

// TestStatusHeldJoin: while the leader holds a join back for the
// rebalance gap (on a fake clock, so the hold lasts until the test moves
// it), Status shows no handoff in flight and no bucket unassigned, and
// counts the new member in members_without_buckets; a pending member (no
// keep-alive yet) and a draining one are not counted. Once the gap has
// passed the leader writes the map, and none is.
func TestStatusHeldJoin(t *testing.T) {
	clk := keyshardtest.NewFakeClock(time.Date(2026, 5, 6, 7, 0, 0, 0, time.UTC))
	ts := startServerWith(t, func(c *server.Config) { c.RebalanceGap = time.Second }, clk)
	ctx := ctxT(t)
	if err := ts.WaitLeading(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.admin.CreateKeyspace(ctx, connect.NewRequest(&v1.CreateKeyspaceRequest{Keyspace: &v1.Keyspace{Name: "rooms", Buckets: 16, LeaseTtl: durationpb.New(time.Minute)}})); err != nil {
		t.Fatal(err)
	}
	a := joinMember(t, ts, "rooms", "a")
	grantsOf(t, ctx, ts, a, 16) // a's map places unassigned buckets: not held back
	if k := keyspaceStatus(t, ctx, ts, "rooms"); k.MembersWithoutBuckets != 0 || k.Members != 1 {
		t.Fatalf("a alone: %v; want 1 member, none without buckets", k)
	}
	epoch, _ := owners(t, ctx, ts, "rooms", 0)

	// p joins but never keeps alive: pending, no map would give it a bucket.
	if _, err := ts.member.Join(ctx, connect.NewRequest(&v1.JoinRequest{Keyspace: "rooms", Member: &v1.Member{Id: "p"}})); err != nil {
		t.Fatal(err)
	}
	joinMember(t, ts, "rooms", "b") // active once it returns
	joinMember(t, ts, "rooms", "c")
	k := keyspaceStatus(t, ctx, ts, "rooms")
	if k.Members != 4 || k.MembersWithoutBuckets != 2 || k.HandoffsInFlight != 0 || k.UnassignedBuckets != 0 || k.ReleasingBuckets != 0 || k.Epoch != epoch {
		t.Fatalf("b and c joined within the gap: %v; want epoch %d, 4 members, 2 without buckets, nothing else moving", k, epoch)
	}
	if _, err := ts.admin.DrainMember(ctx, connect.NewRequest(&v1.DrainMemberRequest{Keyspace: "rooms", Member: "c"})); err != nil {
		t.Fatal(err)
	}
	if k := keyspaceStatus(t, ctx, ts, "rooms"); k.MembersWithoutBuckets != 1 || k.DrainingMembers != 1 || k.Epoch != epoch {
		t.Fatalf("c drained: %v; want epoch %d, 1 member without buckets (b), 1 draining", k, epoch)
	}

	clk.Advance(time.Second) // the gap has passed: the leader writes b's map
	// The leader's own watch may bring c's drain after the gap's timer
	// fires (Status reads serve's view, which can be ahead of it): its map
	// then gives c buckets too, and the next one moves them off at once (a
	// move off a draining member is not held back). Either way the
	// keyspace ends with c holding nothing.
	e, own := epoch, []string(nil)
	for e == epoch || slices.Contains(own, "c") {
		e, own = owners(t, ctx, ts, "rooms", e)
	}
	if k := keyspaceStatus(t, ctx, ts, "rooms"); k.MembersWithoutBuckets != 0 || k.Epoch != e {
		t.Fatalf("after the gap: %v; want epoch %d, no member without buckets", k, e)
	}
}
