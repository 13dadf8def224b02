package server

import "github.com/prometheus/client_golang/prometheus"

// metrics are the server's Prometheus series, registered on its own
// registry (served at /metrics with Go and process collectors).
type metrics struct {
	leader         prometheus.Gauge
	storeReachable prometheus.Gauge
	epochs         *prometheus.CounterVec
	moves          *prometheus.CounterVec
	granted        *prometheus.CounterVec
	reports        *prometheus.CounterVec
	writeFailures  *prometheus.CounterVec
	leaderPlan     prometheus.Histogram // the coordinator's planning of each batch of events
	// The leader's watch: how long the echo of each of its writes took,
	// and how many revisions it is behind the latest one.
	leaderWatchLag    prometheus.Histogram
	leaderWatchBehind prometheus.Gauge
	leaderWrite       prometheus.Histogram // each leader write: one fenced transaction

	// Hot keys.
	hotReports       *prometheus.CounterVec // reports received by this replica, per pool
	overflowKeys     *prometheus.GaugeVec   // keys in each pool's overflow set, as this replica serves it
	overflowVersion  *prometheus.GaugeVec   // version of each pool's overflow set, as this replica serves it
	hotKeyFailures   *prometheus.CounterVec // failed aggregations and writes of the leader, per pool
	hotKeyLastRound  prometheus.Gauge       // when this replica, as leader, last aggregated
	hotReportsPruned *prometheus.CounterVec // stale reports the leader deleted, per pool

	// Tenant pools.
	tpTenants      *prometheus.GaugeVec     // tenants in each pool's snapshot, as this replica serves it
	tpVersion      *prometheus.GaugeVec     // each pool's snapshot version, as this replica serves it
	tpReports      *prometheus.CounterVec   // load reports the leader took, per pool and outcome
	tpForwarded    *prometheus.CounterVec   // calls this replica forwarded to the leader, per call
	tpRound        *prometheus.HistogramVec // duration of the leader's rounds, per pool
	tpBytes        *prometheus.CounterVec   // bytes the leader's rounds wrote, per pool
	tpRoundFailure *prometheus.CounterVec   // rounds that failed, per pool
	tpSizeChanges  *prometheus.CounterVec   // tenant size changes, per pool and direction

	// Stream commits.
	commits      *prometheus.CounterVec // Commit calls answered, per keyspace
	commitWrites *prometheus.CounterVec // store writes made for them, per keyspace

	// API limits.
	longPolls        prometheus.Gauge   // long polls and watch streams held now
	longPollsRefused prometheus.Counter // refused over limits.max_long_polls
	// keepAlives counts member keep-alives by how they came (call:
	// KeepAlive; stream: a Session stream; shared: a Sessions stream, one
	// per session renewed) and how they ended.
	keepAlives *prometheus.CounterVec
	// keepAliveChecks counts the checks after batches of renewals by what
	// answered them (replica: this replica's view; etcd: a transaction).
	keepAliveChecks *prometheus.CounterVec
	// apiConns counts the API connections by the HTTP/2 server that
	// serves them (grpcbridge.Split).
	apiConns *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keyshard_leader", Help: "1 while this replica leads (runs the balancer), else 0.",
		}),
		storeReachable: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keyshard_store_reachable", Help: "1 while this replica's etcd probe (a linearizable read every second) succeeds; 0 once it has failed for 3 s: the replica is then not ready and refuses member, map and hot-key calls.",
		}),
		epochs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyshard_map_epochs_total", Help: "New map epochs written by this replica as leader.",
		}, []string{"keyspace"}),
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyshard_bucket_moves_total", Help: "Buckets whose target owner changed in maps written by this replica.",
		}, []string{"keyspace"}),
		granted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyshard_grants_total", Help: "Bucket grants written by this replica as leader.",
		}, []string{"keyspace"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyshard_reports_total", Help: "Events an operator should know about: drain timeouts, replaced sessions, members that left.",
		}, []string{"keyspace", "kind"}),
		leaderPlan: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "keyshard_leader_plan_seconds", Help: "Time the leader spent planning each batch of store events and ticks (the coordinator's step), on the wall clock.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 4, 10),
		}),
		leaderWatchLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "keyshard_leader_watch_lag_seconds", Help: "Time from each leader write's commit until the leader's etcd watch delivered it (the watch's lag behind etcd: the leader sees members' joins and releases this late), on the wall clock.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10),
		}),
		leaderWatchBehind: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keyshard_leader_watch_behind_revisions", Help: "Revisions the leader's etcd watch has yet to deliver up to the leader's latest write; 0 when caught up or not leading.",
		}),
		leaderWrite: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "keyshard_leader_write_seconds", Help: "Duration of each leader write (one fenced etcd transaction: a map, a grant round, a revocation), failed ones included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		writeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyshard_leader_write_failures_total", Help: "Leader writes that failed, by action (map, grants, revoke, reservation; batch: a transaction of several keyspaces' maps and grant rounds, then written one by one) and cause (conflict, deadline, unavailable, too_large, other); each is replanned.",
		}, []string{"action", "cause"}),
		hotReports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyshard_hotkey_reports_total", Help: "Hot-key reports (ReportHotKeys) stored through this replica.",
		}, []string{"pool"}),
		overflowKeys: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyshard_hotkey_overflow_keys", Help: "Keys in the pool's cluster-wide overflow set, as this replica serves it.",
		}, []string{"pool"}),
		overflowVersion: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyshard_hotkey_overflow_version", Help: "Version of the pool's overflow set, as this replica serves it.",
		}, []string{"pool"}),
		hotKeyFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyshard_hotkey_aggregation_failures_total", Help: "Hot-key aggregations of this replica as leader that failed (unavailable store, conflict, corrupt set); each is retried at the next round.",
		}, []string{"pool"}),
		hotKeyLastRound: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keyshard_hotkey_last_aggregation_timestamp_seconds", Help: "When this replica, as leader, last aggregated hot-key reports (Unix time); it stops rising when the replica stops leading.",
		}),
		hotReportsPruned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyshard_hotkey_reports_pruned_total", Help: "Stale hot-key reports (older than twice report_max_age) deleted by this replica as leader.",
		}, []string{"pool"}),
		tpTenants: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyshard_tenantpool_tenants", Help: "Tenants in the tenant pool's snapshot, as this replica serves it.",
		}, []string{"pool"}),
		tpVersion: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyshard_tenantpool_version", Help: "Version of the tenant pool's snapshot, as this replica serves it.",
		}, []string{"pool"}),
		tpReports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyshard_tenantpool_reports_total", Help: "Load reports this replica took as leader, by outcome: counted, replayed (a retry, not counted again), stale (older than the window, not counted).",
		}, []string{"pool", "outcome"}),
		tpForwarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyshard_tenantpool_forwarded_total", Help: "Tenant-pool calls this replica forwarded to the leader, by call and result (ok, error).",
		}, []string{"call", "result"}),
		tpRound: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "keyshard_tenantpool_round_seconds", Help: "Duration of the leader's rounds of a tenant pool: plan and write.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"pool"}),
		tpBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyshard_tenantpool_bytes_written_total", Help: "Bytes (keys and values) the leader's rounds of a tenant pool wrote to etcd.",
		}, []string{"pool"}),
		tpRoundFailure: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyshard_tenantpool_round_failures_total", Help: "Rounds of a tenant pool that failed (unavailable store, conflict, too large); each is retried at the next round.",
		}, []string{"pool"}),
		tpSizeChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyshard_tenantpool_size_changes_total", Help: "Tenant size changes the leader made, by direction (grow, shrink).",
		}, []string{"pool", "direction"}),
		commits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyshard_commits_total", Help: "Commit calls (stream positions) this replica answered, accepted or refused.",
		}, []string{"keyspace"}),
		commitWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyshard_commit_writes_total", Help: "Store writes (one applied CommitPositions transaction each) this replica made for Commit calls: concurrent commits of one session share one, so this over keyshard_commits_total is the writes per call.",
		}, []string{"keyspace"}),
		longPolls: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keyshard_api_long_polls", Help: "Long polls (GetGrants, GetMap, GetOverflowSet with a wait) and watch streams this replica holds now.",
		}),
		longPollsRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keyshard_api_long_polls_refused_total", Help: "Long polls and watch streams refused because this replica held limits.max_long_polls already.",
		}),
		keepAlives: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyshard_member_keepalives_total", Help: "Member keep-alives this replica answered, by how they came (via: call for KeepAlive, stream for a Session stream, shared for a session renewed on a Sessions stream) and result (renewed; ended: the session had ended or was replaced; failed: anything else, retried by the member).",
		}, []string{"via", "result"}),
		keepAliveChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyshard_member_keepalive_checks_total", Help: "Checks after batches of keep-alive renewals (is every record still on its session?), by what answered (by: replica, this replica's copy of the store at a revision read from etcd; etcd, a transaction, when the copy did not reach that revision in time or showed a record elsewhere).",
		}, []string{"by"}),
		apiConns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyshard_api_connections_total", Help: "API connections accepted, by the server that serves them (server: grpc, grpc-go's HTTP/2 server, for an HTTP/2 connection, with or without TLS, whose first request is gRPC; http, net/http's, for every other).",
		}, []string{"server"}),
	}
	m.apiConns.WithLabelValues("grpc")
	m.apiConns.WithLabelValues("http")
	m.keepAliveChecks.WithLabelValues("replica")
	m.keepAliveChecks.WithLabelValues("etcd")
	for _, via := range []string{"call", "stream", "shared"} {
		for _, result := range []string{"renewed", "ended", "failed"} {
			m.keepAlives.WithLabelValues(via, result)
		}
	}
	// Every action and cause is exposed from the start, at 0, so that a
	// rate over the series sees the first failure.
	for _, action := range []string{"map", "grants", "revoke", "reservation", "batch"} {
		for _, cause := range []string{"conflict", "deadline", "unavailable", "too_large", "other"} {
			m.writeFailures.WithLabelValues(action, cause)
		}
	}
	reg.MustRegister(m.leader, m.storeReachable, m.epochs, m.moves, m.granted, m.reports, m.writeFailures, m.leaderPlan, m.leaderWatchLag, m.leaderWatchBehind, m.leaderWrite,
		m.hotReports, m.overflowKeys, m.overflowVersion, m.hotKeyFailures, m.hotKeyLastRound, m.hotReportsPruned,
		m.tpTenants, m.tpVersion, m.tpReports, m.tpForwarded, m.tpRound, m.tpBytes, m.tpRoundFailure, m.tpSizeChanges,
		m.commits, m.commitWrites, m.longPolls, m.longPollsRefused, m.keepAlives, m.keepAliveChecks, m.apiConns)
	return m
}
