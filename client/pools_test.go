package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/placement"
)

// poolMembers returns pool members m0..m(n-1), in zones z0..z(zones-1).
func poolMembers(n, zones int) []*keyshardv1.Member {
	out := make([]*keyshardv1.Member, n)
	for i := range out {
		out[i] = &keyshardv1.Member{Id: fmt.Sprintf("m%d", i), Address: fmt.Sprintf("m%d:9000", i), Weight: 1, Zone: fmt.Sprintf("z%d", i%zones)}
	}
	return out
}

// assignment is a tenant served by members since ever, all of them read.
func assignment(tenant string, members ...string) *keyshardv1.TenantAssignment {
	a := &keyshardv1.TenantAssignment{Tenant: tenant, Size: uint32(len(members))}
	for _, m := range members {
		a.Members = append(a.Members, &keyshardv1.TenantPlacement{Member: m})
	}
	a.Targets = []*keyshardv1.TargetSpan{{Members: slices.Sorted(slices.Values(members))}}
	return a
}

// randomSnapshot returns a snapshot of version v with a random subset of
// tenants t0..t49, each on random members.
func randomSnapshot(rng *rand.Rand, v uint64, members []*keyshardv1.Member) *keyshardv1.PoolSnapshot {
	s := &keyshardv1.PoolSnapshot{Pool: "gw", Version: v, Full: true, Members: members,
		Policy: &keyshardv1.TenantPoolPolicy{CapacityPerMember: 100, MinSize: 2}}
	for i := range 50 {
		if rng.IntN(3) == 0 {
			continue
		}
		var ms []string
		for _, j := range rng.Perm(len(members))[:1+rng.IntN(3)] {
			ms = append(ms, members[j].GetId())
		}
		slices.Sort(ms)
		a := assignment(fmt.Sprintf("t%d", i), ms...)
		if rng.IntN(4) == 0 { // a removal within the lookback
			gone := members[rng.IntN(len(members))].GetId()
			if !slices.Contains(ms, gone) {
				a.Removed = []*keyshardv1.TenantRemoval{{Member: gone}}
				a.Targets[0].Members = slices.Sorted(slices.Values(append(slices.Clone(ms), gone)))
			}
		}
		s.Tenants = append(s.Tenants, a)
	}
	return s
}

