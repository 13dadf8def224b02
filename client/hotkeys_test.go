package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/client/clienttest"
	"github.com/keyshard/keyshard/hotkey"
)

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// hotRun is a running HotKeys with everything it tells the test.
type hotRun struct {
	hk       *HotKeys
	sets     chan hotkey.OverflowSet // OnSet
	reported chan error              // OnReport
	minRates chan float64            // Report's minRate, per call
	logs     *syncBuffer
}

// reportedKeys is what the test producer's Report returns, whatever
// minRate is (HotKeys leaves out the keys below it).
var reportedKeys = []hotkey.KeyRate{{Key: "warm", Rate: 30}, {Key: "hot", Rate: 400}, {Key: "cool", Rate: 10}}

// runHotKeys starts a HotKeys of pool "events", producer "p1", on the
// fake's clock; the test's cleanup stops it and checks Run's result.
func runHotKeys(t *testing.T, f fake) *hotRun {
	t.Helper()
	hr := &hotRun{
		sets: make(chan hotkey.OverflowSet, 64), reported: make(chan error, 64), minRates: make(chan float64, 64),
		logs: &syncBuffer{},
	}
	hk, err := NewHotKeys(f.dial(t), HotKeysConfig{
		Pool:     "events",
		Producer: "p1",
		Report: func(_ time.Time, minRate float64) []hotkey.KeyRate {
			hr.minRates <- minRate
			return reportedKeys
		},
		OnSet:    func(s hotkey.OverflowSet) { hr.sets <- s },
		OnReport: func(err error) { hr.reported <- err },
	}, Logger(slog.New(slog.NewTextHandler(hr.logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	hr.hk = hk
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- hk.Run(ctx) }() // exits when the cleanup cancels ctx
	t.Cleanup(func() {
		cancel()
		if err := recv(t, done, "Run to return"); !errors.Is(err, context.Canceled) {
			t.Errorf("Run = %v, want context.Canceled", err)
		}
	})
	return hr
}

func setKeys(s hotkey.OverflowSet) []string { return s.Keys() }

// overflowSet is pool "events"'s set at version with keys: key i at rate
// 1000+i since now, cooling since now if i is odd.
func overflowSet(now time.Time, version uint64, keys ...string) *keyshardv1.OverflowSet {
	set := &keyshardv1.OverflowSet{Pool: "events", Version: version}
	for i, k := range keys {
		ok := &keyshardv1.OverflowKey{Key: k, Rate: float64(1000 + i), Since: timestamppb.New(now)}
		if i%2 == 1 {
			ok.CoolingSince = timestamppb.New(now)
		}
		set.Keys = append(set.Keys, ok)
	}
	return set
}

// TestHotKeysReportsAndFollowsSet: a (re)starting producer gets the
// current set with its first watch, reports at once with minRate 0, then
// every Interval with the pool's report_threshold, and sees every newer
// set, in order.
func TestHotKeysReportsAndFollowsSet(t *testing.T) {
	f := newFake(t)
	f.AddHotKeyPool("events", 1600)
	f.PutOverflowSet(overflowSet(f.Clock().Now(), 5, "a", "b")) // the set outlived the producer's previous run
	start := f.Clock().Now()
	hr := runHotKeys(t, f)

	if w := f.SetWatches().Next(t); w.GetPool() != "events" || w.GetSinceVersion() != 0 {
		t.Errorf("watch request %v, want pool events since version 0", w)
	}
	s := recv(t, hr.sets, "the current set")
	if s.Version != 5 || !slices.Equal(setKeys(s), []string{"a", "b"}) {
		t.Fatalf("first set %+v, want version 5 with a, b", s)
	}
	if e := s.Entries[1]; e.Rate != 1001 || !e.Since.Equal(start) || !e.BelowSince.Equal(start) || !s.Entries[0].BelowSince.IsZero() {
		t.Errorf("entries %+v: rates and times not converted", s.Entries)
	}

	if m := recv(t, hr.minRates, "the first Report"); m != 0 {
		t.Errorf("first Report minRate %v, want 0 (threshold not known yet)", m)
	}
	req := f.Reports().Next(t)
	if req.GetPool() != "events" || req.GetProducer() != "p1" || fmt.Sprint(protoKeys(req)) != "[hot:400 warm:30 cool:10]" {
		t.Errorf("first report %v", req)
	}
	if err := recv(t, hr.reported, "the first report's result"); err != nil {
		t.Fatal(err)
	}
	if st := hr.hk.Stats(); st.Reports != 1 || st.ReportThreshold != 25 || !st.LastContact.Equal(start) || st.Version != 5 || st.Keys != 2 {
		t.Errorf("stats %+v", st)
	}

	f.Clock().MustBlockUntil(t, 1) // the reporter's sleep
	f.Clock().Advance(time.Second)
	if m := recv(t, hr.minRates, "the second Report"); m != 25 {
		t.Errorf("second Report minRate %v, want the pool's report_threshold 25", m)
	}
	req = f.Reports().Next(t)
	if fmt.Sprint(protoKeys(req)) != "[hot:400 warm:30]" {
		t.Errorf("second report %v: want the keys at or above 25", protoKeys(req))
	}
	if err := recv(t, hr.reported, "the second report's result"); err != nil {
		t.Fatal(err)
	}

	for _, want := range []struct {
		version uint64
		keys    []string
	}{{6, []string{"c"}}, {7, []string{}}} {
		f.SetOverflow("events", want.keys...)
		s := recv(t, hr.sets, fmt.Sprint("set version ", want.version))
		if s.Version != want.version || !slices.Equal(setKeys(s), want.keys) {
			t.Errorf("set %+v, want version %d with %v", s, want.version, want.keys)
		}
	}
	// Versions written faster than they are delivered may be skipped, but
	// never go backwards.
	f.SetOverflow("events", "d")
	f.SetOverflow("events", "e")
	for s := recv(t, hr.sets, "set version 8 or 9"); s.Version != 9; s = recv(t, hr.sets, "set version 9") {
		if s.Version != 8 {
			t.Fatalf("set %+v after version 7, want 8 or 9", s)
		}
	}
	if got := hr.hk.Set(); got.Version != 9 || !slices.Equal(got.Keys(), []string{"e"}) {
		t.Errorf("Set() = %+v", got)
	}
	st := hr.hk.Stats()
	if st.Reports != 2 || st.ReportFailures != 0 || st.WatchFailures != 0 || st.Version != 9 || st.Keys != 1 || st.DroppedKeys != 0 {
		t.Errorf("stats %+v", st)
	}
}

func protoKeys(r *keyshardv1.ReportHotKeysRequest) []string {
	var out []string
	for _, k := range r.GetKeys() {
		out = append(out, fmt.Sprintf("%s:%v", k.GetKey(), k.GetRate()))
	}
	return out
}

// TestHotKeysFailOpen: while the control plane is down the producer keeps
// its last set, counts the failures and says what is wrong; once it is
// back, reports resume and the set written meanwhile arrives.
func TestHotKeysFailOpen(t *testing.T) {
	f := newFake(t)
	f.AddHotKeyPool("events", 1600)
	f.SetOverflow("events", "a")
	start := f.Clock().Now()
	hr := runHotKeys(t, f)
	if s := recv(t, hr.sets, "set 1"); s.Version != 1 {
		t.Fatalf("set %+v", s)
	}
	if err := recv(t, hr.reported, "the first report"); err != nil {
		t.Fatal(err)
	}

	f.SetHotKeysUnavailable(true)
	f.Clock().MustBlockUntil(t, 2) // the reporter's sleep, and the watcher's backoff after its stream broke
	for i := range 3 {
		f.Clock().Advance(time.Second)
		err := recv(t, hr.reported, fmt.Sprint("failed report ", i))
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "unreachable") ||
			!strings.Contains(err.Error(), "overflow set version 1 stays in force") {
			t.Errorf("report %d while down: %v", i, err)
		}
		f.Clock().MustBlockUntil(t, 2) // both asleep again
	}
	select {
	case s := <-hr.sets:
		t.Fatalf("a set was delivered while the server was down: %+v", s)
	default:
	}
	st := hr.hk.Stats()
	if st.ReportFailures != 3 || st.WatchFailures == 0 || st.Reports != 1 || st.Version != 1 || !st.LastContact.Equal(start) {
		t.Errorf("stats while down: %+v", st)
	}
	if got := hr.hk.Set(); !slices.Equal(got.Keys(), []string{"a"}) {
		t.Errorf("the set was not kept: %+v", got)
	}
	if logs := hr.logs.String(); !strings.Contains(logs, "hot-key report failed") || !strings.Contains(logs, "unreachable") {
		t.Errorf("no warning logged:\n%s", logs)
	}

	// Back: a set written meanwhile arrives, and reports resume.
	f.SetOverflow("events", "b")
	f.SetHotKeysUnavailable(false)
	f.Clock().Advance(backoffCap) // every sleep ends
	if s := recv(t, hr.sets, "set 2 after recovery"); s.Version != 2 || !slices.Equal(s.Keys(), []string{"b"}) {
		t.Errorf("set after recovery %+v", s)
	}
	if err := recv(t, hr.reported, "a report after recovery"); err != nil {
		t.Errorf("report after recovery: %v", err)
	}
	if st := hr.hk.Stats(); st.Reports != 2 || st.ReportFailures != 3 || st.Version != 2 || !st.LastContact.Equal(f.Clock().Now()) {
		t.Errorf("stats after recovery: %+v", st)
	}
}

// TestHotKeysUnknownPool: the warning says how to create the pool; the
// producer keeps retrying and picks the pool up once it exists.
func TestHotKeysUnknownPool(t *testing.T) {
	f := newFake(t)
	hr := runHotKeys(t, f)
	err := recv(t, hr.reported, "the first report")
	want := "hot-key pool \"events\" does not exist: create it with `keyshard hotkeys pool put events --threshold N`"
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), want) {
		t.Errorf("report to an unknown pool: %v", err)
	}
	f.Clock().MustBlockUntil(t, 2) // the reporter's and the watcher's backoff
	if logs := hr.logs.String(); !strings.Contains(logs, "keyshard hotkeys pool put events --threshold N") {
		t.Errorf("the log does not say how to create the pool:\n%s", logs)
	}
	if st := hr.hk.Stats(); st.ReportFailures != 1 || st.WatchFailures == 0 || st.Reports != 0 || !st.LastContact.IsZero() {
		t.Errorf("stats %+v", st)
	}

	f.AddHotKeyPool("events", 1600)
	f.SetOverflow("events", "x")
	f.Clock().Advance(backoffCap)
	if s := recv(t, hr.sets, "the set once the pool exists"); s.Version != 1 || !slices.Equal(s.Keys(), []string{"x"}) {
		t.Errorf("set %+v", s)
	}
	if err := recv(t, hr.reported, "a report once the pool exists"); err != nil {
		t.Errorf("report: %v", err)
	}
	if st := hr.hk.Stats(); st.Reports != 1 || st.ReportThreshold != 25 {
		t.Errorf("stats %+v", st)
	}
}

