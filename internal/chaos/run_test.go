package chaos

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// testWriter sends progress lines to t.Log until closed.
type testWriter struct {
	t      *testing.T
	mu     sync.Mutex
	closed bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (w *testWriter) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}

// TestChaosRun is the seeded CI run of the chaos suite: about 100 s of
// faults of every kind (netns where the machine allows it) on a cluster
// of real processes. Safety is asserted hard: no violation in the whole
// record, and every process kill or stop proven. Liveness bound misses
// (a bucket unserved longer than TTL + 1 s after a fault) are logged, not
// failed: they depend on fixes to the server and the SDK. Set
// KEYSHARD_CHAOS_SEED to run another schedule, KEYSHARD_CHAOS_DURATION
// to run longer, KEYSHARD_TEST_LOG=1 to stream the children's logs.
func TestChaosRun(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos run takes about two minutes of real processes")
	}
	cfg := DefaultConfig()
	cfg.Seed = 20261201
	if s := os.Getenv("KEYSHARD_CHAOS_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("KEYSHARD_CHAOS_SEED=%q: %v", s, err)
		}
		cfg.Seed = seed
	}
	cfg.Duration = 100 * time.Second
	if s := os.Getenv("KEYSHARD_CHAOS_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("KEYSHARD_CHAOS_DURATION=%q: %v", s, err)
		}
		cfg.Duration = d
	}
	cfg.Faults = append(DefaultFaults(), Netns) // skipped with a message where it cannot run
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration+4*time.Minute)
	defer cancel()
	bin, err := BuildKeyshard(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Binary, cfg.Dir = bin, t.TempDir()
	w := &testWriter{t: t}
	defer w.close()
	cfg.Progress = w
	if os.Getenv("KEYSHARD_TEST_LOG") != "" {
		cfg.Log = os.Stderr
	}
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	rep.WriteText(&text)
	t.Log(text.String())

	if len(rep.Analysis.Faults) < 5 {
		t.Errorf("only %d faults injected in %v", len(rep.Analysis.Faults), cfg.Duration)
	}
	for _, v := range rep.Analysis.Violations {
		t.Errorf("violation (replay with KEYSHARD_CHAOS_SEED=%d): %s", cfg.Seed, v)
	}
	for _, f := range rep.Analysis.Faults {
		switch f.Kind {
		case WorkerKill, WorkerStop, ReplicaKill, ReplicaStop, EtcdKill, EtcdStop:
			if !f.Proven {
				t.Errorf("%s of %s at %v was not proven to take effect", f.Kind, f.Target, f.At)
			}
		}
	}
	for _, m := range rep.Analysis.Misses {
		t.Logf("liveness bound miss (not failed; replay with KEYSHARD_CHAOS_SEED=%d): %s", cfg.Seed, m)
	}
}
