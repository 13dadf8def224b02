package tenantpool

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/keyshard/keyshard/placement"
)

// BenchmarkAggregate: 100,000 tenants reported by 100 reporters every
// second, each reporter splitting its counts into reports of
// DefaultMaxCounts. One op is one report-tenant entry.
func BenchmarkAggregate(b *testing.B) { benchAggregate(b, 0) }

// BenchmarkAggregatePeriod: the same reports, each saying it covers the
// 5s since the previous one (a bucket of the default window): every
// count is spread over two buckets.
func BenchmarkAggregatePeriod(b *testing.B) { benchAggregate(b, 5*time.Second) }

func benchAggregate(b *testing.B, period time.Duration) {
	const tenants, reporters = 100_000, 100
	a, err := NewAggregator(AggregatorConfig{})
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, tenants)
	for i := range ids {
		ids[i] = fmt.Sprintf("tenant-%06d", i)
	}
	var batches [][]Count
	for i := 0; i < tenants; i += DefaultMaxCounts {
		cs := make([]Count, DefaultMaxCounts)
		for j := range cs {
			cs[j] = Count{ids[i+j], int64(j%17 + 1)}
		}
		batches = append(batches, cs)
	}
	seq := make([]uint64, reporters)
	reps := make([]string, reporters)
	for i := range reps {
		reps[i] = fmt.Sprintf("reporter-%03d", i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	entries, sec := 0, 0
	for entries < b.N {
		now := t0.Add(time.Duration(sec)*time.Second + 1500*time.Millisecond)
		for r := 0; r < reporters && entries < b.N; r++ {
			for _, cs := range batches {
				seq[r]++
				if _, err := a.Add(Report{Reporter: reps[r], Seq: seq[r], Time: now, Counts: cs, Period: period}, now); err != nil {
					b.Fatal(err)
				}
				entries += len(cs)
			}
		}
		sec++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(entries), "ns/entry")
}

func BenchmarkRates100k(b *testing.B) {
	a, _ := NewAggregator(AggregatorConfig{})
	cs := make([]Count, 0, DefaultMaxCounts)
	seq := uint64(0)
	for i := range 100_000 {
		cs = append(cs, Count{fmt.Sprintf("tenant-%06d", i), 5})
		if len(cs) == DefaultMaxCounts {
			seq++
			a.Add(Report{Reporter: "r", Seq: seq, Time: t0, Counts: cs}, t0)
			cs = cs[:0]
		}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		a.Rates(t0.Add(time.Duration(i) * time.Millisecond))
	}
}

func benchState(b *testing.B, tenants int) State {
	p := goodPolicy()
	p.ZoneAware = true
	rates := map[string]float64{}
	for i := range tenants {
		rates[fmt.Sprintf("tenant-%06d", i)] = float64(i % 300)
	}
	st, _, err := Plan(State{}, pool(100, 3), rates, p, t0)
	if err != nil {
		b.Fatal(err)
	}
	return st
}

func BenchmarkTargets(b *testing.B) {
	st := benchState(b, 10_000)
	snap := NewSnapshot(st)
	ids := make([]string, 0, len(st.Tenants))
	for id := range st.Tenants {
		ids = append(ids, id)
	}
	now := t0.Add(time.Hour)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if len(snap.Targets(ids[i%len(ids)], now)) == 0 {
			b.Fatal("no targets")
		}
		i++
	}
}

func BenchmarkServes(b *testing.B) {
	st := benchState(b, 10_000)
	snap := NewSnapshot(st)
	ids := make([]string, 0, len(st.Tenants))
	for id := range st.Tenants {
		ids = append(ids, id)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		snap.Serves("m042", ids[i%len(ids)])
		i++
	}
}

// BenchmarkPlan100k: one steady round over 100,000 tenants and 100 members.
func BenchmarkPlan100k(b *testing.B) {
	st := benchState(b, 100_000)
	rates := map[string]float64{}
	for id := range st.Tenants {
		rates[id] = 10
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, _, err := Plan(st, st.Members, rates, st.Policy, t0.Add(time.Duration(i+1)*time.Second)); err != nil {
			b.Fatal(err)
		}
	}
}

