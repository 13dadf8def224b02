package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/internal/chaos"
	"github.com/keyshard/keyshard/keyshardtest"
)

const (
	abuseAdminToken  = "abuse-admin-token-0123456789"
	abuseMemberToken = "abuse-member-token-0123456789"
)

// TestServeMemoryUnderAbuse runs a real `keyshard serve` with tokens and
// measures its memory (VmHWM, VmRSS of /proc/PID/status) through abuse:
// four concurrent 50 MB posts without a token (under 100 MB at the peak),
// four 50 MB posts with one but without a Content-Length (cut at the size
// limit as they are read), then 1,000 long-lived watches of an overflow
// set, each of which holds a long-poll place (under 150 MB). A replica used to read and decode every unauthenticated
// body before refusing it (RSS 35 MB -> 640 MB).
func TestServeMemoryUnderAbuse(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs it through 400 MB of posts")
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("needs /proc to read the server's memory")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bin, err := chaos.BuildKeyshard(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "keyshard.yaml")
	if err := os.WriteFile(cfgFile, []byte("keyspaces: [{name: rooms, buckets: 16}]\nhotkey_pools: [{name: ingest, threshold: 100}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Port 0: serve chooses a free port and logs it. A port found free
	// here and passed on may be taken by another test meanwhile.
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"), "--config", cfgFile,
		"--admin-token", abuseAdminToken, "--member-token", abuseMemberToken)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // exits with the process
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	url := "http://" + waitServing(t, stderr)
	mem := func(what string) (hwm, rss int) {
		hwm, rss = procMemKB(t, cmd.Process.Pid)
		t.Logf("%-40s VmHWM %4d MB, VmRSS %4d MB", what, hwm>>10, rss>>10)
		return hwm, rss
	}
	mem("ready")

	var wg sync.WaitGroup
	post := func(i int, length int64, auth string, want int) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+keyshardv1connect.AdminServiceCreateKeyspaceProcedure, &spaces{n: 50 << 20})
		if err != nil {
			t.Error(err)
			return
		}
		req.ContentLength = length
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := (&http.Client{Transport: &http.Transport{}}).Do(req)
		if err != nil {
			t.Errorf("post %d: %v", i, err)
			return
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("post %d: status %d, want %d", i, res.StatusCode, want)
		}
	}
	for i := range 4 {
		wg.Go(func() { post(i, 50<<20, "", http.StatusUnauthorized) })
	}
	wg.Wait()
	if hwm, _ := mem("after 4 unauthenticated posts of 50 MB"); hwm > 100<<10 {
		t.Errorf("peak RSS %d MB after the posts; want < 100 MB", hwm>>10)
	}
	// With a token, but no Content-Length: each is cut at 4 MiB.
	for i := range 4 {
		wg.Go(func() { post(i, -1, "Bearer "+abuseAdminToken, http.StatusTooManyRequests) })
	}
	wg.Wait()
	if hwm, _ := mem("after 4 chunked posts of 50 MB"); hwm > 150<<10 {
		t.Errorf("peak RSS %d MB after the posts; want < 150 MB", hwm>>10)
	}

	// 1,000 watches (Connect streams over JSON), each on its own HTTP/1.1
	// connection; each call returns once the server has sent the stream's
	// headers, by then it holds a long-poll place.
	watchClient := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: -1}}
	msg := `{"pool":"ingest"}`
	envelope := append([]byte{0, 0, 0, 0, byte(len(msg))}, msg...)
	const polls = 1000
	streams := make([]io.Closer, polls)
	for i := range streams {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+keyshardv1connect.HotKeyServiceWatchOverflowSetProcedure, bytes.NewReader(envelope))
			if err != nil {
				t.Error(err)
				return
			}
			req.Header.Set("Content-Type", "application/connect+json")
			req.Header.Set("Authorization", "Bearer "+abuseMemberToken)
			res, err := watchClient.Do(req)
			if err != nil {
				t.Errorf("watch %d: %v", i, err)
				return
			}
			streams[i] = res.Body
			if res.StatusCode != http.StatusOK {
				t.Errorf("watch %d: status %d", i, res.StatusCode)
			}
		})
	}
	wg.Wait()
	defer func() {
		for _, s := range streams {
			if s != nil {
				s.Close()
			}
		}
	}()
	if got := keyshardtest.Metric(t, url, "keyshard_api_long_polls"); got != polls {
		t.Errorf("keyshard_api_long_polls = %v, want %d", got, polls)
	}
	if hwm, rss := mem(fmt.Sprintf("with %d watches held", polls)); hwm > 150<<10 || rss > 150<<10 {
		t.Errorf("RSS %d MB (peak %d MB) with %d watches; want < 150 MB", rss>>10, hwm>>10, polls)
	}
}

// waitServing reads the server's log until it says it serves, and
// returns the address it listens on; the rest of the log is discarded.
func waitServing(t *testing.T, log io.Reader) (addr string) {
	t.Helper()
	sc := bufio.NewScanner(log)
	var tail []string
	for sc.Scan() {
		line := sc.Text()
		if m := chaos.ServingRE.FindStringSubmatch(line); m != nil {
			go io.Copy(io.Discard, log) // exits when the process closes its stderr
			return m[1]
		}
		tail = append(tail, line)
	}
	t.Fatalf("keyshard serve exited before serving:\n%s", strings.Join(tail, "\n"))
	return ""
}

// procMemKB reads the peak and current resident set of process pid, in kB.
func procMemKB(t *testing.T, pid int) (hwm, rss int) {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(raw)) {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		n, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "VmHWM:":
			hwm = n
		case "VmRSS:":
			rss = n
		}
	}
	return hwm, rss
}

// spaces is a body of n spaces (valid JSON whitespace) made as it is read.
type spaces struct{ n int }

func (s *spaces) Read(p []byte) (int, error) {
	if s.n == 0 {
		return 0, io.EOF
	}
	p = p[:min(len(p), s.n)]
	for i := range p {
		p[i] = ' '
	}
	s.n -= len(p)
	return len(p), nil
}
