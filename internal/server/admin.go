package server

import (
	"context"
	"errors"
	"sort"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
)

// adminService serves AdminService: keyspaces, drains and status.
type adminService struct{ s *Server }

func (a *adminService) CreateKeyspace(ctx context.Context, req *connect.Request[v1.CreateKeyspaceRequest]) (*connect.Response[v1.CreateKeyspaceResponse], error) {
	c, err := keyspaceConfig(req.Msg.GetKeyspace())
	if err != nil {
		return nil, err
	}
	rev, err := a.s.store.CreateKeyspace(ctx, c.store())
	if err != nil {
		if errors.Is(err, store.ErrExists) {
			return nil, connect.NewError(connect.CodeAlreadyExists, errorf("keyspace %q already exists; use UpdateKeyspace to change its lease TTL or drain timeout", c.Name))
		}
		return nil, apiError(err)
	}
	a.s.view.waitRev(ctx, rev)
	a.s.log.Info("created keyspace", "keyspace", c.Name, "buckets", c.Buckets, "hash", c.Hash)
	return connect.NewResponse(&v1.CreateKeyspaceResponse{Keyspace: keyspaceProto(c.store())}), nil
}

func (a *adminService) GetKeyspace(ctx context.Context, req *connect.Request[v1.GetKeyspaceRequest]) (*connect.Response[v1.GetKeyspaceResponse], error) {
	k, err := a.s.keyspace(ctx, req.Msg.GetName())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.GetKeyspaceResponse{Keyspace: keyspaceProto(k)}), nil
}

func (a *adminService) ListKeyspaces(ctx context.Context, _ *connect.Request[v1.ListKeyspacesRequest]) (*connect.Response[v1.ListKeyspacesResponse], error) {
	resp := &v1.ListKeyspacesResponse{}
	a.s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		for _, ks := range snap.Keyspaces {
			if ks.Config.Exists() {
				resp.Keyspaces = append(resp.Keyspaces, keyspaceProto(ks.Config.Value))
			}
		}
	})
	sort.Slice(resp.Keyspaces, func(i, j int) bool { return resp.Keyspaces[i].Name < resp.Keyspaces[j].Name })
	return connect.NewResponse(resp), nil
}

func (a *adminService) UpdateKeyspace(ctx context.Context, req *connect.Request[v1.UpdateKeyspaceRequest]) (*connect.Response[v1.UpdateKeyspaceResponse], error) {
	have, err := a.s.keyspace(ctx, req.Msg.GetKeyspace().GetName())
	if err != nil {
		return nil, err
	}
	in := req.Msg.GetKeyspace()
	// Unset immutable fields mean "keep"; set ones must match.
	if in.GetBuckets() == 0 {
		in.Buckets = uint32(have.Buckets)
	}
	if in.GetHash() == "" {
		in.Hash = string(have.Hash)
	}
	if in.GetLeaseTtl() == nil {
		in.LeaseTtl = keyspaceProto(have).LeaseTtl
	}
	if in.GetDrainTimeout() == nil {
		in.DrainTimeout = keyspaceProto(have).DrainTimeout
	}
	if in.GetMode() == v1.KeyspaceMode_KEYSPACE_MODE_UNSPECIFIED {
		in.Mode = keyspaceProto(have).Mode
	}
	c, err := keyspaceConfig(in)
	if err != nil {
		return nil, err
	}
	switch {
	case c.Buckets != have.Buckets:
		return nil, failedPrecondition("keyspace %q has %d buckets; the bucket count cannot change while clients hash keys with it (create a new keyspace instead)", c.Name, have.Buckets)
	case c.Hash != have.Hash:
		return nil, failedPrecondition("keyspace %q hashes with %s; the hash cannot change while clients use it (create a new keyspace instead)", c.Name, have.Hash)
	case shard.Mode(c.Mode) != have.Mode:
		return nil, failedPrecondition("keyspace %q is in %s mode; the mode cannot change", c.Name, have.Mode)
	}
	rev, err := a.s.store.UpdateKeyspace(ctx, c.store())
	if err != nil {
		return nil, apiError(err)
	}
	a.s.view.waitRev(ctx, rev)
	return connect.NewResponse(&v1.UpdateKeyspaceResponse{Keyspace: keyspaceProto(c.store())}), nil
}

func (a *adminService) ListMembers(ctx context.Context, req *connect.Request[v1.ListMembersRequest]) (*connect.Response[v1.ListMembersResponse], error) {
	name := req.Msg.GetKeyspace()
	if _, err := a.s.keyspace(ctx, name); err != nil {
		return nil, err
	}
	resp := &v1.ListMembersResponse{}
	leaseOf := map[string]shard.LeaseID{}
	a.s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		ks := snap.Keyspaces[name]
		if ks == nil {
			return
		}
		resp.Epoch = ks.Map.Value.Epoch
		target := ks.Map.Value.Assignment.Counts()
		for id, m := range ks.Members {
			st := &v1.MemberStatus{Member: memberProto(m.Value), TargetBuckets: uint32(target[id])}
			for _, bt := range ks.Grants[id].Value.Buckets {
				st.GrantedBuckets++
				if ks.Map.Value.Assignment.Owner(bt.Bucket) != id {
					st.ReleasingBuckets++
				}
			}
			d, ok := ks.Drains[id]
			st.Draining = ok && d.Lease == m.Lease // a replaced session's drain ends with it
			leaseOf[id] = m.Lease
			resp.Members = append(resp.Members, st)
		}
	})
	sort.Slice(resp.Members, func(i, j int) bool { return resp.Members[i].Member.Id < resp.Members[j].Member.Id })
	if !req.Msg.GetLeaseLeft() {
		return connect.NewResponse(resp), nil
	}
	leases := make([]shard.LeaseID, 0, len(leaseOf))
	for _, l := range leaseOf {
		leases = append(leases, l)
	}
	left := a.s.leasesLeft(ctx, leases)
	for _, st := range resp.Members {
		if d, ok := left[leaseOf[st.Member.Id]]; ok {
			st.LeaseLeft = durationpb.New(d)
		}
	}
	return connect.NewResponse(resp), nil
}

