package dashboard_test

// The dashboard in headless Debian chromium, driven by chromedp, against a
// real `keyshard serve` process. The browser is /usr/bin/chromium (or
// $KEYSHARD_CHROMIUM); without it the tests skip, unless
// KEYSHARD_REQUIRE_BROWSER is set (CI sets it after installing chromium).
// The keyshard binary is $KEYSHARD_BIN or built once. Screenshots of each
// view go to $KEYSHARD_ARTIFACTS, or the test's temp dir.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/internal/chaos"
)

const (
	adminToken  = "ui-test-admin-token"
	memberToken = "ui-test-member-token"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// keyshardBin returns $KEYSHARD_BIN or a keyshard built once per run.
func keyshardBin(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("KEYSHARD_BIN"); b != "" {
		return b
	}
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "keyshard-ui-bin-"); binErr != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		binPath, binErr = chaos.BuildKeyshard(ctx, binDir)
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// chromium returns the browser's path, or skips the test when it is
// missing and KEYSHARD_REQUIRE_BROWSER is unset.
func chromium(t *testing.T) string {
	t.Helper()
	p := os.Getenv("KEYSHARD_CHROMIUM")
	if p == "" {
		p = "/usr/bin/chromium"
	}
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("KEYSHARD_REQUIRE_BROWSER") != "" {
			t.Fatalf("no browser at %s (KEYSHARD_REQUIRE_BROWSER is set): apt-get install chromium, or set KEYSHARD_CHROMIUM", p)
		}
		t.Skipf("no browser at %s: apt-get install chromium (or set KEYSHARD_CHROMIUM) to run the dashboard's browser tests", p)
	}
	return p
}

// ---- a keyshard serve process ----

type serve struct {
	t      *testing.T
	bin    string
	dir    string
	args   []string
	addr   string
	url    string
	cmd    *exec.Cmd
	exited chan struct{}
}

func startServe(t *testing.T, args ...string) *serve {
	t.Helper()
	s := &serve{t: t, bin: keyshardBin(t), dir: t.TempDir(), args: args, addr: "127.0.0.1:0"}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *serve) start() {
	t := s.t
	t.Helper()
	args := []string{"serve", "--listen", s.addr, "--data-dir", filepath.Join(s.dir, "data"), "--election-ttl", "2s"}
	if !slices.Contains(s.args, "--replica") {
		args = append(args, "--replica", "ui-test")
	}
	args = append(args, s.args...)
	cmd := exec.Command(s.bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.cmd = cmd
	s.exited = make(chan struct{})
	serving := make(chan string, 1)
	var tail bytes.Buffer
	var mu sync.Mutex
	go func() { // ends when the process closes its stderr
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if m := chaos.ServingRE.FindStringSubmatch(line); m != nil {
				select {
				case serving <- m[1]:
				default:
				}
			}
			mu.Lock()
			if tail.Len() < 64<<10 {
				tail.WriteString(line + "\n")
			}
			mu.Unlock()
		}
		io.Copy(io.Discard, stderr)
		cmd.Wait()
		close(s.exited)
	}()
	select {
	case addr := <-serving:
		s.addr = addr
		s.url = "http://" + addr
	case <-s.exited:
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("keyshard serve exited before serving:\n%s", tail.String())
	case <-time.After(60 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("keyshard serve not serving after 60s:\n%s", tail.String())
	}
}

func (s *serve) stop() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		s.cmd.Process.Kill()
		<-s.exited
	}
	s.cmd = nil
}

// call posts one HTTP/JSON API call and decodes the answer into out.
func (s *serve) call(ctx context.Context, token, method string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/keyshard.v1."+method, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %d %s", method, res.StatusCode, b)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

func (s *serve) mustCall(t *testing.T, token, method string, in, out any) {
	t.Helper()
	if err := s.call(t.Context(), token, method, in, out); err != nil {
		t.Fatal(err)
	}
}

type wireMap struct {
	Map struct {
		Epoch   json.Number `json:"epoch"`
		Buckets int         `json:"buckets"`
		Members []struct {
			ID string `json:"id"`
		} `json:"members"`
		Owners []int `json:"owners"`
	} `json:"map"`
}

