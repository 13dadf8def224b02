package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/keyshard/keyshard/hotkey"
)

// HotkeysReport is the output of `keyshard bench hotkeys --json`. Its
// targets: detector_ops_per_s ≥ 10,000,000 on one core, detector_allocs 0,
// detector_bytes ≤ 4 MB, router_decision_ns ≤ 100, recall 1,
// false_reports 0, memory_growth_10m_unique_bytes ≈ 0.
type HotkeysReport struct {
	// DetectorOpsPerS is the median rate of Detector.Observe, one goroutine,
	// on a Zipf(1.1) stream over a million keys, with a 10,000-key detector.
	DetectorOpsPerS float64 `json:"detector_ops_per_s"`
	// DetectorAllocs is allocations per observation.
	DetectorAllocs float64 `json:"detector_allocs"`
	// DetectorBytes is the heap taken by a 10,000-key detector, measured
	// with runtime.ReadMemStats around its construction.
	DetectorBytes int64 `json:"detector_bytes"`
	// RouterDecisionNs is the median cost of Policy.Decide (detector, rules,
	// sticky overflow set) on the same stream.
	RouterDecisionNs float64 `json:"router_decision_ns"`
	// Recall is the fraction of keys at or above the threshold rate (by
	// exact decayed counting) that the detector reported, over checkpoints
	// of a Zipf(1.1) stream; FalseReports counts reported keys whose exact
	// rate was below (1−ε) of the threshold.
	Recall       float64 `json:"recall"`
	FalseReports int     `json:"false_reports"`
	// MemoryGrowth10MUniqueBytes is the heap growth (after GC) over
	// 10,000,000 observations of distinct keys; negative means it shrank.
	MemoryGrowth10MUniqueBytes int64 `json:"memory_growth_10m_unique_bytes"`
}

const (
	hkRuns     = 3
	hkKeys     = 1 << 16 // pre-generated stream keys for the timings
	hkCapacity = 10_000
)

