package server

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/keyshard/keyshard/hotkey"
	"github.com/keyshard/keyshard/internal/store"
)

// hotKeyInterval is how often the leader sums each pool's reports.
const hotKeyInterval = time.Second

// maxReportDeletes bounds the stale reports one transaction deletes; the
// rest go at the next round.
const maxReportDeletes = 128

// maxLoggedKeys bounds the keys logged one by one when a set changes.
const maxLoggedKeys = 16

// aggregateHotKeys runs while this replica leads, on a goroutine owned by
// the term: every hotKeyInterval of s.clock it sums each pool's reports,
// as the view has them, into the pool's next overflow set (hotkey.Aggregate)
// and commits it, fenced, when its keys or a key's cooldown changed; and it
// deletes reports older than twice the pool's report_max_age. It returns
// errNotLeader when a write is fenced, and nil when ctx ends. Other
// failures are logged and counted, and retried at the next round.
func (s *Server) aggregateHotKeys(ctx context.Context, fence store.Fence) error {
	tick := s.clock.NewTicker(hotKeyInterval)
	defer tick.Stop()
	s.onTerm()
	warned := map[string]bool{} // pools whose stored set is corrupt, logged once a term
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C():
		}
		if !s.view.ready() {
			continue
		}
		now := s.clock.Now()
		for _, w := range s.hotKeyWork(now) {
			if w.corrupt != nil {
				if !warned[w.name] {
					warned[w.name] = true
					s.metrics.hotKeyFailures.WithLabelValues(w.name).Inc()
					s.log.Error("the stored overflow set does not decode; the leader leaves the pool alone until it is fixed: delete the key to start the set again from version 0",
						"pool", w.name, "key", store.OverflowKey(w.name), "err", w.corrupt)
				}
				continue
			}
			delete(warned, w.name)
			err := s.aggregatePool(ctx, fence, w, now)
			switch {
			case err == nil:
			case errors.Is(err, store.ErrFenced):
				return errNotLeader
			case ctx.Err() != nil:
				return nil
			default:
				s.metrics.hotKeyFailures.WithLabelValues(w.name).Inc()
				s.log.Warn("hot-key aggregation failed; retrying at the next round", "pool", w.name, "err", err, "what_to_do", hotKeyHint(err))
			}
		}
		s.metrics.hotKeyLastRound.Set(float64(now.UnixNano()) / 1e9)
		s.onRound(now)
	}
}

// hotKeyHint says what an operator can do about a failed round.
func hotKeyHint(err error) string {
	switch {
	case errors.Is(err, store.ErrConflict):
		return "nothing: this replica's view was behind the store; it catches up by itself"
	case errors.Is(err, store.ErrUnavailable):
		return "check that etcd is reachable and has a quorum"
	case errors.Is(err, store.ErrTooLarge):
		return "raise etcd's --max-request-bytes, or lower the pool's max_keys"
	case errors.Is(err, errStoreDeadline):
		return "check etcd's health (a member may have just died or be overloaded); the leader retries every second"
	}
	return "look for the cause in the error; the leader retries every second"
}

// poolWork is what one round needs of one pool, copied out of the view.
type poolWork struct {
	name    string
	cfg     store.HotPool
	reports []hotkey.Report
	prev    store.Entry[hotkey.OverflowSet]
	stale   []store.Expect // reports older than 2×report_max_age, at the revision read
	corrupt error          // the stored set did not decode
}

