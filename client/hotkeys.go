package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/clock"
	"github.com/keyshard/keyshard/hotkey"
)

// Limits of a hot-key report, as the server enforces them.
const (
	// MaxReportKeys is the most keys one report carries; beyond it,
	// HotKeys keeps the keys with the highest rates.
	MaxReportKeys = 1024
	// MaxReportKeyLen is the longest key a report may carry, in bytes.
	// Longer keys are left out of reports (HotKeysStats.DroppedKeys).
	MaxReportKeyLen = 512
)

// DefaultHotKeysInterval is the default of HotKeysConfig.Interval.
const DefaultHotKeysInterval = time.Second

// reportTimeout bounds one ReportHotKeys call (or Interval, if longer): a
// call that hangs is abandoned and counted as a failure.
const reportTimeout = 10 * time.Second

type hotKeysOptions struct {
	clock clock.Clock
	log   *slog.Logger
}

// HotKeysConfig configures NewHotKeys.
type HotKeysConfig struct {
	// Pool is the hot-key pool the producer belongs to, 1-128 characters
	// of [A-Za-z0-9._:@-]. An operator creates it (`keyshard hotkeys pool
	// put`, or Admin.PutHotKeyPool). Required.
	Pool string
	// Producer names this producer in the pool, 1-128 characters of
	// [A-Za-z0-9._:@-]. It must be unique among the pool's producers (two
	// producers of one name replace each other's reports, so their keys
	// are undercounted) and should be stable across restarts (host name
	// and role, say), so that a restarted producer replaces its own
	// report. Required.
	Producer string
	// Interval is the time between two reports. Default
	// DefaultHotKeysInterval.
	Interval time.Duration
	// Report returns the producer's keys whose local rate, in messages per
	// second, is at least minRate at now: the pool's report_threshold,
	// which the server sends back with every report. The threshold is not
	// known before a report has been answered: the first report of Run
	// calls Report with minRate 0 (at most MaxReportKeys keys, the
	// highest, are sent), and until an answer brings the threshold the
	// next ones are sent empty without calling Report, so that a producer
	// that cannot reach the control plane does not scan its keys in vain.
	// Report upper bounds of the rates (see hotkey.Detector.AppendAbove).
	// Keys that are empty, longer than MaxReportKeyLen or whose rate is
	// negative or not finite are left out, as are keys below minRate.
	// Required. Called from Run's goroutine, once per report; it must not
	// block.
	Report func(now time.Time, minRate float64) []hotkey.KeyRate
	// OnSet, if set, is called with every overflow set newer than the one
	// the HotKeys has (the first one included), in version order, each
	// with a copy of its own. Calls are serialized, made from a goroutine
	// of Run, and must not block. An error never produces a call: the
	// last set stays in force.
	OnSet func(hotkey.OverflowSet)
	// OnReport, if set, is called after every report with its outcome:
	// nil if the server accepted it, or the error, which says what to do
	// (the one logged at Warn). Calls are made from Run's goroutine, in
	// order, before it waits for the next report, and must not block.
	// Stats counts the same outcomes; OnReport is for acting on each, a
	// health check say.
	OnReport func(err error)
}

// HotKeysStats is a snapshot of a HotKeys' counters.
type HotKeysStats struct {
	// Reports counts the reports the server accepted; ReportFailures
	// those that failed (unreachable server, unknown pool, refused...).
	Reports, ReportFailures uint64
	// WatchFailures counts the failed watches and long polls of the
	// overflow set.
	WatchFailures uint64
	// DroppedKeys counts keys left out of reports: invalid ones, and those
	// beyond MaxReportKeys.
	DroppedKeys uint64
	// Version is the version of the overflow set held (0: none yet), and
	// Keys its number of keys.
	Version uint64
	Keys    int
	// ReportThreshold is the pool's report_threshold as of the latest
	// accepted report (0 before the first).
	ReportThreshold float64
	// LastContact is when the server last answered a call (a report, a
	// set on the watch, a long poll); zero if it never has.
	LastContact time.Time
}

