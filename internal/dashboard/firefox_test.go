package dashboard_test

// The dashboard in headless Firefox (Debian's firefox-esr), driven over
// WebDriver BiDi, against a real `keyshard serve` process: the same
// checks as the first pass of TestDashboard and as TestDashboardAuth,
// in the other engine. The browser is /usr/bin/firefox-esr (or
// $KEYSHARD_FIREFOX); without it the tests skip, unless
// KEYSHARD_REQUIRE_BROWSER is set. Screenshots (firefox-*.png) go to
// $KEYSHARD_ARTIFACTS, or the test's temp dir.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keyshard/keyshard/client"
)

// firefox returns the browser's path, or skips the test when it is
// missing and KEYSHARD_REQUIRE_BROWSER is unset.
func firefox(t *testing.T) string {
	t.Helper()
	p := os.Getenv("KEYSHARD_FIREFOX")
	if p == "" {
		p = "/usr/bin/firefox-esr"
	}
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("KEYSHARD_REQUIRE_BROWSER") != "" {
			t.Fatalf("no Firefox at %s (KEYSHARD_REQUIRE_BROWSER is set): apt-get install -y firefox-esr, or set KEYSHARD_FIREFOX", p)
		}
		t.Skipf("no Firefox at %s: apt-get install -y firefox-esr (or set KEYSHARD_FIREFOX) to run the dashboard's Firefox tests", p)
	}
	return p
}

// firefoxPrefs go in the fresh profile's user.js: no first-run, welcome
// or default-browser pages (the test's tab is the only one), and nothing
// fetched in the background (updates, telemetry, studies, remote
// settings, safe-browsing lists).
const firefoxPrefs = `
user_pref("browser.shell.checkDefaultBrowser", false);
user_pref("browser.startup.homepage_override.mstone", "ignore");
user_pref("browser.startup.page", 0);
user_pref("browser.aboutwelcome.enabled", false);
user_pref("startup.homepage_welcome_url", "about:blank");
user_pref("datareporting.policy.firstRunURL", "");
user_pref("datareporting.policy.dataSubmissionEnabled", false);
user_pref("datareporting.healthreport.uploadEnabled", false);
user_pref("toolkit.telemetry.reportingpolicy.firstRun", false);
user_pref("app.update.disabledForTesting", true);
user_pref("app.normandy.enabled", false);
user_pref("app.shield.optoutstudies.enabled", false);
user_pref("messaging-system.rsexperimentloader.enabled", false);
user_pref("services.settings.server", "data:,#remote-settings-dummy/v1");
user_pref("extensions.update.enabled", false);
user_pref("browser.safebrowsing.malware.enabled", false);
user_pref("browser.safebrowsing.phishing.enabled", false);
user_pref("browser.safebrowsing.downloads.enabled", false);
user_pref("network.captive-portal-service.enabled", false);
user_pref("network.connectivity-service.enabled", false);
user_pref("browser.sessionstore.resume_from_crash", false);
`

var bidiListeningRE = regexp.MustCompile(`WebDriver BiDi listening on (ws://\S+)`)

// ffPage is one tab of a headless Firefox of the test's own.
type ffPage struct {
	t     *testing.T
	bd    *bidi
	ctx   string // the tab's browsing context id
	shots string

	logMu  sync.Mutex
	logs   []string // the page's console and errors (log.entryAdded)
	thrown []string // of which uncaught exceptions
}

// onEvent keeps the log entries: the test logs them all at its end, and
// fails if the page threw an exception it did not catch.
func (p *ffPage) onEvent(method string, params json.RawMessage) {
	if method != "log.entryAdded" {
		return
	}
	var e struct {
		Type  string `json:"type"` // javascript (an uncaught exception) or console
		Level string `json:"level"`
		Text  string `json:"text"`
	}
	if json.Unmarshal(params, &e) != nil {
		return
	}
	line := fmt.Sprintf("%s %s: %s", e.Type, e.Level, e.Text)
	p.logMu.Lock()
	defer p.logMu.Unlock()
	p.logs = append(p.logs, line)
	if e.Type == "javascript" && e.Level == "error" {
		p.thrown = append(p.thrown, e.Text)
	}
}

