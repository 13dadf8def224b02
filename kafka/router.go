package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/clock"
	"github.com/keyshard/keyshard/hotkey"
)

// producer is what the router needs from a *kgo.Client.
type producer interface {
	Produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error))
}

// admin is what the router needs from a *kadm.Client.
type admin interface {
	ListTopics(ctx context.Context, topics ...string) (kadm.TopicDetails, error)
	FetchOffsets(ctx context.Context, group string) (kadm.OffsetResponses, error)
	ListStartOffsets(ctx context.Context, topics ...string) (kadm.ListedOffsets, error)
	ListEndOffsets(ctx context.Context, topics ...string) (kadm.ListedOffsets, error)
	DescribeTopicConfigs(ctx context.Context, topics ...string) (kadm.ResourceConfigs, error)
}

// result is how a send resolved; each send counts in exactly one.
type result uint8

const (
	resMain result = iota
	resOverflow
	resDeadLetter
	resDropped
	resMissingKey
	resFailed
	resTimedOut
	numResults
)

var resultNames = [numResults]string{"main", "overflow", "dead_letter", "dropped", "missing_key", "failed", "timed_out"}

// action is what Produce does with a routed record.
type action uint8

const (
	actDrop action = iota
	actNoDeadLetter
	actHold    // held at a key's entry barrier; released by release
	actProduce // handed to the Kafka client now
)

// Router routes keyed records to a main and an overflow topic by a
// hotkey.Policy, and produces them with a franz-go client. See the package
// documentation for its guarantees.
//
// A Router is safe for concurrent use. NewRouter checks the arguments and
// starts nothing; Start loads the topics and starts two goroutines (the
// refresh loop and the one that times out sends), and a third with
// Config.ClusterHotKeys (the cluster hot-key sync); a key's entry barrier
// starts one while it releases held records. Close stops them.
type Router struct {
	prod producer
	adm  admin
	cfg  Config
	clk  clock.Clock
	log  *slog.Logger

	// mu guards the policy and every field below it, and the pending-list
	// fields of every send.
	mu        sync.Mutex
	policy    *hotkey.Policy
	last      time.Time  // monotone decision time
	lastNs    int64      // last.UnixNano()
	realClock bool       // the clock is clock.Real: decision times are record timestamps
	epoch     uint64     // bumped when the kill switch turns overflow back on
	mainN     int32      // main topic partitions, to predict a key's partition
	parts     []mainPart // per main partition
	keys      map[string]*keyState
	// byEntry indexes keys by the policy's overflow entry
	// (hotkey.Policy.DecideEntry), which spares an overflow record the map
	// lookup: byEntry[e], if not nil, is in keys and was the key of entry
	// e when it was set, so a lookup checks its key (see cachedKey).
	byEntry   []*keyState
	held      int
	started   bool               // Start succeeded: Produce accepts sends
	starting  bool               // a Start is loading the topics
	stopStart context.CancelFunc // ends the Start in progress (Close)
	closed    bool
	stopped   bool
	retention int64 // overflow retention.bytes; ≤ 0 is unlimited
	ovBytes   uint64
	ovRecords uint64
	backlog   []PartitionBacklog
	warned    map[int32]bool
	// The cluster overflow set in force (ApplyClusterSet).
	clusterVersion uint64
	clusterKeys    int
	clusterChanged chan struct{} // closed and replaced when it changes, and by Close
	// Sends not resolved by the client, oldest first. Their deadlines are
	// in the same order (the decision time is monotone and SendTimeout
	// fixed), so expireLoop only ever waits for the head.
	pendHead, pendTail *send
	kick               chan struct{} // wakes expireLoop when the list stops being empty

	accepted uint64        // sends accepted (resolved ones count in resolved)
	idle     chan struct{} // closed when resolved reaches accepted; nil if nobody waits

	resolved atomic.Uint64
	waiting  atomic.Bool // idle is set

	results                                         [numResults]atomic.Uint64
	lateAcks, untracked, mismatches, refreshErrors  atomic.Uint64
	retentionWarnings, barriersEntered, barriersNow atomic.Uint64
	clusterTruncated                                atomic.Uint64

	hot *client.HotKeys // the cluster hot-key sync; nil without Config.ClusterHotKeys

	collector *collector         // registered by Start
	cancel    context.CancelFunc // stops the goroutines Start started
	wg        sync.WaitGroup
	starts    sync.WaitGroup // a Start in progress; Close waits for it
	closeOnce sync.Once
}

// mainPart tracks the main sends to one main partition (as predicted from
// the key) in generations: an entry barrier closes the current generation
// and waits until it and every older one have resolved or expired, so
// that every main record of the key decided before the barrier has its
// offset (or has timed out: a record written after its send timed out is
// not covered). So a barrier waits at most SendTimeout, and only for its
// own partition.
type mainPart struct {
	maxAcked int64 // highest acknowledged offset, -1 if none
	cur      *mainGen
	gens     []*mainGen // closed, oldest first, not yet resolved
}

