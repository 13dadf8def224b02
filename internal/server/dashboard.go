package server

import (
	"context"
	"errors"
	"slices"
	"sort"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/internal/coordinator"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
)

// The dashboard's reads: a keyspace's map history, its buckets, a pool's
// hot-key reports, and the replicas and store health in Status. Every
// replica answers them, the leader or not: buckets and reports from its
// view of the store, the history with one bounded read of etcd.

// Limits of GetKeyspaceHistoryRequest.limit.
const (
	defaultHistory = 50
	maxHistory     = store.HistoryKeep
)

// Bounds of the reads Status and ListMembers make of etcd beyond the view.
const (
	storeHealthTimeout = time.Second
	leaseReadTimeout   = time.Second
	leaseReadParallel  = 8
)

var moveReasons = map[coordinator.MapReason]v1.MoveReason{
	coordinator.ReasonCreate: v1.MoveReason_MOVE_REASON_CREATE,
	coordinator.ReasonJoin:   v1.MoveReason_MOVE_REASON_JOIN,
	coordinator.ReasonLeave:  v1.MoveReason_MOVE_REASON_LEAVE,
	coordinator.ReasonCrash:  v1.MoveReason_MOVE_REASON_CRASH,
	coordinator.ReasonDrain:  v1.MoveReason_MOVE_REASON_DRAIN,
	coordinator.ReasonLoad:   v1.MoveReason_MOVE_REASON_LOAD,
	coordinator.ReasonUpdate: v1.MoveReason_MOVE_REASON_UPDATE,
	coordinator.ReasonImport: v1.MoveReason_MOVE_REASON_IMPORT,
}

func (a *adminService) GetKeyspaceHistory(ctx context.Context, req *connect.Request[v1.GetKeyspaceHistoryRequest]) (*connect.Response[v1.GetKeyspaceHistoryResponse], error) {
	name := req.Msg.GetKeyspace()
	limit := int(req.Msg.GetLimit())
	if limit == 0 {
		limit = defaultHistory
	}
	if limit > maxHistory {
		return nil, invalid("limit: %d is above the limit of %d (the history keeps the last %d epochs)", limit, maxHistory, store.HistoryKeep)
	}
	if _, err := a.s.keyspace(ctx, name); err != nil {
		return nil, err
	}
	changes, _, err := a.s.store.KeyspaceHistory(ctx, name, limit)
	if err != nil && !errors.Is(err, store.ErrCorrupt) {
		return nil, apiError(err)
	}
	if err != nil {
		a.s.log.Warn("map history entry skipped", "keyspace", name, "err", err)
	}
	resp := &v1.GetKeyspaceHistoryResponse{}
	for _, c := range changes {
		resp.Changes = append(resp.Changes, epochChangeProto(c))
	}
	return connect.NewResponse(resp), nil
}

func epochChangeProto(c store.EpochChange) *v1.EpochChange {
	out := &v1.EpochChange{
		Epoch: c.Epoch, Time: timestamppb.New(c.Time), Reason: moveReasons[coordinator.MapReason(c.Reason)],
		Members: c.Members, MovedBuckets: uint32(c.Moved), Detail: c.Detail,
	}
	for _, m := range c.Moves {
		out.Moves = append(out.Moves, &v1.Move{From: m.From, To: m.To, Buckets: uint32(m.Buckets)})
	}
	return out
}

func (a *adminService) GetBuckets(ctx context.Context, req *connect.Request[v1.GetBucketsRequest]) (*connect.Response[v1.GetBucketsResponse], error) {
	name := req.Msg.GetKeyspace()
	if _, err := a.s.keyspace(ctx, name); err != nil {
		return nil, err
	}
	var resp *v1.GetBucketsResponse
	a.s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		ks := snap.Keyspaces[name]
		if ks == nil || !ks.Config.Exists() {
			return
		}
		resp = keyspaceBuckets(ks)
	})
	if resp == nil { // created through another replica a moment ago
		return nil, connect.NewError(connect.CodeUnavailable, errorf("keyspace %q is not in this replica's view yet; retry", name))
	}
	return connect.NewResponse(resp), nil
}

// keyspaceBuckets is GetBuckets' answer for ks as read.
func keyspaceBuckets(ks *store.KeyspaceState) *v1.GetBucketsResponse {
	n := ks.Config.Value.Buckets
	stream := ks.Config.Value.Mode == shard.ModeStream
	owners := make([]string, n)
	if ks.Map.Exists() && ks.Map.Value.Assignment.Buckets() == n {
		for b := range owners {
			owners[b] = ks.Map.Value.Assignment.Owner(b)
		}
	}
	holders := make([]string, n)
	tokens := make([]uint64, n)
	for id, g := range ks.Grants {
		for _, bt := range g.Value.Buckets {
			if bt.Bucket >= 0 && bt.Bucket < n {
				holders[bt.Bucket], tokens[bt.Bucket] = id, bt.Token
			}
		}
	}
	var pos []uint64
	if stream {
		pos, _ = ks.BucketPositions()
	}
	resp := bucketRuns(owners, holders, tokens, pos)
	resp.Epoch, resp.Stream = ks.Map.Value.Epoch, stream
	return resp
}

