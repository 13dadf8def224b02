package client

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/placement"
)

func TestAdminKeyspaces(t *testing.T) {
	f := newFake(t)
	a := f.dial(t).Admin()
	ctx := context.Background()

	got, err := a.CreateKeyspace(ctx, KeyspaceConfig{Name: "rooms", Buckets: 256, Hash: placement.HashSynapse, Mode: ModeStream, LeaseTTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	want := KeyspaceConfig{Name: "rooms", Buckets: 256, Hash: placement.HashSynapse, Mode: ModeStream, LeaseTTL: 5 * time.Second, DrainTimeout: 30 * time.Second}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("CreateKeyspace (-want +got):\n%s", diff)
	}
	// Defaults come from the server.
	def, err := a.CreateKeyspace(ctx, KeyspaceConfig{Name: "tenants"})
	if err != nil {
		t.Fatal(err)
	}
	wantDef := KeyspaceConfig{Name: "tenants", Buckets: 4096, Hash: placement.HashXXH64, Mode: ModeExclusive, LeaseTTL: 10 * time.Second, DrainTimeout: 30 * time.Second}
	if diff := cmp.Diff(wantDef, def); diff != "" {
		t.Errorf("CreateKeyspace with defaults (-want +got):\n%s", diff)
	}
	if _, err := a.CreateKeyspace(ctx, KeyspaceConfig{Name: "rooms"}); !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), `keyspace "rooms" already exists`) {
		t.Errorf("second CreateKeyspace = %v, want ErrExists with the server's message", err)
	}
	g, err := a.GetKeyspace(ctx, "rooms")
	if err != nil || g != want {
		t.Errorf("GetKeyspace = %+v, %v", g, err)
	}
	if _, err := a.GetKeyspace(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetKeyspace(nope) = %v, want ErrNotFound", err)
	}
	list, err := a.ListKeyspaces(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]KeyspaceConfig{want, wantDef}, list); diff != "" {
		t.Errorf("ListKeyspaces (-want +got):\n%s", diff)
	}
	up, err := a.UpdateKeyspace(ctx, KeyspaceConfig{Name: "rooms", LeaseTTL: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if up.LeaseTTL != 20*time.Second || up.DrainTimeout != 30*time.Second || up.Buckets != 256 {
		t.Errorf("UpdateKeyspace = %+v", up)
	}
	if _, err := a.UpdateKeyspace(ctx, KeyspaceConfig{Name: "rooms", Buckets: 512}); !errors.Is(err, ErrImmutable) || !strings.Contains(err.Error(), "buckets cannot change") {
		t.Errorf("UpdateKeyspace(buckets) = %v, want ErrImmutable", err)
	}
}

func TestAdminBadInput(t *testing.T) {
	f := newFake(t)
	a := f.dial(t).Admin()
	ctx := context.Background()
	tests := []struct {
		name string
		cfg  KeyspaceConfig
		arg  string // the *ArgError's Arg
		text string // in its Reason
	}{
		{"empty name", KeyspaceConfig{}, "keyspace name", "is empty"},
		{"bad name", KeyspaceConfig{Name: "rooms and halls"}, "keyspace name", `has ' ' at byte 5`},
		{"negative buckets", KeyspaceConfig{Name: "r", Buckets: -1}, "KeyspaceConfig.Buckets", "-1 is out of range"},
		{"too many buckets", KeyspaceConfig{Name: "r", Buckets: 65537}, "KeyspaceConfig.Buckets", "65537 is out of range"},
		{"bad hash", KeyspaceConfig{Name: "r", Hash: "md5"}, "KeyspaceConfig.Hash", `hash mode "md5" is unknown`},
		{"bad mode", KeyspaceConfig{Name: "r", Mode: "shared"}, "KeyspaceConfig.Mode", `"shared" is unknown`},
		{"negative ttl", KeyspaceConfig{Name: "r", LeaseTTL: -time.Second}, "KeyspaceConfig.LeaseTTL", "-1s is negative"},
		{"negative drain timeout", KeyspaceConfig{Name: "r", DrainTimeout: -time.Second}, "KeyspaceConfig.DrainTimeout", "-1s is negative"},
	}
	for _, tc := range tests {
		_, err := a.CreateKeyspace(ctx, tc.cfg)
		checkArgError(t, tc.name, err, "Admin.CreateKeyspace", tc.arg, tc.text)
	}
	checkArgError(t, "DrainMember", a.DrainMember(ctx, "rooms", ""), "Admin.DrainMember", "member id", "is empty")
	_, err := a.ListMembers(ctx, "")
	checkArgError(t, "ListMembers", err, "Admin.ListMembers", "keyspace name", "is empty")
	_, err = a.Positions(ctx, "ev", 1001)
	checkArgError(t, "Positions", err, "Admin.Positions", "behind", "1001 is outside [0, 1000]")
	_, err = a.Positions(ctx, "", 0)
	checkArgError(t, "Positions", err, "Admin.Positions", "keyspace name", "is empty")
	_, err = a.ResetPositions(ctx, "ev", nil, 5)
	checkArgError(t, "ResetPositions", err, "Admin.ResetPositions", "buckets", "is empty; use ResetAllPositions")
	_, err = a.ResetPositions(ctx, "ev", []int{3, -1}, 5)
	checkArgError(t, "ResetPositions", err, "Admin.ResetPositions", "buckets", "entry 1: -1 is outside [0, 65536)")
	_, err = a.ResetAllPositions(ctx, "bad name", 5)
	checkArgError(t, "ResetAllPositions", err, "Admin.ResetAllPositions", "keyspace name", "has ' ' at byte 3")
	for _, proc := range []string{"CreateKeyspace", "GetPositions", "ResetPositions"} {
		if n := f.CallCount("/keyshard.v1.AdminService/" + proc); n != 0 {
			t.Errorf("%d %s calls reached the server; bad input must be refused locally", n, proc)
		}
	}
	for _, tc := range []struct {
		name string
		imp  KeyspaceImport
		arg  string
		text string
	}{
		{"import without instances", KeyspaceImport{Keyspace: KeyspaceConfig{Name: "fed"}}, "KeyspaceImport.Instances", "is empty"},
		{"import bad member", KeyspaceImport{Keyspace: KeyspaceConfig{Name: "fed"}, Instances: []ImportInstance{{Member: "a"}, {Member: "b c"}}}, "KeyspaceImport.Instances[1].Member", `has ' '`},
		{"import negative wait", KeyspaceImport{Keyspace: KeyspaceConfig{Name: "fed"}, Instances: []ImportInstance{{Member: "a"}}, WaitForInstances: -time.Second}, "KeyspaceImport.WaitForInstances", "-1s is negative"},
		{"import bad keyspace", KeyspaceImport{Keyspace: KeyspaceConfig{Name: ""}, Instances: []ImportInstance{{Member: "a"}}}, "keyspace name", "is empty"},
	} {
		_, err := a.ImportKeyspace(ctx, tc.imp)
		checkArgError(t, tc.name, err, "Admin.ImportKeyspace", tc.arg, tc.text)
	}
	if n := f.CallCount("/keyshard.v1.AdminService/ImportKeyspace"); n != 0 {
		t.Errorf("%d ImportKeyspace calls reached the server; bad input must be refused locally", n)
	}
}

// join joins member m to keyspace "rooms" with a Join call and returns
// the session, as a worker would.
func join(t *testing.T, c *Client, m *keyshardv1.Member) string {
	t.Helper()
	resp, err := call(context.Background(), c, memberAPI.Join, &keyshardv1.JoinRequest{Keyspace: "rooms", Member: m})
	if err != nil {
		t.Fatalf("Join(%s): %v", m.GetId(), err)
	}
	return resp.GetSession()
}

func TestAdminMembersAndStatus(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, 10*time.Second)
	c := f.dial(t)
	s1 := join(t, c, &keyshardv1.Member{Id: "w1", Address: "h:1", Weight: 2, Zone: "z", Metadata: map[string]string{"v": "1"}})
	s2 := join(t, c, &keyshardv1.Member{Id: "w2", Address: "h:2"})
	// w1 is the target of buckets 0-4 and holds 0-3, releasing 3; w2 is
	// the target of 5-12 and holds them; 13-15 are unassigned.
	f.SetMap("rooms", members("w1", "w2"), func(b int) string {
		switch {
		case b < 5:
			return "w1"
		case b < 13:
			return "w2"
		}
		return ""
	})
	for b := range 13 {
		switch {
		case b < 4:
			f.Grant(s1, b)
		case b >= 5:
			f.Grant(s2, b)
		}
	}
	f.AskRelease(s1, 3)
	a := c.Admin()
	ctx := context.Background()
	got, err := a.ListMembers(ctx, "rooms")
	if err != nil {
		t.Fatal(err)
	}
	w1 := MemberStatus{
		Member:        Member{ID: "w1", Address: "h:1", Weight: 2, Zone: "z", Metadata: map[string]string{"v": "1"}},
		TargetBuckets: 5, GrantedBuckets: 4, ReleasingBuckets: 1,
	}
	w2 := MemberStatus{Member: Member{ID: "w2", Address: "h:2"}, TargetBuckets: 8, GrantedBuckets: 8}
	if diff := cmp.Diff(Members{Members: []MemberStatus{w1, w2}, Epoch: 1}, got); diff != "" {
		t.Errorf("ListMembers (-want +got):\n%s", diff)
	}
	if err := a.DrainMember(ctx, "rooms", "w1"); err != nil {
		t.Errorf("DrainMember: %v", err)
	}
	got, err = a.ListMembers(ctx, "rooms")
	if err != nil {
		t.Fatal(err)
	}
	w1.Draining, w1.ReleasingBuckets = true, 4
	if diff := cmp.Diff(Members{Members: []MemberStatus{w1, w2}, Epoch: 1}, got); diff != "" {
		t.Errorf("ListMembers after DrainMember (-want +got):\n%s", diff)
	}
	if err := a.DrainMember(ctx, "rooms", "w9"); !errors.Is(err, ErrNotFound) {
		t.Errorf("DrainMember(a member that never joined) = %v, want ErrNotFound", err)
	}
	st, err := a.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantSt := Status{Replica: "clienttest", Leader: "clienttest", Keyspaces: []KeyspaceStatus{{
		Keyspace: KeyspaceConfig{Name: "rooms", Buckets: 16, Hash: "xxh64", Mode: ModeExclusive, LeaseTTL: 10 * time.Second, DrainTimeout: 30 * time.Second},
		Epoch:    1, Members: 2, UnassignedBuckets: 3, HandoffsInFlight: 1, // bucket 4: w1 does not hold it
	}}}
	if diff := cmp.Diff(wantSt, st); diff != "" {
		t.Errorf("Status (-want +got):\n%s", diff)
	}
	// w3 joins and keeps alive, but the map gives it nothing (the real
	// server's map for it not written yet); w4 joins only (pending).
	s3 := join(t, c, &keyshardv1.Member{Id: "w3"})
	if _, err := call(ctx, c, memberAPI.KeepAlive, &keyshardv1.KeepAliveRequest{Session: s3}); err != nil {
		t.Fatal(err)
	}
	join(t, c, &keyshardv1.Member{Id: "w4"})
	if st, err = a.Status(ctx); err != nil {
		t.Fatal(err)
	}
	wantSt.Keyspaces[0].Members, wantSt.Keyspaces[0].MembersWithoutBuckets = 4, 1
	if diff := cmp.Diff(wantSt, st); diff != "" {
		t.Errorf("Status with w3 active and not in the map (-want +got):\n%s", diff)
	}
}

