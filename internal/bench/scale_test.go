package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"

	"connectrpc.com/connect"
)

// TestScaleQuick runs every scenario of bench scale at tiny sizes end to
// end (real etcd and serve processes, simulated members and routers) and
// checks that the report is complete and consistent with the sizes asked
// for: every bucket granted, every router reached, the counts as
// configured. Timings are not checked: -race and a busy machine make them
// meaningless here.
func TestScaleQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("builds keyshard and starts etcd and serve processes; skipped with -short")
	}
	bin := keyshardBinary(t)
	opts := ScaleOptions{
		Binary: bin, Quick: true,
		Members: 50, Buckets: 512,
		LiveMembers: 50, Keyspaces: 2, LiveBuckets: 64,
		Routers:    200,
		JoinWindow: 500 * time.Millisecond, Window: time.Second,
		// A lease of 3 s and waits of up to 60 s: a keep-alive late on a
		// busy machine must not fail the test (the members re-join, as
		// the SDK does, and the report counts it).
		LeaseTTL: 3 * time.Second, Budget: 60 * time.Second,
		// Members in groups of 7 per connection: the members' calls go
		// over transports of the fleet's own, not the harness's.
		MembersPerConn: 7,
	}
	var progress bytes.Buffer
	rep, err := Scale(t.Context(), opts, &progress)
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := json.Marshal(rep); err != nil {
		t.Errorf("the report does not encode as JSON: %v", err)
	}
	if rep.Etcd != EtcdEmbedded || rep.EtcdMembers != 1 || !rep.Quick || rep.MembersPerConn != 7 {
		t.Errorf("etcd %q with %d members, quick %v, %d members per connection; want embedded, 1, true, 7", rep.Etcd, rep.EtcdMembers, rep.Quick, rep.MembersPerConn)
	}
	checkWhere := func(name string, w TimeSplit) {
		t.Helper()
		if w.ServeCPUS < 0 || w.EtcdCPUS < 0 || len(w.NotSplit) == 0 {
			t.Errorf("%s: where %+v: negative CPU or nothing said about what is not split", name, w)
		}
	}

	if r := rep.JoinStorm; r == nil {
		t.Error("no join-storm report")
	} else {
		if r.TimedOut || r.Granted != opts.Buckets || r.MembersListed != opts.Members || r.Members != opts.Members || r.Buckets != opts.Buckets {
			t.Errorf("join storm: timed out %v, %d of %d buckets granted to %d of %d members", r.TimedOut, r.Granted, opts.Buckets, r.MembersListed, opts.Members)
		}
		if r.EtcdWrites <= 0 || r.Where.MapEpochs < 1 || r.Where.Grants < int64(opts.Buckets) || r.Where.LeaderWrites < 1 || r.Where.LeaderPlans < 1 {
			t.Errorf("join storm: %d etcd writes, where %+v; want writes, epochs, at least every bucket's grant, leader plans and writes", r.EtcdWrites, r.Where)
		}
		if r.GrantedAfterLastJoinS < 0 || r.GrantedAfterFirstJoinS < r.GrantedAfterLastJoinS {
			t.Errorf("join storm: granted %.3fs after the last join, %.3fs after the first", r.GrantedAfterLastJoinS, r.GrantedAfterFirstJoinS)
		}
		checkWhere("join storm", r.Where)
	}

	if r := rep.Live; r == nil {
		t.Error("no live report")
	} else {
		if r.TimedOut || r.Granted != opts.Keyspaces*opts.LiveBuckets || r.LiveMembers != opts.LiveMembers || r.Keyspaces != opts.Keyspaces {
			t.Errorf("live: timed out %v, %d buckets granted, want %d", r.TimedOut, r.Granted, opts.Keyspaces*opts.LiveBuckets)
		}
		if r.KeepAlivesPerS <= 0 {
			t.Errorf("live: %.1f keep-alives/s; want some", r.KeepAlivesPerS)
		}
		// The first keep-alive of each session is a call; the rest ride
		// its Session stream.
		if r.KeepAlivesOnStreamPct <= 50 || rep.KeepAlives != "stream" {
			t.Errorf("live: %.1f%% of keep-alives on Session streams (keep-alives: %q); want most", r.KeepAlivesOnStreamPct, rep.KeepAlives)
		}
		// The members speak gRPC, which serve's grpc-go server serves.
		if r.ConnsGRPC == 0 || rep.Protocol != ProtocolGRPC {
			t.Errorf("live: serve served %d connections on grpc-go's server, members speaking %q; want the members' there", r.ConnsGRPC, rep.Protocol)
		}
		// etcd is the scenario's alone: its revision moves only with
		// serve's writes, which serve's view has seen.
		if r.ChecksOnReplicaPct <= 0 {
			t.Errorf("live: %.1f%% of keep-alive checks answered by serve's view; want some", r.ChecksOnReplicaPct)
		}
		if r.Health.SessionsLost != r.Health.Rejoins {
			t.Errorf("live: %d sessions lost, %d re-joined; want every lost session re-joined", r.Health.SessionsLost, r.Health.Rejoins)
		}
		// Each member's Session stream holds a goroutine of serve's, and
		// its stack. (The heap's figure swings with the collector.)
		if r.ServeGoroutinesPerMember < 0.9 || r.ServeStackBytesPerMember <= 0 {
			t.Errorf("live: serve's goroutines %.2f, stacks %.0f bytes per member; want a goroutine and its stack per member", r.ServeGoroutinesPerMember, r.ServeStackBytesPerMember)
		}
		if r.ServeRSSAfterBytes <= 0 || r.EtcdRSSBytes <= 0 || r.EtcdDBSizeBytes <= 0 || r.WindowS < opts.Window.Seconds() {
			t.Errorf("live: serve RSS %d, etcd RSS %d, db %d bytes, window %.2fs; want all measured", r.ServeRSSAfterBytes, r.EtcdRSSBytes, r.EtcdDBSizeBytes, r.WindowS)
		}
		checkWhere("live", r.Where)
	}

	if r := rep.LiveFloor; r == nil {
		t.Error("no live-floor report")
	} else {
		if r.LiveMembers != opts.LiveMembers || r.KeepAlivesPerS <= 0 || r.Health.KeepAliveErrors != 0 || r.Health.SessionsLost != 0 {
			t.Errorf("live floor: %d members, %.1f keep-alives/s, health %+v; want %d members keeping alive without errors", r.LiveMembers, r.KeepAlivesPerS, r.Health, opts.LiveMembers)
		}
		// Its CPU may round to 0 at these sizes: /proc counts 10 ms ticks.
		if r.EchoRSSAfterBytes <= 0 || r.EchoCPUPct < 0 || r.WindowS < opts.Window.Seconds() {
			t.Errorf("live floor: echo RSS %d bytes, CPU %.2f%%, window %.2fs; want all measured", r.EchoRSSAfterBytes, r.EchoCPUPct, r.WindowS)
		}
	}

	if r := rep.Routers; r == nil {
		t.Error("no routers report")
	} else {
		if r.Routers != opts.Routers || r.StreamRouters+r.PollRouters != opts.Routers || r.StreamRouters == 0 || r.PollRouters == 0 {
			t.Errorf("routers: %d (%d streams + %d polls); want %d, both kinds", r.Routers, r.StreamRouters, r.PollRouters, opts.Routers)
		}
		if r.Seen != opts.Routers || r.Missed != 0 {
			t.Errorf("routers: %d saw the epoch, %d missed; want all %d", r.Seen, r.Missed, opts.Routers)
		}
		if r.P50Ms < 0 || r.P99Ms < r.P50Ms || r.MaxMs < r.P99Ms || r.Where.MapEpochs < 1 {
			t.Errorf("routers: p50 %.1f p99 %.1f max %.1f ms, %d epochs written", r.P50Ms, r.P99Ms, r.MaxMs, r.Where.MapEpochs)
		}
		checkWhere("routers", r.Where)
	}

	if r := rep.Crash; r == nil {
		t.Error("no crash report")
	} else {
		wantCrashed := (opts.Members + 9) / 10
		if r.Crashed != wantCrashed || r.Members != opts.Members || r.Orphaned <= 0 {
			t.Errorf("crash: %d of %d crashed holding %d buckets; want %d crashed, holding some", r.Crashed, r.Members, r.Orphaned, wantCrashed)
		}
		if r.TimedOut || r.Granted != opts.Buckets || r.MembersListed != opts.Members-wantCrashed {
			t.Errorf("crash: timed out %v, %d of %d buckets granted to %d members; want all, to %d", r.TimedOut, r.Granted, opts.Buckets, r.MembersListed, opts.Members-wantCrashed)
		}
		if r.RegrantedS <= 0 || r.LeaseTTLS != opts.LeaseTTL.Seconds() {
			t.Errorf("crash: regranted after %.3fs, lease TTL %.1fs", r.RegrantedS, r.LeaseTTLS)
		}
		checkWhere("crash", r.Where)
	}
}

