package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/keyshard/keyshard/internal/server"
)

// TestDebugListen: with debug_listen, Go's profiles answer on their own
// listener, without a token; the API port never serves them.
func TestDebugListen(t *testing.T) {
	ts := startServer(t, func(c *server.Config) { c.DebugListen = "127.0.0.1:0" })
	addr := ts.srv.DebugAddr()
	if addr == "" || addr == "127.0.0.1:0" {
		t.Fatalf("DebugAddr = %q; want the bound address", addr)
	}
	get := func(url string) (int, string) {
		t.Helper()
		res, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, body := get("http://" + addr + "/debug/pprof/cmdline"); code != http.StatusOK || body == "" {
		t.Errorf("profiles' cmdline: %d %q", code, body)
	}
	if code, body := get("http://" + addr + "/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("profiles' index: %d", code)
	}
	if code, _ := get(ts.url + "/debug/pprof/"); code == http.StatusOK {
		t.Errorf("the API port serves the profiles")
	}
}

// TestDebugListenRefused: a bad debug_listen is refused naming the field.
func TestDebugListenRefused(t *testing.T) {
	for _, v := range []string{"nope", "127.0.0.1:7400"} {
		c := server.DefaultConfig()
		c.Listen, c.DebugListen = "127.0.0.1:7400", v
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "debug_listen") {
			t.Errorf("debug_listen %q: %v; want an error naming debug_listen", v, err)
		}
	}
}