// TestHotKeysThresholdUnknown: until a report is answered, only the first
// one calls Report (with minRate 0); the next ones are empty, so a
// producer whose reports fail (refused here, as a server checking reports
// against the threshold might) neither scans its keys in vain nor fails
// to learn the threshold.
func TestHotKeysThresholdUnknown(t *testing.T) {
	f := newFake(t)
	f.AddHotKeyPool("events", 1600)
	f.Fail(keyshardv1connect.HotKeyServiceReportHotKeysProcedure, connect.NewError(connect.CodeInvalidArgument, errors.New("keys[2]: rate 10 is below the pool's report_threshold 25")))
	hr := runHotKeys(t, f)
	if err := recv(t, hr.reported, "the first report"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("first report: %v", err)
	}
	if req := f.Reports().Next(t); len(req.GetKeys()) != 3 {
		t.Errorf("first report %v, want every key Report returned", protoKeys(req))
	}
	if m := recv(t, hr.minRates, "Report"); m != 0 {
		t.Errorf("the first Report was called with %v", m)
	}
	f.Clock().MustBlockUntil(t, 1) // the reporter's backoff (the watch is open: no set yet)
	f.Clock().Advance(time.Second)
	if err := recv(t, hr.reported, "the second report"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("second report: %v", err)
	}
	if req := f.Reports().Next(t); len(req.GetKeys()) != 0 {
		t.Errorf("second report %v, want an empty one", protoKeys(req))
	}
	f.Fail(keyshardv1connect.HotKeyServiceReportHotKeysProcedure, nil)
	f.Clock().MustBlockUntil(t, 1)
	f.Clock().Advance(time.Second)
	if req := f.Reports().Next(t); len(req.GetKeys()) != 0 {
		t.Errorf("third report %v, want an empty one", protoKeys(req))
	}
	if err := recv(t, hr.reported, "the third report"); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-hr.minRates:
		t.Errorf("Report called again (minRate %v) before the threshold was known", m)
	default:
	}
	f.Clock().MustBlockUntil(t, 1)
	f.Clock().Advance(time.Second)
	if m := recv(t, hr.minRates, "Report"); m != 25 {
		t.Errorf("Report after the threshold is known: minRate %v", m)
	}
	if req := f.Reports().Next(t); fmt.Sprint(protoKeys(req)) != "[hot:400 warm:30]" {
		t.Errorf("fourth report %v", protoKeys(req))
	}
	if err := recv(t, hr.reported, "the fourth report"); err != nil {
		t.Fatal(err)
	}
	if st := hr.hk.Stats(); st.Reports != 2 || st.ReportFailures != 2 {
		t.Errorf("stats %+v", st)
	}
}

