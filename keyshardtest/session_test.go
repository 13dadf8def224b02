package keyshardtest_test

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/keyshardtest"
)

// countingTransport counts the requests it carries, by path.
type countingTransport struct {
	base http.RoundTripper
	mu   sync.Mutex
	n    map[string]int
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.n[r.URL.Path]++
	c.mu.Unlock()
	return c.base.RoundTrip(r)
}

func (c *countingTransport) count(path string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[path]
}

// TestWorkerSessionStream: against keyshard serve, a worker over HTTP/2
// keeps alive on its Session stream (one KeepAlive call, the first, right
// after the Join; no WatchGrants); over HTTP/1.1 the server answers the
// Session stream UNIMPLEMENTED and the worker uses WatchGrants and
// KeepAlive calls.
func TestWorkerSessionStream(t *testing.T) {
	for _, tc := range []struct {
		name  string
		http2 bool
	}{{"HTTP/2", true}, {"HTTP/1.1", false}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			ts := keyshardtest.NewServer(t, keyshardtest.Options{
				Keyspaces:  []client.KeyspaceConfig{{Name: "rooms", Buckets: 16, LeaseTTL: 2 * time.Second}},
				AdminToken: adminToken, MemberToken: memberToken,
			})
			tr := &http.Transport{}
			if tc.http2 {
				tr.Protocols = new(http.Protocols)
				tr.Protocols.SetUnencryptedHTTP2(true)
			}
			counts := &countingTransport{base: tr, n: map[string]int{}}
			c := ts.Client(client.Token(memberToken), client.HTTPClient(&http.Client{Transport: counts}))
			ev := newEvents()
			w, err := client.NewWorker(c, "rooms", client.Member{ID: "w1", Address: "w1:1"}, nopHandler{}, client.OnEvent(ev.record))
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- w.Run(ctx) }() // exits on Close
			ev.wait(t, ctx, client.EventAcquired, 16)
			ev.wait(t, ctx, client.EventRenewed, 5) // the first, and four more (every TTL/3)
			if err := w.Close(ctx); err != nil {
				t.Errorf("Close = %v", err)
			}
			if err := <-done; err != nil {
				t.Errorf("Run = %v", err)
			}
			sessions := counts.count(keyshardv1connect.MemberServiceSessionProcedure)
			keepAlives := counts.count(keyshardv1connect.MemberServiceKeepAliveProcedure)
			watches := counts.count(keyshardv1connect.MemberServiceWatchGrantsProcedure)
			switch {
			case tc.http2 && (sessions != 1 || keepAlives != 1 || watches != 0):
				t.Errorf("%d Session streams, %d KeepAlive and %d WatchGrants calls; want 1, 1 and 0", sessions, keepAlives, watches)
			case !tc.http2 && (sessions != 1 || keepAlives < 5 || watches != 1):
				t.Errorf("%d Session streams, %d KeepAlive and %d WatchGrants calls; want 1, at least 5, and 1", sessions, keepAlives, watches)
			}
		})
	}
}
