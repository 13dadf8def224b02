package store

import (
	"context"
	"fmt"
	"time"
)

// Health is one status read of the store's endpoints.
type Health struct {
	Endpoints []string
	// Healthy: every endpoint answered. Err says why not, naming the
	// endpoint.
	Healthy bool
	Err     error
	// DBSize and Revision are those the first endpoint that answered
	// reported; 0 if none did.
	DBSize   int64
	Revision int64
	// Latency is how long the read took.
	Latency time.Duration
}

// Health asks every endpoint of the store for its status, each bounded by
// ctx and timeout, one after the other.
func (s *Store) Health(ctx context.Context, timeout time.Duration) Health {
	h := Health{Endpoints: s.client.Endpoints(), Healthy: true}
	if s.closed() {
		h.Healthy, h.Err = false, errClosed("health")
		return h
	}
	start := time.Now()
	for _, ep := range h.Endpoints {
		sctx, cancel := context.WithTimeout(ctx, timeout)
		resp, err := s.client.Status(sctx, ep)
		cancel()
		if err != nil {
			if h.Healthy {
				h.Healthy, h.Err = false, fmt.Errorf("store: endpoint %s: %w", ep, s.err("status", err))
			}
			continue
		}
		if h.Revision == 0 && resp.Header != nil {
			h.DBSize, h.Revision = resp.DbSize, resp.Header.Revision
		}
		if len(resp.Errors) > 0 && h.Healthy {
			h.Healthy, h.Err = false, fmt.Errorf("store: endpoint %s reports: %v", ep, resp.Errors)
		}
	}
	h.Latency = time.Since(start)
	return h
}
