package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/internal/freeport"
	"github.com/keyshard/keyshard/internal/store"
)

// Scenarios of Scale, in the order they run.
const (
	ScenarioJoinStorm = "join-storm"
	ScenarioLive      = "live"
	ScenarioLiveFloor = "live-floor"
	ScenarioRouters   = "routers"
	ScenarioCrash     = "crash"
)

// AllScaleScenarios lists every scenario of Scale.
var AllScaleScenarios = []string{ScenarioJoinStorm, ScenarioLive, ScenarioLiveFloor, ScenarioRouters, ScenarioCrash}

// Etcd setups of Scale.
const (
	EtcdEmbedded = "embedded" // one etcd member in its own process
	EtcdCluster3 = "cluster3" // three etcd members on loopback, in one process
)

// The protocols the simulated members may speak (ScaleOptions.Protocol).
const (
	ProtocolGRPC    = "grpc"
	ProtocolConnect = "connect"
)

// ScaleOptions selects what Scale measures. Zero sizes take the issue's
// sizes (or, with Quick, small ones).
type ScaleOptions struct {
	// Binary is the keyshard binary the children run (`keyshard serve`
	// and `keyshard bench etcd`). Required.
	Binary string
	// Scenarios to run, of AllScaleScenarios. Default: all.
	Scenarios []string
	// Etcd is EtcdEmbedded (default) or EtcdCluster3.
	Etcd string
	// Quick shrinks every size and window: a smoke test whose figures are
	// not comparable with the targets.
	Quick bool
	// Members joins the join storm's keyspace, and the crash scenario's.
	// Default 1,000 (Quick: 50).
	Members int
	// Buckets of the join storm's and the crash scenario's keyspace.
	// Default 65,536 (Quick: 1,024).
	Buckets int
	// LiveMembers are spread evenly over Keyspaces keyspaces of
	// LiveBuckets buckets in the live scenario. Defaults 10,000, 100,
	// 1,024 (Quick: 100, 2, 64).
	LiveMembers, Keyspaces, LiveBuckets int
	// Routers follow one keyspace of LiveBuckets buckets in the routers
	// scenario, half of them client.Router (a WatchMap stream each), half
	// GetMap long polls. Default 10,000 (Quick: 200).
	Routers int
	// JoinWindow is the time the join storm's joins are spread over.
	// Default 10 s (Quick: 1 s).
	JoinWindow time.Duration
	// Window is how long the live scenario measures once steady.
	// Default 30 s (Quick: 3 s).
	Window time.Duration
	// LeaseTTL of the keyspaces. Default the server's default, 10 s
	// (Quick: 3 s, so that the crash scenario ends sooner).
	LeaseTTL time.Duration
	// MembersPerConn is how many simulated members share one HTTP/2
	// connection to serve (a transport of their own). 0, the default:
	// every member shares one transport, which opens a connection per
	// serve's limit of concurrent streams (250), as one process hosting
	// many members does; 1 is a fleet of separate processes.
	MembersPerConn int
	// UnaryKeepAlives makes the simulated members keep their sessions
	// alive with KeepAlive calls and follow their grants with
	// WatchGrants, as the Python and Node.js clients do; by default they
	// use a Session stream for both, as the Go SDK does over HTTP/2.
	UnaryKeepAlives bool
	// SessionsPerStream, when above 0, puts that many simulated members
	// on each Sessions stream (MemberService.Sessions), as a process
	// running many members does with the Go SDK's SharedSessionStreams:
	// one stream, and one message per 100 ms (sharedWindow) carrying every
	// keep-alive due, for all of them. 0, the default: a Session stream
	// per member.
	SessionsPerStream int
	// Protocol the simulated members speak: ProtocolGRPC (the default),
	// as the Go SDK does with client.GRPC() and as gRPC clients do, which
	// serve answers with grpc-go's HTTP/2 server; or ProtocolConnect, the
	// Connect protocol over HTTP/2, which net/http's serves. Routers and
	// the bench's own calls speak the Connect protocol on connections of
	// their own.
	Protocol string
	// Budget bounds each wait (for every bucket to be granted, for every
	// router to see an epoch); a wait that runs out is reported as timed
	// out, not as an error. Default 3 minutes (Quick: 60 s).
	Budget time.Duration
	// Logs receives the children's stderr (serve's and etcd's logs).
	// Default: a file in the run's temporary directory, named on error.
	Logs io.Writer
}

func (o *ScaleOptions) defaults() error {
	if o.Binary == "" {
		return errors.New("bench scale: no keyshard binary to run serve and etcd with (ScaleOptions.Binary)")
	}
	if len(o.Scenarios) == 0 {
		o.Scenarios = AllScaleScenarios
	}
	for _, s := range o.Scenarios {
		if !slices.Contains(AllScaleScenarios, s) {
			return fmt.Errorf("bench scale: unknown scenario %q; want some of %s", s, strings.Join(AllScaleScenarios, ", "))
		}
	}
	switch o.Etcd {
	case "":
		o.Etcd = EtcdEmbedded
	case EtcdEmbedded, EtcdCluster3:
	default:
		return fmt.Errorf("bench scale: etcd %q; want %s or %s", o.Etcd, EtcdEmbedded, EtcdCluster3)
	}
	def := func(v *int, full, quick int) {
		if *v == 0 {
			*v = full
			if o.Quick {
				*v = quick
			}
		}
	}
	defD := func(v *time.Duration, full, quick time.Duration) {
		if *v == 0 {
			*v = full
			if o.Quick {
				*v = quick
			}
		}
	}
	def(&o.Members, 1000, 50)
	def(&o.Buckets, 65536, 1024)
	def(&o.LiveMembers, 10000, 100)
	def(&o.Keyspaces, 100, 2)
	def(&o.LiveBuckets, 1024, 64)
	def(&o.Routers, 10000, 200)
	defD(&o.JoinWindow, 10*time.Second, time.Second)
	defD(&o.Window, 30*time.Second, 3*time.Second)
	defD(&o.LeaseTTL, 10*time.Second, 3*time.Second)
	defD(&o.Budget, 3*time.Minute, 60*time.Second)
	for _, c := range []struct {
		name string
		v    int
	}{{"members", o.Members}, {"live members", o.LiveMembers}, {"keyspaces", o.Keyspaces}, {"routers", o.Routers}} {
		if c.v < 2 {
			return fmt.Errorf("bench scale: %s is %d; want at least 2", c.name, c.v)
		}
	}
	for _, b := range []int{o.Buckets, o.LiveBuckets} {
		if b < 1 || b > 65536 {
			return fmt.Errorf("bench scale: buckets %d out of range [1, 65536]", b)
		}
	}
	if o.LiveMembers < o.Keyspaces {
		return fmt.Errorf("bench scale: %d live members cannot fill %d keyspaces", o.LiveMembers, o.Keyspaces)
	}
	if o.LeaseTTL < 2*time.Second {
		return fmt.Errorf("bench scale: lease TTL %v; want at least 2s", o.LeaseTTL)
	}
	switch o.Protocol {
	case "":
		o.Protocol = ProtocolGRPC
	case ProtocolGRPC, ProtocolConnect:
	default:
		return fmt.Errorf("bench scale: protocol %q; want %s or %s", o.Protocol, ProtocolGRPC, ProtocolConnect)
	}
	if o.SessionsPerStream < 0 {
		return fmt.Errorf("bench scale: sessions per stream %d; want 0 (a Session stream per member) or more", o.SessionsPerStream)
	}
	if o.SessionsPerStream > 0 && o.UnaryKeepAlives {
		return errors.New("bench scale: sessions per stream and unary keep-alives together; choose one")
	}
	if o.MembersPerConn < 0 {
		return fmt.Errorf("bench scale: members per connection %d; want 0 (all share one transport) or more", o.MembersPerConn)
	}
	return nil
}

// ScaleReport is the output of `keyshard bench scale --json`: the control
// plane at fleet sizes, with `keyshard serve` and etcd each in its own
// process so that their CPU (utime+stime of /proc/<pid>/stat) and memory
// (VmRSS) are measured apart. Simulated members and routers run in the
// bench process over shared HTTP/2 (h2c) connections. Targets (issue 14):
// join_storm.granted_after_last_join_s ≤ 10 with etcd_writes O(members);
// live.serve_plus_etcd_cpu_pct_per_1000 × live_members/1000 ≤ 30 and
// live.serve_rss_bytes_per_member ≤ 20,480; routers.p99_ms ≤ 1,000;
// crash.regranted_s ≤ crash.lease_ttl_s + 2. live_floor is the live
// scenario's traffic against the member API with nothing behind it, the
// floor under live's figures. Omitted scenarios were not run.
type ScaleReport struct {
	// Etcd is the setup (embedded: one member; cluster3: three on
	// loopback, one process) and EtcdMembers its member count.
	Etcd        string `json:"etcd"`
	EtcdMembers int    `json:"etcd_members"`
	Quick       bool   `json:"quick,omitempty"`
	// MembersPerConn is how many simulated members share a connection
	// (0: all share one transport; see ScaleOptions.MembersPerConn).
	MembersPerConn int `json:"members_per_conn"`
	// KeepAlives is how the simulated members keep their sessions alive:
	// "stream" (on their Session streams), "shared" (SessionsPerStream
	// members on each Sessions stream) or "unary" (KeepAlive calls).
	KeepAlives string `json:"keepalives"`
	// SessionsPerStream is ScaleOptions.SessionsPerStream.
	SessionsPerStream int `json:"sessions_per_stream,omitempty"`
	// Protocol the simulated members speak (ScaleOptions.Protocol).
	Protocol string `json:"protocol"`

	JoinStorm *JoinStormReport `json:"join_storm,omitempty"`
	Live      *LiveReport      `json:"live,omitempty"`
	LiveFloor *LiveFloorReport `json:"live_floor,omitempty"`
	Routers   *RoutersReport   `json:"routers,omitempty"`
	Crash     *CrashReport     `json:"crash,omitempty"`

	DurationS float64 `json:"duration_s"`
}