// TestHotKeysLongPoll: without the stream, the set is followed with
// GetOverflowSet long polls.
func TestHotKeysLongPoll(t *testing.T) {
	f := newFake(t)
	f.AddHotKeyPool("events", 1600)
	f.Fail(keyshardv1connect.HotKeyServiceWatchOverflowSetProcedure, connect.NewError(connect.CodeUnimplemented, errors.New("no streams here")))
	f.SetOverflow("events", "a")
	hr := runHotKeys(t, f)
	f.SetWatches().Next(t)
	if err := recv(t, hr.reported, "the first report"); err != nil {
		t.Fatal(err)
	}
	f.Clock().MustBlockUntil(t, 2) // the reporter's sleep and the watcher's backoff
	f.Clock().Advance(backoffBase) // the backoff, not the report interval
	poll := f.SetPolls().Next(t)
	if poll.GetWait().AsDuration() != pollWait || poll.GetSinceVersion() != 0 {
		t.Errorf("poll %v", poll)
	}
	if s := recv(t, hr.sets, "set 1"); s.Version != 1 {
		t.Fatalf("set %+v", s)
	}
	if poll := f.SetPolls().Next(t); poll.GetSinceVersion() != 1 {
		t.Errorf("next poll since %d, want 1", poll.GetSinceVersion())
	}
	f.SetOverflow("events", "a", "b")
	if s := recv(t, hr.sets, "set 2"); s.Version != 2 || !slices.Equal(s.Keys(), []string{"a", "b"}) {
		t.Errorf("set %+v", s)
	}
}

