package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/internal/tenantpool"
	"github.com/keyshard/keyshard/placement"
)

// The leader's side of tenant pools. One goroutine of the term
// (leadTenantPools) owns every pool's Aggregator and State: load reports,
// readiness marks and rate queries reach it over a channel, from this
// replica's handlers or forwarded by the others, and every second it runs
// a round per pool: the live active members, the aggregator's rates and
// the pending readiness marks go through tenantpool.Plan, and what changed
// is published (store.StateWrites): the rewritten chunks in fenced
// transactions under a byte budget, then the meta in a last one, which is
// what makes the new version visible to every replica's view.

// tenantPoolInterval is how often the leader runs each pool's round.
const tenantPoolInterval = time.Second

// tenantPoolBookkeepingFlush bounds how long a tenant's bookkeeping-only
// change (see tenantpool.Changes.Bookkeeping) waits to be stored: a new
// leader continues a cooldown from at most this far back.
const tenantPoolBookkeepingFlush = 10 * time.Second

// tpLeader is this replica's tenant-pool leadership during one term.
type tpLeader struct {
	reqs chan tpReq
	done chan struct{} // closed when the loop has exited
}

// tpReq is one call the leader's loop answers.
type tpReq struct {
	pool   string
	report *tenantpool.Report // ReportLoad
	at     time.Time          // ReportLoad: when it arrived (it may wait while a round writes)
	ready  []tenantpool.Ready // MarkReady (all of one member)
	rates  []string           // GetTenants: these tenants' rates
	all    bool               // GetTenants: every tenant's rate
	reply  chan tpReply       // buffered, 1
}

type tpReply struct {
	outcome         tenantpool.Outcome
	marked, ignored int
	rates           map[string]float64
	err             error
}

// ask sends r to the loop and waits for its answer.
func (l *tpLeader) ask(ctx context.Context, r tpReq) (tpReply, error) {
	r.reply = make(chan tpReply, 1)
	select {
	case l.reqs <- r:
	case <-l.done:
		return tpReply{}, errLeadershipMoving
	case <-ctx.Done():
		return tpReply{}, ctx.Err()
	}
	select {
	case rep := <-r.reply:
		return rep, rep.err
	case <-l.done:
		return tpReply{}, errLeadershipMoving
	case <-ctx.Done():
		return tpReply{}, ctx.Err()
	}
}

// leaderPool is one pool as the leader's loop holds it.
type leaderPool struct {
	window time.Duration
	agg    *tenantpool.Aggregator
	since  time.Time // when agg started measuring
	loaded bool
	// pl owns the state from the load on; st is its last round's State,
	// valid until pl's next round (rounds and answers run on one goroutine).
	pl      *tenantpool.Planner
	st      tenantpool.State
	meta    *store.TenantMeta // as stored; nil: nothing stored yet
	ix      *store.ChunkIndex
	pending []tenantpool.Ready
	// deferred are tenants whose bookkeeping-only changes are not stored
	// yet, and flushed when they last all were.
	deferred map[string]bool
	flushed  time.Time
}

// TenantPoolWrite describes the last write of a pool's round, for tests
// and benchmarks: the tenants it rewrote and the bytes it sent.
type TenantPoolWrite struct {
	Version uint64
	Tenants int // tenants whose state changed
	Writes  int // keys written (meta and chunks)
	Bytes   int // bytes of keys and values written
	Txns    int // transactions the write took (store.Publication)
	// Round is the time of the round that wrote.
	Round time.Time
}

// LastTenantPoolWrite returns the last write this replica made, as
// leader, for pool's round (zero if none).
func (s *Server) LastTenantPoolWrite(pool string) TenantPoolWrite {
	s.tpMu.Lock()
	defer s.tpMu.Unlock()
	return s.tpWrites[pool]
}

