package tenantpool

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/keyshard/keyshard/placement"
)

func pool(n, zones int) []placement.Member {
	ms := make([]placement.Member, n)
	for i := range ms {
		ms[i] = placement.Member{ID: fmt.Sprintf("m%03d", i), Weight: 1, Zone: fmt.Sprintf("z%d", i%zones)}
	}
	return ms
}

func mustPlan(t *testing.T, prev State, ms []placement.Member, rates map[string]float64, p Policy, now time.Time) (State, Changes) {
	t.Helper()
	st, ch, err := Plan(prev, ms, rates, p, now)
	if err != nil {
		t.Fatal(err)
	}
	return st, ch
}

// TestScenario is the discussion's: 50 requests/s at capacity 10 is 5
// members (6 rounded up for 3 zones), whatever the pool does as it grows
// 10 → 100 → 10 members: never 0 or 1, never following the pool. By
// default (RebalanceMoves 0) it keeps every member throughout. When
// balance is sought, about 90% of every member's load must move to the
// new members (see TestGrowthMovesOnlyWhatBalanceNeeds), so the tenant
// keeps its size but not, in general, its members: the test only logs
// how many it keeps.
func TestScenario(t *testing.T) {
	for _, tc := range []struct{ zones, rebalance int }{{1, 0}, {3, 0}, {1, 50}, {3, 50}} {
		zones := tc.zones
		t.Run(fmt.Sprintf("zones=%d,rebalance=%d", zones, tc.rebalance), func(t *testing.T) {
			p := goodPolicy()
			p.ZoneAware = zones > 1
			p.RebalanceMoves = tc.rebalance
			want, why := 5, "new tenant: rate 50/s × headroom 1 / capacity 10 → 5"
			if zones == 3 {
				want, why = 6, why+", rounded up to 6 for 3 zones"
			}
			rates := map[string]float64{"a": 50}
			for i := range 200 {
				rates[fmt.Sprintf("bg%03d", i)] = float64(10 * (i%7 + 1))
			}
			var st State
			now := t0
			var first []string
			minKept, moves := want, 0
			pools := []int{10, 10, 25, 50, 100, 100, 100, 100, 100, 100, 50, 25, 10, 10}
			for round, n := range pools {
				now = now.Add(time.Minute)
				var ch Changes
				st, ch = mustPlan(t, st, pool(n, zones), rates, p, now)
				if round > 0 && len(ch.Sizes) > 0 {
					t.Fatalf("pool %d: sizes followed the pool: %+v", n, ch.Sizes)
				}
				for _, c := range ch.Subsets {
					if round > 0 {
						moves += len(c.Added)
					}
				}
				a := st.Tenants["a"]
				if a.Size.Size != want || len(a.Members) != want {
					t.Fatalf("pool %d: size %d with %d members, want %d", n, a.Size.Size, len(a.Members), want)
				}
				if a.Why != why {
					t.Fatalf("pool %d: why %q, want %q", n, a.Why, why)
				}
				if first == nil {
					first = placementIDs(a.Members)
				}
				kept := 0
				for _, m := range placementIDs(a.Members) {
					if slices.Contains(first, m) {
						kept++
					}
				}
				minKept = min(minKept, kept)
			}
			t.Logf("kept at least %d of its %d first members; the pool moved %d placements in all", minKept, want, moves)
			switch {
			case tc.rebalance == 0 && (moves != 0 || minKept != want):
				t.Fatalf("RebalanceMoves 0: moved %d placements, kept %d of %d members; want nothing moved", moves, minKept, want)
			case tc.rebalance > 0 && moves == 0:
				t.Fatal("nothing rebalanced as the pool grew")
			}
		})
	}
}

func TestExplain(t *testing.T) {
	p := goodPolicy()
	p.Headroom, p.ZoneAware = 1.2, true
	st, _ := mustPlan(t, State{}, pool(12, 3), map[string]float64{"t": 52}, p, t0)
	want := "new tenant: rate 52/s × headroom 1.2 / capacity 10 → 7, rounded up to 9 for 3 zones"
	if got := st.Tenants["t"].Why; got != want {
		t.Fatalf("why %q, want %q", got, want)
	}
}

