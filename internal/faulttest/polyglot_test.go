package faulttest

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keyshard/keyshard/internal/chaos"
)

// mixedLangs are the client languages of TestMixedLanguageCluster's three
// workers, one worker each, in the order the faults hit them in its first
// round: the first leaves gracefully, the second is killed, the third is
// paused. Each later round rotates the list, so that every language goes
// through every fault. KEYSHARD_MIXED_LANGS (such as "go,python,node", or
// "python" for three Python workers) runs one round of its own list
// instead.
var mixedLangs = []chaos.Lang{chaos.LangGo, chaos.LangPython, chaos.LangNode}

// langWorker is one worker of TestMixedLanguageCluster: its member id
// (<lang>-<n>), its language and its newest process.
type langWorker struct {
	id   string
	lang chaos.Lang
	proc *proc
}

// startLangWorker starts a worker of lang with member id id (see
// chaos.Workers), reporting to the harness's sink.
func (h *harness) startLangWorker(ws chaos.Workers, lang chaos.Lang, id string, extra ...string) *proc {
	h.t.Helper()
	bin, argv, err := ws.Command(lang, chaos.WorkerArgs(h.url, h.sink.URL(), keyspace, id, extra...)...)
	if err != nil {
		h.t.Fatal(err)
	}
	return startProc(h.t, id, bin, argv...)
}

// TestMixedLanguageCluster runs one worker process per client language on
// one keyspace, all reporting to the fenced sink, and puts each through a
// different fault: the first leaves gracefully (SIGTERM) and comes back;
// the second is killed (SIGKILL) and restarted at once with --replace; the
// third is paused (SIGSTOP) past its lease until the others have taken its
// buckets, then resumed: it must fence itself (its late writes refused or
// never made) and re-join. After each step the cluster must converge:
// every bucket held by its owner under the map, and written. The whole
// record must pass chaos.Check, every worker must have held buckets, and
// every bucket must end with a live holder. It runs one round per
// rotation of mixedLangs, each on a fresh server, so that every language
// leaves, is killed and is paused once.
func TestMixedLanguageCluster(t *testing.T) {
	if env := os.Getenv("KEYSHARD_MIXED_LANGS"); env != "" {
		var langs []chaos.Lang
		for item := range strings.SplitSeq(env, ",") { // repeats allowed: go,go,python
			l, err := chaos.ParseLangs(item)
			if err != nil {
				t.Fatalf("KEYSHARD_MIXED_LANGS=%q: %v", env, err)
			}
			if len(langs) == 3 {
				t.Fatalf("KEYSHARD_MIXED_LANGS=%q: want one to three languages, one worker per fault", env)
			}
			langs = append(langs, l[0])
		}
		for len(langs) < 3 { // one worker per fault
			langs = append(langs, langs[len(langs)-1])
		}
		mixedCluster(t, langs)
		return
	}
	for i := range mixedLangs {
		langs := append(slices.Clone(mixedLangs[i:]), mixedLangs[:i]...)
		name := fmt.Sprintf("leave=%s,kill=%s,stop=%s", langs[0], langs[1], langs[2])
		t.Run(name, func(t *testing.T) { mixedCluster(t, langs) })
	}
}