// leadTenantPools runs while this replica leads. It returns errNotLeader
// when a write is fenced, nil when ctx ends.
func (s *Server) leadTenantPools(ctx context.Context, fence store.Fence) error {
	l := &tpLeader{reqs: make(chan tpReq), done: make(chan struct{})}
	defer close(l.done)
	s.tpLeader.Store(l)
	defer s.tpLeader.CompareAndSwap(l, nil)
	tick := s.clock.NewTicker(tenantPoolInterval)
	defer tick.Stop()
	s.onTPTerm()
	pools := map[string]*leaderPool{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case r := <-l.reqs:
			r.reply <- s.answer(ctx, pools, r)
		case <-tick.C():
			if !s.view.ready() {
				continue
			}
			now := s.clock.Now()
			work := s.tenantPoolWork()
			for name := range pools {
				if !slices.ContainsFunc(work, func(w tenantPoolWork) bool { return w.cfg.Name == name }) {
					delete(pools, name) // deleted: a pool made again starts afresh
				}
			}
			for _, w := range work {
				err := s.tenantPoolRound(ctx, fence, pools, w, now)
				switch {
				case err == nil:
				case errors.Is(err, store.ErrFenced):
					return errNotLeader
				case ctx.Err() != nil:
					return nil
				default:
					s.metrics.tpRoundFailure.WithLabelValues(w.cfg.Name).Inc()
					s.log.Warn("tenant pool round failed; retrying at the next round", "pool", w.cfg.Name, "err", err)
				}
			}
			s.onTPRound(now)
		}
	}
}

// pool returns the leader's pool name, making its aggregator if needed;
// nil if the pool does not exist.
func (s *Server) leaderPool(pools map[string]*leaderPool, name string) (*leaderPool, store.TenantPool, error) {
	var cfg store.TenantPool
	ok := false
	s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		if ps := snap.TenantPools[name]; ps != nil && ps.Config.Exists() {
			cfg, ok = ps.Config.Value, true
		}
	})
	if !ok {
		delete(pools, name)
		return nil, cfg, tenantPoolNotFound(name)
	}
	lp := pools[name]
	if lp == nil || lp.window != cfg.Window {
		agg, err := tenantpool.NewAggregator(tenantpool.AggregatorConfig{Window: cfg.Window})
		if err != nil {
			return nil, cfg, err
		}
		if lp == nil {
			lp = &leaderPool{}
			pools[name] = lp
		}
		lp.agg, lp.window, lp.since = agg, cfg.Window, s.clock.Now()
		agg.Start(lp.since)
	}
	return lp, cfg, nil
}

// load reads the pool's state from etcd once a term: a new leader
// continues every size, subset and cooldown.
func (s *Server) loadPool(ctx context.Context, name string, lp *leaderPool) error {
	if lp.loaded {
		return nil
	}
	st, meta, ok, err := s.store.LoadTenantState(ctx, name)
	if err != nil {
		return fmt.Errorf("load the state of tenant pool %q: %w", name, err)
	}
	lp.st, lp.pl, lp.loaded, lp.meta = st, tenantpool.NewPlanner(st), true, nil
	clear(lp.deferred) // the stored state is what the Planner has now
	if ok {
		lp.meta = &meta
	}
	lp.ix = store.NewChunkIndex(st)
	if st.Version > meta.Version {
		// A publication stopped part way (a leader gone, a failed
		// transaction): its chunks are taken as they are, and this
		// round's meta, of st.Version or above, publishes them.
		s.log.Info("tenant pool state loaded with chunks ahead of the published meta; the next round publishes them", "pool", name, "published", meta.Version, "version", st.Version, "tenants", len(st.Tenants))
		return nil
	}
	s.log.Info("tenant pool state loaded", "pool", name, "version", st.Version, "tenants", len(st.Tenants))
	return nil
}

func (s *Server) answer(ctx context.Context, pools map[string]*leaderPool, r tpReq) tpReply {
	lp, _, err := s.leaderPool(pools, r.pool)
	if err != nil {
		return tpReply{err: err}
	}
	now := s.clock.Now()
	switch {
	case r.report != nil:
		at := now
		if !r.at.IsZero() && r.at.Before(now) {
			at = r.at
		}
		out, err := lp.agg.Add(*r.report, at)
		if err == nil {
			s.metrics.tpReports.WithLabelValues(r.pool, out.String()).Inc()
		}
		return tpReply{outcome: out, err: err}
	case r.ready != nil:
		if err := s.loadPool(ctx, r.pool, lp); err != nil {
			return tpReply{err: err}
		}
		var rep tpReply
		for _, m := range r.ready {
			ts, ok := lp.st.Tenants[m.Tenant]
			if ok && slices.ContainsFunc(ts.Members, func(p tenantpool.Placement) bool { return p.ID == m.Member }) {
				rep.marked++
				lp.pending = append(lp.pending, m)
			} else {
				rep.ignored++
			}
		}
		return rep
	case r.all:
		return tpReply{rates: lp.agg.Rates(now)}
	default:
		rates := make(map[string]float64, len(r.rates))
		for _, t := range r.rates {
			if v, ok := lp.agg.Rate(t, now); ok {
				rates[t] = v
			}
		}
		return tpReply{rates: rates}
	}
}