// TestSizing: a 2× step grows within one window of the Aggregator; a drop
// shrinks only after the cooldown (and not much later); overrides win. The
// rates come from reports of two reporters through a real Aggregator.
func TestSizing(t *testing.T) {
	p := goodPolicy()
	p.ShrinkCooldown = 5 * time.Minute
	p.MaxShrinkStep = 100
	const window = time.Minute
	agg, err := NewAggregator(AggregatorConfig{Window: window, Buckets: 12})
	if err != nil {
		t.Fatal(err)
	}
	ms := pool(30, 1)
	var st State
	// size reports perSec requests of t in the last second, half from each
	// reporter, and runs a round.
	size := func(sec int, perSec int64) int {
		now := t0.Add(time.Duration(sec) * time.Second)
		for i, rep := range []string{"c1", "c2"} {
			n := perSec / 2
			if i == 0 {
				n = perSec - n
			}
			if o, err := agg.Add(Report{Reporter: rep, Seq: uint64(sec), Time: now, Counts: []Count{{"t", n}}}, now); err != nil || o != Counted {
				t.Fatalf("second %d: %v, %v", sec, o, err)
			}
		}
		st, _ = mustPlan(t, st, ms, agg.Rates(now), p, now)
		return st.Tenants["t"].Size.Size
	}
	sec := 1
	for ; sec <= 120; sec++ {
		if got := size(sec, 50); sec > 15 && got != 5 { // the first bucket is partial
			t.Fatalf("second %d at 50/s: size %d, want 5", sec, got)
		}
	}
	// 2× step: the size rises from the first complete bucket on, and
	// reaches 10 within one window.
	step, first, full := sec, 0, 0
	prev := 5
	for ; sec < step+int(window/time.Second); sec++ {
		got := size(sec, 100)
		switch {
		case got < prev:
			t.Fatalf("second %d after the step: size %d → %d", sec-step, prev, got)
		case got > 5 && first == 0:
			first = sec - step
		}
		if got == 10 && full == 0 {
			full = sec - step
		}
		prev = got
	}
	t.Logf("2× step: size rose after %ds, reached 10 after %ds", first, full)
	if full == 0 {
		t.Fatalf("2× step: still size %d after a window of %v", prev, window)
	}
	if bucket := int(window / 12 / time.Second); first > 2*bucket {
		t.Fatalf("2× step: size rose only after %ds", first)
	}
	for ; sec <= 300; sec++ {
		size(sec, 100)
	}
	// Drop to 20/s: the wanted size falls within the window, the size only
	// after the cooldown, then at once to 2 (MaxShrinkStep 100).
	drop := sec
	shrunk := 0
	for ; sec <= drop+600; sec++ {
		if got := size(sec, 20); got < 10 && shrunk == 0 {
			shrunk = sec - drop
		}
	}
	t.Logf("drop: shrank after %ds (cooldown %v)", shrunk, p.ShrinkCooldown)
	cooldown := int(p.ShrinkCooldown / time.Second)
	if shrunk < cooldown || shrunk > cooldown+int(window/time.Second) {
		t.Fatalf("shrank %ds after the drop; want after the cooldown of %v, within a window of it", shrunk, p.ShrinkCooldown)
	}
	if got := st.Tenants["t"].Size.Size; got != 2 {
		t.Fatalf("after the drop: size %d, want 2", got)
	}
	// An override wins at once, both ways.
	p.Overrides = map[string]Override{"t": {Size: 12}}
	if got := size(sec, 20); got != 12 {
		t.Fatalf("fixed 12: size %d", got)
	}
	p.Overrides = map[string]Override{"t": {Size: 1}}
	if got := size(sec+1, 20); got != 1 {
		t.Fatalf("fixed 1: size %d, want 1 at once, without the cooldown", got)
	}
	p.Overrides = map[string]Override{"t": {MinSize: 4}}
	if got := size(sec+2, 20); got != 4 {
		t.Fatalf("min 4 at 20/s: size %d", got)
	}
	// A maximum caps a growth: at 1000/s (100 members' worth), 6.
	p.Overrides = map[string]Override{"t": {MaxSize: 6}}
	sec += 3
	for end := sec + 20; sec < end; sec++ {
		if got := size(sec, 1000); got > 6 {
			t.Fatalf("max 6 at 1000/s: size %d", got)
		}
	}
	if got := st.Tenants["t"].Size.Size; got != 6 {
		t.Fatalf("max 6 at 1000/s: size %d, want 6", got)
	}
}

