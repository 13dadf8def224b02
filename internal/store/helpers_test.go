package store

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"
)

// testLogger discards etcd's logs unless KEYSHARD_TEST_ETCD_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("KEYSHARD_TEST_ETCD_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// ctxFor returns a context that ends after d or with the test.
func ctxFor(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// runEmbedded starts a fresh embedded etcd in a temporary directory and
// closes it when the test ends.
func runEmbedded(t testing.TB, cfg EmbeddedConfig) *Embedded {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	e, err := StartEmbedded(ctxFor(t, 30*time.Second), cfg)
	if err != nil {
		t.Fatalf("StartEmbedded: %v", err)
	}
	t.Cleanup(e.Close)
	return e
}

func openStore(t testing.TB, endpoints []string) *Store {
	t.Helper()
	s, err := Open(ctxFor(t, 10*time.Second), Config{Endpoints: endpoints, Logger: testLogger()})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// shared is one embedded etcd for the tests that only need a store; each
// such test uses its own keyspace names.
var shared struct {
	once sync.Once
	dir  string
	e    *Embedded
	err  error
}

func sharedStore(t *testing.T) *Store {
	t.Helper()
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "keyshard-store-test-")
		if shared.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		shared.e, shared.err = StartEmbedded(ctx, EmbeddedConfig{Dir: shared.dir, Logger: testLogger(), UnsafeNoFsync: true})
	})
	if shared.err != nil {
		t.Fatalf("start shared etcd: %v", shared.err)
	}
	return openStore(t, shared.e.Endpoints())
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.e != nil {
		shared.e.Close()
	}
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}
