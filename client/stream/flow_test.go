package stream

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/placement"
)

// memLog is a stream in memory: read returns up to limit records at or
// after from, and the position after them (the log's end when it ran
// out).
type memLog struct {
	recs []Record
	end  uint64
}

func (l *memLog) read(from uint64, limit int) ([]Record, uint64) {
	i := sort.Search(len(l.recs), func(i int) bool { return l.recs[i].Position >= from })
	j := min(i+limit, len(l.recs))
	if j == len(l.recs) {
		return l.recs[i:j], max(l.end, from)
	}
	return l.recs[i:j], l.recs[j].Position
}

// genLog returns n records over keys distinct keys, at increasing
// positions with gaps, starting at start.
func genLog(rng *rand.Rand, n, keys int, start uint64) *memLog {
	l := &memLog{recs: make([]Record, n)}
	p := start
	for i := range l.recs {
		p += 1 + uint64(rng.IntN(3))
		l.recs[i] = Record{Key: fmt.Appendf(nil, "host-%d.example", rng.IntN(keys)), Position: p}
	}
	l.end = p + 1
	return l
}

func mustHasher(t testing.TB, buckets int) placement.Hasher {
	t.Helper()
	h, err := placement.NewHasher(placement.HashXXH64, buckets)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// collect returns a deliver func that appends to *got.
func collect(got *[]uint64) func(Record) error {
	return func(r Record) error { *got = append(*got, r.Position); return nil }
}

func TestFlowCatchupThenMerge(t *testing.T) {
	h := mustHasher(t, 4)
	// Keys of bucket 0 and bucket 1, found by the hash.
	var k0, k1 []byte
	for i := 0; k0 == nil || k1 == nil; i++ {
		k := fmt.Appendf(nil, "k%d", i)
		switch h.Bucket(k) {
		case 0:
			k0 = k
		case 1:
			k1 = k
		}
	}
	log := &memLog{end: 100}
	for p := uint64(10); p < 100; p += 10 {
		log.recs = append(log.recs, Record{Key: k0, Position: p}, Record{Key: k1, Position: p + 1})
	}
	f, err := NewFlow(h, 50)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Gain(BucketPosition{0, 50}, BucketPosition{1, 20}); err != nil {
		t.Fatal(err)
	}
	def, except := f.Progress()
	if diff := cmp.Diff([]BucketPosition{{1, 20}}, except); def != 50 || diff != "" {
		t.Fatalf("Progress = %d, %v; want 50 and bucket 1 at 20 (-want +got):\n%s", def, except, diff)
	}
	var main, catch []uint64
	recs, next := log.read(50, 4) // 50, 51, 60, 61
	if err := f.Main(50, recs, next, collect(&main)); err != nil {
		t.Fatal(err)
	}
	from, ok := f.Catching()
	if !ok || from != 20 {
		t.Fatalf("Catching = %d, %v; want 20, true", from, ok)
	}
	recs, next = log.read(from, 3) // 20, 21, 30
	if merged, err := f.Catchup(from, recs, next, collect(&catch)); merged || err != nil {
		t.Fatalf("Catchup = %v, %v", merged, err)
	}
	if def, except = f.Progress(); def != 70 || !cmp.Equal(except, []BucketPosition{{1, 31}}) {
		t.Fatalf("Progress = %d, %v; want 70, bucket 1 at 31", def, except)
	}
	from, _ = f.Catching()
	recs, next = log.read(from, 100)
	if merged, err := f.Catchup(from, recs, next, collect(&catch)); !merged || err != nil {
		t.Fatalf("Catchup = %v, %v; want a merge", merged, err)
	}
	recs, next = log.read(f.Position(), 100)
	if err := f.Main(f.Position(), recs, next, collect(&main)); err != nil {
		t.Fatal(err)
	}
	if want := []uint64{21, 31, 41, 51, 61}; !cmp.Equal(catch, want) {
		t.Errorf("catch-up lane delivered %v, want %v", catch, want)
	}
	if want := []uint64{50, 60, 70, 71, 80, 81, 90, 91}; !cmp.Equal(main, want) {
		t.Errorf("main lane delivered %v, want %v", main, want)
	}
	if def, except = f.Progress(); def != 100 || except != nil {
		t.Errorf("Progress = %d, %v; want 100 and no exception", def, except)
	}
}

func TestFlowArgs(t *testing.T) {
	if _, err := NewFlow(placement.Hasher{}, 0); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("NewFlow(zero Hasher) = %v, want ErrInvalid", err)
	}
	f, err := NewFlow(mustHasher(t, 8), 0)
	if err != nil {
		t.Fatal(err)
	}
	var ae *client.ArgError
	if err := f.Gain(BucketPosition{1, 0}, BucketPosition{8, 0}); !errors.As(err, &ae) || ae.Func != "Gain" {
		t.Errorf("Gain(bucket 8 of 8) = %v, want an *ArgError of Gain", err)
	}
	if f.Held(1) {
		t.Error("a refused Gain gained bucket 1")
	}
	if err := f.Lose(-1); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("Lose(-1) = %v, want ErrInvalid", err)
	}
	recs := []Record{{Key: []byte("a"), Position: 5}, {Key: []byte("b"), Position: 4}}
	if err := f.Main(0, recs, 6, collect(new([]uint64))); !errors.Is(err, ErrOrder) {
		t.Errorf("Main(out of order) = %v, want ErrOrder", err)
	}
}