type mainGen struct {
	n       int // sends not yet resolved
	waiters []*keyState
}

type partOffset struct {
	partition int32
	offset    int64
}

// keyState is what the router knows of one key in overflow. There is at
// most one per key the policy holds in overflow (MaxOverflowKeys), plus
// released keys whose last records are still in flight.
type keyState struct {
	key      string
	keyBytes []byte
	byEntry  int    // index+1 in Router.byEntry that may refer to it, 0 if none
	inPolicy bool   // the policy holds the key in overflow (as far as we know)
	epoch    uint64 // Router.epoch at the latest entry
	entry    uint64 // entries so far; tags the records carrying waitMain

	pending     int          // overflow sends decided but not resolved by the client
	lastDecided time.Time    // decision time of the latest overflow send
	acked       []partOffset // highest acknowledged overflow offset per partition

	// Entry barrier.
	mainPart  int32   // the key's main partition
	waits     int     // main generations still to resolve
	gated     bool    // waits > 0: records are held
	releasing bool    // release is producing held records
	held      []*send // overflow sends waiting for the barrier, in order
	waitMain  []byte  // HeaderWaitMain value until a record carrying it is acknowledged
}

type send struct {
	r       *Router
	ctx     context.Context
	rec     *kgo.Record
	promise func(*kgo.Record, error)
	st      *keyState // overflow sends of tracked keys
	gen     *mainGen  // main sends; nil once counted as resolved
	pred    int32     // main sends: predicted partition
	carries uint64    // keyState.entry whose waitMain this record carries, 0 if none
	lane    Lane
	done    atomic.Bool // resolved: the promise has been called

	// Guarded by Router.mu: the pending list.
	deadline   int64 // Unix ns
	prev, next *send
	linked     bool
	expired    bool // timed out before the client resolved it
}

// NewRouter returns a router that will produce with cl and read offsets
// and metadata with adm; call Start before Produce. It checks what can be
// checked without IO: that cl and adm are not nil, that cl's partitioner
// places keys as Kafka's Java client does (murmur2; franz-go's default
// partitioner and kgo.StickyKeyPartitioner(nil) do), the configuration,
// the policy and Config.ClusterHotKeys. It sends nothing and starts no
// goroutine. Errors are *ConfigErrors (ErrBadConfig) naming the argument
// or field.
//
// The router does not own cl or adm: close them after Close. Build cl
// with kgo.RecordDeliveryTimeout at or below Config.SendTimeout so that the
// client, too, gives up on records it cannot deliver.
func NewRouter(cl *kgo.Client, adm *kadm.Client, cfg Config) (*Router, error) {
	switch {
	case cl == nil:
		return nil, configError("kafka.NewRouter", "cl", "(the *kgo.Client) is nil; build one with kgo.NewClient")
	case adm == nil:
		return nil, configError("kafka.NewRouter", "adm", "(the *kadm.Client) is nil; build one with kadm.NewClient(cl)")
	}
	p, _ := cl.OptValue(kgo.RecordPartitioner).(kgo.Partitioner)
	if err := checkPartitioner(p); err != nil {
		return nil, err
	}
	r, err := newRouter(cl, adm, cfg)
	if err != nil {
		return nil, err
	}
	if d, ok := cl.OptValue(kgo.RecordDeliveryTimeout).(time.Duration); ok && (d == 0 || d > r.cfg.SendTimeout) {
		r.log.Info("kafka router: the client's RecordDeliveryTimeout exceeds SendTimeout; sends past SendTimeout resolve with ErrTimeout but may still be written",
			"record_delivery_timeout", d, "send_timeout", r.cfg.SendTimeout)
	}
	return r, nil
}

func newRouter(prod producer, adm admin, cfg Config) (*Router, error) {
	cfg, err := cfg.withDefaults("kafka.NewRouter")
	if err != nil {
		return nil, err
	}
	pol, err := hotkey.NewPolicy(cfg.Policy)
	if err != nil {
		return nil, &ConfigError{Func: "kafka.NewRouter", Field: "Config.Policy", Err: err}
	}
	r := &Router{
		prod:      prod,
		adm:       adm,
		cfg:       cfg,
		clk:       cfg.Clock,
		log:       cfg.Logger,
		policy:    pol,
		keys:      make(map[string]*keyState),
		warned:    make(map[int32]bool),
		retention: -1,
		kick:      make(chan struct{}, 1),
		lastNs:    math.MinInt64,

		clusterChanged: make(chan struct{}),
	}
	_, r.realClock = cfg.Clock.(clock.Real)
	if cfg.ClusterHotKeys != nil {
		if r.hot, err = r.newHotKeys(cfg); err != nil {
			return nil, &ConfigError{Func: "kafka.NewRouter", Field: "Config.ClusterHotKeys", Err: err}
		}
	}
	return r, nil
}

// Backoff of Start between failed metadata requests.
const (
	startBackoffMin = 100 * time.Millisecond
	startBackoffMax = 5 * time.Second
)