// TestSplitWatchLag: the split between two samples of serve's metrics
// reports the leader watch's mean lag over the span, and 0 for a span
// with no echo.
func TestSplitWatchLag(t *testing.T) {
	a := sample{metrics: map[string]float64{"keyshard_leader_watch_lag_seconds_sum": 2, "keyshard_leader_watch_lag_seconds_count": 10}}
	b := sample{metrics: map[string]float64{"keyshard_leader_watch_lag_seconds_sum": 3.5, "keyshard_leader_watch_lag_seconds_count": 40}}
	if got := split(a, b); got.LeaderWatchEchoes != 30 || got.LeaderWatchLagMeanS != 0.05 {
		t.Errorf("split: %d echoes, mean lag %v s; want 30 echoes, 0.05 s", got.LeaderWatchEchoes, got.LeaderWatchLagMeanS)
	}
	if got := split(b, b); got.LeaderWatchEchoes != 0 || got.LeaderWatchLagMeanS != 0 {
		t.Errorf("split of a span with no echo: %d echoes, mean lag %v s; want 0, 0", got.LeaderWatchEchoes, got.LeaderWatchLagMeanS)
	}
}

// TestKeepAliveErrorCodes: the fleet's failed keep-alives are reported by
// code, each with the first error.
func TestKeepAliveErrorCodes(t *testing.T) {
	f := &fleet{}
	f.keepAliveFailed(connect.NewError(connect.CodeDeadlineExceeded, errors.New("first")))
	f.keepAliveFailed(connect.NewError(connect.CodeDeadlineExceeded, errors.New("second")))
	f.keepAliveFailed(connect.NewError(connect.CodeUnavailable, errors.New("etcd")))
	h := f.health()
	want := map[string]*codeCount{
		"deadline_exceeded": {N: 2, First: "deadline_exceeded: first"},
		"unavailable":       {N: 1, First: "unavailable: etcd"},
	}
	if h.KeepAliveErrors != 3 || !reflect.DeepEqual(h.KeepAliveErrorCodes, want) {
		t.Errorf("health: %d errors, by code %+v; want 3, %+v", h.KeepAliveErrors, h.KeepAliveErrorCodes, want)
	}
}

