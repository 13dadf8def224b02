package hotkey

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
)

// ErrMissingKey is returned by Decision.Err for a message without a key.
var ErrMissingKey = errors.New("hotkey: message has no key")

// Outcome is where a message goes. Its String form suits metric labels.
type Outcome uint8

const (
	// Rejected is the zero Outcome: no routing decision was made because the
	// message has no key (Reason MissingKey, Decision.Err returns
	// ErrMissingKey). The caller must fail the send or compute a key; it must
	// never treat a Rejected decision as Main.
	Rejected Outcome = iota
	// Main sends the message to the main destination, keyed.
	Main
	// Overflow sends the message to the overflow destination, keyed unless
	// Decision.Spread is set.
	Overflow
	// Drop discards the message (it is counted).
	Drop
	// DeadLetter sends the message to the dead-letter destination.
	DeadLetter
	// SkipStateful sends the message to main, marked for processing without
	// per-key state.
	SkipStateful
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"rejected", "main", "overflow", "drop", "dead_letter", "skip_stateful"}

func (o Outcome) String() string {
	if o < numOutcomes {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Reason is why a decision was made. Its String form suits metric labels.
type Reason uint8

const (
	NoReason         Reason = iota // zero value, never returned by Decide
	MissingKey                     // Rejected: the key is nil or empty
	NotHot                         // Main: no rule matched and the key is not hot
	DropRule                       // Drop: a drop rule matched
	DeadLetterRule                 // DeadLetter: a dead-letter rule matched
	SkipStatefulRule               // SkipStateful: a skip-stateful rule matched
	ForcedOverflow                 // Overflow: an overflow rule matched
	JunkKey                        // Overflow: the key is a listed junk id
	Detected                       // Overflow: the detector reports the key hot
	Sticky                         // Overflow: the key is no longer hot but has not left overflow yet
	Released                       // Main: the key left overflow with this message
	KillSwitch                     // Main: overflow is disabled; the key would have gone to overflow
	OverflowFull                   // Main: the key is hot (locally or cluster-wide) but MaxOverflowKeys keys are in overflow
	ClusterHot                     // Overflow: the key is in the cluster-wide overflow set (SetClusterKeys)
	numReasons
)

var reasonNames = [numReasons]string{
	"none", "missing_key", "not_hot", "drop_rule", "dead_letter_rule", "skip_stateful_rule",
	"forced_overflow", "junk_key", "detected", "sticky", "released", "kill_switch", "overflow_full",
	"cluster_hot",
}

func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// Decision is the policy's verdict on one message.
type Decision struct {
	Outcome Outcome
	Reason  Reason
	// Spread is set on Overflow decisions whose key must not be preserved:
	// the message goes to a random overflow partition. Only ever set by an
	// explicit opt-in (a rule with "spread", or PolicyConfig.SpreadDetected).
	Spread bool
}

// Err returns ErrMissingKey for a Rejected decision, else nil.
func (d Decision) Err() error {
	if d.Outcome == Rejected {
		return ErrMissingKey
	}
	return nil
}

func (d Decision) String() string {
	s := d.Outcome.String() + "/" + d.Reason.String()
	if d.Spread {
		s += "/spread"
	}
	return s
}

// Defaults and limits of PolicyConfig.
const (
	DefaultCooldown        = 30 * time.Second
	DefaultMaxOverflowKeys = 1024
	MaxOverflowKeysLimit   = 1 << 20
)

// PolicyConfig configures a Policy. Detector.Threshold is the high
// threshold at which keys enter overflow.
type PolicyConfig struct {
	Detector DetectorConfig
	// LowThreshold is the rate below which a key in overflow may leave it.
	// Default Detector.Threshold/2; it must be below Detector.Threshold.
	LowThreshold float64
	// Cooldown is how long a key's rate must have stayed below LowThreshold
	// before it may leave overflow. Default DefaultCooldown.
	Cooldown time.Duration
	// MaxOverflowKeys caps the keys held in overflow. A detected hot key that
	// finds the cap reached stays on main (Reason OverflowFull); a key forced
	// by a rule still goes to overflow but is not made sticky (counted in
	// Counters.Untracked). Default DefaultMaxOverflowKeys.
	MaxOverflowKeys int
	// SpreadDetected sends detected hot keys, and the keys of the cluster
	// set (SetClusterKeys), to random overflow partitions instead of
	// preserving the key. Opt in only when overflow processing is
	// stateless.
	SpreadDetected bool
	// Rules are the operator rules; nil means none.
	Rules *Rules
	// Disabled starts the policy with the kill switch on (see SetEnabled).
	Disabled bool
}

// Policy decides, message by message, where each key goes: main, overflow,
// drop, dead-letter or skip-stateful. It owns a Detector fed by every keyed
// message it decides on.
//
// A Policy is not safe for concurrent use, except SetEnabled and Enabled,
// which may be called from any goroutine. Its only callback-free inputs are
// Decide, MarkDrained, Sweep, SetRules and SetClusterKeys; it starts no
// goroutines and reads no clock.
type Policy struct {
	det     *Detector
	rules   *Rules
	enabled atomic.Bool

	low            float64
	cooldown       int64
	tauNs          float64
	maxKeys        int
	spreadDetected bool

	// The keys in overflow: entries with a free list, indexed by an open
	// addressing table of entry+1 on the key's hash.
	entries []stickyEntry
	free    []int32
	table   []int32
	mask    uint64
	live    int

	counts                       [numOutcomes][numReasons]uint64
	entered, released, untracked uint64
	scratch                      []byte

	// The cluster overflow set (SetClusterKeys), after the fields every
	// Decide reads, so that an empty set costs Decide one length test.
	cluster clusterSet
}

type stickyEntry struct {
	key          string
	hash         uint64
	since        int64 // when the key entered overflow
	lastOverflow int64 // the latest decision that sent it to overflow
	drained      int64 // MarkDrained: processed through this time
	lastHigh     int64 // the latest time its rate was seen ≥ LowThreshold (MinInt64: never)
	lastHighRate float64
	spread       bool
	live         bool
}

// NewPolicy returns a policy, or an error wrapping ErrBadConfig.
func NewPolicy(cfg PolicyConfig) (*Policy, error) {
	dcfg, err := cfg.Detector.withDefaults()
	if err != nil {
		return nil, err
	}
	if cfg.LowThreshold == 0 {
		cfg.LowThreshold = dcfg.Threshold / 2
	}
	if !(cfg.LowThreshold > 0 && cfg.LowThreshold < dcfg.Threshold) {
		return nil, badConfigf("LowThreshold must be in (0, Threshold=%v), got %v", dcfg.Threshold, cfg.LowThreshold)
	}
	if cfg.Cooldown == 0 {
		cfg.Cooldown = DefaultCooldown
	}
	if cfg.Cooldown < 0 {
		return nil, badConfigf("Cooldown must not be negative, got %v", cfg.Cooldown)
	}
	if cfg.MaxOverflowKeys == 0 {
		cfg.MaxOverflowKeys = DefaultMaxOverflowKeys
	}
	if cfg.MaxOverflowKeys < 0 || cfg.MaxOverflowKeys > MaxOverflowKeysLimit {
		return nil, badConfigf("MaxOverflowKeys must be in [1, %d], got %d", MaxOverflowKeysLimit, cfg.MaxOverflowKeys)
	}
	det, err := NewDetector(dcfg)
	if err != nil {
		return nil, err
	}
	p := &Policy{
		det:            det,
		rules:          cfg.Rules,
		low:            cfg.LowThreshold,
		cooldown:       int64(cfg.Cooldown),
		tauNs:          float64(dcfg.HalfLife) / math.Ln2,
		maxKeys:        cfg.MaxOverflowKeys,
		spreadDetected: cfg.SpreadDetected,
		entries:        make([]stickyEntry, cfg.MaxOverflowKeys),
		free:           make([]int32, 0, cfg.MaxOverflowKeys),
	}
	for i := cfg.MaxOverflowKeys - 1; i >= 0; i-- {
		p.free = append(p.free, int32(i))
	}
	tsize := 1
	for tsize < 2*cfg.MaxOverflowKeys {
		tsize <<= 1
	}
	p.table = make([]int32, tsize)
	p.mask = uint64(tsize - 1)
	p.enabled.Store(!cfg.Disabled)
	return p, nil
}

// Detector returns the policy's detector, for reports and statistics.
// Observing through it counts messages that did not go through Decide.
func (p *Policy) Detector() *Detector { return p.det }

// SetRules replaces the operator rules (nil for none). A key that leaves an
// overflow rule stays in overflow, like a detected key, until it cools down
// and drains, provided it was tracked (see PolicyConfig.MaxOverflowKeys).
func (p *Policy) SetRules(rs *Rules) { p.rules = rs }

// Rules returns the current operator rules.
func (p *Policy) Rules() *Rules { return p.rules }

// SetClusterKeys replaces the cluster-wide overflow set: the keys that the
// control plane found hot summed over every producer (see Aggregate), of
// which this policy may see only a small share. nil or empty clears it;
// empty keys are ignored, and keys is not retained. Like Decide, it must
// not run concurrently with the policy's other methods: the owner
// serialises it with Decide.
//
// A key of the set goes to overflow (Reason ClusterHot), keyed unless
// PolicyConfig.SpreadDetected, after the rules (drop, dead-letter,
// skip-stateful, overflow, junk) and before the detector. It is held in
// overflow like a detected key: when it leaves the set it stays (Reason
// Sticky) until it has been below LowThreshold for Cooldown and has
// drained (MarkDrained). The cooldown runs from the last decision that saw
// the key's local rate at or above LowThreshold; a key that was never
// locally that high owes none, since the control plane already applied
// its own cooldown before dropping it from the set, and leaves as soon as
// it has drained. Sweep never releases a key of the set. Beyond
// MaxOverflowKeys a key of the set stays on main (Reason OverflowFull),
// as a detected one does, so that it never reaches overflow without its
// drain barriers.
//
// SetClusterKeys takes time and allocates in proportion to len(keys); a
// policy whose set is empty pays one comparison per Decide for it.
func (p *Policy) SetClusterKeys(keys []string) { p.cluster = newClusterSet(keys) }

// clusterSet is the cluster-wide overflow set: its keys, indexed by an
// open-addressing table of index+1 on the keys' xxhash (the hash Decide
// computes anyway).
type clusterSet struct {
	keys   []string
	hashes []uint64
	table  []int32
	mask   uint64
}

func newClusterSet(keys []string) clusterSet {
	var c clusterSet
	if len(keys) == 0 {
		return c
	}
	size := 2
	for size < 2*len(keys) {
		size <<= 1
	}
	c.table = make([]int32, size)
	c.mask = uint64(size - 1)
	for _, k := range keys {
		h := xxhash.Sum64String(k)
		if k == "" || c.has(h, []byte(k)) {
			continue
		}
		c.keys = append(c.keys, k)
		c.hashes = append(c.hashes, h)
		i := h & c.mask
		for c.table[i] != 0 {
			i = (i + 1) & c.mask
		}
		c.table[i] = int32(len(c.keys))
	}
	return c
}

// has reports whether key, whose xxhash is h, is in the set.
func (c *clusterSet) has(h uint64, key []byte) bool {
	if len(c.table) == 0 {
		return false
	}
	for i := h & c.mask; ; i = (i + 1) & c.mask {
		e := c.table[i]
		if e == 0 {
			return false
		}
		if c.hashes[e-1] == h && c.keys[e-1] == string(key) {
			return true
		}
	}
}

// SetEnabled sets the kill switch: SetEnabled(false) disables overflow
// wholesale, so that every message that would go to overflow (forced, junk,
// detected or sticky) goes to main with Reason KillSwitch. Drop,
// dead-letter and skip-stateful rules still apply: they protect the main
// consumers and are independent of overflow. The detector keeps counting,
// and the keys already in overflow stay listed (they may still cool down
// and drain), so SetEnabled(true) resumes where it left off. While disabled,
// main and overflow may process the same key at once: the kill switch is for
// when overflow itself is the problem. Safe for concurrent use.
func (p *Policy) SetEnabled(on bool) { p.enabled.Store(on) }

// Enabled reports whether overflow is enabled. Safe for concurrent use.
func (p *Policy) Enabled() bool { return p.enabled.Load() }

// Decide counts one message of key at now and returns where it goes. Rules
// apply in priority order: drop > dead-letter > skip-stateful > overflow >
// junk > the cluster set (SetClusterKeys) > the detector (and the keys
// already in overflow). A nil or empty key gets Outcome Rejected, Reason
// MissingKey. Decide does not allocate except when a key enters overflow
// (its key is copied once).
func (p *Policy) Decide(key []byte, now time.Time) Decision {
	d, _ := p.DecideEntry(key, now)
	return d
}

// DecideEntry is Decide that also returns, for an Overflow decision, the
// index of key's overflow entry: an int in [0, MaxOverflowKeys) that is
// key's for as long as the policy holds it in overflow, and may be another
// key's once it has left. It is −1 for an Overflow decision whose key the
// policy could not hold (MaxOverflowKeys keys in overflow; see
// Counters.Untracked), and for every other decision. A caller that keeps
// state per key in overflow may index it by entry, checking the key,
// instead of looking the key up again.
func (p *Policy) DecideEntry(key []byte, now time.Time) (d Decision, entry int) {
	if len(key) == 0 {
		return p.record(Rejected, MissingKey, false), -1
	}
	h := xxhash.Sum64(key)
	est := p.det.observe(key, h, 1, now.UnixNano())
	t := p.det.last // monotone
	var mask, spread uint8
	if p.rules != nil {
		mask, spread = p.rules.match(key)
	}
	if mask != 0 {
		switch {
		case mask&bitDrop != 0:
			return p.record(Drop, DropRule, false), -1
		case mask&bitDead != 0:
			return p.record(DeadLetter, DeadLetterRule, false), -1
		case mask&bitSkip != 0:
			return p.record(SkipStateful, SkipStatefulRule, false), -1
		}
	}
	enabled := p.enabled.Load()
	if mask&(bitOverflow|bitJunk) != 0 {
		if !enabled {
			return p.record(Main, KillSwitch, false), -1
		}
		reason, sp := ForcedOverflow, spread&bitOverflow != 0
		if mask&bitOverflow == 0 {
			reason, sp = JunkKey, spread&bitJunk != 0
		}
		e := p.find(h, key)
		if e >= 0 {
			p.entries[e].touch(t, est.Rate, p.low, sp)
		} else if e = p.insert(key, h, t, est.Rate, sp); e < 0 {
			p.untracked++
		}
		return p.record(Overflow, reason, sp), int(e)
	}
	e := int32(-1)
	if p.live > 0 {
		e = p.find(h, key)
	}
	if len(p.cluster.keys) > 0 && p.cluster.has(h, key) {
		return p.decideCluster(key, h, e, est.Rate, t, enabled)
	}
	if !enabled {
		if e >= 0 || est.Hot {
			return p.record(Main, KillSwitch, false), -1
		}
		return p.record(Main, NotHot, false), -1
	}
	if e >= 0 {
		en := &p.entries[e]
		if est.Hot {
			en.touch(t, est.Rate, p.low, en.spread)
			return p.record(Overflow, Detected, en.spread), int(e)
		}
		if p.releasable(en, est.Rate, t) {
			p.remove(e)
			p.released++
			return p.record(Main, Released, false), -1
		}
		en.lastOverflow = t
		return p.record(Overflow, Sticky, en.spread), int(e)
	}
	if est.Hot {
		if e = p.insert(key, h, t, est.Rate, p.spreadDetected); e < 0 {
			return p.record(Main, OverflowFull, false), -1
		}
		return p.record(Overflow, Detected, p.spreadDetected), int(e)
	}
	return p.record(Main, NotHot, false), -1
}

// decideCluster decides for a key of the cluster set; e is its entry in
// overflow, or -1, and rate its local rate's upper bound. It returns what
// DecideEntry does.
func (p *Policy) decideCluster(key []byte, h uint64, e int32, rate float64, t int64, enabled bool) (Decision, int) {
	if !enabled {
		return p.record(Main, KillSwitch, false), -1
	}
	sp := p.spreadDetected
	if e >= 0 {
		p.entries[e].touch(t, rate, p.low, sp)
		return p.record(Overflow, ClusterHot, sp), int(e)
	}
	e = p.insert(key, h, t, rate, sp)
	if e < 0 {
		return p.record(Main, OverflowFull, false), -1
	}
	if rate < p.low {
		// Not locally high: once the key leaves the set, it owes no
		// cooldown from here (see SetClusterKeys).
		p.entries[e].lastHigh, p.entries[e].lastHighRate = math.MinInt64, 0
	}
	return p.record(Overflow, ClusterHot, sp), int(e)
}

func (p *Policy) record(o Outcome, r Reason, spread bool) Decision {
	p.counts[o][r]++
	return Decision{Outcome: o, Reason: r, Spread: spread}
}

// MarkDrained tells the policy that every message of key that it routed to
// overflow by a decision at or before through has been processed, so
// that the key may leave overflow once it has also cooled down. The caller
// (the overflow router) derives it from committed offsets: through is the
// now it passed to Decide for the latest overflow message of key that is
// processed. It reports whether key is in overflow; for other keys it does
// nothing.
func (p *Policy) MarkDrained(key []byte, through time.Time) bool {
	e := p.find(xxhash.Sum64(key), key)
	if e < 0 {
		return false
	}
	en := &p.entries[e]
	en.drained = max(en.drained, unixNanoSat(through))
	return true
}

// The range of time.Time.UnixNano; beyond it, unixNanoSat saturates.
var minNano, maxNano = time.Unix(0, math.MinInt64), time.Unix(0, math.MaxInt64)

func unixNanoSat(t time.Time) int64 {
	switch {
	case t.Before(minNano):
		return math.MinInt64
	case t.After(maxNano):
		return math.MaxInt64
	}
	return t.UnixNano()
}

// Sweep releases every key in overflow that has cooled down and drained,
// without waiting for its next message, to make room under MaxOverflowKeys.
// It never releases a key of the cluster set (SetClusterKeys). It returns
// how many keys it released. Call it periodically (for example every
// second); it takes time proportional to MaxOverflowKeys.
func (p *Policy) Sweep(now time.Time) int {
	t := max(unixNanoSat(now), p.det.last)
	n := 0
	for i := range p.entries {
		en := &p.entries[i]
		if !en.live {
			continue
		}
		p.scratch = append(p.scratch[:0], en.key...)
		if p.cluster.has(en.hash, p.scratch) {
			continue // still hot cluster-wide
		}
		est := p.det.estimateHash(p.scratch, en.hash, t)
		if p.releasable(en, est.Rate, t) {
			p.remove(int32(i))
			p.released++
			n++
		}
	}
	return n
}

// releasable updates en's cooling state with its current rate (an upper
// bound) and reports whether it may leave overflow at t: its rate is below
// LowThreshold, has been for Cooldown, and it has drained.
func (p *Policy) releasable(en *stickyEntry, rate float64, t int64) bool {
	if rate >= p.low {
		en.lastHigh, en.lastHighRate = t, rate
		return false
	}
	// Between two evaluations the key receives no message, so its rate
	// decays exponentially from lastHighRate and crossed LowThreshold at
	// lastHigh + τ·ln(lastHighRate/LowThreshold).
	cross := en.lastHigh
	if en.lastHighRate > p.low {
		cross = addSat(cross, math.Log(en.lastHighRate/p.low)*p.tauNs)
	}
	if t < cross || uint64(t)-uint64(cross) < uint64(p.cooldown) {
		return false
	}
	return en.drained >= en.lastOverflow
}

func addSat(t int64, d float64) int64 {
	if d >= float64(math.MaxInt64-t) {
		return math.MaxInt64
	}
	return t + int64(d)
}

func (en *stickyEntry) touch(t int64, rate, low float64, spread bool) {
	en.lastOverflow = t
	en.spread = spread
	if rate >= low {
		en.lastHigh, en.lastHighRate = t, rate
	}
}

func (p *Policy) find(h uint64, key []byte) int32 {
	for i := h & p.mask; ; i = (i + 1) & p.mask {
		e := p.table[i]
		if e == 0 {
			return -1
		}
		en := &p.entries[e-1]
		if en.hash == h && en.key == string(key) {
			return e - 1
		}
	}
}

// insert puts key in overflow and returns its entry, or -1 at
// MaxOverflowKeys.
func (p *Policy) insert(key []byte, h uint64, t int64, rate float64, spread bool) int32 {
	if len(p.free) == 0 {
		return -1
	}
	e := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	p.entries[e] = stickyEntry{
		key: string(key), hash: h, since: t, lastOverflow: t, drained: math.MinInt64,
		lastHigh: t, lastHighRate: rate, spread: spread, live: true,
	}
	i := h & p.mask
	for p.table[i] != 0 {
		i = (i + 1) & p.mask
	}
	p.table[i] = e + 1
	p.live++
	p.entered++
	return e
}

// remove takes entry e out of overflow (backward-shift deletion).
func (p *Policy) remove(e int32) {
	i := p.entries[e].hash & p.mask
	for p.table[i] != e+1 {
		i = (i + 1) & p.mask
	}
	for j := i; ; {
		j = (j + 1) & p.mask
		x := p.table[j]
		if x == 0 {
			p.table[i] = 0
			break
		}
		home := p.entries[x-1].hash & p.mask
		if (j-home)&p.mask >= (j-i)&p.mask {
			p.table[i] = x
			i = j
		}
	}
	p.entries[e] = stickyEntry{}
	p.free = append(p.free, e)
	p.live--
}

// OverflowKey describes one key held in overflow.
type OverflowKey struct {
	Key string
	// Since is when the key entered overflow; LastOverflow the latest
	// decision that sent it there; DrainedThrough the latest MarkDrained
	// (zero if none).
	Since, LastOverflow, DrainedThrough time.Time
	Spread                              bool
}

// AppendOverflowKeys appends the keys currently held in overflow to dst, in
// no particular order, and returns the extended slice.
func (p *Policy) AppendOverflowKeys(dst []OverflowKey) []OverflowKey {
	for i := range p.entries {
		en := &p.entries[i]
		if !en.live {
			continue
		}
		k := OverflowKey{
			Key: en.key, Since: time.Unix(0, en.since), LastOverflow: time.Unix(0, en.lastOverflow),
			Spread: en.spread,
		}
		if en.drained != math.MinInt64 {
			k.DrainedThrough = time.Unix(0, en.drained)
		}
		dst = append(dst, k)
	}
	return dst
}

// Counters is a snapshot of a policy's decision counts.
type Counters struct {
	// Decisions counts decisions by outcome and reason; index it with
	// Outcome and Reason values, or use Count.
	Decisions [numOutcomes][numReasons]uint64
	// Entered and Released count keys entering and leaving overflow.
	Entered, Released uint64
	// Untracked counts forced-overflow messages whose key could not be made
	// sticky because MaxOverflowKeys keys were in overflow.
	Untracked uint64
	// OverflowKeys is the number of keys in overflow now.
	OverflowKeys int
	// ClusterKeys is the number of keys in the cluster set
	// (SetClusterKeys).
	ClusterKeys int
	// Enabled is the kill switch's state (false: overflow disabled).
	Enabled bool
}

// Count returns the number of decisions with outcome o and reason r.
func (c *Counters) Count(o Outcome, r Reason) uint64 {
	if o >= numOutcomes || r >= numReasons {
		return 0
	}
	return c.Decisions[o][r]
}

// Outcome returns the number of decisions with outcome o.
func (c *Counters) Outcome(o Outcome) uint64 {
	var n uint64
	for r := Reason(0); r < numReasons; r++ {
		n += c.Count(o, r)
	}
	return n
}

// Reason returns the number of decisions with reason r.
func (c *Counters) Reason(r Reason) uint64 {
	var n uint64
	for o := Outcome(0); o < numOutcomes; o++ {
		n += c.Count(o, r)
	}
	return n
}

// Total returns the number of decisions.
func (c *Counters) Total() uint64 {
	var n uint64
	for o := Outcome(0); o < numOutcomes; o++ {
		n += c.Outcome(o)
	}
	return n
}

// Counters returns a snapshot of the decision counters.
func (p *Policy) Counters() Counters {
	return Counters{
		Decisions:    p.counts,
		Entered:      p.entered,
		Released:     p.released,
		Untracked:    p.untracked,
		OverflowKeys: p.live,
		ClusterKeys:  len(p.cluster.keys),
		Enabled:      p.enabled.Load(),
	}
}