// TestHotKeysApply: only newer sets of the pool reach OnSet.
func TestHotKeysApply(t *testing.T) {
	f := newFake(t)
	var got []uint64
	hk, err := NewHotKeys(f.dial(t), HotKeysConfig{Pool: "events", Producer: "p1",
		Report: func(time.Time, float64) []hotkey.KeyRate { return nil },
		OnSet:  func(s hotkey.OverflowSet) { got = append(got, s.Version) }})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*keyshardv1.OverflowSet{
		nil,
		{Pool: "events", Version: 3, Keys: []*keyshardv1.OverflowKey{{Key: "a"}}},
		{Pool: "events", Version: 3},
		{Pool: "events", Version: 2},
		{Pool: "other", Version: 9},
		{Version: 4}, // a server may leave the pool out
	} {
		hk.apply(m)
	}
	if !slices.Equal(got, []uint64{3, 4}) {
		t.Errorf("OnSet saw versions %v, want [3 4]", got)
	}
	if s := hk.Set(); s.Version != 4 || len(s.Entries) != 0 {
		t.Errorf("Set() = %+v", s)
	}
}

func TestReportKeysToProto(t *testing.T) {
	var keys []hotkey.KeyRate
	for i := range MaxReportKeys + 10 {
		keys = append(keys, hotkey.KeyRate{Key: fmt.Sprintf("k%04d", i), Rate: float64(100 + i)})
	}
	keys = append(keys,
		hotkey.KeyRate{Key: "", Rate: 1e6},
		hotkey.KeyRate{Key: "nan", Rate: math.NaN()},
		hotkey.KeyRate{Key: "inf", Rate: math.Inf(1)},
		hotkey.KeyRate{Key: "negative", Rate: -1},
		hotkey.KeyRate{Key: strings.Repeat("x", MaxReportKeyLen+1), Rate: 1e6},
		hotkey.KeyRate{Key: strings.Repeat("y", MaxReportKeyLen), Rate: 1e6},
		hotkey.KeyRate{Key: "k1033", Rate: 5000}, // a duplicate: the higher rate wins
		hotkey.KeyRate{Key: "low", Rate: 99},     // below minRate: left out, not counted
	)
	out, dropped := reportKeysToProto(keys, 100)
	if len(out) != MaxReportKeys || dropped != 5+11 {
		t.Fatalf("%d keys, %d dropped; want %d and 16 (5 invalid, 11 beyond the limit)", len(out), dropped, MaxReportKeys)
	}
	if out[0].GetKey() != strings.Repeat("y", MaxReportKeyLen) || out[1].GetKey() != "k1033" || out[1].GetRate() != 5000 || out[2].GetKey() != "k1032" {
		t.Errorf("not the highest first: %v %v %v", out[0].GetKey()[:3], out[1], out[2])
	}
	// Kept: the long valid key, then k1033..k0011 (1023 keys).
	if last := out[len(out)-1]; last.GetKey() != "k0011" {
		t.Errorf("last kept key %v, want k0011", last)
	}
	if out, dropped := reportKeysToProto(nil, 0); len(out) != 0 || dropped != 0 {
		t.Errorf("nil: %v, %d", out, dropped)
	}
}

