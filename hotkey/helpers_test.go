package hotkey

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"
)

// t0 is the start of simulated time in tests.
var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// at returns t0 + d.
func at(d time.Duration) time.Time { return t0.Add(d) }

// exactRates is the reference: exact exponentially decayed counts per key,
// with no memory bound. It uses a fixed landmark, so keep runs within a few
// dozen half-lives.
type exactRates struct {
	lambdaNs float64 // per ns
	lambda   float64 // per s
	l0       int64
	counts   map[string]float64
}

func newExactRates(halfLife time.Duration, start time.Time) *exactRates {
	tau := halfLife.Seconds() / math.Ln2
	return &exactRates{lambdaNs: 1 / (tau * 1e9), lambda: 1 / tau, l0: start.UnixNano(), counts: map[string]float64{}}
}

func (e *exactRates) add(key string, n float64, t time.Time) {
	e.counts[key] += n * math.Exp(float64(t.UnixNano()-e.l0)*e.lambdaNs)
}

func (e *exactRates) rate(key string, t time.Time) float64 {
	return e.lambda * e.counts[key] * math.Exp(-float64(t.UnixNano()-e.l0)*e.lambdaNs)
}

// zipfStream yields keys "k<rank>" drawn from Zipf(s) over imax+1 ranks, at a
// steady total rate.
type zipfStream struct {
	z    *rand.Zipf
	rate float64 // messages per second
	i    int64
	buf  []byte
}

func newZipfStream(seed uint64, s float64, imax uint64, rate float64) *zipfStream {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return &zipfStream{z: rand.NewZipf(r, s, 1, imax), rate: rate, buf: make([]byte, 0, 32)}
}

// next returns the next key (valid until the next call) and its time.
func (z *zipfStream) next() ([]byte, time.Time) {
	rank := z.z.Uint64()
	z.buf = strconv.AppendUint(append(z.buf[:0], 'k'), rank, 10)
	t := t0.Add(time.Duration(float64(z.i) * 1e9 / z.rate))
	z.i++
	return z.buf, t
}

// fataler is the part of testing.TB and *rapid.T that checks use.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// checkDetector verifies the detector's internal invariants.
func checkDetector(t fataler, d *Detector) {
	t.Helper()
	n := int(d.n)
	if n > int(d.k) || d.hn > d.n {
		t.Fatalf("n=%d hn=%d k=%d", n, d.hn, d.k)
	}
	seen := make([]bool, n)
	for i := int32(0); i < d.hn; i++ {
		e := d.heap[i]
		if d.slots[e.slot].pos != i {
			t.Fatalf("heap[%d].slot=%d but slot.pos=%d", i, e.slot, d.slots[e.slot].pos)
		}
		if i > 0 && d.heap[(i-1)/4].count > e.count {
			t.Fatalf("heap order broken at %d: parent %v > %v", i, d.heap[(i-1)/4].count, e.count)
		}
		seen[e.slot] = true
	}
	prev := int32(-1)
	queued := 0
	for s := d.qhead; s >= 0; s = d.slots[s].next {
		sl := d.slots[s]
		if sl.pos >= 0 || sl.prev != prev || seen[s] {
			t.Fatalf("queue broken at slot %d: %+v (prev %d)", s, sl, prev)
		}
		if prev >= 0 && d.slots[prev].count > sl.count {
			t.Fatalf("queue not sorted at slot %d: %v after %v", s, sl.count, d.slots[prev].count)
		}
		seen[s] = true
		prev = s
		queued++
	}
	if d.qtail != prev || queued+int(d.hn) != n {
		t.Fatalf("queue tail %d (want %d), %d queued + %d in heap != %d slots", d.qtail, prev, queued, d.hn, n)
	}
	sum := 0.0
	for s := int32(0); s < d.n; s++ {
		sl := d.slots[s]
		c := d.countOf(s)
		sum += c
		if !(sl.own >= 0 && sl.own <= c) || math.IsNaN(c) || math.IsInf(c, 0) {
			t.Fatalf("slot %d: own=%v count=%v", s, sl.own, c)
		}
		if c < d.minCount() {
			t.Fatalf("slot %d: count %v below minCount %v", s, c, d.minCount())
		}
		key, _ := d.storedKey(s)
		if sl.flen > uint32(d.cfg.MaxKeyLen) {
			// A long key cannot be rebuilt; look the slot up in the table.
			found := false
			for _, te := range d.table {
				if te != 0 && int32(uint32(te))-1 == s {
					found = true
				}
			}
			if !found {
				t.Fatalf("slot %d missing from table", s)
			}
			continue
		}
		if got := d.find(sl.hash, key); got != s {
			t.Fatalf("find(%q) = %d, want %d", key, got, s)
		}
	}
	used := 0
	for _, te := range d.table {
		if te != 0 {
			used++
		}
	}
	if used != n {
		t.Fatalf("table holds %d entries, want %d", used, n)
	}
}

// keyOf formats test keys.
func keyOf(i int) []byte { return []byte(fmt.Sprintf("k%d", i)) }
