package clienttest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
)

// Replica is another replica of the fake control plane: a URL of its
// own in front of the same state, as a second keyshard serve replica on
// the same etcd. A client dialed with several URLs
// (client.Dial(f.URL()+","+r.URL())) moves on from a replica that hangs
// or answers unavailable; Pause and Refuse make one do that, on cue. Its
// methods are safe for concurrent use.
type Replica struct {
	s       *Server
	srv     *httptest.Server
	blocked *Requests[string]

	mu    sync.Mutex
	mode  replicaMode
	calls map[string]int
}

type replicaMode int

const (
	replicaServing replicaMode = iota
	replicaPaused
	replicaRefusing
)

// AddReplica starts a Replica of the fake, serving. It is closed with the
// Server.
func (s *Server) AddReplica() *Replica {
	r := &Replica{s: s, calls: map[string]int{}, blocked: newRequests[string]()}
	r.srv = serve(http.HandlerFunc(r.serveHTTP))
	s.mu.Lock()
	s.replicas = append(s.replicas, r)
	s.mu.Unlock()
	return r
}

func (r *Replica) serveHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	mode := r.mode
	r.calls[req.URL.Path]++
	r.mu.Unlock()
	switch mode {
	case replicaPaused:
		r.blocked.add(req.URL.Path)
		r.s.hold(req.Context())
		return
	case replicaRefusing:
		r.blocked.add(req.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `{"code":"unavailable","message":"this replica cannot reach etcd"}`)
		return
	}
	r.s.srv.Config.Handler.ServeHTTP(w, req)
}

// URL returns the replica's base URL.
func (r *Replica) URL() string { return r.srv.URL }

// Pause makes the replica hold every new call until its caller gives up,
// as a replica whose process is stopped (or cut off by the network)
// does: the client waits client.ReplicaTimeout, then tries the next
// replica. Calls already being served go on.
func (r *Replica) Pause() { r.set(replicaPaused) }

// Refuse makes the replica answer every new call with code unavailable
// at once (as HTTP 503, "this replica cannot reach etcd"), as a replica
// cut off from etcd does: the client tries the next replica at once.
func (r *Replica) Refuse() { r.set(replicaRefusing) }

// Serve makes the replica serve again after Pause or Refuse.
func (r *Replica) Serve() { r.set(replicaServing) }

func (r *Replica) set(m replicaMode) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mode = m
}

// CallCount returns how many calls of procedure reached this replica,
// held and refused ones included.
func (r *Replica) CallCount(procedure string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[procedure]
}

// Blocked are the procedures of the calls this replica held (Pause) or
// refused (Refuse), in the order they arrived.
func (r *Replica) Blocked() *Requests[string] { return r.blocked }