func TestNewHotKeysErrors(t *testing.T) {
	f := newFake(t)
	c := f.dial(t)
	report := func(time.Time, float64) []hotkey.KeyRate { return nil }
	for _, tc := range []struct {
		cfg  HotKeysConfig
		arg  string // the *ArgError's Arg
		text string // in its Reason
	}{
		{HotKeysConfig{Producer: "p", Report: report}, "HotKeysConfig.Pool", "is empty"},
		{HotKeysConfig{Pool: "a/b", Producer: "p", Report: report}, "HotKeysConfig.Pool", `"a/b" has '/'`},
		{HotKeysConfig{Pool: "events", Report: report}, "HotKeysConfig.Producer", "is empty"},
		{HotKeysConfig{Pool: "events", Producer: "p 1", Report: report}, "HotKeysConfig.Producer", `"p 1" has ' '`},
		{HotKeysConfig{Pool: "events", Producer: "p"}, "HotKeysConfig.Report", "is nil"},
		{HotKeysConfig{Pool: "events", Producer: "p", Report: report, Interval: -time.Second}, "HotKeysConfig.Interval", "-1s is negative"},
	} {
		_, err := NewHotKeys(c, tc.cfg)
		checkArgError(t, fmt.Sprintf("NewHotKeys(%+v)", tc.cfg), err, "NewHotKeys", tc.arg, tc.text)
	}
	_, err := NewHotKeys(nil, HotKeysConfig{Pool: "events", Producer: "p", Report: report})
	checkArgError(t, "nil client", err, "NewHotKeys", "client", "is nil")

	// Run stops with the Client, and may run once.
	f.AddHotKeyPool("events", 100)
	hk, err := NewHotKeys(c, HotKeysConfig{Pool: "events", Producer: "p", Report: report})
	if err != nil {
		t.Fatal(err)
	}
	if hk.cfg.Interval != DefaultHotKeysInterval {
		t.Errorf("default interval %v", hk.cfg.Interval)
	}
	done := make(chan error, 1)
	go func() { done <- hk.Run(context.Background()) }() // exits when the Client closes
	f.Reports().Next(t)
	c.Close()
	if err := recv(t, done, "Run to return"); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after the Client closed = %v, want ErrClosed", err)
	}
	if err := hk.Run(context.Background()); !errors.Is(err, ErrInvalid) {
		t.Errorf("second Run = %v, want ErrInvalid", err)
	}
	hk2, _ := NewHotKeys(c, HotKeysConfig{Pool: "events", Producer: "p", Report: report})
	if err := hk2.Run(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Run on a closed Client = %v, want ErrClosed", err)
	}
}