// TimeSplit is where a scenario's time and CPU went, from the processes'
// /proc figures and the differences of serve's /metrics over the
// scenario's measured span.
type TimeSplit struct {
	// ServeCPUS and EtcdCPUS are CPU seconds (user+system) of the serve
	// and etcd processes; BenchCPUS that of the bench process (the
	// simulated members and routers), which shares the machine.
	ServeCPUS float64 `json:"serve_cpu_s"`
	EtcdCPUS  float64 `json:"etcd_cpu_s"`
	BenchCPUS float64 `json:"bench_cpu_s"`
	// LeaderPlanS is the leader's planning time (keyshard_leader_plan_seconds
	// sum) over LeaderPlans steps; LeaderWriteS the time of its fenced
	// writes (keyshard_leader_write_seconds) over LeaderWrites writes,
	// LeaderWriteFailures of which failed.
	LeaderPlanS         float64 `json:"leader_plan_s"`
	LeaderPlans         int64   `json:"leader_plans"`
	LeaderWriteS        float64 `json:"leader_write_s"`
	LeaderWrites        int64   `json:"leader_writes"`
	LeaderWriteFailures int64   `json:"leader_write_failures"`
	// LeaderWatchLagMeanS is the mean time from a leader write's commit
	// until the leader's own watch delivered it
	// (keyshard_leader_watch_lag_seconds), over LeaderWatchEchoes
	// echoes: how late the leader saw the store. 0 with no echo.
	LeaderWatchLagMeanS float64 `json:"leader_watch_lag_mean_s"`
	LeaderWatchEchoes   int64   `json:"leader_watch_echoes"`
	// MapEpochs, Grants and Moves are the leader's counters
	// (keyshard_map_epochs_total, keyshard_grants_total,
	// keyshard_bucket_moves_total) summed over keyspaces.
	MapEpochs int64 `json:"map_epochs"`
	Grants    int64 `json:"grants"`
	Moves     int64 `json:"moves"`
	// NotSplit names what the figures cannot separate.
	NotSplit []string `json:"not_split"`
}

// notSplit is what no server metric separates today.
var notSplit = []string{
	"watch fan-out: serve has no metric for delivering maps and grants to streams and long polls; it is in serve_cpu_s, and its latency only end to end (routers scenario)",
	"API handling (Join, KeepAlive, GetGrants, Release, Status and ListMembers of this harness) against the leader's work: one process, one CPU figure",
	"etcd CPU by caller (leader writes, keep-alive lease renewals, watches)",
}

// JoinStormReport: Members members join one keyspace of Buckets buckets,
// their joins spread evenly over JoinWindowS.
type JoinStormReport struct {
	Members     int     `json:"members"`
	Buckets     int     `json:"buckets"`
	JoinWindowS float64 `json:"join_window_s"`
	// JoinsS is from the first Join sent to the last member's first
	// KeepAlive answered (a session is granted nothing before it).
	JoinsS float64 `json:"joins_s"`
	// GrantedAfterLastJoinS is from the last join to every bucket
	// granted as the final map assigns it (Status: no bucket unassigned,
	// none awaiting its grant or its release, Members members and none
	// the map leaves without buckets), polled every 100 ms;
	// GrantedAfterFirstJoinS from the first. TimedOut: not reached within
	// the budget (the figures are then the budget).
	GrantedAfterLastJoinS  float64 `json:"granted_after_last_join_s"`
	GrantedAfterFirstJoinS float64 `json:"granted_after_first_join_s"`
	TimedOut               bool    `json:"timed_out,omitempty"`
	// Granted is the buckets granted at the end; MembersListed the
	// members Status counted.
	Granted       int `json:"granted"`
	MembersListed int `json:"members_listed"`
	// EtcdWrites is etcd's revision after minus before: from the first
	// join to every bucket granted (joins and keep-alive activations
	// included).
	EtcdWrites int64 `json:"etcd_writes"`
	// Releases the members made (Release calls) and the buckets in them.
	ReleaseCalls   int64        `json:"release_calls"`
	ReleasedBucket int64        `json:"released_buckets"`
	Health         MemberHealth `json:"members_health"`
	Where          TimeSplit    `json:"where"`
}

// LiveReport: LiveMembers members over Keyspaces keyspaces of Buckets
// buckets, keep-alives every lease TTL / 3 (the SDK's cadence), measured
// over WindowS once every bucket was granted.
type LiveReport struct {
	LiveMembers int     `json:"live_members"`
	Keyspaces   int     `json:"keyspaces"`
	Buckets     int     `json:"buckets"`
	LeaseTTLS   float64 `json:"lease_ttl_s"`
	WindowS     float64 `json:"window_s"`
	// JoinedS is the time to join every member (8 joins in flight),
	// SteadyS from then until every bucket of every keyspace was granted.
	JoinedS  float64 `json:"joined_s"`
	SteadyS  float64 `json:"steady_s"`
	TimedOut bool    `json:"timed_out,omitempty"`
	// Granted is the buckets granted over all keyspaces when the window
	// began.
	Granted int `json:"granted"`
	// KeepAlivesPerS were answered during the window; KeepAliveErrors
	// failed over the whole scenario; SessionsLost ended (NOT_FOUND).
	KeepAlivesPerS float64 `json:"keepalives_per_s"`
	// KeepAlivesOnStreamPct is the share of the window's keep-alives that
	// serve renewed on Session or Sessions streams (the rest: KeepAlive
	// calls).
	KeepAlivesOnStreamPct float64 `json:"keepalives_on_stream_pct"`
	// ChecksOnReplicaPct is the share of the window's checks after
	// batches of renewals that serve's view answered (the rest: a
	// transaction in etcd).
	ChecksOnReplicaPct float64 `json:"keepalive_checks_on_replica_pct"`
	// ConnsGRPC and ConnsHTTP are the connections serve had accepted by
	// the window's end, by the HTTP/2 server that served them
	// (keyshard_api_connections_total): grpc-go's for gRPC, net/http's
	// for the rest (the bench's own calls and the routers, and the
	// members with --protocol connect).
	ConnsGRPC int          `json:"serve_connections_grpc"`
	ConnsHTTP int          `json:"serve_connections_http"`
	Health    MemberHealth `json:"members_health"`
	// CPU during the window as % of one core: in total, and per 1,000
	// members.
	ServeCPUPct             float64 `json:"serve_cpu_pct"`
	EtcdCPUPct              float64 `json:"etcd_cpu_pct"`
	ServeCPUPctPer1000      float64 `json:"serve_cpu_pct_per_1000"`
	EtcdCPUPctPer1000       float64 `json:"etcd_cpu_pct_per_1000"`
	ServePlusEtcdPctPer1000 float64 `json:"serve_plus_etcd_cpu_pct_per_1000"`
	BenchCPUPct             float64 `json:"bench_cpu_pct"`
	// Memory: serve's RSS before the members joined (keyspaces created)
	// and after the window, the difference per member; etcd's RSS after
	// the window and its database size (etcd's status dbSize, and in use).
	ServeRSSBeforeBytes    int64   `json:"serve_rss_before_bytes"`
	ServeRSSAfterBytes     int64   `json:"serve_rss_after_bytes"`
	ServeRSSBytesPerMember float64 `json:"serve_rss_bytes_per_member"`
	EtcdRSSBytes           int64   `json:"etcd_rss_bytes"`
	EtcdDBSizeBytes        int64   `json:"etcd_db_size_bytes"`
	EtcdDBInUseBytes       int64   `json:"etcd_db_in_use_bytes"`
	// Where serve's memory per member went, from its Go runtime's
	// figures (go_memstats_*) at the same two samples: goroutine
	// stacks; the heap's spans in use (live objects and garbage not yet
	// collected, so it swings with the collector's cycle); goroutines.
	// Go lets the heap grow past the live objects by as much again, and
	// by the stacks' used part, before it collects (GOGC=100).
	ServeStackBytesPerMember     float64 `json:"serve_stack_bytes_per_member"`
	ServeHeapInUseBytesPerMember float64 `json:"serve_heap_in_use_bytes_per_member"`
	ServeGoroutinesPerMember     float64 `json:"serve_goroutines_per_member"`
	// EtcdWritesPerS is etcd's revisions per second during the window.
	EtcdWritesPerS float64   `json:"etcd_writes_per_s"`
	Where          TimeSplit `json:"where"`
}

// RoutersReport: Routers routers follow one keyspace of Buckets buckets
// (StreamRouters client.Router on WatchMap streams, PollRouters raw GetMap
// long polls with since_epoch and a 30 s wait), then one member joins.
// A delay is from the new map's write (seen on an etcd watch of the map
// key, or the first router's view if earlier) to one router seeing an
// epoch above the old one.
type RoutersReport struct {
	Routers       int     `json:"routers"`
	StreamRouters int     `json:"stream_routers"`
	PollRouters   int     `json:"poll_routers"`
	Buckets       int     `json:"buckets"`
	P50Ms         float64 `json:"p50_ms"`
	P99Ms         float64 `json:"p99_ms"`
	MaxMs         float64 `json:"max_ms"`
	StreamP99Ms   float64 `json:"stream_p99_ms"`
	PollP99Ms     float64 `json:"poll_p99_ms"`
	// Seen counts routers that saw the epoch within the budget, Missed
	// the others.
	Seen   int `json:"seen"`
	Missed int `json:"missed"`
	// WriteFromJoinMs is from the joining member's first KeepAlive
	// answered to the map's write: negative when the leader wrote the map
	// before that answer reached the bench process (activation is what
	// triggers the map).
	WriteFromJoinMs float64   `json:"write_from_join_ms"`
	Where           TimeSplit `json:"where"`
}

