package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/clock/clocktest"
)

// fakeServer is a small stateful stand-in for `keyshard serve`: the four
// services of keyshard.v1 over a real httptest.Server (HTTP/1.1 and h2c),
// driven by the test. Time-based waits (GetMap, GetGrants and
// GetOverflowSet long polls) use the fake clock.
type fakeServer struct {
	t     *testing.T
	clock *clocktest.Fake
	srv   *httptest.Server
	token string // if set, every call must carry it
	quit  chan struct{}

	mu        sync.Mutex
	changed   chan struct{} // closed and replaced on every state change
	keyspaces map[string]*keyshardv1.Keyspace
	maps      map[string]*keyshardv1.Map
	members   []*keyshardv1.MemberStatus // what ListMembers returns
	sessions  map[string]*fakeSession
	nextID    int
	lastToken uint64
	pools     map[string]*keyshardv1.HotKeyPool
	sets      map[string]*keyshardv1.OverflowSet

	// Behaviour switches.
	kaMode            string        // "", "fail", "hang", "gate", "notfound"
	kaGate            chan struct{} // "gate": each keep-alive waits for a value
	kaDelay           time.Duration // "delay": each keep-alive answers after this much fake time
	joinDelay         time.Duration // each Join answers after this much fake time
	joinHangs         int           // this many Joins hang until the caller gives up
	joinedAt          []time.Time   // the fake time at which each Join arrived
	watchMapErr       int           // fail this many WatchMap calls with Unavailable
	watchMapUnimpl    bool
	watchGrantsUnimpl bool
	joinErr           error          // returned by the next Join
	leaveIgnored      bool           // Leave succeeds but changes nothing
	releaseGate       chan struct{}  // if set, each Release waits for a value
	failNext          *connect.Error // returned by the next admin call
	hotDown           bool           // every HotKeyService call fails with Unavailable; open watches end
	watchSetUnimpl    bool
	reportErr         *connect.Error // returned by every ReportHotKeys while set

	// Observations, buffered so the server never blocks on the test.
	joins      chan *keyshardv1.JoinRequest
	keepAlives chan string
	releases   chan *keyshardv1.ReleaseRequest
	leaves     chan string
	getMaps    chan *keyshardv1.GetMapRequest
	getGrants  chan *keyshardv1.GetGrantsRequest
	watchMaps  chan *keyshardv1.WatchMapRequest
	reports    chan *keyshardv1.ReportHotKeysRequest
	watchSets  chan *keyshardv1.WatchOverflowSetRequest
	getSets    chan *keyshardv1.GetOverflowSetRequest
	calls      map[string]int
	armed      chan string // "join" or "keep-alive": a delayed call armed its fake-clock timer
}

type fakeSession struct {
	id      string
	member  *keyshardv1.Member
	grants  map[uint32]uint64
	release map[uint32]bool
	rev     uint64
	gone    bool
	leaving bool
}

func newFake(t *testing.T) *fakeServer {
	t.Helper()
	f := &fakeServer{
		t:          t,
		clock:      clocktest.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
		quit:       make(chan struct{}),
		changed:    make(chan struct{}),
		keyspaces:  map[string]*keyshardv1.Keyspace{},
		maps:       map[string]*keyshardv1.Map{},
		sessions:   map[string]*fakeSession{},
		kaGate:     make(chan struct{}),
		joins:      make(chan *keyshardv1.JoinRequest, 1024),
		keepAlives: make(chan string, 1024),
		releases:   make(chan *keyshardv1.ReleaseRequest, 1024),
		leaves:     make(chan string, 1024),
		getMaps:    make(chan *keyshardv1.GetMapRequest, 1024),
		getGrants:  make(chan *keyshardv1.GetGrantsRequest, 1024),
		watchMaps:  make(chan *keyshardv1.WatchMapRequest, 1024),
		reports:    make(chan *keyshardv1.ReportHotKeysRequest, 1024),
		watchSets:  make(chan *keyshardv1.WatchOverflowSetRequest, 1024),
		getSets:    make(chan *keyshardv1.GetOverflowSetRequest, 1024),
		pools:      map[string]*keyshardv1.HotKeyPool{},
		sets:       map[string]*keyshardv1.OverflowSet{},
		calls:      map[string]int{},
		armed:      make(chan string, 1024),
	}
	mux := http.NewServeMux()
	opt := connect.WithInterceptors(authInterceptor{f})
	mux.Handle(keyshardv1connect.NewAdminServiceHandler(fakeAdmin{f}, opt))
	mux.Handle(keyshardv1connect.NewMemberServiceHandler(fakeMember{f}, opt))
	mux.Handle(keyshardv1connect.NewMapServiceHandler(fakeMap{f}, opt))
	mux.Handle(keyshardv1connect.NewHotKeyServiceHandler(fakeHot{f}, opt))
	f.srv = startServer(t, mux, f.quit)
	return f
}

