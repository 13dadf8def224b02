package chaos

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCorpus runs the checker over hand-made histories: every file in
// testdata/histories/bad must be rejected with each violation or miss its
// "# want:" lines name, and every file in testdata/histories/good must be
// accepted with no violation and no miss. Headers "# buckets: N" and "#
// bound: D" set the analysis (defaults 2 buckets, 4 s).
func TestCorpus(t *testing.T) {
	for _, dir := range []string{"good", "bad"} {
		files, err := filepath.Glob(filepath.Join("testdata", "histories", dir, "*.txt"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no histories in testdata/histories/%s: %v", dir, err)
		}
		for _, file := range files {
			t.Run(dir+"/"+filepath.Base(file), func(t *testing.T) {
				text, err := os.ReadFile(file)
				if err != nil {
					t.Fatal(err)
				}
				buckets, bound := 2, 4*time.Second
				var wants []string
				for _, l := range strings.Split(string(text), "\n") {
					switch {
					case strings.HasPrefix(l, "# want: "):
						wants = append(wants, strings.TrimPrefix(l, "# want: "))
					case strings.HasPrefix(l, "# buckets: "):
						if buckets, err = strconv.Atoi(strings.TrimPrefix(l, "# buckets: ")); err != nil {
							t.Fatal(err)
						}
					case strings.HasPrefix(l, "# bound: "):
						if bound, err = time.ParseDuration(strings.TrimPrefix(l, "# bound: ")); err != nil {
							t.Fatal(err)
						}
					}
				}
				recs, err := ParseHistory(strings.NewReader(string(text)))
				if err != nil {
					t.Fatal(err)
				}
				a := Analyze(recs, buckets, bound)
				var found []string
				for _, v := range a.Violations {
					found = append(found, v.Msg)
				}
				found = append(found, a.Misses...)
				if dir == "good" {
					if len(found) != 0 {
						t.Errorf("a good history was rejected:\n%s", strings.Join(found, "\n"))
					}
					return
				}
				if len(wants) == 0 {
					t.Fatal("a bad history names no violation it wants (# want: ...)")
				}
				for _, w := range wants {
					hit := false
					for _, f := range found {
						hit = hit || strings.Contains(f, w)
					}
					if !hit {
						t.Errorf("want a finding containing %q; found:\n%s", w, strings.Join(found, "\n"))
					}
				}
			})
		}
	}
}

// TestParseHistoryErrors shows that a malformed history is refused with a
// message naming the line.
func TestParseHistoryErrors(t *testing.T) {
	for _, in := range []string{
		"acquire a 1",
		"acquire a x 1",
		"frobnicate a",
		"@soon acquire a 1 1",
		"acquire a 1 1 pid=x",
		"acquire a 1 1 sideways",
		"fault-begin",
	} {
		if _, err := ParseHistory(strings.NewReader("# ok\n" + in)); err == nil || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%q: error %v, want one naming line 2", in, err)
		}
	}
}

// TestUnservedIn checks the gap measure against hand-computed answers.
func TestUnservedIn(t *testing.T) {
	base := time.Unix(1000, 0)
	at := func(s ...float64) []time.Time {
		var out []time.Time
		for _, x := range s {
			out = append(out, base.Add(time.Duration(x*float64(time.Second))))
		}
		return out
	}
	sec := func(x float64) time.Time { return base.Add(time.Duration(x * float64(time.Second))) }
	for _, tc := range []struct {
		name          string
		writes        []time.Time
		from, to, end float64
		want          time.Duration
	}{
		{"steady", at(0, 1, 2, 3, 4), 1.5, 3.5, 10, time.Second},
		{"gap across the start", at(0, 3, 3.1), 1, 3.05, 10, 3 * time.Second},
		{"gap inside", at(0, 0.1, 0.2, 2.7, 2.8), 0.15, 3, 10, 2500 * time.Millisecond},
		{"gap after the window is not counted", at(0, 1, 2, 9), 0.5, 1.5, 10, time.Second},
		{"never written again", at(0, 1), 2, 3, 10, 9 * time.Second},
		{"never written", nil, 2, 3, 10, 8 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := unservedIn(tc.writes, sec(tc.from), sec(tc.to), sec(tc.end)); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestScheduleReplays shows that a seed fixes the schedule: the same seed
// draws the same steps, another seed different ones.
func TestScheduleReplays(t *testing.T) {
	draw := func(seed uint64) []step {
		rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		var out []step
		for range 50 {
			out = append(out, nextStep(rng, DefaultFaults(), 3*time.Second))
		}
		return out
	}
	a, b, c := draw(8), draw(8), draw(9)
	if !slices.Equal(a, b) {
		t.Error("seed 8 drew two different schedules")
	}
	if slices.Equal(a, c) {
		t.Error("seeds 8 and 9 drew the same schedule")
	}
	for _, s := range a {
		if s.dur < 1500*time.Millisecond || s.dur >= 6*time.Second || s.restart < 200*time.Millisecond || s.delay < 50*time.Millisecond || s.delay >= 300*time.Millisecond {
			t.Errorf("step out of range: %+v", s)
		}
	}
}
