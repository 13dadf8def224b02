package hotkey

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// ErrBadConfig is wrapped by every error that NewDetector and NewPolicy
// return for an invalid configuration. Branch on it with errors.Is.
var ErrBadConfig = errors.New("hotkey: bad config")

func badConfigf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadConfig}, args...)...)
}

// Defaults and limits of DetectorConfig.
const (
	DefaultEpsilon   = 0.1
	DefaultHalfLife  = 10 * time.Second
	DefaultMaxKeyLen = 64
	// MaxCapacity bounds the number of slots of one detector (about 100 bytes
	// each with the default MaxKeyLen).
	MaxCapacity = 1 << 22
	// MaxKeyLenLimit bounds DetectorConfig.MaxKeyLen.
	MaxKeyLenLimit = 4096
	minCapacity    = 8
)

// renormAt is the exponent λ·(now−landmark) past which the detector rescales
// its counts to a new landmark (e^40 ≈ 2.4e17, far from float64 overflow).
const renormAt = 40

// DetectorConfig sizes a Detector. The zero value is not valid: Threshold and
// one of MaxTotalRate or Capacity are required; the rest have defaults.
type DetectorConfig struct {
	// Threshold is the rate, in messages per second, at or above which a key
	// is hot. Required.
	Threshold float64
	// Epsilon is the relative tolerance, in (0, 1): no key whose rate is
	// below (1−Epsilon)·Threshold is ever reported. Default DefaultEpsilon.
	Epsilon float64
	// HalfLife is the half-life of the exponential decay that turns counts
	// into rates: a message weighs 1 when it arrives and ½ one HalfLife
	// later. Rates average over roughly HalfLife/ln 2. Default DefaultHalfLife.
	HalfLife time.Duration
	// MaxTotalRate is the largest total rate, over all keys, in messages per
	// second, for which every key at Threshold must be reported. It sizes the
	// detector: Capacity = ⌈MaxTotalRate / (Epsilon·Threshold)⌉ slots.
	MaxTotalRate float64
	// Capacity, when non-zero, sets the number of slots directly (and
	// MaxTotalRate is ignored). Recall is then guaranteed up to a total rate
	// of Capacity·Epsilon·Threshold (see Detector.GuaranteedTotalRate).
	Capacity int
	// MaxKeyLen is how many bytes of each tracked key are kept to name it in
	// reports. Longer keys are still told apart by a 64-bit hash of the whole
	// key, their length and their first MaxKeyLen bytes; reports show them
	// truncated. Default DefaultMaxKeyLen, at most MaxKeyLenLimit.
	MaxKeyLen int
}