// startServer serves h over HTTP/1.1 and h2c until the test ends, when it
// first closes quit (which must end h's waits) and then the server.
func startServer(t *testing.T, h http.Handler, quit chan struct{}) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(func() {
		close(quit)
		srv.Close()
	})
	return srv
}

// authInterceptor checks the bearer token (if the test set one) and
// counts calls per procedure.
type authInterceptor struct{ f *fakeServer }

func (a authInterceptor) check(procedure string, h http.Header) error {
	a.f.mu.Lock()
	defer a.f.mu.Unlock()
	a.f.calls[procedure]++
	if a.f.token != "" && h.Get("Authorization") != "Bearer "+a.f.token {
		return connect.NewError(connect.CodeUnauthenticated, errors.New("missing or bad bearer token"))
	}
	return nil
}

func (a authInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if err := a.check(req.Spec().Procedure, req.Header()); err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (a authInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (a authInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if err := a.check(conn.Spec().Procedure, conn.RequestHeader()); err != nil {
			return err
		}
		return next(ctx, conn)
	}
}

// callCount returns how many calls reached procedure (for example
// keyshardv1connect.AdminServiceCreateKeyspaceProcedure).
func (f *fakeServer) callCount(procedure string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[procedure]
}

func (f *fakeServer) dial(t *testing.T, opts ...Option) *Client {
	t.Helper()
	opts = append([]Option{Clock(f.clock)}, opts...)
	c, err := Dial(f.srv.URL, opts...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// notifyLocked wakes every waiter on the server's state.
func (f *fakeServer) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

type waitResult int

const (
	waitChanged waitResult = iota
	waitTimedOut
	waitCancelled
)

// waitChangeLocked waits for a state change, ctx, or timer (a fake-clock
// timer, or nil). It must be called with f.mu held and returns with it
// held.
func (f *fakeServer) waitChangeLocked(ctx context.Context, timer <-chan time.Time) waitResult {
	ch := f.changed
	f.mu.Unlock()
	defer f.mu.Lock()
	select {
	case <-ch:
		return waitChanged
	case <-timer:
		return waitTimedOut
	case <-ctx.Done():
		return waitCancelled
	case <-f.quit:
		return waitCancelled
	}
}

// addKeyspace creates a keyspace with buckets buckets. Like the real
// server, it has no map until setMap (its first epoch).
func (f *fakeServer) addKeyspace(name string, buckets int, ttl time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keyspaces[name] = &keyshardv1.Keyspace{Name: name, Buckets: uint32(buckets), Hash: "xxh64", Mode: keyshardv1.KeyspaceMode_KEYSPACE_MODE_EXCLUSIVE,
		LeaseTtl: durationpb.New(ttl), DrainTimeout: durationpb.New(30 * time.Second)}
	f.notifyLocked()
}

// setMap publishes a new map of ks at the next epoch: owner(b) names the
// member id owning bucket b ("" = unassigned).
func (f *fakeServer) setMap(ks string, members []*keyshardv1.Member, owner func(b int) string) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := f.keyspaces[ks]
	idx := map[string]uint32{}
	for i, m := range members {
		idx[m.GetId()] = uint32(i + 1)
	}
	m := &keyshardv1.Map{Keyspace: ks, Epoch: f.maps[ks].GetEpoch() + 1, Buckets: k.GetBuckets(), Hash: k.GetHash(), Members: members, Owners: make([]uint32, k.GetBuckets())}
	for b := range m.Owners {
		m.Owners[b] = idx[owner(b)]
	}
	f.maps[ks] = m
	f.notifyLocked()
	return m.Epoch
}

// grant grants bucket b to session id with a new token and returns it.
func (f *fakeServer) grant(id string, b int) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.sessions[id]
	f.lastToken++
	s.grants[uint32(b)] = f.lastToken
	delete(s.release, uint32(b))
	s.rev++
	f.notifyLocked()
	return f.lastToken
}

// askRelease lists bucket b in session id's release set.
func (f *fakeServer) askRelease(id string, b int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.sessions[id]
	s.release[uint32(b)] = true
	s.rev++
	f.notifyLocked()
}

// endSession deletes session id, as an expired or revoked lease would.
func (f *fakeServer) endSession(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.endSessionLocked(f.sessions[id])
}

func (f *fakeServer) endSessionLocked(s *fakeSession) {
	s.gone = true
	s.grants = map[uint32]uint64{}
	s.rev++
	f.notifyLocked()
}

func (f *fakeServer) setKA(mode string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kaMode = mode
}

func (f *fakeServer) grantsMsgLocked(s *fakeSession, ks string) *keyshardv1.GetGrantsResponse {
	resp := &keyshardv1.GetGrantsResponse{Revision: s.rev, Epoch: f.maps[ks].GetEpoch()}
	for b, tok := range s.grants {
		resp.Grants = append(resp.Grants, &keyshardv1.BucketGrant{Bucket: b, Token: tok})
	}
	sort.Slice(resp.Grants, func(i, j int) bool { return resp.Grants[i].Bucket < resp.Grants[j].Bucket })
	for b := range s.release {
		if _, ok := s.grants[b]; ok {
			resp.Release = append(resp.Release, b)
		}
	}
	sort.Slice(resp.Release, func(i, j int) bool { return resp.Release[i] < resp.Release[j] })
	return resp
}

// --- AdminService ---

type fakeAdmin struct{ f *fakeServer }

func (a fakeAdmin) takeFailure() error {
	a.f.mu.Lock()
	defer a.f.mu.Unlock()
	if err := a.f.failNext; err != nil {
		a.f.failNext = nil
		return err
	}
	return nil
}

func (a fakeAdmin) CreateKeyspace(_ context.Context, r *connect.Request[keyshardv1.CreateKeyspaceRequest]) (*connect.Response[keyshardv1.CreateKeyspaceResponse], error) {
	if err := a.takeFailure(); err != nil {
		return nil, err
	}
	f := a.f
	f.mu.Lock()
	defer f.mu.Unlock()
	k := proto.Clone(r.Msg.GetKeyspace()).(*keyshardv1.Keyspace)
	if k.GetName() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("keyspace name is empty"))
	}
	if _, ok := f.keyspaces[k.Name]; ok {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("keyspace %q already exists", k.Name))
	}
	if k.Buckets == 0 {
		k.Buckets = 4096
	}
	if k.Hash == "" {
		k.Hash = "xxh64"
	}
	if k.Mode == keyshardv1.KeyspaceMode_KEYSPACE_MODE_UNSPECIFIED {
		k.Mode = keyshardv1.KeyspaceMode_KEYSPACE_MODE_EXCLUSIVE
	}
	if k.LeaseTtl == nil {
		k.LeaseTtl = durationpb.New(10 * time.Second)
	}
	if k.DrainTimeout == nil {
		k.DrainTimeout = durationpb.New(30 * time.Second)
	}
	f.keyspaces[k.Name] = k
	return connect.NewResponse(&keyshardv1.CreateKeyspaceResponse{Keyspace: k}), nil
}

