package server

import "github.com/prometheus/client_golang/prometheus"

// metrics are the server's Prometheus series, registered on its own
// registry (served at /metrics with Go and process collectors).
type metrics struct {
	leader        prometheus.Gauge
	epochs        *prometheus.CounterVec
	moves         *prometheus.CounterVec
	granted       *prometheus.CounterVec
	reports       *prometheus.CounterVec
	writeFailures prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keyshard_leader", Help: "1 while this replica leads (runs the balancer), else 0.",
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
		writeFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keyshard_leader_write_failures_total", Help: "Leader writes that failed (conflict, unavailable store); each is replanned.",
		}),
	}
	reg.MustRegister(m.leader, m.epochs, m.moves, m.granted, m.reports, m.writeFailures)
	return m
}
