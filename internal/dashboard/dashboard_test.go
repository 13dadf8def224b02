package dashboard_test

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/keyshard/keyshard/internal/dashboard"
)

// maxAssetBytes is the budget of the embedded page (issue 13).
const maxAssetBytes = 300 << 10

func TestAssetsWithinBudget(t *testing.T) {
	total := 0
	err := fs.WalkDir(dashboard.Assets(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		t.Logf("%-12s %6d bytes", p, info.Size())
		total += int(info.Size())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("assets: %d bytes in all (budget %d)", total, maxAssetBytes)
	if total > maxAssetBytes {
		t.Errorf("the embedded assets are %d bytes; the budget is %d", total, maxAssetBytes)
	}
}

// TestAssetsLoadNothingExternal: no URL of another origin in the page.
func TestAssetsLoadNothingExternal(t *testing.T) {
	for _, name := range []string{"index.html", "app.js", "style.css"} {
		b, err := fs.ReadFile(dashboard.Assets(), name)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{"http://", "https://", "//cdn", "@import", "fonts.googleapis"} {
			if strings.Contains(string(b), s) {
				t.Errorf("%s contains %q: the dashboard must load nothing from elsewhere", name, s)
			}
		}
	}
}

func TestHandler(t *testing.T) {
	srv := httptest.NewServer(func() http.Handler {
		mux := http.NewServeMux()
		h := dashboard.Handler()
		mux.Handle("/ui/", h)
		mux.Handle("/ui", h)
		return mux
	}())
	defer srv.Close()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	res, err := noRedirect.Get(srv.URL + "/ui")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMovedPermanently || res.Header.Get("Location") != "/ui/" {
		t.Errorf("GET /ui: %d to %q, want a redirect to /ui/", res.StatusCode, res.Header.Get("Location"))
	}

	for path, ctype := range map[string]string{"/ui/": "text/html", "/ui/app.js": "javascript", "/ui/style.css": "text/css"} {
		res, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d", path, res.StatusCode)
		}
		if !strings.Contains(res.Header.Get("Content-Type"), ctype) {
			t.Errorf("GET %s: Content-Type %q, want %s", path, res.Header.Get("Content-Type"), ctype)
		}
		if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
			t.Errorf("GET %s: Content-Security-Policy %q", path, csp)
		}
		if res.Header.Get("Cache-Control") == "" || res.Header.Get("ETag") == "" {
			t.Errorf("GET %s: Cache-Control %q, ETag %q", path, res.Header.Get("Cache-Control"), res.Header.Get("ETag"))
		}
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		req.Header.Set("If-None-Match", res.Header.Get("ETag"))
		res2, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res2.Body.Close()
		if res2.StatusCode != http.StatusNotModified {
			t.Errorf("GET %s with its ETag: %d, want 304", path, res2.StatusCode)
		}
	}
	res, err = http.Get(srv.URL + "/ui/nope.js")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound {
		t.Errorf("GET /ui/nope.js: %d, want 404", res.StatusCode)
	}
	res, err = http.Post(srv.URL+"/ui/", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /ui/: %d, want 405", res.StatusCode)
	}
}