// newFirefoxPage starts Firefox on a fresh profile, opens a BiDi session
// and sizes its tab as the chromium tests do; all of it ends with the test.
func newFirefoxPage(t *testing.T) *ffPage {
	t.Helper()
	bin := firefox(t)
	profile := t.TempDir()
	if err := os.WriteFile(filepath.Join(profile, "user.js"), []byte(firefoxPrefs), 0o644); err != nil {
		t.Fatal(err)
	}
	// Its stdout and stderr (and its content processes') go to one pipe:
	// the line with BiDi's address is read from it, and the rest is kept
	// for a failure's message.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--headless", "--no-remote", "--remote-debugging-port=0", "--profile", profile, "about:blank")
	cmd.Env = append(os.Environ(), "MOZ_CRASHREPORTER_DISABLE=1")
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its own group: killed whole at the end
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		t.Fatalf("start Firefox: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }() // ends when Firefox exits
	var (
		mu   sync.Mutex
		tail bytes.Buffer
	)
	output := func() string { mu.Lock(); defer mu.Unlock(); return tail.String() }
	listening := make(chan string, 1)
	outDone := make(chan struct{})
	go func() { // ends when every process of the group closed the pipe
		defer close(outDone)
		defer r.Close()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if m := bidiListeningRE.FindStringSubmatch(line); m != nil {
				select {
				case listening <- m[1]:
				default:
				}
			}
			mu.Lock()
			if tail.Len() > 256<<10 { // keep the start and the last lines
				tail.Truncate(128 << 10)
			}
			tail.WriteString(line + "\n")
			mu.Unlock()
		}
		io.Copy(io.Discard, r) // after a line too long to scan: Firefox must not block on a full pipe
	}()
	p := &ffPage{t: t}
	t.Cleanup(func() {
		// browser.close ends the session and Firefox; the group is killed
		// after a bounded wait in any case, so nothing outlives the test
		// (nor writes into the profile as t.TempDir removes it).
		if p.bd != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			p.bd.send(ctx, "browser.close", nil) // its answer may be lost as Firefox exits
			cancel()
			p.bd.close()
		}
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			t.Logf("Firefox did not exit 15s after browser.close: killing it")
		}
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		select {
		case <-outDone:
		case <-time.After(10 * time.Second):
			t.Logf("Firefox's output still open 10s after it was killed")
		}
	})

	var ws string
	select {
	case ws = <-listening:
	case <-exited:
		<-outDone
		t.Fatalf("Firefox exited before WebDriver BiDi listened:\n%s", output())
	case <-time.After(60 * time.Second):
		t.Fatalf("WebDriver BiDi not listening 60s after Firefox started:\n%s", output())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bd, err := dialBiDi(ctx, ws+"/session", p.onEvent)
	if err != nil {
		t.Fatalf("connect to Firefox's WebDriver BiDi at %s: %v\n%s", ws, err, output())
	}
	p.bd = bd
	var sess struct {
		SessionID    string `json:"sessionId"`
		Capabilities struct {
			BrowserName    string `json:"browserName"`
			BrowserVersion string `json:"browserVersion"`
		} `json:"capabilities"`
	}
	if err := bd.call(ctx, "session.new", map[string]any{"capabilities": map[string]any{}}, &sess); err != nil {
		t.Fatalf("start a WebDriver BiDi session: %v\n%s", err, output())
	}
	t.Logf("%s %s, WebDriver BiDi at %s", sess.Capabilities.BrowserName, sess.Capabilities.BrowserVersion, ws)
	if err := bd.call(ctx, "session.subscribe", map[string]any{"events": []string{"log.entryAdded"}}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // before Firefox ends (cleanups run last first)
		p.logMu.Lock()
		defer p.logMu.Unlock()
		for _, l := range p.logs {
			t.Logf("page log: %s", l)
		}
		for _, e := range p.thrown {
			t.Errorf("the page threw in Firefox: %s", e)
		}
	})
	var tree struct {
		Contexts []struct {
			Context string `json:"context"`
			URL     string `json:"url"`
		} `json:"contexts"`
	}
	if err := bd.call(ctx, "browsingContext.getTree", map[string]any{"maxDepth": 0}, &tree); err != nil {
		t.Fatal(err)
	}
	if len(tree.Contexts) > 0 {
		p.ctx = tree.Contexts[0].Context
	} else {
		var created struct {
			Context string `json:"context"`
		}
		if err := bd.call(ctx, "browsingContext.create", map[string]any{"type": "tab"}, &created); err != nil {
			t.Fatal(err)
		}
		p.ctx = created.Context
	}
	if err := bd.call(ctx, "browsingContext.setViewport", map[string]any{"context": p.ctx, "viewport": map[string]any{"width": 1400, "height": 1000}}, nil); err != nil {
		t.Fatal(err)
	}
	p.shots = os.Getenv("KEYSHARD_ARTIFACTS")
	if p.shots == "" {
		p.shots = t.TempDir()
	} else if err := os.MkdirAll(p.shots, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// do sends one command to the tab with a bound, failing the test on an error.
func (p *ffPage) do(what string, d time.Duration, method string, params, out any) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := p.bd.call(ctx, method, params, out); err != nil {
		p.fail(what, err)
	}
}

