package chaos

import (
	"fmt"
	"slices"
	"sort"
	"time"
)

// Violation is a breach of a safety guarantee found in a record: Seq is
// the record where it shows.
type Violation struct {
	Seq int    `json:"seq"`
	Msg string `json:"msg"`
}

func (v Violation) String() string { return v.Msg }

// Check checks a sink's record, in arrival order, and returns every
// violation of the safety guarantees:
//
//   - tokens strictly increase per bucket: each acquire carries a token
//     above every earlier acquire of the bucket, and the sink accepted its
//     claim;
//   - grants of a bucket never overlap: a new grant is acquired only after
//     the previous holder released, unless the previous holder was stopped
//     (SIGSTOP) or killed at the time;
//   - every write comes from the worker that acquired the bucket at the
//     write's token, before that worker released it;
//   - an accepted write carries the bucket's highest token at the time: no
//     write of a superseded grant is accepted (late writes are refused),
//     and no write of the current grant is refused;
//   - releases match an acquire of the same worker, once, and report no
//     error.
func Check(recs []Record) []Violation {
	var bad []Violation
	stopped := map[string]bool{} // by worker
	// killed holds "worker" (every process of the worker, for a marker
	// without a pid) or "worker/pid".
	killed := map[string]bool{}
	dead := func(worker string, pid int) bool {
		return killed[worker] || pid != 0 && killed[fmt.Sprintf("%s/%d", worker, pid)]
	}
	type holding struct {
		Grant
		superseded int // Seq of the acquire that replaced it while held
		pid        int
	}
	grants := map[BucketToken]*holding{}
	cur := map[int]*holding{}
	for _, r := range recs {
		fail := func(format string, args ...any) {
			bad = append(bad, Violation{Seq: r.Seq, Msg: fmt.Sprintf("%v: ", r) + fmt.Sprintf(format, args...)})
		}
		key := BucketToken{r.Bucket, r.Token}
		switch r.Kind {
		case FaultStop:
			stopped[r.Worker] = true
		case FaultCont:
			stopped[r.Worker] = false
		case FaultKill:
			if r.Pid == 0 {
				killed[r.Worker] = true
			} else {
				killed[fmt.Sprintf("%s/%d", r.Worker, r.Pid)] = true
			}
		case KindAcquire:
			if r.Refused {
				fail("the sink refused the claim: it had seen a higher token")
			}
			if g := grants[key]; g != nil {
				fail("token %d of bucket %d was already granted to %s (#%d)", r.Token, r.Bucket, g.Worker, g.Acquired)
				continue
			}
			if p := cur[r.Bucket]; p != nil {
				switch {
				case r.Token <= p.Token:
					fail("token does not increase: bucket %d was acquired at token %d before (#%d by %s)", r.Bucket, p.Token, p.Acquired, p.Worker)
				case p.Released == 0 && p.superseded == 0:
					if samePid := p.Worker == r.Worker && p.pid == r.Pid; samePid || !stopped[p.Worker] && !dead(p.Worker, p.pid) {
						fail("overlapping grants: %s still held bucket %d at token %d (acquired #%d) and was neither stopped nor killed", p.Worker, r.Bucket, p.Token, p.Acquired)
					}
					p.superseded = r.Seq
				}
			}
			h := &holding{Grant: Grant{Worker: r.Worker, Token: r.Token, Acquired: r.Seq}, pid: r.Pid}
			grants[key] = h
			if p := cur[r.Bucket]; p == nil || p.Token < r.Token {
				cur[r.Bucket] = h
			}
		case KindRelease:
			h := grants[key]
			switch {
			case r.Err != "":
				fail("the worker's release failed")
			case h == nil || h.Worker != r.Worker:
				fail("release of a grant the worker never acquired")
			case h.Released != 0:
				fail("released twice (first #%d)", h.Released)
			default:
				h.Released = r.Seq
			}
		case KindWrite:
			h := grants[key]
			switch {
			case h == nil || h.Worker != r.Worker:
				fail("write without a grant of bucket %d at token %d", r.Bucket, r.Token)
				continue
			case h.Released != 0:
				fail("write after the worker released the grant (#%d)", h.Released)
			}
			c := cur[r.Bucket]
			switch {
			case !r.Refused && (c != h || h.superseded != 0):
				fail("stale write accepted: bucket %d was granted at token %d (#%d, %s)", r.Bucket, c.Token, c.Acquired, c.Worker)
			case r.Refused && c == h && h.superseded == 0:
				fail("the current holder's write was refused")
			}
		}
	}
	return bad
}

// FaultResult is what the record says about one injected fault.
type FaultResult struct {
	Kind   string `json:"kind"`
	Target string `json:"target"`
	// Proven: the runner saw the fault take effect (Proof says how).
	Proven bool   `json:"proven"`
	Proof  string `json:"proof,omitempty"`
	Begin  int    `json:"begin_seq"`
	// At is when it was injected, since the first record.
	At time.Duration `json:"at_ns"`
	// Settled: every bucket was served again before the next fault.
	Settled bool `json:"settled"`
	// Unserved is the longest time a bucket went without an accepted
	// write across the fault's window (from injection until every bucket
	// was served again), and WorstBucket that bucket. Affected counts the
	// buckets whose gap was longer than twice the normal write interval
	// seen in the record.
	Unserved    time.Duration `json:"unserved_ns"`
	WorstBucket int           `json:"worst_bucket"`
	Affected    int           `json:"affected_buckets"`
	// Refused counts late writes the sink refused in the fault's window.
	Refused    int         `json:"refused_writes"`
	Violations []Violation `json:"violations,omitempty"`
	// Miss says how the fault missed the liveness bound ("" if it did
	// not).
	Miss string `json:"miss,omitempty"`
}

