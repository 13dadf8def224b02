package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestDashboardMounted: the page is served at /ui/ without a token (it
// asks for one), /ui redirects there, and the API it calls still needs
// the token.
func TestDashboardMounted(t *testing.T) {
	ts := startServer(t, nil)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := noRedirect.Get(ts.url + "/ui")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMovedPermanently || res.Header.Get("Location") != "/ui/" {
		t.Errorf("GET /ui: %d to %q, want a redirect to /ui/", res.StatusCode, res.Header.Get("Location"))
	}
	for _, path := range []string{"/ui/", "/ui/app.js", "/ui/style.css"} {
		res, err := http.Get(ts.url + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || len(body) == 0 {
			t.Errorf("GET %s without a token: %d, %d bytes", path, res.StatusCode, len(body))
		}
		if !strings.Contains(res.Header.Get("Content-Security-Policy"), "default-src 'self'") {
			t.Errorf("GET %s: Content-Security-Policy %q", path, res.Header.Get("Content-Security-Policy"))
		}
	}
	res, err = http.Post(ts.url+"/keyshard.v1.AdminService/Status", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Errorf("Status without a token: %d, want 401", res.StatusCode)
	}
}