// mapCounts is the map's epoch and buckets per member id.
func (s *serve) mapCounts(t *testing.T, token, keyspace string) (string, map[string]int) {
	t.Helper()
	var m wireMap
	s.mustCall(t, token, "MapService/GetMap", map[string]any{"keyspace": keyspace}, &m)
	counts := map[string]int{}
	for _, o := range m.Map.Owners {
		if o > 0 {
			counts[m.Map.Members[o-1].ID]++
		}
	}
	return m.Map.Epoch.String(), counts
}

// ---- workers ----

type noop struct{}

func (noop) Acquire(context.Context, client.Grant) error { return nil }
func (noop) Release(context.Context, int) error          { return nil }

// startWorker runs a Go SDK worker until the test ends.
func startWorker(t *testing.T, c *client.Client, keyspace, id string) {
	t.Helper()
	w, err := client.NewWorker(c, keyspace, client.Member{ID: id, Address: id + ".test:9000", Zone: "z" + id[len(id)-1:]}, noop{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }() // ends with ctx
	t.Cleanup(func() {
		cancel()
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		w.Close(cctx)
		<-done
	})
}

// ---- the browser ----

type page struct {
	t     *testing.T
	ctx   context.Context
	shots string
}

func newPage(t *testing.T) *page {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox,
		chromedp.Headless,
		chromedp.DisableGPU,
		chromedp.WindowSize(1400, 1000),
	)
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() { cancel(); acancel() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	shots := os.Getenv("KEYSHARD_ARTIFACTS")
	if shots == "" {
		shots = t.TempDir()
	} else if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	return &page{t: t, ctx: ctx, shots: shots}
}

// run runs actions with a bound: no wait of the tests is unbounded.
func (p *page) run(what string, d time.Duration, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, d)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		p.fail(what, err)
	}
}

