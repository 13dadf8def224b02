package kafka

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyshard/keyshard/clock"
	"github.com/keyshard/keyshard/hotkey"
)

// Errors a send resolves with. Branch on them with errors.Is; every other
// error comes from the Kafka client (a broker error, a cancelled context)
// and counts as failed.
var (
	// ErrMissingKey: the record has no key and Config.KeyFunc is nil or
	// returned no key (its error, if any, is wrapped too). Never produced.
	ErrMissingKey = errors.New("kafka: record has no key")
	// ErrDropped: a drop rule matched the key. Never produced; counted.
	ErrDropped = errors.New("kafka: record dropped by policy")
	// ErrTimeout: the send did not resolve within Config.SendTimeout. The
	// record may still be written later (counted in Stats.LateAcks); the
	// client may still read it, so do not modify or reuse it.
	ErrTimeout = errors.New("kafka: send timed out")
	// ErrClosed: Produce or Start was called after Close. Never produced;
	// counted as failed.
	ErrClosed = errors.New("kafka: router closed")
	// ErrNotStarted: Produce or Refresh was called before Start returned
	// nil. Never produced; counted as failed.
	ErrNotStarted = errors.New("kafka: router not started; call Start first")
	// ErrNoDeadLetterTopic: a dead-letter rule matched the key but
	// Config.DeadLetterTopic is empty. Never produced; counted as failed.
	ErrNoDeadLetterTopic = errors.New("kafka: dead-letter rule matched but no dead-letter topic is configured")
	// ErrBadConfig: a configuration error that retrying cannot fix. Every
	// such error is a *ConfigError, which names the argument or field: from
	// NewRouter, Router.Start (a topic missing or not describable, metrics
	// refused), NewBarrier, Router.SetRules and PartitionReader.Read (its
	// topic or partition missing, or not readable by the client).
	ErrBadConfig = errors.New("kafka: bad config")
	// ErrBadHeader is wrapped by Barrier.Wait for a barrier header that is
	// not "<partition>:<offset>".
	ErrBadHeader = errors.New("kafka: bad barrier header")
)

// ConfigError is a configuration error: an argument, field or option that
// the package refused, with what is wrong and what to do. It wraps
// ErrBadConfig, so errors.Is(err, ErrBadConfig) holds, and the error it
// comes from, if any (kerr.UnknownTopicOrPartition for a missing topic, a
// hotkey.ErrBadConfig for a bad policy). errors.As tells which field:
//
//	var ce *kafka.ConfigError
//	if errors.As(err, &ce) && ce.Field == "Config.OverflowTopic" { ... }
type ConfigError struct {
	// Func is the function that refused it: "kafka.NewRouter",
	// "Router.Start", "PartitionReader.Read".
	Func string
	// Field names the argument, field or option as the caller writes it:
	// "Config.MainTopic", "BarrierConfig.Group", "kgo.RecordPartitioner",
	// "partition".
	Field string
	// Reason says what is wrong with it, and what to do, in words that
	// follow Field: "is empty", `"events": topic not found; create it or
	// fix the name`. It may be empty when Err says it all.
	Reason string
	// Err is the error it comes from, or nil.
	Err error
}

func (e *ConfigError) Error() string {
	s := ErrBadConfig.Error() + ": " + e.Func + ": " + e.Field
	if e.Reason != "" {
		s += " " + e.Reason
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns ErrBadConfig and Err.
func (e *ConfigError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrBadConfig}
	}
	return []error{ErrBadConfig, e.Err}
}

// configError returns a *ConfigError of function fn for field, with the
// reason given by format and a, and no cause.
func configError(fn, field, format string, a ...any) error {
	return &ConfigError{Func: fn, Field: field, Reason: fmt.Sprintf(format, a...)}
}

