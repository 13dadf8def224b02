package chaos

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/internal/freeport"
)

// ServingRE matches keyshard serve's log line once its API is up and its
// view loaded; its group is the address it listens on (the port it was
// given, or the one it chose for --listen host:0).
var ServingRE = regexp.MustCompile(`msg="keyshard serving" listen=(\S+)`)

// etcdReadyRE matches an etcd member process's line once it is ready.
var etcdReadyRE = regexp.MustCompile(`msg="etcd member ready"`)

// Keyspace is the keyspace the chaos workers join.
const Keyspace = "chaos"

// member is one etcd member process.
type member struct {
	name, dir          string
	clientURL, peerURL string
	initial            string
	proc               *Proc
	cli                *clientv3.Client // straight to this member, for Status
}

// replica is one `keyshard serve` process.
type replica struct {
	name, addr string
	etcd       []*Proxy // one per etcd member: its way to etcd
	proc       *Proc
}

// worker is one chaos worker process and the fault proxies it reaches
// the replicas through, one per replica.
type worker struct {
	id    string
	proxy Proxies
	proc  *Proc
	netns bool // runs in the cluster's network namespace
}

// cluster is the chaos suite's world of real processes: three etcd
// members, two serve replicas that reach etcd through fault proxies,
// workers that reach the replicas through fault proxies, and the fenced
// sink in this process.
type cluster struct {
	cfg  Config
	sink *Sink

	members  []*member
	replicas []*replica
	workers  []*worker
	admins   []*client.Client // one per replica, not through a proxy
	netns    *netnsLink       // nil unless the netns fault kind runs

	mu sync.Mutex // guards the procs fields against the teardown
}

// start brings the cluster up: etcd, replicas, keyspace, workers, and
// waits until every bucket is served.
func (c *cluster) start(ctx context.Context, p *progress, netns bool) error {
	var err error
	if c.sink, err = NewSink("127.0.0.1:0"); err != nil {
		return err
	}
	// The first record starts the record's clock, by which the analysis
	// says when each fault happened.
	c.sink.Mark(Note, "chaos", "starting the cluster")
	// Ports below the ephemeral range: a member or replica restarted by a
	// fault comes back on its port, which no outgoing connection took
	// while it was down.
	addrs, err := freeport.Addrs(2*c.cfg.Members + len(replicaNames))
	if err != nil {
		return err
	}
	var initial []string
	for i := range c.cfg.Members {
		m := &member{
			name:      fmt.Sprintf("etcd-%d", i),
			clientURL: "http://" + addrs[2*i],
			peerURL:   "http://" + addrs[2*i+1],
		}
		m.dir = filepath.Join(c.cfg.Dir, m.name)
		initial = append(initial, m.name+"="+m.peerURL)
		c.members = append(c.members, m)
	}
	p.printf("starting %d etcd members", len(c.members))
	errs := make([]error, len(c.members))
	var wg sync.WaitGroup
	for i, m := range c.members {
		m.initial = strings.Join(initial, ",")
		wg.Go(func() { errs[i] = c.startMember(ctx, m) }) // exits once the member is ready or failed
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, m := range c.members {
		if m.cli, err = clientv3.New(clientv3.Config{Endpoints: []string{m.clientURL}, DialTimeout: time.Second, Logger: zap.NewNop()}); err != nil {
			return fmt.Errorf("etcd client of %s: %w", m.name, err)
		}
	}
	p.printf("starting %d serve replicas on etcd (each through its own fault proxies)", len(replicaNames))
	for i, name := range replicaNames {
		r := &replica{name: name, addr: addrs[2*c.cfg.Members+i]}
		for _, m := range c.members {
			px, err := NewProxy("127.0.0.1:0", strings.TrimPrefix(m.clientURL, "http://"))
			if err != nil {
				return err
			}
			r.etcd = append(r.etcd, px)
		}
		c.replicas = append(c.replicas, r)
		if err := c.startReplica(ctx, r); err != nil {
			return err
		}
		cl, err := client.Dial("http://" + r.addr)
		if err != nil {
			return err
		}
		c.admins = append(c.admins, cl)
	}
	if err := c.createKeyspace(ctx); err != nil {
		return err
	}
	p.printf("starting %d workers (each given both replicas' URLs, each through a fault proxy of its own)", c.cfg.Workers)
	if netns {
		if c.netns, err = newNetnsLink(strings.TrimPrefix(c.sink.URL(), "http://")); err != nil {
			return err
		}
		p.printf("worker w%d runs in network namespace %s (veth %s)", c.cfg.Workers, c.netns.ns, c.netns.ctlHost)
	}
	for i := range c.cfg.Workers {
		backends := []string{c.replicas[i%2].addr, c.replicas[(i+1)%2].addr}
		w := &worker{id: fmt.Sprintf("w%d", i+1), netns: netns && i == c.cfg.Workers-1}
		listen := "127.0.0.1:0"
		if w.netns {
			listen = c.netns.ctlIP + ":0"
		}
		for _, b := range backends {
			px, err := NewProxy(listen, b)
			if err != nil {
				return err
			}
			w.proxy = append(w.proxy, px)
		}
		c.workers = append(c.workers, w)
		if err := c.startWorker(w, false); err != nil {
			return err
		}
	}
	return nil
}

var replicaNames = []string{"r1", "r2"}

func (c *cluster) startMember(ctx context.Context, m *member) error {
	pr, err := StartProc(m.name, c.cfg.Log, c.cfg.Binary, "chaos", "etcd",
		"--name", m.name, "--dir", m.dir, "--client-url", m.clientURL, "--peer-url", m.peerURL,
		"--initial-cluster", m.initial, "--cluster-token", "keyshard-chaos", "--election-timeout", c.cfg.EtcdElection.String())
	if err != nil {
		return err
	}
	c.setProc(&m.proc, pr)
	actx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err := pr.Await(actx, etcdReadyRE); err != nil {
		return err
	}
	return nil
}

func (c *cluster) startReplica(ctx context.Context, r *replica) error {
	var eps []string
	for _, px := range r.etcd {
		eps = append(eps, px.URL())
	}
	pr, err := StartProc(r.name, c.cfg.Log, c.cfg.Binary, "serve", "--replica", r.name, "--listen", r.addr,
		"--etcd-endpoints", strings.Join(eps, ","), "--election-ttl", c.cfg.ElectionTTL.String())
	if err != nil {
		return err
	}
	c.setProc(&r.proc, pr)
	actx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	_, err = pr.Await(actx, ServingRE)
	return err
}

func (c *cluster) startWorker(w *worker, replace bool) error {
	sink := c.sink.URL()
	if w.netns {
		sink = c.netns.sinkProxy.URL()
	}
	args := []string{"chaos", "worker", "--server", w.proxy.URL(), "--sink", sink, "--keyspace", Keyspace,
		"--id", w.id, "--interval", c.cfg.Interval.String()}
	if replace {
		args = append(args, "--replace")
	}
	cmd := exec.Command(c.cfg.Binary, args...)
	if w.netns {
		cmd = c.netns.command(c.cfg.Binary, args...)
	}
	pr, err := startProc(w.id, c.cfg.Log, cmd)
	if err != nil {
		return err
	}
	c.setProc(&w.proc, pr)
	return nil
}

func (c *cluster) setProc(dst **Proc, p *Proc) {
	c.mu.Lock()
	*dst = p
	c.mu.Unlock()
}

// createKeyspace creates the keyspace through any replica, retrying while
// the replicas elect a leader.
func (c *cluster) createKeyspace(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var last error
	for i := 0; ; i++ {
		actx, acancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := c.admins[i%len(c.admins)].Admin().CreateKeyspace(actx, client.KeyspaceConfig{
			Name: Keyspace, Buckets: c.cfg.Buckets, LeaseTTL: c.cfg.TTL, DrainTimeout: c.cfg.DrainTimeout,
		})
		acancel()
		if err == nil || errors.Is(err, client.ErrExists) {
			return nil
		}
		last = err
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return fmt.Errorf("create keyspace %q: %w (last: %v)", Keyspace, ctx.Err(), last)
		}
	}
}

