package store

import (
	"context"
	"slices"
	"sync"
	"time"
)

// How often, and how patiently, checkEndpoints asks each etcd endpoint
// for its status.
const (
	endpointCheckEvery   = 500 * time.Millisecond
	endpointCheckTimeout = 400 * time.Millisecond
)

// checkEndpoints keeps the client's endpoints to those that answer. The
// client spreads requests over a connection per endpoint, and a member
// that is paused (or whose host stopped answering) keeps its connection
// looking alive: gRPC's keepalive, at least 10 s, is far slower than a
// member lease. Every endpointCheckEvery it asks each of all for its
// status within endpointCheckTimeout, on a connection of its own, and
// gives the client only those that answered (all of them if none did),
// so that requests stop going to a stuck member within about a second and
// go to it again once it answers. It returns when the client is closed.
func (s *Store) checkEndpoints(all []string) {
	ctx := s.client.Ctx()
	tick := time.NewTicker(endpointCheckEvery)
	defer tick.Stop()
	current := slices.Clone(all)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		healthy := s.answering(ctx, all)
		if len(healthy) == 0 {
			healthy = all
		}
		if slices.Equal(healthy, current) {
			continue
		}
		if len(healthy) < len(all) {
			s.log.Warn("etcd endpoints not answering; sending requests to the others until they do", "answering", healthy, "all", all)
		} else {
			s.log.Info("every etcd endpoint answers again", "endpoints", all)
		}
		s.client.SetEndpoints(healthy...)
		current = healthy
	}
}

// answering returns the endpoints of all that answer a status request in
// time, in all's order.
func (s *Store) answering(ctx context.Context, all []string) []string {
	ok := make([]bool, len(all))
	var wg sync.WaitGroup
	for i, ep := range all {
		wg.Go(func() { // exits within endpointCheckTimeout
			cctx, cancel := context.WithTimeout(ctx, endpointCheckTimeout)
			defer cancel()
			_, err := s.client.Status(cctx, ep)
			ok[i] = err == nil
		})
	}
	wg.Wait()
	var out []string
	for i, ep := range all {
		if ok[i] {
			out = append(out, ep)
		}
	}
	return out
}
