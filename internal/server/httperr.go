package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
)

// jsonErrors gives the answers that net/http and connect write in plain
// text (404 for an unknown path or method, 405 for a wrong HTTP method,
// 415 for a content type no codec serves) the JSON error body of every
// other error, {"code": ..., "message": ...}, with a message that says
// what to send instead. The status stays.
func jsonErrors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&jsonErrorWriter{ResponseWriter: w, req: r}, r)
	})
}

type jsonErrorWriter struct {
	http.ResponseWriter
	req      *http.Request
	wrote    bool
	replaced bool // the body written is ours; drop the handler's
}

func (w *jsonErrorWriter) WriteHeader(status int) {
	if w.wrote {
		w.ResponseWriter.WriteHeader(status)
		return
	}
	w.wrote = true
	h := w.Header()
	msg := ""
	if !strings.HasPrefix(h.Get("Content-Type"), "application/json") {
		msg = plainStatusMessage(status, w.req, h)
	}
	if msg == "" {
		w.ResponseWriter.WriteHeader(status)
		return
	}
	body, _ := json.Marshal(struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}{connect.CodeUnimplemented.String(), msg})
	h.Del("X-Content-Type-Options")
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", fmt.Sprint(len(body)))
	w.ResponseWriter.WriteHeader(status)
	w.ResponseWriter.Write(body)
	w.replaced = true
}

func (w *jsonErrorWriter) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if w.replaced {
		return len(p), nil
	}
	return w.ResponseWriter.Write(p)
}

func (w *jsonErrorWriter) Flush() {
	if !w.wrote { // flushing sends the headers, with 200
		w.WriteHeader(http.StatusOK)
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *jsonErrorWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// plainStatusMessage says what to do about a 404, 405 or 415 answer to r;
// "" for other statuses.
func plainStatusMessage(status int, r *http.Request, h http.Header) string {
	switch status {
	case http.StatusNotFound:
		return notFoundMessage(r.URL.Path)
	case http.StatusMethodNotAllowed:
		return fmt.Sprintf("%s %s: HTTP method not allowed; use %s", r.Method, r.URL.Path, h.Get("Allow"))
	case http.StatusUnsupportedMediaType:
		ct := r.Header.Get("Content-Type")
		if r.Method == http.MethodGet {
			return fmt.Sprintf("GET %s: a GET request takes its message in the query (?encoding=json&message=...) and has no body", r.URL.Path)
		}
		return fmt.Sprintf("Content-Type %q is not served; send \"application/json\" (Connect JSON), \"application/proto\", or gRPC (accepted: %s)", ct, h.Get("Accept-Post"))
	}
	return ""
}

// notFoundMessage names the methods of the service path names, or the
// services if it names none.
func notFoundMessage(path string) string {
	svc, method, _ := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	services := v1.File_keyshard_proto.Services()
	var names []string
	for i := range services.Len() {
		sd := services.Get(i)
		names = append(names, string(sd.FullName()))
		if string(sd.FullName()) != svc {
			continue
		}
		var methods []string
		for j := range sd.Methods().Len() {
			methods = append(methods, string(sd.Methods().Get(j).Name()))
		}
		return fmt.Sprintf("%s has no method %q; it has %s", svc, method, strings.Join(methods, ", "))
	}
	return fmt.Sprintf("no such path: %s; the API is POST /<service>/<method> with services %s (see api/keyshard/v1/keyshard.proto), and /healthz, /readyz, /metrics", path, strings.Join(names, ", "))
}