// Analysis is the checker's verdict over a whole record.
type Analysis struct {
	Violations []Violation    `json:"violations"`
	Faults     []*FaultResult `json:"faults"`
	// Misses are liveness bound misses: a fault after which a bucket
	// stayed unserved longer than the bound, or that never settled.
	Misses  []string `json:"misses"`
	Writes  int      `json:"writes"`
	Refused int      `json:"refused_writes"`
}

// Analyze checks recs (Check) and measures every fault marked in it
// (FaultBegin ... FaultSettled): how long each bucket stayed unserved,
// which violations and refused writes fall in its window, and whether the
// longest gap is within bound (zero: no bound). buckets is the number of
// buckets in the keyspace: a bucket never written after a fault is
// unserved until the end of the record.
func Analyze(recs []Record, buckets int, bound time.Duration) *Analysis {
	a := &Analysis{Violations: Check(recs)}
	if len(recs) == 0 {
		return a
	}
	start, end := recs[0].At, recs[len(recs)-1].At
	writes := make([][]time.Time, buckets) // accepted writes per bucket
	var gaps []time.Duration
	var cur *FaultResult
	for _, r := range recs {
		switch r.Kind {
		case KindWrite:
			a.Writes++
			if r.Refused {
				a.Refused++
				if cur != nil {
					cur.Refused++
				}
				continue
			}
			if r.Bucket >= 0 && r.Bucket < buckets {
				if w := writes[r.Bucket]; len(w) > 0 {
					gaps = append(gaps, r.At.Sub(w[len(w)-1]))
				}
				writes[r.Bucket] = append(writes[r.Bucket], r.At)
			}
		case FaultBegin:
			cur = &FaultResult{Kind: r.Err, Target: r.Worker, Begin: r.Seq, At: r.At.Sub(start)}
			a.Faults = append(a.Faults, cur)
		case FaultProven:
			if cur != nil {
				cur.Proven, cur.Proof = true, r.Err
			}
		case FaultSettled:
			if cur != nil {
				cur.Settled = true
			}
		}
	}
	// The normal interval between two writes of a bucket: the median gap.
	normal := time.Duration(0)
	if len(gaps) > 0 {
		slices.Sort(gaps)
		normal = gaps[len(gaps)/2]
	}
	// Windows: from each FaultBegin to its FaultSettled, or to the next
	// FaultBegin, or to the end.
	type window struct {
		f          *FaultResult
		from, to   time.Time
		fromS, toS int
	}
	var ws []window
	for i, f := range a.Faults {
		w := window{f: f, from: recs[f.Begin-1].At, fromS: f.Begin, to: end, toS: len(recs) + 1}
		if i+1 < len(a.Faults) {
			w.toS = a.Faults[i+1].Begin
			w.to = recs[w.toS-1].At
		}
		for _, r := range recs[f.Begin:min(w.toS-1, len(recs))] {
			if r.Kind == FaultSettled {
				w.to = r.At
				break
			}
		}
		ws = append(ws, w)
	}
	for _, w := range ws {
		for _, v := range a.Violations {
			if v.Seq >= w.fromS && v.Seq < w.toS {
				w.f.Violations = append(w.f.Violations, v)
			}
		}
		for b := range buckets {
			gap := unservedIn(writes[b], w.from, w.to, end)
			if gap > w.f.Unserved {
				w.f.Unserved, w.f.WorstBucket = gap, b
			}
			if normal > 0 && gap > 2*normal {
				w.f.Affected++
			}
		}
		switch {
		case !w.f.Settled:
			w.f.Miss = fmt.Sprintf("%s of %s at %v: buckets not all served again before the next fault or the end (bucket %d unserved %v)",
				w.f.Kind, w.f.Target, w.f.At.Round(time.Millisecond), w.f.WorstBucket, w.f.Unserved.Round(time.Millisecond))
		case bound > 0 && w.f.Unserved > bound:
			w.f.Miss = fmt.Sprintf("%s of %s at %v: bucket %d unserved %v, over the bound of %v",
				w.f.Kind, w.f.Target, w.f.At.Round(time.Millisecond), w.f.WorstBucket, w.f.Unserved.Round(time.Millisecond), bound)
		}
		if w.f.Miss != "" {
			a.Misses = append(a.Misses, w.f.Miss)
		}
	}
	return a
}

// unservedIn returns the longest gap between two consecutive accepted
// writes (ws, in order) that overlaps [from, to]; a bucket with no write
// after from is unserved from its last write (or from) until end.
func unservedIn(ws []time.Time, from, to, end time.Time) time.Duration {
	i := sort.Search(len(ws), func(i int) bool { return ws[i].After(from) })
	// ws[i] is the first write after from; the gap ending there began at
	// ws[i-1] (or at from, if the bucket was never written before).
	if i == len(ws) {
		last := from
		if i > 0 {
			last = ws[i-1]
		}
		return end.Sub(last)
	}
	var worst time.Duration
	prev := from
	if i > 0 {
		prev = ws[i-1]
	}
	for ; i < len(ws); i++ {
		if g := ws[i].Sub(prev); g > worst {
			worst = g
		}
		if ws[i].After(to) {
			break
		}
		prev = ws[i]
	}
	return worst
}