// TestFlowRandom drives a Flow like a worker does, over many seeds: a
// random stream read in random batches by both lanes, random gains (from
// before or after the main position, during a catch-up or not), random
// losses and failing deliveries. It checks, per tenure of a bucket (from
// a Gain to its Lose or the end): every record at or after from is
// delivered exactly once if the bucket is held to the end, none twice
// otherwise, each key's records in stream order, none of a lost bucket
// after its loss; and, at every step, that Progress puts each held
// bucket exactly past the records it has delivered.
func TestFlowRandom(t *testing.T) {
	seeds := 500
	if testing.Short() {
		seeds = 50
	}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { checkFlowRandom(t, seed) })
	}
}

type tenure struct {
	bucket    int
	from      uint64
	lost      bool
	delivered []uint64 // positions, in delivery order
	keysLast  map[string]uint64
}

func checkFlowRandom(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	buckets := 1 + rng.IntN(16)
	h := mustHasher(t, buckets)
	log := genLog(rng, 50+rng.IntN(400), 1+rng.IntN(40), uint64(rng.IntN(1000)))
	start := log.recs[0].Position + uint64(rng.IntN(int(log.end-log.recs[0].Position)))
	f, err := NewFlow(h, start)
	if err != nil {
		t.Fatal(err)
	}
	bucketOf := make([]int, len(log.recs))
	for i, r := range log.recs {
		bucketOf[i] = h.Bucket(r.Key)
	}
	// recordsOf returns the positions of bucket b's records in [from, to).
	recordsOf := func(b int, from, to uint64) []uint64 {
		var ps []uint64
		for i, r := range log.recs {
			if bucketOf[i] == b && r.Position >= from && r.Position < to {
				ps = append(ps, r.Position)
			}
		}
		return ps
	}
	cur := make([]*tenure, buckets) // the bucket's tenure while held
	var all []*tenure
	gain := func(b int, from uint64) {
		if err := f.Gain(BucketPosition{b, from}); err != nil {
			t.Fatal(err)
		}
		if cur[b] != nil {
			cur[b].lost = true
		}
		cur[b] = &tenure{bucket: b, from: from, keysLast: map[string]uint64{}}
		all = append(all, cur[b])
	}
	for b := range buckets {
		if rng.IntN(2) == 0 {
			gain(b, start)
		}
	}
	// randFrom is a from around the main position, mostly before it.
	randFrom := func() uint64 {
		lo := log.recs[0].Position - 1
		return lo + uint64(rng.IntN(int(f.Position()-lo)+20))
	}
	deliver := func(r Record) error {
		if rng.IntN(20) == 0 {
			return errors.New("handler failed")
		}
		b := h.Bucket(r.Key)
		tn := cur[b]
		if tn == nil {
			t.Fatalf("record at %d of bucket %d delivered, but the bucket is not held", r.Position, b)
		}
		if r.Position < tn.from {
			t.Fatalf("record at %d of bucket %d delivered, before its from %d", r.Position, b, tn.from)
		}
		if last, ok := tn.keysLast[string(r.Key)]; ok && r.Position <= last {
			t.Fatalf("key %s: record at %d delivered after one at %d", r.Key, r.Position, last)
		}
		tn.keysLast[string(r.Key)] = r.Position
		tn.delivered = append(tn.delivered, r.Position)
		return nil
	}
	checkProgress := func(step int) {
		def, except := f.Progress()
		pos := make(map[int]uint64)
		for _, e := range except {
			pos[e.Bucket] = e.Position
		}
		for b, tn := range cur {
			if tn == nil {
				if _, ok := pos[b]; ok {
					t.Fatalf("step %d: Progress names bucket %d, which is not held", step, b)
				}
				continue
			}
			p, ok := pos[b]
			if !ok {
				p = def
			}
			// Delivered: exactly the bucket's records in [from, p).
			if want := recordsOf(b, tn.from, p); !slices.Equal(want, tn.delivered) {
				t.Fatalf("step %d: bucket %d (from %d) at %d in Progress, delivered (-want +got):\n%s", step, b, tn.from, p, cmp.Diff(want, tn.delivered))
			}
		}
	}
	for step := 0; ; step++ {
		checkProgress(step)
		from, catching := f.Catching()
		if !catching && f.Position() >= log.end && step > 50 {
			break
		}
		if step > 100000 {
			t.Fatal("no end after 100000 steps")
		}
		switch k := rng.IntN(10); {
		case k < 4:
			recs, next := log.read(f.Position(), 1+rng.IntN(20))
			if err := f.Main(f.Position(), recs, next, deliver); err != nil && err.Error() != "handler failed" {
				t.Fatal(err)
			}
		case k < 7 && catching:
			recs, next := log.read(from, 1+rng.IntN(20))
			if _, err := f.Catchup(from, recs, next, deliver); err != nil && err.Error() != "handler failed" {
				t.Fatal(err)
			}
		case k < 8 && step < 200:
			gain(rng.IntN(buckets), randFrom())
		case k < 9 && step < 200:
			b := rng.IntN(buckets)
			if err := f.Lose(b); err != nil {
				t.Fatal(err)
			}
			if cur[b] != nil {
				cur[b].lost = true
				cur[b] = nil
			}
		}
	}
	// Held to the end: every record at or after from, exactly once.
	for _, tn := range all {
		if tn.lost {
			continue
		}
		if diff := cmp.Diff(recordsOf(tn.bucket, tn.from, none), tn.delivered); diff != "" {
			t.Errorf("bucket %d from %d, held to the end, delivered (-want +got):\n%s", tn.bucket, tn.from, diff)
		}
	}
}

// TestFlowBucketMemo: with a costly hash the Flow remembers keys'
// buckets, up to memoKeys of them, and always answers as the Hasher does,
// also once the memo has been emptied for being full.
func TestFlowBucketMemo(t *testing.T) {
	h, err := placement.NewHasher(placement.HashSynapse, 64)
	if err != nil {
		t.Fatal(err)
	}
	f, err := NewFlow(h, 0)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 2 { // the second round reads keys back, some from the memo
		for i := range memoKeys + 100 {
			key := fmt.Appendf(nil, "server-%d.example.org", i)
			if got, want := f.bucket(key), h.Bucket(key); got != want {
				t.Fatalf("round %d: bucket(%s) = %d, want %d", round, key, got, want)
			}
			if len(f.memo) > memoKeys {
				t.Fatalf("the memo holds %d keys, more than %d", len(f.memo), memoKeys)
			}
		}
	}
	x, err := placement.NewHasher(placement.HashXXH64, 64)
	if err != nil {
		t.Fatal(err)
	}
	if g, _ := NewFlow(x, 0); g.memo != nil {
		t.Error("an xxh64 Flow keeps a memo; hashing is cheaper than the lookup")
	}
}