// Start loads the topics' metadata (the main topic's partition count, and
// that every topic exists), registers the metrics with Config.Registerer
// and starts the router's goroutines (see Router). It returns once the
// router routes: until then Produce resolves with ErrNotStarted. ctx
// bounds only the loading; the goroutines run until Close.
//
// A producer that starts while Kafka is briefly unreachable (a rolling
// restart, a broker still starting) should wait for it rather than fail,
// so Start retries what may pass by waiting, a failed metadata request or
// a topic without a leader yet, with backoff from 100ms to 5s, logging each
// failure, until ctx ends; it then returns an error wrapping ctx.Err() and
// the last failure. Give it a deadline. A missing topic does not appear by
// waiting: Start returns at once a *ConfigError (ErrBadConfig) whose Field
// names the field ("Config.OverflowTopic"), whose message names the topic,
// and which wraps kerr.UnknownTopicOrPartition. *ConfigErrors also come
// from a topic the client may not describe (wrapping kerr's error) and
// from Config.Registerer refusing the metrics.
//
// A failed Start starts nothing, and may be called again (the Kafka
// client caches metadata, a missing topic included, for
// kgo.MetadataMinAge). Start returns ErrClosed after Close, or if Close
// ends it; and an error wrapping client.ErrInvalid if it has succeeded
// before or runs already (as the SDK's Run called twice).
func (r *Router) Start(ctx context.Context) error {
	r.mu.Lock()
	switch {
	case r.closed:
		r.mu.Unlock()
		return ErrClosed
	case r.started:
		r.mu.Unlock()
		return fmt.Errorf("%w: kafka: Router.Start called after it succeeded", client.ErrInvalid)
	case r.starting:
		r.mu.Unlock()
		return fmt.Errorf("%w: kafka: Router.Start called while another Start runs", client.ErrInvalid)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r.starting, r.stopStart = true, cancel
	r.starts.Add(1) // Close waits for it
	r.mu.Unlock()
	defer r.starts.Done()

	err := r.loadTopics(ctx)
	if err == nil && r.cfg.Registerer != nil {
		c := newCollector(r)
		if err = r.cfg.Registerer.Register(c); err != nil {
			err = &ConfigError{Func: "Router.Start", Field: "Config.Registerer", Reason: "refused the router's metrics (routers of the same topics on one registry need a label each: prometheus.WrapRegistererWith)", Err: err}
		} else {
			r.collector = c
		}
	}
	r.mu.Lock()
	r.starting, r.stopStart = false, nil
	closed := r.closed
	if err == nil && !closed {
		r.started = true
		r.run()
	}
	r.mu.Unlock()
	if closed {
		if r.collector != nil {
			r.cfg.Registerer.Unregister(r.collector)
			r.collector = nil
		}
		return ErrClosed
	}
	return err
}

// run starts the router's goroutines. r.mu is held.
func (r *Router) run() {
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	r.wg.Add(2)
	go r.loop(ctx)       // exits when Close cancels ctx
	go r.expireLoop(ctx) // exits when Close cancels ctx
	if r.hot != nil {
		r.wg.Add(1)
		go r.syncHotKeys(ctx) // exits when Close cancels ctx
	}
}

// loadTopics learns the partition count of the main topic, and that every
// topic exists. It retries transient failures with backoff until ctx ends
// (see Start).
func (r *Router) loadTopics(ctx context.Context) error {
	var last error // the last failure other than ctx's
	for wait := startBackoffMin; ; wait = min(2*wait, startBackoffMax) {
		n, retry, err := r.describeTopics(ctx)
		switch {
		case err == nil:
			r.mu.Lock()
			r.setMainPartitions(n)
			r.mu.Unlock()
			return nil
		case !retry:
			return err
		case ctx.Err() == nil:
			last = err
			r.log.Warn("kafka router: cannot load the topics yet; retrying", "err", err, "retry_in", wait)
			t := r.clk.NewTimer(wait)
			select {
			case <-t.C():
				continue
			case <-ctx.Done():
				t.Stop()
			}
		}
		if last == nil {
			last = err
		}
		return fmt.Errorf("kafka: start: waiting for the topics' metadata: %w; last failure: %w", ctx.Err(), last)
	}
}

// describeTopics reads the topics' metadata once and returns the main
// topic's partition count, or an error and whether it may pass by waiting.
func (r *Router) describeTopics(ctx context.Context) (mainN int32, retry bool, err error) {
	topics := []string{r.cfg.MainTopic, r.cfg.OverflowTopic}
	fields := []string{"MainTopic", "OverflowTopic"}
	if r.cfg.DeadLetterTopic != "" {
		topics = append(topics, r.cfg.DeadLetterTopic)
		fields = append(fields, "DeadLetterTopic")
	}
	td, err := r.adm.ListTopics(ctx, topics...)
	if err != nil {
		// The client retried already; only an error the broker says is
		// final (an authorization failure, say) is not worth waiting on.
		var ke *kerr.Error
		return 0, !errors.As(err, &ke) || ke.Retriable, fmt.Errorf("kafka: list topics: %w", err)
	}
	for i, t := range topics {
		d, ok := td[t]
		switch {
		case !ok: // not in the answer: the same
			d.Err = kerr.UnknownTopicOrPartition
			fallthrough
		case errors.Is(d.Err, kerr.UnknownTopicOrPartition):
			return 0, false, &ConfigError{Func: "Router.Start", Field: "Config." + fields[i], Reason: fmt.Sprintf("%q: topic not found; create it or fix the name", t), Err: d.Err}
		case kerr.IsRetriable(d.Err): // a leader election, a topic being created
			return 0, true, fmt.Errorf("kafka: Config.%s %q: %w", fields[i], t, d.Err)
		case d.Err != nil:
			return 0, false, &ConfigError{Func: "Router.Start", Field: "Config." + fields[i], Reason: fmt.Sprintf("%q", t), Err: d.Err}
		case len(d.Partitions) == 0:
			return 0, false, configError("Router.Start", "Config."+fields[i], "%q: no partitions", t)
		}
	}
	return int32(len(td[r.cfg.MainTopic].Partitions)), false, nil
}

func (r *Router) setMainPartitions(n int32) {
	if n <= 0 {
		return
	}
	r.mainN = n
	r.part(n - 1)
}

// part returns the tracker of main partition p, growing the table.
func (r *Router) part(p int32) *mainPart {
	for int(p) >= len(r.parts) {
		r.parts = append(r.parts, mainPart{maxAcked: -1, cur: &mainGen{}})
	}
	return &r.parts[p]
}

// Produce routes rec by the policy and produces it asynchronously, calling
// promise exactly once (nil promise: ignore the result): with nil once the
// broker has acknowledged it, or with an error. It sets rec.Topic to the
// lane's topic and keeps rec.Key, so that partitioning by key puts a hot
// key on one overflow partition. Errors: ErrMissingKey, ErrDropped,
// ErrNoDeadLetterTopic, ErrNotStarted and ErrClosed (promise called before
// Produce returns), ErrTimeout (SendTimeout passed), or the client's error.
//
// Produce blocks only while the client's buffer is full (see
// kgo.MaxBufferedRecords), bounded by ctx. The router owns rec until
// promise is called; do not reuse rec after an ErrTimeout. With the real
// clock, a zero rec.Timestamp is set to the decision time (the client
// would read the same clock).
func (r *Router) Produce(ctx context.Context, rec *kgo.Record, promise func(*kgo.Record, error)) {
	if promise == nil {
		promise = func(*kgo.Record, error) {}
	}
	if rec == nil {
		r.results[resMissingKey].Add(1)
		promise(nil, fmt.Errorf("%w: nil record", ErrMissingKey))
		return
	}
	if len(rec.Key) == 0 {
		if err := r.fillKey(rec); err != nil {
			r.results[resMissingKey].Add(1)
			promise(rec, err)
			return
		}
	}
	s := &send{r: r, ctx: ctx, rec: rec, promise: promise}
	now := r.clk.Now() // outside the lock
	r.mu.Lock()
	if !r.started || r.closed {
		err := ErrNotStarted
		if r.closed {
			err = ErrClosed
		}
		r.mu.Unlock()
		r.results[resFailed].Add(1)
		promise(rec, err)
		return
	}
	act, wake := r.accept(s, now)
	r.mu.Unlock()
	if wake {
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
	switch act {
	case actDrop:
		r.results[resDropped].Add(1)
		promise(rec, ErrDropped)
		return
	case actNoDeadLetter:
		r.results[resFailed].Add(1)
		promise(rec, ErrNoDeadLetterTopic)
		return
	}
	if act == actProduce {
		r.prod.Produce(ctx, rec, s.produced)
	}
}

// accept routes s and, unless it fails at once, counts it and starts its
// timeout; wake reports that the pending list was empty. r.mu is held.
func (r *Router) accept(s *send, now time.Time) (act action, wake bool) {
	act = r.route(s, now)
	if act >= actHold {
		r.accepted++
		s.deadline = r.lastNs + int64(r.cfg.SendTimeout)
		wake = r.pendHead == nil
		r.link(s)
	}
	return act, wake
}

// link appends s to the pending list. r.mu is held.
func (r *Router) link(s *send) {
	s.prev, s.linked = r.pendTail, true
	if r.pendTail != nil {
		r.pendTail.next = s
	} else {
		r.pendHead = s
	}
	r.pendTail = s
}

// unlink removes s from the pending list. r.mu is held.
func (r *Router) unlink(s *send) {
	if !s.linked {
		return
	}
	if s.prev != nil {
		s.prev.next = s.next
	} else {
		r.pendHead = s.next
	}
	if s.next != nil {
		s.next.prev = s.prev
	} else {
		r.pendTail = s.prev
	}
	s.prev, s.next, s.linked = nil, nil, false
}

// expireLoop resolves with ErrTimeout every send that the client has not
// resolved by its deadline. It exits when ctx is done.
func (r *Router) expireLoop(ctx context.Context) {
	defer r.wg.Done()
	var expired []*send
	for {
		r.mu.Lock()
		now := r.clk.Now().UnixNano()
		for s := r.pendHead; s != nil && s.deadline <= now; s = r.pendHead {
			r.unlink(s)
			s.expired = true
			if s.lane == Main {
				r.mainDone(s) // barriers stop waiting for it
			}
			expired = append(expired, s)
		}
		wait := time.Duration(-1)
		if r.pendHead != nil {
			wait = time.Duration(r.pendHead.deadline - now)
		}
		r.mu.Unlock()
		for i, s := range expired {
			s.resolve(ErrTimeout)
			expired[i] = nil
		}
		expired = expired[:0]
		if wait < 0 {
			select {
			case <-r.kick:
			case <-ctx.Done():
				return
			}
			continue
		}
		// Sends linked meanwhile have later deadlines: no need to wake
		// before this one.
		t := r.clk.NewTimer(wait)
		select {
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

// ProduceSync is Produce that waits for the result.
func (r *Router) ProduceSync(ctx context.Context, rec *kgo.Record) error {
	done := make(chan error, 1)
	r.Produce(ctx, rec, func(_ *kgo.Record, err error) { done <- err })
	return <-done // every send resolves within SendTimeout
}

func (r *Router) fillKey(rec *kgo.Record) error {
	if r.cfg.KeyFunc == nil {
		return ErrMissingKey
	}
	k, err := r.cfg.KeyFunc(rec)
	switch {
	case err != nil:
		return fmt.Errorf("%w: Config.KeyFunc: %w", ErrMissingKey, err)
	case len(k) == 0:
		return fmt.Errorf("%w: Config.KeyFunc returned an empty key", ErrMissingKey)
	}
	rec.Key = k
	return nil
}

// route decides where s goes at now (made monotone here) and updates the
// lane bookkeeping. r.mu is held.
func (r *Router) route(s *send, now time.Time) action {
	rec := s.rec
	if ns := now.UnixNano(); ns < r.lastNs {
		now = r.last
	} else {
		r.last, r.lastNs = now, ns
	}
	if r.realClock && rec.Timestamp.IsZero() {
		rec.Timestamp = now // what the client would read; it need not read it again
	}
	d, entry := r.policy.DecideEntry(rec.Key, now)
	switch d.Outcome {
	case hotkey.Main:
		if d.Reason == hotkey.Released {
			r.leaveOverflow(rec)
		}
		r.toMain(s)
		return actProduce
	case hotkey.Overflow:
		return r.toOverflow(s, entry, d.Spread, now)
	case hotkey.SkipStateful:
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: HeaderSkipStateful, Value: []byte("1")})
		r.toMain(s)
		return actProduce
	case hotkey.DeadLetter:
		if r.cfg.DeadLetterTopic == "" {
			return actNoDeadLetter
		}
		rec.Topic = r.cfg.DeadLetterTopic
		s.lane = DeadLetter
		return actProduce
	}
	return actDrop // hotkey.Drop; Rejected cannot happen with a key
}

func (r *Router) toMain(s *send) {
	s.rec.Topic = r.cfg.MainTopic
	s.lane = Main
	p := KeyPartition(s.rec.Key, r.mainN)
	g := r.part(p).cur
	g.n++
	s.gen, s.pred = g, p
}

// toOverflow sends s to overflow; entry is the key's overflow entry in the
// policy, or −1 if the policy does not hold the key (see
// hotkey.Policy.DecideEntry).
func (r *Router) toOverflow(s *send, entry int, spread bool, now time.Time) action {
	rec := s.rec
	rec.Topic = r.cfg.OverflowTopic
	s.lane = Overflow
	key := rec.Key
	if spread {
		// A random partition: remove the key so it is not hashed, and
		// keep it in a header for the consumers.
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: HeaderKey, Value: key})
		rec.Key = nil
	}
	var st *keyState
	if entry >= 0 {
		if st = r.cachedKey(entry, key); st == nil {
			if st = r.keys[string(key)]; st == nil {
				st = &keyState{key: string(key), keyBytes: append([]byte(nil), key...)}
				r.keys[st.key] = st
			}
			r.cacheKey(entry, st)
		}
	} else if st = r.keys[string(key)]; st == nil {
		// The policy does not hold the key (MaxOverflowKeys).
		r.untracked.Add(1)
		return actProduce
	}
	if !st.inPolicy || st.epoch != r.epoch {
		r.enter(st)
	}
	st.pending++
	st.lastDecided = now
	s.st = st
	if st.gated || st.releasing {
		st.held = append(st.held, s)
		r.held++
		return actHold
	}
	if st.waitMain != nil {
		s.carryWait(st)
	}
	return actProduce
}

// cachedKey returns the state of key, whose overflow entry in the policy is
// entry, if byEntry has it. r.mu is held.
func (r *Router) cachedKey(entry int, key []byte) *keyState {
	if entry < len(r.byEntry) {
		if st := r.byEntry[entry]; st != nil && st.key == string(key) {
			return st
		}
	}
	return nil
}

// cacheKey makes st, which is in keys, byEntry's state for the key of the
// policy's overflow entry entry, and drops its former place, so that each
// state has at most one. r.mu is held.
func (r *Router) cacheKey(entry int, st *keyState) {
	if entry >= len(r.byEntry) {
		r.byEntry = append(r.byEntry, make([]*keyState, entry+1-len(r.byEntry))...)
	}
	r.uncacheKey(st)
	r.byEntry[entry] = st
	st.byEntry = entry + 1
}

// uncacheKey removes st from byEntry. r.mu is held.
func (r *Router) uncacheKey(st *keyState) {
	if i := st.byEntry - 1; i >= 0 && r.byEntry[i] == st {
		r.byEntry[i] = nil
	}
	st.byEntry = 0
}

// enter starts st's stay in overflow: its first records must wait for the
// main records of the key decided before, and carry their position.
func (r *Router) enter(st *keyState) {
	r.barriersEntered.Add(1)
	st.inPolicy = true
	st.epoch = r.epoch
	st.entry++
	st.waitMain = nil
	p := KeyPartition(st.keyBytes, r.mainN)
	st.mainPart = p
	mp := r.part(p)
	var g *mainGen
	switch {
	case mp.cur.n > 0:
		g = mp.cur
		mp.gens = append(mp.gens, g)
		mp.cur = &mainGen{}
	case len(mp.gens) > 0:
		g = mp.gens[len(mp.gens)-1]
	default:
		r.barriersNow.Add(1)
		st.waitMain = r.waitMainValue(p)
		return
	}
	g.waiters = append(g.waiters, st)
	st.waits++
	st.gated = true
}

func (r *Router) waitMainValue(p int32) []byte {
	off := r.part(p).maxAcked
	if off < 0 {
		return nil // this router has no main record there to wait for
	}
	return position(p, off)
}

func position(p int32, off int64) []byte {
	b := strconv.AppendInt(make([]byte, 0, 24), int64(p), 10)
	return strconv.AppendInt(append(b, ':'), off, 10)
}

// carryWait adds st's HeaderWaitMain to s. r.mu is held, and s has not
// expired (its promise has not been called).
func (s *send) carryWait(st *keyState) {
	s.rec.Headers = append(s.rec.Headers, kgo.RecordHeader{Key: HeaderWaitMain, Value: st.waitMain})
	s.carries = st.entry
}

// leaveOverflow handles a key's release to main: the record carries the
// position of the key's last overflow record.
func (r *Router) leaveOverflow(rec *kgo.Record) {
	st := r.keys[string(rec.Key)]
	if st == nil {
		return
	}
	if len(st.acked) == 1 {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{
			Key: HeaderWaitOverflow, Value: position(st.acked[0].partition, st.acked[0].offset),
		})
	}
	st.inPolicy = false
	r.maybeForget(st)
}

