package kafka

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyshard/keyshard/clock"
)

// DefaultPollInterval is the default BarrierConfig.PollInterval.
const DefaultPollInterval = 100 * time.Millisecond

// BarrierConfig configures a Barrier.
type BarrierConfig struct {
	// Lane is the lane whose records the consumer processes: Overflow
	// honours HeaderWaitMain (waiting for the main group), Main honours
	// HeaderWaitOverflow (waiting for the overflow group).
	Lane Lane
	// Topic and Group are the other lane's topic and consumer group.
	Topic, Group string
	// PollInterval is how often Wait re-reads the committed offsets while
	// it waits. Default DefaultPollInterval.
	PollInterval time.Duration
	// Clock times the polls. Default clock.Real{}.
	Clock clock.Clock
}

// Barrier is the consumer side of the router's drain barriers: Wait holds
// a record that carries a barrier header until the other lane's consumer
// group has committed past the position in the header, so that main and
// overflow never process a key at the same time and the key's order holds.
//
// The other lane's group must commit an offset only once the records
// before it are processed (commit after processing: kgo.AutoCommitMarks
// with MarkCommitRecords after each record, or CommitRecords after each
// batch), since the barrier reads "committed" as "processed".
//
// A Barrier is safe for concurrent use and starts no goroutines.
type Barrier struct {
	adm    admin
	header string
	cfg    BarrierConfig

	mu        sync.Mutex
	committed map[int32]int64 // highest committed offset seen per partition
	poke      chan struct{}   // closed by Notify
}

// NewBarrier returns a barrier that reads the other lane's committed
// offsets with adm. Errors are *ConfigErrors (ErrBadConfig) naming the
// argument or field.
func NewBarrier(adm *kadm.Client, cfg BarrierConfig) (*Barrier, error) {
	if adm == nil {
		return nil, configError("kafka.NewBarrier", "adm", "(the *kadm.Client) is nil; build one with kadm.NewClient(cl)")
	}
	return newBarrier(adm, cfg)
}

func newBarrier(adm admin, cfg BarrierConfig) (*Barrier, error) {
	b := &Barrier{adm: adm, cfg: cfg, committed: make(map[int32]int64), poke: make(chan struct{})}
	switch cfg.Lane {
	case Overflow:
		b.header = HeaderWaitMain
	case Main:
		b.header = HeaderWaitOverflow
	default:
		return nil, configError("kafka.NewBarrier", "BarrierConfig.Lane", "must be Main or Overflow, got %v", cfg.Lane)
	}
	switch {
	case cfg.Topic == "":
		return nil, configError("kafka.NewBarrier", "BarrierConfig.Topic", "(the other lane's topic) is empty")
	case cfg.Group == "":
		return nil, configError("kafka.NewBarrier", "BarrierConfig.Group", "(the other lane's group) is empty")
	case cfg.PollInterval < 0:
		return nil, configError("kafka.NewBarrier", "BarrierConfig.PollInterval", "must be positive, got %v", cfg.PollInterval)
	case cfg.PollInterval == 0:
		b.cfg.PollInterval = DefaultPollInterval
	}
	b.cfg.Clock = clock.Or(cfg.Clock)
	return b, nil
}

// ParsePosition parses a barrier header value "<partition>:<offset>".
func ParsePosition(v []byte) (partition int32, offset int64, err error) {
	i := bytes.IndexByte(v, ':')
	if i < 0 {
		return 0, 0, fmt.Errorf("%w: %q", ErrBadHeader, v)
	}
	p, err1 := strconv.ParseInt(string(v[:i]), 10, 32)
	o, err2 := strconv.ParseInt(string(v[i+1:]), 10, 64)
	if err1 != nil || err2 != nil || p < 0 || o < 0 {
		return 0, 0, fmt.Errorf("%w: %q", ErrBadHeader, v)
	}
	return int32(p), o, nil
}

// Wait returns once rec may be processed: at once if rec carries no
// barrier header for this lane, else once the other lane's group has
// committed an offset beyond the header's position on its partition. It
// returns ctx's error if ctx ends first (wrapping the last offset fetch
// error, if any), or an error wrapping ErrBadHeader for a malformed header.
func (b *Barrier) Wait(ctx context.Context, rec *kgo.Record) error {
	var pos []byte
	for _, h := range rec.Headers {
		if h.Key == b.header {
			pos = h.Value
		}
	}
	if pos == nil {
		return nil
	}
	p, off, err := ParsePosition(pos)
	if err != nil {
		return err
	}
	var lastErr error
	for {
		b.mu.Lock()
		done := b.committed[p] > off
		poke := b.poke
		b.mu.Unlock()
		if done {
			return nil
		}
		if err := b.fetch(ctx); err != nil {
			lastErr = err
		} else if b.passed(p, off) {
			return nil
		}
		t := b.cfg.Clock.NewTimer(b.cfg.PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			if lastErr != nil {
				return fmt.Errorf("kafka: barrier %s=%s: %w (last fetch: %v)", b.header, pos, ctx.Err(), lastErr)
			}
			return fmt.Errorf("kafka: barrier %s=%s: %w", b.header, pos, ctx.Err())
		case <-t.C():
		case <-poke:
			t.Stop()
		}
	}
}

func (b *Barrier) passed(p int32, off int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.committed[p] > off
}

func (b *Barrier) fetch(ctx context.Context) error {
	os, err := b.adm.FetchOffsets(ctx, b.cfg.Group)
	if err != nil && !errors.Is(err, kerr.GroupIDNotFound) {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for p, o := range os[b.cfg.Topic] {
		if o.Err == nil && o.At > b.committed[p] {
			b.committed[p] = o.At
		}
	}
	return nil
}

// Notify makes every Wait re-read the committed offsets now rather than at
// its next poll. A process that consumes both lanes can call it after each
// commit of the other lane.
func (b *Barrier) Notify() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.poke)
	b.poke = make(chan struct{})
}