// fail ends the test with what the page says.
func (p *page) fail(what string, err error) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	defer cancel()
	dom, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText.slice(0, 3000)`))
	p.t.Fatalf("%s: %v\npage text:\n%s", what, err, dom)
}

// waitJS waits (bounded) until the JavaScript expression is true.
func (p *page) waitJS(what string, d time.Duration, expr string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, d+5*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(d), chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
		p.fail("wait for "+what, err)
	}
}

// evalJS evaluates expr in the page and decodes its value.
func evalJS[T any](p *page, expr string) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		p.fail("evaluate "+expr, err)
	}
	return v
}

func (p *page) screenshot(name string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // 100: PNG
	if err != nil {
		p.fail("screenshot "+name, err)
	}
	path := filepath.Join(p.shots, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		p.t.Fatal(err)
	}
	p.t.Logf("screenshot of %s: %s", name, path)
}

// legendJS is the page's epoch and the per-member counts of its legend
// (the unassigned row left out), as a legendValue; the chromium and the
// Firefox tests read it alike.
const legendJS = `({epoch: document.querySelector('#view').dataset.epoch || '',
	counts: Object.fromEntries([...document.querySelectorAll('#legend li[data-member]')].filter(li => li.dataset.member !== '').map(li => [li.dataset.member, +li.dataset.count]))})`

type legendValue struct {
	Epoch  string         `json:"epoch"`
	Counts map[string]int `json:"counts"`
}

// legend reads the per-member counts the page shows.
func (p *page) legend() (string, map[string]int) {
	p.t.Helper()
	got := evalJS[legendValue](p, legendJS)
	return got.Epoch, got.Counts
}

// eventually polls cond every 100ms until it holds, failing with its
// last message after d.
func eventually(t *testing.T, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, msg)
		}
		<-tick.C
	}
}

func sameCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// ---- the tests ----

// TestDashboard opens every view against a server without tokens: the
// grid's counts against GetMap, a join seen without reload, a drain
// through the confirmation dialog, hover, hot keys, tenant pools, a
// replica restart survived, and 65,536 buckets × 200 members rendered.
func TestDashboard(t *testing.T) {
	if testing.Short() {
		t.Skip("runs keyshard serve and chromium; skipped with -short")
	}
	p := newPage(t)
	s := startServe(t)
	c, err := client.Dial(s.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := t.Context()
	if _, err := c.Admin().CreateKeyspace(ctx, client.KeyspaceConfig{Name: "rooms", Buckets: 256, LeaseTTL: 10 * time.Second, DrainTimeout: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	s.mustCall(t, "", "AdminService/PutHotKeyPool", map[string]any{"pool": map[string]any{"name": "ingest", "threshold": 100}}, nil)
	s.mustCall(t, "", "HotKeyService/ReportHotKeys", map[string]any{"pool": "ingest", "producer": "ingest-1", "keys": []any{map[string]any{"key": "token:abc", "rate": 150}}}, nil)
	s.mustCall(t, "", "TenantPoolService/PutTenantPool", map[string]any{"pool": map[string]any{"name": "gateways", "policy": map[string]any{"capacityPerMember": 10}}}, nil)
	for _, id := range []string{"w1", "w2", "w3"} {
		startWorker(t, c, "rooms", id)
	}

	p.run("open the overview", 20*time.Second,
		chromedp.Navigate(s.url+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(`#keyspaces tr[data-keyspace="rooms"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#hot-pools`)),
		chromedp.WaitVisible(chromedp.CSS(`#tenant-pools`)),
	)
	p.waitJS("the overview shows 3 members of rooms", 10*time.Second,
		`document.querySelector('#keyspaces tr[data-keyspace="rooms"] td:nth-child(5)')?.textContent === '3'`)
	p.screenshot("overview")

	t.Run("grid counts match GetMap", func(t *testing.T) {
		p.t = t
		p.run("open the keyspace", 10*time.Second, chromedp.Navigate(s.url+"/ui/#/keyspace/rooms"), chromedp.WaitVisible(chromedp.CSS(`#legend li[data-member]`)))
		// The map settles as the workers join: wait until the page shows
		// the map GetMap answers (bounded).
		eventually(t, 15*time.Second, func() (bool, string) {
			epoch, want := s.mapCounts(t, "", "rooms")
			pageEpoch, got := p.legend()
			if pageEpoch == epoch && sameCounts(got, want) && len(want) == 3 {
				t.Logf("epoch %s: page and GetMap agree: %v", epoch, got)
				return true, ""
			}
			return false, fmt.Sprintf("page at epoch %s shows %v; GetMap at epoch %s says %v", pageEpoch, got, epoch, want)
		})
	})

	t.Run("a join shows without reload", func(t *testing.T) {
		p.t = t
		start := time.Now()
		startWorker(t, c, "rooms", "w4")
		p.waitJS("w4 in the legend", 10*time.Second, `!!document.querySelector('#legend li[data-member="w4"]') && +document.querySelector('#legend li[data-member="w4"]').dataset.count > 0`)
		t.Logf("join of w4 visible on the page %v after the worker started (joining included)", time.Since(start).Round(time.Millisecond))
		p.waitJS("w4 in the members table", 5*time.Second, `!!document.querySelector('#members-table tr[data-member="w4"]')`)
	})

	t.Run("hover shows a bucket", func(t *testing.T) {
		p.t = t
		box := evalJS[[]float64](p, `(() => { const r = document.querySelector('#grid').getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; })()`)
		p.run("hover the grid", 5*time.Second, chromedp.MouseEvent(input.DispatchMouseEventTypeMouseMoved, box[0]+3, box[1]+3))
		p.waitJS("the tooltip", 5*time.Second, `!document.querySelector('#tooltip').hidden && document.querySelector('#tooltip').textContent.startsWith('bucket 0\nowner  w')`)
		// GetBuckets: the holder and its fencing token show.
		p.waitJS("the tooltip's holder and token", 10*time.Second, `/holder w\d+\ntoken  \d+/.test(document.querySelector('#tooltip').textContent)`)
		tip := evalJS[string](p, `document.querySelector('#tooltip').textContent`)
		t.Logf("tooltip over bucket 0: %q", tip)
		p.screenshot("keyspace")
	})

	t.Run("drain through the dialog", func(t *testing.T) {
		p.t = t
		p.run("ask to drain w1", 10*time.Second,
			chromedp.Click(chromedp.CSS(`button[data-drain="w1"]`)),
			chromedp.WaitVisible(chromedp.CSS(`#drain-dialog`)),
		)
		p.screenshot("drain-dialog")
		p.run("confirm", 10*time.Second, chromedp.Click(chromedp.CSS(`#drain-confirm`)), chromedp.WaitNotVisible(chromedp.CSS(`#drain-dialog`)))
		eventually(t, 15*time.Second, func() (bool, string) {
			ms, err := c.Admin().ListMembers(ctx, "rooms")
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range ms.Members {
				if m.ID == "w1" && m.Draining && m.TargetBuckets == 0 {
					return true, ""
				}
			}
			return false, fmt.Sprintf("w1 not drained through the API after the UI's drain: %+v", ms.Members)
		})
		p.waitJS("w1 shown draining", 5*time.Second, `document.querySelector('#members-table tr[data-member="w1"]')?.dataset.draining === 'true'`)
		p.waitJS("w1 left the map", 10*time.Second, `!document.querySelector('#legend li[data-member="w1"]') || document.querySelector('#legend li[data-member="w1"]').dataset.count === '0'`)
		// The epoch history, newest first: the drain of w1 on top, and the
		// join of w4 below it, each with the buckets it moved.
		p.waitJS("the drain and the join in the history", 10*time.Second, `(() => {
			const rows = [...document.querySelectorAll('#history-table tbody tr')].map((r) => [...r.querySelectorAll('td')].map((td) => td.textContent.trim()));
			const drain = rows.findIndex((c) => c[2] === 'drain' && c[3] === 'w1' && +c[4] > 0);
			const join = rows.findIndex((c) => c[2] === 'join' && c[3] === 'w4' && +c[4] > 0);
			return drain >= 0 && join > drain && rows.every((c, i) => i === 0 || +rows[i - 1][0] > +c[0]);
		})()`)
		p.screenshot("keyspace-history")
	})

	t.Run("hot keys", func(t *testing.T) {
		p.t = t
		p.run("open the pool", 20*time.Second, chromedp.Navigate(s.url+"/ui/#/hotkeys/ingest"), chromedp.WaitVisible(chromedp.CSS(`#overflow-table tr[data-key="token:abc"]`)))
		p.waitJS("the reports behind the set", 10*time.Second, `!!document.querySelector('#reports-table') && document.querySelector('#reports-table').textContent.includes('token:abc')`)
		p.screenshot("hotkeys")
	})

	t.Run("tenant pool", func(t *testing.T) {
		p.t = t
		p.run("open the pool", 10*time.Second, chromedp.Navigate(s.url+"/ui/#/pools/gateways"), chromedp.WaitReady(chromedp.CSS(`#tp-members`)))
		p.waitJS("its members and tenants", 10*time.Second, `document.querySelector('#tp-members').textContent !== '' && document.querySelector('#tp-tenants').textContent !== ''`)
		p.screenshot("tenant-pool")
	})

	t.Run("a replica restart", func(t *testing.T) {
		p.t = t
		p.run("open the keyspace", 10*time.Second, chromedp.Navigate(s.url+"/ui/#/keyspace/rooms"), chromedp.WaitVisible(chromedp.CSS(`#legend li[data-member]`)))
		s.stop()
		p.run("the banner", 10*time.Second, chromedp.WaitVisible(chromedp.CSS(`#banner`)))
		text := evalJS[string](p, `document.querySelector('#banner').textContent`)
		if !strings.Contains(text, "reconnecting to Keyshard") {
			t.Errorf("banner says %q", text)
		}
		p.screenshot("reconnecting")
		s.start() // the same address and data
		p.run("the banner goes", 40*time.Second, chromedp.WaitNotVisible(chromedp.CSS(`#banner`)))
		p.waitJS("the legend after the restart", 15*time.Second, `document.querySelectorAll('#legend li[data-member]').length > 0`)
	})

	t.Run("65536 buckets x 200 members", func(t *testing.T) {
		p.t = t
		large(t, p, s)
	})
}