func (r *Router) maybeForget(st *keyState) {
	if st.inPolicy || st.pending > 0 || st.gated || st.releasing || len(st.held) > 0 {
		return
	}
	if r.keys[st.key] == st {
		delete(r.keys, st.key)
	}
	r.uncacheKey(st)
}

// mainDone counts main send s as resolved in its generation, once, and
// opens the barriers that no longer wait for anything. r.mu is held.
func (r *Router) mainDone(s *send) {
	g := s.gen
	if g == nil {
		return
	}
	s.gen = nil
	g.n--
	mp := r.part(s.pred)
	for len(mp.gens) > 0 && mp.gens[0].n == 0 {
		g := mp.gens[0]
		mp.gens[0] = nil
		mp.gens = mp.gens[1:]
		for _, st := range g.waiters {
			r.openBarrier(st)
		}
	}
}

func (r *Router) openBarrier(st *keyState) {
	st.waits--
	if st.waits > 0 {
		return
	}
	st.gated = false
	st.waitMain = r.waitMainValue(st.mainPart)
	if len(st.held) == 0 {
		r.maybeForget(st)
		return
	}
	if r.stopped {
		// Close has seen every send resolve: the held ones timed out.
		r.held -= len(st.held)
		st.pending -= len(st.held)
		st.held = nil
		r.maybeForget(st)
		return
	}
	st.releasing = true
	r.wg.Add(1)
	go r.release(st) // exits once st.held is empty
}