// TestHotKeysClose: Close ends Run, which returns nil, while a report and
// the watch are in flight; it returns only once Run's goroutines exited
// (the report's timer is off the clock), and is idempotent.
func TestHotKeysClose(t *testing.T) {
	f := newFake(t)
	f.AddHotKeyPool("events", 1600)
	fr := f.AddReplica()
	fr.Pause()
	reports := make(chan float64, 16)
	hk, err := NewHotKeys(dialReplicas(t, f, []*clienttest.Replica{fr}), HotKeysConfig{Pool: "events", Producer: "p1",
		Report: func(_ time.Time, minRate float64) []hotkey.KeyRate { reports <- minRate; return reportedKeys }})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- hk.Run(context.Background()) }() // exits when Close stops it
	recv(t, reports, "Report")
	held := map[string]bool{}
	for range 2 {
		held[fr.Blocked().Next(t)] = true
	}
	if !held[keyshardv1connect.HotKeyServiceReportHotKeysProcedure] || !held[keyshardv1connect.HotKeyServiceWatchOverflowSetProcedure] {
		t.Fatalf("calls held: %v; want the report and the watch", held)
	}
	if n := f.Clock().Waiters(); n != 1 {
		t.Fatalf("%d timers on the clock; want 1, the report's deadline", n)
	}
	if err := hk.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	if n := f.Clock().Waiters(); n != 0 {
		t.Errorf("%d timers left on the clock after Close: a goroutine of Run is still in a call", n)
	}
	if err := recv(t, done, "Run to return"); err != nil {
		t.Errorf("Run after Close = %v, want nil", err)
	}
	if err := hk.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if st := hk.Stats(); st.Reports != 0 || st.ReportFailures != 0 || st.WatchFailures != 0 {
		t.Errorf("Stats after Close = %+v; an abandoned call is not a failure", st)
	}
	if err := hk.Run(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after Close = %v, want ErrClosed", err)
	}
	if len(reports) != 0 {
		t.Errorf("Report called after Close")
	}
}

