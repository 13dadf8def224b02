package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keyshard/keyshard/internal/chaos"
)

func TestPairHandoffs(t *testing.T) {
	recs, err := chaos.ParseHistory(strings.NewReader(`
@0s      acquire w1 0 1
@0s      acquire w1 1 1
@0s      acquire w1 2 1
@0s      acquire w1 3 1
# before the measured part: a handoff of bucket 3 that does not count
@100ms   release w1 3 1
@150ms   acquire w2 3 2
# record 6 is where the measurement begins
@1s      release w1 0 1
@1.040s  acquire w2 0 2
# a fenced release starts no handoff
@1.1s    release w1 1 1 fenced
@5s      acquire w2 1 2
# a grant superseded while its holder was stopped starts none either
@2s      stop w1
@4s      acquire w2 2 2
@6s      cont w1
@6.1s    release w1 2 1 fenced
@6.2s    release w2 2 2
# an old token or a refused claim does not end the handoff; the next token does
@6.3s    acquire w3 2 1
@6.5s    acquire w1 2 3
# a release without a next acquire yet
@7s      release w2 0 2
`))
	if err != nil {
		t.Fatal(err)
	}
	hs := PairHandoffs(recs, 6)
	type pair struct {
		b        int
		from, to string
		ft, tt   uint64
		took     time.Duration
	}
	var got []pair
	for _, h := range hs {
		got = append(got, pair{h.Bucket, h.From, h.To, h.FromToken, h.ToToken, h.Took()})
	}
	want := []pair{
		{0, "w1", "w2", 1, 2, 40 * time.Millisecond},
		{2, "w2", "w1", 2, 3, 300 * time.Millisecond},
	}
	if len(got) != len(want) {
		t.Fatalf("handoffs %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("handoff %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if all := PairHandoffs(recs, 0); len(all) != 3 || all[0].Bucket != 3 || all[0].Took() != 50*time.Millisecond {
		t.Errorf("from 0: %+v, want bucket 3's handoff first, then the two above", all)
	}
}

// TestHandoffPercentiles pairs 100 synthetic handoffs of 1 to 100 ms
// and takes their percentiles as Clients does.
func TestHandoffPercentiles(t *testing.T) {
	var hist strings.Builder
	at, tok := time.Duration(0), 0
	for i := 100; i >= 1; i-- { // out of order on purpose
		b := i % 7
		tok++
		fmt.Fprintf(&hist, "@%v acquire w1 %d %d\n", at, b, tok)
		at += time.Second
		fmt.Fprintf(&hist, "@%v release w1 %d %d\n", at, b, tok)
		at += time.Duration(i) * time.Millisecond
		tok++
		fmt.Fprintf(&hist, "@%v acquire w2 %d %d\n", at, b, tok)
		fmt.Fprintf(&hist, "@%v release w2 %d %d fenced\n", at, b, tok)
		at += time.Second
	}
	recs, err := chaos.ParseHistory(strings.NewReader(hist.String()))
	if err != nil {
		t.Fatal(err)
	}
	hs := PairHandoffs(recs, 0)
	if len(hs) != 100 {
		t.Fatalf("%d handoffs, want 100", len(hs))
	}
	var times []time.Duration
	for _, h := range hs {
		times = append(times, h.Took())
	}
	for _, tc := range []struct{ p, want float64 }{{50, 50}, {99, 99}, {100, 100}} {
		if got := percentileMs(times, tc.p); got != tc.want {
			t.Errorf("p%v = %v ms, want %v", tc.p, got, tc.want)
		}
	}
}

// TestClientsMissingWorker: a language whose worker script is missing is
// named before anything starts.
func TestClientsMissingWorker(t *testing.T) {
	repo := t.TempDir()
	_, err := Clients(t.Context(), ClientsOptions{Langs: []chaos.Lang{chaos.LangGo, chaos.LangPython, chaos.LangNode},
		Workers: chaos.Workers{Repo: repo, LookPath: func(f string) (string, error) {
			if f == "node" {
				return "", errors.New("not found")
			}
			return "/usr/bin/" + f, nil
		}}}, &bytes.Buffer{})
	if err == nil {
		t.Fatal("no error")
	}
	for _, s := range []string{"no keyshard binary", "chaos_worker.py is missing", "need node", "install Node.js"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error does not say %q:\n%v", s, err)
		}
	}
}

// TestClientsQuick runs the cross-language handoff benchmark with Go
// workers only, quick, and checks that the figures are there and sane.
func TestClientsQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("builds keyshard and runs worker processes; skipped with -short")
	}
	bin := keyshardBinary(t)
	var progress bytes.Buffer
	rep, err := Clients(t.Context(), ClientsOptions{Langs: []chaos.Lang{chaos.LangGo}, Runs: 1, Quick: true, Workers: chaos.Workers{Keyshard: bin}}, &progress)
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatal(err)
	}
	g := rep.PerLang["go"]
	if len(rep.Langs) != 1 || rep.Langs[0] != "go" || g == nil || len(rep.PerLang) != 1 {
		t.Fatalf("report for %v: %+v", rep.Langs, rep.PerLang)
	}
	if rep.Buckets != 64 || rep.LeaseTTLS != 10 || rep.Cycles != 2 || rep.Runs != 1 || !rep.Quick {
		t.Errorf("settings %+v", rep)
	}
	// Each cycle hands about a third of the buckets to the new worker and
	// back.
	if g.Handoffs < 2*rep.Cycles || g.Handoffs > 2*rep.Cycles*rep.Buckets {
		t.Errorf("%d handoffs in %d cycles", g.Handoffs, rep.Cycles)
	}
	if !(0 < g.HandoffP50Ms && g.HandoffP50Ms <= g.HandoffP99Ms && g.HandoffP99Ms <= g.HandoffMaxMs) {
		t.Errorf("handoff p50 %v, p99 %v, max %v ms: want 0 < p50 <= p99 <= max", g.HandoffP50Ms, g.HandoffP99Ms, g.HandoffMaxMs)
	}
	if len(g.HandoffP99RunsMs) != 1 || g.HandoffP99RunsMs[0] != g.HandoffP99Ms {
		t.Errorf("p99 per run %v, median %v", g.HandoffP99RunsMs, g.HandoffP99Ms)
	}
	if g.P99RatioVsGo == nil || *g.P99RatioVsGo != 1 {
		t.Errorf("Go's p99 ratio to itself: %v", g.P99RatioVsGo)
	}
	if g.JoinMs <= 0 || g.LeaveMs <= 0 {
		t.Errorf("join %v ms, leave %v ms", g.JoinMs, g.LeaveMs)
	}
	if g.Violations != 0 || g.FencedReleases != 0 {
		t.Errorf("%d violations (%v), %d fenced releases", g.Violations, g.ViolationExamples, g.FencedReleases)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	goFields, _ := m["per_lang"].(map[string]any)["go"].(map[string]any)
	for _, f := range []string{"handoffs", "handoff_p50_ms", "handoff_p99_ms", "handoff_max_ms", "p99_ratio_vs_go", "join_ms", "leave_ms"} {
		if _, ok := goFields[f]; !ok {
			t.Errorf("JSON per_lang.go has no %q: %s", f, b)
		}
	}
	for _, s := range []string{"cycle 1/2", "cycle 2/2", "go: "} {
		if !strings.Contains(progress.String(), s) {
			t.Errorf("progress does not say %q", s)
		}
	}
}