// mixedCluster is one round of TestMixedLanguageCluster: langs[0] leaves,
// langs[1] is killed, langs[2] is paused.
func mixedCluster(t *testing.T, langs []chaos.Lang) {
	h := newHarness(t, 240*time.Second)
	h.buckets = 32
	ttl, drain := 3*time.Second, 5*time.Second
	repo, err := chaos.FindRepo(".")
	if err != nil {
		t.Fatal(err)
	}
	ws := chaos.Workers{Keyshard: h.keyshard, Repo: repo}
	for _, l := range langs {
		if err := ws.Check(l); err != nil {
			t.Fatal(err)
		}
	}
	_, addr := h.serve("ks-1", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir())
	h.connect("http://"+addr, ttl, drain)

	var workers []*langWorker
	var ids []string
	for i, l := range langs[:3] {
		w := &langWorker{id: fmt.Sprintf("%s-%d", l, i+1), lang: l}
		workers, ids = append(workers, w), append(ids, w.id)
	}
	leaver, killed, paused := workers[0], workers[1], workers[2]
	var phases []string
	phase := func(name string, began time.Time) {
		d := time.Since(began).Round(time.Millisecond)
		phases = append(phases, fmt.Sprintf("%s %v", name, d))
		t.Logf("phase %q took %v", name, d)
	}

	// 1. All join.
	began := time.Now()
	for _, w := range workers {
		w.proc = h.startLangWorker(ws, w.lang, w.id)
	}
	h.waitConverged(60*time.Second, ids...)
	phase("join", began)

	// 2. A graceful leave (SIGTERM: drain, then leave) and a restart.
	began = time.Now()
	leaving := h.sink.held(leaver.id)
	if len(leaving) == 0 {
		t.Fatalf("%s holds nothing after convergence", leaver.id)
	}
	term := h.sink.mark(note, leaver.id, "SIGTERM: graceful leave")
	leaver.proc.signal(t, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(h.ctx, 45*time.Second)
	err = leaver.proc.wait(ctx)
	cancel()
	if err != nil {
		t.Fatalf("%s after SIGTERM: %v (want exit status 0: drained in time)", leaver.id, err)
	}
	h.waitConverged(45*time.Second, paused.id, killed.id)
	h.awaitSink(leaver.id+"'s left event", 10*time.Second, func(s *chaos.History) string {
		for _, r := range s.Recs[term:] {
			if r.Worker == leaver.id && r.Kind == chaos.KindLeft {
				return ""
			}
		}
		return "no left event after SIGTERM"
	})
	for _, r := range h.sink.records()[term:] {
		if tok, ok := leaving[r.Bucket]; ok && r.Worker == leaver.id && r.Kind == kindRelease && r.Token == tok && r.Fenced {
			t.Errorf("%v: %s's graceful leave fenced a grant instead of handing it over", r, leaver.id)
		}
	}
	if held := h.sink.held(leaver.id); len(held) != 0 {
		t.Errorf("%s left but still holds %v", leaver.id, held)
	}
	leaver.proc = h.startLangWorker(ws, leaver.lang, leaver.id)
	h.waitConverged(45*time.Second, ids...)
	phase("graceful leave and restart", began)

	// 3. kill -9 and an immediate restart that replaces the dead session.
	began = time.Now()
	if len(h.sink.held(killed.id)) == 0 {
		t.Fatalf("%s holds nothing after convergence", killed.id)
	}
	old := killed.proc
	h.sink.Add(chaos.Record{Kind: faultKill, Worker: killed.id, Pid: old.Pid(), Err: "SIGKILL"})
	old.kill()
	if !old.KilledBySIGKILL() {
		t.Fatalf("%s did not die of SIGKILL", killed.id)
	}
	killed.proc = h.startLangWorker(ws, killed.lang, killed.id, "--replace")
	newPid := killed.proc.Pid()
	h.waitConverged(60*time.Second, ids...)
	acquiredByNew := 0
	for _, r := range h.sink.records() {
		if r.Worker == killed.id && r.Kind == kindAcquire && r.Pid == newPid {
			acquiredByNew++
		}
	}
	if acquiredByNew == 0 {
		t.Errorf("%s's restarted process (pid %d) acquired nothing", killed.id, newPid)
	}
	phase("kill -9 and restart with --replace", began)

	// 4. SIGSTOP past the lease, until the others hold its buckets; then
	// SIGCONT.
	began = time.Now()
	held := h.sink.held(paused.id)
	if len(held) == 0 {
		t.Fatalf("%s holds nothing after convergence", paused.id)
	}
	h.sink.mark(faultStop, paused.id, "SIGSTOP")
	paused.proc.signal(t, syscall.SIGSTOP)
	stopped := time.Now()
	h.awaitSink(paused.id+"'s buckets granted to others while it is stopped", 30*time.Second, func(s *chaos.History) string {
		for b, tok := range held {
			if g := s.Cur[b]; g.Token == tok {
				return fmt.Sprintf("bucket %d still at %s's token %d", b, paused.id, tok)
			}
		}
		return ""
	})
	takeover := time.Since(stopped)
	cont := h.sink.mark(faultCont, paused.id, "SIGCONT")
	paused.proc.signal(t, syscall.SIGCONT)
	resumed := time.Now()
	h.awaitSink(paused.id+" to fence its old grants after resuming", 30*time.Second, func(s *chaos.History) string {
		for b, tok := range held {
			if g := s.Grants[bucketToken{Bucket: b, Token: tok}]; g.Released == 0 {
				return fmt.Sprintf("%s has not released bucket %d at token %d", paused.id, b, tok)
			}
		}
		return ""
	})
	fencedIn := time.Since(resumed)
	h.awaitSink(paused.id+" to re-join", 30*time.Second, func(s *chaos.History) string {
		for _, r := range s.Recs[cont:] {
			if r.Worker == paused.id && r.Kind == kindRejoined {
				return ""
			}
		}
		return "no rejoined event after SIGCONT"
	})
	phase("SIGSTOP past the lease and SIGCONT", began)

	// 5. Final convergence and the whole record.
	began = time.Now()
	h.waitConverged(60*time.Second, ids...)
	phase("final convergence", began)
	h.check()

	recs := h.sink.records()
	late, refused := 0, 0
	successor := map[int]uint64{} // bucket → the token of the grant that replaced the paused worker's
	for _, r := range recs {
		tok, was := held[r.Bucket]
		switch {
		case !was:
		case r.Kind == kindAcquire && r.Token > tok && successor[r.Bucket] == 0:
			successor[r.Bucket] = r.Token
		case r.Kind == kindRelease && r.Worker == paused.id && r.Token == tok && !r.Fenced:
			t.Errorf("%v: %s released an old grant after resuming without fencing itself", r, paused.id)
		case r.Kind == kindRelease && r.Token == successor[r.Bucket] && r.Fenced:
			t.Errorf("%v: a grant made while %s was stopped was fenced: the resumed worker disturbed its successor", r, paused.id)
		case r.Kind == kindWrite && r.Worker == paused.id && r.Token == tok && r.Seq > cont:
			late++
			if r.Refused {
				refused++
			} else {
				t.Errorf("%v: %s's late write with its old token was accepted", r, paused.id)
			}
		}
	}
	acquires := map[string]int{}
	for _, r := range recs {
		if r.Kind == kindAcquire {
			acquires[r.Worker]++
		}
	}
	for _, w := range workers {
		if acquires[w.id] == 0 {
			t.Errorf("%s (%s) never acquired a bucket", w.id, w.lang)
		}
	}
	h.sink.View(func(s *chaos.History) {
		for b := range h.buckets {
			if g := s.Cur[b]; g == nil || g.Released != 0 {
				t.Errorf("bucket %d ends without a holder (%+v)", b, g)
			}
		}
	})
	if takeover < ttl/2 {
		t.Errorf("%s's buckets moved %v after it stopped; its lease (TTL %v) cannot have expired yet", paused.id, takeover, ttl)
	}
	var langNames []string
	for _, w := range workers {
		langNames = append(langNames, fmt.Sprintf("%s=%s (%d acquires)", w.id, w.lang, acquires[w.id]))
	}
	t.Logf("workers %s; %s held %d buckets at SIGSTOP, taken over %v later (lease TTL %v), fenced within %v of SIGCONT, %d late writes (%d refused); phases: %s",
		strings.Join(langNames, ", "), paused.id, len(held), takeover.Round(time.Millisecond), ttl, fencedIn.Round(time.Millisecond), late, refused, strings.Join(phases, ", "))
}