// CrashReport: Members members hold one keyspace of Buckets buckets;
// Crashed of them stop at once without leaving (their keep-alives and
// grant streams cancelled).
type CrashReport struct {
	Members   int     `json:"members"`
	Crashed   int     `json:"crashed"`
	Buckets   int     `json:"buckets"`
	LeaseTTLS float64 `json:"lease_ttl_s"`
	// Orphaned is the buckets the crashed members held.
	Orphaned int `json:"orphaned"`
	// RegrantedS is from the crash to every bucket granted to the
	// survivors as the final map assigns it (polled every 100 ms); the
	// target is TargetS, the lease TTL + 2 s.
	RegrantedS float64 `json:"regranted_s"`
	TargetS    float64 `json:"target_s"`
	TimedOut   bool    `json:"timed_out,omitempty"`
	// Granted and MembersListed at the end.
	Granted       int          `json:"granted"`
	MembersListed int          `json:"members_listed"`
	EtcdWrites    int64        `json:"etcd_writes"`
	Health        MemberHealth `json:"members_health"`
	Where         TimeSplit    `json:"where"`
}

// Scale runs the scenarios of opts, each on a fresh etcd and serve, and
// prints progress to progress.
func Scale(ctx context.Context, opts ScaleOptions, progress io.Writer) (ScaleReport, error) {
	if err := opts.defaults(); err != nil {
		return ScaleReport{}, err
	}
	start := time.Now()
	rep := ScaleReport{Etcd: opts.Etcd, EtcdMembers: 1, Quick: opts.Quick, MembersPerConn: opts.MembersPerConn, KeepAlives: "stream", Protocol: opts.Protocol}
	if opts.UnaryKeepAlives {
		rep.KeepAlives = "unary"
	}
	if opts.SessionsPerStream > 0 {
		rep.KeepAlives, rep.SessionsPerStream = "shared", opts.SessionsPerStream
	}
	if opts.Etcd == EtcdCluster3 {
		rep.EtcdMembers = 3
	}
	var logMu sync.Mutex // joins log their progress from several goroutines
	logf := func(format string, args ...any) {
		line := fmt.Sprintf("[%6.1fs] scale: %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
		logMu.Lock()
		defer logMu.Unlock()
		io.WriteString(progress, line)
	}
	for _, sc := range AllScaleScenarios {
		if !slices.Contains(opts.Scenarios, sc) {
			continue
		}
		if sc == ScenarioLiveFloor { // no etcd, no serve: see liveFloor
			logf("%s: starting the echo server", sc)
			var err error
			if rep.LiveFloor, err = liveFloor(ctx, opts, logf); err != nil {
				return rep, fmt.Errorf("bench scale: %s: %w", sc, err)
			}
			continue
		}
		logf("%s: starting etcd (%s) and serve", sc, opts.Etcd)
		env, err := startScaleEnv(ctx, opts, rep.EtcdMembers)
		if err != nil {
			return rep, fmt.Errorf("bench scale: %s: %w", sc, err)
		}
		switch sc {
		case ScenarioJoinStorm:
			rep.JoinStorm, err = env.joinStorm(ctx, opts, logf)
		case ScenarioLive:
			rep.Live, err = env.live(ctx, opts, logf)
		case ScenarioRouters:
			rep.Routers, err = env.routers(ctx, opts, logf)
		case ScenarioCrash:
			rep.Crash, err = env.crash(ctx, opts, logf)
		}
		cerr := env.close(err != nil) // keep the logs of a failed scenario
		if err != nil {
			return rep, fmt.Errorf("bench scale: %s: %w (logs: %s)", sc, err, env.logName)
		}
		if cerr != nil {
			logf("%s: stopping the children: %v", sc, cerr)
		}
	}
	rep.DurationS = time.Since(start).Seconds()
	return rep, nil
}

// RunEtcd runs an etcd of members members (1 or 3, on loopback) with its
// data under dir until ctx ends, after printing "endpoints <url>,<url>..."
// on out: `keyshard bench etcd`, the etcd process of Scale.
func RunEtcd(ctx context.Context, dir string, members int, out io.Writer) error {
	var endpoints []string
	switch members {
	case 1:
		e, err := store.StartEmbedded(ctx, store.EmbeddedConfig{Dir: dir})
		if err != nil {
			return err
		}
		defer e.Close()
		endpoints = e.Endpoints()
	case 3:
		c, err := store.StartEmbeddedCluster(ctx, dir, 3)
		if err != nil {
			return err
		}
		defer c.Close()
		endpoints = c.Endpoints()
	default:
		return fmt.Errorf("bench etcd: %d members; want 1 or 3", members)
	}
	if _, err := fmt.Fprintf(out, "endpoints %s\n", strings.Join(endpoints, ",")); err != nil {
		return fmt.Errorf("bench etcd: print the endpoints: %w", err)
	}
	<-ctx.Done()
	return nil
}

// scaleEnv is one etcd process and one serve process, and the clients
// the bench process drives them with.
type scaleEnv struct {
	dir       string
	logName   string
	logFile   *os.File
	etcd      *child
	serve     *child
	url       string
	endpoints []string
	hc        *http.Client
	tr        *http.Transport
	grpc      bool // the simulated members speak gRPC
	memberTr  *http.Transport
	member    keyshardv1connect.MemberServiceClient
	maps      keyshardv1connect.MapServiceClient
	sdk       *client.Client
	etcdCli   *clientv3.Client
}

// child is a process of the run; done closes once it has exited.
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // set before done closes
}

func startChild(name, bin string, args []string, stdout io.Writer, logs io.Writer) (*child, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stdout = stdout
	cmd.Stderr = logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s %s): %w", name, bin, strings.Join(args, " "), err)
	}
	c := &child{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { // exits when the process does
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// stop ends the process: SIGTERM, then SIGKILL after 10 s.
func (c *child) stop() error {
	if c == nil {
		return nil
	}
	select {
	case <-c.done:
		return fmt.Errorf("%s had exited already: %v", c.name, c.err)
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-c.done:
		return nil
	case <-t.C:
		_ = c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("%s did not stop within 10s of SIGTERM; killed", c.name)
	}
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// startChildSaying starts a child that prints prefix and a value on the
// first line of its stdout once it is ready (etcd its endpoints, the
// echo server its address), and returns the value.
func startChildSaying(ctx context.Context, name, bin string, args []string, logs io.Writer, prefix string, wait time.Duration) (*child, string, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, "", fmt.Errorf("pipe for %s's first line: %w", name, err)
	}
	c, err := startChild(name, bin, args, pw, logs)
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, "", err
	}
	lines := make(chan string, 1)
	go func() { // exits at the first line, or when the child's stdout closes
		defer pr.Close()
		line, _ := bufio.NewReader(pr).ReadString('\n')
		lines <- line
		_, _ = io.Copy(io.Discard, pr)
	}()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case line := <-lines:
		v, ok := strings.CutPrefix(strings.TrimSpace(line), prefix)
		if !ok {
			return c, "", fmt.Errorf("%s printed %q, not %q and a value", name, line, prefix)
		}
		return c, v, nil
	case <-t.C:
		return c, "", fmt.Errorf("%s did not print %q within %v", name, prefix, wait)
	case <-ctx.Done():
		return c, "", ctx.Err()
	}
}

// newScaleEnv makes a scenario's temporary directory and the writer its
// children log to (opts.Logs, or a file in the directory).
func newScaleEnv(opts ScaleOptions) (_ *scaleEnv, logs io.Writer, err error) {
	e := &scaleEnv{grpc: opts.Protocol != ProtocolConnect}
	if e.dir, err = os.MkdirTemp("", "keyshard-scale-"); err != nil {
		return nil, nil, fmt.Errorf("temporary directory: %w", err)
	}
	if logs = opts.Logs; logs != nil {
		e.logName = "the log writer"
		return e, logs, nil
	}
	e.logName = filepath.Join(e.dir, "children.log")
	if e.logFile, err = os.Create(e.logName); err != nil {
		os.RemoveAll(e.dir)
		return nil, nil, fmt.Errorf("log file: %w", err)
	}
	return e, e.logFile, nil
}

// dialMembers makes the transports and the member API client of the
// simulated members: one HTTP/2 (h2c) transport for every simulated
// member, which opens another connection when one has as many streams as
// the server allows, and another for the routers and the bench's own
// calls. A connection whose first request is gRPC serves only gRPC
// (grpcbridge.Split), so members speaking gRPC and routers speaking the
// Connect protocol do not share one.
func (e *scaleEnv) dialMembers() {
	h2c := func() *http.Transport {
		tr := &http.Transport{Protocols: new(http.Protocols), MaxIdleConnsPerHost: 1024}
		tr.Protocols.SetUnencryptedHTTP2(true)
		return tr
	}
	e.tr, e.memberTr = h2c(), h2c()
	e.hc = &http.Client{Transport: e.tr}
	e.member = keyshardv1connect.NewMemberServiceClient(&http.Client{Transport: e.memberTr}, e.url, e.memberOpts()...)
}

// memberOpts are the simulated members' client options.
func (e *scaleEnv) memberOpts() []connect.ClientOption {
	if e.grpc {
		return []connect.ClientOption{connect.WithGRPC()}
	}
	return nil
}

