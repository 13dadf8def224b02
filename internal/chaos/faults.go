package chaos

import (
	"context"
	"fmt"
	"syscall"
	"time"
)

// runner injects the faults of a run, one at a time: each is injected,
// proven, healed, and then the runner waits until every bucket is served
// again before the next one.
type runner struct {
	c      *cluster
	p      *progress
	cfg    Config
	misses []string // liveness problems found outside the faults' windows
}

// settle waits until every bucket is held by its newest grant, which has
// had a write accepted after record from, and returns how long that took.
func (r *runner) settle(ctx context.Context, from int, limit time.Duration) (time.Duration, bool) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	err := r.c.sink.Await(ctx, "every bucket served", func(h *History) string {
		for b := range r.cfg.Buckets {
			switch g := h.Cur[b]; {
			case g == nil:
				return fmt.Sprintf("bucket %d never acquired", b)
			case g.Released != 0:
				return fmt.Sprintf("bucket %d released by %s@%d and not granted since", b, g.Worker, g.Token)
			case g.LastWrite <= from:
				return fmt.Sprintf("bucket %d: no write by its holder %s@%d yet", b, g.Worker, g.Token)
			}
		}
		return ""
	})
	return time.Since(start), err == nil
}

// revive restarts any process that exited by itself (not by a fault),
// and counts it as a miss.
func (r *runner) revive(ctx context.Context) error {
	for _, w := range r.c.workers {
		if w.proc.Exited() {
			r.miss("worker %s (pid %d) exited by itself; its output ends: %s", w.id, w.proc.Pid(), lastLine(w.proc.Output()))
			r.c.sink.Add(Record{Kind: FaultKill, Worker: w.id, Pid: w.proc.Pid(), Err: "exited by itself"})
			if err := r.c.startWorker(w, true); err != nil {
				return err
			}
		}
	}
	for _, rp := range r.c.replicas {
		if rp.proc.Exited() {
			r.miss("replica %s exited by itself; its output ends: %s", rp.name, lastLine(rp.proc.Output()))
			if err := r.c.startReplica(ctx, rp); err != nil {
				return err
			}
		}
	}
	for _, m := range r.c.members {
		if m.proc.Exited() {
			r.miss("etcd member %s exited by itself; its output ends: %s", m.name, lastLine(m.proc.Output()))
			if err := r.c.startMember(ctx, m); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *runner) miss(format string, args ...any) {
	m := fmt.Sprintf(format, args...)
	r.misses = append(r.misses, m)
	r.p.printf("MISS: %s", m)
}

func lastLine(s string) string {
	s = Tail(s, 600)
	for len(s) > 0 && s[len(s)-1] == '\n' {
		s = s[:len(s)-1]
	}
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '\n' {
			return s[i+1:]
		}
	}
	return s
}

// fault is one fault being injected: its markers go to the sink.
type fault struct {
	r      *runner
	n      int
	kind   string
	target string
	begin  int
	start  time.Time
	proof  string
}

func (r *runner) begin(n int, kind, target, what string) *fault {
	f := &fault{r: r, n: n, kind: kind, target: target, start: time.Now()}
	f.begin = r.c.sink.Add(Record{Kind: FaultBegin, Worker: target, Err: kind}).Seq
	r.p.phase(fmt.Sprintf("fault %d: %s of %s", n, kind, target))
	r.p.printf("fault %d: %s of %s: %s", n, kind, target, what)
	return f
}

// proven records that the fault took effect.
func (f *fault) proven(format string, args ...any) {
	f.proof = fmt.Sprintf(format, args...)
	f.r.c.sink.Add(Record{Kind: FaultProven, Worker: f.target, Err: f.proof})
	f.r.p.printf("  proven: %s", f.proof)
}

// unproven reports a fault that could not be shown to take effect.
func (f *fault) unproven(format string, args ...any) {
	f.r.p.printf("  NOT proven: %s", fmt.Sprintf(format, args...))
}

// end marks the fault healed, waits until every bucket is served again,
// and prints how long the worst bucket stayed unserved.
func (f *fault) end(ctx context.Context) {
	r := f.r
	if f.proof == "" {
		f.unproven("no proof recorded")
	}
	endSeq := r.c.sink.Add(Record{Kind: FaultEnd, Worker: f.target, Err: f.kind}).Seq
	r.p.phase(fmt.Sprintf("fault %d: %s of %s healed; waiting until every bucket is served again", f.n, f.kind, f.target))
	d, ok := r.settle(ctx, endSeq, r.cfg.SettleLimit)
	if ok {
		r.c.sink.Add(Record{Kind: FaultSettled, Worker: f.target, Err: f.kind})
	}
	a := Analyze(r.c.sink.Records(), r.cfg.Buckets, r.cfg.Bound)
	var fr *FaultResult
	for _, x := range a.Faults {
		if x.Begin == f.begin {
			fr = x
		}
	}
	status := fmt.Sprintf("every bucket served again %v after healing", d.Round(10*time.Millisecond))
	if !ok {
		status = fmt.Sprintf("NOT every bucket served again %v after healing", d.Round(time.Second))
	}
	over := ""
	if fr != nil && fr.Unserved > r.cfg.Bound {
		over = fmt.Sprintf(" — OVER the bound of %v", r.cfg.Bound)
	}
	if fr != nil {
		r.p.printf("  %s; worst bucket %d unserved %v%s; %d buckets affected, %d late writes refused, %d violations",
			status, fr.WorstBucket, fr.Unserved.Round(10*time.Millisecond), over, fr.Affected, fr.Refused, len(fr.Violations))
		for _, v := range fr.Violations {
			r.p.printf("  VIOLATION %s", v)
		}
	}
	r.p.phase("")
}

// inject runs one fault: inject, prove, heal, settle.
func (r *runner) inject(ctx context.Context, n int, st step) error {
	c := r.c
	switch st.kind {
	case WorkerKill:
		w := c.workers[st.target%len(c.workers)]
		f := r.begin(n, st.kind, w.id, fmt.Sprintf("kill -9, restart after %v", st.restart.Round(time.Millisecond)))
		c.sink.Add(Record{Kind: FaultKill, Worker: w.id, Pid: w.proc.Pid(), Err: "SIGKILL"})
		f.kill(w.proc, "a worker")
		sleepCtx(ctx, st.restart)
		if err := c.startWorker(w, true); err != nil {
			return err
		}
		f.end(ctx)
	case WorkerStop:
		w := c.workers[st.target%len(c.workers)]
		f := r.begin(n, st.kind, w.id, fmt.Sprintf("SIGSTOP for %v", st.dur.Round(time.Millisecond)))
		c.sink.Add(Record{Kind: FaultStop, Worker: w.id, Pid: w.proc.Pid(), Err: "SIGSTOP"})
		return f.stop(ctx, w.proc, st.dur, func() {
			c.sink.Add(Record{Kind: FaultCont, Worker: w.id, Pid: w.proc.Pid(), Err: "SIGCONT"})
		})
	case ReplicaKill:
		rp := c.replicas[st.target%len(c.replicas)]
		lead := r.leaderNote(ctx, rp.name)
		f := r.begin(n, st.kind, rp.name, fmt.Sprintf("kill -9 (%s), restart after %v", lead, st.restart.Round(time.Millisecond)))
		f.kill(rp.proc, lead)
		sleepCtx(ctx, st.restart)
		if err := c.startReplica(ctx, rp); err != nil {
			return err
		}
		f.end(ctx)
	case ReplicaStop:
		rp := c.replicas[st.target%len(c.replicas)]
		lead := r.leaderNote(ctx, rp.name)
		f := r.begin(n, st.kind, rp.name, fmt.Sprintf("SIGSTOP for %v (%s)", st.dur.Round(time.Millisecond), lead))
		return f.stop(ctx, rp.proc, st.dur, nil)
	case ReplicaPartition:
		rp := c.replicas[st.target%len(c.replicas)]
		lead := r.leaderNote(ctx, rp.name)
		f := r.begin(n, st.kind, rp.name, fmt.Sprintf("cut off from etcd for %v (%s)", st.dur.Round(time.Millisecond), lead))
		held := 0
		for _, px := range rp.etcd {
			held -= px.Stats().Held
			px.Partition()
		}
		sleepCtx(ctx, st.dur)
		for _, px := range rp.etcd {
			held += px.Stats().Held
		}
		if held > 0 {
			f.proven("the proxies to etcd held %d chunks or connections of %s", held, rp.name)
		}
		for _, px := range rp.etcd {
			px.Heal()
		}
		f.end(ctx)
	case EtcdKill, EtcdStop:
		m := c.members[st.target%len(c.members)]
		leader, term := c.etcdLeader(ctx)
		role := "a follower"
		if leader == m {
			role = fmt.Sprintf("the leader, term %d", term)
		}
		if st.kind == EtcdKill {
			f := r.begin(n, st.kind, m.name, fmt.Sprintf("kill -9 (%s), restart after %v", role, st.restart.Round(time.Millisecond)))
			f.kill(m.proc, role)
			sleepCtx(ctx, st.restart)
			if err := c.startMember(ctx, m); err != nil {
				return err
			}
			f.end(ctx)
			return nil
		}
		f := r.begin(n, st.kind, m.name, fmt.Sprintf("SIGSTOP for %v (%s)", st.dur.Round(time.Millisecond), role))
		return f.stop(ctx, m.proc, st.dur, nil)
	case EtcdLeader:
		return r.etcdLeaderDuringHandoff(ctx, n, st)
	case Partition:
		w := c.workers[st.target%len(c.workers)]
		f := r.begin(n, st.kind, w.id, fmt.Sprintf("link to the replicas cut for %v", st.dur.Round(time.Millisecond)))
		before := w.proxy.Stats()
		w.proxy.Partition()
		sleepCtx(ctx, st.dur)
		after := w.proxy.Stats()
		if held := after.Held - before.Held; held > 0 {
			f.proven("the proxy held %d chunks or connections of %s", held, w.id)
		}
		w.proxy.Heal()
		f.end(ctx)
	case Reset:
		f := r.begin(n, st.kind, "all workers", "TCP RST on every worker connection")
		total := 0
		for _, w := range c.workers {
			total += w.proxy.Reset()
		}
		if total > 0 {
			f.proven("reset %d connections", total)
		}
		f.end(ctx)
	case Latency:
		w := c.workers[st.target%len(c.workers)]
		f := r.begin(n, st.kind, w.id, fmt.Sprintf("%v added each way for %v", st.delay.Round(time.Millisecond), (2*st.dur).Round(time.Millisecond)))
		before := w.proxy.Stats()
		w.proxy.SetDelay(st.delay)
		sleepCtx(ctx, 2*st.dur)
		after := w.proxy.Stats()
		if d := after.Delayed - before.Delayed; d > 0 {
			f.proven("the proxy delayed %d chunks of %s by %v", d, w.id, st.delay.Round(time.Millisecond))
		}
		w.proxy.SetDelay(0)
		f.end(ctx)
	case Netns:
		return r.netnsPartition(ctx, n, st)
	default:
		return fmt.Errorf("unknown fault kind %q", st.kind)
	}
	return nil
}

// kill sends SIGKILL to p and proves it died of it; role says what p
// was.
func (f *fault) kill(p *Proc, role string) {
	pid := p.Pid()
	p.Kill()
	if p.KilledBySIGKILL() {
		f.proven("pid %d exited on SIGKILL (%s)", pid, role)
	}
}

// stop sends SIGSTOP to p, proves it stopped, waits d, calls beforeCont
// (if not nil), sends SIGCONT and ends the fault.
func (f *fault) stop(ctx context.Context, p *Proc, d time.Duration, beforeCont func()) error {
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	// The kernel stops the process asynchronously; it takes microseconds.
	for i := 0; i < 100; i++ {
		if s, err := p.State(); err == nil && s == 'T' {
			f.proven("pid %d is in state T (stopped)", p.Pid())
			break
		}
		sleepCtx(ctx, 10*time.Millisecond)
	}
	sleepCtx(ctx, d)
	if beforeCont != nil {
		beforeCont()
	}
	if err := p.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	f.end(ctx)
	return nil
}

// leaderNote says whether replica leads, as the replicas answer.
func (r *runner) leaderNote(ctx context.Context, replica string) string {
	for _, cl := range r.c.admins {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := cl.Admin().Status(actx)
		cancel()
		if err == nil && st.Leader != "" {
			if st.Leader == replica {
				return "the leading replica"
			}
			return "not the leading replica"
		}
	}
	return "leader unknown"
}

// etcdLeaderDuringHandoff drains a worker (SIGTERM) and, as soon as it
// begins releasing buckets, kills the etcd leader; then restarts both.
func (r *runner) etcdLeaderDuringHandoff(ctx context.Context, n int, st step) error {
	c := r.c
	w := c.workers[st.target%len(c.workers)]
	from := c.sink.Seq()
	r.p.printf("fault %d: %s: draining %s to start handoffs", n, st.kind, w.id)
	if err := w.proc.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	var releasing Record
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := c.sink.Await(actx, w.id+" to begin releasing", func(h *History) string {
		for _, rec := range h.Recs[from:] {
			if rec.Worker == w.id && rec.Kind == KindReleasing {
				releasing = rec
				return ""
			}
		}
		return "no release begun"
	})
	cancel()
	leader, term := c.etcdLeader(ctx)
	if leader == nil {
		f := r.begin(n, st.kind, "etcd", "no etcd leader found")
		f.unproven("no member answered as the leader")
		return r.restartDrained(ctx, f, w)
	}
	f := r.begin(n, st.kind, leader.name, fmt.Sprintf("kill -9 of the etcd leader (term %d) during %s's handoffs", term, w.id))
	pid := leader.proc.Pid()
	// The releases begun and not finished when the leader dies.
	inFlight := 0
	c.sink.View(func(h *History) {
		open := map[BucketToken]bool{}
		for _, rec := range h.Recs[from:] {
			switch {
			case rec.Worker != w.id:
			case rec.Kind == KindReleasing:
				open[BucketToken{Bucket: rec.Bucket, Token: rec.Token}] = true
			case rec.Kind == KindRelease:
				delete(open, BucketToken{Bucket: rec.Bucket, Token: rec.Token})
			}
		}
		inFlight = len(open)
	})
	leader.proc.Kill()
	var next *member
	var nterm uint64
	for i := 0; i < 50 && next == nil; i++ {
		if next, nterm = c.etcdLeader(ctx); next == nil {
			sleepCtx(ctx, 100*time.Millisecond)
		}
	}
	switch {
	case err != nil:
		f.unproven("no handoff in flight: %v", err)
	case !leader.proc.KilledBySIGKILL():
		f.unproven("pid %d did not exit on SIGKILL", pid)
	default:
		nl := "no new leader yet"
		if next != nil {
			nl = fmt.Sprintf("new leader %s, term %d", next.name, nterm)
		}
		f.proven("pid %d, the etcd leader in term %d, exited on SIGKILL during %s's drain (first release: bucket %d at token %d; %d releases unfinished at the kill); %s",
			pid, term, w.id, releasing.Bucket, releasing.Token, inFlight, nl)
	}
	sleepCtx(ctx, st.restart)
	if err := c.startMember(ctx, leader); err != nil {
		return err
	}
	return r.restartDrained(ctx, f, w)
}

// restartDrained waits for a drained worker to exit (killing it after the
// drain timeout), starts it again and ends the fault.
func (r *runner) restartDrained(ctx context.Context, f *fault, w *worker) error {
	wctx, cancel := context.WithTimeout(ctx, r.cfg.DrainTimeout+5*time.Second)
	err := w.proc.Wait(wctx)
	cancel()
	if !w.proc.Exited() {
		r.c.sink.Add(Record{Kind: FaultKill, Worker: w.id, Pid: w.proc.Pid(), Err: "SIGKILL: the drain did not finish"})
		w.proc.Kill()
		r.miss("worker %s did not finish its drain within %v", w.id, r.cfg.DrainTimeout+5*time.Second)
	} else if err != nil {
		r.miss("worker %s's drain ended with %v; its output ends: %s", w.id, err, lastLine(w.proc.Output()))
	}
	if err := r.c.startWorker(w, true); err != nil {
		return err
	}
	f.end(ctx)
	return nil
}

// finalChecks looks for stuck sessions: once the faults are over, every
// worker must hold at least one bucket again (there are at least as many
// buckets as workers).
func (r *runner) finalChecks(ctx context.Context) {
	r.p.phase("final check: every worker holds a bucket (no stuck session)")
	r.p.printf("faults over; checking that every worker serves buckets again")
	actx, cancel := context.WithTimeout(ctx, r.cfg.SettleLimit)
	defer cancel()
	err := r.c.sink.Await(actx, "every worker to hold a bucket", func(h *History) string {
		for _, w := range r.c.workers {
			if len(h.Held(w.id)) == 0 {
				return fmt.Sprintf("worker %s holds no bucket", w.id)
			}
		}
		return ""
	})
	if err != nil {
		r.miss("stuck session: %v", err)
	}
	if st, err := r.memberStatus(ctx); err == nil {
		r.p.printf("members: %s", st)
	}
	r.p.phase("")
}

// memberStatus sums up the server's view of the members.
func (r *runner) memberStatus(ctx context.Context) (string, error) {
	var last error
	for _, cl := range r.c.admins {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ms, err := cl.Admin().ListMembers(actx, Keyspace)
		cancel()
		if err != nil {
			last = err
			continue
		}
		s := fmt.Sprintf("epoch %d:", ms.Epoch)
		for _, m := range ms.Members {
			s += fmt.Sprintf(" %s %d/%d", m.ID, m.GrantedBuckets, m.TargetBuckets)
		}
		return s, nil
	}
	return "", last
}