// HotKeys is a producer's part in cluster-wide hot-key detection: it
// reports the producer's heavy hitters to the control plane every
// Interval (HotKeyService.ReportHotKeys), and follows the pool's
// cluster-wide overflow set (WatchOverflowSet, falling back to
// GetOverflowSet long polls, like a Router follows its map), handing each
// newer set to OnSet. A set reaches the producer as soon as the server
// has it.
//
// It fails open: while the control plane is unreachable, the pool does
// not exist or the token is refused, it keeps the last set it has (it
// never clears it because of an error), logs a warning that says what to
// do, retries with capped exponential backoff, and counts the failures
// (Stats). The set lives in the control plane, so a producer that
// restarts gets the current set with its first successful call.
//
// Create it with NewHotKeys, which does no IO; run it with Run, which
// owns its goroutines and blocks; stop it with Close (or by ending Run's
// ctx). Its methods are safe for concurrent use.
type HotKeys struct {
	c     *Client
	cfg   HotKeysConfig
	clock clock.Clock
	log   *slog.Logger
	life  *lifecycle

	mu     sync.Mutex
	set    hotkey.OverflowSet
	stats  HotKeysStats
	probed bool // Report was called without a threshold (see HotKeysConfig.Report)
}

// NewHotKeys returns a HotKeys for cfg. It does no IO and starts nothing:
// call Run. It returns an *ArgError (wrapping ErrInvalid) for a nil
// Client or a bad config, naming the field.
func NewHotKeys(c *Client, cfg HotKeysConfig, opts ...HotKeysOption) (*HotKeys, error) {
	const fn = "NewHotKeys"
	if c == nil {
		return nil, argError(fn, "client", "is nil; create one with Dial")
	}
	if err := validName(fn, "HotKeysConfig.Pool", cfg.Pool); err != nil {
		return nil, err
	}
	if err := validName(fn, "HotKeysConfig.Producer", cfg.Producer); err != nil {
		return nil, err
	}
	switch {
	case cfg.Report == nil:
		return nil, argError(fn, "HotKeysConfig.Report", "is nil")
	case cfg.Interval < 0:
		return nil, argError(fn, "HotKeysConfig.Interval", "%v is negative (0 means the default, %v)", cfg.Interval, DefaultHotKeysInterval)
	case cfg.Interval == 0:
		cfg.Interval = DefaultHotKeysInterval
	}
	o := hotKeysOptions{clock: c.opts.clock, log: c.opts.log}
	for _, opt := range opts {
		if opt != nil {
			opt.applyHotKeys(&o)
		}
	}
	return &HotKeys{c: c, cfg: cfg, clock: o.clock, log: o.log.With("pool", cfg.Pool, "producer", cfg.Producer), life: newLifecycle("HotKeys")}, nil
}

// Run reports and follows the overflow set until ctx ends (returning
// ctx.Err()), Close (returning nil) or the Client's Close (returning
// ErrClosed). Server errors never end it. It reports once at once, then
// every Interval. Run may be called once (again: an error wrapping
// ErrInvalid; after Close: ErrClosed); it returns after every goroutine
// it started has exited.
func (h *HotKeys) Run(ctx context.Context) error {
	parent := ctx
	ctx, end, err := h.life.begin(ctx, h.c)
	if err != nil {
		return err
	}
	defer end()
	var wg sync.WaitGroup
	wg.Go(func() { h.follow(ctx) }) // exits when ctx ends
	h.reportLoop(ctx)               // returns when ctx ends
	wg.Wait()
	return h.life.result(parent, h.c, nil)
}

// Close stops Run, if it runs, and waits until Run returned and every
// goroutine it started exited; a report in flight is abandoned. Set and
// Stats keep answering with the last values. Close is idempotent, may be
// called without Run (which then returns ErrClosed), and returns nil.
func (h *HotKeys) Close() error {
	if h.life.close() {
		h.life.stop()
	}
	return nil
}

// Set returns the overflow set held: the newest the server sent, kept
// through errors (version 0 and no keys before the first).
func (h *HotKeys) Set() hotkey.OverflowSet {
	h.mu.Lock()
	defer h.mu.Unlock()
	return cloneSet(h.set)
}

// Stats returns a snapshot of the counters.
func (h *HotKeys) Stats() HotKeysStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stats
}

func cloneSet(s hotkey.OverflowSet) hotkey.OverflowSet {
	s.Entries = slices.Clone(s.Entries)
	return s
}

func (h *HotKeys) version() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.set.Version
}

// contact records a successful answer of the server.
func (h *HotKeys) contact() {
	now := h.clock.Now()
	h.mu.Lock()
	h.stats.LastContact = now
	h.mu.Unlock()
}