// TestLookbackAndWarmUp: after a shrink the removed member stays a read
// target for the lookback; after a growth the new member is read only once
// ready or warm.
func TestLookbackAndWarmUp(t *testing.T) {
	p := goodPolicy()
	p.ShrinkCooldown, p.Lookback, p.WarmUp, p.MaxShrinkStep = 0, time.Minute, 30*time.Second, 10
	ms := pool(20, 1)
	st, _ := mustPlan(t, State{}, ms, map[string]float64{"t": 30}, p, t0)
	old := placementIDs(st.Tenants["t"].Members)
	if len(old) != 3 {
		t.Fatalf("size %d, want 3", len(old))
	}
	// Grow to 5: two new members, not read before ready or warm.
	now := t0.Add(time.Minute)
	st, _ = mustPlan(t, st, ms, map[string]float64{"t": 50}, p, now)
	var added []string
	for _, m := range st.Tenants["t"].Members {
		if !slices.Contains(old, m.ID) {
			added = append(added, m.ID)
		}
	}
	snap := NewSnapshot(st)
	if got := snap.Targets("t", now.Add(time.Second)); !cmp.Equal(got, old) {
		t.Fatalf("targets while warming %v, want the old members %v", got, old)
	}
	for _, m := range added {
		if !snap.Serves(m, "t") {
			t.Fatalf("%s does not serve t while warming: it would not load its data", m)
		}
	}
	st2, n, err := MarkReady(st, []Ready{{added[0], "t"}, {"nobody", "t"}, {added[0], "other"}})
	if err != nil || n != 1 || st2.Version <= st.Version {
		t.Fatalf("MarkReady: %d applied, version %d → %d, %v", n, st.Version, st2.Version, err)
	}
	if got := NewSnapshot(st2).Targets("t", now.Add(time.Second)); !cmp.Equal(got, sorted(append(slices.Clone(old), added[0]))) {
		t.Fatalf("targets after one ready %v", got)
	}
	if got := snap.Targets("t", now.Add(p.WarmUp)); len(got) != 5 {
		t.Fatalf("targets after the warm-up %v, want all 5", got)
	}
	// Shrink to 3 (cooldown 0: two rounds), once everyone is warm.
	now = now.Add(time.Minute)
	st, _ = mustPlan(t, st, ms, map[string]float64{"t": 30}, p, now)
	now = now.Add(time.Second)
	st, _ = mustPlan(t, st, ms, map[string]float64{"t": 30}, p, now)
	ts := st.Tenants["t"]
	if ts.Size.Size != 3 || len(ts.Removed) != 2 {
		t.Fatalf("after the shrink: size %d, removed %v", ts.Size.Size, ts.Removed)
	}
	snap = NewSnapshot(st)
	for _, r := range ts.Removed {
		if !slices.Contains(snap.Targets("t", now.Add(p.Lookback-time.Second)), r.ID) || !snap.Serves(r.ID, "t") {
			t.Fatalf("removed %s is not a target within the lookback", r.ID)
		}
		if slices.Contains(snap.Targets("t", now.Add(p.Lookback)), r.ID) {
			t.Fatalf("removed %s is still a target after the lookback", r.ID)
		}
	}
	st, _ = mustPlan(t, st, ms, map[string]float64{"t": 30}, p, now.Add(p.Lookback))
	if r := st.Tenants["t"].Removed; len(r) != 0 {
		t.Fatalf("removed %v kept after the lookback", r)
	}
}

