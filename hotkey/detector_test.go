package hotkey

import (
	"errors"
	"math"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// tol is the relative tolerance for floating-point rounding in comparisons
// with the exact reference.
const tol = 1e-9

func TestNewDetectorConfigErrors(t *testing.T) {
	ok := DetectorConfig{Threshold: 100, MaxTotalRate: 10000}
	tests := []struct {
		name string
		mod  func(*DetectorConfig)
		want string
	}{
		{"zero threshold", func(c *DetectorConfig) { c.Threshold = 0 }, "Threshold must be a positive finite rate"},
		{"NaN threshold", func(c *DetectorConfig) { c.Threshold = math.NaN() }, "Threshold"},
		{"inf threshold", func(c *DetectorConfig) { c.Threshold = math.Inf(1) }, "Threshold"},
		{"epsilon 1", func(c *DetectorConfig) { c.Epsilon = 1 }, "Epsilon must be in (0, 1)"},
		{"negative epsilon", func(c *DetectorConfig) { c.Epsilon = -0.1 }, "Epsilon"},
		{"tiny half-life", func(c *DetectorConfig) { c.HalfLife = time.Microsecond }, "HalfLife must be at least 1ms"},
		{"negative key len", func(c *DetectorConfig) { c.MaxKeyLen = -1 }, "MaxKeyLen"},
		{"huge key len", func(c *DetectorConfig) { c.MaxKeyLen = MaxKeyLenLimit + 1 }, "MaxKeyLen"},
		{"one message is hot", func(c *DetectorConfig) { c.Threshold = 0.05; c.HalfLife = time.Second }, "single message would count as hot"},
		{"no sizing", func(c *DetectorConfig) { c.MaxTotalRate = 0 }, "set MaxTotalRate"},
		{"negative capacity", func(c *DetectorConfig) { c.Capacity = -1 }, "Capacity must not be negative"},
		{"capacity too large", func(c *DetectorConfig) { c.Capacity = MaxCapacity + 1 }, "exceeds the maximum"},
		{"derived capacity too large", func(c *DetectorConfig) { c.MaxTotalRate = 1e12 }, "raise Threshold or Epsilon"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := ok
			tt.mod(&cfg)
			_, err := NewDetector(cfg)
			if !errors.Is(err, ErrBadConfig) {
				t.Fatalf("NewDetector(%+v) error = %v, want ErrBadConfig", cfg, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not mention %q", err, tt.want)
			}
		})
	}
}

func TestDetectorCapacity(t *testing.T) {
	tests := []struct {
		cfg  DetectorConfig
		want int
	}{
		{DetectorConfig{Threshold: 100, MaxTotalRate: 100000}, 10000},              // 1e5/(0.1·100)
		{DetectorConfig{Threshold: 100, Epsilon: 0.2, MaxTotalRate: 100001}, 5001}, // rounds up
		{DetectorConfig{Threshold: 100, MaxTotalRate: 1}, minCapacity},
		{DetectorConfig{Threshold: 100, MaxTotalRate: 1e9, Capacity: 77}, 77}, // Capacity wins
	}
	for _, tt := range tests {
		d, err := NewDetector(tt.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := d.Capacity(); got != tt.want {
			t.Errorf("Capacity(%+v) = %d, want %d", tt.cfg, got, tt.want)
		}
		if got, want := d.GuaranteedTotalRate(), float64(tt.want)*d.Config().Epsilon*tt.cfg.Threshold; got != want {
			t.Errorf("GuaranteedTotalRate = %v, want %v", got, want)
		}
	}
}

// TestDetectorMemoryBudget checks the 4 MB budget of a 10,000-key detector
// both by its own accounting and by the heap.
func TestDetectorMemoryBudget(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	d, err := NewDetector(DetectorConfig{Threshold: 100, Capacity: 10000})
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	const budget = 4 << 20
	if d.MemoryBytes() > budget || heap > budget {
		t.Errorf("10,000-key detector: MemoryBytes %d, heap growth %d; budget %d", d.MemoryBytes(), heap, budget)
	}
	t.Logf("10,000-key detector: MemoryBytes %d, heap growth %d", d.MemoryBytes(), heap)
	runtime.KeepAlive(d)
}

// zipfCase is one Zipf run compared with exact counting.
type zipfCase struct {
	name      string
	threshold float64
	rate      float64 // total messages per second
	sizeRate  float64 // MaxTotalRate given to the detector
	halfLife  time.Duration
	messages  int
	checks    int
}

// runZipf streams Zipf(1.1) keys through a detector and an exact reference,
// and at checkpoints compares every key. It returns the number of hot keys
// (exact rate ≥ threshold) seen over all checks, the number reported, the
// number of false reports (exact rate < (1−ε)·threshold), the number of hot
// keys missed, and whether the precondition held at every check.
func runZipf(t *testing.T, c zipfCase) (hot, reported, falseReports, missed int, guaranteed bool) {
	t.Helper()
	d, err := NewDetector(DetectorConfig{Threshold: c.threshold, MaxTotalRate: c.sizeRate, HalfLife: c.halfLife})
	if err != nil {
		t.Fatal(err)
	}
	eps := d.Config().Epsilon
	ex := newExactRates(c.halfLife, t0)
	zs := newZipfStream(1, 1.1, 1_000_000, c.rate)
	guaranteed = true
	every := c.messages / c.checks
	var hk []HotKey
	for i := 1; i <= c.messages; i++ {
		key, now := zs.next()
		d.Observe(key, now)
		ex.add(string(key), 1, now)
		if i%every != 0 {
			continue
		}
		guaranteed = guaranteed && d.Stats(now).Guaranteed
		hk = d.AppendHot(hk[:0], now)
		reportedSet := make(map[string]bool, len(hk))
		for _, h := range hk {
			reportedSet[h.Key] = true
			reported++
			if r := ex.rate(h.Key, now); r < (1-eps)*c.threshold*(1-tol) {
				falseReports++
				t.Errorf("%s: reported %q with exact rate %.2f < (1−ε)·T = %.2f", c.name, h.Key, r, (1-eps)*c.threshold)
			}
		}
		for k := range ex.counts {
			r := ex.rate(k, now)
			est := d.Estimate([]byte(k), now)
			if est.Lower() > r*(1+tol)+1e-9 || est.Rate < r*(1-tol) {
				t.Fatalf("%s: key %q exact rate %v outside [%v, %v]", c.name, k, r, est.Lower(), est.Rate)
			}
			if est.Hot != reportedSet[k] {
				t.Fatalf("%s: key %q Estimate.Hot=%v but AppendHot says %v", c.name, k, est.Hot, reportedSet[k])
			}
			if r >= c.threshold*(1+tol) {
				hot++
				if !est.Hot {
					missed++
				}
			}
		}
	}
	checkDetector(t, d)
	return hot, reported, falseReports, missed, guaranteed
}

// TestDetectorZipfBounds: on Zipf(1.1) streams, compared with exact
// counting, every key at or above the threshold is reported (recall 100%)
// and none below (1−ε) of it, when the detector is sized for the stream's
// total rate.
func TestDetectorZipfBounds(t *testing.T) {
	cases := []zipfCase{
		{name: "200k/s T=500", threshold: 500, rate: 200_000, sizeRate: 200_000, halfLife: time.Second, messages: 1_000_000, checks: 10},
		{name: "50k/s T=100 slow decay", threshold: 100, rate: 50_000, sizeRate: 50_000, halfLife: 3 * time.Second, messages: 600_000, checks: 6},
	}
	if testing.Short() {
		for i := range cases {
			cases[i].messages /= 4
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hot, reported, falseReports, missed, guaranteed := runZipf(t, c)
			t.Logf("hot keys %d, reported %d, false reports %d, missed %d", hot, reported, falseReports, missed)
			if !guaranteed {
				t.Fatalf("precondition μ ≤ ε·T did not hold although total rate ≤ MaxTotalRate")
			}
			if hot == 0 {
				t.Fatal("no hot keys: the test proves nothing")
			}
			if missed != 0 || falseReports != 0 {
				t.Errorf("missed %d of %d hot keys, %d false reports", missed, hot, falseReports)
			}
		})
	}
}

// TestDetectorZipfOverloaded: when the total rate is far above what the
// detector is sized for, it says so (Degraded, not Guaranteed) and still
// reports no key below (1−ε)·threshold.
func TestDetectorZipfOverloaded(t *testing.T) {
	c := zipfCase{name: "overloaded", threshold: 500, rate: 200_000, sizeRate: 2_000, halfLife: time.Second, messages: 200_000, checks: 5}
	_, reported, falseReports, _, guaranteed := runZipf(t, c)
	if guaranteed {
		t.Error("Guaranteed held at 100× the sized rate")
	}
	if reported == 0 || falseReports != 0 {
		t.Errorf("reported %d keys, %d false", reported, falseReports)
	}
}

func TestDetectorSteadyRateAndDecay(t *testing.T) {
	d, err := NewDetector(DetectorConfig{Threshold: 50, Capacity: 16, HalfLife: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	key := []byte("steady")
	var now time.Time
	for i := 0; i < 20_000; i++ { // 1000/s for 20 s
		now = at(time.Duration(i) * time.Millisecond)
		d.Observe(key, now)
	}
	est := d.Estimate(key, now)
	if math.Abs(est.Rate-1000) > 1 || est.ErrorBound != 0 || !est.Hot || !est.Tracked {
		t.Fatalf("steady 1000/s: %+v", est)
	}
	for h := 1; h <= 6; h++ {
		later := now.Add(time.Duration(h) * time.Second)
		got := d.Estimate(key, later).Rate
		want := est.Rate / math.Pow(2, float64(h))
		if math.Abs(got-want) > want*1e-9 {
			t.Errorf("after %d half-lives rate %v, want %v", h, got, want)
		}
		if hot := d.Estimate(key, later).Hot; hot != (want >= 45) {
			t.Errorf("after %d half-lives Hot=%v at rate %v", h, hot, want)
		}
	}
}

// TestDetectorFreshKeyAdversary: a fresh key with every message neither
// grows memory nor is reported, even at a total rate far beyond the
// detector's sizing.
func TestDetectorFreshKeyAdversary(t *testing.T) {
	n := 10_000_000
	if testing.Short() {
		n = 1_000_000
	}
	d, err := NewDetector(DetectorConfig{Threshold: 100, Capacity: 10_000, HalfLife: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	mem := d.MemoryBytes()
	buf := make([]byte, 0, 32)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var now time.Time
	hot := 0
	for i := 0; i < n; i++ {
		buf = strconv.AppendUint(append(buf[:0], "fresh:"...), uint64(i), 10)
		now = at(time.Duration(i) * time.Microsecond) // 1,000,000 msg/s
		if d.Observe(buf, now).Hot {
			hot++
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	growth := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d unique keys: heap growth %d bytes, %d mallocs", n, growth, after.Mallocs-before.Mallocs)
	if growth > 256<<10 {
		t.Errorf("heap grew by %d bytes over %d unique keys", growth, n)
	}
	if d.MemoryBytes() != mem {
		t.Errorf("MemoryBytes changed from %d to %d", mem, d.MemoryBytes())
	}
	if hk := d.AppendHot(nil, now); hot != 0 || len(hk) != 0 {
		t.Errorf("fresh keys reported hot: %d observations, %v", hot, hk)
	}
	st := d.Stats(now)
	if st.Tracked != st.Capacity || st.Evictions != uint64(n-st.Capacity) {
		t.Errorf("stats %+v", st)
	}
	checkDetector(t, d)

	// And no allocation per observation, for fresh and for tracked keys.
	i := n
	if a := testing.AllocsPerRun(1000, func() {
		i++
		buf = strconv.AppendUint(append(buf[:0], "fresh:"...), uint64(i), 10)
		d.Observe(buf, now)
	}); a != 0 {
		t.Errorf("Observe(fresh key) allocates %v times", a)
	}
	if a := testing.AllocsPerRun(1000, func() { d.Observe(buf, now) }); a != 0 {
		t.Errorf("Observe(tracked key) allocates %v times", a)
	}
}

func TestDetectorLongKeys(t *testing.T) {
	d, err := NewDetector(DetectorConfig{Threshold: 10, Capacity: 8, MaxKeyLen: 4, HalfLife: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	a, b := []byte("abcdefgh-1"), []byte("abcdefgh-2") // same stored prefix and length
	short := []byte("ab")
	for i := 0; i < 100; i++ {
		now := at(time.Duration(i) * time.Millisecond)
		d.Observe(a, now)
		if i%2 == 0 {
			d.Observe(b, now)
		}
		d.Observe(short, now)
	}
	now := at(100 * time.Millisecond)
	ea, eb := d.Estimate(a, now), d.Estimate(b, now)
	if !(ea.Rate > eb.Rate*1.5) || ea.ErrorBound != 0 || eb.ErrorBound != 0 {
		t.Fatalf("long keys merged: %+v vs %+v", ea, eb)
	}
	hk := d.AppendHot(nil, now)
	if len(hk) != 3 {
		t.Fatalf("AppendHot = %+v, want 3 keys", hk)
	}
	for _, h := range hk {
		if wantTrunc := h.Key != "ab"; h.Truncated != wantTrunc || (wantTrunc && h.Key != "abcd") {
			t.Errorf("hot key %+v", h)
		}
	}
	if hk[0].Rate < hk[1].Rate || hk[1].Rate < hk[2].Rate {
		t.Errorf("AppendHot not sorted by rate: %+v", hk)
	}
	checkDetector(t, d)
}

func TestDetectorTimeBackwardsAndRenormalization(t *testing.T) {
	d, err := NewDetector(DetectorConfig{Threshold: 10, Capacity: 8, HalfLife: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	key := []byte("k")
	d.Observe(key, at(10*time.Second))
	e1 := d.Observe(key, at(5*time.Second)) // earlier: counts at 10s
	e2 := d.Estimate(key, at(10*time.Second))
	if e1 != e2 || math.Abs(e1.Rate-2*math.Ln2) > 1e-12 {
		t.Fatalf("backwards time: %+v vs %+v", e1, e2)
	}
	// Walk far enough that the exponent passes renormAt several times, and
	// check that rates match the closed form through each rescaling.
	var want float64 = 2
	last := 10 * time.Second
	for step := 1; step <= 40; step++ {
		now := last + 7*time.Second
		want = want*math.Pow(2, -7) + 1
		last = now
		got := d.Observe(key, at(now))
		if math.Abs(got.Rate-want*math.Ln2) > want*math.Ln2*1e-9 {
			t.Fatalf("step %d: rate %v, want %v", step, got.Rate, want*math.Ln2)
		}
	}
	if st := d.Stats(at(last)); st.Renormalizations == 0 {
		t.Errorf("no renormalization over %v: %+v", last, st)
	}
	// A jump of centuries decays everything to zero without overflow.
	got := d.Observe([]byte("other"), at(last+200*365*24*time.Hour))
	if got.Rate != math.Ln2 || math.IsNaN(d.Estimate(key, at(last+200*365*24*time.Hour)).Rate) {
		t.Errorf("after a long jump: %+v", got)
	}
	checkDetector(t, d)
}

func TestDetectorObserveNAndReset(t *testing.T) {
	d, err := NewDetector(DetectorConfig{Threshold: 10, Capacity: 8, HalfLife: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	key := []byte("k")
	for _, n := range []float64{0, -1, math.NaN(), math.Inf(1), 1 << 54} {
		if got := d.ObserveN(key, n, t0); got != (Estimate{}) {
			t.Errorf("ObserveN(%v) = %+v, want no effect", n, got)
		}
	}
	if got := d.ObserveN(key, 100, t0); !got.Hot || math.Abs(got.Rate-100*math.Ln2) > 1e-9 {
		t.Errorf("ObserveN(100) = %+v", got)
	}
	d.Reset()
	if st := d.Stats(t0); st.Tracked != 0 || st.Observations != 0 {
		t.Errorf("after Reset: %+v", st)
	}
	if got := d.Estimate(key, t0); got != (Estimate{}) {
		t.Errorf("after Reset: %+v", got)
	}
}

// TestDetectorProperties checks, on random small streams and a small
// detector, Space-Saving's bounds against exact decayed counts after every
// message: Lower ≤ exact ≤ Rate, ErrorBound ≤ the error bound in Stats, no
// report below (1−ε)·T, and every key ≥ T reported while Stats.Guaranteed.
func TestDetectorProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		cfg := DetectorConfig{
			Threshold: rapid.Float64Range(2, 50).Draw(rt, "threshold"),
			Epsilon:   rapid.Float64Range(0.05, 0.5).Draw(rt, "epsilon"),
			HalfLife:  time.Duration(rapid.IntRange(1, 10).Draw(rt, "halfLifeS")) * time.Second,
			Capacity:  rapid.IntRange(1, 12).Draw(rt, "capacity"),
		}
		d, err := NewDetector(cfg)
		if err != nil {
			rt.Skip(err)
		}
		cfg = d.Config()
		nkeys := rapid.IntRange(1, 40).Draw(rt, "nkeys")
		ex := newExactRates(cfg.HalfLife, t0)
		now := t0
		steps := rapid.IntRange(1, 300).Draw(rt, "steps")
		for i := 0; i < steps; i++ {
			now = now.Add(time.Duration(rapid.IntRange(0, 200).Draw(rt, "dtMs")) * time.Millisecond)
			k := keyOf(rapid.IntRange(0, nkeys-1).Draw(rt, "key"))
			n := 1.0
			if rapid.Bool().Draw(rt, "weighted") {
				n = rapid.Float64Range(0.5, 20).Draw(rt, "n")
			}
			d.ObserveN(k, n, now)
			ex.add(string(k), n, now)
			st := d.Stats(now)
			for j := 0; j < nkeys; j++ {
				kj := keyOf(j)
				r := ex.rate(string(kj), now)
				est := d.Estimate(kj, now)
				if est.Lower() > r*(1+tol)+1e-12 || est.Rate < r*(1-tol) {
					rt.Fatalf("key %s: exact %v outside [%v, %v]", kj, r, est.Lower(), est.Rate)
				}
				if est.ErrorBound > st.ErrorBound*(1+tol)+1e-12 {
					rt.Fatalf("key %s: ErrorBound %v > Stats.ErrorBound %v", kj, est.ErrorBound, st.ErrorBound)
				}
				if est.Hot && r < (1-cfg.Epsilon)*cfg.Threshold*(1-tol) {
					rt.Fatalf("key %s reported at exact rate %v < (1−ε)·T = %v", kj, r, (1-cfg.Epsilon)*cfg.Threshold)
				}
				if st.Guaranteed && r >= cfg.Threshold*(1+tol) && !est.Hot {
					rt.Fatalf("key %s at exact rate %v ≥ T = %v not reported though guaranteed (%+v, %+v)", kj, r, cfg.Threshold, st, est)
				}
			}
		}
		checkDetector(rt, d)
	})
}

// FuzzObserve drives a small detector with arbitrary keys, times and
// weights, checking its invariants and the bounds against exact counts.
func FuzzObserve(f *testing.F) {
	f.Add([]byte("\x01a\x02bb\x00\x03ccc"), uint8(4), uint8(3))
	f.Add([]byte("\xffhot\xff\xffhot\x10cold\x00hot"), uint8(2), uint8(1))
	f.Add([]byte{}, uint8(1), uint8(0))
	f.Add([]byte("\x00\x00\x00\x00\x00\x00\x00\x00\x00"), uint8(9), uint8(200))
	f.Fuzz(func(t *testing.T, data []byte, capacity, keyLen uint8) {
		d, err := NewDetector(DetectorConfig{Threshold: 5, Capacity: int(capacity%16) + 1, MaxKeyLen: int(keyLen%8) + 1, HalfLife: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ex := newExactRates(time.Second, t0)
		now := t0
		keys := map[string]bool{}
		// Each record: one byte of time step (10ms units, 0xff = a long jump
		// backwards then forwards is not allowed: exact counts need a fixed
		// landmark), one byte of length, then the key.
		for len(data) >= 2 {
			step, l := data[0], int(data[1]%16)
			data = data[2:]
			l = min(l, len(data))
			key := data[:l]
			data = data[l:]
			now = now.Add(time.Duration(step) * 10 * time.Millisecond)
			est := d.Observe(key, now)
			ex.add(string(key), 1, now)
			keys[string(key)] = true
			if !est.Tracked || est.Rate < est.ErrorBound || est.ErrorBound < 0 {
				t.Fatalf("Observe(%q) = %+v", key, est)
			}
		}
		checkDetector(t, d)
		for k := range keys {
			r := ex.rate(k, now)
			est := d.Estimate([]byte(k), now)
			if est.Lower() > r*(1+tol)+1e-12 || est.Rate < r*(1-tol) {
				t.Fatalf("key %q: exact %v outside [%v, %v]", k, r, est.Lower(), est.Rate)
			}
			if est.Hot && r < 0.9*5*(1-tol) {
				t.Fatalf("key %q reported at exact rate %v", k, r)
			}
		}
	})
}