// release produces st's held records in order, from its own goroutine
// (the client's promises must not produce). Records decided meanwhile are
// appended to st.held and produced by a later round, so order holds.
func (r *Router) release(st *keyState) {
	defer r.wg.Done()
	for {
		r.mu.Lock()
		batch := st.held
		st.held = nil
		r.held -= len(batch)
		if len(batch) == 0 || r.stopped {
			st.pending -= len(batch)
			st.releasing = false
			r.maybeForget(st)
			r.mu.Unlock()
			return
		}
		live := batch[:0]
		for _, s := range batch {
			if s.expired { // timed out while held: never produced
				st.pending--
				continue
			}
			if st.waitMain != nil {
				s.carryWait(st)
			}
			live = append(live, s)
		}
		r.mu.Unlock()
		for _, s := range live {
			r.prod.Produce(s.ctx, s.rec, s.produced)
		}
	}
}

func (st *keyState) addAck(p int32, off int64) {
	for i := range st.acked {
		if st.acked[i].partition == p {
			st.acked[i].offset = max(st.acked[i].offset, off)
			return
		}
	}
	st.acked = append(st.acked, partOffset{p, off})
}

// produced is the client's promise: it updates the bookkeeping (even after
// the send timed out) and resolves the send.
func (s *send) produced(rec *kgo.Record, err error) {
	r := s.r
	r.mu.Lock()
	r.unlink(s)
	switch s.lane {
	case Main:
		if err == nil {
			if rec.Partition != s.pred {
				r.mismatches.Add(1) // stale partition count; Refresh reloads it
			}
			mp := r.part(rec.Partition)
			mp.maxAcked = max(mp.maxAcked, rec.Offset)
		}
		r.mainDone(s)
	case Overflow:
		if err == nil {
			r.ovRecords++
			r.ovBytes += uint64(recordSize(rec))
		}
		if st := s.st; st != nil {
			st.pending--
			if err == nil {
				st.addAck(rec.Partition, rec.Offset)
				if s.carries != 0 && s.carries == st.entry {
					st.waitMain = nil // the barrier is in the topic
				}
			}
			r.maybeForget(st)
		}
	}
	r.mu.Unlock()
	if !s.resolve(err) && err == nil {
		r.lateAcks.Add(1)
	}
}