// TestHotKeysCloseWithoutRun: Close before Run is fine and idempotent;
// Run then returns ErrClosed without a call.
func TestHotKeysCloseWithoutRun(t *testing.T) {
	f := newFake(t)
	f.AddHotKeyPool("events", 1600)
	hk, err := NewHotKeys(f.dial(t), HotKeysConfig{Pool: "events", Producer: "p1",
		Report: func(time.Time, float64) []hotkey.KeyRate { t.Error("Report called"); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := hk.Close(); err != nil {
			t.Errorf("Close %d = %v", i+1, err)
		}
	}
	if err := hk.Run(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after Close = %v, want ErrClosed", err)
	}
	if n := f.CallCount(keyshardv1connect.HotKeyServiceReportHotKeysProcedure) + f.CallCount(keyshardv1connect.HotKeyServiceWatchOverflowSetProcedure); n != 0 {
		t.Errorf("%d calls reached the server", n)
	}
}

// TestClientOverflowSet: OverflowSet reads a pool's set; WatchOverflowSet
// hands over every newer version until ctx ends or the stream fails, and
// does not reconnect.
func TestClientOverflowSet(t *testing.T) {
	f := newFake(t)
	f.AddHotKeyPool("events", 1600)
	c := f.dial(t)
	ctx := context.Background()
	if s, err := c.OverflowSet(ctx, "events"); err != nil || s.Version != 0 || len(s.Entries) != 0 {
		t.Errorf("OverflowSet before any set = %+v, %v; want version 0", s, err)
	}
	f.PutOverflowSet(overflowSet(f.Clock().Now(), 5, "a", "b"))
	s, err := c.OverflowSet(ctx, "events")
	if err != nil || s.Version != 5 || !slices.Equal(s.Keys(), []string{"a", "b"}) {
		t.Fatalf("OverflowSet = %+v, %v; want version 5 with a, b", s, err)
	}
	if e := s.Entries[1]; e.Rate != 1001 || !e.Since.Equal(f.Clock().Now()) || !e.BelowSince.Equal(f.Clock().Now()) {
		t.Errorf("entry %+v: rate and times not converted", e)
	}
	if _, err := c.OverflowSet(ctx, "nope"); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), `hot-key pool "nope" does not exist`) {
		t.Errorf("OverflowSet(unknown pool) = %v, want ErrNotFound", err)
	}
	_, err = c.OverflowSet(ctx, "a/b")
	checkArgError(t, "OverflowSet", err, "Client.OverflowSet", "pool name", `"a/b" has '/'`)
	checkArgError(t, "WatchOverflowSet", c.WatchOverflowSet(ctx, "", 0, nil), "Client.WatchOverflowSet", "pool name", "is empty")

	sets := make(chan hotkey.OverflowSet, 16)
	watch := func(ctx context.Context, since uint64) chan error {
		done := make(chan error, 1)
		go func() { done <- c.WatchOverflowSet(ctx, "events", since, func(s hotkey.OverflowSet) { sets <- s }) }() // exits when ctx ends or the stream does
		if req := f.SetWatches().Next(t); req.GetSinceVersion() != since {
			t.Errorf("watch since %d, want %d", req.GetSinceVersion(), since)
		}
		return done
	}
	wctx, cancel := context.WithCancel(ctx)
	done := watch(wctx, 5)
	f.SetOverflow("events", "c")
	if s := recv(t, sets, "version 6"); s.Version != 6 || !slices.Equal(s.Keys(), []string{"c"}) {
		t.Errorf("watched %+v, want version 6 with c", s)
	}
	cancel()
	if err := recv(t, done, "WatchOverflowSet to return"); !errors.Is(err, context.Canceled) {
		t.Errorf("WatchOverflowSet after cancel = %v, want context.Canceled", err)
	}

	done = watch(ctx, 6)
	f.SetHotKeysUnavailable(true)
	if err := recv(t, done, "WatchOverflowSet to return"); !errors.Is(err, ErrUnavailable) {
		t.Errorf("WatchOverflowSet when the server fails = %v, want ErrUnavailable", err)
	}
	if n := f.CallCount(keyshardv1connect.HotKeyServiceWatchOverflowSetProcedure); n != 2 {
		t.Errorf("%d WatchOverflowSet calls, want 2: it does not reconnect", n)
	}
}

func TestAdminHotKeyPools(t *testing.T) {
	f := newFake(t)
	adm := f.dial(t).Admin()
	ctx := context.Background()
	got, err := adm.PutHotKeyPool(ctx, HotKeyPool{Name: "events", Threshold: 1600, Cooldown: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	want := HotKeyPool{Name: "events", Threshold: 1600, LowThreshold: 800, Cooldown: time.Minute, ReportThreshold: 25, ReportMaxAge: 30 * time.Second, MaxKeys: 1024}
	if got != want {
		t.Errorf("PutHotKeyPool = %+v, want %+v", got, want)
	}
	if _, err := adm.PutHotKeyPool(ctx, HotKeyPool{Name: "b", Threshold: 10}); err != nil {
		t.Fatal(err)
	}
	pools, err := adm.ListHotKeyPools(ctx)
	if err != nil || len(pools) != 2 || pools[0].Name != "b" || pools[1] != want {
		t.Errorf("ListHotKeyPools = %+v, %v", pools, err)
	}
	for _, bad := range []HotKeyPool{
		{Name: "", Threshold: 1},
		{Name: "x", Threshold: math.NaN()},
		{Name: "x", Threshold: 1, ReportThreshold: -1},
		{Name: "x", Threshold: 1, Cooldown: -time.Second},
	} {
		if _, err := adm.PutHotKeyPool(ctx, bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("PutHotKeyPool(%+v) = %v, want ErrInvalid", bad, err)
		}
	}
	if n := f.CallCount("/keyshard.v1.AdminService/PutHotKeyPool"); n != 2 {
		t.Errorf("%d PutHotKeyPool calls; invalid pools must be refused without a call", n)
	}
	if _, err := adm.PutHotKeyPool(ctx, HotKeyPool{Name: "zero", Threshold: 0}); !errors.Is(err, ErrInvalid) {
		t.Errorf("a zero threshold is the server's to refuse: %v", err)
	}
}
