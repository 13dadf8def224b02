package faulttest

import (
	"context"
	"io"
	"os"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keyshard/keyshard/internal/chaos"
)

// bins is the keyshard binary the tests run (serve, and chaos worker for
// the workers), built once per test binary run (without -race, to keep
// the children fast) into a directory that TestMain removes.
var bins struct {
	once      sync.Once
	dir       string
	keyshard  string
	err       error
	buildTime time.Duration
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bins.dir != "" {
		os.RemoveAll(bins.dir)
	}
	os.Exit(code)
}

// binary builds ./cmd/keyshard once, from the module root, and returns
// its path.
func binary(t *testing.T) string {
	t.Helper()
	bins.once.Do(func() {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		var err error
		if bins.dir, err = os.MkdirTemp("", "keyshard-faulttest-"); err != nil {
			bins.err = err
			return
		}
		bins.keyshard, bins.err = chaos.BuildKeyshard(ctx, bins.dir)
		bins.buildTime = time.Since(start)
	})
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	return bins.keyshard
}

// proc is a child process (chaos.Proc). Every proc is killed and reaped
// in t.Cleanup, and its output is logged if the test failed.
type proc struct{ *chaos.Proc }

func startProc(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	var tee io.Writer
	if os.Getenv("KEYSHARD_TEST_LOG") != "" {
		tee = os.Stderr
	}
	p, err := chaos.StartProc(name, tee, bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("--- output of %s (pid %d) ---\n%s", name, p.Pid(), chaos.Tail(p.Output(), 64<<10))
		}
	})
	return &proc{p}
}

// signal sends sig to the process, or fails the test if it has exited.
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// kill sends SIGKILL and waits until the process is reaped; idempotent.
func (p *proc) kill() { p.Kill() }

// wait waits, bounded by ctx, for the process to exit.
func (p *proc) wait(ctx context.Context) error { return p.Wait(ctx) }

// await waits until the process's output matches re.
func (p *proc) await(ctx context.Context, re *regexp.Regexp) ([]string, error) {
	return p.Await(ctx, re)
}

// proxy is a TCP load balancer (chaos.Proxy) closed in t.Cleanup.
type proxy struct{ *chaos.Proxy }

func startProxy(t *testing.T, backends ...string) *proxy {
	t.Helper()
	p, err := chaos.NewProxy("127.0.0.1:0", backends...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return &proxy{p}
}
