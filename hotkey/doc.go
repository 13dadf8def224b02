// Package hotkey finds hot keys in bounded memory and decides, message by
// message, whether a key goes to the main destination, to overflow, to the
// dead-letter destination, is dropped, or is processed without per-key state.
//
// It is pure: no IO, no goroutines, no clock. Every method that needs the time
// takes it as a now argument, so tests and simulations drive it with any
// clock. The Kafka overflow router (package kafka) and the control plane wire
// it to real traffic.
//
// # Usage
//
//	rules, err := hotkey.ParseRules(`
//		drop        token:abusive
//		dead-letter token:revoked:*
//		overflow    user:42
//		junk        anonymous,null,undefined
//	`)
//	if err != nil { return err } // a *RuleError naming the line, wrapping ErrBadRule
//	p, err := hotkey.NewPolicy(hotkey.PolicyConfig{
//		Detector: hotkey.DetectorConfig{
//			Threshold:    1000,    // a key at ≥ 1000 msg/s is hot
//			MaxTotalRate: 200_000, // sizes the sketch: 200000/(0.1·1000) = 2000 slots
//		},
//		Rules: rules,
//	})
//	if err != nil { return err }
//	for msg := range msgs {
//		d := p.Decide(msg.Key, msg.Time) // no allocation in the steady state
//		if err := d.Err(); err != nil { ... } // no key: never silently main
//		switch d.Outcome { case hotkey.Main: ...; case hotkey.Overflow: ... }
//	}
//	// when the overflow consumers have committed past a key's messages:
//	p.MarkDrained(key, decidedAt)
//	// periodically:
//	p.Sweep(now)
//	stats := p.Counters() // by outcome and reason
//
// Neither Detector nor Policy is safe for concurrent use (except
// Policy.SetEnabled and Policy.Enabled): the router owns one from one
// goroutine, or behind its own lock.
//
// # Detection and its error bounds
//
// Detector is a Space-Saving sketch [Metwally et al. 2005] of Capacity slots
// over exponentially decayed weights. A message at time tᵢ weighs
// e^{−λ(t−tᵢ)} at time t, with λ = ln 2/HalfLife; the decayed count of key k
// is fₖ(t) = Σ e^{−λ(t−tᵢ)} over k's messages, and its rate is rₖ(t) = λ·fₖ(t)
// messages per second (a key sending steadily at r has rₖ → r). Decay is
// applied lazily ("forward decay"): a message is added with weight e^{λ(tᵢ−L)}
// for a landmark L, and counts are divided by e^{λ(t−L)} when read; when the
// exponent passes 40 every count is rescaled once to a new landmark. Since all
// weights of one instant are scaled alike, Space-Saving's guarantees for
// weighted streams apply to decayed counts unchanged. Each slot keeps its
// count c, and own, the weight the key received since it took the slot. A new
// key takes the slot of the smallest count m, with c = m + its weight.
//
// Let K be Capacity, T Threshold, ε Epsilon, R(t) = Σₖ rₖ(t) the decayed
// total rate, and μ(t) = λ·m(t) the smallest tracked rate once every slot is in
// use (0 before). Then at every t, up to floating-point rounding:
//
//  1. Bounds. Estimate.Lower() ≤ rₖ(t) ≤ Estimate.Rate for every key, and
//     Estimate.ErrorBound ≤ μ(t) ≤ R(t)/K. An untracked key has rₖ(t) ≤ μ(t).
//  2. No false report, unconditionally. A key is reported (Estimate.Hot,
//     AppendHot) only if Lower() ≥ (1−ε)·T, so every reported key has
//     rₖ(t) ≥ (1−ε)·T, however many keys there are and however loaded the
//     sketch is.
//  3. Every hot key is reported, if μ(t) ≤ ε·T. Then a key with rₖ(t) ≥ T is
//     tracked (untracked keys are at most μ(t) < T) and its Lower() ≥
//     rₖ(t) − μ(t) ≥ (1−ε)·T. The precondition holds whenever
//     R(t) ≤ K·ε·T = GuaranteedTotalRate(); K is derived from MaxTotalRate so
//     that this is at least MaxTotalRate. Stats reports whether it holds now
//     (Guaranteed) and counts the observations made while it did not
//     (Degraded): beyond it, keys may be missed but still never falsely
//     reported.
//  4. A key that sends one message is never reported: its lower bound is at
//     most λ, and NewDetector rejects configurations with (1−ε)·T ≤ λ. So an
//     adversary sending a fresh key with every message is never reported, and
//     cannot grow memory, which is fixed at NewDetector:
//     K·(56+max(MaxKeyLen, 24)) bytes plus 8-byte table entries for a power
//     of two ≥ 2K (about 1.5 MB for K = 10,000 and MaxKeyLen 64; see
//     MemoryBytes).
//
// Keys are hashed with xxhash; a slot stores the first MaxKeyLen bytes of its
// key, the key's full length and its 64-bit hash, and two keys are the same
// if all three agree (keys longer than MaxKeyLen that share all three are
// merged, which only overestimates). Observe never allocates. Keys not seen
// again since they took their slot wait in a queue that is sorted by
// construction (they enter with count m + weight, which never decreases), and
// the others in a 4-ary min-heap, so a message costs O(1) for a new key or a
// flood of fresh keys and O(log K) at worst. Time never runs backwards: an
// earlier now counts as the latest. Times must lie within int64 nanoseconds
// since 1970 (years 1678 to 2262), as time.Time.UnixNano requires.
//
// # Overflow policy
//
// Policy.Decide applies, in priority order:
//
//   - drop rules (Drop, DropRule), dead-letter rules (DeadLetter,
//     DeadLetterRule) and skip-stateful rules (SkipStateful,
//     SkipStatefulRule);
//   - overflow rules (Overflow, ForcedOverflow), then junk ids (Overflow,
//     JunkKey), matched without regard to ASCII case;
//   - the cluster-wide overflow set that the owner installs with
//     SetClusterKeys (Overflow, ClusterHot; Main with OverflowFull);
//   - the keys already in overflow and the detector (Overflow with Detected
//     or Sticky; Main with NotHot, Released or OverflowFull).
//
// A message without a key gets Outcome Rejected (Reason MissingKey, and
// Decision.Err returns ErrMissingKey): never silently main. The key is
// preserved by default, so a hot key lands on one overflow partition;
// Decision.Spread (a random partition) is set only by explicit opt-in, for
// stateless processing.
//
// # Lifecycle of a key in overflow
//
// A key enters overflow when the detector reports it hot (rate ≥ (1−ε)·T
// guaranteed; see above), a rule forces it there, or it is in the cluster
// set. It then stays, Reason Sticky, until all of these hold at one of its
// decisions or at Sweep (which never releases a key of the cluster set):
//
//  1. its rate's upper bound is below LowThreshold (hysteresis: enter at
//     T, leave below LowThreshold < T);
//  2. it has been below LowThreshold for Cooldown (a key that entered
//     through the cluster set and was never locally at LowThreshold owes
//     none: the control plane's own cooldown has run);
//  3. MarkDrained has reported processed every message that a decision sent
//     to overflow, up to the latest one.
//
// The message that finds all three true goes to main with Reason Released,
// and so do the key's next ones until it is hot again. Because the key stays
// in overflow until its overflow backlog is processed, main and overflow
// never process it at the same time (except with the kill switch off). At
// most MaxOverflowKeys keys are in overflow: a newly hot key beyond the cap
// stays on main (Reason OverflowFull), and a forced key beyond the cap still
// goes to overflow but will not be sticky once its rule is removed
// (Counters.Untracked). The kill switch SetEnabled(false) sends to main
// everything that would have gone to overflow (Reason KillSwitch); drop,
// dead-letter and skip-stateful rules still apply.
//
// Every decision is counted by outcome and reason (Counters); String forms of
// Outcome and Reason suit metric labels.
//
// # Cluster-wide hot keys
//
// Aggregate is the pure core of cluster-wide detection: it sums the latest
// heavy-hitter Report of every producer (stale ones dropped), so a key
// spread evenly over many producers is caught at the global threshold, and
// returns the next versioned OverflowSet with the same hysteresis as the
// policy (enter at Threshold, leave after Cooldown below LowThreshold).
// The version rises whenever the set's membership changes.
//
// A producer takes part with two calls, both made by the policy's owner
// under the lock it decides under: Detector.AppendAbove lists the keys
// to report (their upper-bound rates, so that sums never miss a key), and
// Policy.SetClusterKeys installs each newer set. The client package's
// HotKeys runs that exchange with `keyshard serve`; the kafka package's
// Router wires it up (kafka.Config.ClusterHotKeys).
package hotkey