// Record headers the router sets. Consumers honour the two barriers with a
// Barrier.
const (
	// HeaderWaitMain is set on the first records of a key entering
	// overflow: "<main partition>:<offset>". The overflow consumer must not
	// process the record until the main group has committed past offset on
	// that main partition, so that the key's earlier main records are done.
	HeaderWaitMain = "keyshard-wait-main"
	// HeaderWaitOverflow is set on the first record of a key back on main,
	// when that record's decision released it from overflow:
	// "<overflow partition>:<offset>", the key's last overflow record. (A
	// key released by Refresh gets none: the overflow group has committed
	// past all its overflow records by then.)
	HeaderWaitOverflow = "keyshard-wait-overflow"
	// HeaderSkipStateful ("1") marks a main record that a skip-stateful rule
	// matched: process it without per-key state.
	HeaderSkipStateful = "keyshard-skip-stateful"
	// HeaderKey carries the key of a record sent to a random overflow
	// partition (a "spread" rule or hotkey.PolicyConfig.SpreadDetected),
	// whose Kafka key is removed so that it is not hashed.
	HeaderKey = "keyshard-key"
)

// Lane is a destination of the router. Its String form suits metric labels.
type Lane uint8

const (
	// Main is the main topic: keys that are not hot, and skip-stateful ones.
	Main Lane = iota + 1
	// Overflow is the overflow topic: hot and forced keys, keyed, so a key
	// lands on one overflow partition.
	Overflow
	// DeadLetter is the dead-letter topic.
	DeadLetter
)

func (l Lane) String() string {
	switch l {
	case Main:
		return "main"
	case Overflow:
		return "overflow"
	case DeadLetter:
		return "dead_letter"
	}
	return fmt.Sprintf("Lane(%d)", uint8(l))
}

// Defaults of Config.
const (
	DefaultSendTimeout           = 10 * time.Second
	DefaultRefreshInterval       = time.Second
	DefaultRetentionWarnFraction = 0.8
)

// Config configures a Router. MainTopic, OverflowTopic, OverflowGroup and
// Policy.Detector are required; the rest have defaults.
type Config struct {
	// MainTopic and OverflowTopic are the two lanes. They must differ, and
	// exist when Start runs.
	MainTopic, OverflowTopic string
	// DeadLetterTopic receives the keys that dead-letter rules match.
	// Optional unless such rules are configured.
	DeadLetterTopic string
	// OverflowGroup is the consumer group of the overflow lane. Its
	// committed offsets tell the router that a key's overflow records are
	// processed, so the key may go back to main.
	OverflowGroup string
	// Policy configures the hot-key policy the router owns.
	Policy hotkey.PolicyConfig
	// KeyFunc, if set, computes a key for a record that has none; it must
	// return a non-empty key or an error. When nil, such records fail with
	// ErrMissingKey. Called from Produce's goroutine, concurrently.
	KeyFunc func(*kgo.Record) ([]byte, error)
	// SendTimeout bounds every send: a send that the broker has not
	// answered by then resolves with ErrTimeout. Default DefaultSendTimeout.
	SendTimeout time.Duration
	// RefreshInterval is how often the router reads the overflow group's
	// committed offsets, end offsets and topic metadata (see Refresh).
	// Default DefaultRefreshInterval.
	RefreshInterval time.Duration
	// RetentionWarnFraction: warn when an overflow partition's estimated
	// unconsumed bytes reach this fraction of the topic's retention.bytes.
	// In (0, 1]; default DefaultRetentionWarnFraction.
	RetentionWarnFraction float64
	// Clock is the time source of the policy, timeouts and the refresh
	// loop. Default clock.Real{}.
	Clock clock.Clock
	// Logger receives warnings (backlog near retention, refresh errors).
	// Default: discard.
	Logger *slog.Logger
	// ClusterHotKeys, if set, joins the router to cluster-wide hot-key
	// detection: a goroutine of the router reports the detector's keys at
	// or above the pool's report threshold to the control plane every
	// Interval (client.HotKeys), and installs every newer cluster overflow
	// set it publishes (ApplyClusterSet), so that a key hot only summed
	// over many producers goes to overflow in each of them, with the same
	// guarantees as a locally hot key. It fails open: sends never wait for
	// the control plane, and while it is unreachable the set in force
	// stays. Nil: local detection only.
	ClusterHotKeys *ClusterHotKeysConfig
	// Registerer, if set, gets the router's metrics, labelled with the
	// main and overflow topics: Start registers them and Close unregisters
	// them. They are
	// keyshard_router_sends_total{result}, keyshard_router_late_acks_total,
	// keyshard_router_decisions_total{outcome,reason},
	// keyshard_router_overflow_keys, keyshard_router_held_records,
	// keyshard_router_pending_sends,
	// keyshard_overflow_backlog_messages{partition},
	// keyshard_overflow_backlog_bytes_estimate{partition},
	// keyshard_overflow_retention_warnings_total,
	// keyshard_router_refresh_errors_total,
	// keyshard_router_untracked_overflow_total,
	// keyshard_router_partition_mismatches_total,
	// keyshard_router_overflow_entries_total,
	// keyshard_router_cluster_set_version, keyshard_router_cluster_set_keys,
	// keyshard_router_cluster_reports_total,
	// keyshard_router_cluster_report_failures_total,
	// keyshard_router_cluster_watch_failures_total,
	// keyshard_router_cluster_truncated_keys_total and
	// keyshard_router_cluster_last_contact_timestamp_seconds.
	Registerer prometheus.Registerer
}