// reportLoop reports every Interval, backing off after failures, until
// ctx ends.
func (h *HotKeys) reportLoop(ctx context.Context) {
	var b backoff
	for {
		start := h.clock.Now()
		err := h.report(ctx, start)
		if ctx.Err() != nil {
			return
		}
		wait := h.cfg.Interval
		if err != nil {
			wait = max(wait, b.next())
		} else {
			b.reset()
		}
		if h.cfg.OnReport != nil {
			h.cfg.OnReport(err)
		}
		if d := wait - h.clock.Since(start); d > 0 && !clock.Sleep(ctx, h.clock, d) {
			return
		}
	}
}

// report makes one report and returns its error, explained.
func (h *HotKeys) report(ctx context.Context, now time.Time) error {
	h.mu.Lock()
	minRate, probed := h.stats.ReportThreshold, h.probed
	h.probed = true
	h.mu.Unlock()
	var keys []hotkey.KeyRate
	if minRate > 0 || !probed {
		keys = h.cfg.Report(now, minRate)
	}
	// else: the threshold is still unknown after the first report; an
	// empty report costs the producer nothing, is always valid, and its
	// answer brings the threshold.
	pks, dropped := reportKeysToProto(keys, minRate)
	req := &keyshardv1.ReportHotKeysRequest{Pool: h.cfg.Pool, Producer: h.cfg.Producer, Keys: pks}
	// Abandon a call that hangs.
	resp, err := callWithin(ctx, h.c, hotAPI.ReportHotKeys, req, budget{within: max(h.cfg.Interval, reportTimeout)})
	answered := h.clock.Now()

	h.mu.Lock()
	defer h.mu.Unlock()
	h.stats.DroppedKeys += dropped
	if err != nil {
		if ctx.Err() != nil {
			return err // stopping: not a failure of the server
		}
		h.stats.ReportFailures++
		err = h.explainLocked(err)
		h.log.Warn("keyshard: hot-key report failed; retrying", "err", err, "failures", h.stats.ReportFailures)
		return err
	}
	h.stats.Reports++
	h.stats.LastContact = answered
	if t := resp.GetPool().GetReportThreshold(); t > 0 && !math.IsInf(t, 0) {
		h.stats.ReportThreshold = t
	}
	return nil
}

// reportKeysToProto keeps the valid keys at or above minRate, at most
// MaxReportKeys of them with the highest rates (each key once), and
// returns them with the number of keys left out as invalid or beyond the
// limit.
func reportKeysToProto(keys []hotkey.KeyRate, minRate float64) ([]*keyshardv1.KeyRate, uint64) {
	var dropped uint64
	valid := make([]hotkey.KeyRate, 0, len(keys))
	for _, k := range keys {
		switch {
		case k.Key == "" || len(k.Key) > MaxReportKeyLen || math.IsNaN(k.Rate) || math.IsInf(k.Rate, 0) || k.Rate < 0:
			dropped++
		case k.Rate >= minRate:
			valid = append(valid, k)
		}
	}
	slices.SortFunc(valid, func(a, b hotkey.KeyRate) int {
		switch {
		case a.Rate > b.Rate:
			return -1
		case a.Rate < b.Rate:
			return 1
		}
		return strings.Compare(a.Key, b.Key)
	})
	out := make([]*keyshardv1.KeyRate, 0, min(len(valid), MaxReportKeys))
	seen := make(map[string]bool, len(valid))
	for _, k := range valid {
		switch {
		case seen[k.Key]: // a duplicate, at a lower rate
		case len(out) == MaxReportKeys:
			dropped++
		default:
			seen[k.Key] = true
			out = append(out, &keyshardv1.KeyRate{Key: k.Key, Rate: k.Rate})
		}
	}
	return out, dropped
}

// explainLocked wraps err with what to do about it. h.mu is held.
func (h *HotKeys) explainLocked(err error) error {
	pool := h.cfg.Pool
	switch {
	case errors.Is(err, ErrNotFound):
		return fmt.Errorf("hot-key pool %q does not exist: create it with `keyshard hotkeys pool put %s --threshold N` (N: the summed rate, in messages per second, at which a key goes to overflow); until then overflow set version %d stays in force: %w",
			pool, pool, h.set.Version, err)
	case errors.Is(err, ErrUnauthenticated), errors.Is(err, ErrPermissionDenied):
		return fmt.Errorf("the server refused the token: give this producer a member or admin token (client.Token); until then overflow set version %d stays in force: %w",
			h.set.Version, err)
	case errors.Is(err, ErrUnavailable), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return fmt.Errorf("the control plane at %s is unreachable or not answering; overflow set version %d stays in force until it answers: %w",
			h.c.URL(), h.set.Version, err)
	case errors.Is(err, ErrInvalid):
		return fmt.Errorf("the server refused the hot-key report of pool %q: %w", pool, err)
	}
	return err
}

