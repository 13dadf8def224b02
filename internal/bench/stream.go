package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/keyshard/keyshard/client/stream"
	"github.com/keyshard/keyshard/internal/demo"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/placement"
)

// StreamReport is the output of `keyshard bench stream --json`: stream
// mode's parts against issue 10's targets: commit_bytes_uniform_4096 ≤
// 1,024, commits_per_s ≥ 1,000, catchup_filter_events_per_s ≥ 10,000,000.
//
// Commits are measured twice. Through the API (commits_per_s and the
// commit_* figures): a keyshard server on an embedded etcd of its own
// (fsync on, as in production), one worker holding 4,096 buckets that
// keeps streamInFlight Commit calls in flight through the Go connect
// client, each at a higher position than the last. At the store
// (..._store_...): store.CommitPositions, one commit after the other, the
// write one Commit call costs when nothing is coalesced.
type StreamReport struct {
	// CommitBytesUniform4096 is the stored size of one member's commit
	// covering 4,096 held buckets at one position; CommitBytes16Exceptions
	// of one with 16 buckets behind, each with its own position.
	CommitBytesUniform4096  int `json:"commit_bytes_uniform_4096"`
	CommitBytes16Exceptions int `json:"commit_bytes_16_exceptions"`
	// CommitsPerS is the median rate of acknowledged Commit calls of one
	// worker through the API; CommitAPIP50Ms and CommitAPIP99Ms are over
	// every call of every run. CommitWritesPerCall is etcd revisions per
	// call: below 1 when concurrent calls share a write.
	// CommitsOvertaken counts calls refused because a concurrent higher
	// commit of the worker was written first (FAILED_PRECONDITION
	// "backwards": the position is covered).
	CommitsPerS         float64 `json:"commits_per_s"`
	CommitWritesPerCall float64 `json:"commit_writes_per_call"`
	CommitAPIP50Ms      float64 `json:"commit_api_p50_ms"`
	CommitAPIP99Ms      float64 `json:"commit_api_p99_ms"`
	CommitsOvertaken    int     `json:"commits_overtaken"`
	CommitInFlight      int     `json:"commit_in_flight"`
	// CommitsPerSStoreSequential is the median rate of sequential
	// store.CommitPositions of one member; CommitStoreP50Ms and
	// CommitStoreP99Ms are over every commit of every run;
	// CommitStoreWritesPerCall is etcd revisions per commit (1: one write).
	CommitsPerSStoreSequential float64 `json:"commits_per_s_store_sequential"`
	CommitStoreP50Ms           float64 `json:"commit_store_p50_ms"`
	CommitStoreP99Ms           float64 `json:"commit_store_p99_ms"`
	CommitStoreWritesPerCall   float64 `json:"commit_store_writes_per_call"`
	// CatchupFilterEventsPerS is the median rate of the SDK's
	// filter-and-merge stage (stream.Flow.Catchup, records in memory) in
	// an xxh64 keyspace; ...SHA256 in a synapse-sha256 one.
	CatchupFilterEventsPerS       float64 `json:"catchup_filter_events_per_s"`
	CatchupFilterSHA256EventsPerS float64 `json:"catchup_filter_sha256_events_per_s"`
	// Moves under load (one run of `keyshard demo --mode stream`, whose
	// checks must pass): GracefulMoveDuplicates counts events handled
	// again after a graceful release of their bucket (target 0);
	// CrashDuplicates those handled again after a crash, and
	// CrashDuplicatesBound how many events the crashed holders had handled
	// after their last commit (target: CrashDuplicates <= the bound).
	MoveEvents             int `json:"move_events"`
	GracefulMoveDuplicates int `json:"graceful_move_duplicates"`
	CrashDuplicates        int `json:"crash_duplicates"`
	CrashDuplicatesBound   int `json:"crash_duplicates_bound"`
	Runs                   int `json:"runs"`
}

const (
	streamBuckets  = 4096
	streamCommits  = 500 // per run, at the store
	streamInFlight = 8   // Commit calls in flight, through the API
	streamAPIRun   = 3 * time.Second
	streamMovesRun = 10 * time.Second
)