// etcdLeader returns the member that leads etcd, as a running member
// answers, and the raft term; nil if no member answers within a second.
func (c *cluster) etcdLeader(ctx context.Context) (*member, uint64) {
	for _, m := range c.members {
		if m.proc.Exited() {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := m.cli.Status(actx, m.clientURL)
		cancel()
		if err != nil || st.Leader == 0 {
			continue
		}
		for _, o := range c.members {
			actx, cancel := context.WithTimeout(ctx, time.Second)
			ost, err := o.cli.Status(actx, o.clientURL)
			cancel()
			if err == nil && ost.Header.MemberId == st.Leader {
				return o, st.RaftTerm
			}
		}
	}
	return nil, 0
}

// close kills every process, closes the proxies, clients and the sink.
func (c *cluster) close() {
	c.mu.Lock()
	var procs []*Proc
	for _, w := range c.workers {
		procs = append(procs, w.proc)
	}
	for _, r := range c.replicas {
		procs = append(procs, r.proc)
	}
	for _, m := range c.members {
		procs = append(procs, m.proc)
	}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		if p != nil {
			wg.Go(p.Kill) // exits once the process is reaped
		}
	}
	wg.Wait()
	for _, w := range c.workers {
		w.proxy.Close()
	}
	for _, r := range c.replicas {
		for _, px := range r.etcd {
			px.Close()
		}
	}
	for _, cl := range c.admins {
		cl.Close()
	}
	for _, m := range c.members {
		if m.cli != nil {
			m.cli.Close()
		}
	}
	if c.netns != nil {
		c.netns.close()
	}
	if c.sink != nil {
		c.sink.Close()
	}
}

// sleepCtx waits for d or until ctx ends, and reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