func recordSize(rec *kgo.Record) int {
	n := len(rec.Key) + len(rec.Value)
	for _, h := range rec.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// resolve calls the promise unless the send has resolved already, and
// reports whether it did.
func (s *send) resolve(err error) bool {
	if !s.done.CompareAndSwap(false, true) {
		return false
	}
	r := s.r
	res := resFailed
	switch {
	case err == nil:
		res = [...]result{Main: resMain, Overflow: resOverflow, DeadLetter: resDeadLetter}[s.lane]
	case errors.Is(err, ErrTimeout):
		res = resTimedOut
	}
	r.results[res].Add(1)
	s.promise(s.rec, err)
	r.resolved.Add(1)
	if r.waiting.Load() {
		r.mu.Lock()
		if r.idle != nil && r.resolved.Load() == r.accepted {
			close(r.idle)
			r.idle = nil
			r.waiting.Store(false)
		}
		r.mu.Unlock()
	}
	return true
}

// Flush waits until every send accepted so far has resolved, or ctx is
// done. It does not flush the client's buffer (a client that lingers keeps
// records until its linger passes).
func (r *Router) Flush(ctx context.Context) error {
	r.mu.Lock()
	// waiting is set before resolved is read, and a resolve reads waiting
	// after counting: one of the two sees the other.
	if r.idle == nil {
		r.waiting.Store(true)
	}
	if r.resolved.Load() == r.accepted {
		if r.idle == nil {
			r.waiting.Store(false)
		}
		r.mu.Unlock()
		return nil
	}
	if r.idle == nil {
		r.idle = make(chan struct{})
	}
	ch := r.idle
	r.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops accepting sends (Produce resolves with ErrClosed), ends a
// Start in progress (which returns ErrClosed) and waits until it has
// returned, waits until every accepted send has resolved (at most
// SendTimeout), stops the router's goroutines (the cluster hot-key sync
// included) and unregisters its metrics. It is idempotent, safe to call
// concurrently and without Start; every call returns once the router is
// closed. It closes neither the Kafka client nor the admin client, nor the
// Keyshard client of Config.ClusterHotKeys.
func (r *Router) Close() {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		r.closed = true
		close(r.clusterChanged) // WaitClusterVersion returns ErrClosed
		r.clusterChanged = make(chan struct{})
		stopStart := r.stopStart
		r.mu.Unlock()
		if stopStart != nil {
			stopStart()
		}
		r.starts.Wait()
		_ = r.Flush(context.Background()) // bounded: every send expires by its deadline
		r.mu.Lock()
		r.stopped = true
		for _, st := range r.keys {
			r.held -= len(st.held)
			st.pending -= len(st.held)
			st.held = nil
		}
		cancel := r.cancel // nil without Start
		r.mu.Unlock()
		if cancel != nil {
			cancel()
		}
		r.wg.Wait()
		if r.hot != nil {
			_ = r.hot.Close() // it never ran without Start; always nil
		}
		if r.collector != nil {
			r.cfg.Registerer.Unregister(r.collector)
		}
	})
}