// withDefaults validates c, fills in defaults and derives the capacity.
func (c DetectorConfig) withDefaults() (DetectorConfig, error) {
	if !(c.Threshold > 0) || math.IsInf(c.Threshold, 0) {
		return c, badConfigf("Threshold must be a positive finite rate, got %v", c.Threshold)
	}
	if c.Epsilon == 0 {
		c.Epsilon = DefaultEpsilon
	}
	if !(c.Epsilon > 0 && c.Epsilon < 1) {
		return c, badConfigf("Epsilon must be in (0, 1), got %v", c.Epsilon)
	}
	if c.HalfLife == 0 {
		c.HalfLife = DefaultHalfLife
	}
	if c.HalfLife < time.Millisecond {
		return c, badConfigf("HalfLife must be at least 1ms, got %v", c.HalfLife)
	}
	if c.MaxKeyLen == 0 {
		c.MaxKeyLen = DefaultMaxKeyLen
	}
	if c.MaxKeyLen < 0 || c.MaxKeyLen > MaxKeyLenLimit {
		return c, badConfigf("MaxKeyLen must be in [1, %d], got %d", MaxKeyLenLimit, c.MaxKeyLen)
	}
	tau := c.HalfLife.Seconds() / math.Ln2
	if c.Threshold*tau*(1-c.Epsilon) <= 1 {
		return c, badConfigf("Threshold·HalfLife/ln2·(1−Epsilon) = %.3g must exceed 1 message, or a single message would count as hot (raise Threshold or HalfLife)",
			c.Threshold*tau*(1-c.Epsilon))
	}
	switch {
	case c.Capacity < 0:
		return c, badConfigf("Capacity must not be negative, got %d", c.Capacity)
	case c.Capacity > 0:
		if c.Capacity > MaxCapacity {
			return c, badConfigf("Capacity %d exceeds the maximum %d", c.Capacity, MaxCapacity)
		}
	default:
		if !(c.MaxTotalRate > 0) || math.IsInf(c.MaxTotalRate, 0) {
			return c, badConfigf("set MaxTotalRate (a positive finite rate) or Capacity, got MaxTotalRate %v", c.MaxTotalRate)
		}
		k := math.Ceil(c.MaxTotalRate / (c.Epsilon * c.Threshold))
		if k > MaxCapacity {
			return c, badConfigf("MaxTotalRate/(Epsilon·Threshold) = %.0f slots exceeds the maximum %d: raise Threshold or Epsilon, or lower MaxTotalRate", k, MaxCapacity)
		}
		c.Capacity = max(int(k), minCapacity)
	}
	return c, nil
}

// Estimate is what the detector knows about one key's rate at one instant.
// Rates are exponentially decayed message counts times ln 2/HalfLife, in
// messages per second; for a key sending at a steady rate r they converge to r.
type Estimate struct {
	// Rate is an upper bound on the key's decayed rate.
	Rate float64
	// ErrorBound is how much Rate may overestimate it: the true rate lies in
	// [Rate−ErrorBound, Rate] (up to floating-point rounding).
	ErrorBound float64
	// Hot reports Rate−ErrorBound ≥ (1−Epsilon)·Threshold: the key's rate
	// is guaranteed to be at least (1−Epsilon)·Threshold.
	Hot bool
	// Tracked reports whether the key holds a slot. An untracked key's rate
	// is at most the smallest tracked count, reported as Rate = ErrorBound.
	Tracked bool
}

// Lower returns the guaranteed lower bound Rate−ErrorBound.
func (e Estimate) Lower() float64 { return e.Rate - e.ErrorBound }

// HotKey is one entry of Detector.AppendHot.
type HotKey struct {
	// Key is the key, or its first MaxKeyLen bytes when Truncated.
	Key       string
	Truncated bool
	Estimate
}

// DetectorStats is a snapshot of a detector's counters and error bound.
type DetectorStats struct {
	Capacity int // slots, fixed at construction
	Tracked  int // slots in use
	// Observations, Evictions and Renormalizations count calls to Observe,
	// keys that replaced the smallest tracked key, and rescalings of the
	// decayed counts to a new time origin.
	Observations, Evictions, Renormalizations uint64
	// ErrorBound is the current worst-case overestimate of any rate, in
	// messages per second (the smallest tracked rate once every slot is in
	// use, else 0).
	ErrorBound float64
	// Guaranteed reports ErrorBound ≤ Epsilon·Threshold: every key at or
	// above Threshold is currently reported.
	Guaranteed bool
	// Degraded counts observations made while Guaranteed was false.
	Degraded uint64
	// MemoryBytes is the fixed size of the detector's arrays.
	MemoryBytes int
}

// slot is one tracked key. A slot is either queued (pos < 0; its count is
// in count) or in the heap (its count is in heap[pos]).
//
// A slot is 64 bytes, one cache line (the slots are a large, page-aligned
// allocation for any sizable detector), and holds the first headLen bytes
// of its key: finding a key of up to headLen bytes reads its table entry
// and this one line, and only longer keys read the rest from the arena.
type slot struct {
	hash uint64
	// own is the decayed weight the key received since it took this slot: a
	// lower bound on its decayed count. count − own is the error.
	own        float64
	count      float64 // while queued
	pos        int32   // heap position, or -1 while queued
	flen       uint32  // length of the full key (saturating)
	prev, next int32   // queue links, -1 at the ends
	// head holds the stored key's first min(flen, MaxKeyLen, headLen)
	// bytes; the arena holds the rest of its first MaxKeyLen.
	head [headLen]byte
}

