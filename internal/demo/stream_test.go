package demo_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/keyshard/keyshard/internal/demo"
)

// TestStreamDemo runs the stream demo, short and slow, and checks that it
// passes its own checks, that its schedule did what it says (graceful
// releases, a crash whose duplicates stay within the bound), and that it
// narrates every change.
func TestStreamDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for 10 s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rep, err := demo.RunStream(ctx, demo.StreamOptions{Duration: 10 * time.Second, Rate: 500, Buckets: 64, Out: &out})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !rep.OK {
		t.Fatalf("checks failed: %+v\n%s", rep, out.String())
	}
	if rep.Events < 200 || rep.Releases == 0 || rep.Crashes == 0 || rep.Commits == 0 || rep.CommitWritesPerCall > 1 {
		t.Fatalf("the demo did too little: %+v", rep)
	}
	if rep.Missed != 0 || rep.DuplicatesGraceful != 0 || rep.DuplicatesCrash > rep.DuplicatesCrashBound {
		t.Fatalf("OK with %+v", rep)
	}
	for _, want := range []string{"s3 joins", "leaves gracefully", "is killed", "s5 joins", "all checks passed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("commentary lacks %q:\n%s", want, out.String())
		}
	}
}

func TestStreamDemoOptions(t *testing.T) {
	_, err := demo.RunStream(context.Background(), demo.StreamOptions{Duration: time.Second})
	if err == nil || !strings.Contains(err.Error(), "--duration 1s is too short") {
		t.Fatalf("err = %v", err)
	}
	_, err = demo.RunStream(context.Background(), demo.StreamOptions{Buckets: 70000})
	if err == nil || !strings.Contains(err.Error(), "--buckets") {
		t.Fatalf("err = %v", err)
	}
}
