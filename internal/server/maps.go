package server

import (
	"context"

	"connectrpc.com/connect"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/internal/store"
)

// mapService serves MapService: maps for routers, and lookups for clients
// that do not hash locally.
type mapService struct{ s *Server }

// currentMap returns the served map of a keyspace (nil before the first
// epoch) and the channel that closes at the next change.
func (s *Server) currentMap(name string) (*mapView, <-chan struct{}) {
	var mv *mapView
	changed := s.view.read(func(_ *store.Snapshot, maps map[string]*mapView) { mv = maps[name] })
	return mv, changed
}

func (a *mapService) GetMap(ctx context.Context, req *connect.Request[v1.GetMapRequest]) (*connect.Response[v1.GetMapResponse], error) {
	name := req.Msg.GetKeyspace()
	if _, err := a.s.keyspace(ctx, name); err != nil {
		return nil, err
	}
	wait, err := waitOf(req.Msg.GetWait())
	if err != nil {
		return nil, err
	}
	release, err := a.s.polls.holdIf(wait > 0)
	if err != nil {
		return nil, err
	}
	defer release()
	timer := a.s.clock.NewTimer(wait)
	defer timer.Stop()
	for {
		mv, changed := a.s.currentMap(name)
		if mv != nil && (mv.epoch > req.Msg.GetSinceEpoch() || wait == 0) {
			return connect.NewResponse(&v1.GetMapResponse{Map: mv.proto, Changed: mv.epoch > req.Msg.GetSinceEpoch()}), nil
		}
		select {
		case <-changed:
		case <-timer.C():
			resp := &v1.GetMapResponse{}
			if mv != nil {
				resp.Map = mv.proto
			}
			return connect.NewResponse(resp), nil
		case <-ctx.Done():
			return nil, apiError(ctx.Err())
		}
	}
}

func (a *mapService) WatchMap(ctx context.Context, req *connect.Request[v1.WatchMapRequest], stream *connect.ServerStream[v1.Map]) error {
	name := req.Msg.GetKeyspace()
	if _, err := a.s.keyspace(ctx, name); err != nil {
		return err
	}
	release, err := a.s.polls.hold()
	if err != nil {
		return err
	}
	defer release()
	sent := req.Msg.GetSinceEpoch()
	for {
		mv, changed := a.s.currentMap(name)
		if mv != nil && mv.epoch > sent {
			if err := stream.Send(mv.proto); err != nil {
				return err
			}
			sent = mv.epoch
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil
		}
	}
}

func (a *mapService) Lookup(ctx context.Context, req *connect.Request[v1.LookupRequest]) (*connect.Response[v1.LookupResponse], error) {
	name := req.Msg.GetKeyspace()
	if _, err := a.s.keyspace(ctx, name); err != nil {
		return nil, err
	}
	keys := req.Msg.GetKeys()
	if err := a.s.cfg.Limits.checkLookup(keys); err != nil {
		return nil, err
	}
	mv, _ := a.s.currentMap(name)
	if mv == nil {
		return nil, connect.NewError(connect.CodeUnavailable, errorf("keyspace %q has no map yet: no member has joined", name))
	}
	resp := &v1.LookupResponse{Epoch: mv.epoch, Owners: make([]*v1.Owner, len(keys))}
	h := mv.table.Hasher()
	for i, k := range keys {
		b := h.BucketString(k)
		owner, _ := mv.table.BucketOwner(b)
		resp.Owners[i] = &v1.Owner{Key: k, Bucket: uint32(b), Member: owner, Address: mv.addr[owner]}
	}
	return connect.NewResponse(resp), nil
}