// headLen is how many bytes of its key a slot holds itself: what fills the
// slot to 64 bytes.
const headLen = 24

type heapEntry struct {
	count float64
	slot  int32
}

// Detector finds the keys whose message rate is at or above a threshold, in
// memory fixed by its configuration, whatever the number of distinct keys.
// It is a Space-Saving sketch over exponentially decayed (forward-decay)
// weights; see the package documentation for the error bounds.
//
// A Detector is not safe for concurrent use. It never allocates after
// NewDetector except in AppendHot and AppendAbove.
type Detector struct {
	cfg      DetectorConfig
	k        int32
	lambdaNs float64 // decay per nanosecond
	lambda   float64 // decay per second; rate = λ·decayed count
	hotCount float64 // (1−ε)·Threshold/λ: lower bound a hot key's count must reach
	errCount float64 // ε·Threshold/λ: largest error with full guarantees

	// Space-Saving needs the smallest count. Keys that have not been seen
	// again since they took their slot enter with count min+w, which never
	// decreases (the minimum only grows and so do forward-decay weights), so
	// they form a queue sorted by count at no cost; keys seen again move to
	// a min-heap. The smallest count is at the head of the queue or the root
	// of the heap, and a flood of fresh keys costs O(1) per message.
	slots        []slot
	heap         []heapEntry // 4-ary min-heap on count; heap[:hn] in use
	table        []uint64    // open addressing: uint32(hash) << 32 | slot+1; 0 is empty
	mask         uint64
	arena        []byte // tailLen bytes per slot: stored key bytes past headLen
	tailLen      int    // max(MaxKeyLen−headLen, 0)
	keyBuf       []byte // MaxKeyLen bytes: storedKey joins long keys here
	n, hn        int32  // slots in use; of which in the heap
	qhead, qtail int32  // queue ends, -1 when empty

	started            bool
	landmark           int64   // ns; counts are scaled by e^{λ(t−landmark)}
	last               int64   // latest time seen, ns
	scale              float64 // e^{λ(last−landmark)}
	invScale           float64
	base               int64 // ns; baseScale = e^{λ(base−landmark)} exactly
	baseScale, baseInv float64

	observations, evictions, renorms, degraded uint64
}

// NewDetector returns a detector sized by cfg, or an error wrapping
// ErrBadConfig.
func NewDetector(cfg DetectorConfig) (*Detector, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	tau := cfg.HalfLife.Seconds() / math.Ln2
	d := &Detector{
		cfg:      cfg,
		k:        int32(cfg.Capacity),
		lambda:   1 / tau,
		lambdaNs: 1 / (tau * 1e9),
		hotCount: (1 - cfg.Epsilon) * cfg.Threshold * tau,
		errCount: cfg.Epsilon * cfg.Threshold * tau,
	}
	tsize := 1
	for tsize < 2*cfg.Capacity {
		tsize <<= 1
	}
	d.slots = make([]slot, cfg.Capacity)
	// Three entries of padding put the four children of every node in one
	// 64-byte cache line (large allocations are page-aligned).
	d.heap = make([]heapEntry, cfg.Capacity+3)[3:]
	d.table = make([]uint64, tsize)
	d.mask = uint64(tsize - 1)
	d.tailLen = max(cfg.MaxKeyLen-headLen, 0)
	d.arena = make([]byte, cfg.Capacity*d.tailLen)
	d.keyBuf = make([]byte, cfg.MaxKeyLen)
	d.Reset()
	return d, nil
}