func (a fakeAdmin) GetKeyspace(_ context.Context, r *connect.Request[keyshardv1.GetKeyspaceRequest]) (*connect.Response[keyshardv1.GetKeyspaceResponse], error) {
	if err := a.takeFailure(); err != nil {
		return nil, err
	}
	a.f.mu.Lock()
	defer a.f.mu.Unlock()
	k, ok := a.f.keyspaces[r.Msg.GetName()]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("keyspace %q does not exist", r.Msg.GetName()))
	}
	return connect.NewResponse(&keyshardv1.GetKeyspaceResponse{Keyspace: k}), nil
}

func (a fakeAdmin) ListKeyspaces(context.Context, *connect.Request[keyshardv1.ListKeyspacesRequest]) (*connect.Response[keyshardv1.ListKeyspacesResponse], error) {
	if err := a.takeFailure(); err != nil {
		return nil, err
	}
	a.f.mu.Lock()
	defer a.f.mu.Unlock()
	resp := &keyshardv1.ListKeyspacesResponse{}
	for _, k := range a.f.keyspaces {
		resp.Keyspaces = append(resp.Keyspaces, k)
	}
	sort.Slice(resp.Keyspaces, func(i, j int) bool { return resp.Keyspaces[i].Name < resp.Keyspaces[j].Name })
	return connect.NewResponse(resp), nil
}

