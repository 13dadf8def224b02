package tenantpool

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/keyshard/keyshard/placement"
)

// TestStaleReadersReachServingMembers is the lookback's promise, version
// by version: a client still holding a State for up to the lookback after
// a later one replaced it reads only members that serve the tenant by the
// newest State. It drives a pool through joins, drains, departures, load
// steps and readiness marks (each round and each MarkReady is a version),
// and checks at every version every target that an older version, replaced
// less than the lookback ago, gives from now until its lookback ends: of a
// member still alive, the newest State must list it as serving the tenant.
// (A member whose session ended is dropped from everything at once, by
// design: it is not checked.) It also checks that a serve-only removal is
// no read target, and that a drained member's ReadUntil covers it.
func TestStaleReadersReachServingMembers(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) { staleReaders(t, seed) })
	}
}

// heldSnapshot is a replaced version some client may still hold, until
// the lookback after it was replaced.
type heldSnapshot struct {
	snap  *Snapshot
	until time.Time
}

func staleReaders(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	p := goodPolicy()
	p.ZoneAware, p.MinSize = true, 3
	p.ShrinkCooldown, p.MaxShrinkStep = 8*time.Second, 3
	p.Lookback, p.WarmUp = 4*time.Second, 4*time.Second
	rates := map[string]float64{}
	for i := range 60 {
		rates[fmt.Sprintf("t%02d", i)] = float64(5 + i%7*10)
	}
	ms := pool(10, 3)
	next := len(ms)
	pl := NewPlanner(State{})
	now := t0
	first, _, err := pl.Plan(ms, rates, p, now)
	if err != nil {
		t.Fatal(err)
	}
	cur := NewSnapshot(first)
	var held []heldSnapshot
	checked, serveOnly := 0, 0
	// publish replaces cur by the State st, as of now, and checks it.
	publish := func(what string, st State) {
		t.Helper()
		snap := NewSnapshot(st)
		held = append(held, heldSnapshot{cur, now.Add(p.Lookback)})
		held = slices.DeleteFunc(held, func(h heldSnapshot) bool { return !now.Before(h.until) })
		cur = snap
		alive := map[string]bool{}
		for _, m := range ms {
			alive[m.ID] = true
		}
		for _, h := range held {
			for _, id := range sortedKeys(rates) {
				times := []time.Time{now}
				for _, sp := range h.snap.Spans(id) {
					if sp.From.After(now) && sp.From.Before(h.until) {
						times = append(times, sp.From)
					}
				}
				for _, at := range times {
					for _, m := range h.snap.Targets(id, at) {
						if !alive[m] {
							continue
						}
						checked++
						if !snap.Serves(m, id) {
							t.Fatalf("%s at %v: a client holding version %d reads %s from %s at +%v, which version %d does not serve it from: %+v %+v",
								what, now.Sub(t0), h.snap.Version(), id, m, at.Sub(now), st.Version, st.Tenants[id].Members, st.Tenants[id].Removed)
						}
					}
				}
			}
		}
		for _, id := range sortedKeys(st.Tenants) {
			for _, r := range st.Tenants[id].Removed {
				if !r.ServeOnly {
					continue
				}
				serveOnly++
				for _, sp := range snap.Spans(id) {
					if slices.Contains(sp.Members, r.ID) {
						t.Fatalf("%s: serve-only %s of %s is a target from %v", what, r.ID, id, sp.From)
					}
				}
				if until, ok := snap.ReadUntil(r.ID); ok && until.Before(r.At.Add(p.Lookback)) {
					t.Fatalf("%s: ReadUntil(%s) = %v, before its serve-only removal from %s ends at %v", what, r.ID, until, id, r.At.Add(p.Lookback))
				}
			}
		}
	}
	for round := range 150 {
		now = now.Add(time.Duration(200+rng.IntN(2800)) * time.Millisecond)
		switch r := rng.IntN(10); {
		case r < 3 && len(ms) < 25: // a member joins
			ms = append(ms, placement.Member{ID: fmt.Sprintf("m%03d", next), Weight: 1, Zone: fmt.Sprintf("z%d", next%3)})
			next++
		case r < 5 && len(ms) > 6: // a member drains (a graceful leave)
			i := rng.IntN(len(ms))
			ms = slices.Clone(ms)
			ms[i].Weight = 0
		case r < 6: // a drained member's session ends
			for i, m := range ms {
				if m.Weight == 0 {
					ms = slices.Delete(slices.Clone(ms), i, i+1)
					break
				}
			}
		case r < 8: // a load step
			rates[fmt.Sprintf("t%02d", rng.IntN(60))] = float64(rng.IntN(200))
		}
		st, ch, err := pl.Plan(ms, rates, p, now)
		if err != nil {
			t.Fatal(err)
		}
		if ch.Visible {
			publish(fmt.Sprintf("round %d", round), st)
		}
		// Some placements report ready, a little later.
		now = now.Add(time.Duration(rng.IntN(500)) * time.Millisecond)
		var marks []Ready
		for _, id := range sortedKeys(st.Tenants) {
			for _, m := range st.Tenants[id].Members {
				if !m.Ready && !m.Added.IsZero() && rng.IntN(4) == 0 {
					marks = append(marks, Ready{m.ID, id})
				}
			}
		}
		st, n, err := pl.MarkReady(marks)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			publish(fmt.Sprintf("marks after round %d", round), st)
		}
	}
	t.Logf("%d (version, tenant, member) reads checked; %d serve-only removals seen", checked, serveOnly)
	if checked == 0 || serveOnly == 0 {
		t.Fatal("nothing checked, or no serve-only removal: the test checks nothing of them")
	}
}