func startScaleEnv(ctx context.Context, opts ScaleOptions, etcdMembers int) (_ *scaleEnv, err error) {
	e, logs, err := newScaleEnv(opts)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			e.close(e.logFile != nil)
		}
	}()

	// etcd, in its own process.
	var eps string
	e.etcd, eps, err = startChildSaying(ctx, "etcd", opts.Binary, []string{"bench", "etcd", "--dir", filepath.Join(e.dir, "etcd"), "--members", strconv.Itoa(etcdMembers)}, logs, "endpoints ", 90*time.Second)
	if err != nil {
		return nil, err
	}
	e.endpoints = strings.Split(eps, ",")

	// serve, on a free loopback port.
	addrs, err := freeport.Addrs(1)
	if err != nil {
		return nil, err
	}
	addr := addrs[0]
	e.url = "http://" + addr
	e.serve, err = startChild("serve", opts.Binary, []string{"serve", "--listen", addr, "--replica", "bench-scale",
		"--etcd-endpoints", strings.Join(e.endpoints, ","), "--data-dir", filepath.Join(e.dir, "serve"),
		"--max-long-polls", "1048576", "--log-level", "warn"}, nil, logs)
	if err != nil {
		return nil, err
	}

	e.dialMembers()
	e.maps = keyshardv1connect.NewMapServiceClient(e.hc, e.url)
	if e.sdk, err = client.Dial(e.url, client.HTTPClient(e.hc)); err != nil {
		return nil, fmt.Errorf("dial serve at %s: %w", e.url, err)
	}
	if e.etcdCli, err = clientv3.New(clientv3.Config{Endpoints: e.endpoints, DialTimeout: 5 * time.Second}); err != nil {
		return nil, fmt.Errorf("etcd client for %v: %w", e.endpoints, err)
	}
	if err := e.waitLeader(ctx); err != nil {
		return nil, err
	}
	return e, nil
}

// waitLeader waits until serve is ready and names a leader.
func (e *scaleEnv) waitLeader(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		select {
		case <-e.serve.done:
			return fmt.Errorf("serve exited while starting: %v", e.serve.err)
		case <-ctx.Done():
			return fmt.Errorf("serve at %s not ready with a leader within 60s: %v", e.url, last)
		case <-tick.C:
		}
		st, err := e.sdk.Admin().Status(ctx)
		switch {
		case err != nil:
			last = err
		case st.Leader == "":
			last = errors.New("no leader yet")
		default:
			return nil
		}
	}
}

// close stops the children and removes the run's directory, unless keep
// is set or a child would not stop (the logs are there).
func (e *scaleEnv) close(keep bool) error {
	var errs []error
	if e.sdk != nil {
		e.sdk.Close()
	}
	if e.tr != nil {
		e.tr.CloseIdleConnections()
		e.memberTr.CloseIdleConnections()
	}
	if e.etcdCli != nil {
		e.etcdCli.Close()
	}
	errs = append(errs, e.serve.stop(), e.etcd.stop())
	if e.logFile != nil {
		e.logFile.Close()
	}
	if err := errors.Join(errs...); err != nil {
		return err // keep the directory and its logs
	}
	if keep {
		return nil
	}
	return os.RemoveAll(e.dir)
}

func (e *scaleEnv) createKeyspace(ctx context.Context, name string, buckets int, ttl time.Duration) error {
	_, err := e.sdk.Admin().CreateKeyspace(ctx, client.KeyspaceConfig{Name: name, Buckets: buckets, LeaseTTL: ttl, DrainTimeout: 30 * time.Second})
	if err != nil {
		return fmt.Errorf("create keyspace %s (%d buckets): %w", name, buckets, err)
	}
	return nil
}

// --- measurements ---

// procSample is a process's CPU seconds and resident memory.
type procSample struct {
	cpuS float64
	rss  int64
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

func readProc(pid string) (procSample, error) {
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return procSample{}, fmt.Errorf("read CPU time of process %s: %w", pid, err)
	}
	// Fields after the command name (which may hold spaces) in parentheses.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return procSample{}, fmt.Errorf("/proc/%s/stat: %d fields after the name; want at least 13", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64) // field 14, utime
	st, err2 := strconv.ParseInt(f[12], 10, 64) // field 15, stime
	if err := errors.Join(err1, err2); err != nil {
		return procSample{}, fmt.Errorf("/proc/%s/stat: utime/stime: %w", pid, err)
	}
	status, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return procSample{}, fmt.Errorf("read memory of process %s: %w", pid, err)
	}
	var rss int64
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return procSample{}, fmt.Errorf("/proc/%s/status: VmRSS %q: %w", pid, v, err)
			}
			rss = kb << 10
		}
	}
	return procSample{cpuS: float64(ut+st) / clockTicks, rss: rss}, nil
}

// sample is everything measured at one instant of a scenario.
type sample struct {
	at           time.Time
	serve, etcd  procSample
	bench        procSample
	rev          int64
	metrics      map[string]float64
	dbSize       int64
	dbSizeInUse  int64
	keepAlivesOK int64
}