// hotKeyWork copies every configured pool out of the view, sorted by name.
func (s *Server) hotKeyWork(now time.Time) []poolWork {
	var out []poolWork
	s.view.read(func(snap *store.Snapshot, _ map[string]*mapView) {
		for name, ps := range snap.Pools {
			if !ps.Config.Exists() {
				continue
			}
			w := poolWork{name: name, cfg: ps.Config.Value, prev: ps.Overflow, corrupt: snap.Corrupt[store.OverflowKey(name)]}
			for id, r := range ps.Reports {
				if now.Sub(r.Value.At) > 2*w.cfg.ReportMaxAge {
					w.stale = append(w.stale, store.ExpectEntry(store.HotReportKey(name, id), r))
					continue
				}
				w.reports = append(w.reports, r.Value)
			}
			out = append(out, w)
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// aggregatePool runs one round for one pool.
func (s *Server) aggregatePool(ctx context.Context, fence store.Fence, w poolWork, now time.Time) error {
	prev := w.prev.Value
	next, err := hotkey.Aggregate(prev, w.reports, now, aggregateConfig(w.cfg))
	if err != nil {
		return fmt.Errorf("aggregate: %w", err)
	}
	if setChanged(prev, next) {
		// Bounded like the leader's map writes: a write stuck on an etcd
		// member that died is abandoned and the next round tries again,
		// rather than holding every pool's rounds for etcd's own timeout.
		var rev int64
		timedOut, err := s.within(ctx, maxWriteDeadline, errStoreDeadline, func(ctx context.Context) (err error) {
			rev, err = s.store.Commit(ctx, fence,
				[]store.Write{store.PutOverflow(w.name, next)},
				[]store.Expect{store.ExpectEntry(store.OverflowKey(w.name), w.prev)})
			return err
		})
		if timedOut {
			err = fmt.Errorf("%w: no answer within %v", errStoreDeadline, maxWriteDeadline)
		}
		if err != nil {
			return fmt.Errorf("write the overflow set: %w", err)
		}
		s.logSetChange(w.name, prev, next)
		// The next round reads the set back from the view: let it catch
		// up, so the round does not conflict with its own write.
		s.view.waitRev(ctx, rev)
	}
	if len(w.stale) > 0 {
		stale := w.stale[:min(len(w.stale), maxReportDeletes)]
		dels := make([]store.Write, len(stale))
		for i, e := range stale {
			dels[i] = store.Delete(e.Key)
		}
		// Each delete expects the report it read: a producer that reported
		// again meanwhile keeps its fresh report (ErrConflict; the next
		// round tries again with what is then stale).
		timedOut, err := s.within(ctx, maxWriteDeadline, errStoreDeadline, func(ctx context.Context) error {
			_, err := s.store.Commit(ctx, fence, dels, stale)
			return err
		})
		if timedOut {
			err = fmt.Errorf("%w: no answer within %v", errStoreDeadline, maxWriteDeadline)
		}
		switch {
		case err == nil:
			s.metrics.hotReportsPruned.WithLabelValues(w.name).Add(float64(len(stale)))
			s.log.Info("deleted stale hot-key reports", "pool", w.name, "reports", len(stale), "older_than", 2*w.cfg.ReportMaxAge)
		case errors.Is(err, store.ErrConflict):
			s.log.Debug("a stale hot-key report changed while being deleted; trying again at the next round", "pool", w.name, "err", err)
		default:
			return fmt.Errorf("delete stale reports: %w", err)
		}
	}
	return nil
}

// setChanged reports whether next must be written: its keys differ from
// prev's, or a key started or ended its cooldown (so that the cooldown
// survives a change of leader).
func setChanged(prev, next hotkey.OverflowSet) bool {
	if len(prev.Entries) != len(next.Entries) || prev.Version != next.Version {
		return true
	}
	for i, e := range next.Entries {
		p := prev.Entries[i]
		if p.Key != e.Key || !p.BelowSince.Equal(e.BelowSince) {
			return true
		}
	}
	return false
}

// logSetChange logs the keys that entered and left a pool's set, and the
// cooldowns that started or ended.
func (s *Server) logSetChange(pool string, prev, next hotkey.OverflowSet) {
	was := make(map[string]hotkey.OverflowEntry, len(prev.Entries))
	for _, e := range prev.Entries {
		was[e.Key] = e
	}
	is := make(map[string]bool, len(next.Entries))
	entered, left := 0, 0
	for _, e := range next.Entries {
		is[e.Key] = true
		p, ok := was[e.Key]
		switch {
		case !ok:
			if entered++; entered <= maxLoggedKeys {
				s.log.Info("hot key entered the overflow set", "pool", pool, "key", e.Key, "rate", e.Rate, "version", next.Version)
			}
		case p.BelowSince.IsZero() && !e.BelowSince.IsZero():
			s.log.Debug("hot key cooling down", "pool", pool, "key", e.Key, "rate", e.Rate, "version", next.Version)
		case !p.BelowSince.IsZero() && e.BelowSince.IsZero():
			s.log.Debug("hot key hot again; cooldown ended", "pool", pool, "key", e.Key, "rate", e.Rate, "version", next.Version)
		}
	}
	for _, e := range prev.Entries {
		if !is[e.Key] {
			if left++; left <= maxLoggedKeys {
				s.log.Info("hot key left the overflow set", "pool", pool, "key", e.Key, "version", next.Version)
			}
		}
	}
	if entered > maxLoggedKeys || left > maxLoggedKeys {
		s.log.Info("overflow set changed", "pool", pool, "entered", entered, "left", left, "keys", len(next.Entries), "version", next.Version)
	}
}