// planRound is one round of a planning implementation, for the benchmarks
// that compare the Planner with the reference.
type planRound func(st State, ms []placement.Member, rates map[string]float64, p Policy, now time.Time) (State, Changes, error)

func benchRates(st State, rate float64) map[string]float64 {
	rates := make(map[string]float64, len(st.Tenants))
	for id := range st.Tenants {
		rates[id] = rate
	}
	return rates
}

// benchSteady: a round in which no size changes.
func benchSteady(b *testing.B, planner bool) {
	st := benchState(b, 100_000)
	rates := benchRates(st, 10)
	pl := NewPlanner(Clone(st))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		now := t0.Add(time.Duration(i+1) * time.Second)
		var err error
		if planner {
			_, _, err = pl.Plan(st.Members, rates, st.Policy, now)
		} else {
			_, _, err = planReference(st, st.Members, rates, st.Policy, now)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}

// benchOnePercent: a round in which 1% of the tenants grow.
func benchOnePercent(b *testing.B, planner bool) {
	st := benchState(b, 100_000)
	ids := sortedKeys(st.Tenants)
	rates := map[string]float64{}
	for i, id := range ids {
		rates[id] = float64(i % 300)
	}
	pl := NewPlanner(Clone(st))
	b.ReportAllocs()
	sizes := 0
	for i := 0; b.Loop(); i++ {
		now := t0.Add(time.Duration(i+1) * time.Second)
		for j := i % 100; j < len(ids); j += 100 {
			rates[ids[j]] += 30 // +3 members
		}
		var ch Changes
		var err error
		if planner {
			_, ch, err = pl.Plan(st.Members, rates, st.Policy, now)
		} else {
			_, ch, err = planReference(st, st.Members, rates, st.Policy, now)
		}
		if err != nil {
			b.Fatal(err)
		}
		sizes += len(ch.Sizes)
	}
	b.ReportMetric(float64(sizes)/float64(b.N), "sizes/op")
}

// benchMembers: a round after one member left (leave) or joined.
func benchMembers(b *testing.B, planner, leave bool) {
	st := benchState(b, 100_000)
	rates := map[string]float64{}
	ids := sortedKeys(st.Tenants)
	for i, id := range ids {
		rates[id] = float64(i % 300)
	}
	ms := slices.Clone(st.Members)
	if leave {
		ms = slices.Delete(ms, 42, 43)
	} else {
		ms = append(ms, placement.Member{ID: "m100", Weight: 1, Zone: "z1"})
	}
	b.ReportAllocs()
	b.ResetTimer()
	moved := 0
	for i := 0; i < b.N; i++ {
		var ch Changes
		var err error
		if planner {
			b.StopTimer()
			pl := NewPlanner(Clone(st))
			b.StartTimer()
			_, ch, err = pl.Plan(ms, rates, st.Policy, t0.Add(time.Second))
		} else {
			_, ch, err = planReference(st, ms, rates, st.Policy, t0.Add(time.Second))
		}
		if err != nil {
			b.Fatal(err)
		}
		moved += len(ch.Subsets)
	}
	b.ReportMetric(float64(moved)/float64(b.N), "subsets/op")
}

func BenchmarkPlanner100kSteady(b *testing.B)     { benchSteady(b, true) }
func BenchmarkPlanner100kOnePercent(b *testing.B) { benchOnePercent(b, true) }
func BenchmarkPlanner100kLeave(b *testing.B)      { benchMembers(b, true, true) }
func BenchmarkPlanner100kJoin(b *testing.B)       { benchMembers(b, true, false) }

// The same rounds by the reference implementation (Plan before the
// Planner), for comparison.
func BenchmarkReference100kSteady(b *testing.B)     { benchSteady(b, false) }
func BenchmarkReference100kOnePercent(b *testing.B) { benchOnePercent(b, false) }
func BenchmarkReference100kLeave(b *testing.B)      { benchMembers(b, false, true) }
func BenchmarkReference100kJoin(b *testing.B)       { benchMembers(b, false, false) }
