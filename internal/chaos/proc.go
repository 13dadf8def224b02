package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
)

// maxOutput is how much of a child's output a Proc keeps (the newest).
const maxOutput = 256 << 10

// Output collects a child's stdout and stderr (the newest maxOutput
// bytes), and lets a caller wait for a line to appear.
type output struct {
	tee io.Writer // nil, or where to copy the output

	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{} // closed and replaced on every write
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	o.buf.Write(p)
	if o.buf.Len() > maxOutput {
		b := o.buf.Bytes()[o.buf.Len()-maxOutput/2:]
		o.buf = *bytes.NewBuffer(append([]byte(nil), b...))
	}
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

// Proc is a child process. Kill it (and so reap it) when done with it;
// its output is kept for Await and Output.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	out  *output
	done chan struct{} // closed once the process has exited and been reaped
	err  error         // Wait's error, valid after done
}

// StartProc starts bin with args. Its output goes to tee as well, each
// line prefixed with name, unless tee is nil. The child gets SIGKILL if
// this process dies first (Linux).
func StartProc(name string, tee io.Writer, bin string, args ...string) (*Proc, error) {
	return startProc(name, tee, exec.Command(bin, args...))
}

func startProc(name string, tee io.Writer, cmd *exec.Cmd) (*Proc, error) {
	p := &Proc{Name: name, cmd: cmd, out: &output{changed: make(chan struct{})}, done: make(chan struct{})}
	if tee != nil {
		p.out.tee = prefixWriter{name, tee}
	}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { // exits when the process has exited
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid returns the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Output returns the newest output of the process.
func (p *Proc) Output() string { return p.out.String() }

// Exited reports whether the process has exited (and been reaped).
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Done is closed once the process has exited and been reaped.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Signal sends sig to the process if it is still running.
func (p *Proc) Signal(sig syscall.Signal) error {
	if p.Exited() {
		return fmt.Errorf("%s has exited (%v); cannot send %v", p.Name, p.err, sig)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %v to %s: %w", sig, p.Name, err)
	}
	return nil
}

// Kill sends SIGKILL (which also ends a stopped process) and waits until
// the process is reaped. It is idempotent.
func (p *Proc) Kill() {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// KilledBySIGKILL reports whether the process has exited because of
// SIGKILL.
func (p *Proc) KilledBySIGKILL() bool {
	if !p.Exited() || p.cmd.ProcessState == nil {
		return false
	}
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// Wait waits, bounded by ctx, for the process to exit and returns Wait's
// error.
func (p *Proc) Wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return fmt.Errorf("%s has not exited: %w", p.Name, ctx.Err())
	}
}

// State returns the process's state letter from /proc/<pid>/stat ('R',
// 'S', 'T' for stopped, 'Z'...), or an error if it has exited.
func (p *Proc) State() (byte, error) {
	if p.Exited() {
		return 0, fmt.Errorf("%s has exited", p.Name)
	}
	return procState(p.Pid())
}

func procState(pid int) (byte, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// pid (comm) S ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, errors.New("unexpected /proc stat format")
	}
	return b[i+2], nil
}

// Await waits until the process's output matches re, the process exits,
// or ctx ends, and returns the submatches.
func (p *Proc) Await(ctx context.Context, re *regexp.Regexp) ([]string, error) {
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
			return nil, fmt.Errorf("%s exited (%v) before its output matched %q; its output ends:\n%s", p.Name, p.err, re, Tail(p.out.String(), 4<<10))
		case <-ctx.Done():
			return nil, fmt.Errorf("%s: output does not match %q: %w", p.Name, re, ctx.Err())
		}
	}
}

// Tail returns the last n bytes of s.
func Tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "...\n" + s[len(s)-n:]
}

// prefixWriter writes to w with each line prefixed by a name.
type prefixWriter struct {
	name string
	w    io.Writer
}

func (p prefixWriter) Write(b []byte) (int, error) {
	var out strings.Builder
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if l != "" {
			out.WriteString("[" + p.name + "] " + l)
		}
	}
	_, err := io.WriteString(p.w, out.String())
	return len(b), err
}
