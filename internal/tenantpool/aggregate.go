package tenantpool

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"time"
)

// Report is one batch of request counts from one reporter (a client or a
// server of the pool).
type Report struct {
	// Reporter names the reporter; required.
	Reporter string
	// Seq numbers the reporter's reports from 1 up. A report whose Seq is
	// not above the last one counted from the same reporter is a retry or
	// a replay and is not counted. A reporter sends its reports one at a
	// time: one that overtakes an earlier one makes the earlier one a
	// replay.
	Seq uint64
	// Time is when the reporter sent the report, by its clock; required.
	// A report older than the window is not counted (so a replay that
	// arrives after its reporter was forgotten is not counted either).
	Time time.Time
	// Counts are the requests per tenant since the reporter's previous
	// report. A tenant may appear more than once; its counts add up.
	Counts []Count
	// Period is the span the counts were counted over, by the reporter's
	// clock: the time since its previous report. Add spreads the counts
	// evenly over that much time ending at their arrival, so that a late
	// report does not read as a burst, nor two reports landing in one
	// bucket as twice the rate. The part of the period before the window
	// (or before the aggregator started) is not counted. Zero: every
	// count goes to the bucket of its arrival.
	Period time.Duration
}

// Count is the number of requests of one tenant.
type Count struct {
	Tenant string
	N      int64
}

// Outcome says what Add did with a report it did not refuse.
type Outcome int

const (
	// Counted: the report's counts were added.
	Counted Outcome = iota
	// Replayed: the report's Seq is not above the last counted from its
	// reporter; nothing was added.
	Replayed
	// Stale: the report is older than the window; nothing was added.
	Stale
)

func (o Outcome) String() string {
	switch o {
	case Counted:
		return "counted"
	case Replayed:
		return "replayed"
	case Stale:
		return "stale"
	}
	return "outcome(?)"
}

// Limits of an Aggregator, and their defaults.
const (
	// DefaultMaxCounts is the default limit on Counts in one report: a
	// reporter of more tenants splits its counts over several reports.
	DefaultMaxCounts    = 10_000
	DefaultWindow       = time.Minute
	DefaultBuckets      = 12
	DefaultMaxTenants   = 1_000_000
	DefaultMaxReporters = 10_000
)

// ErrFull is returned by Add for a report that would make the aggregator
// track more tenants or reporters than its limits allow; nothing of the
// report was added.
var ErrFull = errors.New("tenantpool: aggregator full")

// AggregatorConfig sizes an Aggregator. Zero fields take the defaults.
type AggregatorConfig struct {
	// Window is the span the rate is measured over. Default DefaultWindow.
	Window time.Duration
	// Buckets divides the window: counts expire one bucket (Window/Buckets)
	// at a time. Default DefaultBuckets.
	Buckets int
	// MaxCounts bounds len(Report.Counts). Default DefaultMaxCounts.
	MaxCounts int
	// MaxTenants bounds the tenants tracked at once. Default DefaultMaxTenants.
	MaxTenants int
	// MaxReporters bounds the reporters tracked at once. Default DefaultMaxReporters.
	MaxReporters int
}

// Aggregator turns reports into a rate per tenant over a sliding window.
// It is pure (time is an argument) but not a value: the leader's loop owns
// one per pool from one goroutine; it is not safe for concurrent use. It is
// not persisted: a new leader starts an empty one, and Rates divides by the
// time it has measured (at least one bucket) until a window has passed.
// Counts are placed by the time they arrive (now), not by Report.Time,
// which only tells stale reports apart, so reporters' clocks need only be
// within a window of the leader's. A report that says the Period its
// counts cover has them spread over that much time ending at its
// arrival; the rate then leaves out the last buckets such a report may
// not have covered yet (the longest period heard, in buckets, at most
// half the window). Without periods, one report more or less in a window
// moves a rate by a report's worth (1/8 at a report every Window/8);
// with them, the rate is as smooth as the load.
//
// Memory is bounded: per tenant, one count per bucket and for the current
// one, a running sum and a time (Buckets+3 words and the tenant ID), at most MaxTenants tenants; per
// reporter its last Seq, period and when it was last heard, at most MaxReporters.
// A tenant with no report for a window, and a reporter not heard for two
// windows, are forgotten. A reporter that stops reporting therefore stops
// counting once its last counts leave the window.
type Aggregator struct {
	cfg    AggregatorConfig
	width  int64 // bucket width in ns
	cur    int64 // current bucket number (unix ns / width); 0 before the first call
	first  int64 // bucket number of the first call
	ids    map[string]int32
	names  []string  // tenant ID by index; "" if the slot is free
	counts [][]int64 // counts[b][t]: bucket b mod Buckets+1, tenant t
	sum    []int64   // per tenant, the sum over the complete buckets of the window
	last   []int64   // bucket number of the last report of each tenant
	free   []int32
	reps   map[string]*reporter
	idx    []int32 // scratch: resolved tenant index per count; -1 new
	shares []share // scratch: the current report's spread
	// lagAt is the bucket lagged was computed at, -1 after a report: lag
	// looks at every reporter, and Rate is asked once per tenant.
	lagAt, lagged int64
}

