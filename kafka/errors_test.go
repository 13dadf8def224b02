package kafka

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/client/stream"
	"github.com/keyshard/keyshard/placement"
)

// asConfigError returns the *ConfigError in err's chain, failing the test
// unless there is one, errors.Is(err, ErrBadConfig) holds and it names
// field of function fn, in its Field and in its message.
func asConfigError(t *testing.T, what string, err error, fn, field string) *ConfigError {
	t.Helper()
	var ce *ConfigError
	if !errors.Is(err, ErrBadConfig) || !errors.As(err, &ce) {
		t.Errorf("%s: %v, want a *ConfigError wrapping ErrBadConfig", what, err)
		return nil
	}
	if ce.Func != fn || ce.Field != field || !strings.Contains(err.Error(), fn+": "+field) {
		t.Errorf("%s: %v (Func %q, Field %q), want %s naming %s", what, err, ce.Func, ce.Field, fn, field)
	}
	return ce
}

// TestConfigErrorsNameTheField: the refusals of NewBarrier, SetRules and
// Start's metrics are *ConfigErrors naming the field, on a real cluster.
func TestConfigErrorsNameTheField(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct {
		field string
		cfg   BarrierConfig
	}{
		{"BarrierConfig.Lane", BarrierConfig{Lane: DeadLetter, Topic: mainTopic, Group: "g"}},
		{"BarrierConfig.Topic", BarrierConfig{Lane: Overflow, Group: "g"}},
		{"BarrierConfig.Group", BarrierConfig{Lane: Overflow, Topic: mainTopic}},
		{"BarrierConfig.PollInterval", BarrierConfig{Lane: Overflow, Topic: mainTopic, Group: "g", PollInterval: -time.Second}},
	} {
		_, err := NewBarrier(e.adm, c.cfg)
		asConfigError(t, "NewBarrier", err, "kafka.NewBarrier", c.field)
	}
	_, err := NewBarrier(nil, BarrierConfig{Lane: Overflow, Topic: mainTopic, Group: "g"})
	asConfigError(t, "NewBarrier(nil)", err, "kafka.NewBarrier", "adm")

	// SetRules: the rules in force stay.
	cfg := testConfig(e)
	cfg.DeadLetterTopic = ""
	r := e.router(t, cfg)
	err = r.SetRules(mustRules(t, "dead-letter k:*"))
	if ce := asConfigError(t, "SetRules", err, "Router.SetRules", "Config.DeadLetterTopic"); ce != nil && !strings.Contains(ce.Reason, "dead-letter k:*") {
		t.Errorf("SetRules: %v does not quote the rule", err)
	}
	if err := r.ProduceSync(testCtx(t), rec("k:1", "v")); err != nil {
		t.Errorf("Produce after a refused SetRules: %v", err)
	}

	// Two routers of the same topics on one registry: the second Start
	// is refused, naming Config.Registerer, and wraps the registry's error.
	reg := prometheus.NewRegistry()
	cfg = testConfig(e)
	cfg.Registerer = reg
	e.router(t, cfg)
	r2, err := NewRouter(e.cl, e.adm, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	err = r2.Start(testCtx(t))
	asConfigError(t, "Start with metrics already registered", err, "Router.Start", "Config.Registerer")
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) {
		t.Errorf("Start: %v does not wrap prometheus.AlreadyRegisteredError", err)
	}
}

// TestPartitionReaderMissing: a PartitionReader of a topic or partition
// that does not exist fails with a *ConfigError naming the argument and
// wrapping kerr.UnknownTopicOrPartition, and a stream.Consumer's Run
// returns it, so a caller can tell it from a broker error worth retrying.
func TestPartitionReaderMissing(t *testing.T) {
	ctx := testCtx(t)
	cl := streamEnv(t, 1)
	for _, c := range []struct {
		name, topic string
		partition   int32
		field       string
	}{
		{"missing partition", "events", 3, "partition"},
		{"missing topic", "no-such-topic", 0, "topic"},
	} {
		r, err := NewPartitionReader(cl, c.topic, c.partition, PartitionReaderConfig{})
		if err != nil {
			t.Fatal(err)
		}
		_, next, err := r.Read(ctx, 7)
		asConfigError(t, c.name, err, "PartitionReader.Read", c.field)
		if !errors.Is(err, kerr.UnknownTopicOrPartition) || next != 7 {
			t.Errorf("%s: Read = next %d, %v; want 7 and kerr.UnknownTopicOrPartition", c.name, next, err)
		}
	}

	// Through a stream.Consumer, as a stream worker runs it.
	r, err := NewPartitionReader(cl, "events", 3, PartitionReaderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := placement.NewHasher(placement.HashXXH64, 8)
	if err != nil {
		t.Fatal(err)
	}
	flow, err := stream.NewFlow(h, 0)
	if err != nil {
		t.Fatal(err)
	}
	c, err := stream.NewConsumer(flow, r, func(context.Context, stream.Record) error { return nil }, stream.ConsumerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Run(ctx)
	asConfigError(t, "Consumer.Run", err, "PartitionReader.Read", "partition")
	if errors.Is(err, client.ErrInvalid) || errors.Is(err, ErrOffsetOutOfRange) {
		t.Errorf("Consumer.Run: %v wraps more than it should", err)
	}
}
