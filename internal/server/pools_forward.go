package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/internal/store"
)

// Forwarding. Load reports, readiness marks and live rates live in the
// leader's memory. A replica that does not lead forwards those calls to
// the leader: it reads the leader's replica id from the election and the
// URL that replica advertises (replicas/<id>, on the replica's session),
// and calls the leader with the caller's Authorization header and
// forwardedHeader. A forwarded call that reaches a replica that does not
// lead (leadership moved meanwhile) is not forwarded again: it answers
// UNAVAILABLE, and the caller retries.

// forwardedHeader marks a call forwarded by another replica; its value is
// the forwarding replica's id.
const forwardedHeader = "Keyshard-Forwarded-By"

// forwardTimeout bounds one forwarded call.
const forwardTimeout = 10 * time.Second

var errLeadershipMoving = errors.New("leadership is moving; retry")

func leadershipMoving(detail string) error {
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%w (%s)", errLeadershipMoving, detail))
}

// leaderCacheTTL is how long a replica forwards to the leader it last
// read from the election without reading it again: load reports arrive
// many times a second, and each would otherwise cost an etcd read. A
// failed forward forgets it at once.
const leaderCacheTTL = time.Second

// forwarder holds the clients of the leaders this replica forwarded to,
// and the leader it last read.
type forwarder struct {
	http     *http.Client
	mu       sync.Mutex
	by       map[string]keyshardv1connect.TenantPoolServiceClient // by URL
	leader   string                                               // "" : read the election
	leaderAt time.Time
}

// cachedLeader returns the leader read less than leaderCacheTTL before
// now, or "".
func (f *forwarder) cachedLeader(now time.Time) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.leader == "" || now.Sub(f.leaderAt) >= leaderCacheTTL {
		return ""
	}
	return f.leader
}

func (f *forwarder) setLeader(id string, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leader, f.leaderAt = id, at
}

func newForwarder(cfg Config) (*forwarder, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if cfg.TLS.CAFile != "" {
		pem, err := os.ReadFile(cfg.TLS.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: tls.ca_file: %v", ErrConfig, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: tls.ca_file: %s holds no PEM certificate", ErrConfig, cfg.TLS.CAFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &forwarder{http: &http.Client{Transport: tr}, by: map[string]keyshardv1connect.TenantPoolServiceClient{}}, nil
}

func (f *forwarder) client(url string) keyshardv1connect.TenantPoolServiceClient {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.by[url]
	if c == nil {
		c = keyshardv1connect.NewTenantPoolServiceClient(f.http, url)
		f.by[url] = c
	}
	return c
}

// toLeader says where a leader-only call goes: local is this replica's
// loop when it leads; otherwise remote is the leader's client.
func (s *Server) toLeader(ctx context.Context, h http.Header) (local *tpLeader, remote keyshardv1connect.TenantPoolServiceClient, err error) {
	if l := s.tpLeader.Load(); l != nil {
		return l, nil, nil
	}
	if h.Get(forwardedHeader) != "" {
		return nil, nil, leadershipMoving(fmt.Sprintf("forwarded by %s to %s, which does not lead", h.Get(forwardedHeader), s.cfg.Replica))
	}
	id := s.forward.cachedLeader(s.clock.Now())
	if id == "" {
		id, err = s.store.Leader(ctx)
		if err == nil && id != s.cfg.Replica {
			s.forward.setLeader(id, s.clock.Now())
		}
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, nil, leadershipMoving("no leader is elected")
	case err != nil:
		return nil, nil, apiError(err)
	case id == s.cfg.Replica:
		return nil, nil, leadershipMoving("this replica was elected and is starting to lead")
	}
	var url string
	s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		if e, ok := snap.Replicas[id]; ok {
			url = e.Value
		}
	})
	if url == "" {
		if url, err = s.store.ReplicaURL(ctx, id); err != nil {
			return nil, nil, leadershipMoving(fmt.Sprintf("the leader %s has not advertised its URL", id))
		}
	}
	return nil, s.forward.client(url), nil
}

// forwarded prepares req, a copy of the caller's message, for the leader.
func forwardRequest[T any](s *Server, msg *T, from http.Header) *connect.Request[T] {
	req := connect.NewRequest(msg)
	if a := from.Get("Authorization"); a != "" {
		req.Header().Set("Authorization", a)
	}
	req.Header().Set(forwardedHeader, s.cfg.Replica)
	return req
}

// countForward counts a forwarded call.
func (s *Server) countForward(call string, err error) {
	result := "ok"
	if err != nil {
		result = "error"
		s.forward.setLeader("", time.Time{}) // read the election again
	}
	s.metrics.tpForwarded.WithLabelValues(call, result).Inc()
}

// advertise keeps replicas/<id> holding this replica's API URL, on a
// session of its own, until ctx ends.
func (s *Server) advertise(ctx context.Context) error {
	if err := store.ValidateName(store.KindReplica, s.cfg.Replica); err != nil {
		s.log.Warn("replica id is not a valid name; other replicas cannot forward tenant-pool calls to this one while it leads", "replica", s.cfg.Replica, "err", err)
		<-ctx.Done()
		return nil
	}
	url := s.advertiseURL(s.addr)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		sess, err := s.store.NewSession(ctx, s.cfg.ElectionTTL)
		if err == nil {
			err = s.store.PutReplica(ctx, s.cfg.Replica, url, sess.LeaseID())
			if err == nil {
				s.log.Debug("advertised the API URL", "replica", s.cfg.Replica, "url", url)
				backoff = 100 * time.Millisecond
				select {
				case <-ctx.Done():
				case <-sess.Done():
				}
			}
			_ = sess.Close() // best effort: the lease expires otherwise
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			s.log.Warn("could not advertise the API URL; retrying", "err", err)
		}
		t := s.clock.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	return nil
}
