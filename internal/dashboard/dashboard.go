package dashboard

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed assets
var embedded embed.FS

// Prefix is where Handler serves the page; Prefix without its slash
// redirects to it.
const Prefix = "/ui/"

// ContentSecurityPolicy is sent with every asset: the page loads nothing
// but its own files and talks to nothing but the API it came from.
const ContentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

type asset struct {
	body  []byte
	ctype string
	etag  string
}

// Assets returns the embedded files, for tests and tools that want their
// names and sizes.
func Assets() fs.FS {
	sub, err := fs.Sub(embedded, "assets")
	if err != nil {
		panic(err) // the directory is embedded above
	}
	return sub
}

// Handler returns the handler of Prefix and of Prefix without its
// trailing slash (a redirect). Mount it on both: mux.Handle("/ui/", h)
// and mux.Handle("/ui", h).
func Handler() http.Handler {
	files := map[string]asset{}
	err := fs.WalkDir(Assets(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := fs.ReadFile(Assets(), p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		ctype := mime.TypeByExtension(path.Ext(p))
		if ctype == "" {
			ctype = http.DetectContentType(body)
		}
		files[p] = asset{body: body, ctype: ctype, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	if err != nil {
		panic(fmt.Sprintf("dashboard: read the embedded assets: %v", err))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == strings.TrimSuffix(Prefix, "/") {
			http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
			return
		}
		name, ok := strings.CutPrefix(r.URL.Path, Prefix)
		if !ok {
			http.NotFound(w, r)
			return
		}
		if name == "" {
			name = "index.html"
		}
		a, ok := files[name]
		if !ok {
			http.Error(w, fmt.Sprintf("no dashboard asset %q", name), http.StatusNotFound)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "the dashboard's assets are read with GET", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", ContentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		// The assets change with the binary: revalidate every time (a 304
		// by ETag is cheap), so an upgraded replica serves the new page.
		h.Set("Cache-Control", "no-cache")
		h.Set("ETag", a.etag)
		h.Set("Content-Type", a.ctype)
		http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(a.body))
	})
}
