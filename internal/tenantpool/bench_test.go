package tenantpool

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkAggregate: 100,000 tenants reported by 100 reporters every
// second, each reporter splitting its counts into reports of
// DefaultMaxCounts. One op is one report-tenant entry.
func BenchmarkAggregate(b *testing.B) {
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
		now := t0.Add(time.Duration(sec) * time.Second)
		for r := 0; r < reporters && entries < b.N; r++ {
			for _, cs := range batches {
				seq[r]++
				if _, err := a.Add(Report{Reporter: reps[r], Seq: seq[r], Time: now, Counts: cs}, now); err != nil {
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