// TestWholeSubsetReplaced: when every member of a tenant's subset drains
// at once, the new members are not read before they are ready or warm:
// the members they replaced stay the targets. (Reading the new subset at
// once would send reads to members that may not have seen their placement
// yet.) Once they are read, the replaced members leave the targets after
// the lookback.
func TestWholeSubsetReplaced(t *testing.T) {
	p := goodPolicy()
	p.Lookback, p.WarmUp = 10*time.Second, 30*time.Second
	ms := pool(6, 1)
	st, _ := mustPlan(t, State{}, ms, map[string]float64{"t": 30}, p, t0)
	now := t0.Add(time.Hour) // everyone warm
	st, _ = mustPlan(t, st, ms, map[string]float64{"t": 30}, p, now)
	old := placementIDs(st.Tenants["t"].Members)
	if len(old) != 3 {
		t.Fatalf("size %d, want 3", len(old))
	}
	drained := slices.Clone(ms)
	for i := range drained {
		if slices.Contains(old, drained[i].ID) {
			drained[i].Weight = 0
		}
	}
	now = now.Add(time.Second)
	st, _ = mustPlan(t, st, drained, map[string]float64{"t": 30}, p, now)
	added := placementIDs(st.Tenants["t"].Members)
	if len(added) != 3 || slices.ContainsFunc(added, func(id string) bool { return slices.Contains(old, id) }) {
		t.Fatalf("subset %v after draining %v", added, old)
	}
	snap := NewSnapshot(st)
	for _, at := range []time.Duration{0, p.Lookback, p.WarmUp - time.Nanosecond} {
		if got := snap.Targets("t", now.Add(at)); !cmp.Equal(got, old) {
			t.Fatalf("targets %v after the drain: %v, want the replaced members %v", at, got, old)
		}
	}
	if got := snap.Targets("t", now.Add(p.WarmUp)); !cmp.Equal(got, added) {
		t.Fatalf("targets once warm: %v, want %v", got, added)
	}
	// One new member ready: it is read, and the replaced ones for the
	// lookback from now on (the others are not read yet).
	st2, n, err := MarkReady(st, []Ready{{added[0], "t"}})
	if err != nil || n != 1 {
		t.Fatalf("MarkReady: %d applied, %v", n, err)
	}
	if got := NewSnapshot(st2).Targets("t", now.Add(time.Second)); !cmp.Equal(got, sorted(append(slices.Clone(old), added[0]))) {
		t.Fatalf("targets after one ready: %v", got)
	}
}

func sorted(s []string) []string { slices.Sort(s); return s }

// TestLeaderChange: a new leader planning from the persisted State (and
// an empty aggregator) keeps every size and subset.
func TestLeaderChange(t *testing.T) {
	p := goodPolicy()
	p.ZoneAware, p.ShrinkCooldown = true, 10*time.Minute
	ms := pool(30, 3)
	rates := map[string]float64{}
	for i := range 500 {
		rates[fmt.Sprintf("t%d", i)] = float64(i % 97)
	}
	var st State
	for i := range 3 {
		st, _ = mustPlan(t, st, ms, rates, p, t0.Add(time.Duration(i)*time.Minute))
	}
	// Shrink in progress for one tenant: its cooldown must survive.
	rates["t96"] = 0
	st, _ = mustPlan(t, st, ms, rates, p, t0.Add(3*time.Minute))
	buf, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var loaded State
	if err := json.Unmarshal(buf, &loaded); err != nil {
		t.Fatal(err)
	}
	now := t0.Add(4 * time.Minute)
	a, _ := mustPlan(t, st, ms, rates, p, now)
	b, ch := mustPlan(t, loaded, ms, rates, p, now)
	if d := cmp.Diff(sizesAndSubsets(a), sizesAndSubsets(b)); d != "" {
		t.Fatalf("new leader differs (-old +new):\n%s", d)
	}
	if ch.Visible || len(ch.Sizes) != 0 || len(ch.Subsets) != 0 {
		t.Fatalf("new leader changed something: %+v", ch)
	}
	if got := b.Tenants["t96"].Size; got.BelowSince.IsZero() {
		t.Fatalf("t96 lost its cooldown: %+v", got)
	}
}

func sizesAndSubsets(st State) map[string]string {
	out := map[string]string{}
	for id, ts := range st.Tenants {
		out[id] = fmt.Sprint(ts.Size.Size, placementIDs(ts.Members), ts.Removed)
	}
	return out
}