func (a fakeAdmin) UpdateKeyspace(_ context.Context, r *connect.Request[keyshardv1.UpdateKeyspaceRequest]) (*connect.Response[keyshardv1.UpdateKeyspaceResponse], error) {
	if err := a.takeFailure(); err != nil {
		return nil, err
	}
	a.f.mu.Lock()
	defer a.f.mu.Unlock()
	in := r.Msg.GetKeyspace()
	k, ok := a.f.keyspaces[in.GetName()]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("keyspace %q does not exist", in.GetName()))
	}
	if in.Buckets != 0 && in.Buckets != k.Buckets {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("keyspace %q: buckets cannot change from %d to %d", k.Name, k.Buckets, in.Buckets))
	}
	k = proto.Clone(k).(*keyshardv1.Keyspace)
	if in.LeaseTtl != nil {
		k.LeaseTtl = in.LeaseTtl
	}
	if in.DrainTimeout != nil {
		k.DrainTimeout = in.DrainTimeout
	}
	a.f.keyspaces[k.Name] = k
	return connect.NewResponse(&keyshardv1.UpdateKeyspaceResponse{Keyspace: k}), nil
}

func (a fakeAdmin) ListMembers(_ context.Context, r *connect.Request[keyshardv1.ListMembersRequest]) (*connect.Response[keyshardv1.ListMembersResponse], error) {
	if err := a.takeFailure(); err != nil {
		return nil, err
	}
	a.f.mu.Lock()
	defer a.f.mu.Unlock()
	return connect.NewResponse(&keyshardv1.ListMembersResponse{Members: a.f.members, Epoch: a.f.maps[r.Msg.GetKeyspace()].GetEpoch()}), nil
}

func (a fakeAdmin) DrainMember(context.Context, *connect.Request[keyshardv1.DrainMemberRequest]) (*connect.Response[keyshardv1.DrainMemberResponse], error) {
	if err := a.takeFailure(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&keyshardv1.DrainMemberResponse{}), nil
}

func (a fakeAdmin) Status(context.Context, *connect.Request[keyshardv1.StatusRequest]) (*connect.Response[keyshardv1.StatusResponse], error) {
	if err := a.takeFailure(); err != nil {
		return nil, err
	}
	a.f.mu.Lock()
	defer a.f.mu.Unlock()
	resp := &keyshardv1.StatusResponse{Replica: "r1", Leader: "r1"}
	for name, k := range a.f.keyspaces {
		resp.Keyspaces = append(resp.Keyspaces, &keyshardv1.KeyspaceStatus{Keyspace: k, Epoch: a.f.maps[name].GetEpoch(), Members: 2, UnassignedBuckets: 3, HandoffsInFlight: 1})
	}
	return connect.NewResponse(resp), nil
}

func (a fakeAdmin) PutHotKeyPool(_ context.Context, r *connect.Request[keyshardv1.PutHotKeyPoolRequest]) (*connect.Response[keyshardv1.PutHotKeyPoolResponse], error) {
	if err := a.takeFailure(); err != nil {
		return nil, err
	}
	p := proto.Clone(r.Msg.GetPool()).(*keyshardv1.HotKeyPool)
	if p.GetName() == "" || !(p.GetThreshold() > 0) {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("pool.name is empty or pool.threshold is not > 0"))
	}
	if p.LowThreshold == 0 {
		p.LowThreshold = p.Threshold / 2
	}
	if p.ReportThreshold == 0 {
		p.ReportThreshold = p.Threshold / 64
	}
	if p.Cooldown == nil {
		p.Cooldown = durationpb.New(30 * time.Second)
	}
	if p.ReportMaxAge == nil {
		p.ReportMaxAge = durationpb.New(30 * time.Second)
	}
	if p.MaxKeys == 0 {
		p.MaxKeys = 1024
	}
	a.f.mu.Lock()
	defer a.f.mu.Unlock()
	a.f.pools[p.Name] = p
	a.f.notifyLocked()
	return connect.NewResponse(&keyshardv1.PutHotKeyPoolResponse{Pool: p}), nil
}