// poolWork is what one round needs of a pool, copied from the view.
type tenantPoolWork struct {
	cfg     store.TenantPool
	cfgRev  int64
	members []placement.Member // live, active, sorted by ID; leaving ones of weight 0
}

func (s *Server) tenantPoolWork() []tenantPoolWork {
	var out []tenantPoolWork
	s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		for _, ps := range snap.TenantPools {
			if !ps.Config.Exists() {
				continue
			}
			w := tenantPoolWork{cfg: ps.Config.Value, cfgRev: ps.Config.ModRevision}
			for _, e := range ps.Members {
				if e.Value.Active {
					m := placement.Member{ID: e.Value.ID, Weight: e.Value.Weight, Zone: e.Value.Zone}
					if e.Value.Leaving {
						m.Weight = 0 // draining: in no subset, read while the core keeps it
					}
					w.members = append(w.members, m)
				}
			}
			sort.Slice(w.members, func(i, j int) bool { return w.members[i].ID < w.members[j].ID })
			out = append(out, w)
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].cfg.Name < out[j].cfg.Name })
	return out
}

// tenantPoolRound runs one round of one pool.
func (s *Server) tenantPoolRound(ctx context.Context, fence store.Fence, pools map[string]*leaderPool, w tenantPoolWork, now time.Time) error {
	start := time.Now()
	name := w.cfg.Name
	lp, cfg, err := s.leaderPool(pools, name)
	if err != nil {
		return nil // deleted since
	}
	if err := s.loadPool(ctx, name, lp); err != nil {
		return err
	}
	touched := map[string]bool{}
	if len(lp.pending) > 0 {
		if _, _, err := lp.pl.MarkReady(lp.pending); err != nil {
			lp.pending = nil
			return fmt.Errorf("mark ready: %w", err)
		}
		for _, m := range lp.pending {
			touched[m.Tenant] = true
		}
	}
	// Until the aggregator has measured a whole window (a new leader, a
	// new pool), the round sizes nobody: see tenantpool.Planner.Hold.
	var (
		next tenantpool.State
		ch   tenantpool.Changes
	)
	if now.Sub(lp.since) < cfg.Window {
		next, ch, err = lp.pl.Hold(w.members, cfg.Policy, now)
	} else {
		next, ch, err = lp.pl.Plan(w.members, lp.agg.Rates(now), cfg.Policy, now)
	}
	if err != nil {
		lp.loaded = false // the Planner may be part way: reload at the next round
		return fmt.Errorf("plan: %w", err)
	}
	// Bookkeeping-only changes (cooldown timers, wanted sizes) wait: they
	// go with the next write of their chunk, or at the latest
	// tenantPoolBookkeepingFlush later. Rates near a size's boundary
	// flip them every round, and rewriting a 100 KB chunk each time for
	// nothing a reader sees cost megabytes a second.
	if lp.deferred == nil {
		lp.deferred = map[string]bool{}
	}
	bookkeeping := make(map[string]bool, len(ch.Bookkeeping))
	for _, t := range ch.Bookkeeping {
		bookkeeping[t] = true
	}
	for _, t := range ch.Tenants {
		if bookkeeping[t] && !touched[t] {
			lp.deferred[t] = true
		} else {
			touched[t] = true // a visible change: written now, with its bookkeeping
		}
	}
	if len(lp.deferred) > 0 && now.Sub(lp.flushed) >= tenantPoolBookkeepingFlush {
		for t := range lp.deferred {
			touched[t] = true
		}
	}
	tenants := make([]string, 0, len(touched))
	for t := range touched {
		if _, ok := next.Tenants[t]; ok {
			lp.ix.Set(t, true)
		} else {
			lp.ix.Set(t, false)
		}
		tenants = append(tenants, t)
	}
	sort.Strings(tenants)
	pub, err := store.StateWrites(name, next, now, lp.meta, tenants, lp.ix, store.StateBudget{Bytes: s.cfg.TenantPoolTxnBytes, Writes: s.store.MaxTxnWrites()})
	if err == nil {
		err = s.publish(ctx, fence, name, w.cfgRev, pub)
	}
	if err != nil {
		// The Planner has moved on to a state that was not stored, or
		// stored in part: reload the stored one at the next round (chunks
		// written ahead of the meta included: see store.LoadTenantState)
		// and plan again from it (pending readiness marks are kept).
		lp.loaded = false
		return fmt.Errorf("write the state: %w", err)
	}
	lp.pending = nil
	if len(lp.deferred) > 0 {
		// Whatever chunk was written carries its deferred tenants too.
		written := make(map[int]bool, len(tenants))
		for _, t := range tenants {
			written[store.TenantChunkOf(t)] = true
		}
		for t := range lp.deferred {
			if written[store.TenantChunkOf(t)] {
				delete(lp.deferred, t)
			}
		}
	}
	if len(lp.deferred) == 0 || now.Sub(lp.flushed) >= tenantPoolBookkeepingFlush {
		lp.flushed = now
	}
	if pub.Writes > 0 {
		published := now
		if lp.meta != nil && lp.meta.Version == next.Version {
			published = lp.meta.Published
		}
		lp.meta = &store.TenantMeta{Version: next.Version, Members: next.Members, Policy: next.Policy, Published: published}
		s.metrics.tpBytes.WithLabelValues(name).Add(float64(pub.Bytes))
		s.tpMu.Lock()
		s.tpWrites[name] = TenantPoolWrite{Version: next.Version, Tenants: len(tenants), Writes: pub.Writes, Bytes: pub.Bytes, Txns: len(pub.Batches) + min(len(pub.Last), 1), Round: now}
		s.tpMu.Unlock()
	}
	lp.st = next
	for _, c := range ch.Sizes {
		dir := "grow"
		if c.To < c.From {
			dir = "shrink"
		}
		s.metrics.tpSizeChanges.WithLabelValues(name, dir).Inc()
		s.log.Info("tenant size changed", "pool", name, "tenant", c.Tenant, "from", c.From, "to", c.To, "why", c.Why, "version", next.Version)
	}
	for _, t := range ch.Dropped {
		s.log.Info("tenant forgotten: no load for forget_after; it gets the stateless subset again", "pool", name, "tenant", t, "forget_after", cfg.Policy.ForgetAfter)
	}
	s.metrics.tpRound.WithLabelValues(name).Observe(time.Since(start).Seconds())
	return nil
}