func (e *scaleEnv) sample(ctx context.Context) (sample, error) {
	s := sample{at: time.Now()}
	var err error
	if s.serve, err = readProc(strconv.Itoa(e.serve.pid())); err != nil {
		return s, fmt.Errorf("serve: %w", err)
	}
	if s.etcd, err = readProc(strconv.Itoa(e.etcd.pid())); err != nil {
		return s, fmt.Errorf("etcd: %w", err)
	}
	if s.bench, err = readProc("self"); err != nil {
		return s, fmt.Errorf("bench process: %w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := e.etcdCli.Status(sctx, e.endpoints[0])
	if err != nil {
		return s, fmt.Errorf("etcd status at %s: %w", e.endpoints[0], err)
	}
	s.rev, s.dbSize, s.dbSizeInUse = st.Header.Revision, st.DbSize, st.DbSizeInUse
	if s.metrics, err = e.scrape(sctx); err != nil {
		return s, err
	}
	return s, nil
}

// keptSeries are series that scrape also keeps apart, by their labels.
var keptSeries = map[string]bool{keepAlivesOnStream: true, keepAlivesShared: true, keepAliveChecksOnReplica: true, connsGRPC: true, connsHTTP: true}

// keepAlivesOnStream and keepAlivesShared are serve's counts of
// keep-alives renewed on Session streams and on Sessions streams.
const (
	keepAlivesOnStream = `keyshard_member_keepalives_total{result="renewed",via="stream"}`
	keepAlivesShared   = `keyshard_member_keepalives_total{result="renewed",via="shared"}`
)

// keepAliveChecksOnReplica is serve's count of keep-alive batch checks
// its view answered (the rest went to etcd).
const keepAliveChecksOnReplica = `keyshard_member_keepalive_checks_total{by="replica"}`

// connsGRPC and connsHTTP are serve's counts of API connections by the
// HTTP/2 server that serves them.
const (
	connsGRPC = `keyshard_api_connections_total{server="grpc"}`
	connsHTTP = `keyshard_api_connections_total{server="http"}`
)

// scrape reads serve's /metrics and sums each series over its labels
// (keptSeries are also kept apart).
func (e *scaleEnv) scrape(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.url+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape serve's /metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape serve's /metrics: %s", resp.Status)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		series := line[:sp]
		name := series
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		m[name] += v
		if keptSeries[series] {
			m[series] = v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read serve's /metrics: %w", err)
	}
	return m, nil
}

// split is where the time went between two samples.
func split(a, b sample) TimeSplit {
	d := func(name string) float64 { return b.metrics[name] - a.metrics[name] }
	return TimeSplit{
		ServeCPUS:           b.serve.cpuS - a.serve.cpuS,
		EtcdCPUS:            b.etcd.cpuS - a.etcd.cpuS,
		BenchCPUS:           b.bench.cpuS - a.bench.cpuS,
		LeaderPlanS:         d("keyshard_leader_plan_seconds_sum"),
		LeaderPlans:         int64(d("keyshard_leader_plan_seconds_count")),
		LeaderWriteS:        d("keyshard_leader_write_seconds_sum"),
		LeaderWrites:        int64(d("keyshard_leader_write_seconds_count")),
		LeaderWriteFailures: int64(d("keyshard_leader_write_failures_total")),
		LeaderWatchLagMeanS: mean(d("keyshard_leader_watch_lag_seconds_sum"), d("keyshard_leader_watch_lag_seconds_count")),
		LeaderWatchEchoes:   int64(d("keyshard_leader_watch_lag_seconds_count")),
		MapEpochs:           int64(d("keyshard_map_epochs_total")),
		Grants:              int64(d("keyshard_grants_total")),
		Moves:               int64(d("keyshard_bucket_moves_total")),
		NotSplit:            notSplit,
	}
}

// mean is sum / n, or 0 when n is 0.
func mean(sum, n float64) float64 {
	if n <= 0 {
		return 0
	}
	return sum / n
}

// grantState is a keyspace's grants as Status shows them.
type grantState struct {
	members, granted int
	// handoffs: buckets whose target has no grant yet; waiting: active
	// members the map gives no bucket (a map the leader holds back).
	handoffs, waiting int
	// settled: every bucket is granted to its target owner, none is
	// releasing, the map gives every active member buckets (while there
	// are buckets enough: a join the leader holds back for the rebalance
	// gap leaves it none yet), and wantMembers are listed.
	settled bool
}

// grantsOf is k's grantState.
func grantsOf(k client.KeyspaceStatus, wantMembers int) grantState {
	buckets := k.Keyspace.Buckets
	return grantState{
		members: k.Members,
		// Held by their target owner, and held by another until released.
		granted:  buckets - k.UnassignedBuckets - k.HandoffsInFlight + k.ReleasingBuckets,
		handoffs: k.HandoffsInFlight,
		waiting:  k.MembersWithoutBuckets,
		settled: k.Members == wantMembers && k.UnassignedBuckets == 0 && k.HandoffsInFlight == 0 && k.ReleasingBuckets == 0 &&
			k.MembersWithoutBuckets <= max(k.Members-buckets, 0), // more members than buckets: the surplus holds none
	}
}

// waitSettled polls the keyspaces every 100 ms until each is settled
// with want[i] members, or budget runs out (timedOut, not an error).
func (e *scaleEnv) waitSettled(ctx context.Context, kss []string, buckets int, want []int, budget time.Duration, logf logFunc) (at time.Time, states []grantState, timedOut bool, err error) {
	start := time.Now()
	deadline := start.Add(budget)
	nextLog := start.Add(2 * time.Second)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	states = make([]grantState, len(kss))
	done := make([]bool, len(kss))
	for {
		// One Status for every keyspace.
		var st client.Status
		if st, err = e.sdk.Admin().Status(ctx); err != nil {
			return time.Time{}, states, false, fmt.Errorf("status: %w", err)
		}
		byName := make(map[string]client.KeyspaceStatus, len(st.Keyspaces))
		for _, k := range st.Keyspaces {
			byName[k.Keyspace.Name] = k
		}
		all := true
		for i, ks := range kss {
			if done[i] {
				continue
			}
			k, ok := byName[ks]
			if !ok {
				return time.Time{}, states, false, fmt.Errorf("status lists no keyspace %s", ks)
			}
			states[i] = grantsOf(k, want[i])
			done[i] = states[i].settled
			all = all && done[i]
		}
		now := time.Now()
		if all {
			return now, states, false, nil
		}
		if now.After(deadline) {
			return now, states, true, nil
		}
		if now.After(nextLog) { // a long wait shows its progress
			nextLog = now.Add(2 * time.Second)
			settled, granted, members, handoffs, waiting := 0, 0, 0, 0, 0
			for i := range kss {
				if done[i] {
					settled++
				}
				granted += states[i].granted
				members += states[i].members
				handoffs += states[i].handoffs
				waiting += states[i].waiting
			}
			logf("  %.0fs: %d of %d keyspaces settled; %d of %d buckets granted (%d handoffs in flight), %d members listed (%d without buckets)", now.Sub(start).Seconds(), settled, len(kss), granted, buckets*len(kss), handoffs, members, waiting)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, states, false, ctx.Err()
		case <-e.serve.done:
			return time.Time{}, states, false, fmt.Errorf("serve exited: %v", e.serve.err)
		case <-tick.C:
		}
	}
}

// --- simulated members ---

// fleet owns the simulated members' goroutines.
type fleet struct {
	e  *scaleEnv
	wg sync.WaitGroup

	// perConn members share each of conns (0: all use e.member).
	perConn int
	// unary: keep-alives are KeepAlive calls and grants come on
	// WatchGrants, rather than both on a Session stream.
	unary bool
	// perStream: members share Sessions streams, perStream each (0: a
	// Session stream each).
	perStream    int
	mu           sync.Mutex
	joined       int
	joinedShared int             // (mu) members given a group
	groups       []*sessionGroup // (mu)
	conns        []*http.Transport
	api          []keyshardv1connect.MemberServiceClient

	keepAlivesOK, keepAliveErrs, sessionsLost atomic.Int64
	// keepAliveCodes counts the failed keep-alives by code (under mu),
	// with the first error of each.
	keepAliveCodes                   map[string]*codeCount
	releaseCalls, releasedBuckets    atomic.Int64
	releaseErrs, streamErrs          atomic.Int64
	rejoins, rejoinErrs, joinRetries atomic.Int64
}

// MemberHealth is what went wrong with the simulated members' sessions.
type MemberHealth struct {
	// KeepAliveErrors counts keep-alives that failed (not NOT_FOUND);
	// SessionsLost sessions that ended under a member still running
	// (NOT_FOUND: its lease expired or it was revoked), Rejoins the new
	// sessions members took after, RejoinErrors failed attempts.
	KeepAliveErrors int64 `json:"keepalive_errors"`
	// KeepAliveErrorCodes splits KeepAliveErrors by the error's code
	// (deadline_exceeded for one unanswered within TTL/3), each with the
	// first error seen: what a failed keep-alive ran into.
	KeepAliveErrorCodes map[string]*codeCount `json:"keepalive_error_codes,omitempty"`
	SessionsLost        int64                 `json:"sessions_lost"`
	Rejoins             int64                 `json:"rejoins"`
	RejoinErrors        int64                 `json:"rejoin_errors"`
	// JoinRetries counts Joins (and first KeepAlives) retried because
	// the server could not serve them (UNAVAILABLE, a deadline).
	JoinRetries int64 `json:"join_retries"`
	// ReleaseErrors and StreamErrors count failed Release calls and
	// Session (or WatchGrants) streams that broke.
	ReleaseErrors int64 `json:"release_errors"`
	StreamErrors  int64 `json:"stream_errors"`
}

// codeCount is how many calls failed with one code, and the first
// error's text.
type codeCount struct {
	N     int64  `json:"n"`
	First string `json:"first"`
}

// keepAliveFailed counts a keep-alive that failed with err.
func (f *fleet) keepAliveFailed(err error) {
	f.keepAliveErrs.Add(1)
	code := connect.CodeOf(err).String()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.keepAliveCodes == nil {
		f.keepAliveCodes = map[string]*codeCount{}
	}
	c := f.keepAliveCodes[code]
	if c == nil {
		c = &codeCount{First: err.Error()}
		f.keepAliveCodes[code] = c
	}
	c.N++
}

func (f *fleet) health() MemberHealth {
	f.mu.Lock()
	codes := make(map[string]*codeCount, len(f.keepAliveCodes))
	for code, c := range f.keepAliveCodes {
		codes[code] = &codeCount{N: c.N, First: c.First}
	}
	f.mu.Unlock()
	return MemberHealth{
		KeepAliveErrors: f.keepAliveErrs.Load(), KeepAliveErrorCodes: codes, SessionsLost: f.sessionsLost.Load(),
		Rejoins: f.rejoins.Load(), RejoinErrors: f.rejoinErrs.Load(), JoinRetries: f.joinRetries.Load(),
		ReleaseErrors: f.releaseErrs.Load(), StreamErrors: f.streamErrs.Load(),
	}
}

// simMember is one simulated member: a session kept alive at the SDK's
// cadence (lease TTL / 3), its grants followed, both on a Session stream
// (or KeepAlive calls and a WatchGrants stream: fleet.unary), and every
// bucket it is asked to release released at once (a handler that returns
// immediately). session and ttl belong to the member's run goroutine
// once join returned.
type simMember struct {
	keyspace, id, session string
	ttl                   time.Duration
	stop                  context.CancelFunc
	api                   keyshardv1connect.MemberServiceClient

	mu     sync.Mutex
	stream *sessionConn // (mu) the open Session stream; nil: none
}

// sessionConn is a simulated member's open Session stream: its follow
// goroutine receives, its keep goroutine sends keep-alives on it.
type sessionConn struct {
	st      *connect.BidiStreamForClient[keyshardv1.SessionRequest, keyshardv1.SessionResponse]
	answers chan *keyshardv1.KeepAliveAnswer // cap 1: one keep-alive in flight
	ended   chan struct{}                    // closed when the stream ends
	n       uint64                           // the last keep-alive's number (keep's)

	sendMu sync.Mutex  // serializes Send
	closed atomic.Bool // CloseRequest was called
}

// close ends the sending side of c: when its follow goroutine is done,
// and when the member stops. An HTTP/2 transport still reading a
// request body sees no cancelled context, so only the body's end lets
// the stream's Receive return. connect's CloseRequest and Send meet only
// at the body's io.Pipe, whose Close is safe alongside a Write, so close
// does not wait for sendMu.
func (c *sessionConn) close() {
	if c.closed.CompareAndSwap(false, true) {
		_ = c.st.CloseRequest()
	}
}

func (c *sessionConn) send(msg *keyshardv1.SessionRequest) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if c.closed.Load() {
		return connect.NewError(connect.CodeUnavailable, errors.New("session stream ended"))
	}
	return c.st.Send(msg)
}

// keepAlive sends a keep-alive on c and waits for its answer, the end of
// the stream, or ctx.
func (c *sessionConn) keepAlive(ctx context.Context) error {
	c.n++
	if err := c.send(&keyshardv1.SessionRequest{KeepAlive: c.n}); err != nil {
		return err
	}
	for {
		select {
		case a := <-c.answers:
			if a.GetKeepAlive() != c.n {
				continue // the answer to one that timed out
			}
			if a.GetErrorCode() != "" {
				var code connect.Code
				if err := code.UnmarshalText([]byte(a.GetErrorCode())); err != nil {
					code = connect.CodeUnknown
				}
				return connect.NewError(code, errors.New(a.GetErrorMessage()))
			}
			return nil
		case <-c.ended:
			return connect.NewError(connect.CodeUnavailable, errors.New("session stream ended"))
		case <-ctx.Done():
			return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
		}
	}
}

func (m *simMember) conn() *sessionConn {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stream
}

func (m *simMember) setConn(c *sessionConn) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stream = c
}

// client returns the member API client of the next member to join: every
// perConn members get a transport, so a connection, of their own.
func (f *fleet) client() keyshardv1connect.MemberServiceClient {
	if f.perConn <= 0 {
		return f.e.member
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.joined%f.perConn == 0 {
		tr := &http.Transport{Protocols: new(http.Protocols)}
		tr.Protocols.SetUnencryptedHTTP2(true)
		f.conns = append(f.conns, tr)
		f.api = append(f.api, keyshardv1connect.NewMemberServiceClient(&http.Client{Transport: tr}, f.e.url, f.e.memberOpts()...))
	}
	f.joined++
	return f.api[len(f.api)-1]
}

// closeConns closes the fleet's own connections, once its members ended.
func (f *fleet) closeConns() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, tr := range f.conns {
		tr.CloseIdleConnections()
	}
}