// Stream measures stream mode's commit record, its store write and the
// SDK's catch-up stage, writing one progress line per step to progress.
func Stream(ctx context.Context, runs int, progress io.Writer) (StreamReport, error) {
	if runs <= 0 {
		runs = 3
	}
	rep := StreamReport{Runs: runs}
	uniform := shard.Commit{Session: 0x7fffffffffffffff, MaxToken: 1 << 40, Default: 1 << 40}
	b, err := store.EncodeCommit(uniform)
	if err != nil {
		return rep, err
	}
	rep.CommitBytesUniform4096 = len(b)
	behind := uniform
	for i := range 16 {
		behind.Exceptions = append(behind.Exceptions, shard.BucketPosition{Bucket: i * 256, Token: 1 << 40, Position: 1<<40 - uint64(i)*1000})
	}
	if b, err = store.EncodeCommit(behind); err != nil {
		return rep, err
	}
	rep.CommitBytes16Exceptions = len(b)
	fmt.Fprintf(progress, "stream 1/5  commit record: %d bytes for 4,096 buckets at one position, %d with 16 behind\n", rep.CommitBytesUniform4096, rep.CommitBytes16Exceptions)

	if err := streamCommitRuns(ctx, runs, &rep, progress); err != nil {
		return rep, err
	}
	if err := streamAPIRuns(ctx, runs, &rep, progress); err != nil {
		return rep, err
	}

	for i, mode := range []placement.HashMode{placement.HashXXH64, placement.HashSynapse} {
		var rates []float64
		for range runs {
			r, err := catchupRate(mode)
			if err != nil {
				return rep, err
			}
			rates = append(rates, r)
		}
		if i == 0 {
			rep.CatchupFilterEventsPerS = medianOf(rates)
		} else {
			rep.CatchupFilterSHA256EventsPerS = medianOf(rates)
		}
		fmt.Fprintf(progress, "stream 4/5  catch-up filter and merge, %s: %.1fM records/s\n", mode, medianOf(rates)/1e6)
	}

	// Moves under load: the stream demo's schedule, once.
	fmt.Fprintf(progress, "stream 5/5  moves under load: `keyshard demo --mode stream` for %v (joins, a graceful leave, a kill)\n", streamMovesRun)
	d, err := demo.RunStream(ctx, demo.StreamOptions{Duration: streamMovesRun, Rate: 2000, Buckets: 256})
	if err != nil {
		return rep, fmt.Errorf("moves under load: %w", err)
	}
	if !d.OK {
		return rep, fmt.Errorf("moves under load: the stream demo's checks failed: %+v", d.Report)
	}
	rep.MoveEvents, rep.GracefulMoveDuplicates, rep.CrashDuplicates, rep.CrashDuplicatesBound = d.Events, d.DuplicatesGraceful, d.DuplicatesCrash, d.DuplicatesCrashBound
	fmt.Fprintf(progress, "stream 5/5  %d events, %d graceful releases, %d crashed grants: %d duplicates after graceful moves, %d after the crash (bound %d)\n",
		d.Events, d.Releases, d.Crashes, d.DuplicatesGraceful, d.DuplicatesCrash, d.DuplicatesCrashBound)
	return rep, nil
}

