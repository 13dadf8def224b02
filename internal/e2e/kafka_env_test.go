package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyshard/keyshard/clock/clocktest"
	"github.com/keyshard/keyshard/hotkey"
	"github.com/keyshard/keyshard/kafka"
)

const (
	mainTopic     = "main"
	overflowTopic = "overflow"
	overflowGroup = "overflow-g"
)

// testCtx bounds a test's waiting on the broker; it is a deadline for
// failure, never a way to pace the test.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// kafkaEnv is a one-broker kfake cluster with the main and overflow topics
// (4 partitions each), a producing client and the test's fake clock.
type kafkaEnv struct {
	cl  *kgo.Client
	adm *kadm.Client
	clk *clocktest.Fake
}

func newEnv(t *testing.T) *kafkaEnv {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, mainTopic, overflowTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &kafkaEnv{cl: cl, adm: kadm.NewClient(cl), clk: clocktest.NewFake(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))}
}

// testConfig: hot at 100 msg/s with a 1 s half-life, 2 s cooldown.
func testConfig(e *kafkaEnv) kafka.Config {
	return kafka.Config{
		MainTopic:     mainTopic,
		OverflowTopic: overflowTopic,
		OverflowGroup: overflowGroup,
		Policy: hotkey.PolicyConfig{
			Detector: hotkey.DetectorConfig{Threshold: 100, HalfLife: time.Second, Capacity: 256},
			Cooldown: 2 * time.Second,
		},
		Clock: e.clk,
	}
}

func rec(key, value string) *kgo.Record {
	return &kgo.Record{Key: []byte(key), Value: []byte(value)}
}