// join joins one member and activates its session (first KeepAlive);
// the member then runs until crash or ctx ends, joining again with a new
// session if it loses one, as the SDK's Worker does.
func (f *fleet) join(ctx context.Context, ks, id string) (*simMember, error) {
	if f.perStream > 0 {
		return f.joinShared(ctx, ks, id)
	}
	m := &simMember{keyspace: ks, id: id, api: f.client()}
	if err := f.session(ctx, m); err != nil {
		return nil, err
	}
	mctx, cancel := context.WithCancel(ctx)
	m.stop = cancel
	f.wg.Go(func() { f.run(mctx, m) }) // exits when mctx ends
	return m, nil
}

// session joins m with a new session and activates it. Like the SDK's
// Worker it retries a Join or first KeepAlive the server could not serve
// (UNAVAILABLE, a deadline), backing off from 200 ms up to the lease TTL,
// at most 8 times; a retry replaces the session the failed attempt may
// have left (never activated, so holding nothing).
func (f *fleet) session(ctx context.Context, m *simMember) error {
	wait := 200 * time.Millisecond
	for attempt := 0; ; attempt++ {
		err := f.trySession(ctx, m, attempt > 0)
		if err == nil || ctx.Err() != nil || attempt == 7 {
			return err
		}
		if c := connect.CodeOf(err); c != connect.CodeUnavailable && c != connect.CodeDeadlineExceeded {
			return err
		}
		f.joinRetries.Add(1)
		pause(ctx, wait)
		wait = min(2*wait, max(m.ttl, time.Second))
	}
}

func (f *fleet) trySession(ctx context.Context, m *simMember, replace bool) error {
	resp, err := m.api.Join(ctx, connect.NewRequest(&keyshardv1.JoinRequest{Keyspace: m.keyspace, Member: &keyshardv1.Member{Id: m.id, Address: m.id + ":1"}, Replace: replace}))
	if err != nil {
		return fmt.Errorf("join %s as %s: %w", m.keyspace, m.id, err)
	}
	m.session, m.ttl = resp.Msg.GetSession(), resp.Msg.GetLeaseTtl().AsDuration()
	if m.ttl <= 0 {
		return fmt.Errorf("join %s as %s: lease TTL %v", m.keyspace, m.id, m.ttl)
	}
	if _, err := m.api.KeepAlive(ctx, connect.NewRequest(&keyshardv1.KeepAliveRequest{Session: m.session})); err != nil {
		return fmt.Errorf("first keep-alive of %s/%s: %w", m.keyspace, m.id, err)
	}
	f.keepAlivesOK.Add(1)
	return nil
}

// run serves m's sessions until ctx ends: keep-alives and grants of
// each, then a new Join when one is lost (after 1 s, then every TTL).
func (f *fleet) run(ctx context.Context, m *simMember) {
	for ctx.Err() == nil {
		sctx, lost := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { f.keep(sctx, m, lost) })   // exits when sctx ends or the session is lost
		wg.Go(func() { f.follow(sctx, m, lost) }) // exits when sctx ends or the session is lost
		wg.Wait()
		lost()
		if ctx.Err() != nil {
			return
		}
		f.sessionsLost.Add(1)
		for wait := time.Second; ; wait = m.ttl {
			pause(ctx, wait)
			if ctx.Err() != nil {
				return
			}
			if err := f.session(ctx, m); err == nil {
				f.rejoins.Add(1)
				break
			}
			f.rejoinErrs.Add(1)
		}
	}
}

func (f *fleet) keep(ctx context.Context, m *simMember, lost context.CancelFunc) {
	t := time.NewTicker(m.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, m.ttl/3)
		var err error
		if c := m.conn(); c != nil {
			err = c.keepAlive(cctx)
		} else {
			_, err = m.api.KeepAlive(cctx, connect.NewRequest(&keyshardv1.KeepAliveRequest{Session: m.session}))
		}
		cancel()
		switch {
		case err == nil:
			f.keepAlivesOK.Add(1)
		case ctx.Err() != nil:
			return
		case connect.CodeOf(err) == connect.CodeNotFound:
			lost()
			return
		default:
			f.keepAliveFailed(err)
		}
	}
}

func (f *fleet) follow(ctx context.Context, m *simMember, lost context.CancelFunc) {
	g := grantsFollower{f: f, m: m, released: map[[2]uint64]bool{}}
	for ctx.Err() == nil {
		var err error
		if f.unary {
			err = g.watch(ctx)
		} else {
			err = g.session(ctx)
		}
		if ctx.Err() == nil {
			if connect.CodeOf(err) == connect.CodeNotFound {
				lost() // the session is gone
				return
			}
			f.streamErrs.Add(1)
			pause(ctx, 100*time.Millisecond)
		}
	}
}

// grantsFollower is a simulated member's follow goroutine: what it has
// released and the newest revision it has seen, across its streams.
type grantsFollower struct {
	f        *fleet
	m        *simMember
	released map[[2]uint64]bool // (bucket, token) released successfully
	minRev   uint64
}

// watch follows the grants on one WatchGrants stream, until it ends.
func (g *grantsFollower) watch(ctx context.Context) error {
	st, err := g.m.api.WatchGrants(ctx, connect.NewRequest(&keyshardv1.WatchGrantsRequest{Session: g.m.session, MinRevision: g.minRev}))
	if err != nil {
		return err
	}
	for st.Receive() {
		g.apply(ctx, st.Msg())
	}
	st.Close()
	return st.Err()
}

// session follows the grants on one Session stream, until it ends, and
// answers the keep-alives the member's keep goroutine sends on it.
func (g *grantsFollower) session(ctx context.Context) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st := g.m.api.Session(sctx)
	if err := st.Send(&keyshardv1.SessionRequest{Session: g.m.session, MinRevision: g.minRev}); err != nil {
		_ = st.CloseResponse()
		return err
	}
	c := &sessionConn{st: st, answers: make(chan *keyshardv1.KeepAliveAnswer, 1), ended: make(chan struct{})}
	g.m.setConn(c)
	stop := context.AfterFunc(sctx, c.close)
	defer func() {
		stop()
		g.m.setConn(nil)
		close(c.ended)
		c.close()
		_ = st.CloseResponse()
	}()
	for {
		msg, err := st.Receive()
		if err != nil {
			return err
		}
		if a := msg.GetKeepAlive(); a != nil {
			select {
			case c.answers <- a:
			default: // an answer nobody waits for any more
			}
		}
		if gr := msg.GetGrants(); gr != nil {
			g.apply(ctx, gr)
		}
	}
}

// apply releases at once every bucket msg asks the member to release.
func (g *grantsFollower) apply(ctx context.Context, msg *keyshardv1.GetGrantsResponse) {
	g.minRev = max(g.minRev, msg.GetRevision())
	if len(msg.GetRelease()) == 0 {
		return
	}
	want := map[uint32]bool{}
	for _, b := range msg.GetRelease() {
		want[b] = true
	}
	var rel []*keyshardv1.BucketGrant
	for _, gr := range msg.GetGrants() {
		if want[gr.GetBucket()] && !g.released[[2]uint64{uint64(gr.GetBucket()), gr.GetToken()}] {
			rel = append(rel, gr)
		}
	}
	if len(rel) == 0 {
		return
	}
	resp, err := g.m.api.Release(ctx, connect.NewRequest(&keyshardv1.ReleaseRequest{Session: g.m.session, Buckets: rel}))
	if err != nil {
		if ctx.Err() == nil {
			g.f.releaseErrs.Add(1)
		}
		return
	}
	g.minRev = max(g.minRev, resp.Msg.GetRevision())
	g.f.releaseCalls.Add(1)
	g.f.releasedBuckets.Add(int64(len(rel)))
	for _, gr := range rel {
		g.released[[2]uint64{uint64(gr.GetBucket()), gr.GetToken()}] = true
	}
}

// pause waits d, or until ctx ends: a retry's backoff.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// joinAll joins ids[i] into kss[i] with at most inflight joins at once,
// and returns the members in order. It logs every tenth of the way, and
// stops starting joins once budget has passed (an error naming how many
// joined).
func (f *fleet) joinAll(ctx context.Context, kss, ids []string, inflight int, budget time.Duration, logf logFunc) ([]*simMember, error) {
	ms := make([]*simMember, len(ids))
	errs := make([]error, len(ids))
	sem := make(chan struct{}, inflight)
	var wg sync.WaitGroup
	var joined atomic.Int64
	start := time.Now()
	step := max(len(ids)/10, 1)
	for i := range ids {
		sem <- struct{}{}
		if time.Since(start) > budget {
			<-sem
			wg.Wait()
			return ms, fmt.Errorf("joins: %d of %d members joined within %v", joined.Load(), len(ids), budget)
		}
		wg.Go(func() { // exits once the join returned
			defer func() { <-sem }()
			if ms[i], errs[i] = f.join(ctx, kss[i], ids[i]); errs[i] == nil {
				if n := joined.Add(1); n%int64(step) == 0 {
					logf("  %d of %d members joined (%.1fs)", n, len(ids), time.Since(start).Seconds())
				}
			}
		})
	}
	wg.Wait()
	return ms, firstErr(errs)
}

// firstErr reports how many of errs are set, and the first.
func firstErr(errs []error) error {
	var first error
	n := 0
	for _, err := range errs {
		if err != nil {
			n++
			if first == nil {
				first = err
			}
		}
	}
	if n == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d failed, the first: %w", n, len(errs), first)
}

// --- scenarios ---

type logFunc func(format string, args ...any)