func (a fakeAdmin) ListHotKeyPools(context.Context, *connect.Request[keyshardv1.ListHotKeyPoolsRequest]) (*connect.Response[keyshardv1.ListHotKeyPoolsResponse], error) {
	if err := a.takeFailure(); err != nil {
		return nil, err
	}
	a.f.mu.Lock()
	defer a.f.mu.Unlock()
	resp := &keyshardv1.ListHotKeyPoolsResponse{}
	for _, p := range a.f.pools {
		resp.Pools = append(resp.Pools, p)
	}
	sort.Slice(resp.Pools, func(i, j int) bool { return resp.Pools[i].Name < resp.Pools[j].Name })
	return connect.NewResponse(resp), nil
}

// --- MemberService ---

type fakeMember struct{ f *fakeServer }

// delay waits d of fake time (if d > 0), first telling the test on
// f.armed that its timer is set.
func (f *fakeServer) delay(ctx context.Context, what string, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := f.clock.NewTimer(d)
	defer t.Stop()
	f.armed <- what
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
	case <-f.quit:
	}
	return connect.NewError(connect.CodeCanceled, errors.New("gave up"))
}

func (m fakeMember) Join(ctx context.Context, r *connect.Request[keyshardv1.JoinRequest]) (*connect.Response[keyshardv1.JoinResponse], error) {
	f := m.f
	f.mu.Lock()
	f.joinedAt = append(f.joinedAt, f.clock.Now())
	hang := f.joinHangs > 0 // decided before the test hears of the Join
	if hang {
		f.joinHangs--
	}
	d := f.joinDelay
	f.mu.Unlock()
	f.joins <- r.Msg
	if hang {
		select {
		case <-ctx.Done():
		case <-f.quit:
		}
		return nil, connect.NewError(connect.CodeCanceled, errors.New("hung"))
	}
	if err := f.delay(ctx, "join", d); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.joinErr; err != nil {
		f.joinErr = nil
		return nil, err
	}
	k, ok := f.keyspaces[r.Msg.GetKeyspace()]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("keyspace %q does not exist", r.Msg.GetKeyspace()))
	}
	f.nextID++
	s := &fakeSession{id: fmt.Sprintf("s%d", f.nextID), member: r.Msg.GetMember(), grants: map[uint32]uint64{}, release: map[uint32]bool{}, rev: 1}
	f.sessions[s.id] = s
	f.notifyLocked()
	return connect.NewResponse(&keyshardv1.JoinResponse{Session: s.id, LeaseTtl: k.LeaseTtl, Keyspace: k}), nil
}

func (m fakeMember) KeepAlive(ctx context.Context, r *connect.Request[keyshardv1.KeepAliveRequest]) (*connect.Response[keyshardv1.KeepAliveResponse], error) {
	f := m.f
	f.keepAlives <- r.Msg.GetSession()
	f.mu.Lock()
	mode := f.kaMode
	s := f.sessions[r.Msg.GetSession()]
	gone := s == nil || s.gone
	f.mu.Unlock()
	if gone || mode == "notfound" {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("session %q does not exist", r.Msg.GetSession()))
	}
	switch mode {
	case "delay":
		f.mu.Lock()
		d := f.kaDelay
		f.mu.Unlock()
		if err := f.delay(ctx, "keep-alive", d); err != nil {
			return nil, err
		}
	case "fail":
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("etcd is unreachable"))
	case "hang":
		select {
		case <-ctx.Done():
		case <-f.quit:
		}
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("hung"))
	case "gate":
		select {
		case <-f.kaGate:
		case <-ctx.Done():
			return nil, connect.NewError(connect.CodeUnavailable, errors.New("hung"))
		case <-f.quit:
			return nil, connect.NewError(connect.CodeUnavailable, errors.New("closing"))
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ttl := f.keyspaces["rooms"].GetLeaseTtl()
	return connect.NewResponse(&keyshardv1.KeepAliveResponse{Ttl: ttl}), nil
}

func (m fakeMember) GetGrants(ctx context.Context, r *connect.Request[keyshardv1.GetGrantsRequest]) (*connect.Response[keyshardv1.GetGrantsResponse], error) {
	f := m.f
	f.getGrants <- r.Msg
	f.mu.Lock()
	defer f.mu.Unlock()
	wait := r.Msg.GetWait().AsDuration()
	var timer <-chan time.Time
	for {
		s := f.sessions[r.Msg.GetSession()]
		if s == nil || s.gone {
			return nil, connect.NewError(connect.CodeNotFound, errors.New("session ended"))
		}
		if s.rev > r.Msg.GetSinceRevision() || wait <= 0 {
			return connect.NewResponse(f.grantsMsgLocked(s, "rooms")), nil
		}
		if timer == nil {
			t := f.clock.NewTimer(wait)
			defer t.Stop()
			timer = t.C()
		}
		switch f.waitChangeLocked(ctx, timer) {
		case waitCancelled:
			return nil, connect.NewError(connect.CodeCanceled, errors.New("cancelled"))
		case waitTimedOut:
			return connect.NewResponse(f.grantsMsgLocked(s, "rooms")), nil
		}
	}
}