// large joins 200 members to a keyspace of 65,536 buckets (plain Join
// calls and one keep-alive each, with a lease longer than the test: the
// map is what is drawn, grants do not matter),
// then times the first render and the repaint of one more join.
func large(t *testing.T, p *page, s *serve) {
	const buckets, members = 65536, 200
	s.mustCall(t, "", "AdminService/CreateKeyspace", map[string]any{"keyspace": map[string]any{"name": "big", "buckets": buckets, "leaseTtl": "120s"}}, nil)
	join := func(i int) error {
		id := fmt.Sprintf("m%03d", i)
		var joined struct {
			Session string `json:"session"`
		}
		if err := s.call(t.Context(), "", "MemberService/Join",
			map[string]any{"keyspace": "big", "member": map[string]any{"id": id, "address": id + ".test:9000", "zone": fmt.Sprintf("z%d", i%3)}}, &joined); err != nil {
			return err
		}
		// The first keep-alive activates the session: only then is it placed.
		return s.call(t.Context(), "", "MemberService/KeepAlive", map[string]any{"session": joined.Session}, nil)
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, members)
	const joiners = 25 // concurrent joins land in fewer epochs
	for g := range joiners {
		wg.Go(func() {
			for i := g; i < members; i += joiners {
				if err := join(i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d members joined in %v", members, time.Since(start).Round(time.Millisecond))
	// Joins land in the map as the leader places them: wait for all 200.
	eventually(t, 45*time.Second, func() (bool, string) {
		_, counts := s.mapCounts(t, "", "big")
		return len(counts) == members, fmt.Sprintf("%d of %d members in the map", len(counts), members)
	})
	t.Logf("%d members joined and placed in %v", members, time.Since(start).Round(time.Millisecond))

	p.run("open the big keyspace", 20*time.Second, chromedp.Navigate(s.url+"/ui/#/keyspace/big"))
	p.waitJS("200 members drawn", 20*time.Second, `window.__keyshardTimings.members === 200 && window.__keyshardTimings.render_ms !== null && document.querySelectorAll('#legend li[data-member]').length >= 200`)
	epoch, want := s.mapCounts(t, "", "big")
	pageEpoch, got := p.legend()
	if pageEpoch == epoch && !sameCounts(got, want) {
		t.Errorf("epoch %s: page counts differ from GetMap", epoch)
	}
	repaintsBefore := evalJS[int](p, `window.__keyshardTimings.repaints`)
	if err := join(members); err != nil {
		t.Fatal(err)
	}
	p.waitJS("the repaint after a join", 20*time.Second, fmt.Sprintf(`window.__keyshardTimings.repaints > %d && !!document.querySelector('#legend li[data-member="m%03d"]')`, repaintsBefore, members))
	timings := evalJS[map[string]any](p, `window.__keyshardTimings`)
	t.Logf("render of %d buckets × %d members: %.1f ms; repaint after a map update: %.1f ms (window.__keyshardTimings = %v)",
		buckets, members, timings["render_ms"], timings["repaint_ms"], timings)
	p.screenshot("keyspace-65536x200")
}

// TestDashboardAuth: with tokens configured the page asks for one; an
// admin token reads and drains; a member token reads the map and its
// drain is refused with a plain message, after which the drain buttons
// are disabled (the page remembers the refusal for that token).
func TestDashboardAuth(t *testing.T) {
	if testing.Short() {
		t.Skip("runs keyshard serve and chromium; skipped with -short")
	}
	p := newPage(t)
	s := startServe(t, "--admin-token", adminToken, "--member-token", memberToken)
	admin, err := client.Dial(s.url, client.Token(adminToken))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	member, err := client.Dial(s.url, client.Token(memberToken))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { member.Close() })
	if _, err := admin.Admin().CreateKeyspace(t.Context(), client.KeyspaceConfig{Name: "rooms", Buckets: 64, LeaseTTL: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	startWorker(t, member, "rooms", "w1")
	startWorker(t, member, "rooms", "w2")

	useToken := func(tok string) {
		p.run("type the token", 10*time.Second,
			chromedp.WaitVisible(chromedp.CSS(`#auth-form`)),
			chromedp.SendKeys(chromedp.CSS(`#auth-token`), tok),
			chromedp.Click(chromedp.CSS(`#auth-submit`)),
			chromedp.WaitNotVisible(chromedp.CSS(`#auth-form`)),
		)
	}

	p.run("the token prompt", 20*time.Second, chromedp.Navigate(s.url+"/ui/"), chromedp.WaitVisible(chromedp.CSS(`#auth-form`)))
	p.screenshot("token-prompt")
	useToken(adminToken)
	p.run("the overview with the admin token", 10*time.Second, chromedp.WaitVisible(chromedp.CSS(`#keyspaces tr[data-keyspace="rooms"]`)))
	p.run("the keyspace with the admin token", 10*time.Second,
		chromedp.Navigate(s.url+"/ui/#/keyspace/rooms"),
		chromedp.WaitVisible(chromedp.CSS(`#members-table tr[data-member="w2"] button[data-drain]`)),
	)

	// The member token: the map is readable by any token.
	p.run("open the token form", 5*time.Second, chromedp.Click(chromedp.CSS(`#token-button`)))
	useToken(memberToken)
	p.waitJS("the map with the member token", 15*time.Second, `document.querySelectorAll('#legend li[data-member]').length === 2`)
	epoch, want := s.mapCounts(t, memberToken, "rooms")
	if pageEpoch, got := p.legend(); pageEpoch == epoch && !sameCounts(got, want) {
		t.Errorf("with the member token, epoch %s: page %v, GetMap %v", epoch, got, want)
	}
	// AdminService's reads take a member token: the full members table
	// (lease left, granted) and the epoch history show, with no note that
	// details are not readable.
	p.waitJS("the full members table with the member token", 15*time.Second,
		`(() => { const r = document.querySelector('#members-table tr[data-member="w1"]'); if (!r) return false;
		  const td = r.querySelectorAll('td'); return td[4].textContent.trim() !== '—' && td[6].textContent.trim() !== '—' &&
		  !document.querySelector('#members-note').textContent.includes('not readable'); })()`)
	// (Its newest row is the page's epoch; the workers' joins may have
	// folded into the keyspace's first map, whose reason is create.)
	p.waitJS("the epoch history with the member token", 10*time.Second,
		`(() => { const r = document.querySelector('#history-table tbody tr'); return !!r && r.dataset.epoch === document.querySelector('#view').dataset.epoch; })()`)
	p.waitJS("the members table", 10*time.Second, `!!document.querySelector('#members-table tr[data-member="w1"] button[data-drain]')`)
	p.run("drain w1 with the member token", 10*time.Second,
		chromedp.Click(chromedp.CSS(`#members-table tr[data-member="w1"] button[data-drain]`)),
		chromedp.WaitVisible(chromedp.CSS(`#drain-dialog`)),
		chromedp.Click(chromedp.CSS(`#drain-confirm`)),
	)
	p.waitJS("the plain refusal", 10*time.Second, `!document.querySelector('#drain-error').hidden && document.querySelector('#drain-error').textContent.includes('draining needs an admin token; this token is read-only')`)
	p.screenshot("drain-refused")
	p.run("close the dialog", 5*time.Second, chromedp.Click(chromedp.CSS(`#drain-cancel`)), chromedp.WaitNotVisible(chromedp.CSS(`#drain-dialog`)))
	p.waitJS("drain buttons disabled with the reason", 5*time.Second,
		`[...document.querySelectorAll('button[data-drain]')].every(b => b.disabled) && document.querySelector('#members-note').textContent.includes('draining needs an admin token')`)
	ms, err := admin.Admin().ListMembers(t.Context(), "rooms")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms.Members {
		if m.Draining {
			t.Errorf("%s is draining after a refused drain", m.ID)
		}
	}
	// The overview reads with the member token too.
	p.run("the overview with the member token", 10*time.Second,
		chromedp.Navigate(s.url+"/ui/#/"),
		chromedp.WaitVisible(chromedp.CSS(`#keyspaces tr[data-keyspace="rooms"]`)),
	)
	p.screenshot("overview-member-token")
}
