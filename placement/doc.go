// Package placement is Keyshard's pure core: which bucket a key falls in,
// which member owns each bucket, how to move the fewest buckets when
// members come and go, which members serve each tenant, and how many
// members a tenant needs for its load.
//
// Everything here is a function of its arguments: no IO, no goroutines, no
// clock reads (time is passed in), and the same input gives the same
// output whatever the order of slices or maps in it. The coordinator, the
// SDK and the benchmarks build on it.
//
// # Keys and buckets
//
// A keyspace hashes keys into B buckets (DefaultBuckets is 4096; 1 to
// 65536). HashXXH64, the default, is
//
//	bucket = (xxh64(key, seed=0) * B) >> 64
//
// and HashSynapse reproduces Synapse's static instance choice. The test
// vectors in api/keyshard/v1/hash_vectors.json and the plain-Python
// reference api/keyshard/v1/reference/bucket.py let a client in another
// language check itself.
//
// # Buckets and members
//
// Balance takes the current Assignment and the live members and returns a
// Plan: every member with a positive weight ends with ⌊share⌋ or ⌈share⌉
// buckets (share = B·weight/Σweights) and exactly the minimum number of
// buckets moves. BalanceLoad is the load-aware variant: it moves buckets
// from the most to the least loaded members until each is within a
// tolerance of its target load or a move budget is spent. A Table answers
// key → owner in a few nanoseconds without allocating.
//
//	p, err := placement.Balance(cur, []placement.Member{{ID: "w1", Weight: 1}, {ID: "w2", Weight: 1}})
//	if err != nil { ... }            // errors.Is(err, placement.ErrInvalid)
//	for _, m := range p.Moves { ... } // bucket, from, to, why
//	table, _ := placement.NewTable(placement.HashXXH64, p.Assignment)
//	owner, ok := table.OwnerString("!room:example.org")
//
// # Tenants
//
// Shards computes sticky, balanced shuffle shards for a pool: from the
// previous subsets (tenant → member IDs), the live members and each
// tenant's Size and Load it returns a ShardPlan. A size change of Δ adds or
// removes exactly |Δ| members; a member that leaves or drains is replaced
// only in the tenants that had it; adding members moves nothing unless
// ShardOptions.MaxRebalanceMoves allows that many swaps. Members are spread
// over zones (at most ⌈size/zones⌉ per zone) and new members are chosen
// among the least loaded by a per-tenant hash, so subsets overlap no more
// than random ones; Overlap reports that against the hypergeometric
// expectation.
//
// Subset is the stateless variant for a client that has only the member
// list, with dskit's guarantees: same input, same subset; one member
// joining or leaving changes a subset by at most one; size n+1 contains
// size n. Its hash is portable (see Subset).
//
// NextSize turns a tenant's measured rate into its shard size, with
// hysteresis held in an explicit SizeState: it grows at once and shrinks
// only after a cooldown, by a bounded step, and never depends on the pool
// except as the upper clamp.
//
// # Lifecycle
//
// There is none: values in, values out. Callers own every value they pass
// and get back; nothing is retained except by NewTable, which copies.
package placement
