package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"

	"connectrpc.com/connect"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/hotkey"
	"github.com/keyshard/keyshard/internal/store"
)

// Cluster-wide hot keys. Producers report their local heavy hitters to any
// replica (ReportHotKeys stores the report under hotreports/<pool>/<producer>,
// stamped with the replica's clock); the leader sums each pool's reports
// every second into the pool's overflow set (aggregate.go); every replica
// serves the set from its view (GetOverflowSet, WatchOverflowSet).
//
// A pool's report_threshold is what producers should send: every key whose
// local rate is at least it. The server does not refuse keys below it: they
// are summed like the others, and only cost space.

// hotKeyService serves HotKeyService: producers' reports and the overflow
// sets they follow. Member and admin tokens may call it.
type hotKeyService struct{ s *Server }

func (h *hotKeyService) ReportHotKeys(ctx context.Context, req *connect.Request[v1.ReportHotKeysRequest]) (*connect.Response[v1.ReportHotKeysResponse], error) {
	s := h.s
	pool, err := s.hotPool(ctx, req.Msg.GetPool())
	if err != nil {
		return nil, err
	}
	producer := req.Msg.GetProducer()
	if err := store.ValidateName(store.KindHotReport, producer); err != nil {
		return nil, apiError(err)
	}
	keys, err := reportKeys(req.Msg.GetKeys())
	if err != nil {
		return nil, err
	}
	rev, err := s.store.PutHotReport(ctx, pool.Name, hotkey.Report{Producer: producer, At: s.clock.Now(), Keys: keys})
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, poolNotFound(pool.Name)
		}
		return nil, apiError(err)
	}
	s.metrics.hotReports.WithLabelValues(pool.Name).Inc()
	s.view.waitRev(ctx, rev)
	set, _ := s.view.overflowSet(pool.Name)
	return connect.NewResponse(&v1.ReportHotKeysResponse{Pool: hotPoolProto(pool), Version: set.version}), nil
}

// reportKeys checks a report's keys and returns them sorted, as the store
// keeps them. Errors are INVALID_ARGUMENT naming the entry.
func reportKeys(in []*v1.KeyRate) ([]hotkey.KeyRate, error) {
	if len(in) > store.MaxReportKeys {
		return nil, invalid("keys: %d keys in one report; send at most %d, the ones with the highest rates", len(in), store.MaxReportKeys)
	}
	seen := make(map[string]int, len(in))
	out := make([]hotkey.KeyRate, len(in))
	for i, kr := range in {
		key, rate := kr.GetKey(), kr.GetRate()
		switch {
		case key == "":
			return nil, invalid("keys[%d].key: empty; want 1-%d bytes", i, store.MaxHotKeyLen)
		case len(key) > store.MaxHotKeyLen:
			return nil, invalid("keys[%d].key: %.40q... is %d bytes; want at most %d", i, key, len(key), store.MaxHotKeyLen)
		case math.IsNaN(rate) || math.IsInf(rate, 0) || rate < 0:
			return nil, invalid("keys[%d].rate: %v (key %.40q); want a finite number >= 0, in messages per second", i, rate, key)
		}
		if j, dup := seen[key]; dup {
			return nil, invalid("keys[%d].key: %.40q appears twice (also keys[%d]); send each key once, with its total local rate", i, key, j)
		}
		seen[key] = i
		out[i] = hotkey.KeyRate{Key: key, Rate: rate}
	}
	store.SortKeyRates(out)
	return out, nil
}

func (h *hotKeyService) GetOverflowSet(ctx context.Context, req *connect.Request[v1.GetOverflowSetRequest]) (*connect.Response[v1.GetOverflowSetResponse], error) {
	pool, err := h.s.hotPool(ctx, req.Msg.GetPool())
	if err != nil {
		return nil, err
	}
	wait, err := waitOf(req.Msg.GetWait())
	if err != nil {
		return nil, err
	}
	release, err := h.s.polls.holdIf(wait > 0)
	if err != nil {
		return nil, err
	}
	defer release()
	since := req.Msg.GetSinceVersion()
	timer := h.s.clock.NewTimer(wait)
	defer timer.Stop()
	for {
		set, changed := h.s.view.overflowSet(pool.Name)
		if set.version > since || wait == 0 {
			return connect.NewResponse(&v1.GetOverflowSetResponse{Set: set.proto, Changed: set.version > since}), nil
		}
		select {
		case <-changed:
		case <-timer.C():
			return connect.NewResponse(&v1.GetOverflowSetResponse{Set: set.proto}), nil
		case <-ctx.Done():
			return nil, apiError(ctx.Err())
		}
	}
}

