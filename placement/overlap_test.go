package placement_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/keyshard/keyshard/placement"
	"pgregory.net/rapid"
)

// refOverlapPairs counts, by brute force over all pairs of non-empty
// subsets, how many share exactly k members.
func refOverlapPairs(subsets map[string][]string) (hist []int, mean float64) {
	var ids []string
	for id, s := range subsets {
		if len(s) > 0 {
			ids = append(ids, id)
		}
	}
	pairs := 0
	var sum int
	for i := range ids {
		for j := i + 1; j < len(ids); j++ {
			k := len(setDiff(distinct(subsets[ids[i]]), setDiff(distinct(subsets[ids[i]]), distinct(subsets[ids[j]]))))
			for len(hist) <= k {
				hist = append(hist, 0)
			}
			hist[k]++
			sum += k
			pairs++
		}
	}
	if pairs == 0 {
		return nil, 0
	}
	return hist, float64(sum) / float64(pairs)
}

// binom is a binomial coefficient in floating point.
func binom(n, k int) float64 {
	if k < 0 || k > n {
		return 0
	}
	r := 1.0
	for i := 1; i <= k; i++ {
		r = r * float64(n-k+i) / float64(i)
	}
	return r
}

func TestOverlapMatchesBruteForce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		pool := rapid.IntRange(1, 12).Draw(t, "pool")
		n := rapid.IntRange(0, 15).Draw(t, "tenants")
		subsets := map[string][]string{}
		for i := range n {
			var s []string
			for range rapid.IntRange(0, pool).Draw(t, "size") {
				s = append(s, fmt.Sprint("m", rapid.IntRange(0, pool-1).Draw(t, "member")))
			}
			subsets[fmt.Sprint("t", i)] = s
		}
		r := placement.Overlap(subsets, pool, 0)
		hist, mean := refOverlapPairs(subsets)
		if r.Sampled {
			t.Fatal("sampled although all pairs fit")
		}
		obs := slices.Clone(r.Observed)
		for len(obs) > 0 && obs[len(obs)-1] == 0 {
			obs = obs[:len(obs)-1]
		}
		if !slices.Equal(obs, hist) || math.Abs(r.ObservedMean-mean) > 1e-12 && r.Pairs > 0 {
			t.Fatalf("Observed %v mean %v, brute force %v mean %v", r.Observed, r.ObservedMean, hist, mean)
		}
		// The expected histogram sums to the pairs, and its mean is the
		// hypergeometric mean.
		var sum, m float64
		for k, e := range r.Expected {
			sum += e
			m += float64(k) * e
		}
		if r.Pairs > 0 && (math.Abs(sum-float64(r.Pairs)) > 1e-6*float64(r.Pairs) || math.Abs(m/sum-r.ExpectedMean) > 1e-9) {
			t.Fatalf("Expected %v sums to %v (pairs %d), mean %v vs ExpectedMean %v", r.Expected, sum, r.Pairs, m/sum, r.ExpectedMean)
		}
		if r.ExpectedTail > 0.01+1e-9 || r.ExpectedTail < 0 {
			t.Fatalf("ExpectedTail %v outside [0, 1%%]", r.ExpectedTail)
		}
		// Insertion order does not matter.
		again := map[string][]string{}
		keys := make([]string, 0, len(subsets))
		for k := range subsets {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		slices.Reverse(keys)
		for _, k := range keys {
			again[k] = subsets[k]
		}
		if r2 := placement.Overlap(again, pool, 0); r2.String() != r.String() {
			t.Fatalf("report depends on map order:\n%v\n%v", r, r2)
		}
	})
}

func TestOverlapHypergeometric(t *testing.T) {
	// Two subsets of 2 from a pool of 4 share k members with probability
	// C(2,k)C(2,2-k)/C(4,2): 1/6, 4/6, 1/6.
	r := placement.Overlap(map[string][]string{"a": {"m1", "m2"}, "b": {"m1", "m3"}}, 4, 0)
	want := []float64{1.0 / 6, 4.0 / 6, 1.0 / 6}
	for k, w := range want {
		if math.Abs(r.Expected[k]-w) > 1e-12 {
			t.Errorf("Expected[%d] = %v, want %v", k, r.Expected[k], w)
		}
	}
	if r.ExpectedMean != 1 || r.ObservedMean != 1 || r.Pairs != 1 || r.MaxOverlap != 1 {
		t.Errorf("report %+v", r)
	}
	if math.Abs(r.ExpectedFull-1.0/6) > 1e-12 || r.ObservedFull != 0 {
		t.Errorf("full containment observed %v expected %v, want 0 and 1/6", r.ObservedFull, r.ExpectedFull)
	}
	// Larger sizes against the closed form.
	pool, a, b := 50, 7, 12
	r = placement.Overlap(map[string][]string{"a": shufflePoolIDs(a), "b": shufflePoolIDs(b)}, pool, 0)
	for k := range r.Expected {
		w := binom(b, k) * binom(pool-b, a-k) / binom(pool, a)
		if math.Abs(r.Expected[k]-w) > 1e-9 {
			t.Errorf("Expected[%d] = %v, want %v", k, r.Expected[k], w)
		}
	}
}

