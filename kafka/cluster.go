package kafka

import (
	"context"
	"time"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/hotkey"
)

// ClusterHotKeysConfig joins a Router to cluster-wide hot-key detection
// through Keyshard's control plane (see Config.ClusterHotKeys).
type ClusterHotKeysConfig struct {
	// Client reaches the control plane (client.Dial), with a token of the
	// member or admin role. Required. The router does not own it: close
	// it after the router.
	Client *client.Client
	// Pool is the hot-key pool of the producers that write these topics;
	// an operator creates it (`keyshard hotkeys pool put`). Required.
	Pool string
	// Producer names this router in the pool: unique among the pool's
	// producers, and stable across restarts (host name and role, say).
	// Required. See client.HotKeysConfig.Producer.
	Producer string
	// Interval is the time between two reports. Default
	// client.DefaultHotKeysInterval.
	Interval time.Duration
}

// ClusterStats is the state of a router's cluster-wide hot-key sync.
type ClusterStats struct {
	// Version is the version of the cluster overflow set in force (0:
	// none yet), and Keys its number of keys.
	Version uint64
	Keys    int
	// TruncatedKeys counts hot keys left out of reports because the
	// detector keeps only their first MaxKeyLen bytes, so they cannot be
	// named (raise hotkey.DetectorConfig.MaxKeyLen to report them).
	TruncatedKeys uint64
	// Sync is the client's own counters (zero without
	// Config.ClusterHotKeys): reports sent and failed, watch failures, the
	// pool's report threshold and the last successful contact.
	Sync client.HotKeysStats
}

// newHotKeys builds the cluster hot-key sync of cfg.ClusterHotKeys.
func (r *Router) newHotKeys(cfg Config) (*client.HotKeys, error) {
	h := cfg.ClusterHotKeys
	return client.NewHotKeys(h.Client, client.HotKeysConfig{
		Pool:     h.Pool,
		Producer: h.Producer,
		Interval: h.Interval,
		Report:   r.clusterReport,
		OnSet:    func(s hotkey.OverflowSet) { r.ApplyClusterSet(s) },
	}, client.Clock(cfg.Clock), client.Logger(cfg.Logger))
}

// syncHotKeys runs the cluster hot-key sync until ctx ends.
func (r *Router) syncHotKeys(ctx context.Context) {
	defer r.wg.Done()
	err := r.hot.Run(ctx)
	if ctx.Err() == nil { // the Client was closed before the router
		r.log.Warn("kafka router: the Keyshard client was closed; the cluster overflow set in force stays until the router closes",
			"version", r.Stats().Cluster.Version, "err", err)
	}
}

// clusterReport is the sync's Report: the keys whose local rate's upper
// bound is at least minRate, except those the detector holds truncated.
// Only the detector's scan runs under the router's lock.
func (r *Router) clusterReport(now time.Time, minRate float64) []hotkey.KeyRate {
	r.mu.Lock()
	hot := r.policy.Detector().AppendAbove(nil, minRate, now)
	r.mu.Unlock()
	keys := make([]hotkey.KeyRate, 0, len(hot))
	truncated := 0
	for _, h := range hot {
		if h.Truncated {
			truncated++
			continue
		}
		keys = append(keys, hotkey.KeyRate{Key: h.Key, Rate: h.Rate})
	}
	r.clusterTruncated.Add(uint64(truncated))
	return keys
}

// ApplyClusterSet installs set as the cluster overflow set in force if its
// version is above the current one (initially 0), and reports whether it
// did. Its keys then go to overflow, keyed, through the same drain
// barriers as locally hot keys; a key that leaves the set stays in
// overflow until its overflow records are committed (and, if it was hot
// locally, it has cooled down), then returns to main carrying
// HeaderWaitOverflow (see hotkey.Policy.SetClusterKeys).
//
// The cluster hot-key sync (Config.ClusterHotKeys) calls it with every
// newer set. Call it yourself to drive the router from another source of
// sets, or from a test. It never blocks on the network, and is safe for
// concurrent use.
func (r *Router) ApplyClusterSet(set hotkey.OverflowSet) bool {
	keys := set.Keys()
	r.mu.Lock()
	defer r.mu.Unlock()
	if set.Version <= r.clusterVersion {
		return false
	}
	r.policy.SetClusterKeys(keys)
	r.clusterVersion = set.Version
	r.clusterKeys = r.policy.Counters().ClusterKeys
	close(r.clusterChanged)
	r.clusterChanged = make(chan struct{})
	return true
}

// WaitClusterVersion blocks until the cluster overflow set in force has
// reached version v, ctx is done (returning ctx.Err()), or the router is
// closed (returning ErrClosed).
func (r *Router) WaitClusterVersion(ctx context.Context, v uint64) error {
	for {
		r.mu.Lock()
		cur, closed, ch := r.clusterVersion, r.closed, r.clusterChanged
		r.mu.Unlock()
		switch {
		case cur >= v:
			return nil
		case closed:
			return ErrClosed
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
