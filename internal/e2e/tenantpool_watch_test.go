package e2e_test

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/internal/tenantpool"
	"github.com/keyshard/keyshard/keyshardtest"
)

// TestTenantPoolWatchDeltas follows WatchPoolSnapshot of a real keyshard
// serve while the load moves over 20 tenants (groups of five report for
// a few seconds, then go quiet and are forgotten): the first message is
// the full snapshot; every later one is a delta that lists exactly the
// tenants whose stored state changed since the previous message (the
// removed ones in removed_tenants); and a copy that applies the deltas
// equals, at every version, a fresh full GetPoolSnapshot.
func TestTenantPoolWatchDeltas(t *testing.T) {
	e := newTPEnv(t, 1)
	l := e.leader()
	e.putPool(l, &keyshardv1.TenantPool{Name: "gw", Policy: &keyshardv1.TenantPoolPolicy{
		CapacityPerMember: 1, Window: durationpb.New(2 * time.Second), ShrinkCooldown: durationpb.New(2 * time.Second),
		Lookback: durationpb.New(2 * time.Second), ForgetAfter: durationpb.New(3 * time.Second),
	}})
	api := e.api(l)
	for i := range 6 {
		e.rawMember(l, "gw", fmt.Sprintf("m%d", i), fmt.Sprintf("z%d", i%2))
	}
	st := e.stepUntilState(l, "gw", "six members placed", 20, func(st tenantpool.State) bool { return len(st.Members) == 6 })

	// The replica answers from its view, which the leader's publication
	// reaches through etcd's watch: wait until it has st's version, so
	// that the watch's first message is that version.
	for v := uint64(0); v < st.Version; {
		resp, err := api.GetPoolSnapshot(e.ctx, connect.NewRequest(&keyshardv1.GetPoolSnapshotRequest{Pool: "gw", SinceVersion: v, Wait: durationpb.New(time.Second)}))
		if err != nil {
			t.Fatal(err)
		}
		v = resp.Msg.GetSnapshot().GetVersion()
	}
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	stream, err := api.WatchPoolSnapshot(ctx, connect.NewRequest(&keyshardv1.WatchPoolSnapshotRequest{Pool: "gw"}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	msgs := make(chan *keyshardv1.PoolSnapshot, 100)
	go func() { // ends when ctx ends
		defer close(msgs)
		for stream.Receive() {
			msgs <- stream.Msg()
		}
	}()
	next := func(want uint64) *keyshardv1.PoolSnapshot {
		t.Helper()
		select {
		case m, ok := <-msgs:
			if !ok {
				t.Fatalf("the watch ended waiting for version %d: %v", want, stream.Err())
			}
			if m.GetVersion() != want {
				t.Fatalf("watch message of version %d; want %d", m.GetVersion(), want)
			}
			return m
		case <-e.ctx.Done():
			t.Fatalf("no watch message of version %d", want)
		}
		panic("unreachable")
	}
	first := next(st.Version)
	if !first.GetFull() || len(first.GetMembers()) != 6 || first.GetPolicy().GetCapacityPerMember() != 1 {
		t.Fatalf("first message: full %v, %d members, policy %v; want the full snapshot", first.GetFull(), len(first.GetMembers()), first.GetPolicy())
	}
	copyOf := map[string]*keyshardv1.TenantAssignment{}
	for _, a := range first.GetTenants() {
		copyOf[a.GetTenant()] = a
	}
	compare := func(version uint64) {
		t.Helper()
		resp, err := api.GetPoolSnapshot(e.ctx, connect.NewRequest(&keyshardv1.GetPoolSnapshotRequest{Pool: "gw"}))
		if err != nil {
			t.Fatal(err)
		}
		full := resp.Msg.GetSnapshot()
		if full.GetVersion() != version || !full.GetFull() {
			t.Fatalf("GetPoolSnapshot: version %d, full %v; want the full snapshot of version %d", full.GetVersion(), full.GetFull(), version)
		}
		if len(full.GetTenants()) != len(copyOf) {
			t.Fatalf("version %d: the copy holds %d tenants, the full snapshot %d", version, len(copyOf), len(full.GetTenants()))
		}
		for _, a := range full.GetTenants() {
			if !proto.Equal(a, copyOf[a.GetTenant()]) {
				t.Fatalf("version %d: tenant %s is %v in the copy, %v in the full snapshot", version, a.GetTenant(), copyOf[a.GetTenant()], a)
			}
		}
	}
	compare(st.Version)

	r, err := e.sdk(l).NewLoadReporter("gw", "c1", client.ReportInterval(time.Hour)) // Flush sends
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var (
		prev                       = st                // the state of the last message
		touched                    = map[string]bool{} // tenants whose state changed since
		versions, changed, removed int                 // deltas seen, tenants in them, removals
	)
	for i := range 40 {
		if i < 28 { // then quiet: every tenant is forgotten
			group := (i / 7) % 4
			for j := range 5 {
				tn := fmt.Sprintf("t%02d", group*5+j)
				mustAdd(t, r, tn, int64(1+(j*7+i)%6))
			}
			if err := r.Flush(e.ctx); err != nil {
				t.Fatal(err)
			}
		}
		before := e.state("gw")
		e.step(l)
		cur := e.state("gw")
		for tn := range mapUnion(before.Tenants, cur.Tenants) {
			if !reflect.DeepEqual(before.Tenants[tn], cur.Tenants[tn]) {
				touched[tn] = true
			}
		}
		if cur.Version == prev.Version {
			continue
		}
		m := next(cur.Version)
		if m.GetFull() || len(m.GetMembers()) != 6 || m.GetPolicy() == nil {
			t.Fatalf("version %d: full %v, %d members, policy %v; want a delta with the members and the policy", cur.Version, m.GetFull(), len(m.GetMembers()), m.GetPolicy())
		}
		var listed []string
		for _, a := range m.GetTenants() {
			listed = append(listed, a.GetTenant())
			copyOf[a.GetTenant()] = a
		}
		for _, tn := range m.GetRemovedTenants() {
			if _, ok := cur.Tenants[tn]; ok {
				t.Fatalf("version %d: %s in removed_tenants, yet in the state", cur.Version, tn)
			}
			listed = append(listed, tn)
			delete(copyOf, tn)
		}
		slices.Sort(listed)
		if want := slices.Sorted(maps.Keys(touched)); !slices.Equal(listed, want) {
			t.Fatalf("version %d: the delta lists %v; the tenants whose state changed since version %d are %v", cur.Version, listed, prev.Version, want)
		}
		compare(cur.Version)
		versions++
		changed += len(m.GetTenants())
		removed += len(m.GetRemovedTenants())
		prev, touched = cur, map[string]bool{}
	}
	t.Logf("%d deltas: %d tenants changed, %d removed; %d tenants at version %d", versions, changed, removed, len(copyOf), prev.Version)
	if versions < 15 || changed == 0 || removed < 20 || len(copyOf) != 0 {
		t.Fatalf("%d deltas, %d tenants changed, %d removed, %d left; want at least 15 deltas, every one of the 20 tenants forgotten", versions, changed, removed, len(copyOf))
	}
}

// rawMember joins pool as member id through the raw API and sends its
// first keep-alive, which places it at the next round. Its session is an
// etcd lease that outlives the test.
func (e *tpEnv) rawMember(r *keyshardtest.Server, pool, id, zone string) string {
	e.t.Helper()
	api := e.api(r)
	j, err := api.JoinPool(e.ctx, connect.NewRequest(&keyshardv1.JoinPoolRequest{Pool: pool, Member: &keyshardv1.Member{Id: id, Address: id + ":80", Zone: zone}}))
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := api.PoolKeepAlive(e.ctx, connect.NewRequest(&keyshardv1.PoolKeepAliveRequest{Session: j.Msg.GetSession()})); err != nil {
		e.t.Fatal(err)
	}
	return j.Msg.GetSession()
}

func mapUnion[V any](a, b map[string]V) map[string]bool {
	out := make(map[string]bool, len(a)+len(b))
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

// TestTenantPoolLongPoll: GetPoolSnapshot with since_version answers at
// once (changed) when the version is above since_version; with no newer
// version it holds the call until the wait has passed on the server's
// clock, and then answers unchanged, with the current snapshot; a new
// version within the wait answers at once.
func TestTenantPoolLongPoll(t *testing.T) {
	e := newTPEnv(t, 1)
	l := e.leader()
	e.putPool(l, &keyshardv1.TenantPool{Name: "gw", Policy: &keyshardv1.TenantPoolPolicy{
		CapacityPerMember: 1, Window: durationpb.New(2 * time.Second), ShrinkCooldown: durationpb.New(2 * time.Second),
	}})
	api := e.api(l)
	for i := range 3 {
		e.rawMember(l, "gw", fmt.Sprintf("m%d", i), "")
	}
	v := e.stepUntilState(l, "gw", "three members placed", 20, func(st tenantpool.State) bool { return len(st.Members) == 3 }).Version
	poll := func(since uint64, wait time.Duration) (*keyshardv1.GetPoolSnapshotResponse, error) {
		resp, err := api.GetPoolSnapshot(e.ctx, connect.NewRequest(&keyshardv1.GetPoolSnapshotRequest{Pool: "gw", SinceVersion: since, Wait: durationpb.New(wait)}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}

	// Above since_version: at once, though the clock stands still.
	at := e.clk.Now()
	resp, err := poll(v-1, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetChanged() || resp.GetSnapshot().GetVersion() != v || !resp.GetSnapshot().GetFull() || len(resp.GetSnapshot().GetMembers()) != 3 {
		t.Fatalf("since %d: changed %v, version %d, full %v; want the full snapshot of version %d, changed", v-1, resp.GetChanged(), resp.GetSnapshot().GetVersion(), resp.GetSnapshot().GetFull(), v)
	}
	if !e.clk.Now().Equal(at) {
		t.Fatal("the clock moved")
	}

	// Nothing changes any more: the state is stable.
	for range 2 {
		e.step(l)
	}
	if got := e.state("gw").Version; got != v {
		t.Fatalf("version %d with nothing to change; want %d", got, v)
	}

	// No newer version: held for the wait, on the server's clock.
	const wait = 10 * time.Second
	type answer struct {
		resp *keyshardv1.GetPoolSnapshotResponse
		err  error
		at   time.Time
	}
	done := make(chan answer, 1)
	start := e.clk.Now()
	waiters := e.clk.Waiters()
	go func() {
		resp, err := poll(v, wait)
		done <- answer{resp, err, e.clk.Now()}
	}()
	// The server's timer of the wait (or, if another timer came first,
	// the checks below are weaker, never wrong: the server's timer starts
	// at start or later).
	if err := e.clk.BlockUntilContext(e.ctx, waiters+1); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < int(wait/time.Second); i++ {
		e.step(l)
		select {
		case a := <-done:
			t.Fatalf("the long poll answered %v (%v) after %v of its %v wait", a.resp, a.err, e.clk.Now().Sub(start), wait)
		default:
		}
	}
	var a answer
	e.stepUntil(l, "the long poll's answer", 20, func() bool {
		select {
		case a = <-done:
			return true
		default:
			return false
		}
	})
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.resp.GetChanged() || a.resp.GetSnapshot().GetVersion() != v || !a.resp.GetSnapshot().GetFull() {
		t.Fatalf("after the wait: changed %v, version %d; want the unchanged snapshot of version %d", a.resp.GetChanged(), a.resp.GetSnapshot().GetVersion(), v)
	}
	if a.at.Sub(start) < wait {
		t.Fatalf("answered %v into a wait of %v", a.at.Sub(start), wait)
	}

	// A new version within the wait: answered with it.
	start = e.clk.Now()
	go func() {
		resp, err := poll(v, time.Minute)
		done <- answer{resp, err, e.clk.Now()}
	}()
	e.rawMember(l, "gw", "m3", "")
	e.stepUntil(l, "the long poll's answer to a new version", 20, func() bool {
		select {
		case a = <-done:
			return true
		default:
			return false
		}
	})
	if a.err != nil || !a.resp.GetChanged() || a.resp.GetSnapshot().GetVersion() <= v || len(a.resp.GetSnapshot().GetMembers()) != 4 {
		t.Fatalf("a new version in the wait: %v, %v; want changed, the fourth member placed", a.resp, a.err)
	}
	if a.at.Sub(start) >= time.Minute {
		t.Fatalf("answered %v into a wait of 1m", a.at.Sub(start))
	}
}