// follow keeps the overflow set current until ctx ends.
func (h *HotKeys) follow(ctx context.Context) {
	failed := func(ctx context.Context, err error) error {
		if err == nil || ctx.Err() != nil {
			return err
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		h.stats.WatchFailures++
		return h.explainLocked(err)
	}
	f := follower[keyshardv1.OverflowSet]{
		clock: h.clock,
		log:   h.log,
		what:  "overflow set",
		watch: func(ctx context.Context, yield func(*keyshardv1.OverflowSet)) error {
			req := &keyshardv1.WatchOverflowSetRequest{Pool: h.cfg.Pool, SinceVersion: h.version()}
			return failed(ctx, stream(ctx, h.c, hotAPI.WatchOverflowSet, req, yield))
		},
		poll: func(ctx context.Context) (*keyshardv1.OverflowSet, bool, error) {
			req := &keyshardv1.GetOverflowSetRequest{Pool: h.cfg.Pool, SinceVersion: h.version(), Wait: durationpb.New(pollWait)}
			resp, err := callWithin(ctx, h.c, hotAPI.GetOverflowSet, req, budget{wait: pollWait})
			if err != nil {
				return nil, false, failed(ctx, err)
			}
			h.contact()
			return resp.GetSet(), resp.GetChanged(), nil
		},
		apply: h.apply,
		fatal: func(err error) bool { return errors.Is(err, ErrClosed) },
	}
	_ = f.run(ctx) // only ErrClosed, when the Client closed
}

// apply installs m if it is newer than the set held and hands it to
// OnSet. Only the follow goroutine calls it.
func (h *HotKeys) apply(m *keyshardv1.OverflowSet) {
	if m == nil {
		return
	}
	h.contact()
	if p := m.GetPool(); p != "" && p != h.cfg.Pool {
		h.log.Error("keyshard: ignoring an overflow set of another pool", "set_pool", p, "version", m.GetVersion())
		return
	}
	h.mu.Lock()
	if m.GetVersion() <= h.set.Version {
		h.mu.Unlock()
		return
	}
	h.set = overflowSetFromProto(m)
	h.stats.Version, h.stats.Keys = h.set.Version, len(h.set.Entries)
	set := cloneSet(h.set)
	h.mu.Unlock()
	if h.cfg.OnSet != nil {
		h.cfg.OnSet(set)
	}
}

// OverflowSet returns the current overflow set of hot-key pool: version 0
// and no keys if the pool has none yet. It needs a member or admin token.
// It returns an error wrapping ErrNotFound if the pool does not exist. A
// producer follows the set with a HotKeys; this is for looking at it.
func (c *Client) OverflowSet(ctx context.Context, pool string) (hotkey.OverflowSet, error) {
	if err := validName("Client.OverflowSet", "pool name", pool); err != nil {
		return hotkey.OverflowSet{}, err
	}
	resp, err := call(ctx, c, hotAPI.GetOverflowSet, &keyshardv1.GetOverflowSetRequest{Pool: pool, Wait: durationpb.New(0)})
	if err != nil {
		return hotkey.OverflowSet{}, fmt.Errorf("overflow set of hot-key pool %q: %w", pool, err)
	}
	return overflowSetFromProto(resp.GetSet()), nil
}

// WatchOverflowSet calls f with every version of pool's overflow set newer
// than since, in order, as the server publishes them, over one stream
// (WatchOverflowSet) to the replica that answered last. It does not
// reconnect: it returns when ctx ends (an error wrapping ctx.Err()), when
// the stream fails (its error; ErrUnavailable if the replica went away),
// or nil if the server ended the stream. Calls to f are made from the
// caller's goroutine. A HotKeys follows the set through failures; this is
// for watching it.
func (c *Client) WatchOverflowSet(ctx context.Context, pool string, since uint64, f func(hotkey.OverflowSet)) error {
	if err := validName("Client.WatchOverflowSet", "pool name", pool); err != nil {
		return err
	}
	req := &keyshardv1.WatchOverflowSetRequest{Pool: pool, SinceVersion: since}
	err := stream(ctx, c, hotAPI.WatchOverflowSet, req, func(m *keyshardv1.OverflowSet) { f(overflowSetFromProto(m)) })
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("watch the overflow set of hot-key pool %q: %w", pool, ctx.Err())
	case err != nil:
		return fmt.Errorf("watch the overflow set of hot-key pool %q: %w", pool, err)
	}
	return nil
}