// TestScaleSharedSessions runs the scenarios whose members keep alive
// (join storm, live, crash) with the members on shared Sessions streams,
// 8 to a stream, end to end: every bucket is granted (the join storm's
// moves need each member's releases, which follow its grants on the
// stream), the live window's keep-alives are renewed on the streams with
// no error, serve holds a goroutine per stream rather than per member,
// and the crashed members' buckets are granted again.
func TestScaleSharedSessions(t *testing.T) {
	if testing.Short() {
		t.Skip("builds keyshard and starts etcd and serve processes; skipped with -short")
	}
	bin := keyshardBinary(t)
	opts := ScaleOptions{
		Binary: bin, Quick: true,
		Scenarios: []string{ScenarioJoinStorm, ScenarioLive, ScenarioCrash},
		Members:   40, Buckets: 256,
		LiveMembers: 48, Keyspaces: 2, LiveBuckets: 64,
		JoinWindow: 500 * time.Millisecond, Window: time.Second,
		LeaseTTL: 3 * time.Second, Budget: 60 * time.Second,
		SessionsPerStream: 8,
	}
	var progress bytes.Buffer
	rep, err := Scale(t.Context(), opts, &progress)
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatal(err)
	}
	if rep.KeepAlives != "shared" || rep.SessionsPerStream != 8 {
		t.Errorf("keep-alives %q, %d sessions per stream; want shared, 8", rep.KeepAlives, rep.SessionsPerStream)
	}
	if r := rep.JoinStorm; r == nil || r.TimedOut || r.Granted != opts.Buckets || r.MembersListed != opts.Members {
		t.Errorf("join storm: %+v; want all %d buckets granted to %d members", r, opts.Buckets, opts.Members)
	}
	if r := rep.Live; r == nil {
		t.Error("no live report")
	} else {
		if r.TimedOut || r.Granted != opts.Keyspaces*opts.LiveBuckets {
			t.Errorf("live: timed out %v, %d buckets granted, want %d", r.TimedOut, r.Granted, opts.Keyspaces*opts.LiveBuckets)
		}
		if r.KeepAlivesPerS <= 0 || r.KeepAlivesOnStreamPct <= 50 || r.Health.KeepAliveErrors != 0 || r.Health.StreamErrors != 0 {
			t.Errorf("live: %.1f keep-alives/s, %.1f%% on streams, health %+v; want keep-alives on the shared streams, without errors", r.KeepAlivesPerS, r.KeepAlivesOnStreamPct, r.Health)
		}
		// 48 members on 6 streams: serve's goroutines are per stream.
		if r.ServeGoroutinesPerMember > 0.5 {
			t.Errorf("live: serve holds %.2f goroutines per member; want about one per 8", r.ServeGoroutinesPerMember)
		}
	}
	if r := rep.Crash; r == nil || r.TimedOut || r.Granted != opts.Buckets || r.RegrantedS <= 0 {
		t.Errorf("crash: %+v; want every bucket granted again", r)
	}
}