func (h *hotKeyService) WatchOverflowSet(ctx context.Context, req *connect.Request[v1.WatchOverflowSetRequest], stream *connect.ServerStream[v1.OverflowSet]) error {
	pool, err := h.s.hotPool(ctx, req.Msg.GetPool())
	if err != nil {
		return err
	}
	release, err := h.s.polls.hold()
	if err != nil {
		return err
	}
	defer release()
	sent := req.Msg.GetSinceVersion()
	for first := true; ; first = false {
		set, changed := h.s.view.overflowSet(pool.Name)
		switch {
		case set.version > sent:
			if err := stream.Send(set.proto); err != nil {
				return err
			}
			sent = set.version
		case first:
			// Nothing to send yet (no set, or none newer than the
			// client's): send the response headers, so that the client's
			// call returns now rather than at the first set.
			if err := stream.Send(nil); err != nil {
				return err
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil
		}
	}
}

func (a *adminService) PutHotKeyPool(ctx context.Context, req *connect.Request[v1.PutHotKeyPoolRequest]) (*connect.Response[v1.PutHotKeyPoolResponse], error) {
	c, err := hotPoolConfig(req.Msg.GetPool())
	if err != nil {
		return nil, err
	}
	p := c.store()
	rev, err := a.s.store.PutHotPool(ctx, p)
	if err != nil {
		return nil, apiError(err)
	}
	a.s.view.waitRev(ctx, rev)
	a.s.log.Info("hot-key pool set", "pool", p.Name, "threshold", p.Threshold, "low_threshold", p.LowThreshold, "cooldown", p.Cooldown,
		"report_threshold", p.ReportThreshold, "report_max_age", p.ReportMaxAge, "max_keys", p.MaxKeys)
	return connect.NewResponse(&v1.PutHotKeyPoolResponse{Pool: hotPoolProto(p)}), nil
}

func (a *adminService) ListHotKeyPools(ctx context.Context, _ *connect.Request[v1.ListHotKeyPoolsRequest]) (*connect.Response[v1.ListHotKeyPoolsResponse], error) {
	resp := &v1.ListHotKeyPoolsResponse{}
	a.s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		for _, ps := range snap.Pools {
			if ps.Config.Exists() {
				resp.Pools = append(resp.Pools, hotPoolProto(ps.Config.Value))
			}
		}
	})
	sort.Slice(resp.Pools, func(i, j int) bool { return resp.Pools[i].Name < resp.Pools[j].Name })
	return connect.NewResponse(resp), nil
}

// hotPool returns a pool's settings from the view, or from etcd if the
// view does not know it yet (it may have been created through another
// replica a moment ago), or a NotFound error that says how to create it.
func (s *Server) hotPool(ctx context.Context, name string) (store.HotPool, error) {
	if err := store.ValidateName(store.KindHotPool, name); err != nil {
		return store.HotPool{}, apiError(err)
	}
	var p store.HotPool
	var ok bool
	s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		if ps := snap.Pools[name]; ps != nil && ps.Config.Exists() {
			p, ok = ps.Config.Value, true
		}
	})
	if ok {
		return p, nil
	}
	p, _, err := s.store.GetHotPool(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return p, poolNotFound(name)
	}
	return p, apiError(err)
}

func poolNotFound(name string) error {
	return notFound("hot-key pool %q does not exist; create it with `keyshard hotkeys pool put %s --threshold N` or list them with `keyshard hotkeys pool list`", name, name)
}

// createHotKeyPools creates the pools of the config that do not exist yet.
// An existing pool keeps its stored settings, which may have been changed
// through the API since; a difference is logged.
func (s *Server) createHotKeyPools(ctx context.Context) error {
	for _, c := range s.cfg.HotKeyPools {
		p := c.store()
		_, err := s.store.CreateHotPool(ctx, p)
		switch {
		case err == nil:
			s.log.Info("created hot-key pool from config", "pool", p.Name, "threshold", p.Threshold)
		case errors.Is(err, store.ErrExists):
			have, _, gerr := s.store.GetHotPool(ctx, p.Name)
			if gerr != nil {
				return fmt.Errorf("read hot-key pool %q: %w", p.Name, gerr)
			}
			if have != p {
				s.log.Warn("hot-key pool exists with other settings than the config; keeping the stored ones (change them with `keyshard hotkeys pool put`)",
					"pool", p.Name, "stored", fmt.Sprintf("%+v", have), "config", fmt.Sprintf("%+v", p))
			}
		default:
			return fmt.Errorf("create hot-key pool %q: %w", p.Name, err)
		}
	}
	return nil
}
