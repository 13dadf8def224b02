package keyshardtest

import (
	"context"
	"sync"
	"time"
)

// rounds records what a replica's hot-key aggregation told it through
// server.Options (OnHotKeyTerm, OnHotKeyRound), so that tests driving a
// fake clock wait for a term or a round instead of sleeping.
type rounds struct {
	mu      sync.Mutex
	starts  int       // starts of the replica
	leading int       // the start in which the latest term began
	last    time.Time // the clock time of the latest finished round
	// The same for the tenant-pool rounds.
	tpLeading int
	tpLast    time.Time
	changed   chan struct{}
}

func newRounds() *rounds { return &rounds{changed: make(chan struct{})} }

func (r *rounds) update(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f()
	close(r.changed)
	r.changed = make(chan struct{})
}

// started counts a start of the replica and returns the hooks of its run.
func (r *rounds) started() (term func(), round func(at time.Time)) {
	var n int
	r.update(func() { r.starts++; n = r.starts })
	term = func() { r.update(func() { r.leading = n }) }
	round = func(at time.Time) { r.update(func() { r.last = at }) }
	return term, round
}

// tenantPoolHooks returns the tenant-pool hooks of the run that started
// last.
func (r *rounds) tenantPoolHooks() (term func(), round func(at time.Time)) {
	r.mu.Lock()
	n := r.starts
	r.mu.Unlock()
	term = func() { r.update(func() { r.tpLeading = n }) }
	round = func(at time.Time) { r.update(func() { r.tpLast = at }) }
	return term, round
}

// wait returns once cond holds, or ctx's error.
func (r *rounds) wait(ctx context.Context, cond func(*rounds) bool) error {
	for {
		r.mu.Lock()
		ok, changed := cond(r), r.changed
		r.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
