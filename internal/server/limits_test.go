package server_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
)

// stalledBody sends head, then blocks until done is closed: a client that
// announces a large body and sends it slowly, or never.
type stalledBody struct {
	head []byte
	done <-chan struct{}
}

func (b *stalledBody) Read(p []byte) (int, error) {
	if len(b.head) > 0 {
		n := copy(p, b.head)
		b.head = b.head[n:]
		return n, nil
	}
	<-b.done
	return 0, io.ErrUnexpectedEOF
}

// h2cClient speaks HTTP/2 without TLS, with prior knowledge.
func h2cClient() *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// TestAuthBeforeBody shows that a call without a valid token is refused
// as soon as its headers are in: the server reads none of its body, which
// here never comes. Also for an HTTP/1.1 request asking to upgrade to h2c,
// which must not be buffered whole first.
func TestAuthBeforeBody(t *testing.T) {
	ts := startServer(t, nil)
	http1 := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	for _, tc := range []struct {
		name   string
		client *http.Client
		length int64 // -1: unknown (chunked in HTTP/1.1)
		header map[string]string
		want   int
	}{
		{"http1 no token", http1, 50 << 20, nil, http.StatusUnauthorized},
		{"http1 member token on admin", http1, 50 << 20, map[string]string{"Authorization": "Bearer " + memberToken}, http.StatusForbidden},
		{"h2c upgrade no token", http1, 50 << 20, map[string]string{"Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c", "HTTP2-Settings": "AAMAAABkAAQAoAAAAAIAAAAA"}, http.StatusUnauthorized},
		{"h2 no token", h2cClient(), -1, nil, http.StatusUnauthorized},
		{"h2 unknown token", h2cClient(), 50 << 20, map[string]string{"Authorization": "Bearer not-a-real-token-at-all"}, http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			body := &stalledBody{head: []byte(`{"keyspace":{"name":"`), done: ctx.Done()}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.url+keyshardv1connect.AdminServiceCreateKeyspaceProcedure, body)
			if err != nil {
				t.Fatal(err)
			}
			req.ContentLength = tc.length
			req.Header.Set("Content-Type", "application/json")
			for k, v := range tc.header {
				req.Header.Set(k, v)
			}
			res, err := tc.client.Do(req)
			if err != nil {
				t.Fatalf("no answer before the body: %v", err)
			}
			defer res.Body.Close()
			msg, _ := io.ReadAll(res.Body)
			if res.StatusCode != tc.want || !strings.Contains(string(msg), `"code"`) {
				t.Fatalf("status %d %s, want %d with a connect error body", res.StatusCode, msg, tc.want)
			}
		})
	}
}

// TestBearerSchemeCaseInsensitive: RFC 7235 auth schemes are
// case-insensitive, and the token may follow after several spaces.
func TestBearerSchemeCaseInsensitive(t *testing.T) {
	ts := startServer(t, nil)
	ctx := ctxT(t)
	for _, auth := range []string{"Bearer " + adminToken, "bearer " + adminToken, "BEARER " + adminToken, "bEaReR   " + adminToken} {
		c := keyshardv1connect.NewAdminServiceClient(http.DefaultClient, ts.url, connect.WithInterceptors(header("Authorization", auth)))
		if _, err := c.ListKeyspaces(ctx, connect.NewRequest(&v1.ListKeyspacesRequest{})); err != nil {
			t.Errorf("Authorization: %s: %v", auth, err)
		}
	}
	for _, auth := range []string{"Basic " + adminToken, "Bearer", "Bearer ", "Bearer" + adminToken} {
		c := keyshardv1connect.NewAdminServiceClient(http.DefaultClient, ts.url, connect.WithInterceptors(header("Authorization", auth)))
		_, err := c.ListKeyspaces(ctx, connect.NewRequest(&v1.ListKeyspacesRequest{}))
		wantCode(t, err, connect.CodeUnauthenticated, "bearer token")
	}
}

func header(key, value string) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set(key, value)
			return next(ctx, req)
		}
	}
}