// Hotkeys measures the hotkey package against its targets, writing one
// progress line per step to progress.
func Hotkeys(ctx context.Context, runs int, progress io.Writer) (HotkeysReport, error) {
	var rep HotkeysReport
	if runs <= 0 {
		runs = hkRuns
	}
	keys := hkZipfKeys(1, hkKeys)
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

	// 1. Detector throughput and allocations.
	dcfg := hotkey.DetectorConfig{Threshold: 1000, Capacity: hkCapacity}
	if _, err := hotkey.NewDetector(dcfg); err != nil {
		return rep, err
	}
	var allocs []float64
	nsPerOp := median(runs, func() float64 {
		r := testing.Benchmark(func(b *testing.B) {
			d, _ := hotkey.NewDetector(dcfg) // validated above
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				d.Observe(keys[i&(hkKeys-1)], start.Add(time.Duration(i)*time.Microsecond))
			}
		})
		allocs = append(allocs, float64(r.MemAllocs)/float64(max(r.N, 1)))
		return float64(r.T.Nanoseconds()) / float64(max(r.N, 1))
	})
	rep.DetectorOpsPerS = 1e9 / nsPerOp
	rep.DetectorAllocs = slices.Max(allocs)
	fmt.Fprintf(progress, "hotkeys: detector: %.1fM observations/s (%.1f ns), %.2f allocs/observation (target ≥ 10M/s, 0)\n",
		rep.DetectorOpsPerS/1e6, nsPerOp, rep.DetectorAllocs)

	// 2. Memory of a 10,000-key detector.
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	d, _ := hotkey.NewDetector(dcfg)
	runtime.GC()
	runtime.ReadMemStats(&after)
	rep.DetectorBytes = int64(after.HeapAlloc) - int64(before.HeapAlloc)
	fmt.Fprintf(progress, "hotkeys: 10,000-key detector: %d bytes on the heap, %d by its own account (target ≤ 4 MB)\n",
		rep.DetectorBytes, d.MemoryBytes())
	runtime.KeepAlive(d)

	// 3. Router decision cost.
	rules, err := hotkey.ParseRules("drop token:abc\ndead-letter bad:*\noverflow user:42\njunk anonymous,null,undefined")
	if err != nil {
		return rep, err
	}
	pcfg := hotkey.PolicyConfig{Detector: dcfg, Rules: rules}
	if _, err := hotkey.NewPolicy(pcfg); err != nil {
		return rep, err
	}
	rep.RouterDecisionNs = median(runs, func() float64 {
		r := testing.Benchmark(func(b *testing.B) {
			p, _ := hotkey.NewPolicy(pcfg) // validated above
			const warm = 1 << 20           // hot keys enter overflow first
			for i := 0; i < warm; i++ {
				p.Decide(keys[i&(hkKeys-1)], start.Add(time.Duration(i)*time.Microsecond))
			}
			b.ResetTimer()
			for i := warm; i < warm+b.N; i++ {
				p.Decide(keys[i&(hkKeys-1)], start.Add(time.Duration(i)*time.Microsecond))
			}
		})
		return float64(r.T.Nanoseconds()) / float64(max(r.N, 1))
	})
	fmt.Fprintf(progress, "hotkeys: router decision: %.1f ns (target ≤ 100)\n", rep.RouterDecisionNs)

	if err := ctx.Err(); err != nil {
		return rep, err
	}
	// 4. Recall and false reports against exact counting.
	hot, found, falseReports, err := hkAccuracy(start)
	if err != nil {
		return rep, err
	}
	rep.Recall = float64(found) / float64(max(hot, 1))
	rep.FalseReports = falseReports
	fmt.Fprintf(progress, "hotkeys: accuracy on Zipf(1.1): %d of %d hot keys reported (recall %.4f), %d false reports (target 1, 0)\n",
		found, hot, rep.Recall, rep.FalseReports)

	if err := ctx.Err(); err != nil {
		return rep, err
	}
	// 5. Memory growth over 10,000,000 distinct keys.
	d, _ = hotkey.NewDetector(dcfg)
	buf := make([]byte, 0, 32)
	runtime.GC()
	runtime.ReadMemStats(&before)
	reported := 0
	for i := 0; i < 10_000_000; i++ {
		buf = strconv.AppendUint(append(buf[:0], "fresh:"...), uint64(i), 10)
		if d.Observe(buf, start.Add(time.Duration(i)*time.Microsecond)).Hot {
			reported++
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	rep.MemoryGrowth10MUniqueBytes = int64(after.HeapAlloc) - int64(before.HeapAlloc)
	fmt.Fprintf(progress, "hotkeys: 10,000,000 distinct keys: heap growth %d bytes, %d mallocs, %d reported hot (target ≈ 0, 0)\n",
		rep.MemoryGrowth10MUniqueBytes, after.Mallocs-before.Mallocs, reported)
	runtime.KeepAlive(d)
	if reported != 0 {
		return rep, fmt.Errorf("hotkeys: %d distinct-key observations reported hot", reported)
	}
	return rep, nil
}

// hkAccuracy streams 1,000,000 Zipf(1.1) messages at 200,000 msg/s through
// a detector sized for that rate (threshold 500 msg/s, ε 0.1, half-life
// 1 s), and at ten checkpoints compares its reports with exact decayed
// rates: it returns the hot keys (exact rate ≥ threshold) over all
// checkpoints, how many of them were reported, and the reports below
// (1−ε)·threshold.
func hkAccuracy(start time.Time) (hot, found, falseReports int, err error) {
	const (
		threshold = 500.0
		rate      = 200_000.0
		messages  = 1_000_000
		checks    = 10
	)
	halfLife := time.Second
	d, err := hotkey.NewDetector(hotkey.DetectorConfig{Threshold: threshold, MaxTotalRate: rate, HalfLife: halfLife})
	if err != nil {
		return 0, 0, 0, err
	}
	eps := d.Config().Epsilon
	lambda := math.Ln2 / halfLife.Seconds() // per second
	exact := map[uint64]float64{}           // rank → Σ e^{λ(tᵢ−start)}
	z := rand.NewZipf(rand.New(rand.NewPCG(2, 3)), 1.1, 1, 1_000_000)
	buf := make([]byte, 0, 32)
	var hk []hotkey.HotKey
	for i := 1; i <= messages; i++ {
		rank := z.Uint64()
		elapsed := float64(i) / rate // seconds
		now := start.Add(time.Duration(elapsed * 1e9))
		buf = strconv.AppendUint(append(buf[:0], 'k'), rank, 10)
		d.Observe(buf, now)
		exact[rank] += math.Exp(lambda * elapsed)
		if i%(messages/checks) != 0 {
			continue
		}
		decay := lambda * math.Exp(-lambda*elapsed)
		hk = d.AppendHot(hk[:0], now)
		reported := make(map[string]bool, len(hk))
		for _, h := range hk {
			reported[h.Key] = true
			rank, perr := strconv.ParseUint(h.Key[1:], 10, 64)
			if perr != nil || exact[rank]*decay < (1-eps)*threshold*(1-1e-9) {
				falseReports++
			}
		}
		for rank, c := range exact {
			if c*decay >= threshold*(1+1e-9) {
				hot++
				if reported["k"+strconv.FormatUint(rank, 10)] {
					found++
				}
			}
		}
	}
	return hot, found, falseReports, nil
}

// hkZipfKeys returns n keys drawn from Zipf(1.1) over a million ranks.
func hkZipfKeys(seed uint64, n int) [][]byte {
	z := rand.NewZipf(rand.New(rand.NewPCG(seed, seed+1)), 1.1, 1, 1_000_000)
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = strconv.AppendUint([]byte("k"), z.Uint64(), 10)
	}
	return keys
}
