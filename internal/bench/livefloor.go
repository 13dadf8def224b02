package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// LiveFloorReport is the live scenario's traffic against the member API
// with nothing behind it (`keyshard bench echo`: no etcd, no sessions,
// keep-alives answered in batches every 20 ms, as serve answers them).
// The same simulated members, as many, on the same lease TTL and
// connections, join, keep alive and follow their grants as in the live
// scenario; what the echo server's process then takes is what HTTP/2 and
// connect alone cost for that traffic: the floor under serve's figures
// in LiveReport.
type LiveFloorReport struct {
	LiveMembers int     `json:"live_members"`
	LeaseTTLS   float64 `json:"lease_ttl_s"`
	WindowS     float64 `json:"window_s"`
	JoinedS     float64 `json:"joined_s"`
	// KeepAlivesPerS were answered during the window.
	KeepAlivesPerS float64      `json:"keepalives_per_s"`
	Health         MemberHealth `json:"members_health"`
	// The echo server's CPU during the window as % of one core, in total
	// and per 1,000 members, and the bench process's.
	EchoCPUPct        float64 `json:"echo_cpu_pct"`
	EchoCPUPctPer1000 float64 `json:"echo_cpu_pct_per_1000"`
	BenchCPUPct       float64 `json:"bench_cpu_pct"`
	// The echo server's RSS before the members joined and after the
	// window, and the difference per member.
	EchoRSSBeforeBytes    int64   `json:"echo_rss_before_bytes"`
	EchoRSSAfterBytes     int64   `json:"echo_rss_after_bytes"`
	EchoRSSBytesPerMember float64 `json:"echo_rss_bytes_per_member"`
}

// liveFloor runs the live scenario's members against `keyshard bench
// echo` (see LiveFloorReport).
func liveFloor(ctx context.Context, o ScaleOptions, logf logFunc) (_ *LiveFloorReport, err error) {
	e, logs, err := newScaleEnv(o)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := e.close(err != nil); cerr != nil && err == nil {
			logf("live-floor: stopping the echo server: %v", cerr)
		}
	}()
	// Port 0: the echo server prints the port it chose.
	var listening string
	e.serve, listening, err = startChildSaying(ctx, "echo", o.Binary,
		[]string{"bench", "echo", "--listen", "127.0.0.1:0", "--lease-ttl", o.LeaseTTL.String()}, logs, "listening ", 30*time.Second)
	if err != nil {
		return nil, err
	}
	e.url = "http://" + listening
	e.dialMembers()
	echoPid := strconv.Itoa(e.serve.pid())
	procs := func() (echo, self procSample, err error) {
		if echo, err = readProc(echoPid); err != nil {
			return echo, self, fmt.Errorf("echo server: %w", err)
		}
		if self, err = readProc("self"); err != nil {
			return echo, self, fmt.Errorf("bench process: %w", err)
		}
		return echo, self, nil
	}

	mctx, stopMembers := context.WithCancel(ctx)
	f := &fleet{e: e, perConn: o.MembersPerConn, unary: o.UnaryKeepAlives}
	defer func() { stopMembers(); f.wg.Wait(); f.closeConns() }()
	base, _, err := procs()
	if err != nil {
		return nil, err
	}
	logf("live-floor: %d members join the echo server (the member API with nothing behind it)", o.LiveMembers)
	kss, ids := liveMembers(o)
	start := time.Now()
	if _, err := f.joinAll(mctx, kss, ids, 8, o.Budget, logf); err != nil {
		return nil, err
	}
	joined := time.Now()
	// A member's keep-alives go every TTL/3 from its join: one TTL on,
	// every member has its stream open and its keep-alives going.
	logf("live-floor: joined in %.1fs; measuring for %v after one lease TTL (%v)", joined.Sub(start).Seconds(), o.Window, o.LeaseTTL)
	pause(ctx, o.LeaseTTL)
	a, aSelf, err := procs()
	if err != nil {
		return nil, err
	}
	aAt, aOK := time.Now(), f.keepAlivesOK.Load()
	pause(ctx, o.Window)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	b, bSelf, err := procs()
	if err != nil {
		return nil, err
	}
	w := time.Since(aAt).Seconds()
	r := &LiveFloorReport{
		LiveMembers: o.LiveMembers, LeaseTTLS: o.LeaseTTL.Seconds(), WindowS: w,
		JoinedS:               joined.Sub(start).Seconds(),
		KeepAlivesPerS:        float64(f.keepAlivesOK.Load()-aOK) / w,
		Health:                f.health(),
		EchoCPUPct:            100 * (b.cpuS - a.cpuS) / w,
		BenchCPUPct:           100 * (bSelf.cpuS - aSelf.cpuS) / w,
		EchoRSSBeforeBytes:    base.rss,
		EchoRSSAfterBytes:     b.rss,
		EchoRSSBytesPerMember: float64(b.rss-base.rss) / float64(o.LiveMembers),
	}
	r.EchoCPUPctPer1000 = r.EchoCPUPct / (float64(o.LiveMembers) / 1000)
	logf("live-floor: the echo server %.1f%% of a core for %d members (%.2f%% per 1,000); RSS %.0f bytes/member",
		r.EchoCPUPct, o.LiveMembers, r.EchoCPUPctPer1000, r.EchoRSSBytesPerMember)
	return r, nil
}
