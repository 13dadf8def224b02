package kafka

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keyshard/keyshard/hotkey"
)

// collector exports a router's counters at scrape time, so the send path
// pays for one atomic add per send and nothing else.
type collector struct {
	r                                                       *Router
	sends, lateAcks, decisions, overflowKeys, held, pending *prometheus.Desc
	backlog, backlogBytes, warnings, refreshErrs, untracked *prometheus.Desc
	mismatches, barriers                                    *prometheus.Desc
	clusterVersion, clusterKeys, clusterReports             *prometheus.Desc
	clusterReportFailures, clusterWatchFailures             *prometheus.Desc
	clusterTruncated, clusterContact                        *prometheus.Desc
}

func newCollector(r *Router) *collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, prometheus.Labels{"main_topic": r.cfg.MainTopic, "overflow_topic": r.cfg.OverflowTopic})
	}
	return &collector{
		r:            r,
		sends:        d("keyshard_router_sends_total", "Sends resolved, by result: main, overflow, dead_letter (acknowledged), dropped, missing_key, failed, timed_out.", "result"),
		lateAcks:     d("keyshard_router_late_acks_total", "Records acknowledged after their send had timed out."),
		decisions:    d("keyshard_router_decisions_total", "Policy decisions by outcome and reason.", "outcome", "reason"),
		overflowKeys: d("keyshard_router_overflow_keys", "Keys the policy holds in overflow."),
		held:         d("keyshard_router_held_records", "Overflow records waiting at an entry barrier."),
		pending:      d("keyshard_router_pending_sends", "Sends not yet resolved."),
		backlog:      d("keyshard_overflow_backlog_messages", "Overflow partition end offset minus the overflow group's committed offset.", "partition"),
		backlogBytes: d("keyshard_overflow_backlog_bytes_estimate", "Overflow partition backlog times the mean overflow record size.", "partition"),
		warnings:     d("keyshard_overflow_retention_warnings_total", "Times an overflow partition's backlog reached the warning fraction of retention.bytes."),
		refreshErrs:  d("keyshard_router_refresh_errors_total", "Refreshes with a failed request."),
		untracked:    d("keyshard_router_untracked_overflow_total", "Overflow records of keys beyond MaxOverflowKeys (no barrier)."),
		mismatches:   d("keyshard_router_partition_mismatches_total", "Main records placed on another partition than predicted (stale partition count)."),
		barriers:     d("keyshard_router_overflow_entries_total", "Keys entering overflow through an entry barrier."),

		clusterVersion:        d("keyshard_router_cluster_set_version", "Version of the cluster-wide overflow set in force (0: none)."),
		clusterKeys:           d("keyshard_router_cluster_set_keys", "Keys in the cluster-wide overflow set in force."),
		clusterReports:        d("keyshard_router_cluster_reports_total", "Hot-key reports the control plane accepted."),
		clusterReportFailures: d("keyshard_router_cluster_report_failures_total", "Hot-key reports that failed (control plane unreachable, unknown pool, refused)."),
		clusterWatchFailures:  d("keyshard_router_cluster_watch_failures_total", "Failed watches and long polls of the cluster-wide overflow set."),
		clusterTruncated:      d("keyshard_router_cluster_truncated_keys_total", "Hot keys left out of reports because the detector holds them truncated (MaxKeyLen)."),
		clusterContact:        d("keyshard_router_cluster_last_contact_timestamp_seconds", "When the control plane last answered the hot-key sync, in Unix seconds (0: never)."),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.sends, c.lateAcks, c.decisions, c.overflowKeys, c.held, c.pending,
		c.backlog, c.backlogBytes, c.warnings, c.refreshErrs, c.untracked, c.mismatches, c.barriers,
		c.clusterVersion, c.clusterKeys, c.clusterReports, c.clusterReportFailures, c.clusterWatchFailures,
		c.clusterTruncated, c.clusterContact} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.r.Stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for i, v := range []uint64{s.Main, s.Overflow, s.DeadLetter, s.Dropped, s.MissingKey, s.Failed, s.TimedOut} {
		counter(c.sends, v, resultNames[i])
	}
	counter(c.lateAcks, s.LateAcks)
	for o := hotkey.Outcome(0); int(o) < len(s.Policy.Decisions); o++ {
		for r := hotkey.Reason(0); int(r) < len(s.Policy.Decisions[o]); r++ {
			if n := s.Policy.Count(o, r); n > 0 {
				counter(c.decisions, n, o.String(), r.String())
			}
		}
	}
	gauge(c.overflowKeys, float64(s.Policy.OverflowKeys))
	gauge(c.held, float64(s.Held))
	gauge(c.pending, float64(s.Pending))
	for _, b := range s.Backlog {
		p := strconv.Itoa(int(b.Partition))
		gauge(c.backlog, float64(b.Messages), p)
		gauge(c.backlogBytes, float64(b.BytesEstimate), p)
	}
	counter(c.warnings, s.RetentionWarnings)
	counter(c.refreshErrs, s.RefreshErrors)
	counter(c.untracked, s.Untracked)
	counter(c.mismatches, s.PartitionMismatches)
	counter(c.barriers, s.Barriers)
	cl := s.Cluster
	gauge(c.clusterVersion, float64(cl.Version))
	gauge(c.clusterKeys, float64(cl.Keys))
	counter(c.clusterReports, cl.Sync.Reports)
	counter(c.clusterReportFailures, cl.Sync.ReportFailures)
	counter(c.clusterWatchFailures, cl.Sync.WatchFailures)
	counter(c.clusterTruncated, cl.TruncatedKeys)
	contact := 0.0
	if !cl.Sync.LastContact.IsZero() {
		contact = float64(cl.Sync.LastContact.UnixNano()) / 1e9
	}
	gauge(c.clusterContact, contact)
}