func (e *scaleEnv) joinStorm(ctx context.Context, o ScaleOptions, logf logFunc) (*JoinStormReport, error) {
	const ks = "scale-join-storm"
	if err := e.createKeyspace(ctx, ks, o.Buckets, o.LeaseTTL); err != nil {
		return nil, err
	}
	mctx, stopMembers := context.WithCancel(ctx)
	f := &fleet{e: e, perConn: o.MembersPerConn, unary: o.UnaryKeepAlives, perStream: o.SessionsPerStream}
	defer func() { stopMembers(); f.wg.Wait(); f.closeConns() }()

	before, err := e.sample(ctx)
	if err != nil {
		return nil, fmt.Errorf("sample before the joins: %w", err)
	}
	logf("join-storm: %d members join %s (%d buckets) over %v", o.Members, ks, o.Buckets, o.JoinWindow)
	first := time.Now()
	var lastMu sync.Mutex
	var last time.Time
	errs := make([]error, o.Members)
	var joins sync.WaitGroup
	for i := range o.Members {
		at := first.Add(time.Duration(int64(o.JoinWindow) * int64(i) / int64(o.Members)))
		if d := time.Until(at); d > 0 {
			pause(ctx, d) // pacing the joins, not synchronisation
		}
		joins.Go(func() { // exits once the join returned
			if _, errs[i] = f.join(mctx, ks, fmt.Sprintf("m%05d", i)); errs[i] == nil {
				lastMu.Lock()
				last = time.Now()
				lastMu.Unlock()
			}
		})
	}
	joins.Wait()
	if err := firstErr(errs); err != nil {
		return nil, err
	}
	logf("join-storm: joined in %.2fs; waiting for every bucket to be granted", last.Sub(first).Seconds())
	at, states, timedOut, err := e.waitSettled(ctx, []string{ks}, o.Buckets, []int{o.Members}, o.Budget, logf)
	if err != nil {
		return nil, err
	}
	after, err := e.sample(ctx)
	if err != nil {
		return nil, fmt.Errorf("sample after the storm: %w", err)
	}
	r := &JoinStormReport{
		Members: o.Members, Buckets: o.Buckets, JoinWindowS: o.JoinWindow.Seconds(),
		JoinsS:                 last.Sub(first).Seconds(),
		GrantedAfterLastJoinS:  at.Sub(last).Seconds(),
		GrantedAfterFirstJoinS: at.Sub(first).Seconds(),
		TimedOut:               timedOut,
		Granted:                states[0].granted, MembersListed: states[0].members,
		EtcdWrites:   after.rev - before.rev,
		ReleaseCalls: f.releaseCalls.Load(), ReleasedBucket: f.releasedBuckets.Load(),
		Health: f.health(),
		Where:  split(before, after),
	}
	logf("join-storm: every bucket granted %.2fs after the last join (timed out: %v), %d etcd writes", r.GrantedAfterLastJoinS, timedOut, r.EtcdWrites)
	return r, nil
}

// liveKeyspace names the live scenario's keyspace i.
func liveKeyspace(i int) string { return fmt.Sprintf("scale-live-%03d", i) }

// liveMembers names the live scenario's members (the live-floor's too):
// member i of ids joins keyspace kss[i], the keyspaces taking turns.
func liveMembers(o ScaleOptions) (kss, ids []string) {
	kss, ids = make([]string, o.LiveMembers), make([]string, o.LiveMembers)
	for i := range ids {
		kss[i] = liveKeyspace(i % o.Keyspaces)
		ids[i] = fmt.Sprintf("m%05d", i)
	}
	return kss, ids
}

func (e *scaleEnv) live(ctx context.Context, o ScaleOptions, logf logFunc) (*LiveReport, error) {
	kss := make([]string, o.Keyspaces)
	for i := range kss {
		kss[i] = liveKeyspace(i)
		if err := e.createKeyspace(ctx, kss[i], o.LiveBuckets, o.LeaseTTL); err != nil {
			return nil, err
		}
	}
	mctx, stopMembers := context.WithCancel(ctx)
	f := &fleet{e: e, perConn: o.MembersPerConn, unary: o.UnaryKeepAlives, perStream: o.SessionsPerStream}
	defer func() { stopMembers(); f.wg.Wait(); f.closeConns() }()
	base, err := e.sample(ctx)
	if err != nil {
		return nil, fmt.Errorf("sample before the joins: %w", err)
	}
	logf("live: %d members join %d keyspaces of %d buckets", o.LiveMembers, o.Keyspaces, o.LiveBuckets)
	memberKs, ids := liveMembers(o)
	want := make([]int, o.Keyspaces)
	for i := range ids {
		want[i%o.Keyspaces]++
	}
	start := time.Now()
	if _, err := f.joinAll(mctx, memberKs, ids, 8, o.Budget, logf); err != nil {
		return nil, err
	}
	joined := time.Now()
	logf("live: joined in %.1fs; waiting until every bucket is granted", joined.Sub(start).Seconds())
	steadyAt, states, timedOut, err := e.waitSettled(ctx, kss, o.LiveBuckets, want, o.Budget, logf)
	if err != nil {
		return nil, err
	}
	granted := 0
	for _, s := range states {
		granted += s.granted
	}
	logf("live: steady after %.1fs (timed out: %v); measuring for %v", steadyAt.Sub(joined).Seconds(), timedOut, o.Window)
	a, err := e.sample(ctx)
	if err != nil {
		return nil, fmt.Errorf("sample at the window's start: %w", err)
	}
	a.keepAlivesOK = f.keepAlivesOK.Load()
	pause(ctx, o.Window) // the measured window
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	b, err := e.sample(ctx)
	if err != nil {
		return nil, fmt.Errorf("sample at the window's end: %w", err)
	}
	b.keepAlivesOK = f.keepAlivesOK.Load()
	w := b.at.Sub(a.at).Seconds()
	per := float64(o.LiveMembers) / 1000
	r := &LiveReport{
		LiveMembers: o.LiveMembers, Keyspaces: o.Keyspaces, Buckets: o.LiveBuckets,
		LeaseTTLS: o.LeaseTTL.Seconds(), WindowS: w,
		JoinedS: joined.Sub(start).Seconds(), SteadyS: steadyAt.Sub(joined).Seconds(), TimedOut: timedOut,
		Granted:        granted,
		KeepAlivesPerS: float64(b.keepAlivesOK-a.keepAlivesOK) / w,
		KeepAlivesOnStreamPct: pct(b.metrics[keepAlivesOnStream]-a.metrics[keepAlivesOnStream]+b.metrics[keepAlivesShared]-a.metrics[keepAlivesShared],
			b.metrics["keyshard_member_keepalives_total"]-a.metrics["keyshard_member_keepalives_total"]),
		ChecksOnReplicaPct: pct(b.metrics[keepAliveChecksOnReplica]-a.metrics[keepAliveChecksOnReplica],
			b.metrics["keyshard_member_keepalive_checks_total"]-a.metrics["keyshard_member_keepalive_checks_total"]),
		ConnsGRPC:           int(b.metrics[connsGRPC]),
		ConnsHTTP:           int(b.metrics[connsHTTP]),
		Health:              f.health(),
		ServeCPUPct:         100 * (b.serve.cpuS - a.serve.cpuS) / w,
		EtcdCPUPct:          100 * (b.etcd.cpuS - a.etcd.cpuS) / w,
		BenchCPUPct:         100 * (b.bench.cpuS - a.bench.cpuS) / w,
		ServeRSSBeforeBytes: base.serve.rss, ServeRSSAfterBytes: b.serve.rss,
		ServeRSSBytesPerMember: float64(b.serve.rss-base.serve.rss) / float64(o.LiveMembers),
		EtcdRSSBytes:           b.etcd.rss,
		EtcdDBSizeBytes:        b.dbSize, EtcdDBInUseBytes: b.dbSizeInUse,
		EtcdWritesPerS: float64(b.rev-a.rev) / w,
		Where:          split(a, b),
	}
	perMember := func(name string) float64 { return (b.metrics[name] - base.metrics[name]) / float64(o.LiveMembers) }
	r.ServeStackBytesPerMember = perMember("go_memstats_stack_inuse_bytes")
	r.ServeHeapInUseBytesPerMember = perMember("go_memstats_heap_inuse_bytes")
	r.ServeGoroutinesPerMember = perMember("go_goroutines")
	r.ServeCPUPctPer1000 = r.ServeCPUPct / per
	r.EtcdCPUPctPer1000 = r.EtcdCPUPct / per
	r.ServePlusEtcdPctPer1000 = r.ServeCPUPctPer1000 + r.EtcdCPUPctPer1000
	logf("live: serve %.1f%% + etcd %.1f%% of a core for %d members; serve RSS %.0f bytes/member (goroutine stacks %.0f, heap in use %.0f); etcd db %d bytes",
		r.ServeCPUPct, r.EtcdCPUPct, o.LiveMembers, r.ServeRSSBytesPerMember, r.ServeStackBytesPerMember, r.ServeHeapInUseBytesPerMember, r.EtcdDBSizeBytes)
	return r, nil
}