func (a *adminService) DrainMember(ctx context.Context, req *connect.Request[v1.DrainMemberRequest]) (*connect.Response[v1.DrainMemberResponse], error) {
	ks, id := req.Msg.GetKeyspace(), req.Msg.GetMember()
	if _, err := a.s.keyspace(ctx, ks); err != nil {
		return nil, err
	}
	rev, err := a.s.store.PutDrain(ctx, ks, id, shard.Drain{RequestedAt: a.s.clock.Now(), By: "admin"})
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, notFound("member %q is not joined to keyspace %q; list members with `keyshard members %s`", id, ks, ks)
		}
		return nil, apiError(err)
	}
	a.s.view.waitRev(ctx, rev)
	a.s.log.Info("drain requested", "keyspace", ks, "member", id)
	return connect.NewResponse(&v1.DrainMemberResponse{}), nil
}

func (a *adminService) Status(ctx context.Context, _ *connect.Request[v1.StatusRequest]) (*connect.Response[v1.StatusResponse], error) {
	resp := &v1.StatusResponse{Replica: a.s.cfg.Replica}
	leader, err := a.s.store.Leader(ctx)
	if err != nil && !errors.Is(err, store.ErrNotFound) { // not found: nobody leads right now
		return nil, apiError(err)
	}
	resp.Leader = leader
	resp.Store = storeHealthProto(a.s.store.Health(ctx, storeHealthTimeout))
	a.s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		resp.Replicas = replicas(snap, leader)
		for _, ks := range snap.Keyspaces {
			if !ks.Config.Exists() {
				continue
			}
			resp.Keyspaces = append(resp.Keyspaces, keyspaceStatus(ks))
		}
	})
	sort.Slice(resp.Keyspaces, func(i, j int) bool { return resp.Keyspaces[i].Keyspace.Name < resp.Keyspaces[j].Keyspace.Name })
	return connect.NewResponse(resp), nil
}

// keyspaceStatus is Status's summary of one keyspace from the view.
func keyspaceStatus(ks *store.KeyspaceState) *v1.KeyspaceStatus {
	st := &v1.KeyspaceStatus{Keyspace: keyspaceProto(ks.Config.Value), Epoch: ks.Map.Value.Epoch, Members: uint32(len(ks.Members))}
	a := ks.Map.Value.Assignment
	// holder is, per bucket, the index in the map's members of the member
	// holding it: a slice and indexes, not maps of names, since Status
	// reads every bucket of every keyspace under the view's lock.
	const (
		none  = -1 // held by nobody
		other = -2 // held by a member the map does not name
	)
	idx := make(map[string]int32, len(a.Members))
	for i, id := range a.Members {
		idx[id] = int32(i)
	}
	holder := make([]int32, len(a.Owners))
	for b := range holder {
		holder[b] = none
	}
	for id, g := range ks.Grants {
		i, ok := idx[id]
		if !ok {
			i = other
		}
		for _, bt := range g.Value.Buckets {
			if bt.Bucket >= 0 && bt.Bucket < len(holder) {
				holder[bt.Bucket] = i
			} else {
				st.ReleasingBuckets++ // a bucket the map does not have
			}
		}
	}
	owned := make([]int32, len(a.Members)) // buckets per member of the map
	for b, o := range a.Owners {
		if o < 0 || int(o) >= len(a.Members) {
			o = none
			st.UnassignedBuckets++
		} else {
			owned[o]++
			if holder[b] != o {
				st.HandoffsInFlight++
			}
		}
		if holder[b] != none && holder[b] != o {
			st.ReleasingBuckets++
		}
	}
	for id, d := range ks.Drains {
		if m, ok := ks.Members[id]; ok && d.Lease == m.Lease {
			st.DrainingMembers++
		}
	}
	// Active members the map gives nothing: while there are buckets
	// enough, a map the leader holds back (rebalance_gap) names them.
	// A pending member gets nothing until its first keep-alive, a
	// draining one (or one of weight 0) nothing at all.
	for id, m := range ks.Members {
		if m.Value.Pending || !(m.Value.Weight > 0) {
			continue
		}
		if d, ok := ks.Drains[id]; ok && d.Lease == m.Lease { // a replaced session's drain ends with it
			continue
		}
		if i, ok := idx[id]; !ok || owned[i] == 0 {
			st.MembersWithoutBuckets++
		}
	}
	if !ks.Map.Exists() {
		st.UnassignedBuckets = uint32(ks.Config.Value.Buckets)
	}
	return st
}

// keyspace returns a keyspace's config from the view, or from etcd if the
// view does not know it yet (it may have been created through another
// replica a moment ago), or a NotFound error that names it.
func (s *Server) keyspace(ctx context.Context, name string) (shard.Keyspace, error) {
	if err := store.ValidateName(store.KindKeyspace, name); err != nil {
		return shard.Keyspace{}, apiError(err)
	}
	var k shard.Keyspace
	var ok bool
	s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		if ks := snap.Keyspaces[name]; ks != nil && ks.Config.Exists() {
			k, ok = ks.Config.Value, true
		}
	})
	if ok {
		return k, nil
	}
	k, _, err := s.store.GetKeyspace(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return k, notFound("keyspace %q does not exist; create it with `keyshard keyspace create %s` or list them with `keyshard keyspace list`", name, name)
	}
	return k, apiError(err)
}
