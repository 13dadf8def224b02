package streamcheck

import (
	"fmt"
	"strings"
	"testing"
)

// stream returns n events over keys k0..k3, key i in bucket i%2.
func stream(n int) []Event {
	ev := make([]Event, n)
	for i := range ev {
		k := i % 4
		ev[i] = Event{Pos: uint64(i), Key: fmt.Sprintf("k%d", k), Bucket: k % 2}
	}
	return ev
}

// handle makes worker handle every event of bucket b in [from, to).
func handle(rec *Recorder, ev []Event, worker string, b int, token, from, to uint64) {
	for _, e := range ev {
		if e.Bucket == b && e.Pos >= from && e.Pos < to {
			rec.Handle(worker, b, token, e.Pos, e.Key)
		}
	}
}

func TestCheck(t *testing.T) {
	ev := stream(100)
	for _, tc := range []struct {
		name string
		run  func(rec *Recorder)
		want func(r Report) string // "" if as expected
	}{{
		name: "graceful move",
		run: func(rec *Recorder) {
			rec.Acquire("a", 0, 1, 0)
			rec.Acquire("a", 1, 1, 0)
			handle(rec, ev, "a", 0, 1, 0, 100)
			handle(rec, ev, "a", 1, 1, 0, 40)
			rec.Commit("a", 1, 30, nil)
			rec.Release("a", 1, 1, 40)
			rec.Acquire("b", 1, 2, 40)
			handle(rec, ev, "b", 1, 2, 40, 100)
		},
		want: func(r Report) string {
			if !r.OK() || r.Events != 100 || r.Handled != 100 || r.Releases != 1 || r.Tenures != 3 {
				return "want a clean record of 100 events"
			}
			return ""
		},
	}, {
		name: "crash reprocesses after the last commit only",
		run: func(rec *Recorder) {
			rec.Acquire("a", 0, 1, 0)
			rec.Acquire("a", 1, 1, 0)
			handle(rec, ev, "a", 0, 1, 0, 100)
			handle(rec, ev, "a", 1, 1, 0, 60)
			rec.Commit("a", 1, 50, nil)
			rec.Crash("a")
			rec.Acquire("b", 1, 2, 50)
			handle(rec, ev, "b", 1, 2, 50, 100)
		},
		want: func(r Report) string {
			// Bucket 1 holds odd positions: 51..59 is 5 events.
			if !r.OK() || r.DuplicatesCrash != 5 || r.DuplicatesCrashBound != 5+25 || r.Crashes != 2 {
				return "want 5 crash duplicates within the bound"
			}
			return ""
		},
	}, {
		name: "a crash's next holder starting below the last commit",
		run: func(rec *Recorder) {
			rec.Acquire("a", 1, 1, 0)
			handle(rec, ev, "a", 1, 1, 0, 60)
			rec.Commit("a", 1, 50, nil)
			rec.Crash("a")
			rec.Acquire("b", 1, 2, 30)
			handle(rec, ev, "b", 1, 2, 30, 100)
		},
		want: func(r Report) string {
			if r.OK() || r.DuplicatesOverBound != 10 || r.PositionRegressions != 1 {
				return "want 10 duplicates over the bound and a regression"
			}
			return ""
		},
	}, {
		name: "duplicates after a graceful release",
		run: func(rec *Recorder) {
			rec.Acquire("a", 1, 1, 0)
			handle(rec, ev, "a", 1, 1, 0, 60)
			rec.Release("a", 1, 1, 50)
			rec.Acquire("b", 1, 2, 50)
			handle(rec, ev, "b", 1, 2, 50, 100)
		},
		want: func(r Report) string {
			if r.OK() || r.DuplicatesGraceful != 5 {
				return "want 5 graceful duplicates"
			}
			return ""
		},
	}, {
		name: "a skipped event",
		run: func(rec *Recorder) {
			rec.Acquire("a", 1, 1, 0)
			handle(rec, ev, "a", 1, 1, 0, 60)
			rec.Release("a", 1, 1, 62) // claims one more than it handled
			rec.Acquire("b", 1, 2, 62)
			handle(rec, ev, "b", 1, 2, 62, 100)
			rec.Acquire("c", 0, 3, 0)
			handle(rec, ev, "c", 0, 3, 0, 100)
		},
		want: func(r Report) string {
			if r.OK() || r.Missed != 1 || !strings.Contains(strings.Join(r.Violations, "\n"), "event at 61") {
				return "want event 61 missed"
			}
			return ""
		},
	}, {
		name: "out of order within a tenure",
		run: func(rec *Recorder) {
			rec.Acquire("a", 1, 1, 0)
			rec.Handle("a", 1, 1, 5, "k1")
			rec.Handle("a", 1, 1, 1, "k1")
			rec.Handle("a", 1, 1, 5, "k1")
		},
		want: func(r Report) string {
			if r.OK() || r.OrderViolations != 2 {
				return "want 2 order violations"
			}
			return ""
		},
	}, {
		name: "handling without a grant, or of another bucket's key",
		run: func(rec *Recorder) {
			rec.Handle("a", 1, 9, 1, "k1") // never acquired
			rec.Acquire("a", 1, 1, 0)
			rec.Handle("a", 1, 1, 2, "k2") // k2 is bucket 0's
			rec.Release("a", 1, 1, 3)
			rec.Release("a", 1, 1, 3)
			rec.Release("a", 0, 7, 0) // never acquired: a grant that ended before it started
		},
		want: func(r Report) string {
			if r.OK() || r.Strays != 3 || r.Tenures != 3 || r.Releases != 2 {
				return "want 3 strays, and a tenure for the grant released unstarted"
			}
			return ""
		},
	}, {
		name: "a record handled before its acquire is recorded",
		run: func(rec *Recorder) {
			rec.Handle("a", 1, 1, 1, "k1")
			rec.Acquire("a", 1, 1, 0)
			handle(rec, ev, "a", 1, 1, 2, 100)
			rec.Acquire("a", 0, 2, 0)
			handle(rec, ev, "a", 0, 2, 0, 100)
		},
		want: func(r Report) string {
			if !r.OK() || r.Handled != 100 {
				return "want a clean record"
			}
			return ""
		},
	}, {
		name: "a commit after the holder stopped does not cover the bucket",
		run: func(rec *Recorder) {
			rec.Acquire("a", 1, 1, 0)
			handle(rec, ev, "a", 1, 1, 0, 50)
			rec.Stop("a", 1, 1)
			rec.Commit("a", 1, 90, nil) // the default no longer covers bucket 1
			rec.Release("a", 1, 1, 50)
			rec.Acquire("b", 1, 2, 50)
			handle(rec, ev, "b", 1, 2, 50, 100)
			rec.Acquire("c", 0, 3, 0)
			handle(rec, ev, "c", 0, 3, 0, 100)
		},
		want: func(r Report) string {
			if !r.OK() {
				return "want a clean record"
			}
			return ""
		},
	}, {
		name: "exceptions and max token in commits",
		run: func(rec *Recorder) {
			rec.Acquire("a", 0, 1, 0)
			handle(rec, ev, "a", 0, 1, 0, 100)
			rec.Acquire("z", 1, 2, 0)
			handle(rec, ev, "z", 1, 2, 0, 20)
			rec.Release("z", 1, 2, 20)
			rec.Acquire("a", 1, 5, 20) // gained later, catching up
			handle(rec, ev, "a", 1, 5, 20, 40)
			rec.Commit("a", 1, 100, []BucketPosition{{Bucket: 1, Token: 5, Position: 40}})
			rec.Commit("a", 4, 100, nil) // token 5 above max token: stays at 40
			rec.Crash("a")
			rec.Acquire("b", 1, 6, 40)
			handle(rec, ev, "b", 1, 6, 40, 100)
			rec.Acquire("b", 0, 6, 100)
		},
		want: func(r Report) string {
			if !r.OK() || r.DuplicatesCrash != 0 {
				return "want a clean record"
			}
			return ""
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			rec := NewRecorder()
			tc.run(rec)
			r := Check(ev, rec, 100)
			if msg := tc.want(r); msg != "" {
				t.Errorf("%s; got %+v", msg, r)
			}
		})
	}
}