type reporter struct {
	seq    uint64
	seen   int64 // unix ns
	period int64 // ns: the Period of its last report
}

// NewAggregator returns an empty aggregator, or a *FieldError for a bad
// config.
func NewAggregator(cfg AggregatorConfig) (*Aggregator, error) {
	def := func(v *int, d int, name string) error {
		if *v < 0 {
			return invalidf(name, "is %d; want >= 0 (0 = default %d)", *v, d)
		}
		if *v == 0 {
			*v = d
		}
		return nil
	}
	if cfg.Window < 0 {
		return nil, invalidf("Window", "is %v; want > 0 (0 = default %v)", cfg.Window, DefaultWindow)
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	for _, err := range []error{
		def(&cfg.Buckets, DefaultBuckets, "Buckets"),
		def(&cfg.MaxCounts, DefaultMaxCounts, "MaxCounts"),
		def(&cfg.MaxTenants, DefaultMaxTenants, "MaxTenants"),
		def(&cfg.MaxReporters, DefaultMaxReporters, "MaxReporters"),
	} {
		if err != nil {
			return nil, err
		}
	}
	if cfg.Window/time.Duration(cfg.Buckets) < time.Millisecond {
		return nil, invalidf("Buckets", "is %d; a bucket of Window/Buckets = %v is under 1ms", cfg.Buckets, cfg.Window/time.Duration(cfg.Buckets))
	}
	a := &Aggregator{
		cfg:    cfg,
		lagAt:  -1,
		width:  int64(cfg.Window) / int64(cfg.Buckets),
		ids:    make(map[string]int32),
		counts: make([][]int64, cfg.Buckets+1),
		reps:   make(map[string]*reporter),
	}
	return a, nil
}

// Add adds a report's counts that arrived at time now (the leader's
// clock). now may be behind the aggregator's latest time (a report that
// waited in a queue while the leader was busy): its counts go where they
// arrived, within the window, not where they were taken in. It returns
// the outcome, or an error for a refused report, of which nothing was
// added: a *FieldError naming the field for an empty Reporter, a zero Seq
// or Time, more than MaxCounts counts, an empty tenant ID or a negative
// count; ErrFull when the limits on tenants or reporters would be passed.
func (a *Aggregator) Add(r Report, now time.Time) (Outcome, error) {
	switch {
	case r.Reporter == "":
		return 0, invalidf("Reporter", "is empty")
	case r.Seq == 0:
		return 0, invalidf("Seq", "is 0; reporters number their reports from 1")
	case r.Time.IsZero():
		return 0, invalidf("Time", "is zero")
	case len(r.Counts) > a.cfg.MaxCounts:
		return 0, invalidf("Counts", "has %d entries; the limit is %d (split the report)", len(r.Counts), a.cfg.MaxCounts)
	}
	a.advance(now)
	n := a.nanos(now)
	rep := a.reps[r.Reporter]
	if rep != nil && r.Seq <= rep.seq {
		return Replayed, validCounts(r.Counts)
	}
	if r.Time.UnixNano() < n-int64(a.cfg.Window) {
		return Stale, validCounts(r.Counts)
	}
	if rep == nil && len(a.reps) >= a.cfg.MaxReporters {
		return 0, ErrFull
	}
	// Validate and resolve every count first, so that a refused report
	// adds nothing.
	idx := a.idx[:0]
	fresh := 0
	for i, c := range r.Counts {
		if c.Tenant == "" {
			return 0, invalidf("Counts["+strconv.Itoa(i)+"].Tenant", "is empty")
		}
		if c.N < 0 {
			return 0, invalidf("Counts["+strconv.Itoa(i)+"].N", "is %d; want >= 0", c.N)
		}
		t, ok := a.ids[c.Tenant]
		if !ok {
			t = -1
			fresh++ // an upper bound: a new tenant may appear twice
		}
		idx = append(idx, t)
	}
	a.idx = idx
	if fresh > 0 && len(a.ids)+fresh > a.cfg.MaxTenants {
		if len(a.ids)+a.countNew(r.Counts, idx) > a.cfg.MaxTenants {
			return 0, ErrFull
		}
	}
	spread := a.spread(n, r.Period)
	for i, c := range r.Counts {
		t := idx[i]
		if t < 0 {
			if t2, ok := a.ids[c.Tenant]; ok { // second sighting in this report
				t = t2
			} else {
				t = a.newTenant(c.Tenant)
			}
		}
		a.place(t, c.N, spread)
		a.last[t] = a.cur
	}
	if rep == nil {
		rep = &reporter{}
		a.reps[r.Reporter] = rep
	}
	rep.seq, rep.seen, rep.period = r.Seq, n, min(int64(r.Period), int64(a.cfg.Window))
	a.lagAt = -1
	return Counted, nil
}

// share is the part of a report's period up to the end of bucket x,
// cumulative from the period's start.
type share struct {
	x   int64
	cum float64 // in [0, 1]
}

// spread returns how a report that arrived at n (not after the current
// bucket) and covers period divides over the buckets. Its first entry
// (x = -1) is the share that falls before the window, or before the
// first call: those counts are not counted. Without a period, everything
// goes to the bucket of n.
func (a *Aggregator) spread(n int64, period time.Duration) []share {
	last := n / a.width
	a.shares = append(a.shares[:0], share{x: -1})
	if period <= 0 {
		return append(a.shares, share{x: last, cum: 1})
	}
	p := int64(period)
	start := n - p
	first := max(a.oldest(), start/a.width)
	a.shares[0].cum = float64(max(first*a.width-start, 0)) / float64(p)
	for x := first; x <= last; x++ {
		end := min((x+1)*a.width, n)
		a.shares = append(a.shares, share{x: x, cum: float64(end-start) / float64(p)})
	}
	return a.shares
}

// place adds n counts of tenant t as spread says: bucket x gets
// ⌊n·cum(x)⌋ − ⌊n·cum(x−1)⌋, so that the parts add up to n over the whole
// period. A complete bucket's part joins the window's sum at once.
func (a *Aggregator) place(t int32, n int64, spread []share) {
	// A hair above the product counts as it: bucket edges are whole
	// nanoseconds (a 2s window's 12 buckets are 166,666,666 ns), so a
	// period of exactly 6 buckets reads 0.999999996 of itself.
	floor := func(c float64) int64 { return min(int64(math.Floor(float64(n)*c+1e-6)), n) }
	prev := floor(spread[0].cum)
	for _, s := range spread[1:] {
		upto := n
		if s.cum < 1 {
			upto = floor(s.cum)
		}
		part := upto - prev
		prev = upto
		if part <= 0 {
			continue
		}
		a.col(s.x)[t] += part
		if s.x < a.cur {
			a.sum[t] += part
		}
	}
}

// validCounts checks counts without adding them, so that a replay of a bad
// report is refused like the report was.
func validCounts(cs []Count) error {
	for i, c := range cs {
		if c.Tenant == "" {
			return invalidf("Counts["+strconv.Itoa(i)+"].Tenant", "is empty")
		}
		if c.N < 0 {
			return invalidf("Counts["+strconv.Itoa(i)+"].N", "is %d; want >= 0", c.N)
		}
	}
	return nil
}

func (a *Aggregator) countNew(cs []Count, idx []int32) int {
	seen := make(map[string]bool)
	for i, c := range cs {
		if idx[i] < 0 {
			seen[c.Tenant] = true
		}
	}
	return len(seen)
}

func (a *Aggregator) newTenant(id string) int32 {
	id = strings.Clone(id) // do not pin the caller's buffer
	var t int32
	if n := len(a.free); n > 0 {
		t = a.free[n-1]
		a.free = a.free[:n-1]
		a.names[t] = id
	} else {
		t = int32(len(a.names))
		a.names = append(a.names, id)
		a.sum = append(a.sum, 0)
		a.last = append(a.last, 0)
		for b := range a.counts {
			a.counts[b] = append(a.counts[b], 0)
		}
	}
	a.ids[id] = t
	return t
}

func (a *Aggregator) nanos(now time.Time) int64 {
	n := now.UnixNano()
	if lo := a.oldest() * a.width; a.cur != 0 && n < lo {
		n = lo // not before the window (nor before the first call)
	}
	return n
}

// oldest returns the number of the oldest bucket in the window.
func (a *Aggregator) oldest() int64 { return max(a.cur-int64(a.cfg.Buckets), a.first) }

// Start begins the measurement at now, before any report: rates then
// divide by the time measured since now (not since the first report),
// so an aggregator started when its leader's term began reads a tenant
// that reports late in the window at its true rate.
func (a *Aggregator) Start(now time.Time) { a.advance(now) }

// advance moves the window to now: completes the current bucket, expires
// the buckets that left the window, forgets idle tenants and reporters.
func (a *Aggregator) advance(now time.Time) {
	n := now.UnixNano()
	b := n / a.width
	if a.cur == 0 {
		a.cur, a.first = b, b
		return
	}
	if b <= a.cur {
		return
	}
	nb := int64(a.cfg.Buckets)
	for t, c := range a.col(a.cur) {
		a.sum[t] += c
	}
	for x := a.cur - nb; x <= min(a.cur, b-nb-1); x++ {
		col := a.col(x)
		for t, c := range col {
			a.sum[t] -= c
		}
		clear(col)
	}
	a.cur = b
	for t, id := range a.names {
		if id != "" && a.last[t] < b-nb {
			delete(a.ids, id)
			a.names[t] = ""
			a.free = append(a.free, int32(t))
		}
	}
	for id, r := range a.reps {
		if r.seen < n-2*int64(a.cfg.Window) {
			delete(a.reps, id)
		}
	}
}

// col returns the counts of bucket x.
func (a *Aggregator) col(x int64) []int64 {
	m := int64(len(a.counts))
	return a.counts[((x%m)+m)%m]
}

// lag returns how many of the window's last complete buckets to leave
// out of the rate: those a reporter that spreads its counts over a
// period may not have covered yet (its next report fills them). It is
// the longest period among the reporters heard within the window, in
// buckets rounded up, at most half the window; 0 when no reporter gives
// a period, so arrival-placed counts are read as they always were.
func (a *Aggregator) lag() int64 {
	if a.lagAt == a.cur {
		return a.lagged
	}
	var p int64
	n := a.cur * a.width
	for _, r := range a.reps {
		if r.seen >= n-int64(a.cfg.Window) {
			p = max(p, r.period)
		}
	}
	a.lagAt, a.lagged = a.cur, min((p+a.width-1)/a.width, int64(a.cfg.Buckets)/2)
	return a.lagged
}

// rate returns tenant t's rate: the sum of the complete buckets of the
// window (or of those since the first call), less the last lag of them,
// over their span; only the current bucket if none is complete yet.
func (a *Aggregator) rate(t int32, lag int64) float64 {
	k := min(int64(a.cfg.Buckets), a.cur-a.first)
	if k == 0 {
		return float64(a.col(a.cur)[t]) / (a.cfg.Window.Seconds() / float64(a.cfg.Buckets))
	}
	sum := a.sum[t]
	if lag > 0 && lag < k {
		for x := a.cur - lag; x < a.cur; x++ {
			sum -= a.col(x)[t]
		}
		k -= lag
	}
	// The nominal span (k buckets of Window/Buckets), not k*width: width
	// is truncated to whole nanoseconds, and dividing by it would read a
	// steady 50/s as 50.00000002/s.
	return float64(sum) / (float64(k) * a.cfg.Window.Seconds() / float64(a.cfg.Buckets))
}

// Rates returns the rate (counts per second) of every tenant reported
// within the window, including tenants reported at 0. The rate is the
// counts of the window's complete buckets over their span, so it lags by
// up to one bucket (Window/Buckets), and by the longest report period
// more when reporters give periods.
func (a *Aggregator) Rates(now time.Time) map[string]float64 {
	a.advance(now)
	out := make(map[string]float64, len(a.ids))
	lag := a.lag()
	for t, id := range a.names {
		if id != "" {
			out[id] = a.rate(int32(t), lag)
		}
	}
	return out
}

// Rate returns one tenant's rate, and whether it was reported within the
// window.
func (a *Aggregator) Rate(tenant string, now time.Time) (float64, bool) {
	a.advance(now)
	t, ok := a.ids[tenant]
	if !ok {
		return 0, false
	}
	return a.rate(t, a.lag()), true
}

// Len returns the number of tenants and reporters tracked.
func (a *Aggregator) Len() (tenants, reporters int) { return len(a.ids), len(a.reps) }