// Config returns the configuration with defaults filled in and Capacity
// derived.
func (d *Detector) Config() DetectorConfig { return d.cfg }

// Capacity returns the number of slots: the most keys tracked at once.
func (d *Detector) Capacity() int { return int(d.k) }

// GuaranteedTotalRate returns Capacity·Epsilon·Threshold: while the decayed
// total rate of all keys stays at or below it, every key at or above
// Threshold is reported.
func (d *Detector) GuaranteedTotalRate() float64 {
	return float64(d.k) * d.cfg.Epsilon * d.cfg.Threshold
}

// MemoryBytes returns the size of the detector, fixed at construction.
func (d *Detector) MemoryBytes() int {
	return int(unsafe.Sizeof(*d)) +
		len(d.slots)*int(unsafe.Sizeof(slot{})) +
		cap(d.heap)*int(unsafe.Sizeof(heapEntry{})) +
		len(d.table)*8 + len(d.arena) + len(d.keyBuf)
}

// Reset forgets every key and counter, keeping the memory.
func (d *Detector) Reset() {
	clear(d.slots)
	clear(d.heap)
	clear(d.table)
	d.n, d.hn = 0, 0
	d.qhead, d.qtail = -1, -1
	d.started = false
	d.landmark, d.last, d.base = 0, 0, 0
	d.scale, d.invScale, d.baseScale, d.baseInv = 1, 1, 1, 1
	d.observations, d.evictions, d.renorms, d.degraded = 0, 0, 0, 0
}

// Observe counts one message of key at now and returns the key's estimate
// including it. It does not allocate. Times earlier than the latest time
// seen count as the latest time seen. An empty key is counted like any other.
func (d *Detector) Observe(key []byte, now time.Time) Estimate {
	return d.observe(key, xxhash.Sum64(key), 1, now.UnixNano())
}

// ObserveN counts n messages of key at now, for callers that aggregate. n must
// be positive and at most 2^53; other values are ignored and the estimate is
// returned unchanged.
func (d *Detector) ObserveN(key []byte, n float64, now time.Time) Estimate {
	if !(n > 0 && n <= 1<<53) {
		return d.Estimate(key, now)
	}
	return d.observe(key, xxhash.Sum64(key), n, now.UnixNano())
}

// polyMax bounds the exponent step that advance computes with a cubic
// polynomial instead of math.Exp: for δ < 1e-4 the truncation error δ⁴/24
// is below 5e-18, well under one ulp.
const polyMax = 1e-4

// advance moves the detector's clock to t (never backwards). The scale
// e^{λ(t−landmark)} is math.Exp at a base time, recomputed when the clock
// has moved by polyMax/λ since, times a polynomial for the step from there;
// so steps of a few microseconds cost a few multiplications and rounding
// errors never accumulate. observe tries step first.
func (d *Detector) advance(t int64) {
	if !d.started {
		d.started = true
		d.landmark, d.last, d.base = t, t, t
		d.scale, d.invScale, d.baseScale, d.baseInv = 1, 1, 1, 1
		return
	}
	if t <= d.last {
		return
	}
	d.last = t
	// t > last ≥ base, so dt is positive unless t−base overflows int64.
	if dt := t - d.base; dt > 0 && float64(dt)*d.lambdaNs < polyMax {
		x := float64(dt) * d.lambdaNs
		d.scale = d.baseScale * (1 + x*(1+x*(0.5+x*(1.0/6))))
		d.invScale = d.baseInv * (1 - x*(1-x*(0.5-x*(1.0/6))))
		return
	}
	x := float64(uint64(t)-uint64(d.landmark)) * d.lambdaNs
	if x > renormAt {
		d.renormalize(t, x)
		return
	}
	d.base = t
	d.baseScale = math.Exp(x)
	d.baseInv = 1 / d.baseScale
	d.scale, d.invScale = d.baseScale, d.baseInv
}