func (m fakeMember) WatchGrants(ctx context.Context, r *connect.Request[keyshardv1.WatchGrantsRequest], st *connect.ServerStream[keyshardv1.GetGrantsResponse]) error {
	f := m.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.watchGrantsUnimpl {
		return connect.NewError(connect.CodeUnimplemented, errors.New("no streams here"))
	}
	var sent uint64
	for {
		s := f.sessions[r.Msg.GetSession()]
		if s == nil || s.gone {
			return connect.NewError(connect.CodeNotFound, errors.New("session ended"))
		}
		if s.rev > sent {
			msg := f.grantsMsgLocked(s, "rooms")
			sent = s.rev
			f.mu.Unlock()
			err := st.Send(msg)
			f.mu.Lock()
			if err != nil {
				return err
			}
			continue
		}
		if f.waitChangeLocked(ctx, nil) == waitCancelled {
			return nil
		}
	}
}

// releaseRevBase puts Release's revisions above the session's own.
const releaseRevBase = 1000

func (m fakeMember) Release(_ context.Context, r *connect.Request[keyshardv1.ReleaseRequest]) (*connect.Response[keyshardv1.ReleaseResponse], error) {
	f := m.f
	f.releases <- r.Msg
	f.mu.Lock()
	gate := f.releaseGate
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-f.quit:
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.sessions[r.Msg.GetSession()]
	if s == nil || s.gone {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("session ended"))
	}
	// Like the real server: one bucket not held at its token refuses the call.
	for i, g := range r.Msg.GetBuckets() {
		if tok, ok := s.grants[g.GetBucket()]; !ok || tok != g.GetToken() {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("buckets[%d]: bucket %d is not held at token %d", i, g.GetBucket(), g.GetToken()))
		}
	}
	for _, g := range r.Msg.GetBuckets() {
		delete(s.grants, g.GetBucket())
		delete(s.release, g.GetBucket())
	}
	s.rev++
	if s.leaving && len(s.grants) == 0 {
		f.endSessionLocked(s)
	}
	f.notifyLocked()
	// A store revision is global: the release's can be above every
	// revision the session's answers showed so far.
	return connect.NewResponse(&keyshardv1.ReleaseResponse{Revision: releaseRevBase + s.rev}), nil
}

func (m fakeMember) Leave(_ context.Context, r *connect.Request[keyshardv1.LeaveRequest]) (*connect.Response[keyshardv1.LeaveResponse], error) {
	f := m.f
	f.leaves <- r.Msg.GetSession()
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.sessions[r.Msg.GetSession()]
	if s == nil || s.gone {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("session ended"))
	}
	if f.leaveIgnored {
		return connect.NewResponse(&keyshardv1.LeaveResponse{}), nil
	}
	s.leaving = true
	if len(s.grants) == 0 {
		f.endSessionLocked(s)
		return connect.NewResponse(&keyshardv1.LeaveResponse{}), nil
	}
	for b := range s.grants {
		s.release[b] = true
	}
	s.rev++
	f.notifyLocked()
	return connect.NewResponse(&keyshardv1.LeaveResponse{}), nil
}

// --- MapService ---

type fakeMap struct{ f *fakeServer }

