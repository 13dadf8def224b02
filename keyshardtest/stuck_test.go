package keyshardtest

import (
	"context"
	"runtime/pprof"
	"strings"
	"testing"
	"time"
)

// TestStopReportsStuckGoroutines: a run whose goroutines ignore the stop
// fails the stop within the bound, and the error shows the stuck
// goroutine's stack and no other goroutine.
func TestStopReportsStuckGoroutines(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	r := &run{replica: "stuck", stop: stop, done: make(chan error, 1), label: "stuck#test"}
	go pprof.Do(runCtx, pprof.Labels(goroutineLabel, r.label), func(context.Context) { // exits when the test ends
		go func() { // inherits the label; exits when the test ends
			ignoresStop(release)
		}()
		<-release
		r.done <- nil
	})
	err := r.halt(50 * time.Millisecond)
	if err == nil {
		t.Fatal("halt returned nil for a run that does not stop")
	}
	msg := err.Error()
	for _, want := range []string{"keyshard serve stuck did not stop within 50ms", "keyshardtest.ignoresStop", `"keyshardtest.server":"stuck#test"`} {
		if !strings.Contains(msg, want) {
			t.Errorf("the report does not mention %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "testing.tRunner") {
		t.Errorf("the report lists the test's own goroutine:\n%s", msg)
	}
}

func ignoresStop(release <-chan struct{}) { <-release }

func TestLabelled(t *testing.T) {
	profile := `goroutine profile: total 3
1 @ 0x1 0x2
# labels: {"keyshardtest.server":"r1#1"}
#	0x1	main.serve+0x1	/src/main.go:10

1 @ 0x3
# labels: {"keyshardtest.server":"r1#12", "other":"x"}
#	0x3	main.other+0x1	/src/main.go:20

1 @ 0x4
#	0x4	main.unlabelled+0x1	/src/main.go:30

`
	got := labelled(profile, goroutineLabel, "r1#1")
	want := "1 @ 0x1 0x2\n# labels: {\"keyshardtest.server\":\"r1#1\"}\n#\t0x1\tmain.serve+0x1\t/src/main.go:10"
	if got != want {
		t.Errorf("labelled r1#1:\n%s\nwant\n%s", got, want)
	}
	if got := labelled(profile, goroutineLabel, "r1#12"); !strings.Contains(got, "main.other") || strings.Contains(got, "main.serve") {
		t.Errorf("labelled r1#12:\n%s", got)
	}
	if got := labelled(profile, goroutineLabel, "r2#1"); !strings.HasPrefix(got, "(none labelled") {
		t.Errorf("labelled r2#1: %s", got)
	}
}