// step is advance's common case, the clock moving forward by less than
// polyMax/λ from the base time, computed exactly as advance does; it
// reports whether it applied, and changes nothing if not. Unlike advance,
// it is small enough to inline into observe.
func (d *Detector) step(t int64) bool {
	dt := t - d.base
	x := float64(dt) * d.lambdaNs
	if !d.started || t <= d.last || dt <= 0 || x >= polyMax {
		return false
	}
	d.last = t
	d.scale = d.baseScale * (1 + x*(1+x*(0.5+x*(1.0/6))))
	d.invScale = d.baseInv * (1 - x*(1-x*(0.5-x*(1.0/6))))
	return true
}

// renormalize rescales every count to the time origin t. Counts decayed
// below the smallest float64 become zero, which keeps the heap order.
func (d *Detector) renormalize(t int64, x float64) {
	f := math.Exp(-x)
	for i := range d.heap[:d.hn] {
		d.heap[i].count *= f
	}
	for i := range d.slots[:d.n] {
		d.slots[i].own *= f
		d.slots[i].count *= f
	}
	d.landmark, d.base = t, t
	d.scale, d.invScale, d.baseScale, d.baseInv = 1, 1, 1, 1
	d.renorms++
}

func (d *Detector) observe(key []byte, h uint64, n float64, t int64) Estimate {
	if !d.step(t) {
		d.advance(t)
	}
	d.observations++
	if d.n == d.k && d.minAbove(d.errCount*d.scale) {
		d.degraded++
	}
	w := n * d.scale
	if s := d.find(h, key); s >= 0 {
		sl := &d.slots[s]
		sl.own += w
		own := sl.own
		var c float64
		if p := sl.pos; p >= 0 {
			d.heap[p].count += w
			c = d.heap[p].count
			if 4*p+1 < d.hn { // a leaf, as most often, stays put
				d.down(p)
			}
		} else {
			c = sl.count + w
			d.unqueue(s)
			d.push(s, c)
		}
		return d.estimate(c, own, d.scale, d.invScale)
	}
	var s int32
	c := w
	if d.n < d.k {
		s = d.n
		d.n++
	} else {
		// Evict the smallest count m; the new key inherits it as its error.
		if d.hn == 0 || d.qhead >= 0 && d.slots[d.qhead].count <= d.heap[0].count {
			s = d.qhead
			c += d.slots[s].count
			d.unqueue(s)
		} else {
			s = d.heap[0].slot
			c += d.heap[0].count
			d.popMin()
		}
		d.tableRemove(s)
		d.evictions++
	}
	if d.qtail < 0 || c >= d.slots[d.qtail].count {
		d.enqueue(s, c)
	} else {
		d.push(s, c) // out of order only with ObserveN's varying weights
	}
	sl := &d.slots[s]
	sl.hash = h
	sl.own = w
	sl.flen = uint32(min(len(key), math.MaxUint32))
	stored := key[:min(len(key), d.cfg.MaxKeyLen)]
	if n := copy(sl.head[:], stored); n < len(stored) {
		copy(d.arena[int(s)*d.tailLen:], stored[n:])
	}
	d.tableInsert(h, s)
	return d.estimate(c, w, d.scale, d.invScale)
}

// minCount returns the smallest count; d.n must be positive.
func (d *Detector) minCount() float64 {
	switch {
	case d.hn == 0:
		return d.slots[d.qhead].count
	case d.qhead < 0:
		return d.heap[0].count
	}
	return min(d.heap[0].count, d.slots[d.qhead].count)
}

// minAbove reports whether the smallest count exceeds x, as minCount() > x
// does, but without min's care for NaN and signed zeros (either count
// being NaN makes both false); d.n must be positive.
func (d *Detector) minAbove(x float64) bool {
	return (d.hn == 0 || d.heap[0].count > x) && (d.qhead < 0 || d.slots[d.qhead].count > x)
}

