package faulttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// bins are the two programs the tests run, built once per test binary
// run (without -race, to keep the children fast) into a directory that
// TestMain removes.
var bins struct {
	once             sync.Once
	dir              string
	worker, keyshard string
	err              error
	buildTime        time.Duration
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bins.dir != "" {
		os.RemoveAll(bins.dir)
	}
	os.Exit(code)
}

// binaries builds ./cmd/keyshard and ./internal/faulttest/testdata/worker
// once, from the module root, and returns their paths.
func binaries(t *testing.T) (worker, keyshard string) {
	t.Helper()
	bins.once.Do(func() {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
		if err != nil || strings.TrimSpace(string(out)) == "" || strings.TrimSpace(string(out)) == os.DevNull {
			bins.err = fmt.Errorf("find the module root (go env GOMOD): %q %v", out, err)
			return
		}
		root := filepath.Dir(strings.TrimSpace(string(out)))
		if bins.dir, err = os.MkdirTemp("", "keyshard-faulttest-"); err != nil {
			bins.err = err
			return
		}
		bins.worker, bins.keyshard = filepath.Join(bins.dir, "worker"), filepath.Join(bins.dir, "keyshard")
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, b := range []struct{ out, pkg string }{{bins.worker, "./internal/faulttest/testdata/worker"}, {bins.keyshard, "./cmd/keyshard"}} {
			wg.Go(func() { // exits when the build does
				cmd := exec.CommandContext(ctx, "go", "build", "-o", b.out, b.pkg)
				cmd.Dir = root
				if out, err := cmd.CombinedOutput(); err != nil {
					errs[i] = fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
				}
			})
		}
		wg.Wait()
		bins.err = errors.Join(errs...)
		bins.buildTime = time.Since(start)
	})
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	return bins.worker, bins.keyshard
}

// output collects a child's stdout and stderr, and lets a test wait for a
// line to appear.
type output struct {
	tee io.Writer // nil, or os.Stderr with KEYSHARD_TEST_LOG set

	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{} // closed and replaced on every write
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	o.buf.Write(p)
	close(o.changed)
	o.changed = make(chan struct{})
	o.mu.Unlock()
	if o.tee != nil {
		o.tee.Write(p)
	}
	return len(p), nil
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// proc is a child process. Every proc is killed and reaped in t.Cleanup,
// and its output is logged if the test failed.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *output
	done chan struct{} // closed once the process has exited and been reaped
	err  error         // Wait's error, valid after done
}

func startProc(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, out: &output{changed: make(chan struct{})}, done: make(chan struct{})}
	if os.Getenv("KEYSHARD_TEST_LOG") != "" {
		p.out.tee = prefixWriter{name, os.Stderr}
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	// If the test binary dies without running its cleanups, the kernel
	// kills the children.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { // exits when the process has exited
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("--- output of %s (pid %d) ---\n%s", name, p.cmd.Process.Pid, tail(p.out.String(), 64<<10))
		}
	})
	return p
}

// signal sends sig to the process if it is still running.
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	select {
	case <-p.done:
		t.Fatalf("%s has exited (%v); cannot send %v", p.name, p.err, sig)
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to %s: %v", sig, p.name, err)
	}
}

// kill sends SIGKILL (which also ends a stopped process) and waits until
// the process is reaped. It is idempotent.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// wait waits, bounded by ctx, for the process to exit and returns Wait's
// error.
func (p *proc) wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return fmt.Errorf("%s has not exited: %w", p.name, ctx.Err())
	}
}

// await waits until the process's output matches re, the process exits,
// or ctx ends, and returns the submatches.
func (p *proc) await(ctx context.Context, re *regexp.Regexp) ([]string, error) {
	for {
		p.out.mu.Lock()
		m := re.FindStringSubmatch(p.out.buf.String())
		ch := p.out.changed
		p.out.mu.Unlock()
		if m != nil {
			return m, nil
		}
		select {
		case <-ch:
		case <-p.done:
			if m := re.FindStringSubmatch(p.out.String()); m != nil {
				return m, nil
			}
			return nil, fmt.Errorf("%s exited (%v) before its output matched %q", p.name, p.err, re)
		case <-ctx.Done():
			return nil, fmt.Errorf("%s: output does not match %q: %w", p.name, re, ctx.Err())
		}
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "...\n" + s[len(s)-n:]
}

// prefixWriter writes to w with each write prefixed by a name.
type prefixWriter struct {
	name string
	w    io.Writer
}

func (p prefixWriter) Write(b []byte) (int, error) {
	lines := strings.SplitAfter(string(b), "\n")
	var out strings.Builder
	for _, l := range lines {
		if l != "" {
			out.WriteString("[" + p.name + "] " + l)
		}
	}
	_, err := io.WriteString(p.w, out.String())
	return len(b), err
}

// proxy is a TCP load balancer on loopback in front of serve replicas:
// each connection goes to the next backend in turn that accepts it, so
// workers spread over the replicas and reach a surviving one once a
// replica dies. Connections to a dead replica break, as they would behind
// a real load balancer.
type proxy struct {
	ln       net.Listener
	backends []string

	mu    sync.Mutex
	next  int
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup // the accept loop and every connection's copiers
}

func startProxy(t *testing.T, backends ...string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, backends: backends, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept) // exits when the listener closes
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.conns = nil
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// URL is the proxy's http:// URL.
func (p *proxy) URL() string { return "http://" + p.ln.Addr().String() }

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.serve(c) }) // exits when either side closes
	}
}

func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *proxy) serve(c net.Conn) {
	defer c.Close()
	if !p.track(c) {
		return
	}
	p.mu.Lock()
	start := p.next
	p.next++
	p.mu.Unlock()
	var up net.Conn
	for i := range p.backends {
		d, err := net.DialTimeout("tcp", p.backends[(start+i)%len(p.backends)], time.Second)
		if err == nil {
			up = d
			break
		}
	}
	if up == nil {
		return
	}
	defer up.Close()
	if !p.track(up) {
		return
	}
	done := make(chan struct{}, 2)
	go func() { io.Copy(up, c); up.Close(); done <- struct{}{} }() // exits when c or up closes
	go func() { io.Copy(c, up); c.Close(); done <- struct{}{} }()  // exits when up or c closes
	<-done
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}
