package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/placement"
)

func member(id string) shard.Member {
	return shard.Member{ID: id, Address: id + ":9000", Weight: 1, JoinedAt: testTime}
}

// newSession starts a session that is closed (its lease revoked) when the
// test ends.
func newSession(t *testing.T, s *Store, ttl time.Duration) *Session {
	t.Helper()
	se, err := s.NewSession(ctxFor(t, 10*time.Second), ttl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { se.Close() })
	return se
}

func createKeyspace(t *testing.T, s *Store, name string) shard.Keyspace {
	t.Helper()
	k := testKeyspace(name)
	if _, err := s.CreateKeyspace(ctxFor(t, 10*time.Second), k); err != nil {
		t.Fatal(err)
	}
	return k
}

// campaign makes a leader with its own session.
func campaign(t *testing.T, s *Store, id string) (*Election, Fence) {
	t.Helper()
	el := s.NewElection(newSession(t, s, 10*time.Second))
	f, err := el.Campaign(ctxFor(t, 10*time.Second), id)
	if err != nil {
		t.Fatalf("campaign %s: %v", id, err)
	}
	return el, f
}

// nextChanges waits for the next update that has changes, bounded by ctx.
func nextUpdate(t *testing.T, ctx context.Context, ch <-chan Update) Update {
	t.Helper()
	select {
	case u, ok := <-ch:
		if !ok {
			t.Fatal("watch channel closed")
		}
		return u
	case <-ctx.Done():
		t.Fatalf("no update: %v", ctx.Err())
	}
	panic("unreachable")
}

// waitFor applies updates to snap until cond holds, bounded by ctx.
func waitFor(t *testing.T, ctx context.Context, ch <-chan Update, snap **Snapshot, what string, cond func(*Snapshot) bool) {
	t.Helper()
	for !cond(*snap) {
		select {
		case u, ok := <-ch:
			if !ok {
				t.Fatalf("watch closed while waiting for %s", what)
			}
			applyUpdate(snap, u)
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		}
	}
}

func applyUpdate(snap **Snapshot, u Update) {
	if u.Resync != nil {
		*snap = u.Resync.Snapshot
		return
	}
	for _, c := range u.Changes {
		(*snap).Apply(c)
	}
}