func shufflePoolIDs(n int) []string {
	var ids []string
	for _, m := range shufflePool(n, 1) {
		ids = append(ids, m.ID)
	}
	return ids
}

// TestOverlapRandomSubsets checks the expectation against truly random
// subsets, all pairs and sampled.
func TestOverlapRandomSubsets(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	ids := shufflePoolIDs(40)
	subsets := map[string][]string{}
	for i := range 800 {
		s := slices.Clone(ids)
		rng.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
		subsets[fmt.Sprint("t", i)] = s[:1+rng.IntN(10)]
	}
	for _, maxPairs := range []int{0, 50000} {
		r := placement.Overlap(subsets, 40, maxPairs)
		if r.Sampled != (maxPairs != 0) || (maxPairs != 0 && r.Pairs != maxPairs) {
			t.Errorf("maxPairs %d: sampled %v, pairs %d", maxPairs, r.Sampled, r.Pairs)
		}
		if math.Abs(r.ObservedMean/r.ExpectedMean-1) > 0.03 {
			t.Errorf("maxPairs %d: mean observed %v, expected %v", maxPairs, r.ObservedMean, r.ExpectedMean)
		}
		if math.Abs(r.ObservedTail-r.ExpectedTail) > 0.003 {
			t.Errorf("maxPairs %d: tail observed %v, expected %v", maxPairs, r.ObservedTail, r.ExpectedTail)
		}
		if !strings.Contains(r.String(), "mean shared: observed") {
			t.Errorf("String() = %q", r.String())
		}
	}
	if a, b := placement.Overlap(subsets, 40, 1000), placement.Overlap(subsets, 40, 1000); a.String() != b.String() {
		t.Errorf("sampling is not deterministic")
	}
}

func TestOverlapEdgeCases(t *testing.T) {
	for _, tc := range []struct {
		name    string
		subsets map[string][]string
		pool    int
		pairs   int
		tenants int
		poolOut int
	}{
		{"nil", nil, 10, 0, 0, 10},
		{"one tenant", map[string][]string{"a": {"x"}}, 10, 0, 1, 10},
		{"empty subsets ignored", map[string][]string{"a": {}, "b": {"x"}, "c": nil}, 3, 0, 1, 3},
		{"pool from members", map[string][]string{"a": {"x", "y"}, "b": {"y", "z"}}, 0, 1, 2, 3},
		{"duplicates count once", map[string][]string{"a": {"x", "x", "y"}, "b": {"x", "x"}}, 2, 1, 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := placement.Overlap(tc.subsets, tc.pool, 0)
			if r.Pairs != tc.pairs || r.Tenants != tc.tenants || r.Pool != tc.poolOut {
				t.Errorf("report %+v", r)
			}
			_ = r.String()
		})
	}
}

func FuzzOverlap(f *testing.F) {
	f.Add([]byte{1, 2, 3, 0, 2, 3, 4}, 5, 0)
	f.Add([]byte{}, 0, -1)
	f.Add([]byte{0, 0, 0, 0, 0, 0, 255, 255}, 1, 3)
	f.Fuzz(func(t *testing.T, data []byte, pool, maxPairs int) {
		// Each 0 byte starts a new tenant; other bytes name members.
		subsets := map[string][]string{}
		tenant := 0
		for _, b := range data {
			if b == 0 {
				tenant++
				continue
			}
			id := fmt.Sprint("t", tenant)
			subsets[id] = append(subsets[id], fmt.Sprint("m", b))
		}
		r := placement.Overlap(subsets, pool%1000, maxPairs%10000)
		n := 0
		for _, o := range r.Observed {
			n += o
		}
		if n != r.Pairs || len(r.Observed) != len(r.Expected) {
			t.Fatalf("histogram %v / %v for %d pairs", r.Observed, r.Expected, r.Pairs)
		}
		for _, x := range []float64{r.ObservedMean, r.ExpectedMean, r.ObservedTail, r.ExpectedTail, r.ObservedFull, r.ExpectedFull} {
			if r.Pairs > 0 && (math.IsNaN(x) || x < 0) {
				t.Fatalf("bad statistic in %+v", r)
			}
		}
		_ = r.String()
	})
}
