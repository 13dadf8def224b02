package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
)

// Cluster is a multi-member etcd cluster run inside this process on
// loopback ports: for fault tests of the control plane, and for trying a
// replicated setup on one machine. Members can be stopped and restarted
// one by one.
type Cluster struct {
	mu      sync.Mutex
	cfgs    []EmbeddedConfig
	members []*Embedded // nil while stopped
}

// StartEmbeddedCluster starts an n-member etcd cluster with its data in
// dir/member-<i> (dir must not hold a cluster already) and waits, bounded
// by ctx, until every member is ready. The members start in parallel, as
// each needs a quorum of the others to become ready. On error nothing is
// left running. etcd's errors go to slog.Default(); warnings are dropped.
func StartEmbeddedCluster(ctx context.Context, dir string, n int) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("store: start embedded cluster: %d members; want at least 1", n)
	}
	for attempt := 0; ; attempt++ {
		c, err := startCluster(ctx, dir, n)
		if err != nil && errors.Is(err, syscall.EADDRINUSE) && attempt < 3 {
			// A picked port was taken before etcd bound it: the data dirs
			// are fresh, so wipe them and pick again.
			for i := range n {
				os.RemoveAll(memberDir(dir, i))
			}
			continue
		}
		return c, err
	}
}

func memberDir(dir string, i int) string { return filepath.Join(dir, fmt.Sprintf("member-%d", i)) }

func startCluster(ctx context.Context, dir string, n int) (*Cluster, error) {
	urls, err := freeLoopbackURLs(2 * n)
	if err != nil {
		return nil, fmt.Errorf("store: start embedded cluster: %w", err)
	}
	c := &Cluster{cfgs: make([]EmbeddedConfig, n), members: make([]*Embedded, n)}
	var initial []string
	for i := range n {
		c.cfgs[i] = EmbeddedConfig{
			Dir:          memberDir(dir, i),
			Name:         fmt.Sprintf("etcd-%d", i),
			ClientURL:    urls[2*i],
			PeerURL:      urls[2*i+1],
			ClusterToken: "keyshard-" + filepath.Base(dir),
		}
		initial = append(initial, c.cfgs[i].Name+"="+c.cfgs[i].PeerURL)
	}
	for i := range c.cfgs {
		c.cfgs[i].InitialCluster = strings.Join(initial, ",")
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { // exits once member i is ready or failed
			c.members[i], errs[i] = startEmbedded(ctx, c.cfgs[i])
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Close()
		return nil, fmt.Errorf("store: start embedded cluster in %s: %w", dir, err)
	}
	return c, nil
}

// Len returns the number of members, running or stopped.
func (c *Cluster) Len() int { return len(c.cfgs) }

// Endpoints returns the client URLs of every member, running or stopped,
// for Open: the client fails over between them.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.cfgs))
	for i, cfg := range c.cfgs {
		eps[i] = cfg.ClientURL
	}
	return eps
}

// Member returns member i, or nil while it is stopped.
func (c *Cluster) Member(i int) *Embedded {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i]
}

// Stop stops member i and waits until it is down. Stopping a stopped
// member does nothing.
func (c *Cluster) Stop(i int) {
	c.mu.Lock()
	m := c.members[i]
	c.members[i] = nil
	c.mu.Unlock()
	if m != nil {
		m.Close()
	}
}

// Restart starts stopped member i again from its data directory, on the
// same URLs, and waits (bounded by ctx) until it is ready.
func (c *Cluster) Restart(ctx context.Context, i int) error {
	c.mu.Lock()
	running := c.members[i] != nil
	c.mu.Unlock()
	if running {
		return fmt.Errorf("store: restart cluster member %d: it is running", i)
	}
	m, err := startEmbedded(ctx, c.cfgs[i])
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.members[i] = m
	c.mu.Unlock()
	return nil
}

// Close stops every running member and waits until all are down. It is
// idempotent. Followers stop first, in parallel, then the etcd leader:
// a leader that stops while its followers are up first hands leadership
// over, which stalls for seconds if they are stopping too.
func (c *Cluster) Close() {
	c.mu.Lock()
	ms := c.members
	c.members = make([]*Embedded, len(ms))
	c.mu.Unlock()
	var followers, leaders []*Embedded
	for _, m := range ms {
		switch {
		case m == nil:
		case m.IsLeader():
			leaders = append(leaders, m)
		default:
			followers = append(followers, m)
		}
	}
	for _, group := range [][]*Embedded{followers, leaders} {
		var wg sync.WaitGroup
		for _, m := range group {
			wg.Go(m.Close) // exits once the member is down
		}
		wg.Wait()
	}
}