func TestKeyspaceAdmin(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	k := testKeyspace("admin")
	if _, err := s.CreateKeyspace(ctx, k); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateKeyspace(ctx, k); !errors.Is(err, ErrExists) {
		t.Fatalf("second create: %v, want ErrExists", err)
	}
	if _, err := s.CreateKeyspace(ctx, shard.Keyspace{Name: "x y"}); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("create bad name: %v, want ErrInvalidName", err)
	}
	if _, err := s.CreateKeyspace(ctx, shard.Keyspace{Name: "admin-bad"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("create bad config: %v, want ErrInvalid", err)
	}
	for _, tc := range []struct {
		field string
		edit  func(*shard.Keyspace)
	}{
		{"buckets", func(k *shard.Keyspace) { k.Buckets = 128 }},
		{"hash", func(k *shard.Keyspace) { k.Hash = placement.HashSynapse }},
		{"mode", func(k *shard.Keyspace) { k.Mode = shard.ModeStream }},
	} {
		k2 := k
		tc.edit(&k2)
		_, err := s.UpdateKeyspace(ctx, k2)
		if !errors.Is(err, ErrImmutable) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("update %s: %v, want ErrImmutable naming it", tc.field, err)
		}
	}
	k.DrainTimeout = time.Minute
	rev, err := s.UpdateKeyspace(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	got, modRev, err := s.GetKeyspace(ctx, k.Name)
	if err != nil || got != k || modRev != rev {
		t.Fatalf("GetKeyspace = %+v %d %v, want %+v %d", got, modRev, err, k, rev)
	}
	if _, err := s.UpdateKeyspace(ctx, testKeyspace("admin-missing")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("update missing: %v, want ErrNotFound", err)
	}
	createKeyspace(t, s, "admin-2")
	list, _, err := s.ListKeyspaces(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, k := range list {
		if strings.HasPrefix(k.Name, "admin") {
			names = append(names, k.Name)
		}
	}
	if diff := cmp.Diff([]string{"admin", "admin-2"}, names); diff != "" {
		t.Errorf("ListKeyspaces (-want +got):\n%s", diff)
	}

	// Delete removes every key of the keyspace, and only of it.
	se := newSession(t, s, 10*time.Second)
	if _, _, err := s.Join(ctx, "admin", member("w1"), se.LeaseID(), false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Join(ctx, "admin-2", member("w1"), se.LeaseID(), false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteKeyspace(ctx, "admin"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteKeyspace(ctx, "admin"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v, want ErrNotFound", err)
	}
	if _, _, err := s.LoadKeyspace(ctx, "admin"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("load deleted: %v, want ErrNotFound", err)
	}
	snap, _, err := s.LoadKeyspace(ctx, "admin-2")
	if err != nil || snap.Keyspaces["admin-2"].Members["w1"].Value.ID != "w1" {
		t.Fatalf("admin-2 lost its member: %v", err)
	}
	all, err := s.LoadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st := all.Keyspaces["admin"]; st != nil {
		t.Fatalf("keys of deleted keyspace remain: %+v", st)
	}
}

func TestJoinConflictAndReplace(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	createKeyspace(t, s, "join")
	a, b := newSession(t, s, 10*time.Second), newSession(t, s, 10*time.Second)

	if _, _, err := s.Join(ctx, "nope", member("w1"), a.LeaseID(), false); !errors.Is(err, ErrNotFound) {
		t.Fatalf("join missing keyspace: %v, want ErrNotFound", err)
	}
	old, _, err := s.Join(ctx, "join", member("w1"), a.LeaseID(), false)
	if err != nil || old != 0 {
		t.Fatalf("first join: %v %v", old, err)
	}
	// The same session may join again (an update).
	m := member("w1")
	m.Weight = 2
	if _, _, err := s.Join(ctx, "join", m, a.LeaseID(), false); err != nil {
		t.Fatalf("rejoin with the same session: %v", err)
	}
	_, _, err = s.Join(ctx, "join", member("w1"), b.LeaseID(), false)
	if !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), a.LeaseID().String()) {
		t.Fatalf("join held id: %v, want ErrExists naming session %v", err, a.LeaseID())
	}
	old, _, err = s.Join(ctx, "join", member("w1"), b.LeaseID(), true)
	if err != nil || old != a.LeaseID() {
		t.Fatalf("replace: old %v, %v; want old %v", old, err, a.LeaseID())
	}
	// Revoking the old session leaves the new record in place.
	if err := s.Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	snap, _, err := s.LoadKeyspace(ctx, "join")
	if err != nil {
		t.Fatal(err)
	}
	got := snap.Keyspaces["join"].Members["w1"]
	if got.Value.Session != b.LeaseID() || got.Lease != b.LeaseID() || got.Value.Replaces != a.LeaseID() || got.Value.ReplacesFenced {
		t.Fatalf("member after replace: %+v, want session %v replacing %v, not fenced", got, b.LeaseID(), a.LeaseID())
	}
	// A process that fenced itself replaces its own session: the record
	// says so, and only when the session it names is the one replaced.
	c, d := newSession(t, s, 10*time.Second), newSession(t, s, 10*time.Second)
	for _, tc := range []struct {
		lease, fenced shard.LeaseID
		want          bool
	}{{c.LeaseID(), a.LeaseID(), false}, {d.LeaseID(), c.LeaseID(), true}} {
		m := member("w1")
		m.Replaces = tc.fenced
		if _, _, err := s.Join(ctx, "join", m, tc.lease, true); err != nil {
			t.Fatal(err)
		}
		snap, _, err := s.LoadKeyspace(ctx, "join")
		if err != nil {
			t.Fatal(err)
		}
		if got := snap.Keyspaces["join"].Members["w1"].Value; got.ReplacesFenced != tc.want {
			t.Fatalf("replace naming fenced session %v: record %+v, want ReplacesFenced %v", tc.fenced, got, tc.want)
		}
	}
	// Joining with a dead lease fails clearly.
	if _, _, err := s.Join(ctx, "join", member("w2"), old, false); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("join with revoked lease: %v, want ErrLeaseNotFound", err)
	}
	if _, _, err := s.Join(ctx, "join", member("bad id"), b.LeaseID(), false); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("join bad id: %v, want ErrInvalidName", err)
	}
}

