package server

import (
	"context"
	"errors"
	"sort"

	"connectrpc.com/connect"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
)

// The operator's view of a stream keyspace's positions, and its reset.

// Limits of GetPositionsRequest.behind.
const (
	defaultBehind = 10
	maxBehind     = 1000
)

func (a *adminService) GetPositions(ctx context.Context, req *connect.Request[v1.GetPositionsRequest]) (*connect.Response[v1.GetPositionsResponse], error) {
	name := req.Msg.GetKeyspace()
	behind := int(req.Msg.GetBehind())
	if behind == 0 {
		behind = defaultBehind
	}
	if behind > maxBehind {
		return nil, invalid("behind: %d is above the limit of %d", behind, maxBehind)
	}
	if _, err := a.s.streamKeyspace(ctx, name); err != nil {
		return nil, err
	}
	p, err := a.s.store.Positions(ctx, name)
	if err != nil {
		return nil, apiError(err)
	}
	resp := positionsSummary(p.Positions, p.Holders, behind)
	resp.Epoch, resp.Revision = p.Epoch, uint64(p.Rev)
	return connect.NewResponse(resp), nil
}

// positionsSummary is GetPositions' answer over pos, each bucket's
// position, and holders, each bucket's holder: the minimum, maximum and
// spread, every bucket in runs, and the behind buckets of lowest
// position, lowest bucket first among equals.
func positionsSummary(pos []uint64, holders []shard.Holder, behind int) *v1.GetPositionsResponse {
	resp := &v1.GetPositionsResponse{}
	if len(pos) == 0 {
		return resp
	}
	resp.Min, resp.Max = pos[0], pos[0]
	for b, p := range pos {
		resp.Min, resp.Max = min(resp.Min, p), max(resp.Max, p)
		if n := len(resp.Runs); n > 0 && resp.Runs[n-1].Position == p {
			resp.Runs[n-1].Count++
			continue
		}
		resp.Runs = append(resp.Runs, &v1.PositionRun{First: uint32(b), Count: 1, Position: p})
	}
	resp.Spread = resp.Max - resp.Min
	order := make([]int, len(pos))
	for b := range order {
		order[b] = b
	}
	sort.SliceStable(order, func(i, j int) bool { return pos[order[i]] < pos[order[j]] })
	for _, b := range order[:min(behind, len(order))] {
		resp.Behind = append(resp.Behind, &v1.BucketBehind{Bucket: uint32(b), Position: pos[b], Member: holders[b].Member, Token: holders[b].Token})
	}
	return resp
}

func (a *adminService) ResetPositions(ctx context.Context, req *connect.Request[v1.ResetPositionsRequest]) (*connect.Response[v1.ResetPositionsResponse], error) {
	name := req.Msg.GetKeyspace()
	k, err := a.s.streamKeyspace(ctx, name)
	if err != nil {
		return nil, err
	}
	buckets, err := resetBuckets(req.Msg, k.Buckets)
	if err != nil {
		return nil, err
	}
	pos := req.Msg.GetPosition()
	rev, err := a.s.store.ResetPositions(ctx, name, buckets, pos)
	if err != nil {
		var he *store.HeldError
		if errors.As(err, &he) {
			if he.Reason == store.HeldUnfolded {
				return nil, failedPrecondition("%v; retry in a moment, once the leader has folded them. Nothing was reset", he)
			}
			return nil, failedPrecondition("%v; drain the member (keyshard drain %s %s) or stop it first. Nothing was reset", he, name, he.Member)
		}
		return nil, apiError(err)
	}
	a.s.view.waitRev(ctx, rev)
	a.s.log.Info("reset positions", "keyspace", name, "buckets", len(buckets), "position", pos, "revision", rev)
	return connect.NewResponse(&v1.ResetPositionsResponse{Buckets: uint32(len(buckets)), Revision: uint64(rev)}), nil
}

// resetBuckets returns the buckets a reset names: exactly one of buckets
// (each in [0, n), listed once) and all_buckets.
func resetBuckets(req *v1.ResetPositionsRequest, n int) ([]int, error) {
	in := req.GetBuckets()
	switch {
	case req.GetAllBuckets() && len(in) > 0:
		return nil, invalid("buckets: %d buckets given with all_buckets; give one or the other", len(in))
	case req.GetAllBuckets():
		out := make([]int, n)
		for b := range out {
			out[b] = b
		}
		return out, nil
	case len(in) == 0:
		return nil, invalid("buckets: empty; name the buckets to reset, or set all_buckets")
	}
	out := make([]int, len(in))
	first := make(map[uint32]int, len(in))
	for i, b := range in {
		if int64(b) >= int64(n) {
			return nil, invalid("buckets[%d]: bucket %d is outside the keyspace's range [0, %d)", i, b, n)
		}
		if j, ok := first[b]; ok {
			return nil, invalid("buckets[%d]: bucket %d is listed twice (also buckets[%d])", i, b, j)
		}
		first[b] = i
		out[i] = int(b)
	}
	return out, nil
}

// streamKeyspace returns keyspace name if it exists and is a stream one,
// else an error naming the field.
func (s *Server) streamKeyspace(ctx context.Context, name string) (shard.Keyspace, error) {
	if name == "" {
		return shard.Keyspace{}, invalid("keyspace: empty; name a stream keyspace")
	}
	k, err := s.keyspace(ctx, name)
	if err != nil {
		return k, err
	}
	if k.Mode != shard.ModeStream {
		return k, invalid("keyspace: %q is in %s mode; positions belong to stream keyspaces", name, k.Mode)
	}
	return k, nil
}