// fail ends the test with what the page says.
func (p *ffPage) fail(what string, err error) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var dom string
	if v, derr := p.bd.evaluate(ctx, p.ctx, `document.body.innerText.slice(0, 3000)`); derr == nil {
		v.decode(&dom)
	}
	p.t.Fatalf("%s: %v\npage text:\n%s", what, err, dom)
}

// navigate loads url and waits for its load event.
func (p *ffPage) navigate(what string, d time.Duration, url string) {
	p.t.Helper()
	p.do(what, d, "browsingContext.navigate", map[string]any{"context": p.ctx, "url": url, "wait": "complete"}, nil)
}

// ffEval evaluates expr in the page and decodes its value.
func ffEval[T any](p *ffPage, expr string) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out T
	v, err := p.bd.evaluate(ctx, p.ctx, expr)
	if err == nil {
		err = v.decode(&out)
	}
	if err != nil {
		p.fail("evaluate "+expr, err)
	}
	return out
}

// waitJS waits (bounded) until the JavaScript expression is true: it is
// evaluated every 50ms until d has passed. An evaluation that fails (the
// page between two documents) counts as false; the last error is in the
// failure's message.
func (p *ffPage) waitJS(what string, d time.Duration, expr string) {
	p.t.Helper()
	deadline := time.Now().Add(d)
	var last error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		v, err := p.bd.evaluate(ctx, p.ctx, expr)
		cancel()
		if err == nil {
			var ok bool
			if err = v.decode(&ok); err == nil && ok {
				return
			}
		}
		last = err
		if time.Now().After(deadline) {
			if last == nil {
				last = fmt.Errorf("still false after %v", d)
			}
			p.fail("wait for "+what, last)
		}
		time.Sleep(50 * time.Millisecond) // the poll interval of a bounded wait
	}
}

// visibleJS is true when the element sel matches is laid out with a size
// (as chromedp.WaitVisible sees it).
func visibleJS(sel string) string {
	q, _ := json.Marshal(sel)
	return fmt.Sprintf(`(() => { const e = document.querySelector(%s); if (!e) return false;
		const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0 && getComputedStyle(e).visibility !== 'hidden'; })()`, q)
}

func (p *ffPage) waitVisible(what string, d time.Duration, sel string) {
	p.t.Helper()
	p.waitJS(what+" ("+sel+" visible)", d, visibleJS(sel))
}

func (p *ffPage) waitNotVisible(what string, d time.Duration, sel string) {
	p.t.Helper()
	p.waitJS(what+" ("+sel+" not visible)", d, "!"+visibleJS(sel))
}

// element scrolls the element sel matches into view and returns its id
// for input actions.
func (p *ffPage) element(sel string) string {
	p.t.Helper()
	q, _ := json.Marshal(sel)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := p.bd.evaluate(ctx, p.ctx, fmt.Sprintf(`(() => { const e = document.querySelector(%s); e?.scrollIntoView({block: 'center', inline: 'center'}); return e; })()`, q))
	if err == nil && v.SharedID == "" {
		err = fmt.Errorf("no element (got a %s)", v.Type)
	}
	if err != nil {
		p.fail("find "+sel, err)
	}
	return v.SharedID
}

// click clicks the element sel matches with the mouse, at its centre.
func (p *ffPage) click(what, sel string) {
	p.t.Helper()
	el := p.element(sel)
	p.do(what, 10*time.Second, "input.performActions", map[string]any{"context": p.ctx, "actions": []any{mouseActions(
		pointerAt(el, 0, 0),
		map[string]any{"type": "pointerDown", "button": 0},
		map[string]any{"type": "pointerUp", "button": 0},
	)}}, nil)
}

