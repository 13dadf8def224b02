package hotkey

import (
	"strconv"
	"testing"
	"time"
)

// zipfKeys pre-generates n Zipf(1.1) keys over a million ranks.
func zipfKeys(n int) [][]byte {
	zs := newZipfStream(7, 1.1, 1_000_000, 1)
	keys := make([][]byte, n)
	for i := range keys {
		k, _ := zs.next()
		keys[i] = append([]byte(nil), k...)
	}
	return keys
}

// BenchmarkObserveZipf: a 10,000-key detector on a Zipf(1.1) stream at
// about 1M msg/s of simulated time (a new timestamp every message).
func BenchmarkObserveZipf(b *testing.B) {
	d, err := NewDetector(DetectorConfig{Threshold: 1000, Capacity: 10_000})
	if err != nil {
		b.Fatal(err)
	}
	keys := zipfKeys(1 << 16)
	b.ReportAllocs()
	b.ReportMetric(float64(d.MemoryBytes()), "detector-bytes")
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		d.Observe(keys[i&(1<<16-1)], t0.Add(time.Duration(i)*time.Microsecond))
	}
}

// BenchmarkObserveUnique: the adversary, a fresh key with every message
// (every observation evicts).
func BenchmarkObserveUnique(b *testing.B) {
	d, err := NewDetector(DetectorConfig{Threshold: 1000, Capacity: 10_000})
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 0, 32)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		buf = strconv.AppendUint(append(buf[:0], "fresh:"...), uint64(i), 10)
		d.Observe(buf, t0.Add(time.Duration(i)*time.Microsecond))
	}
}

// BenchmarkDecide: the whole policy (detector, rules, sticky set) on a
// Zipf(1.1) stream with a few rules, after warm-up.
func BenchmarkDecide(b *testing.B) {
	rules, err := ParseRules("drop token:abc\ndead-letter bad:*\noverflow user:42\njunk anonymous,null,undefined\nskip-stateful k9*")
	if err != nil {
		b.Fatal(err)
	}
	p, err := NewPolicy(PolicyConfig{
		Detector: DetectorConfig{Threshold: 1000, Capacity: 10_000},
		Rules:    rules,
	})
	if err != nil {
		b.Fatal(err)
	}
	keys := zipfKeys(1 << 16)
	for i := 0; i < 1<<20; i++ { // warm up: hot keys enter overflow
		p.Decide(keys[i&(1<<16-1)], t0.Add(time.Duration(i)*time.Microsecond))
	}
	start := 1 << 20
	b.ReportAllocs()
	b.ResetTimer()
	for i := start; b.Loop(); i++ {
		p.Decide(keys[i&(1<<16-1)], t0.Add(time.Duration(i)*time.Microsecond))
	}
	b.StopTimer()
	if c := p.Counters(); c.Outcome(Overflow) == 0 || c.Outcome(Main) == 0 {
		b.Fatalf("no mix of outcomes: %+v", c)
	}
}

func BenchmarkRulesLookup(b *testing.B) {
	rules, err := ParseRules("drop token:abc\ndead-letter bad:*\noverflow user:42,user:43,user:44\njunk anonymous,null,undefined")
	if err != nil {
		b.Fatal(err)
	}
	keys := [][]byte{[]byte("user:42"), []byte("k123456"), []byte("NULL"), []byte("bad:x")}
	for i := 0; b.Loop(); i++ {
		rules.Lookup(keys[i&3])
	}
}