// countOf returns the count of slot s.
func (d *Detector) countOf(s int32) float64 {
	if p := d.slots[s].pos; p >= 0 {
		return d.heap[p].count
	}
	return d.slots[s].count
}

func (d *Detector) enqueue(s int32, c float64) {
	sl := &d.slots[s]
	sl.pos, sl.count, sl.prev, sl.next = -1, c, d.qtail, -1
	if d.qtail >= 0 {
		d.slots[d.qtail].next = s
	} else {
		d.qhead = s
	}
	d.qtail = s
}

func (d *Detector) unqueue(s int32) {
	sl := &d.slots[s]
	if sl.prev >= 0 {
		d.slots[sl.prev].next = sl.next
	} else {
		d.qhead = sl.next
	}
	if sl.next >= 0 {
		d.slots[sl.next].prev = sl.prev
	} else {
		d.qtail = sl.prev
	}
}

func (d *Detector) estimate(count, own, scale, invScale float64) Estimate {
	r := d.lambda * invScale
	return Estimate{
		Rate:       count * r,
		ErrorBound: (count - own) * r,
		Hot:        own >= d.hotCount*scale,
		Tracked:    true,
	}
}

// Estimate returns the estimate of key at now without counting a message.
func (d *Detector) Estimate(key []byte, now time.Time) Estimate {
	return d.estimateHash(key, xxhash.Sum64(key), now.UnixNano())
}

func (d *Detector) estimateHash(key []byte, h uint64, t int64) Estimate {
	scale, inv := d.scaleAt(t)
	if s := d.find(h, key); s >= 0 {
		return d.estimate(d.countOf(s), d.slots[s].own, scale, inv)
	}
	if d.n < d.k {
		return Estimate{} // no key was ever evicted: an untracked key was never seen
	}
	m := d.minCount() * d.lambda * inv
	return Estimate{Rate: m, ErrorBound: m}
}

// scaleAt returns e^{λ(t−landmark)} and its inverse without moving the clock.
func (d *Detector) scaleAt(t int64) (scale, inv float64) {
	if !d.started || t <= d.last {
		return d.scale, d.invScale
	}
	scale = math.Exp(float64(uint64(t)-uint64(d.landmark)) * d.lambdaNs)
	return scale, 1 / scale
}

// AppendHot appends the keys that are hot at now to dst, highest rate first,
// and returns the extended slice. It allocates the key strings.
func (d *Detector) AppendHot(dst []HotKey, now time.Time) []HotKey {
	scale, inv := d.scaleAt(now.UnixNano())
	start := len(dst)
	for s := range d.slots[:d.n] {
		sl := &d.slots[s]
		if sl.own < d.hotCount*scale {
			continue
		}
		key, trunc := d.storedKey(int32(s))
		dst = append(dst, HotKey{
			Key:       string(key),
			Truncated: trunc,
			Estimate:  d.estimate(d.countOf(int32(s)), sl.own, scale, inv),
		})
	}
	sortHot(dst[start:])
	return dst
}

// AppendAbove appends to dst every tracked key whose estimated Rate (the
// upper bound) is at least minRate at now, highest rate first, and
// returns the extended slice. It allocates the key strings. A NaN minRate
// selects nothing; a minRate ≤ 0 selects every tracked key.
//
// It is what a producer reports for cluster-wide detection (see
// Aggregate): every producer reports its keys at or above a common
// minRate, and the control plane sums the reports. The upper bound is
// reported, not the guaranteed lower bound, so that the sum never misses
// a key: if a key's true rate summed over the producers is at least the
// global threshold, the sum of its reported rates is too, provided every
// producer that sends it holds its share at or above minRate and tracks
// it (a share below minRate, or an untracked one, is left out, so set
// minRate to at most threshold/producers for keys spread evenly). The
// price is overestimation: the sum exceeds the true summed rate by at most
// the reported keys' ErrorBounds, each at most the producer's
// Stats().ErrorBound.
//
// Keys longer than MaxKeyLen come back with Truncated set and only their
// first MaxKeyLen bytes: they cannot be reported by name, so callers skip
// them (and should count them), or raise MaxKeyLen.
func (d *Detector) AppendAbove(dst []HotKey, minRate float64, now time.Time) []HotKey {
	scale, inv := d.scaleAt(now.UnixNano())
	start := len(dst)
	for s := range d.slots[:d.n] {
		est := d.estimate(d.countOf(int32(s)), d.slots[s].own, scale, inv)
		if !(est.Rate >= minRate) {
			continue
		}
		key, trunc := d.storedKey(int32(s))
		dst = append(dst, HotKey{Key: string(key), Truncated: trunc, Estimate: est})
	}
	sortHot(dst[start:])
	return dst
}

