package bench

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/keyshard/keyshard/internal/chaos"
)

// built is the keyshard binary the tests run their children with: the
// one KEYSHARD_BIN names, or one built once per test binary run into a
// directory that TestMain removes.
var built struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// keyshardBinary returns the keyshard binary to run etcd, serve and the
// workers with, building it the first time a test asks.
func keyshardBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("KEYSHARD_BIN"); bin != "" {
		return bin
	}
	built.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if built.dir, built.err = os.MkdirTemp("", "keyshard-bench-test-"); built.err != nil {
			return
		}
		built.bin, built.err = chaos.BuildKeyshard(ctx, built.dir)
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
}
