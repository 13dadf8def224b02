package demo_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/keyshard/keyshard/internal/demo"
)

// TestDemo runs the whole demo, short and slow, and checks that it passes
// its own checks and narrates every scheduled change.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for 10 s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rep, err := demo.Run(ctx, demo.Options{Duration: 10 * time.Second, Rate: 500, Buckets: 64, Out: &out})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !rep.OK {
		t.Fatalf("checks failed: %+v\n%s", rep, out.String())
	}
	if rep.EventsSent == 0 || rep.Handoffs == 0 || rep.Moves == 0 || len(rep.Steps) != 6 {
		t.Fatalf("the demo did too little: %+v", rep)
	}
	// The lease runs from the crashed worker's last renewal, up to a TTL
	// before the crash; takeover waits for etcd to expire it.
	if rep.CrashTakeoverS <= 0 || rep.CrashTakeoverS > rep.LeaseTTLS+5 {
		t.Errorf("crash takeover %.1f s with a lease TTL of %.0f s", rep.CrashTakeoverS, rep.LeaseTTLS)
	}
	for _, want := range []string{"w4 joins", "leaves gracefully", "crashes", "w6 joins", "buckets moved = optimum"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("commentary lacks %q:\n%s", want, out.String())
		}
	}
}

func TestDemoOptions(t *testing.T) {
	_, err := demo.Run(context.Background(), demo.Options{Duration: time.Second})
	if err == nil || !strings.Contains(err.Error(), "--duration 1s is too short") {
		t.Fatalf("err = %v", err)
	}
}