func TestMemberWrites(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	createKeyspace(t, s, "mw")
	a, b := newSession(t, s, 10*time.Second), newSession(t, s, 10*time.Second)
	if _, _, err := s.Join(ctx, "mw", member("w1"), a.LeaseID(), false); err != nil {
		t.Fatal(err)
	}
	// The leader grants w1 a few buckets; w1 releases them one call at a
	// time, and concurrently: every release must stay recorded.
	_, fence := campaign(t, s, "leader-mw")
	var granted []shard.BucketToken
	for b := range 20 {
		granted = append(granted, shard.BucketToken{Bucket: b, Token: 7})
	}
	grantsRev, err := s.Commit(ctx, fence, []Write{PutGrants("mw", "w1", shard.Grants{Session: a.LeaseID(), Buckets: granted})}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, "mw", "w1", a.LeaseID(), []shard.BucketToken{{Bucket: 3, Token: 7}}, nil); err != nil {
		t.Fatal(err)
	}
	var nh *NotHeldError
	if _, err := s.Release(ctx, "mw", "w1", a.LeaseID(), []shard.BucketToken{{Bucket: 5, Token: 8}}, nil); !errors.As(err, &nh) || nh.Held != 7 || !errors.Is(err, ErrNotHeld) {
		t.Fatalf("release at the wrong token: %v", err)
	}
	if _, err := s.Release(ctx, "mw", "w1", a.LeaseID(), []shard.BucketToken{{Bucket: 40, Token: 1}}, nil); !errors.As(err, &nh) || nh.Held != 0 {
		t.Fatalf("release of a bucket not held: %v", err)
	}
	if _, err := s.Release(ctx, "mw", "w1", b.LeaseID(), []shard.BucketToken{{Bucket: 3, Token: 7}}, nil); !errors.Is(err, ErrFenced) {
		t.Fatalf("release from another session: %v, want ErrFenced", err)
	}
	if _, err := s.Release(ctx, "mw", "w9", a.LeaseID(), []shard.BucketToken{{Bucket: 3, Token: 7}}, nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("release of unknown member: %v, want ErrNotFound", err)
	}
	var wg sync.WaitGroup
	for _, bt := range granted[4:] {
		wg.Add(1)
		go func() { // exits after one release
			defer wg.Done()
			// A stale guess (nothing released yet) must not lose a release.
			stale := &ReleaseState{Grants: shard.Grants{Session: a.LeaseID(), Buckets: granted}, GrantsRev: grantsRev}
			if _, err := s.Release(ctx, "mw", "w1", a.LeaseID(), []shard.BucketToken{bt}, stale); err != nil {
				t.Errorf("release %v: %v", bt, err)
			}
		}()
	}
	wg.Wait()
	rel := shard.Releases{Buckets: append([]shard.BucketToken{{Bucket: 3, Token: 7}}, granted[4:]...)}
	if _, err := s.PutDrain(ctx, "mw", "w1", sampleDrain); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutDrain(ctx, "mw", "w9", sampleDrain); !errors.Is(err, ErrNotFound) {
		t.Fatalf("drain unknown member: %v, want ErrNotFound", err)
	}
	snap, _, err := s.LoadKeyspace(ctx, "mw")
	if err != nil {
		t.Fatal(err)
	}
	st := snap.Keyspaces["mw"]
	if d := st.Drains["w1"]; d.Lease != a.LeaseID() || d.Value.By != "admin" {
		t.Errorf("drain %+v, want on lease %v", d, a.LeaseID())
	}
	if r := st.Releases["w1"]; r.Lease != a.LeaseID() || !cmp.Equal(r.Value, rel) {
		t.Errorf("releases %+v, want %+v on lease %v", r, rel, a.LeaseID())
	}
	if _, err := s.DeleteDrain(ctx, "mw", "w1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteDrain(ctx, "mw", "w1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second DeleteDrain: %v, want ErrNotFound", err)
	}
	if _, err := s.DeleteMember(ctx, "mw", "w1", b.LeaseID()); !errors.Is(err, ErrFenced) {
		t.Fatalf("delete by another session: %v, want ErrFenced", err)
	}
	if _, err := s.DeleteMember(ctx, "mw", "w1", a.LeaseID()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteMember(ctx, "mw", "w1", 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete twice: %v, want ErrNotFound", err)
	}
	snap, _, err = s.LoadKeyspace(ctx, "mw")
	if err != nil {
		t.Fatal(err)
	}
	if st := snap.Keyspaces["mw"]; len(st.Members)+len(st.Releases)+len(st.Drains) != 0 {
		t.Fatalf("member keys remain: %+v", st)
	}
}

func TestLeaseOps(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	id, granted, err := s.Grant(ctx, 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if granted < 2*time.Second {
		t.Errorf("granted %v for 1.5s; want it rounded up to at least 2s", granted)
	}
	ttl, err := s.KeepAliveOnce(ctx, id)
	if err != nil || ttl != granted {
		t.Fatalf("KeepAliveOnce = %v, %v; want %v", ttl, err, granted)
	}
	info, err := s.TimeToLive(ctx, id)
	if err != nil || info.Granted != granted || info.TTL <= 0 || info.TTL > granted {
		t.Fatalf("TimeToLive = %+v, %v", info, err)
	}
	if err := s.Revoke(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := s.Revoke(ctx, id); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("second revoke: %v, want ErrLeaseNotFound", err)
	}
	if _, err := s.KeepAliveOnce(ctx, id); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("keep-alive revoked: %v, want ErrLeaseNotFound", err)
	}
	if _, err := s.TimeToLive(ctx, id); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("time to live of revoked: %v, want ErrLeaseNotFound", err)
	}

	// A session's Done closes when its lease is revoked from elsewhere.
	se := newSession(t, s, 2*time.Second)
	if err := s.Revoke(ctx, se.LeaseID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-se.Done():
	case <-ctx.Done():
		t.Fatal("session Done not closed after its lease was revoked")
	}
	if err := se.Close(); err != nil {
		t.Fatalf("Close after revoke: %v", err)
	}
}