func (r *Router) loop(ctx context.Context) {
	defer r.wg.Done()
	t := r.clk.NewTicker(r.cfg.RefreshInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			rctx, cancel := context.WithTimeout(ctx, r.cfg.SendTimeout)
			if err := r.Refresh(rctx); err != nil && ctx.Err() == nil {
				r.log.Warn("kafka router: refresh", "err", err)
			}
			cancel()
		}
	}
}

// SetEnabled is the kill switch: SetEnabled(false) sends to main every
// record that would go to overflow, at once and without barriers, so main
// and overflow may then process one key at the same time (see
// hotkey.Policy.SetEnabled). SetEnabled(true) resumes; a key that goes back
// to overflow passes an entry barrier again.
func (r *Router) SetEnabled(on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if on && !r.policy.Enabled() {
		r.epoch++
	}
	r.policy.SetEnabled(on)
}

// Enabled reports the kill switch's state (false: overflow disabled).
func (r *Router) Enabled() bool { return r.policy.Enabled() }

// SetRules replaces the operator rules (nil for none). It returns a
// *ConfigError (ErrBadConfig) naming Config.DeadLetterTopic if a
// dead-letter rule has no dead-letter topic; the rules in force stay.
func (r *Router) SetRules(rs *hotkey.Rules) error {
	if err := checkDeadLetter("Router.SetRules", rs, r.cfg.DeadLetterTopic); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.policy.SetRules(rs)
	return nil
}