// streamCommitRuns times sequential CommitPositions of one member holding
// streamBuckets buckets of a stream keyspace, on an embedded etcd of its
// own (fsync on, as in production).
func streamCommitRuns(ctx context.Context, runs int, rep *StreamReport, progress io.Writer) (err error) {
	dir, err := os.MkdirTemp("", "keyshard-bench-stream-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	log := slog.New(slog.DiscardHandler)
	emb, err := store.StartEmbedded(ctx, store.EmbeddedConfig{Dir: filepath.Join(dir, "etcd"), Name: "bench", Logger: log})
	if err != nil {
		return err
	}
	defer emb.Close()
	st, err := store.Open(ctx, store.Config{Endpoints: emb.Endpoints(), Logger: log})
	if err != nil {
		return err
	}
	defer st.Close()
	const ks, id = "bench-stream", "sender-1"
	if _, err := st.CreateKeyspace(ctx, shard.Keyspace{Name: ks, Buckets: streamBuckets, Hash: placement.HashXXH64,
		Mode: shard.ModeStream, LeaseTTL: 10 * time.Second, DrainTimeout: 30 * time.Second}); err != nil {
		return err
	}
	member, err := st.NewSession(ctx, 10*time.Second)
	if err != nil {
		return err
	}
	defer member.Close()
	lease := member.LeaseID()
	if _, _, err := st.Join(ctx, ks, shard.Member{ID: id, Weight: 1, JoinedAt: time.Now()}, lease, false); err != nil {
		return err
	}
	leader, err := st.NewSession(ctx, 10*time.Second)
	if err != nil {
		return err
	}
	defer leader.Close()
	fence, err := st.NewElection(leader).Campaign(ctx, "bench")
	if err != nil {
		return err
	}
	g := shard.Grants{Session: lease}
	for bk := range streamBuckets {
		g.Buckets = append(g.Buckets, shard.BucketToken{Bucket: bk, Token: 1})
	}
	if _, err := st.Commit(ctx, fence, []store.Write{store.PutGrants(ks, id, g), store.PutTokens(ks, 1)}, nil); err != nil {
		return err
	}

	var all []time.Duration
	var rates []float64
	var writes, calls int64
	pos := uint64(0)
	for run := range runs {
		first, err := st.Rev(ctx)
		if err != nil {
			return err
		}
		start := time.Now()
		for range streamCommits {
			pos += 100
			t0 := time.Now()
			if _, err := st.CommitPositions(ctx, ks, id, lease, shard.Commit{Session: lease, MaxToken: 1, Default: pos}); err != nil {
				return fmt.Errorf("commit at position %d: %w", pos, err)
			}
			all = append(all, time.Since(t0))
		}
		elapsed := time.Since(start)
		last, err := st.Rev(ctx)
		if err != nil {
			return err
		}
		writes += last - first
		calls += streamCommits
		rates = append(rates, streamCommits/elapsed.Seconds())
		fmt.Fprintf(progress, "stream 2/5  store, run %d/%d: %d commits of 4,096 buckets in %v (%.0f/s), %d etcd writes\n",
			run+1, runs, streamCommits, elapsed.Round(time.Millisecond), rates[len(rates)-1], last-first)
	}
	rep.CommitsPerSStoreSequential = medianOf(rates)
	rep.CommitStoreP50Ms, rep.CommitStoreP99Ms = percentileMs(all, 50), percentileMs(all, 99)
	rep.CommitStoreWritesPerCall = float64(writes) / float64(calls)
	return nil
}

// catchupRate is records/s of stream.Flow.Catchup on 64 Ki records of
// 10,000 keys, for a worker that gains a quarter of 4,096 buckets from
// the start of the stream while it holds another quarter at the end.
func catchupRate(mode placement.HashMode) (float64, error) {
	const n = 1 << 16
	h, err := placement.NewHasher(mode, streamBuckets)
	if err != nil {
		return 0, err
	}
	recs := make([]stream.Record, n)
	for i := range recs {
		recs[i] = stream.Record{Key: fmt.Appendf(nil, "matrix-%d.example.org", i*7919%10000), Position: uint64(i)}
	}
	var held, gained []stream.BucketPosition
	for bk := 0; bk < streamBuckets/2; bk += 2 {
		held = append(held, stream.BucketPosition{Bucket: bk, Position: n})
		gained = append(gained, stream.BucketPosition{Bucket: bk + 1})
	}
	deliver := func(stream.Record) error { return nil }
	var failed error
	res := testing.Benchmark(func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			f, err := stream.NewFlow(h, n)
			if err == nil {
				err = errors.Join(f.Gain(held...), f.Gain(gained...))
			}
			if err != nil {
				failed = err
				return
			}
			b.StartTimer()
			if merged, err := f.Catchup(0, recs, n, deliver); err != nil || !merged {
				failed = fmt.Errorf("catch-up: merged %v, %v", merged, err)
				return
			}
		}
	})
	if failed != nil {
		return 0, failed
	}
	return float64(n) * float64(res.N) / res.T.Seconds(), nil
}