// TestPairHandoffsOnWorkersClock: a handoff on the workers' clock starts
// when the old owner's release() returned, which its next record carries
// and may reach the sink after the new owner's acquire; without it, at its
// release record.
func TestPairHandoffsOnWorkersClock(t *testing.T) {
	recs := []chaos.Record{
		{Seq: 1, Kind: chaos.KindAcquire, Worker: "w1", Bucket: 0, Token: 1, Mono: 100},
		{Seq: 2, Kind: chaos.KindAcquire, Worker: "w1", Bucket: 1, Token: 1, Mono: 100},
		{Seq: 3, Kind: chaos.KindRelease, Worker: "w1", Bucket: 0, Token: 1, Mono: 1_000},
		{Seq: 4, Kind: chaos.KindAcquire, Worker: "w2", Bucket: 0, Token: 2, Mono: 11_000},
		{Seq: 5, Kind: chaos.KindWrite, Worker: "w1", Bucket: 1, Token: 1, Released: []chaos.ReleasedAt{{Bucket: 0, Token: 1, Mono: 3_000}}},
		{Seq: 6, Kind: chaos.KindRelease, Worker: "w1", Bucket: 1, Token: 1, Mono: 20_000},
		{Seq: 7, Kind: chaos.KindAcquire, Worker: "w2", Bucket: 1, Token: 2, Mono: 25_000},
		// the return of another grant's release() does not count
		{Seq: 8, Kind: chaos.KindJoined, Worker: "w1", Released: []chaos.ReleasedAt{{Bucket: 1, Token: 7, Mono: 24_000}}},
	}
	hs := PairHandoffs(recs, 0)
	if len(hs) != 2 {
		t.Fatalf("got %d handoffs, want 2: %+v", len(hs), hs)
	}
	for i, want := range []time.Duration{8_000, 5_000} {
		if d, ok := hs[i].InWorkers(); !ok || d != want {
			t.Errorf("handoff of bucket %d on the workers' clock: %v, %v; want %v", hs[i].Bucket, d, ok, want)
		}
	}
	if _, ok := (Handoff{MonoAcquired: 5}).InWorkers(); ok {
		t.Error("a handoff without the old owner's time has a time on the workers' clock")
	}
}