func TestCommitFenced(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 30*time.Second)
	createKeyspace(t, s, "fence")
	w := newSession(t, s, 10*time.Second)
	if _, _, err := s.Join(ctx, "fence", member("w1"), w.LeaseID(), false); err != nil {
		t.Fatal(err)
	}
	el, f := campaign(t, s, "replica-1")
	if id, err := s.Leader(ctx); err != nil || id != "replica-1" {
		t.Fatalf("Leader = %q, %v", id, err)
	}

	snap, _, err := s.LoadKeyspace(ctx, "fence")
	if err != nil {
		t.Fatal(err)
	}
	st := snap.Keyspaces["fence"]
	m := shard.Map{Epoch: 1, Hash: placement.HashXXH64, Assignment: placement.NewAssignment(64)}
	g := shard.Grants{Session: w.LeaseID(), Buckets: []shard.BucketToken{{Bucket: 0, Token: 1}, {Bucket: 1, Token: 2}}}
	writes := []Write{PutMap("fence", m), PutGrants("fence", "w1", g), PutTokens("fence", 2)}
	expects := []Expect{
		ExpectEntry(MapKey("fence"), st.Map),
		ExpectEntry(TokensKey("fence"), st.Tokens),
		ExpectEntry(MemberKey("fence", "w1"), st.Members["w1"]),
	}
	rev, err := s.Commit(ctx, f, writes, expects)
	if err != nil {
		t.Fatalf("leader commit: %v", err)
	}
	snap, rev2, err := s.LoadKeyspace(ctx, "fence")
	if err != nil {
		t.Fatal(err)
	}
	st = snap.Keyspaces["fence"]
	if rev2 != rev || st.Map.ModRevision != rev || st.Tokens.Value != 2 || st.Grants["w1"].Lease != w.LeaseID() {
		t.Fatalf("after commit at %d: rev %d, map at %d, tokens %d, grants %+v", rev, rev2, st.Map.ModRevision, st.Tokens.Value, st.Grants["w1"])
	}
	if diff := cmp.Diff(g, st.Grants["w1"].Value); diff != "" {
		t.Errorf("grants (-want +got):\n%s", diff)
	}

	// The same expectations are stale now: ErrConflict naming the key.
	_, err = s.Commit(ctx, f, writes, expects)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), MapKey("fence")) {
		t.Fatalf("stale commit: %v, want ErrConflict naming the map key", err)
	}
	// Duplicate keys and oversized rounds are refused before etcd sees them.
	if _, err := s.Commit(ctx, f, []Write{PutTokens("fence", 3), PutTokens("fence", 4)}, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("duplicate key: %v, want ErrInvalid", err)
	}
	if _, err := s.Commit(ctx, f, []Write{PutTokens("bad name", 3)}, nil); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("bad name: %v, want ErrInvalidName", err)
	}
	many := make([]Write, DefaultMaxTxnOps)
	for i := range many {
		many[i] = PutTokens(fmt.Sprintf("ks%d", i), 1)
	}
	if _, err := s.Commit(ctx, f, many, nil); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "--max-txn-ops") {
		t.Fatalf("oversized commit: %v, want ErrTooLarge naming --max-txn-ops", err)
	}

	// A second replica campaigns; the first resigns; the second wins and
	// the first's fence is dead.
	el2 := s.NewElection(newSession(t, s, 10*time.Second))
	won := make(chan Fence, 1)
	errc := make(chan error, 1)
	go func() { // exits when the campaign ends (won, or ctx done)
		f2, err := el2.Campaign(ctx, "replica-2")
		if err != nil {
			errc <- err
			return
		}
		won <- f2
	}()
	if err := el.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	var f2 Fence
	select {
	case f2 = <-won:
	case err := <-errc:
		t.Fatal(err)
	case <-ctx.Done():
		t.Fatal("second replica did not win")
	}
	snap, _, err = s.LoadKeyspace(ctx, "fence")
	if err != nil {
		t.Fatal(err)
	}
	st = snap.Keyspaces["fence"]
	fresh := []Expect{ExpectEntry(MapKey("fence"), st.Map)}
	if _, err := s.Commit(ctx, f, []Write{PutTokens("fence", 9)}, fresh); !errors.Is(err, ErrFenced) {
		t.Fatalf("deposed leader commit: %v, want ErrFenced", err)
	}
	if _, err := s.Commit(ctx, f2, []Write{PutTokens("fence", 9)}, fresh); err != nil {
		t.Fatalf("new leader commit: %v", err)
	}
	if id, err := s.Leader(ctx); err != nil || id != "replica-2" {
		t.Fatalf("Leader = %q, %v; want replica-2", id, err)
	}
}