// TestAgree: for 10,000 tenants, Targets and Serves/Tenants give the same
// members from the same snapshot, known tenants or not.
func TestAgree(t *testing.T) {
	p := goodPolicy()
	p.ZoneAware, p.MinSize = true, 2
	ms := pool(60, 3)
	rates := map[string]float64{}
	for i := range 10_000 {
		rates[fmt.Sprintf("t%05d", i)] = float64(i % 300)
	}
	st, _ := mustPlan(t, State{}, ms, rates, p, t0)
	// Change the pool (five leave, ten join, one drains), so that there
	// are warming and removed members, and mark some of the new members
	// ready.
	ms2 := pool(70, 3)[5:]
	ms2[10].Weight = 0
	st, _ = mustPlan(t, st, ms2, rates, p, t0.Add(time.Minute))
	var marks []Ready
	for i, id := range sortedKeys(st.Tenants) {
		for _, m := range st.Tenants[id].Members {
			if !m.Added.IsZero() && i%2 == 0 {
				marks = append(marks, Ready{m.ID, id})
				break
			}
		}
	}
	st, _, err := MarkReady(st, marks)
	if err != nil || len(marks) == 0 {
		t.Fatal(len(marks), err)
	}
	snap := NewSnapshot(st)
	warming, ready, removed := 0, 0, 0
	served := map[string]map[string]bool{}
	for _, m := range st.Members {
		for _, tn := range snap.Tenants(m.ID) {
			if served[tn] == nil {
				served[tn] = map[string]bool{}
			}
			served[tn][m.ID] = true
		}
	}
	for i := range 10_100 { // 100 unknown tenants
		tn := fmt.Sprintf("t%05d", i)
		for _, at := range []time.Duration{0, time.Minute + 2*time.Second, time.Hour} {
			targets := snap.Targets(tn, t0.Add(at))
			if len(targets) == 0 {
				t.Fatalf("%s: targets %v", tn, targets)
			}
			for _, m := range targets {
				if !snap.Serves(m, tn) {
					t.Fatalf("%s: target %s does not serve it", tn, m)
				}
				if snap.Known(tn) && !served[tn][m] {
					t.Fatalf("%s: target %s does not list it in Tenants", tn, m)
				}
			}
		}
		for m := range served[tn] {
			if !snap.Serves(m, tn) {
				t.Fatalf("%s: Tenants(%s) lists it, Serves does not", tn, m)
			}
		}
		// Every member of the subset that is read (ready, warm or there
		// from the start) is a target, and so is every removed member
		// within the lookback.
		ts, ok := st.Tenants[tn]
		if !ok {
			continue
		}
		for _, at := range []time.Duration{0, time.Minute + 2*time.Second, time.Hour} {
			now := t0.Add(at)
			targets := snap.Targets(tn, now)
			for _, m := range ts.Members {
				if !snap.Serves(m.ID, tn) {
					t.Fatalf("%s: member %s of its subset does not serve it", tn, m.ID)
				}
				if !now.Before(m.readAt(p.WarmUp)) {
					if !slices.Contains(targets, m.ID) {
						t.Fatalf("%s at %v: %+v is read but not a target %v", tn, at, m, targets)
					}
				} else {
					warming++
				}
				if m.Ready && at == 0 {
					ready++
				}
			}
			for _, r := range ts.Removed {
				if now.Before(r.At.Add(p.Lookback)) {
					if !slices.Contains(targets, r.ID) {
						t.Fatalf("%s at %v: %s was removed within the lookback but is not a target %v", tn, at, r.ID, targets)
					}
					removed++
				}
			}
		}
	}
	t.Logf("checked %d warming, %d ready, %d removed (tenant, member) pairs", warming, ready, removed)
	if warming == 0 || ready == 0 || removed == 0 {
		t.Fatal("the snapshot lacks warming, ready or removed members: the test checks nothing of them")
	}
	// An unknown tenant gets the placement a first round gives it.
	next, _ := mustPlan(t, st, st.Members, map[string]float64{"new": 0}, p, t0.Add(2*time.Minute))
	if got, want := placementIDs(next.Tenants["new"].Members), snap.Targets("new", t0); !cmp.Equal(got, want) {
		t.Fatalf("new tenant placed on %v; clients read %v before", got, want)
	}
}