// sortHot orders hs by rate, highest first, then by key.
func sortHot(hs []HotKey) {
	slices.SortFunc(hs, func(a, b HotKey) int {
		switch {
		case a.Rate > b.Rate:
			return -1
		case a.Rate < b.Rate:
			return 1
		}
		return bytes.Compare([]byte(a.Key), []byte(b.Key))
	})
}

// Stats returns a snapshot of the detector's counters at now.
func (d *Detector) Stats(now time.Time) DetectorStats {
	_, inv := d.scaleAt(now.UnixNano())
	st := DetectorStats{
		Capacity:         int(d.k),
		Tracked:          int(d.n),
		Observations:     d.observations,
		Evictions:        d.evictions,
		Renormalizations: d.renorms,
		Degraded:         d.degraded,
		MemoryBytes:      d.MemoryBytes(),
	}
	if d.n == d.k {
		st.ErrorBound = d.minCount() * d.lambda * inv
	}
	st.Guaranteed = st.ErrorBound <= d.cfg.Epsilon*d.cfg.Threshold
	return st
}

// storedKey returns the stored bytes of slot s's key: the whole key, or its
// first MaxKeyLen bytes when truncated. A key longer than headLen is joined
// in d.keyBuf, so the result is valid until the next call.
func (d *Detector) storedKey(s int32) (key []byte, truncated bool) {
	sl := &d.slots[s]
	l := min(int(sl.flen), d.cfg.MaxKeyLen)
	if l <= headLen {
		return sl.head[:l], int(sl.flen) > l
	}
	n := copy(d.keyBuf, sl.head[:])
	off := int(s) * d.tailLen
	copy(d.keyBuf[n:l], d.arena[off:off+l-n])
	return d.keyBuf[:l], int(sl.flen) > l
}

// find returns the slot of key, or -1.
func (d *Detector) find(h uint64, key []byte) int32 {
	tag := h & math.MaxUint32
	for i := h & d.mask; ; i = (i + 1) & d.mask {
		e := d.table[i]
		if e == 0 {
			return -1
		}
		if e>>32 != tag {
			continue
		}
		s := int32(uint32(e)) - 1
		sl := &d.slots[s]
		if sl.hash != h || int(sl.flen) != min(len(key), math.MaxUint32) {
			continue
		}
		// The stored bytes are key's first min(len(key), MaxKeyLen): its
		// first headLen in the slot, the rest in the arena.
		stored := key[:min(len(key), d.cfg.MaxKeyLen)]
		n := min(len(stored), headLen)
		if string(sl.head[:n]) != string(stored[:n]) {
			continue
		}
		if n == len(stored) {
			return s
		}
		off := int(s) * d.tailLen
		if string(d.arena[off:off+len(stored)-n]) == string(stored[n:]) {
			return s
		}
	}
}

// tableInsert adds slot s, whose key's hash is h, to the table. An entry
// keeps the hash's low 32 bits, from which the entry's home index follows
// (the table has at most 2^23 entries) and which tell most keys apart
// without reading their slots.
func (d *Detector) tableInsert(h uint64, s int32) {
	i := h & d.mask
	for d.table[i] != 0 {
		i = (i + 1) & d.mask
	}
	d.table[i] = h<<32 | uint64(s+1)
}