// TestWaitDrained: progress reports the buckets left; the wait wakes on
// a new map at once, and on the poll interval otherwise.
func TestWaitDrained(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, 10*time.Second)
	c := f.dial(t)
	s1 := join(t, c, &keyshardv1.Member{Id: "w1"})
	s2 := join(t, c, &keyshardv1.Member{Id: "w2"})
	f.SetMap("rooms", members("w1", "w2"), func(b int) string { return []string{"w1", "w2"}[b/8] })
	for b := range 16 {
		f.Grant([]string{s1, s2}[b/8], b)
	}
	a := c.Admin()
	progress := make(chan int, 100)
	done := make(chan error, 1)
	go func() {
		done <- a.WaitDrained(context.Background(), "rooms", "w1", func(left int) { progress <- left })
	}()

	if got := recv(t, progress, "progress"); got != 8 {
		t.Errorf("progress = %d, want 8", got)
	}
	f.MapPolls().Next(t)
	// A new map moves w1's targets away, as it holds 6 still: the long
	// poll returns at once.
	f.Revoke(s1, 0)
	f.Revoke(s1, 1)
	f.SetMap("rooms", members("w1", "w2"), func(int) string { return "w2" })
	if got := recv(t, progress, "progress"); got != 6 {
		t.Errorf("progress = %d, want 6", got)
	}
	// Releases change no epoch: the next read comes after the poll wait.
	f.MapPolls().Next(t)
	for b := 2; b < 8; b++ {
		f.Revoke(s1, b)
	}
	f.Clock().MustBlockUntil(t, 1)
	f.Clock().Advance(drainPoll)
	if got := recv(t, progress, "progress"); got != 0 {
		t.Errorf("progress = %d, want 0", got)
	}
	if err := recv(t, done, "WaitDrained"); err != nil {
		t.Errorf("WaitDrained = %v", err)
	}

	// A member that is not listed (it left) is drained.
	if err := a.WaitDrained(context.Background(), "rooms", "gone", nil); err != nil {
		t.Errorf("WaitDrained(gone) = %v", err)
	}
	checkArgError(t, "WaitDrained", a.WaitDrained(context.Background(), "rooms", "", nil), "Admin.WaitDrained", "member id", "is empty")
}
