package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// netnsLink puts one worker into its own network namespace, joined to the
// host by two veth pairs: one carries its link to the replicas (through a
// fault proxy listening on the host end), the other its reports to the
// sink (through a plain proxy), so that taking the first pair down cuts
// the worker off from the control plane in the kernel while the sink
// still records what it does.
type netnsLink struct {
	ns           string
	ctlHost      string // the host end of the control veth pair
	ctlIP, skIP  string // host-side addresses
	sinkProxy    *Proxy
	cleanupLinks []string
}

// ipCmd runs ip with args and returns its combined output on error.
func ipCmd(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// netnsUnavailable returns why network namespaces cannot be used here,
// or "".
func netnsUnavailable() string {
	if os.Geteuid() != 0 {
		return "needs root (ip netns, veth)"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "iproute2 is not installed (no ip command)"
	}
	probe := fmt.Sprintf("ksc-probe-%d", os.Getpid())
	if err := ipCmd("netns", "add", probe); err != nil {
		return err.Error()
	}
	if err := ipCmd("netns", "del", probe); err != nil {
		return err.Error()
	}
	return ""
}

// newNetnsLink creates the namespace and both veth pairs.
func newNetnsLink(sinkAddr string) (*netnsLink, error) {
	id := os.Getpid() % 100000
	k := os.Getpid()%200 + 20
	l := &netnsLink{
		ns:      fmt.Sprintf("ksc%d", id),
		ctlHost: fmt.Sprintf("kc%dh", id),
		ctlIP:   fmt.Sprintf("10.213.%d.1", k),
		skIP:    fmt.Sprintf("10.214.%d.1", k),
	}
	ctlNs, skHost, skNs := fmt.Sprintf("kc%dn", id), fmt.Sprintf("ks%dh", id), fmt.Sprintf("ks%dn", id)
	steps := [][]string{
		{"netns", "add", l.ns},
		{"link", "add", l.ctlHost, "type", "veth", "peer", "name", ctlNs},
		{"link", "add", skHost, "type", "veth", "peer", "name", skNs},
		{"link", "set", ctlNs, "netns", l.ns},
		{"link", "set", skNs, "netns", l.ns},
		{"addr", "add", l.ctlIP + "/30", "dev", l.ctlHost},
		{"addr", "add", l.skIP + "/30", "dev", skHost},
		{"link", "set", l.ctlHost, "up"},
		{"link", "set", skHost, "up"},
		{"netns", "exec", l.ns, "ip", "addr", "add", fmt.Sprintf("10.213.%d.2/30", k), "dev", ctlNs},
		{"netns", "exec", l.ns, "ip", "addr", "add", fmt.Sprintf("10.214.%d.2/30", k), "dev", skNs},
		{"netns", "exec", l.ns, "ip", "link", "set", ctlNs, "up"},
		{"netns", "exec", l.ns, "ip", "link", "set", skNs, "up"},
		{"netns", "exec", l.ns, "ip", "link", "set", "lo", "up"},
	}
	l.cleanupLinks = []string{l.ctlHost, skHost}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			l.close()
			return nil, fmt.Errorf("set up a network namespace: %w", err)
		}
	}
	var err error
	if l.sinkProxy, err = NewProxy(l.skIP+":0", sinkAddr); err != nil {
		l.close()
		return nil, err
	}
	return l, nil
}

// command returns the command that runs bin with args in the namespace.
func (l *netnsLink) command(bin string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", l.ns, bin}, args...)...)
}

// setLink takes the control link down or up.
func (l *netnsLink) setLink(up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	return ipCmd("link", "set", l.ctlHost, state)
}

// operstate returns the kernel's view of the control link's host end.
func (l *netnsLink) operstate() string {
	b, err := os.ReadFile("/sys/class/net/" + l.ctlHost + "/operstate")
	if err != nil {
		return err.Error()
	}
	return strings.TrimSpace(string(b))
}

func (l *netnsLink) close() {
	if l.sinkProxy != nil {
		l.sinkProxy.Close()
	}
	for _, link := range l.cleanupLinks {
		_ = ipCmd("link", "del", link)
	}
	_ = ipCmd("netns", "del", l.ns)
}

// netnsPartition takes the namespaced worker's control link down for a
// while.
func (r *runner) netnsPartition(ctx context.Context, n int, st step) error {
	c := r.c
	var w *worker
	for _, x := range c.workers {
		if x.netns {
			w = x
		}
	}
	if w == nil || c.netns == nil {
		return fmt.Errorf("no worker runs in a network namespace")
	}
	f := r.begin(n, st.kind, w.id, fmt.Sprintf("veth %s down for %v (namespace %s)", c.netns.ctlHost, st.dur.Round(time.Millisecond), c.netns.ns))
	if err := c.netns.setLink(false); err != nil {
		return err
	}
	if s := c.netns.operstate(); s == "down" {
		f.proven("%s operstate %q", c.netns.ctlHost, s)
	} else {
		f.unproven("%s operstate %q", c.netns.ctlHost, s)
	}
	sleepCtx(ctx, st.dur)
	if err := c.netns.setLink(true); err != nil {
		return err
	}
	f.end(ctx)
	return nil
}