// bucketRuns run-length encodes buckets: owners, holders and tokens per
// bucket (pos too, or nil outside stream mode). Members are sorted and
// numbered from 1; consecutive buckets alike in every field are one run.
func bucketRuns(owners, holders []string, tokens, pos []uint64) *v1.GetBucketsResponse {
	resp := &v1.GetBucketsResponse{Buckets: uint32(len(owners))}
	seen := map[string]bool{}
	for b := range owners {
		for _, id := range []string{owners[b], holders[b]} {
			if id != "" && !seen[id] {
				seen[id] = true
				resp.Members = append(resp.Members, id)
			}
		}
	}
	slices.Sort(resp.Members)
	index := make(map[string]uint32, len(resp.Members))
	for i, id := range resp.Members {
		index[id] = uint32(i + 1)
	}
	for b := range owners {
		r := &v1.BucketRun{First: uint32(b), Count: 1, Owner: index[owners[b]], Holder: index[holders[b]], Token: tokens[b], State: bucketState(owners[b], holders[b])}
		if pos != nil {
			r.Position = pos[b]
		}
		if n := len(resp.Runs); n > 0 {
			last := resp.Runs[n-1]
			if last.Owner == r.Owner && last.Holder == r.Holder && last.Token == r.Token && last.State == r.State && last.Position == r.Position {
				last.Count++
				continue
			}
		}
		resp.Runs = append(resp.Runs, r)
	}
	return resp
}

func bucketState(owner, holder string) v1.BucketState {
	switch {
	case holder != "" && holder == owner:
		return v1.BucketState_BUCKET_STATE_GRANTED
	case holder != "":
		return v1.BucketState_BUCKET_STATE_RELEASING
	case owner != "":
		return v1.BucketState_BUCKET_STATE_AWAITING_GRANT
	}
	return v1.BucketState_BUCKET_STATE_UNASSIGNED
}

func (a *adminService) GetHotKeyReports(ctx context.Context, req *connect.Request[v1.GetHotKeyReportsRequest]) (*connect.Response[v1.GetHotKeyReportsResponse], error) {
	name := req.Msg.GetPool()
	if _, err := a.s.hotPool(ctx, name); err != nil {
		return nil, err
	}
	resp := &v1.GetHotKeyReportsResponse{}
	a.s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		ps := snap.Pools[name]
		if ps == nil {
			return
		}
		for _, r := range ps.Reports {
			info := &v1.HotKeyReportInfo{Producer: r.Value.Producer, Time: timestamppb.New(r.Value.At)}
			for _, k := range r.Value.Keys {
				info.Keys = append(info.Keys, &v1.KeyRate{Key: k.Key, Rate: k.Rate})
			}
			sort.SliceStable(info.Keys, func(i, j int) bool {
				if info.Keys[i].Rate != info.Keys[j].Rate {
					return info.Keys[i].Rate > info.Keys[j].Rate
				}
				return info.Keys[i].Key < info.Keys[j].Key
			})
			resp.Reports = append(resp.Reports, info)
		}
	})
	sort.Slice(resp.Reports, func(i, j int) bool { return resp.Reports[i].Producer < resp.Reports[j].Producer })
	return connect.NewResponse(resp), nil
}

// replicas lists the replicas that advertise themselves in snap, sorted,
// with leader marked (listed even if it advertises no URL).
func replicas(snap *store.Snapshot, leader string) []*v1.ReplicaInfo {
	var out []*v1.ReplicaInfo
	for id, e := range snap.Replicas {
		out = append(out, &v1.ReplicaInfo{Id: id, Url: e.Value, Leader: id == leader})
	}
	if _, ok := snap.Replicas[leader]; leader != "" && !ok {
		out = append(out, &v1.ReplicaInfo{Id: leader, Leader: true})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Id < out[j].Id })
	return out
}

func storeHealthProto(h store.Health) *v1.StoreHealth {
	out := &v1.StoreHealth{Healthy: h.Healthy, Endpoints: h.Endpoints, DbSizeBytes: h.DBSize, Revision: h.Revision, Latency: durationpb.New(h.Latency)}
	if h.Err != nil {
		out.Error = h.Err.Error()
	}
	return out
}

// leasesLeft asks etcd for the time left on each lease, at most
// leaseReadParallel at a time, all within leaseReadTimeout. A lease that
// is gone or not read in time is absent from the answer.
func (s *Server) leasesLeft(ctx context.Context, leases []shard.LeaseID) map[shard.LeaseID]time.Duration {
	ctx, cancel := context.WithTimeout(ctx, leaseReadTimeout)
	defer cancel()
	out := make(map[shard.LeaseID]time.Duration, len(leases))
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, leaseReadParallel)
	for _, id := range leases {
		if id == 0 {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() { // exits when the read returns, within ctx
			defer wg.Done()
			defer func() { <-sem }()
			info, err := s.store.TimeToLive(ctx, id)
			if err != nil {
				return
			}
			mu.Lock()
			out[id] = info.TTL
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}