// typeInto clicks the element sel matches and types text into it, key by key.
func (p *ffPage) typeInto(what, sel, text string) {
	p.t.Helper()
	p.click(what, sel)
	p.do(what, 10*time.Second, "input.performActions", map[string]any{"context": p.ctx, "actions": []any{keyActions(text)}}, nil)
}

// hover moves the mouse to (x, y) of the viewport, in CSS pixels.
func (p *ffPage) hover(what string, x, y float64) {
	p.t.Helper()
	p.do(what, 10*time.Second, "input.performActions", map[string]any{"context": p.ctx, "actions": []any{mouseActions(pointerAt("", x, y))}}, nil)
}

// screenshot saves the whole page (not only the viewport) as a PNG.
func (p *ffPage) screenshot(name string) {
	p.t.Helper()
	var shot struct {
		Data string `json:"data"`
	}
	p.do("screenshot "+name, 20*time.Second, "browsingContext.captureScreenshot", map[string]any{"context": p.ctx, "origin": "document"}, &shot)
	png, err := base64.StdEncoding.DecodeString(shot.Data)
	if err != nil {
		p.t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(p.shots, "firefox-"+name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		p.t.Fatal(err)
	}
	p.t.Logf("screenshot of %s: %s", name, path)
}

// legend reads the per-member counts the page shows.
func (p *ffPage) legend() (string, map[string]int) {
	p.t.Helper()
	got := ffEval[legendValue](p, legendJS)
	return got.Epoch, got.Counts
}

// ---- the tests ----

// TestDashboardFirefox is TestDashboard's first views in Firefox: the
// overview, the grid's counts against GetMap, a join seen without
// reload, and the hover tooltip over the grid.
func TestDashboardFirefox(t *testing.T) {
	if testing.Short() {
		t.Skip("runs keyshard serve and Firefox; skipped with -short")
	}
	p := newFirefoxPage(t)
	s := startServe(t)
	c, err := client.Dial(s.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Admin().CreateKeyspace(t.Context(), client.KeyspaceConfig{Name: "rooms", Buckets: 256, LeaseTTL: 10 * time.Second, DrainTimeout: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"w1", "w2", "w3"} {
		startWorker(t, c, "rooms", id)
	}

	p.navigate("open the overview", 20*time.Second, s.url+"/ui/")
	p.waitVisible("the overview's row of rooms", 20*time.Second, `#keyspaces tr[data-keyspace="rooms"]`)
	p.waitJS("the overview shows 3 members of rooms", 10*time.Second,
		`document.querySelector('#keyspaces tr[data-keyspace="rooms"] td:nth-child(5)')?.textContent === '3'`)
	p.screenshot("overview")

	t.Run("grid counts match GetMap", func(t *testing.T) {
		p.t = t
		p.navigate("open the keyspace", 10*time.Second, s.url+"/ui/#/keyspace/rooms")
		p.waitVisible("the legend", 10*time.Second, `#legend li[data-member]`)
		eventually(t, 15*time.Second, func() (bool, string) {
			epoch, want := s.mapCounts(t, "", "rooms")
			pageEpoch, got := p.legend()
			if pageEpoch == epoch && sameCounts(got, want) && len(want) == 3 {
				t.Logf("epoch %s: page and GetMap agree: %v", epoch, got)
				return true, ""
			}
			return false, fmt.Sprintf("page at epoch %s shows %v; GetMap at epoch %s says %v", pageEpoch, got, epoch, want)
		})
		p.screenshot("keyspace")
	})

	t.Run("a join shows without reload", func(t *testing.T) {
		p.t = t
		start := time.Now()
		startWorker(t, c, "rooms", "w4")
		p.waitJS("w4 in the legend", 10*time.Second, `!!document.querySelector('#legend li[data-member="w4"]') && +document.querySelector('#legend li[data-member="w4"]').dataset.count > 0`)
		t.Logf("join of w4 visible on the page %v after the worker started (joining included)", time.Since(start).Round(time.Millisecond))
		p.waitJS("w4 in the members table", 5*time.Second, `!!document.querySelector('#members-table tr[data-member="w4"]')`)
		p.screenshot("keyspace-after-join")
	})

	t.Run("hover shows a bucket", func(t *testing.T) {
		p.t = t
		box := ffEval[[]float64](p, `(() => { const g = document.querySelector('#grid'); g.scrollIntoView({block: 'center'}); const r = g.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; })()`)
		p.hover("hover the grid", box[0]+3, box[1]+3)
		p.waitJS("the tooltip", 5*time.Second, `!document.querySelector('#tooltip').hidden && document.querySelector('#tooltip').textContent.startsWith('bucket 0\nowner  w')`)
		p.waitJS("the tooltip's holder and token", 10*time.Second, `/holder w\d+\ntoken  \d+/.test(document.querySelector('#tooltip').textContent)`)
		t.Logf("tooltip over bucket 0: %q", ffEval[string](p, `document.querySelector('#tooltip').textContent`))
		p.screenshot("keyspace-hover")
	})
}

// TestDashboardAuthFirefox is TestDashboardAuth in Firefox: with tokens
// configured the page asks for one; an admin token reads; a member token
// reads the map, its drain is refused with a plain message, and the
// drain buttons are disabled after it.
func TestDashboardAuthFirefox(t *testing.T) {
	if testing.Short() {
		t.Skip("runs keyshard serve and Firefox; skipped with -short")
	}
	p := newFirefoxPage(t)
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
		p.waitVisible("the token form", 10*time.Second, `#auth-form`)
		p.typeInto("type the token", `#auth-token`, tok)
		p.click("use the token", `#auth-submit`)
		p.waitNotVisible("the token form closes", 10*time.Second, `#auth-form`)
	}

	p.navigate("open the page", 20*time.Second, s.url+"/ui/")
	p.waitVisible("the token prompt", 20*time.Second, `#auth-form`)
	p.screenshot("token-prompt")
	useToken(adminToken)
	p.waitVisible("the overview with the admin token", 10*time.Second, `#keyspaces tr[data-keyspace="rooms"]`)
	p.navigate("open the keyspace", 10*time.Second, s.url+"/ui/#/keyspace/rooms")
	p.waitVisible("the keyspace with the admin token", 10*time.Second, `#members-table tr[data-member="w2"] button[data-drain]`)

	// The member token: the map is readable by any token.
	p.click("open the token form", `#token-button`)
	useToken(memberToken)
	p.waitJS("the map with the member token", 15*time.Second, `document.querySelectorAll('#legend li[data-member]').length === 2`)
	epoch, want := s.mapCounts(t, memberToken, "rooms")
	if pageEpoch, got := p.legend(); pageEpoch == epoch && !sameCounts(got, want) {
		t.Errorf("with the member token, epoch %s: page %v, GetMap %v", epoch, got, want)
	}
	p.waitJS("the full members table with the member token", 15*time.Second,
		`(() => { const r = document.querySelector('#members-table tr[data-member="w1"]'); if (!r) return false;
		  const td = r.querySelectorAll('td'); return td[4].textContent.trim() !== '—' && td[6].textContent.trim() !== '—' &&
		  !document.querySelector('#members-note').textContent.includes('not readable'); })()`)
	p.waitJS("the epoch history with the member token", 10*time.Second,
		`(() => { const r = document.querySelector('#history-table tbody tr'); return !!r && r.dataset.epoch === document.querySelector('#view').dataset.epoch; })()`)
	p.waitVisible("the members table's drain button", 10*time.Second, `#members-table tr[data-member="w1"] button[data-drain]`)
	p.click("drain w1 with the member token", `#members-table tr[data-member="w1"] button[data-drain]`)
	p.waitVisible("the drain dialog", 10*time.Second, `#drain-dialog`)
	p.click("confirm the drain", `#drain-confirm`)
	p.waitJS("the plain refusal", 10*time.Second, `!document.querySelector('#drain-error').hidden && document.querySelector('#drain-error').textContent.includes('draining needs an admin token; this token is read-only')`)
	p.screenshot("drain-refused")
	p.click("close the dialog", `#drain-cancel`)
	p.waitNotVisible("the dialog closes", 5*time.Second, `#drain-dialog`)
	p.waitJS("drain buttons disabled with the reason", 5*time.Second,
		`[...document.querySelectorAll('button[data-drain]')].every(b => b.disabled) && document.querySelector('#members-note').textContent.includes('draining needs an admin token')`)
	if who := ffEval[string](p, `document.querySelector('#who').textContent`); who != "token set (read-only)" {
		t.Errorf("the header says %q, want %q", who, "token set (read-only)")
	}
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
	p.navigate("back to the overview", 10*time.Second, s.url+"/ui/#/")
	p.waitVisible("the overview with the member token", 10*time.Second, `#keyspaces tr[data-keyspace="rooms"]`)
	p.screenshot("overview-member-token")
}