// publish commits pub's transactions in order, each fenced and expecting
// the pool's settings at cfgRev. A failure part way leaves chunks ahead
// of the meta, which readers hold aside and the next round's reload
// takes in (store.LoadTenantState).
func (s *Server) publish(ctx context.Context, fence store.Fence, pool string, cfgRev int64, pub store.Publication) error {
	expect := []store.Expect{{Key: store.TenantPoolKey(pool), ModRevision: cfgRev}}
	written := 0
	for i, b := range pub.Batches {
		if _, err := s.store.Commit(ctx, fence, b, expect); err != nil {
			return fmt.Errorf("chunks, transaction %d of %d: %w", i+1, len(pub.Batches), err)
		}
		written += len(b)
		if hook := s.tpBatchHook.Load(); hook != nil && (i+1 < len(pub.Batches) || len(pub.Last) > 0) {
			(*hook)(ctx, pool, i+1, written)
		}
	}
	if len(pub.Last) == 0 {
		return nil
	}
	if _, err := s.store.Commit(ctx, fence, pub.Last, expect); err != nil {
		return fmt.Errorf("meta: %w", err)
	}
	return nil
}

// tpState is the server's tenant-pool leadership state.
type tpState struct {
	tpMu     sync.Mutex
	tpWrites map[string]TenantPoolWrite
	// tpBatchHook, if set, is called by the leader after each transaction
	// of a publication's chunks that is not the last transaction, with
	// the term's context, the batches and the chunks written so far
	// (tests hold a publication half written in it).
	tpBatchHook atomic.Pointer[func(ctx context.Context, pool string, batch, chunks int)]
}