func (m fakeMap) GetMap(ctx context.Context, r *connect.Request[keyshardv1.GetMapRequest]) (*connect.Response[keyshardv1.GetMapResponse], error) {
	f := m.f
	f.getMaps <- r.Msg
	f.mu.Lock()
	defer f.mu.Unlock()
	wait := r.Msg.GetWait().AsDuration()
	var timer <-chan time.Time
	if _, ok := f.keyspaces[r.Msg.GetKeyspace()]; !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("keyspace %q does not exist", r.Msg.GetKeyspace()))
	}
	for {
		cur := f.maps[r.Msg.GetKeyspace()] // nil before the first epoch
		if cur != nil && cur.Epoch > r.Msg.GetSinceEpoch() {
			return connect.NewResponse(&keyshardv1.GetMapResponse{Map: cur, Changed: true}), nil
		}
		if wait <= 0 {
			return connect.NewResponse(&keyshardv1.GetMapResponse{Map: cur}), nil
		}
		if timer == nil {
			t := f.clock.NewTimer(wait)
			defer t.Stop()
			timer = t.C()
		}
		switch f.waitChangeLocked(ctx, timer) {
		case waitCancelled:
			return nil, connect.NewError(connect.CodeCanceled, errors.New("cancelled"))
		case waitTimedOut:
			return connect.NewResponse(&keyshardv1.GetMapResponse{Map: f.maps[r.Msg.GetKeyspace()]}), nil
		}
	}
}

func (m fakeMap) WatchMap(ctx context.Context, r *connect.Request[keyshardv1.WatchMapRequest], st *connect.ServerStream[keyshardv1.Map]) error {
	f := m.f
	f.watchMaps <- r.Msg
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.watchMapUnimpl {
		return connect.NewError(connect.CodeUnimplemented, errors.New("no streams here"))
	}
	if f.watchMapErr > 0 {
		f.watchMapErr--
		return connect.NewError(connect.CodeUnavailable, errors.New("stream refused"))
	}
	if _, ok := f.keyspaces[r.Msg.GetKeyspace()]; !ok {
		return connect.NewError(connect.CodeNotFound, errors.New("no such keyspace"))
	}
	since := r.Msg.GetSinceEpoch()
	for {
		cur := f.maps[r.Msg.GetKeyspace()]
		if cur != nil && cur.Epoch > since {
			since = cur.Epoch
			f.mu.Unlock()
			err := st.Send(cur)
			f.mu.Lock()
			if err != nil {
				return err
			}
			continue
		}
		if f.waitChangeLocked(ctx, nil) == waitCancelled {
			return nil
		}
	}
}

func (m fakeMap) Lookup(context.Context, *connect.Request[keyshardv1.LookupRequest]) (*connect.Response[keyshardv1.LookupResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("not in the fake"))
}

// --- HotKeyService ---

// addPool creates hot-key pool name with threshold and report threshold
// (the rest are the server's defaults).
func (f *fakeServer) addPool(name string, threshold, reportThreshold float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pools[name] = &keyshardv1.HotKeyPool{Name: name, Threshold: threshold, LowThreshold: threshold / 2, ReportThreshold: reportThreshold,
		Cooldown: durationpb.New(30 * time.Second), ReportMaxAge: durationpb.New(30 * time.Second), MaxKeys: 1024}
	f.notifyLocked()
}

// setOverflow publishes pool's overflow set with keys at version (0: the
// next version) and returns the version.
func (f *fakeServer) setOverflow(pool string, version uint64, keys ...string) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if version == 0 {
		version = f.sets[pool].GetVersion() + 1
	}
	set := &keyshardv1.OverflowSet{Pool: pool, Version: version}
	for i, k := range keys {
		ok := &keyshardv1.OverflowKey{Key: k, Rate: float64(1000 + i), Since: timestamppb.New(f.clock.Now())}
		if i%2 == 1 {
			ok.CoolingSince = timestamppb.New(f.clock.Now())
		}
		set.Keys = append(set.Keys, ok)
	}
	f.sets[pool] = set
	f.notifyLocked()
	return version
}

// setHotDown makes every HotKeyService call fail with Unavailable (and
// ends the open watches), or serve again.
func (f *fakeServer) setHotDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hotDown = down
	f.notifyLocked()
}

var errHotDown = connect.NewError(connect.CodeUnavailable, errors.New("etcd is unreachable"))

type fakeHot struct{ f *fakeServer }

func (h fakeHot) poolLocked(name string) error {
	if h.f.hotDown {
		return errHotDown
	}
	if _, ok := h.f.pools[name]; !ok {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("hot-key pool %q does not exist", name))
	}
	return nil
}

func (h fakeHot) ReportHotKeys(_ context.Context, r *connect.Request[keyshardv1.ReportHotKeysRequest]) (*connect.Response[keyshardv1.ReportHotKeysResponse], error) {
	f := h.f
	f.reports <- r.Msg
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := h.poolLocked(r.Msg.GetPool()); err != nil {
		return nil, err
	}
	if f.reportErr != nil {
		return nil, f.reportErr
	}
	p := f.pools[r.Msg.GetPool()]
	return connect.NewResponse(&keyshardv1.ReportHotKeysResponse{Pool: p, Version: f.sets[p.Name].GetVersion()}), nil
}

