package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
)

// Refresh does at once what the refresh loop does every RefreshInterval:
// it reads the overflow group's committed offsets and tells the policy
// which keys have drained (every overflow record of the key acknowledged
// and committed), so they may go back to main; releases keys that have
// cooled down and drained (hotkey.Policy.Sweep); updates the overflow
// backlog per partition and warns when one approaches retention.bytes; and
// reloads the main topic's partition count. It returns the errors of the
// requests that failed (the others still apply), or ErrNotStarted before
// Start.
func (r *Router) Refresh(ctx context.Context) error {
	r.mu.Lock()
	started := r.started
	r.mu.Unlock()
	if !started {
		return ErrNotStarted
	}
	var errs []error
	fail := func(what string, err error) {
		errs = append(errs, fmt.Errorf("%s: %w", what, err))
	}

	mainN := int32(0)
	if td, err := r.adm.ListTopics(ctx, r.cfg.MainTopic); err != nil {
		fail("list topics", err)
	} else if d, ok := td[r.cfg.MainTopic]; ok && d.Err == nil {
		mainN = int32(len(d.Partitions))
	}

	committed := map[int32]int64{}
	offsetsOK := true
	if os, err := r.adm.FetchOffsets(ctx, r.cfg.OverflowGroup); err != nil && !errors.Is(err, kerr.GroupIDNotFound) {
		fail("fetch offsets of group "+r.cfg.OverflowGroup, err)
		offsetsOK = false
	} else {
		for p, o := range os[r.cfg.OverflowTopic] {
			if o.Err == nil && o.At >= 0 {
				committed[p] = o.At
			}
		}
	}

	var backlog []PartitionBacklog
	if ends, err := r.adm.ListEndOffsets(ctx, r.cfg.OverflowTopic); err != nil {
		fail("list end offsets", err)
	} else if starts, err := r.adm.ListStartOffsets(ctx, r.cfg.OverflowTopic); err != nil {
		fail("list start offsets", err)
	} else if offsetsOK {
		for p, e := range ends[r.cfg.OverflowTopic] {
			if e.Err != nil {
				continue
			}
			from, ok := committed[p]
			if !ok {
				if s, found := starts.Lookup(r.cfg.OverflowTopic, p); found && s.Err == nil {
					from = s.Offset
				}
			}
			backlog = append(backlog, PartitionBacklog{Partition: p, Messages: max(0, e.Offset-from)})
		}
	}

	retention, retentionOK := int64(-1), false
	if rc, err := r.adm.DescribeTopicConfigs(ctx, r.cfg.OverflowTopic); err != nil {
		fail("describe topic configs", err)
	} else if c, err := rc.On(r.cfg.OverflowTopic, nil); err == nil && c.Err == nil {
		retentionOK = true
		for _, kv := range c.Configs {
			if kv.Key == "retention.bytes" && kv.Value != nil {
				if v, err := strconv.ParseInt(*kv.Value, 10, 64); err == nil {
					retention = v
				}
			}
		}
	}

	now := r.clk.Now()
	var warnings []PartitionBacklog
	r.mu.Lock()
	if mainN > r.mainN {
		r.setMainPartitions(mainN)
	}
	if offsetsOK {
		r.markDrained(committed)
	}
	if now.Before(r.last) {
		now = r.last
	}
	r.policy.Sweep(now)
	for _, st := range r.keys {
		// A zero time changes nothing: is the key still in overflow?
		if st.inPolicy && !r.policy.MarkDrained(st.keyBytes, time.Time{}) {
			st.inPolicy = false
		}
		r.maybeForget(st)
	}
	if retentionOK {
		r.retention = retention
	}
	if backlog != nil {
		warnings = r.setBacklog(backlog)
	}
	r.mu.Unlock()

	for _, w := range warnings {
		r.retentionWarnings.Add(1)
		r.log.Warn("kafka router: overflow partition backlog approaches retention.bytes; unconsumed records may be deleted",
			"topic", r.cfg.OverflowTopic, "partition", w.Partition, "backlog_messages", w.Messages,
			"backlog_bytes_estimate", w.BytesEstimate, "retention_bytes", retention)
	}
	if len(errs) > 0 {
		r.refreshErrors.Add(1)
		return fmt.Errorf("kafka: refresh: %w", errors.Join(errs...))
	}
	return nil
}

// markDrained tells the policy about every key whose overflow records have
// all been acknowledged and committed by the overflow group.
func (r *Router) markDrained(committed map[int32]int64) {
	for _, st := range r.keys {
		if !st.inPolicy || st.pending > 0 || st.gated || st.releasing || st.lastDecided.IsZero() {
			continue
		}
		drained := true
		for _, po := range st.acked {
			if c, ok := committed[po.partition]; !ok || c <= po.offset {
				drained = false
				break
			}
		}
		if drained && !r.policy.MarkDrained(st.keyBytes, st.lastDecided) {
			st.inPolicy = false
		}
	}
}

// setBacklog stores the backlog and returns the partitions that just
// crossed the retention warning threshold. r.mu is held.
func (r *Router) setBacklog(b []PartitionBacklog) []PartitionBacklog {
	var mean float64
	if r.ovRecords > 0 {
		mean = float64(r.ovBytes) / float64(r.ovRecords)
	}
	limit := r.cfg.RetentionWarnFraction * float64(r.retention)
	var crossed []PartitionBacklog
	for i := range b {
		pb := &b[i]
		pb.BytesEstimate = int64(float64(pb.Messages) * mean)
		if r.retention <= 0 || mean == 0 {
			delete(r.warned, pb.Partition)
			continue
		}
		est := float64(pb.BytesEstimate)
		pb.NearRetention = est >= limit
		switch {
		case pb.NearRetention && !r.warned[pb.Partition]:
			r.warned[pb.Partition] = true
			crossed = append(crossed, *pb)
		case est < 0.9*limit: // hysteresis: warn again only after a real drop
			delete(r.warned, pb.Partition)
		}
	}
	slices.SortFunc(b, func(x, y PartitionBacklog) int { return cmp.Compare(x.Partition, y.Partition) })
	r.backlog = b
	return crossed
}