func followPool(t *testing.T, c *Client, pool string, opts ...PoolOption) *PoolFollower {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	f, err := c.FollowPool(ctx, pool, opts...)
	if err != nil {
		t.Fatalf("FollowPool: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func waitVersion(t *testing.T, f *PoolFollower, v uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := f.WaitVersion(ctx, v); err != nil {
		t.Fatalf("waiting for version %d (have %d): %v", v, f.Version(), err)
	}
}

// sameAnswers fails t unless f answers as a snapshot built from full.
func sameAnswers(t *testing.T, f *PoolFollower, full *keyshardv1.PoolSnapshot) {
	t.Helper()
	empty := &poolSnap{tenants: map[string]*poolTenant{}, byMem: map[string][]string{}}
	want, err := buildPoolSnap(empty, full)
	if err != nil {
		t.Fatal(err)
	}
	now := f.clock.Now()
	for i := range 60 {
		tenant := fmt.Sprintf("t%d", i)
		if got, w := f.Targets(tenant), want.targets(tenant, now); !slices.Equal(got, w) {
			t.Errorf("v%d: Targets(%s) = %v, want %v", full.GetVersion(), tenant, got, w)
		}
		for _, m := range full.GetMembers() {
			if got, w := f.Serves(m.GetId(), tenant), want.serves(m.GetId(), tenant); got != w {
				t.Errorf("v%d: Serves(%s, %s) = %v, want %v", full.GetVersion(), m.GetId(), tenant, got, w)
			}
		}
	}
	for _, m := range full.GetMembers() {
		if got, w := f.Tenants(m.GetId()), want.byMem[m.GetId()]; !slices.Equal(got, w) {
			t.Errorf("v%d: Tenants(%s) = %v, want %v", full.GetVersion(), m.GetId(), got, w)
		}
	}
}

func TestPoolFollowerAppliesDeltas(t *testing.T) {
	fk := newFake(t)
	c := fk.dial(t)
	rng := rand.New(rand.NewPCG(1, 2))
	members := poolMembers(6, 1)
	fk.SetPoolSnapshot(randomSnapshot(rng, 1, members))
	f := followPool(t, c, "gw")
	sameAnswers(t, f, fk.PoolSnapshot("gw"))
	fk.PoolWatches().Next(t) // the stream is open: later versions come as deltas
	for v := uint64(2); v <= 30; v++ {
		fk.SetPoolSnapshot(randomSnapshot(rng, v, members))
		waitVersion(t, f, v)
		sameAnswers(t, f, fk.PoolSnapshot("gw"))
	}
	if n := fk.CallCount(keyshardv1connect.TenantPoolServiceWatchPoolSnapshotProcedure); n != 1 {
		t.Errorf("%d watches; want the one stream throughout", n)
	}
}

func TestPoolFollowerFallsBackToLongPolls(t *testing.T) {
	fk := newFake(t)
	c := fk.dial(t)
	fk.Fail(keyshardv1connect.TenantPoolServiceWatchPoolSnapshotProcedure, connect.NewError(connect.CodeUnimplemented, errors.New("no streams here")))
	fk.SetPoolSnapshot(&keyshardv1.PoolSnapshot{Pool: "gw", Version: 1, Members: poolMembers(3, 1), Tenants: []*keyshardv1.TenantAssignment{assignment("a", "m0")}})
	f := followPool(t, c, "gw")
	fk.PoolPolls().Next(t) // the first read
	fk.PoolWatches().Next(t)
	// The watch failed: the follower waits its backoff, then long polls.
	fk.Clock().MustBlockUntil(t, 1)
	fk.Clock().Advance(backoffCap)
	if r := fk.PoolPolls().Next(t); r.GetSinceVersion() != 1 {
		t.Fatalf("long poll since %d; want 1", r.GetSinceVersion())
	}
	fk.SetPoolSnapshot(&keyshardv1.PoolSnapshot{Pool: "gw", Version: 2, Members: poolMembers(3, 1), Tenants: []*keyshardv1.TenantAssignment{assignment("a", "m1", "m2")}})
	waitVersion(t, f, 2)
	if got := f.Targets("a"); !slices.Equal(got, []string{"m1", "m2"}) {
		t.Errorf("Targets(a) = %v after the long poll; want [m1 m2]", got)
	}
	if since, err := f.Stale(); !since.IsZero() {
		t.Errorf("Stale() = %v, %v; the long polls answer", since, err)
	}
}

func TestPoolFollowerStaleThenRecovers(t *testing.T) {
	fk := newFake(t)
	c := fk.dial(t)
	events := make(chan PoolEvent, 16)
	fk.SetPoolSnapshot(&keyshardv1.PoolSnapshot{Pool: "gw", Version: 1, Members: poolMembers(3, 1), Tenants: []*keyshardv1.TenantAssignment{assignment("a", "m0", "m2")}})
	f := followPool(t, c, "gw", OnPoolEvent(func(e PoolEvent) {
		if e.Kind != PoolUpdated {
			events <- e
		}
	}))
	fk.PoolWatches().Next(t)
	down := fk.Clock().Now()
	fk.SetPoolsUnavailable(true)
	e := recv(t, events, "the stale event")
	if e.Kind != PoolStale || !errors.Is(e.Err, ErrUnavailable) || e.Version != 1 {
		t.Fatalf("event %+v; want PoolStale at version 1 wrapping ErrUnavailable", e)
	}
	since, err := f.Stale()
	if !since.Equal(down) || !errors.Is(err, ErrUnavailable) {
		t.Errorf("Stale() = %v, %v; want %v and ErrUnavailable", since, err, down)
	}
	if got := f.Targets("a"); !slices.Equal(got, []string{"m0", "m2"}) {
		t.Errorf("Targets(a) = %v while stale; want the last snapshot's [m0 m2]", got)
	}
	fk.SetPoolsUnavailable(false)
	fk.Clock().MustBlockUntil(t, 1) // the backoff
	fk.Clock().Advance(backoffCap)
	if e := recv(t, events, "the recovered event"); e.Kind != PoolRecovered {
		t.Fatalf("event %+v; want PoolRecovered", e)
	}
	if since, err := f.Stale(); !since.IsZero() || err != nil {
		t.Errorf("Stale() = %v, %v after recovery; want zero", since, err)
	}
}

func TestPoolTargetsOverTime(t *testing.T) {
	fk := newFake(t)
	c := fk.dial(t)
	t0 := fk.Clock().Now()
	// m3 joined at t0 and warms up until t0+30s; m0 left at t0-10s and is
	// read until its lookback ends at t0+50s.
	a := &keyshardv1.TenantAssignment{
		Tenant: "a", Size: 3,
		Members: []*keyshardv1.TenantPlacement{{Member: "m1"}, {Member: "m2"}, {Member: "m3", Added: timestamppb.New(t0)}},
		Removed: []*keyshardv1.TenantRemoval{{Member: "m0", At: timestamppb.New(t0.Add(-10 * time.Second))}},
		Targets: []*keyshardv1.TargetSpan{
			{Members: []string{"m0", "m1", "m2"}},
			{From: timestamppb.New(t0.Add(30 * time.Second)), Members: []string{"m0", "m1", "m2", "m3"}},
			{From: timestamppb.New(t0.Add(50 * time.Second)), Members: []string{"m1", "m2", "m3"}},
		},
	}
	fk.SetPoolSnapshot(&keyshardv1.PoolSnapshot{Pool: "gw", Version: 1, Members: poolMembers(4, 1), Tenants: []*keyshardv1.TenantAssignment{a}})
	f := followPool(t, c, "gw")
	for _, tc := range []struct {
		at   time.Duration
		want []string
	}{
		{-time.Hour, []string{"m0", "m1", "m2"}},
		{0, []string{"m0", "m1", "m2"}},
		{30*time.Second - 1, []string{"m0", "m1", "m2"}},
		{30 * time.Second, []string{"m0", "m1", "m2", "m3"}},
		{50 * time.Second, []string{"m1", "m2", "m3"}},
		{time.Hour, []string{"m1", "m2", "m3"}},
	} {
		if got := f.TargetsAt("a", t0.Add(tc.at)); !slices.Equal(got, tc.want) {
			t.Errorf("TargetsAt(a, t0%+v) = %v, want %v", tc.at, got, tc.want)
		}
	}
	fk.Clock().Advance(40 * time.Second) // Targets reads the follower's clock
	if got := f.Targets("a"); !slices.Equal(got, []string{"m0", "m1", "m2", "m3"}) {
		t.Errorf("Targets(a) at t0+40s = %v", got)
	}
	for _, m := range []string{"m0", "m1", "m2", "m3"} {
		if !f.Serves(m, "a") {
			t.Errorf("Serves(%s, a) = false; every target serves", m)
		}
	}
	if got := f.Tenants("m0"); !slices.Equal(got, []string{"a"}) {
		t.Errorf("Tenants(m0) = %v; a removed member within the lookback serves", got)
	}
}

// TestPoolRemovedBeforeRead: a member removed from a subset before it was
// read (m3, warming) is no target, but serves the tenant for the lookback
// (clients a version behind start reading it when its warm-up ends), and
// a draining member's read-until counts it: the later of its lookback and
// the end of a read removal's span.
func TestPoolRemovedBeforeRead(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := &keyshardv1.TenantAssignment{
		Tenant: "a", Size: 2,
		Members: []*keyshardv1.TenantPlacement{{Member: "m1"}, {Member: "m2"}, {Member: "m3"}},
		Removed: []*keyshardv1.TenantRemoval{{Member: "m3", At: timestamppb.New(t0)}},
		Targets: []*keyshardv1.TargetSpan{{Members: []string{"m1", "m2"}}},
	}
	b := &keyshardv1.TenantAssignment{
		Tenant: "b", Size: 2,
		Members: []*keyshardv1.TenantPlacement{{Member: "m1"}, {Member: "m2"}, {Member: "m3"}},
		Removed: []*keyshardv1.TenantRemoval{{Member: "m3", At: timestamppb.New(t0.Add(-time.Second))}},
		Targets: []*keyshardv1.TargetSpan{
			{Members: []string{"m1", "m2", "m3"}},
			{From: timestamppb.New(t0.Add(9 * time.Second)), Members: []string{"m1", "m2"}},
		},
	}
	ms := poolMembers(4, 1)
	ms[3].Weight = 0
	snap, err := buildPoolSnap(&poolSnap{}, &keyshardv1.PoolSnapshot{
		Pool: "gw", Version: 1, Full: true, Members: ms, Tenants: []*keyshardv1.TenantAssignment{a, b},
		Policy: &keyshardv1.TenantPoolPolicy{MinSize: 2, Lookback: durationpb.New(10 * time.Second)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !snap.serves("m3", "a") || slices.Contains(snap.targets("a", t0.Add(5*time.Second)), "m3") {
		t.Errorf("m3 on a: serves %v, targets %v; want serving and no target", snap.serves("m3", "a"), snap.targets("a", t0.Add(5*time.Second)))
	}
	if got, want := snap.readUntil("m3"), t0.Add(10*time.Second); !got.Equal(want) {
		t.Errorf("readUntil(m3) = %v, want %v: a's lookback outlasts b's span", got, want)
	}
	b.Targets[1].From = timestamppb.New(t0.Add(12 * time.Second))
	if snap, err = buildPoolSnap(snap, &keyshardv1.PoolSnapshot{Pool: "gw", Version: 2, Members: ms, Tenants: []*keyshardv1.TenantAssignment{b}}); err != nil {
		t.Fatal(err)
	}
	if got, want := snap.readUntil("m3"), t0.Add(12*time.Second); !got.Equal(want) {
		t.Errorf("readUntil(m3) = %v, want %v: b's span outlasts a's lookback", got, want)
	}
}

func TestPoolUnknownTenantFallback(t *testing.T) {
	for _, tc := range []struct {
		name      string
		zones     int
		zoneAware bool
		min, max  uint32
		overrides map[string]*keyshardv1.TenantOverride
		tenant    string
		size      int // the initial size expected
	}{
		{name: "min size", zones: 1, min: 3, tenant: "x", size: 3},
		{name: "default min", zones: 1, tenant: "x", size: 1},
		{name: "zones ignored", zones: 3, min: 2, tenant: "x", size: 2},
		{name: "zone aware rounds up", zones: 3, zoneAware: true, min: 2, tenant: "x", size: 3},
		{name: "zone aware capped by max", zones: 3, zoneAware: true, min: 5, max: 4, tenant: "x", size: 3},
		{name: "fixed override", zones: 3, zoneAware: true, min: 2, tenant: "big", size: 5,
			overrides: map[string]*keyshardv1.TenantOverride{"big": {Size: 5}}},
		{name: "min override", zones: 1, min: 1, tenant: "big", size: 4,
			overrides: map[string]*keyshardv1.TenantOverride{"big": {MinSize: 4}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fk := newFake(t)
			c := fk.dial(t)
			members := poolMembers(9, tc.zones)
			members[4].Weight = 0 // draining: in no stateless subset
			fk.SetPoolSnapshot(&keyshardv1.PoolSnapshot{Pool: "gw", Version: 1, Members: members,
				Policy: &keyshardv1.TenantPoolPolicy{CapacityPerMember: 1, MinSize: tc.min, MaxSize: tc.max, ZoneAware: tc.zoneAware, Overrides: tc.overrides}})
			f := followPool(t, c, "gw")
			var pm []placement.Member
			for _, m := range members {
				z := ""
				if tc.zoneAware {
					z = m.GetZone()
				}
				pm = append(pm, placement.Member{ID: m.GetId(), Weight: m.GetWeight(), Zone: z})
			}
			want, err := placement.Subset(tc.tenant, pm, tc.size)
			if err != nil {
				t.Fatal(err)
			}
			got := f.Targets(tc.tenant)
			if !slices.Equal(got, want) {
				t.Errorf("Targets(%s) = %v; want placement.Subset at size %d: %v", tc.tenant, got, tc.size, want)
			}
			for _, m := range members {
				if f.Serves(m.GetId(), tc.tenant) != slices.Contains(want, m.GetId()) {
					t.Errorf("Serves(%s, %s) disagrees with Targets", m.GetId(), tc.tenant)
				}
			}
			if f.Known(tc.tenant) || f.Targets("") != nil {
				t.Errorf("Known(%s) or Targets(\"\") wrong", tc.tenant)
			}
		})
	}
}

func TestPoolBadInput(t *testing.T) {
	fk := newFake(t)
	c := fk.dial(t)
	ctx := t.Context()
	check := func(err error, arg string) {
		t.Helper()
		var ae *ArgError
		if !errors.As(err, &ae) || ae.Arg != arg || !errors.Is(err, ErrInvalid) {
			t.Errorf("error %v; want an *ArgError naming %q", err, arg)
		}
	}
	_, err := c.FollowPool(ctx, "")
	check(err, "pool name")
	_, err = c.JoinPool(ctx, "", Member{ID: "m0"})
	check(err, "pool name")
	_, err = c.JoinPool(ctx, "gw", Member{})
	check(err, "Member.ID")
	_, err = c.NewLoadReporter("", "r1")
	check(err, "pool name")
	_, err = c.NewLoadReporter("gw", "")
	check(err, "reporter id")
	_, err = c.NewLoadReporter("gw", "r1", ReportInterval(-time.Second))
	check(err, "ReportInterval")
	r, err := c.NewLoadReporter("gw", "r1")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	check(r.Add("", 1), "tenant")
	check(r.Add(string(make([]byte, MaxTenantLen+1)), 1), "tenant")
	check(r.Add("a", -1), "n")
	_, err = c.FollowPool(ctx, "nope")
	if !errors.Is(err, ErrNotFound) {
		t.Errorf("FollowPool of a missing pool: %v; want ErrNotFound", err)
	}
}

func TestLoadReporterRetriesTheSameSeq(t *testing.T) {
	fk := newFake(t)
	fk.PutTenantPool("gw", nil, 0)
	c := fk.dial(t)
	events := make(chan PoolEvent, 16)
	r, err := c.NewLoadReporter("gw", "r1", OnPoolEvent(func(e PoolEvent) { events <- e }))
	if err != nil {
		t.Fatal(err)
	}
	mustAdd := func(tenant string, n int64) {
		t.Helper()
		if err := r.Add(tenant, n); err != nil {
			t.Fatal(err)
		}
	}
	mustAdd("a", 3)
	mustAdd("b", 1)
	mustAdd("a", 2)
	fk.LoseReportAnswers(1) // counted, but the answer is lost
	fk.Clock().MustBlockUntil(t, 1)
	fk.Clock().Advance(DefaultReportInterval)
	first := fk.LoadReports().Next(t)
	if first.GetSeq() != 1 || counts(first)["a"] != 5 || counts(first)["b"] != 1 {
		t.Fatalf("first report: seq %d counts %v; want seq 1, a=5 b=1", first.GetSeq(), counts(first))
	}
	if e := reported(t, events, 1); !errors.Is(e.Err, ErrUnavailable) {
		t.Fatalf("report 1: %v; want ErrUnavailable (the answer lost)", e.Err)
	}
	mustAdd("a", 10) // after the failed report: goes into seq 2
	fk.Clock().MustBlockUntil(t, 1)
	fk.Clock().Advance(DefaultReportInterval)
	again := fk.LoadReports().Next(t)
	if again.GetSeq() != 1 || !slices.Equal(sortedCounts(again), sortedCounts(first)) || !again.GetTime().AsTime().Equal(first.GetTime().AsTime()) {
		t.Fatalf("retry: seq %d counts %v; want seq 1 with the same counts and time", again.GetSeq(), counts(again))
	}
	next := fk.LoadReports().Next(t)
	if next.GetSeq() != 2 || counts(next)["a"] != 10 || len(next.GetCounts()) != 1 {
		t.Fatalf("next report: seq %d counts %v; want seq 2, a=10", next.GetSeq(), counts(next))
	}
	for seq := uint64(1); seq <= 2; seq++ {
		if e := reported(t, events, seq); e.Err != nil {
			t.Fatalf("report %d: %v", seq, e.Err)
		}
	}
	if got := fk.PoolLoad("gw"); got["a"] != 15 || got["b"] != 1 {
		t.Errorf("counted %v; want a=15 b=1 (the replay not counted twice)", got)
	}
	st := r.Stats()
	if st.Replayed != 1 || st.Failures != 1 || st.DroppedCounts != 0 || st.Seq != 2 {
		t.Errorf("stats %+v; want 1 replayed, 1 failure, nothing dropped, seq 2", st)
	}

	// Close flushes; with the control plane down its counts are dropped,
	// and said so.
	mustAdd("c", 7)
	fk.SetUnavailable(true)
	err = r.Close()
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("Close with the control plane down: %v; want ErrUnavailable", err)
	}
	if e := reported(t, events, 3); !errors.Is(e.Err, ErrUnavailable) {
		t.Errorf("report 3: %v; want ErrUnavailable", e.Err)
	}
	if e := recv(t, events, "the dropped event"); e.Kind != PoolReportDropped || e.Dropped != 7 || e.Seq != 3 {
		t.Errorf("event %+v; want PoolReportDropped of 7", e)
	}
	if st := r.Stats(); st.DroppedCounts != 7 || st.DroppedReports != 1 {
		t.Errorf("stats after Close %+v; want 7 counts dropped in 1 report", st)
	}
	if err := r.Add("c", 1); !errors.Is(err, ErrClosed) {
		t.Errorf("Add after Close: %v; want ErrClosed", err)
	}
}

func TestLoadReporterDropsRefusedReports(t *testing.T) {
	fk := newFake(t)
	fk.PutTenantPool("gw", nil, 0)
	c := fk.dial(t)
	events := make(chan PoolEvent, 16)
	r, err := c.NewLoadReporter("gw", "r1", OnPoolEvent(func(e PoolEvent) { events <- e }))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Add("a", 4)
	fk.FailNext(keyshardv1connect.TenantPoolServiceReportLoadProcedure, 1, connect.NewError(connect.CodeInvalidArgument, errors.New("counts[0]: bad")))
	fk.Clock().MustBlockUntil(t, 1)
	fk.Clock().Advance(DefaultReportInterval)
	if e := recv(t, events, "the dropped event"); e.Kind != PoolReportDropped || e.Dropped != 4 || !errors.Is(e.Err, ErrInvalid) {
		t.Fatalf("event %+v; want 4 dropped, ErrInvalid", e)
	}
	reported(t, events, 1)
	if st := r.Stats(); st.DroppedCounts != 4 || st.DroppedReports != 1 || st.Pending != 0 {
		t.Errorf("stats %+v; want 4 counts dropped, nothing pending", st)
	}
	r.Add("a", 1)
	fk.Clock().MustBlockUntil(t, 1)
	fk.Clock().Advance(DefaultReportInterval)
	if e := reported(t, events, 2); e.Err != nil || fk.PoolLoad("gw")["a"] != 1 {
		t.Fatalf("report 2: %v, counted %v; want a=1", e.Err, fk.PoolLoad("gw"))
	}
	if s := r.Stats().Seq; s != 2 {
		t.Errorf("seq %d; the dropped report kept seq 1", s)
	}
}

func TestLoadReporterBatches(t *testing.T) {
	fk := newFake(t)
	fk.PutTenantPool("gw", nil, 0)
	c := fk.dial(t)
	events := make(chan PoolEvent, 16)
	r, err := c.NewLoadReporter("gw", "r1", OnPoolEvent(func(e PoolEvent) { events <- e }))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	const tenants = 2*MaxPoolBatch + 5
	for i := range tenants {
		r.Add(fmt.Sprintf("t%d", i), int64(i%7+1))
	}
	fk.Clock().MustBlockUntil(t, 1)
	fk.Clock().Advance(DefaultReportInterval)
	seen := 0
	for seq := uint64(1); seq <= 3; seq++ {
		rep := fk.LoadReports().Next(t)
		if rep.GetSeq() != seq || len(rep.GetCounts()) > MaxPoolBatch {
			t.Fatalf("report seq %d with %d counts; want seq %d with at most %d", rep.GetSeq(), len(rep.GetCounts()), seq, MaxPoolBatch)
		}
		seen += len(rep.GetCounts())
	}
	if seen != tenants {
		t.Errorf("%d counts sent; want %d", seen, tenants)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		if e := reported(t, events, seq); e.Err != nil {
			t.Fatalf("report %d: %v", seq, e.Err)
		}
	}
	load := fk.PoolLoad("gw")
	for i := range tenants {
		if n := load[fmt.Sprintf("t%d", i)]; n != int64(i%7+1) {
			t.Fatalf("t%d counted %d; want %d", i, n, i%7+1)
		}
	}
}

func TestLoadReporterAddConcurrent(t *testing.T) {
	fk := newFake(t)
	fk.PutTenantPool("gw", nil, 0)
	c := fk.dial(t)
	r, err := c.NewLoadReporter("gw", "r1")
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, adds = 8, 2000
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range adds {
				if err := r.Add(fmt.Sprintf("t%d", (g+i)%10), 1); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	// A report in the middle of the adds.
	fk.Clock().MustBlockUntil(t, 1)
	fk.Clock().Advance(DefaultReportInterval)
	wg.Wait()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, n := range fk.PoolLoad("gw") {
		total += n
	}
	if total != goroutines*adds {
		t.Errorf("counted %d; want %d", total, goroutines*adds)
	}
}

func TestPoolMemberRejoinsAndMarksReady(t *testing.T) {
	fk := newFake(t)
	fk.PutTenantPool("gw", nil, 9*time.Second)
	var tenants []*keyshardv1.TenantAssignment
	var names []string
	for i := range MaxPoolBatch + 2 {
		name := fmt.Sprintf("t%05d", i)
		names = append(names, name)
		tenants = append(tenants, assignment(name, "m0"))
	}
	fk.SetPoolSnapshot(&keyshardv1.PoolSnapshot{Pool: "gw", Version: 1, Members: poolMembers(2, 1), Tenants: tenants})
	c := fk.dial(t)
	events := make(chan PoolEvent, 8)
	m, err := c.JoinPool(t.Context(), "gw", Member{ID: "m0", Address: "m0:9000"}, OnPoolEvent(func(e PoolEvent) {
		if e.Kind == PoolJoined || e.Kind == PoolSessionLost {
			events <- e
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	if e := recv(t, events, "joined"); e.Kind != PoolJoined || e.Session != "ps1" {
		t.Fatalf("event %+v; want joined ps1", e)
	}
	if !m.Serves("t00000") || m.Serves("zz") != slices.Contains(m.Follower().Targets("zz"), "m0") || len(m.Tenants()) != len(names) {
		t.Errorf("Serves/Tenants wrong: %d tenants", len(m.Tenants()))
	}
	ready, err := m.MarkReady(t.Context(), append(names, "other")...)
	if err != nil || ready.Marked != len(names) || ready.Ignored != 1 {
		t.Fatalf("MarkReady = %+v, %v; want %d marked, 1 ignored", ready, err, len(names))
	}
	if a, b := fk.Readies().Next(t), fk.Readies().Next(t); len(a.GetTenants()) != MaxPoolBatch || len(b.GetTenants()) != 3 {
		t.Errorf("MarkReady batches of %d and %d; want %d and 3", len(a.GetTenants()), len(b.GetTenants()), MaxPoolBatch)
	}
	if _, err := m.MarkReady(t.Context(), "a", ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("MarkReady with an empty tenant: %v", err)
	}

	// The session ends at the server: the next keep-alive finds it gone,
	// and the member joins again.
	fk.EndPoolSession("ps1")
	// The keep-alive's sleep, a third of the TTL (the follower's stream is
	// open). Not any timer: while the first keep-alive is still on its way
	// (a busy machine), its call's deadline, the whole TTL, is one too.
	fk.Clock().MustBlockUntilDue(t, 1, 3*time.Second)
	fk.Clock().Advance(3 * time.Second)
	if e := recv(t, events, "lost"); e.Kind != PoolSessionLost || !errors.Is(e.Err, ErrSessionLost) || !errors.Is(e.Err, ErrNotFound) {
		t.Fatalf("event %+v; want session lost, not found", e)
	}
	if e := recv(t, events, "re-joined"); e.Kind != PoolJoined || e.Session != "ps2" {
		t.Fatalf("event %+v; want joined ps2", e)
	}
	if got := fk.PoolSessions("gw"); got["m0"] != "ps2" || m.Session() != "ps2" {
		t.Errorf("sessions %v, member's %q; want ps2", got, m.Session())
	}
	// Drained already (weight 0, no tenant): Leave ends the session.
	drained := poolMembers(2, 1)
	drained[0].Weight = 0
	fk.SetPoolSnapshot(&keyshardv1.PoolSnapshot{Pool: "gw", Version: 2, Members: drained})
	if err := m.Leave(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := fk.PoolSessions("gw"); len(got) != 0 {
		t.Errorf("sessions %v after Leave", got)
	}
}

// leaveMember joins m0 to a pool where it serves tenant "a" (with m1)
// and starts its Leave with ctx; it returns the fake, the member, its
// events and Leave's result.
func leaveMember(t *testing.T, ctx context.Context) (fake, *PoolMember, chan PoolEvent, chan error) {
	fk := newFake(t)
	fk.SetPoolSnapshot(&keyshardv1.PoolSnapshot{Pool: "gw", Version: 1, Members: poolMembers(3, 1),
		Tenants: []*keyshardv1.TenantAssignment{assignment("a", "m0", "m1"), assignment("b", "m1", "m2")}})
	c := fk.dial(t)
	events := make(chan PoolEvent, 16)
	m, err := c.JoinPool(t.Context(), "gw", Member{ID: "m0"}, OnPoolEvent(func(e PoolEvent) {
		switch e.Kind {
		case PoolDraining, PoolLeft, PoolSessionLost, PoolJoined:
			events <- e
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	recv(t, events, "joined")
	res := make(chan error, 1)
	go func() { res <- m.Leave(ctx) }()
	if e := recv(t, events, "draining"); e.Kind != PoolDraining || e.Tenants != 1 || e.Session != "ps1" {
		t.Fatalf("event %+v; want draining, 1 tenant", e)
	}
	if !fk.PoolLeaving("ps1") || fk.PoolSessions("gw")["m0"] != "ps1" {
		t.Fatalf("after LeavePool: leaving %v, sessions %v; want ps1 leaving and alive", fk.PoolLeaving("ps1"), fk.PoolSessions("gw"))
	}
	return fk, m, events, res
}

// TestPoolMemberLeaveDrains: Leave keeps the session while the snapshot
// still lists the member, reports the progress, and ends the session
// once no tenant lists it.
func TestPoolMemberLeaveDrains(t *testing.T) {
	fk, _, events, res := leaveMember(t, t.Context())
	t0 := fk.Clock().Now()
	members := poolMembers(3, 1)
	members[0].Weight = 0
	moved := &keyshardv1.TenantAssignment{Tenant: "a", Size: 2,
		Members: []*keyshardv1.TenantPlacement{{Member: "m0"}, {Member: "m1"}, {Member: "m2", Added: timestamppb.New(t0)}},
		Removed: []*keyshardv1.TenantRemoval{{Member: "m0", At: timestamppb.New(t0)}},
		Targets: []*keyshardv1.TargetSpan{{Members: []string{"m0", "m1", "m2"}}, {From: timestamppb.New(t0.Add(20 * time.Second)), Members: []string{"m1", "m2"}}},
	}
	fk.SetPoolSnapshot(&keyshardv1.PoolSnapshot{Pool: "gw", Version: 2, Members: members, Tenants: []*keyshardv1.TenantAssignment{moved, assignment("b", "m1", "m2")}})
	if e := recv(t, events, "draining"); e.Kind != PoolDraining || e.Tenants != 1 || !e.Until.Equal(t0.Add(20*time.Second)) || e.Version != 2 {
		t.Fatalf("event %+v; want draining, 1 tenant until t0+20s at version 2", e)
	}
	select {
	case err := <-res:
		t.Fatalf("Leave returned %v while a tenant still reads the member", err)
	default:
	}
	if fk.PoolSessions("gw")["m0"] != "ps1" {
		t.Fatalf("the session ended while draining")
	}
	fk.SetPoolSnapshot(&keyshardv1.PoolSnapshot{Pool: "gw", Version: 3, Members: members, Tenants: []*keyshardv1.TenantAssignment{assignment("a", "m1", "m2"), assignment("b", "m1", "m2")}})
	if err := recv(t, res, "Leave"); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	if e := recv(t, events, "left"); e.Kind != PoolLeft || e.Err != nil {
		t.Fatalf("event %+v; want left, no error", e)
	}
	if got := fk.PoolSessions("gw"); len(got) != 0 {
		t.Errorf("sessions %v after Leave", got)
	}
}

// TestPoolMemberLeaveCtx: when ctx ends before the drain, Leave ends the
// session at once and says reads may miss.
func TestPoolMemberLeaveCtx(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	fk, m, events, res := leaveMember(t, ctx)
	cancel()
	err := recv(t, res, "Leave")
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "may miss") || !strings.Contains(err.Error(), "1 tenants") {
		t.Fatalf("Leave = %v; want context.Canceled, saying reads may miss for 1 tenant", err)
	}
	if e := recv(t, events, "left"); e.Kind != PoolLeft || !errors.Is(e.Err, context.Canceled) {
		t.Fatalf("event %+v; want left with ctx's error", e)
	}
	if got := fk.PoolSessions("gw"); len(got) != 0 {
		t.Errorf("sessions %v after Leave", got)
	}
	if err := m.Leave(t.Context()); err != nil {
		t.Errorf("second Leave: %v", err)
	}
}

// TestPoolMemberLeaveLost: a session lost while draining is not joined
// again; Leave returns ErrSessionLost.
func TestPoolMemberLeaveLost(t *testing.T) {
	fk, _, events, res := leaveMember(t, t.Context())
	fk.EndPoolSession("ps1")
	// Move the clock a second at a time until the next keep-alive finds
	// the session gone: the one waiter may be the first keep-alive's call
	// budget or the sleep after it, which cannot be told apart.
	deadline := time.After(10 * time.Second)
	for done := false; !done; {
		select {
		case err := <-res:
			if !errors.Is(err, ErrSessionLost) {
				t.Fatalf("Leave = %v; want ErrSessionLost", err)
			}
			done = true
			continue
		case <-deadline:
			t.Fatal("timed out waiting for Leave")
		default:
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
		if fk.Clock().BlockUntilContext(ctx, 1) == nil {
			fk.Clock().Advance(time.Second)
		}
		cancel()
	}
	for e := recv(t, events, "lost"); e.Kind != PoolLeft; e = recv(t, events, "left") {
		if e.Kind == PoolJoined {
			t.Fatalf("re-joined while leaving: %+v", e)
		}
	}
	if got := fk.PoolSessions("gw"); len(got) != 0 {
		t.Errorf("sessions %v after Leave", got)
	}
}

// reported returns the PoolReported event of report seq, skipping the
// events before it.
func reported(t *testing.T, events <-chan PoolEvent, seq uint64) PoolEvent {
	t.Helper()
	for {
		e := recv(t, events, fmt.Sprintf("report %d", seq))
		if e.Kind == PoolReported && e.Seq == seq {
			return e
		}
	}
}

func counts(r *keyshardv1.ReportLoadRequest) map[string]int64 {
	out := map[string]int64{}
	for _, c := range r.GetCounts() {
		out[c.GetTenant()] += c.GetCount()
	}
	return out
}

func sortedCounts(r *keyshardv1.ReportLoadRequest) []string {
	var out []string
	for _, c := range r.GetCounts() {
		out = append(out, fmt.Sprintf("%s=%d", c.GetTenant(), c.GetCount()))
	}
	slices.Sort(out)
	return out
}

func BenchmarkPoolTargets(b *testing.B) {
	members := poolMembers(50, 1)
	snap := &keyshardv1.PoolSnapshot{Pool: "gw", Version: 1, Full: true, Members: members, Policy: &keyshardv1.TenantPoolPolicy{CapacityPerMember: 1, MinSize: 3}}
	now := time.Now()
	for i := range 10000 {
		a := assignment(fmt.Sprintf("t%d", i), "m1", "m2", "m3")
		a.Targets = append(a.Targets, &keyshardv1.TargetSpan{From: timestamppb.New(now.Add(time.Hour)), Members: []string{"m1", "m2", "m3", "m4"}})
		snap.Tenants = append(snap.Tenants, a)
	}
	empty := &poolSnap{tenants: map[string]*poolTenant{}, byMem: map[string][]string{}}
	s, err := buildPoolSnap(empty, snap)
	if err != nil {
		b.Fatal(err)
	}
	c, err := Dial("http://127.0.0.1:1")
	if err != nil {
		b.Fatal(err)
	}
	f := &PoolFollower{c: c, clock: c.Clock()}
	f.cur.Store(s)
	b.Run("known", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if len(f.Targets("t1234")) != 3 {
				b.Fatal("wrong targets")
			}
		}
	})
	b.Run("unknown", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if len(f.Targets("nobody")) != 3 {
				b.Fatal("wrong targets")
			}
		}
	})
}

func BenchmarkLoadReporterAdd(b *testing.B) {
	c, err := Dial("http://127.0.0.1:1")
	if err != nil {
		b.Fatal(err)
	}
	r, err := c.NewLoadReporter("gw", "r1", ReportInterval(time.Hour))
	if err != nil {
		b.Fatal(err)
	}
	tenants := make([]string, 100)
	for i := range tenants {
		tenants[i] = fmt.Sprintf("t%d", i)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			_ = r.Add(tenants[i%len(tenants)], 1)
			i++
		}
	})
	b.StopTimer()
	c.Close()
	r.Close()
}

func TestPoolFollowerMovesOffARefusingReplica(t *testing.T) {
	fk := newFake(t)
	r := fk.AddReplica()
	r.Refuse()
	c, err := Dial(r.URL()+","+fk.URL(), Clock(fk.Clock()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fk.SetPoolSnapshot(&keyshardv1.PoolSnapshot{Pool: "gw", Version: 1, Members: poolMembers(2, 1), Tenants: []*keyshardv1.TenantAssignment{assignment("a", "m0")}})
	f := followPool(t, c, "gw")
	fk.PoolWatches().Next(t) // the stream opened on the replica that serves
	fk.SetPoolSnapshot(&keyshardv1.PoolSnapshot{Pool: "gw", Version: 2, Members: poolMembers(2, 1), Tenants: []*keyshardv1.TenantAssignment{assignment("a", "m1")}})
	waitVersion(t, f, 2)
	if got := f.Targets("a"); !slices.Equal(got, []string{"m1"}) {
		t.Errorf("Targets(a) = %v; want [m1]", got)
	}
	if r.CallCount(keyshardv1connect.TenantPoolServiceGetPoolSnapshotProcedure) != 1 {
		t.Errorf("the refusing replica was asked %d times; want once", r.CallCount(keyshardv1connect.TenantPoolServiceGetPoolSnapshotProcedure))
	}
}

func TestPoolMemberRejoinsAfterKeepAlivesFailForTheTTL(t *testing.T) {
	fk := newFake(t)
	fk.PutTenantPool("gw", nil, 9*time.Second)
	fk.SetPoolSnapshot(&keyshardv1.PoolSnapshot{Pool: "gw", Version: 1, Members: poolMembers(1, 1)})
	c := fk.dial(t)
	events := make(chan PoolEvent, 64)
	m, err := c.JoinPool(t.Context(), "gw", Member{ID: "m0"}, OnPoolEvent(func(e PoolEvent) {
		if e.Kind == PoolJoined || e.Kind == PoolSessionLost {
			events <- e
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	recv(t, events, "joined")
	fk.PoolWatches().Next(t) // the follower's stream is open: the member's timers are the only ones
	fk.Fail(keyshardv1connect.TenantPoolServicePoolKeepAliveProcedure, connect.NewError(connect.CodeUnavailable, errors.New("cut off")))
	// Move time on until the member gives its session up: its keep-alives
	// fail, and once the TTL since the last one answered has run out it
	// counts the session lost.
	start := fk.Clock().Now()
	var lost PoolEvent
	for lost.Kind == 0 {
		select {
		case lost = <-events:
		default:
			fk.Clock().MustBlockUntil(t, 1)
			fk.Clock().Advance(500 * time.Millisecond)
		}
	}
	if lost.Kind != PoolSessionLost || !errors.Is(lost.Err, ErrSessionLost) || fk.Clock().Since(start) < 9*time.Second-3*time.Second {
		t.Fatalf("after %v: %+v; want the session lost once the TTL since the last keep-alive ran out", fk.Clock().Since(start), lost)
	}
	// The re-join is served at once.
	if e := recv(t, events, "re-joined"); e.Kind != PoolJoined || e.Session != "ps2" {
		t.Fatalf("event %+v; want joined ps2", e)
	}
	fk.PoolJoins().Next(t)
	if !fk.PoolJoins().Next(t).GetReplace() {
		t.Errorf("a re-join must replace the session it lost")
	}
}