func (h fakeHot) GetOverflowSet(ctx context.Context, r *connect.Request[keyshardv1.GetOverflowSetRequest]) (*connect.Response[keyshardv1.GetOverflowSetResponse], error) {
	f := h.f
	f.getSets <- r.Msg
	f.mu.Lock()
	defer f.mu.Unlock()
	wait := r.Msg.GetWait().AsDuration()
	var timer <-chan time.Time
	for {
		if err := h.poolLocked(r.Msg.GetPool()); err != nil {
			return nil, err
		}
		cur := f.sets[r.Msg.GetPool()]
		if cur != nil && cur.Version > r.Msg.GetSinceVersion() {
			return connect.NewResponse(&keyshardv1.GetOverflowSetResponse{Set: cur, Changed: true}), nil
		}
		if wait <= 0 {
			return connect.NewResponse(&keyshardv1.GetOverflowSetResponse{Set: cur}), nil
		}
		if timer == nil {
			t := f.clock.NewTimer(wait)
			defer t.Stop()
			timer = t.C()
		}
		switch f.waitChangeLocked(ctx, timer) {
		case waitCancelled:
			return nil, connect.NewError(connect.CodeCanceled, errors.New("cancelled"))
		case waitTimedOut:
			return connect.NewResponse(&keyshardv1.GetOverflowSetResponse{Set: f.sets[r.Msg.GetPool()]}), nil
		}
	}
}

func (h fakeHot) WatchOverflowSet(ctx context.Context, r *connect.Request[keyshardv1.WatchOverflowSetRequest], st *connect.ServerStream[keyshardv1.OverflowSet]) error {
	f := h.f
	f.watchSets <- r.Msg
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.watchSetUnimpl {
		return connect.NewError(connect.CodeUnimplemented, errors.New("no streams here"))
	}
	since := r.Msg.GetSinceVersion()
	for {
		if err := h.poolLocked(r.Msg.GetPool()); err != nil {
			return err
		}
		cur := f.sets[r.Msg.GetPool()]
		if cur != nil && cur.Version > since {
			since = cur.Version
			f.mu.Unlock()
			err := st.Send(cur)
			f.mu.Lock()
			if err != nil {
				return err
			}
			continue
		}
		if f.waitChangeLocked(ctx, nil) == waitCancelled {
			return nil
		}
	}
}

// front is a replica in front of the fake's state: it serves the fake's
// API, or, once hung, holds every new call until the caller gives up (as
// a paused replica does), or answers every new call Unavailable.
type front struct {
	srv      *httptest.Server
	mu       sync.Mutex
	mode     string // "", "hang" or "unavailable"
	calls    map[string]int
	arrivals chan string   // procedures of calls held or refused
	quit     chan struct{} // closed at cleanup: held calls end
}

func (f *fakeServer) newFront(t *testing.T) *front {
	t.Helper()
	fr := &front{calls: map[string]int{}, arrivals: make(chan string, 1024), quit: make(chan struct{})}
	fr.srv = startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fr.mu.Lock()
		mode := fr.mode
		fr.calls[r.URL.Path]++
		fr.mu.Unlock()
		switch mode {
		case "hang":
			fr.arrivals <- r.URL.Path
			select {
			case <-r.Context().Done():
			case <-fr.quit:
			}
			return
		case "unavailable":
			fr.arrivals <- r.URL.Path
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"code":"unavailable","message":"this replica cannot reach etcd"}`)
			return
		}
		f.srv.Config.Handler.ServeHTTP(w, r)
	}), fr.quit)
	return fr
}

func (fr *front) set(mode string) {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	fr.mode = mode
}

func (fr *front) count(procedure string) int {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	return fr.calls[procedure]
}

// waitUntil blocks until cond, checked under f.mu each time the fake's
// state changes.
func (f *fakeServer) waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for {
		f.mu.Lock()
		ok := cond()
		ch := f.changed
		f.mu.Unlock()
		if ok {
			return
		}
		recv(t, ch, what)
	}
}

// recv returns the next value of ch, failing the test if none comes
// within a generous wall-clock guard (the guard never paces the test).
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}