func (e *scaleEnv) routers(ctx context.Context, o ScaleOptions, logf logFunc) (*RoutersReport, error) {
	const ks = "scale-routers"
	if err := e.createKeyspace(ctx, ks, o.LiveBuckets, o.LeaseTTL); err != nil {
		return nil, err
	}
	mctx, stopMembers := context.WithCancel(ctx)
	f := &fleet{e: e, perConn: o.MembersPerConn, unary: o.UnaryKeepAlives, perStream: o.SessionsPerStream}
	defer func() { stopMembers(); f.wg.Wait(); f.closeConns() }()
	if _, err := f.join(mctx, ks, "r-first"); err != nil {
		return nil, err
	}
	if _, _, timedOut, err := e.waitSettled(ctx, []string{ks}, o.LiveBuckets, []int{1}, o.Budget, logf); err != nil || timedOut {
		return nil, fmt.Errorf("the first member's grants (timed out: %v): %v", timedOut, err)
	}
	mp, err := e.maps.GetMap(ctx, connect.NewRequest(&keyshardv1.GetMapRequest{Keyspace: ks}))
	if err != nil {
		return nil, fmt.Errorf("get the map of %s: %w", ks, err)
	}
	e0 := mp.Msg.GetMap().GetEpoch()

	nStream := o.Routers / 2
	nPoll := o.Routers - nStream
	logf("routers: %d client.Router (streams) and %d GetMap long polls follow %s at epoch %d", nStream, nPoll, ks, e0)
	rctx, stopRouters := context.WithCancel(ctx)
	var routers sync.WaitGroup
	defer func() { stopRouters(); routers.Wait() }()
	seen := make([]time.Time, o.Routers) // written once each, by the router's own goroutine, read after seenAll
	var seenCount atomic.Int64
	seenAll := make(chan struct{})
	mark := func(i int) {
		seen[i] = time.Now()
		if seenCount.Add(1) == int64(o.Routers) {
			close(seenAll)
		}
	}
	// Stream routers: start each (first map loaded), then wait for the
	// next epoch.
	startErrs := make([]error, nStream)
	sem := make(chan struct{}, 64)
	var starting sync.WaitGroup
	for i := range nStream {
		sem <- struct{}{}
		starting.Go(func() { // exits once the router started
			defer func() { <-sem }()
			r, err := client.NewRouter(e.sdk, ks)
			if err == nil {
				err = r.Start(rctx)
			}
			if err != nil {
				startErrs[i] = fmt.Errorf("start router %d: %w", i, err)
				return
			}
			routers.Go(func() { // exits once the router saw the epoch, or rctx ends
				defer r.Close()
				if r.WaitEpoch(rctx, e0+1) == nil {
					mark(i)
				}
			})
		})
	}
	starting.Wait()
	if err := errors.Join(startErrs...); err != nil {
		return nil, err
	}
	// Poll routers: long polls from epoch e0.
	for j := range nPoll {
		i := nStream + j
		routers.Go(func() { // exits once the poller saw the epoch, or rctx ends
			for rctx.Err() == nil {
				resp, err := e.maps.GetMap(rctx, connect.NewRequest(&keyshardv1.GetMapRequest{Keyspace: ks, SinceEpoch: e0, Wait: durationpb.New(30 * time.Second)}))
				if err == nil && resp.Msg.GetMap().GetEpoch() > e0 {
					mark(i)
					return
				}
				if err != nil {
					pause(rctx, 100*time.Millisecond)
				}
			}
		})
	}
	// Every router is waiting once serve holds as many long polls and
	// streams (the members' grant streams included).
	wantPolls := float64(o.Routers + 1)
	if err := e.waitMetric(ctx, "keyshard_api_long_polls", wantPolls, o.Budget); err != nil {
		return nil, fmt.Errorf("routers waiting: %w", err)
	}
	// The map key's writes, from etcd.
	st, err := e.etcdCli.Status(ctx, e.endpoints[0])
	if err != nil {
		return nil, fmt.Errorf("etcd status: %w", err)
	}
	wctx, stopWatch := context.WithCancel(ctx)
	wch := e.etcdCli.Watch(wctx, store.MapKey(ks), clientv3.WithRev(st.Header.Revision+1))
	written := make(chan time.Time, 1)
	var watching sync.WaitGroup
	watching.Go(func() { // exits once the first write is seen, or wctx ends
		for wr := range wch {
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut {
					written <- time.Now()
					return
				}
			}
		}
	})
	defer watching.Wait()
	defer stopWatch()
	before, err := e.sample(ctx)
	if err != nil {
		return nil, fmt.Errorf("sample before the epoch: %w", err)
	}
	logf("routers: every router is waiting; a second member joins")
	if _, err := f.join(mctx, ks, "r-second"); err != nil {
		return nil, err
	}
	joinedAt := time.Now()
	var writeAt time.Time
	t := time.NewTimer(o.Budget)
	defer t.Stop()
	select {
	case writeAt = <-written:
	case <-t.C:
		return nil, fmt.Errorf("no new map of %s written within %v of a member joining", ks, o.Budget)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case <-seenAll:
	case <-t.C: // the routers that have not seen it are missed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	stopRouters()
	routers.Wait()
	after, err := e.sample(ctx)
	if err != nil {
		return nil, fmt.Errorf("sample after the epoch: %w", err)
	}
	t0 := writeAt
	for _, s := range seen {
		if !s.IsZero() && s.Before(t0) {
			t0 = s
		}
	}
	var all, streams, polls []time.Duration
	for i, s := range seen {
		if s.IsZero() {
			continue
		}
		d := s.Sub(t0)
		all = append(all, d)
		if i < nStream {
			streams = append(streams, d)
		} else {
			polls = append(polls, d)
		}
	}
	r := &RoutersReport{
		Routers: o.Routers, StreamRouters: nStream, PollRouters: nPoll, Buckets: o.LiveBuckets,
		P50Ms: pctMs(all, 50), P99Ms: pctMs(all, 99), MaxMs: pctMs(all, 100),
		StreamP99Ms: pctMs(streams, 99), PollP99Ms: pctMs(polls, 99),
		Seen: len(all), Missed: o.Routers - len(all),
		WriteFromJoinMs: float64(writeAt.Sub(joinedAt).Microseconds()) / 1e3,
		Where:           split(before, after),
	}
	logf("routers: epoch reached %d of %d routers: p50 %.1f ms, p99 %.1f ms, max %.1f ms", r.Seen, r.Routers, r.P50Ms, r.P99Ms, r.MaxMs)
	return r, nil
}

// waitMetric polls serve's /metrics every 50 ms until name reaches want.
func (e *scaleEnv) waitMetric(ctx context.Context, name string, want float64, budget time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var got float64
	for {
		m, err := e.scrape(ctx)
		if err == nil {
			if got = m[name]; got >= want {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s is %v after %v; want %v", name, got, budget, want)
		case <-tick.C:
		}
	}
}

func (e *scaleEnv) crash(ctx context.Context, o ScaleOptions, logf logFunc) (*CrashReport, error) {
	const ks = "scale-crash"
	if err := e.createKeyspace(ctx, ks, o.Buckets, o.LeaseTTL); err != nil {
		return nil, err
	}
	mctx, stopMembers := context.WithCancel(ctx)
	f := &fleet{e: e, perConn: o.MembersPerConn, unary: o.UnaryKeepAlives, perStream: o.SessionsPerStream}
	defer func() { stopMembers(); f.wg.Wait(); f.closeConns() }()
	logf("crash: %d members join %s (%d buckets, lease TTL %v)", o.Members, ks, o.Buckets, o.LeaseTTL)
	kss := make([]string, o.Members)
	ids := make([]string, o.Members)
	for i := range ids {
		kss[i], ids[i] = ks, fmt.Sprintf("m%05d", i)
	}
	ms, err := f.joinAll(mctx, kss, ids, 8, o.Budget, logf)
	if err != nil {
		return nil, err
	}
	if _, _, timedOut, err := e.waitSettled(ctx, []string{ks}, o.Buckets, []int{o.Members}, o.Budget, logf); err != nil || timedOut {
		return nil, fmt.Errorf("the members' grants before the crash (timed out: %v): %v", timedOut, err)
	}
	list, err := e.sdk.Admin().ListMembers(ctx, ks)
	if err != nil {
		return nil, fmt.Errorf("list the members of %s: %w", ks, err)
	}
	crashed := map[string]bool{}
	for i := 0; i < o.Members; i += 10 {
		crashed[ms[i].id] = true
	}
	orphaned := 0
	for _, m := range list.Members {
		if crashed[m.ID] {
			orphaned += m.GrantedBuckets
		}
	}
	before, err := e.sample(ctx)
	if err != nil {
		return nil, fmt.Errorf("sample before the crash: %w", err)
	}
	logf("crash: %d members stop without leaving, holding %d buckets", len(crashed), orphaned)
	crashAt := time.Now()
	for i := 0; i < o.Members; i += 10 {
		ms[i].stop()
	}
	at, states, timedOut, err := e.waitSettled(ctx, []string{ks}, o.Buckets, []int{o.Members - len(crashed)}, o.LeaseTTL+o.Budget, logf)
	if err != nil {
		return nil, err
	}
	after, err := e.sample(ctx)
	if err != nil {
		return nil, fmt.Errorf("sample after the takeover: %w", err)
	}
	r := &CrashReport{
		Members: o.Members, Crashed: len(crashed), Buckets: o.Buckets, LeaseTTLS: o.LeaseTTL.Seconds(),
		Orphaned: orphaned, RegrantedS: at.Sub(crashAt).Seconds(), TargetS: (o.LeaseTTL + 2*time.Second).Seconds(),
		TimedOut: timedOut, Granted: states[0].granted, MembersListed: states[0].members,
		EtcdWrites: after.rev - before.rev,
		Health:     f.health(),
		Where:      split(before, after),
	}
	logf("crash: every orphaned bucket granted again %.2fs after the crash (lease TTL %v, timed out: %v)", r.RegrantedS, o.LeaseTTL, timedOut)
	return r, nil
}

// pctMs is the p-th percentile of ds in ms, 0 if ds is empty (JSON has
// no NaN).
func pctMs(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	i := int(math.Ceil(p/100*float64(len(ds)))) - 1
	i = min(max(i, 0), len(ds)-1)
	return float64(ds[i].Microseconds()) / 1e3
}

// pct is part as a percentage of whole (0 when whole is).
func pct(part, whole float64) float64 {
	if whole <= 0 {
		return 0
	}
	return 100 * part / whole
}