// withDefaults checks c and fills in its defaults; errors are
// *ConfigErrors of function fn.
func (c Config) withDefaults(fn string) (Config, error) {
	switch {
	case c.MainTopic == "":
		return c, configError(fn, "Config.MainTopic", "is empty")
	case c.OverflowTopic == "":
		return c, configError(fn, "Config.OverflowTopic", "is empty")
	case c.OverflowTopic == c.MainTopic:
		return c, configError(fn, "Config.OverflowTopic", "must differ from Config.MainTopic (both %q)", c.MainTopic)
	case c.DeadLetterTopic != "" && (c.DeadLetterTopic == c.MainTopic || c.DeadLetterTopic == c.OverflowTopic):
		return c, configError(fn, "Config.DeadLetterTopic", "%q must differ from the main and overflow topics", c.DeadLetterTopic)
	case c.OverflowGroup == "":
		return c, configError(fn, "Config.OverflowGroup", "is empty (its committed offsets gate the return to main)")
	}
	if c.SendTimeout == 0 {
		c.SendTimeout = DefaultSendTimeout
	}
	if c.SendTimeout < 0 {
		return c, configError(fn, "Config.SendTimeout", "must be positive, got %v", c.SendTimeout)
	}
	if c.RefreshInterval == 0 {
		c.RefreshInterval = DefaultRefreshInterval
	}
	if c.RefreshInterval < 0 {
		return c, configError(fn, "Config.RefreshInterval", "must be positive, got %v", c.RefreshInterval)
	}
	if c.RetentionWarnFraction == 0 {
		c.RetentionWarnFraction = DefaultRetentionWarnFraction
	}
	if !(c.RetentionWarnFraction > 0 && c.RetentionWarnFraction <= 1) {
		return c, configError(fn, "Config.RetentionWarnFraction", "must be in (0, 1], got %v", c.RetentionWarnFraction)
	}
	if h := c.ClusterHotKeys; h != nil && h.Client == nil {
		return c, configError(fn, "Config.ClusterHotKeys.Client", "is nil; dial the control plane with client.Dial")
	}
	if err := checkDeadLetter(fn, c.Policy.Rules, c.DeadLetterTopic); err != nil {
		return c, err
	}
	c.Clock = clock.Or(c.Clock)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// checkDeadLetter rejects dead-letter rules without a dead-letter topic,
// with a *ConfigError of function fn.
func checkDeadLetter(fn string, rs *hotkey.Rules, topic string) error {
	if topic != "" {
		return nil
	}
	for _, r := range rs.Rules() {
		if r.Action == hotkey.RuleDeadLetter {
			return configError(fn, "Config.DeadLetterTopic", "is empty, but rule %q sends to it; set it or drop the rule", r.String())
		}
	}
	return nil
}