// OverflowKeys returns the keys the policy holds in overflow.
func (r *Router) OverflowKeys() []hotkey.OverflowKey {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.policy.AppendOverflowKeys(nil)
}

// PartitionBacklog is the unconsumed backlog of one overflow partition as
// of the latest Refresh.
type PartitionBacklog struct {
	Partition int32
	// Messages is the end offset minus the overflow group's committed
	// offset (the log start offset if it has none).
	Messages int64
	// BytesEstimate is Messages times the mean size of the overflow
	// records this router produced (0 before the first one).
	BytesEstimate int64
	// NearRetention: BytesEstimate has reached RetentionWarnFraction of the
	// topic's retention.bytes, so unconsumed records may soon be deleted.
	NearRetention bool
}

// Stats is a snapshot of a router's counters. Every Produce call counts
// once, when it resolves, in exactly one of Main, Overflow, DeadLetter
// (acknowledged), Dropped, MissingKey, Failed or TimedOut; until then it
// is Pending.
type Stats struct {
	Main, Overflow, DeadLetter            uint64
	Dropped, MissingKey, Failed, TimedOut uint64
	Pending                               int
	// LateAcks counts records acknowledged after their send timed out.
	LateAcks uint64
	// Held is the number of overflow records waiting at an entry barrier.
	Held int
	// Barriers counts keys entering overflow; BarriersImmediate those of
	// them that had no main record in flight to wait for.
	Barriers, BarriersImmediate uint64
	// TrackedKeys is the number of keys with overflow state in the router.
	TrackedKeys int
	// Untracked counts overflow records of keys the policy could not hold
	// (MaxOverflowKeys): they pass no barrier.
	Untracked uint64
	// PartitionMismatches counts main records that the client put on
	// another partition than the router predicted from the partition count
	// it knew (the topic grew; Refresh reloads the count).
	PartitionMismatches uint64
	RefreshErrors       uint64
	RetentionWarnings   uint64
	Policy              hotkey.Counters
	Backlog             []PartitionBacklog
	// Cluster is the cluster-wide hot-key state: the set in force, and
	// the sync's counters with Config.ClusterHotKeys.
	Cluster ClusterStats
}

// Resolved returns the number of sends that have resolved.
func (s Stats) Resolved() uint64 {
	return s.Main + s.Overflow + s.DeadLetter + s.Dropped + s.MissingKey + s.Failed + s.TimedOut
}

// Stats returns a snapshot of the counters.
func (r *Router) Stats() Stats {
	r.mu.Lock()
	st := Stats{
		Held:        r.held,
		TrackedKeys: len(r.keys),
		Policy:      r.policy.Counters(),
		Backlog:     append([]PartitionBacklog(nil), r.backlog...),
		Pending:     int(r.accepted - r.resolved.Load()),
		Cluster:     ClusterStats{Version: r.clusterVersion, Keys: r.clusterKeys},
	}
	r.mu.Unlock()
	st.Cluster.TruncatedKeys = r.clusterTruncated.Load()
	if r.hot != nil {
		st.Cluster.Sync = r.hot.Stats()
	}
	st.Main = r.results[resMain].Load()
	st.Overflow = r.results[resOverflow].Load()
	st.DeadLetter = r.results[resDeadLetter].Load()
	st.Dropped = r.results[resDropped].Load()
	st.MissingKey = r.results[resMissingKey].Load()
	st.Failed = r.results[resFailed].Load()
	st.TimedOut = r.results[resTimedOut].Load()
	st.LateAcks = r.lateAcks.Load()
	st.Barriers = r.barriersEntered.Load()
	st.BarriersImmediate = r.barriersNow.Load()
	st.Untracked = r.untracked.Load()
	st.PartitionMismatches = r.mismatches.Load()
	st.RefreshErrors = r.refreshErrors.Load()
	st.RetentionWarnings = r.retentionWarnings.Load()
	return st
}