func TestPlanRefuses(t *testing.T) {
	p := goodPolicy()
	st, _ := mustPlan(t, State{}, pool(5, 1), map[string]float64{"a": 1}, p, t0)
	bad := []struct {
		field string
		ms    []placement.Member
		rates map[string]float64
		p     Policy
	}{
		{"CapacityPerMember", pool(5, 1), nil, Policy{}},
		{`rates["a"]`, pool(5, 1), map[string]float64{"a": -1}, p},
		{`rates[""]`, pool(5, 1), map[string]float64{"": 1}, p},
		{"members[1]", append(pool(5, 1), placement.Member{ID: "m000", Weight: 1}), nil, p},
	}
	for _, b := range bad {
		got, _, err := Plan(st, b.ms, b.rates, b.p, t0.Add(time.Minute))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != b.field {
			t.Errorf("%s: got %v", b.field, err)
		}
		if got.Version != st.Version {
			t.Errorf("%s: state changed on error", b.field)
		}
	}
	if _, _, err := MarkReady(st, []Ready{{"", "a"}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("MarkReady with an empty member: %v", err)
	}
}

// TestForget: an idle tenant is dropped after ForgetAfter and falls back
// to the stateless subset.
func TestForget(t *testing.T) {
	p := goodPolicy()
	p.ForgetAfter = time.Hour
	st, _ := mustPlan(t, State{}, pool(5, 1), map[string]float64{"a": 1}, p, t0)
	st, ch := mustPlan(t, st, pool(5, 1), nil, p, t0.Add(time.Minute))
	if _, ok := st.Tenants["a"]; !ok || ch.Visible || !slices.Equal(ch.Tenants, []string{"a"}) {
		t.Fatalf("idle tenant: %+v", ch)
	}
	st, ch = mustPlan(t, st, pool(5, 1), nil, p, t0.Add(time.Hour+time.Minute))
	if _, ok := st.Tenants["a"]; ok || !ch.Visible {
		t.Fatalf("idle tenant not forgotten: %+v", ch)
	}
}

// TestHold: a held round sizes nobody (a rate measured over part of a
// window is not read), adds no tenant, starts no idle time, but places
// members' joins and leaves, and clamps to the members available.
func TestHold(t *testing.T) {
	p := goodPolicy()
	p.ShrinkCooldown = time.Minute
	p.ForgetAfter = time.Minute
	members := pool(8, 1)
	pl := NewPlanner(State{})
	st, _, err := pl.Plan(members, map[string]float64{"a": 50, "b": 5}, p, t0)
	if err != nil {
		t.Fatal(err)
	}
	a, b := st.Tenants["a"], st.Tenants["b"]
	if a.Size.Size != 5 || b.Size.Size != 1 {
		t.Fatalf("sizes a=%d b=%d; want 5 and 1", a.Size.Size, b.Size.Size)
	}
	// Held for two forget periods, with a member leaving from a's subset:
	// a keeps its size, the leaver is replaced, b is not forgotten.
	gone := a.Members[0].ID
	var left []placement.Member
	for _, m := range members {
		if m.ID != gone {
			left = append(left, m)
		}
	}
	now := t0
	for range 3 {
		now = now.Add(time.Minute)
		if st, _, err = pl.Hold(left, p, now); err != nil {
			t.Fatal(err)
		}
	}
	a2, b2 := st.Tenants["a"], st.Tenants["b"]
	if a2.Size != a.Size || b2.Size != b.Size || !b2.IdleSince.IsZero() {
		t.Fatalf("held: a %+v (was %+v), b %+v (was %+v); want sizes and cooldowns unchanged, no idle time", a2.Size, a.Size, b2.Size, b.Size)
	}
	if len(a2.Members) != 5 || slices.ContainsFunc(a2.Members, func(m Placement) bool { return m.ID == gone }) {
		t.Fatalf("a's subset %+v; want 5 members without %s", a2.Members, gone)
	}
	// Only 3 members left: clamped; back to 8: grows back to what it wanted.
	if st, _, err = pl.Hold(members[:3], p, now.Add(time.Second)); err != nil || st.Tenants["a"].Size.Size != 3 {
		t.Fatalf("3 members: a's size %d (%v); want 3", st.Tenants["a"].Size.Size, err)
	}
	if st, _, err = pl.Hold(members, p, now.Add(2*time.Second)); err != nil || st.Tenants["a"].Size.Size != 5 {
		t.Fatalf("8 members again: a's size %d (%v); want 5", st.Tenants["a"].Size.Size, err)
	}
	if _, ok := st.Tenants["c"]; ok {
		t.Fatal("a held round added a tenant")
	}
}