// tableRemove deletes slot s from the table by backward-shift deletion, so
// that probe sequences stay unbroken without tombstones.
func (d *Detector) tableRemove(s int32) {
	want := uint64(s + 1)
	i := d.slots[s].hash & d.mask
	for uint64(uint32(d.table[i])) != want {
		i = (i + 1) & d.mask
	}
	for j := i; ; {
		j = (j + 1) & d.mask
		e := d.table[j]
		if e == 0 {
			d.table[i] = 0
			return
		}
		home := e >> 32 & d.mask
		// e may move back to i unless its home lies cyclically in (i, j].
		if (j-home)&d.mask >= (j-i)&d.mask {
			d.table[i] = e
			i = j
		}
	}
}

// The heap is 4-ary: node i has children 4i+1..4i+4, so a key sinks
// through half as many levels as in a binary heap, and the children
// compared at one level are adjacent in memory.

// push adds slot s with count c to the heap.
func (d *Detector) push(s int32, c float64) {
	i := d.hn
	d.hn++
	d.heap[i] = heapEntry{count: c, slot: s}
	d.up(i)
}

// popMin removes the root of the heap. The hole sinks to a leaf along the
// smaller children, then the last entry rises from there: the last entry
// is usually large, so this saves the comparisons against it on the way
// down.
func (d *Detector) popMin() {
	d.hn--
	n := d.hn
	if n == 0 {
		return
	}
	h := d.heap[:n+1]
	x := h[n]
	i := int32(0)
	for {
		c := 4*i + 1
		if c >= n {
			break
		}
		c = minChild(h, c, n)
		h[i] = h[c]
		d.slots[h[i].slot].pos = i
		i = c
	}
	h[i] = x
	d.up(i)
}

// minChild returns the first of the children h[c], h[c+1], ... (at most
// four, fewer at the end of the heap of n entries) with the smallest count.
func minChild(h []heapEntry, c, n int32) int32 {
	if c+3 < n {
		return minOf4(h, c)
	}
	for j := c + 1; j < n; j++ {
		if h[j].count < h[c].count {
			c = j
		}
	}
	return c
}

// minOf4 returns the first of the four entries from h[c] with the smallest
// count, as a scan would, without branching on the data-dependent order (a
// mispredicted branch costs more than the comparisons). Counts are never
// negative or NaN, so their bit patterns order as they do; comparing those
// as integers lets the compiler select with conditional moves, which it
// does not do for float comparisons.
func minOf4(h []heapEntry, c int32) int32 {
	q := h[c : c+4]
	k0, k1 := math.Float64bits(q[0].count), math.Float64bits(q[1].count)
	k2, k3 := math.Float64bits(q[2].count), math.Float64bits(q[3].count)
	a := c
	if k1 < k0 {
		a = c + 1
	}
	b := c + 2
	if k3 < k2 {
		b = c + 3
	}
	if min(k2, k3) < min(k0, k1) {
		a = b
	}
	return a
}

func (d *Detector) up(i int32) {
	h := d.heap
	x := h[i]
	for i > 0 {
		p := (i - 1) / 4
		if h[p].count <= x.count {
			break
		}
		h[i] = h[p]
		d.slots[h[i].slot].pos = i
		i = p
	}
	h[i] = x
	d.slots[x.slot].pos = i
}

func (d *Detector) down(i int32) {
	h := d.heap[:d.hn]
	n := d.hn
	x := h[i]
	for {
		c := 4*i + 1
		if c >= n {
			break
		}
		c = minChild(h, c, n)
		if h[c].count >= x.count {
			break
		}
		h[i] = h[c]
		d.slots[h[i].slot].pos = i
		i = c
	}
	h[i] = x
	d.slots[x.slot].pos = i
}
