// Package tenantpool is the pure core of tenant pools: it sizes each
// tenant of a shuffle-sharded pool from the tenant's own measured load
// (never from the size of the pool) and gives clients and servers the same
// answer about which members serve it.
//
// Like internal/coordinator it reads no clock, does no IO and starts no
// goroutines: time is an argument, and the leader's loop
// (internal/server, pools_leader.go) feeds it and persists what it
// returns. The leader keeps a Planner, which runs rounds incrementally
// and holds every size (Planner.Hold) until it has measured a window.
// Three parts:
//
//   - Aggregator turns load reports (reporter, sequence number, per-tenant
//     counts since the reporter's previous report) into a rate per tenant
//     over a sliding window, in bounded memory; a retried or replayed
//     report is never counted twice.
//   - Plan runs one round: placement.NextSize per tenant, placement.Shards
//     for sticky, balanced, zone-aware subsets, and the join and leave
//     times that drive warm-up and lookback. Its State is a plain value:
//     persisted, it lets a new leader continue every size, cooldown and
//     subset.
//   - Snapshot answers from one State: Targets for a client, Serves and
//     Tenants for a server. An unknown tenant gets placement.Subset at the
//     policy's minimum size, so both sides agree before its first report.
//
// The sizing formula, per tenant (see placement.NextSize):
//
//	size = clamp(⌈rate × headroom / capacity⌉, min, max), rounded up to a multiple of the zones
//
// growing at once and shrinking only after the cooldown, by at most the
// shrink step; a fixed-size override wins at once.
//
// Usage, on the leader (one goroutine owns the Aggregator):
//
//	agg, _ := tenantpool.NewAggregator(tenantpool.AggregatorConfig{Window: time.Minute})
//	outcome, err := agg.Add(report, now) // per report; Replayed/Stale are not counted
//	st, changes, err := tenantpool.Plan(st, members, agg.Rates(now), policy, now) // per round
//	// persist changes.Tenants of st; publish st when changes.Visible
//	st, _, err = tenantpool.MarkReady(st, readyReports)
//
// and on a client or server, per published State:
//
//	snap := tenantpool.NewSnapshot(st)
//	targets := snap.Targets(tenant, now) // read-only
//	if snap.Serves(self, tenant) { /* prefetch */ }
//	snap = snap.Update(next, changedTenants) // a later State: rebuilds only those
//
// # Lifecycle
//
// An Aggregator lives for one term of leadership and is not persisted: a
// new leader measures from scratch, dividing by the time it has measured
// until a full window has passed. A shrink cooldown at least as long as
// the window keeps that from shrinking anyone. The State outlives leaders.
package tenantpool