func TestCommitGrantWithRevokedLease(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	createKeyspace(t, s, "revoked")
	_, f := campaign(t, s, "leader")
	w := newSession(t, s, 10*time.Second)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	g := shard.Grants{Session: w.LeaseID(), Buckets: []shard.BucketToken{{Bucket: 5, Token: 1}}}
	_, err := s.Commit(ctx, f, []Write{PutGrants("revoked", "w1", g), PutTokens("revoked", 1)}, nil)
	if !errors.Is(err, ErrLeaseNotFound) || !strings.Contains(err.Error(), w.LeaseID().String()) {
		t.Fatalf("grant on revoked lease: %v, want ErrLeaseNotFound naming %v", err, w.LeaseID())
	}
	// Nothing of the transaction was written.
	snap, _, err := s.LoadKeyspace(ctx, "revoked")
	if err != nil {
		t.Fatal(err)
	}
	if st := snap.Keyspaces["revoked"]; st.Tokens.Exists() || len(st.Grants) > 0 {
		t.Fatalf("partial commit: %+v", st)
	}
}

func TestServerTxnLimit(t *testing.T) {
	// The store believes the server allows more than it does: the server's
	// refusal must come back as ErrTooLarge naming etcd's flag.
	e := runEmbedded(t, EmbeddedConfig{MaxTxnOps: 16, UnsafeNoFsync: true})
	s, err := Open(ctxFor(t, 10*time.Second), Config{Endpoints: e.Endpoints(), MaxTxnOps: 64, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := ctxFor(t, 10*time.Second)
	_, f := campaign(t, s, "leader")
	var ws []Write
	for i := range 20 {
		ws = append(ws, PutTokens(fmt.Sprintf("ks%d", i), 1))
	}
	if _, err := s.Commit(ctx, f, ws, nil); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "--max-txn-ops") {
		t.Fatalf("commit over the server limit: %v, want ErrTooLarge naming --max-txn-ops", err)
	}
}

func TestWatchSeesLeaseRevoke(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	createKeyspace(t, s, "wrevoke")
	snap, err := s.LoadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	updates := s.Watch(wctx, snap.Rev+1)

	w := newSession(t, s, 10*time.Second)
	_, f := campaign(t, s, "leader")
	if _, _, err := s.Join(ctx, "wrevoke", member("w1"), w.LeaseID(), false); err != nil {
		t.Fatal(err)
	}
	g := shard.Grants{Session: w.LeaseID(), Buckets: []shard.BucketToken{{Bucket: 1, Token: 1}}}
	if _, err := s.Commit(ctx, f, []Write{PutGrants("wrevoke", "w1", g), PutTokens("wrevoke", 1)}, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, updates, &snap, "member and grants", func(s *Snapshot) bool {
		st := s.Keyspaces["wrevoke"]
		return st != nil && st.Members["w1"].Exists() && st.Grants["w1"].Exists()
	})
	if err := s.Revoke(ctx, w.LeaseID()); err != nil {
		t.Fatal(err)
	}
	// The member record and its grants vanish in one revision.
	u := nextUpdate(t, ctx, updates)
	var deleted []string
	for _, c := range u.Changes {
		if c.Deleted {
			deleted = append(deleted, c.Key)
		}
		if c.ModRevision != u.Rev {
			t.Errorf("change at %d in an update at %d", c.ModRevision, u.Rev)
		}
	}
	want := []string{GrantsKey("wrevoke", "w1"), MemberKey("wrevoke", "w1")}
	if diff := cmp.Diff(want, deleted, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Fatalf("deleted on revoke (-want +got):\n%s", diff)
	}
	applyUpdate(&snap, u)
	if st := snap.Keyspaces["wrevoke"]; len(st.Members) != 0 || len(st.Grants) != 0 {
		t.Fatalf("state after revoke: %+v", st)
	}

	// Cancelling the context ends the watch goroutine, which closes the
	// channel.
	cancel()
	for range updates {
	}
}

func TestWatchResyncAfterCompaction(t *testing.T) {
	e := runEmbedded(t, EmbeddedConfig{UnsafeNoFsync: true, CompactionRetention: -1})
	s := openStore(t, e.Endpoints())
	ctx := ctxFor(t, 20*time.Second)
	createKeyspace(t, s, "compact")
	se := newSession(t, s, 10*time.Second)
	start, err := s.Rev(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Changes after start, then compaction past them, before the watch
	// starts: etcd can no longer replay them.
	if _, _, err := s.Join(ctx, "compact", member("w1"), se.LeaseID(), false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Join(ctx, "compact", member("w2"), se.LeaseID(), false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteMember(ctx, "compact", "w1", 0); err != nil {
		t.Fatal(err)
	}
	now, err := s.Rev(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(ctx, now); err != nil {
		t.Fatal(err)
	}
	updates := s.Watch(ctx, start+1)
	u := nextUpdate(t, ctx, updates)
	if u.Resync == nil {
		t.Fatalf("first update after compaction is %+v, want a Resync", u)
	}
	if u.Resync.Rev < now || u.Rev != u.Resync.Rev || u.Resync.Snapshot.Rev != u.Resync.Rev {
		t.Fatalf("resync at %d (update rev %d, snapshot rev %d), want >= %d", u.Resync.Rev, u.Rev, u.Resync.Snapshot.Rev, now)
	}
	st := u.Resync.Snapshot.Keyspaces["compact"]
	if st == nil || !st.Config.Exists() || len(st.Members) != 1 || !st.Members["w2"].Exists() {
		t.Fatalf("resync state %+v, want keyspace with member w2 only", st)
	}
	// The watch goes on after the resync revision.
	if _, _, err := s.Join(ctx, "compact", member("w3"), se.LeaseID(), false); err != nil {
		t.Fatal(err)
	}
	snap := u.Resync.Snapshot
	waitFor(t, ctx, updates, &snap, "w3", func(s *Snapshot) bool {
		return s.Keyspaces["compact"].Members["w3"].Exists()
	})
	// A watch started at 0 begins with a resync of the current state.
	u = nextUpdate(t, ctx, s.Watch(ctx, 0))
	if u.Resync == nil || len(u.Resync.Snapshot.Keyspaces["compact"].Members) != 2 {
		t.Fatalf("watch from 0 began with %+v, want a resync with 2 members", u)
	}
}

func TestSnapshotReportsCorruptValues(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	createKeyspace(t, s, "corrupt")
	// Write garbage behind the store's back, as a hand edit would.
	if _, err := s.client.Put(ctx, MapKey("corrupt"), `{"epoch":1}`); err != nil {
		t.Fatal(err)
	}
	bad := shard.Map{Epoch: 1, Hash: placement.HashXXH64, Assignment: placement.NewAssignment(8)}
	b, _ := EncodeMap(bad)
	if _, err := s.client.Put(ctx, TokensKey("corrupt"), "x"); err != nil {
		t.Fatal(err)
	}
	snap, _, err := s.LoadKeyspace(ctx, "corrupt")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{MapKey("corrupt"), TokensKey("corrupt")} {
		if !errors.Is(snap.Corrupt[k], ErrCorrupt) {
			t.Errorf("Corrupt[%q] = %v, want ErrCorrupt", k, snap.Corrupt[k])
		}
	}
	if st := snap.Keyspaces["corrupt"]; st.Map.Exists() || st.Tokens.Exists() || !st.Config.Exists() {
		t.Errorf("corrupt values leaked into the state: %+v", st)
	}
	// A well-formed map whose bucket count disagrees with the keyspace.
	if _, err := s.client.Put(ctx, MapKey("corrupt"), string(b)); err != nil {
		t.Fatal(err)
	}
	snap, _, err = s.LoadKeyspace(ctx, "corrupt")
	if err != nil {
		t.Fatal(err)
	}
	var ce *CorruptError
	if !errors.As(snap.Corrupt[MapKey("corrupt")], &ce) || ce.Field != "buckets" {
		t.Errorf("map with 8 of 64 buckets: %v, want corrupt field buckets", snap.Corrupt[MapKey("corrupt")])
	}
}

func TestObserveLeader(t *testing.T) {
	e := runEmbedded(t, EmbeddedConfig{UnsafeNoFsync: true})
	s := openStore(t, e.Endpoints())
	ctx := ctxFor(t, 20*time.Second)
	if _, err := s.Leader(ctx); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Leader with nobody leading: %v, want ErrNotFound", err)
	}
	obs := s.Observe(ctx)
	expect := func(want string) {
		t.Helper()
		for {
			select {
			case id := <-obs:
				if id == want {
					return
				}
			case <-ctx.Done():
				t.Fatalf("Observe never reported %q", want)
			}
		}
	}
	expect("")
	el, _ := campaign(t, s, "r1")
	expect("r1")
	if err := el.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	expect("")
	_, _ = campaign(t, s, "r2")
	expect("r2")
}

func TestClosedStore(t *testing.T) {
	e := runEmbedded(t, EmbeddedConfig{UnsafeNoFsync: true})
	s := openStore(t, e.Endpoints())
	ctx := ctxFor(t, 10*time.Second)
	updates := s.Watch(ctx, 0)
	nextUpdate(t, ctx, updates)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s.Close() // idempotent
	if _, _, err := s.GetKeyspace(ctx, "x"); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
	// The watch goroutine exits on Close even though ctx lives on.
	for {
		select {
		case _, ok := <-updates:
			if !ok {
				return
			}
		case <-ctx.Done():
			t.Fatal("watch channel not closed after Store.Close")
		}
	}
}

func TestOpenUnreachable(t *testing.T) {
	urls, err := freeLoopbackURLs(1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(ctxFor(t, 10*time.Second), Config{Endpoints: urls, DialTimeout: 300 * time.Millisecond})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Open(nothing listening) = %v, want ErrUnavailable", err)
	}
}

func TestExpiredSessionKeysVanish(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	createKeyspace(t, s, "expire")
	_, f := campaign(t, s, "leader")
	snap, err := s.LoadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	updates := s.Watch(ctx, snap.Rev+1)
	w, err := s.NewSession(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("asked for a 1s lease, etcd granted %v", w.TTL())
	if _, _, err := s.Join(ctx, "expire", member("w1"), w.LeaseID(), false); err != nil {
		t.Fatal(err)
	}
	w.Orphan() // the process "dies": nobody renews the lease
	waitFor(t, ctx, updates, &snap, "member record", func(s *Snapshot) bool {
		return s.Keyspaces["expire"].Members["w1"].Exists()
	})
	// etcd deletes the record when the lease expires; the new owner waits
	// for that deletion, never for a local timer.
	waitFor(t, ctx, updates, &snap, "member record deleted on expiry", func(s *Snapshot) bool {
		return !s.Keyspaces["expire"].Members["w1"].Exists()
	})
	g := shard.Grants{Session: w.LeaseID(), Buckets: []shard.BucketToken{{Bucket: 0, Token: 1}}}
	if _, err := s.Commit(ctx, f, []Write{PutGrants("expire", "w1", g)}, nil); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("grant on an expired lease: %v, want ErrLeaseNotFound", err)
	}
}

func TestQuarantineLivesOnItsOwnLease(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	k := createKeyspace(t, s, "quar")
	_, f := campaign(t, s, "leader")
	w := newSession(t, s, 10*time.Second)
	if _, _, err := s.Join(ctx, "quar", member("w1"), w.LeaseID(), false); err != nil {
		t.Fatal(err)
	}
	// The leader quarantines w1's buckets on a lease of one TTL, then
	// revokes w1's session.
	if qi, err := s.QuarantineOf(ctx, "quar", "w1"); err != nil || qi != (QuarantineInfo{}) {
		t.Fatalf("QuarantineOf before any quarantine = %+v, %v; want none", qi, err)
	}
	ql, _, err := s.Grant(ctx, k.LeaseTTL)
	if err != nil {
		t.Fatal(err)
	}
	q := shard.Quarantine{Session: w.LeaseID(), Buckets: []int{2, 9}}
	if _, err := s.Commit(ctx, f, []Write{PutQuarantine("quar", "w1", q, 0)}, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("quarantine without a lease: %v, want ErrInvalid", err)
	}
	if _, err := s.Commit(ctx, f, []Write{PutQuarantine("quar", "w1", q, ql)}, nil); err != nil {
		t.Fatal(err)
	}
	if qi, err := s.QuarantineOf(ctx, "quar", "w1"); err != nil || qi.Lease != ql || qi.Left <= 0 || qi.Left > k.LeaseTTL {
		t.Fatalf("QuarantineOf = %+v, %v; want lease %v with (0, %v] left", qi, err, ql, k.LeaseTTL)
	}
	if err := s.Revoke(ctx, w.LeaseID()); err != nil {
		t.Fatal(err)
	}
	snap, _, err := s.LoadKeyspace(ctx, "quar")
	if err != nil {
		t.Fatal(err)
	}
	st := snap.Keyspaces["quar"]
	if got := st.Quarantines["w1"]; got.Lease != ql || !cmp.Equal(got.Value, q) || len(st.Members) != 0 {
		t.Fatalf("after revoke: quarantine %+v, members %v; want %+v on lease %v and no members", got, st.Members, q, ql)
	}
	// etcd ends the quarantine by deleting its lease (here: at once).
	if err := s.Revoke(ctx, ql); err != nil {
		t.Fatal(err)
	}
	snap, _, err = s.LoadKeyspace(ctx, "quar")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(snap.Keyspaces["quar"].Quarantines); n != 0 {
		t.Fatalf("%d quarantines after their lease ended", n)
	}
	if qi, err := s.QuarantineOf(ctx, "quar", "w1"); err != nil || qi != (QuarantineInfo{}) {
		t.Fatalf("QuarantineOf after its lease ended = %+v, %v; want none", qi, err)
	}
}

func TestClusterSecret(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 10*time.Second)
	a, err := s.ClusterSecret(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.ClusterSecret(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 32 || string(a) != string(b) {
		t.Fatalf("secrets differ or wrong size: %x %x", a, b)
	}
}

func TestClearElection(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	el, _ := campaign(t, s, "stale-run")
	_ = el
	n, err := s.ClearElection(ctx)
	if err != nil || n < 1 {
		t.Fatalf("ClearElection = %d, %v", n, err)
	}
	if leader, err := s.Leader(ctx); !errors.Is(err, ErrNotFound) {
		t.Fatalf("leader after clearing: %q, %v", leader, err)
	}
}

// TestActivate: a new session's record is pending until its first
// keep-alive activates it; a replaced session cannot activate (or renew
// through the API) any more, and the record names the session it replaced.
func TestActivate(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	createKeyspace(t, s, "act")
	a, b := newSession(t, s, 10*time.Second), newSession(t, s, 10*time.Second)
	record := func() shard.Member {
		t.Helper()
		snap, _, err := s.LoadKeyspace(ctx, "act")
		if err != nil {
			t.Fatal(err)
		}
		return snap.Keyspaces["act"].Members["w1"].Value
	}
	m := member("w1")
	m.Pending = false // Join decides, whatever the caller passes
	if _, _, err := s.Join(ctx, "act", m, a.LeaseID(), false); err != nil {
		t.Fatal(err)
	}
	if got := record(); !got.Pending || got.Replaces != 0 {
		t.Fatalf("after join: pending %v replaces %v, want pending and no replaced session", got.Pending, got.Replaces)
	}
	joinRev, err := s.Activate(ctx, "act", "w1", a.LeaseID())
	if err != nil || joinRev == 0 {
		t.Fatalf("first activate: rev %d, %v; want a write", joinRev, err)
	}
	if rev, err := s.Activate(ctx, "act", "w1", a.LeaseID()); err != nil || rev != 0 {
		t.Fatalf("second activate: rev %d, %v; want no write", rev, err)
	}
	// An update under the same session stays active.
	if _, _, err := s.Join(ctx, "act", member("w1"), a.LeaseID(), false); err != nil {
		t.Fatal(err)
	}
	if got := record(); got.Pending {
		t.Fatal("an update under the same session made it pending again")
	}
	if _, _, err := s.Join(ctx, "act", member("w1"), b.LeaseID(), true); err != nil {
		t.Fatal(err)
	}
	if got := record(); !got.Pending || got.Replaces != a.LeaseID() {
		t.Fatalf("after replace: pending %v replaces %v, want pending, replacing %v", got.Pending, got.Replaces, a.LeaseID())
	}
	if _, err := s.Activate(ctx, "act", "w1", a.LeaseID()); !errors.Is(err, ErrFenced) {
		t.Fatalf("activate the replaced session: %v, want ErrFenced", err)
	}
	if _, err := s.Activate(ctx, "act", "w9", a.LeaseID()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("activate an unknown member: %v, want ErrNotFound", err)
	}
}

// TestReleaseTwice: releasing a bucket again at the same token, before
// the leader has handed it over, succeeds again (so a Release is safe to
// retry after a timeout) and records it once.
func TestReleaseTwice(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	createKeyspace(t, s, "rel2")
	a := newSession(t, s, 10*time.Second)
	if _, _, err := s.Join(ctx, "rel2", member("w1"), a.LeaseID(), false); err != nil {
		t.Fatal(err)
	}
	_, fence := campaign(t, s, "leader-rel2")
	if _, err := s.Commit(ctx, fence, []Write{PutGrants("rel2", "w1", shard.Grants{Session: a.LeaseID(), Buckets: []shard.BucketToken{{Bucket: 1, Token: 4}, {Bucket: 2, Token: 4}}})}, nil); err != nil {
		t.Fatal(err)
	}
	first, err := s.Release(ctx, "rel2", "w1", a.LeaseID(), []shard.BucketToken{{Bucket: 2, Token: 4}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.Release(ctx, "rel2", "w1", a.LeaseID(), []shard.BucketToken{{Bucket: 2, Token: 4}}, nil)
	if err != nil || second <= first {
		t.Fatalf("second release: rev %d, %v; want success after rev %d", second, err, first)
	}
	snap, _, err := s.LoadKeyspace(ctx, "rel2")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := snap.Keyspaces["rel2"].Releases["w1"].Value, (shard.Releases{Buckets: []shard.BucketToken{{Bucket: 2, Token: 4}}}); !cmp.Equal(got, want) {
		t.Fatalf("releases %+v, want %+v", got, want)
	}
}

// A write outside Keyshard's keys moves etcd's revision without an event
// for Keyshard's watch; a progress request makes the watch say how far it
// has delivered, past that write.
func TestWatchProgress(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 20*time.Second)
	snap, err := s.LoadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	updates := s.Watch(wctx, snap.Rev+1)
	resp, err := s.client.Put(ctx, "another-application/key", "value")
	if err != nil {
		t.Fatal(err)
	}
	want := resp.Header.Revision
	ask := time.NewTicker(200 * time.Millisecond) // until the watch is caught up, etcd does not answer
	defer ask.Stop()
	for {
		if err := s.RequestWatchProgress(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case u := <-updates:
			if u.Progress && len(u.Changes) != 0 {
				t.Fatalf("a progress update with %d changes", len(u.Changes))
			}
			if u.Progress && u.Rev >= want {
				return
			}
		case <-ask.C:
		case <-ctx.Done():
			t.Fatalf("no progress update at revision %d or later", want)
		}
	}
}
