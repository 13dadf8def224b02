package server_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
	"github.com/keyshard/keyshard/internal/server"
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

// postJSON posts body to procedure with the admin token and returns the
// status and the answer.
func postJSON(t *testing.T, c *http.Client, url, procedure string, body io.Reader, length int64) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+procedure, body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = length
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+adminToken)
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	msg, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(msg)
}

// TestRequestSizeLimits: a body over its method's limit is refused with
// RESOURCE_EXHAUSTED (HTTP 429) naming the flag and the config key,
// whether its Content-Length announces it or not; the methods that carry
// lists have the larger limit.
func TestRequestSizeLimits(t *testing.T) {
	ts := startServer(t, func(c *server.Config) {
		c.Limits.MaxRequestBytes = 1000
		c.Limits.MaxReportBytes = 3000
	})
	// 2000 bytes of valid JSON: spaces, then {}.
	body := func() string { return strings.Repeat(" ", 1998) + "{}" }
	for _, tc := range []struct {
		name      string
		client    *http.Client
		procedure string
		length    int64
		want      int
		msg       string
	}{
		{"announced", http.DefaultClient, keyshardv1connect.AdminServiceListKeyspacesProcedure, 2000, http.StatusTooManyRequests, "at most 1000 (--max-request-bytes, limits.max_request_bytes)"},
		{"chunked", http.DefaultClient, keyshardv1connect.AdminServiceListKeyspacesProcedure, -1, http.StatusTooManyRequests, "is over 1000 bytes, the most this replica takes (--max-request-bytes, limits.max_request_bytes)"},
		{"h2 unannounced", h2cClient(), keyshardv1connect.AdminServiceListKeyspacesProcedure, -1, http.StatusTooManyRequests, "is over 1000 bytes, the most this replica takes (--max-request-bytes, limits.max_request_bytes)"},
		{"list method", http.DefaultClient, keyshardv1connect.MapServiceLookupProcedure, 2000, http.StatusBadRequest, "keyspace name is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, msg := postJSON(t, tc.client, ts.url, tc.procedure, strings.NewReader(body()), tc.length)
			if status != tc.want || !strings.Contains(msg, tc.msg) {
				t.Fatalf("status %d %s, want %d mentioning %q", status, msg, tc.want, tc.msg)
			}
		})
	}
	status, msg := postJSON(t, http.DefaultClient, ts.url, keyshardv1connect.MapServiceLookupProcedure, strings.NewReader(strings.Repeat(" ", 4000)+"{}"), -1)
	if status != http.StatusTooManyRequests || !strings.Contains(msg, "over 3000 bytes, the most this replica takes (--max-report-bytes, limits.max_report_bytes)") {
		t.Fatalf("lookup of 4000 bytes: status %d %s", status, msg)
	}

	// Over gRPC (grpc-go's server, through grpcbridge) the same limits
	// answer, naming the flag.
	maps := keyshardv1connect.NewMapServiceClient(h2cClient(), ts.url, connect.WithGRPC(), connect.WithInterceptors(bearerToken(adminToken)))
	keys := make([]string, 40)
	for i := range keys {
		keys[i] = strings.Repeat("k", 99)
	}
	_, err := maps.Lookup(ctxT(t), connect.NewRequest(&v1.LookupRequest{Keyspace: "none", Keys: keys}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "3000 (--max-report-bytes, limits.max_report_bytes)") {
		t.Fatalf("gRPC lookup of 4,000 bytes: %v; want RESOURCE_EXHAUSTED naming the limit", err)
	}
	_, err = maps.GetMap(ctxT(t), connect.NewRequest(&v1.GetMapRequest{Keyspace: strings.Repeat("k", 2000)}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "(--max-request-bytes, limits.max_request_bytes)") {
		t.Fatalf("gRPC GetMap of 2,000 bytes: %v; want RESOURCE_EXHAUSTED naming the limit", err)
	}
}

// TestLookupLimits: too many keys is RESOURCE_EXHAUSTED naming the limit;
// a key too long is INVALID_ARGUMENT naming the key.
func TestLookupLimits(t *testing.T) {
	ts := startServer(t, func(c *server.Config) {
		c.Limits.MaxLookupKeys = 3
		c.Limits.MaxLookupKeyBytes = 8
		c.Keyspaces = []server.KeyspaceConfig{{Name: "rooms", Buckets: 16}}
	})
	ctx := ctxT(t)
	_, err := ts.maps.Lookup(ctx, connect.NewRequest(&v1.LookupRequest{Keyspace: "rooms", Keys: []string{"a", "b", "c", "d"}}))
	wantCode(t, err, connect.CodeResourceExhausted, "4 keys in one Lookup; this replica takes at most 3 (--max-lookup-keys, limits.max_lookup_keys)")
	_, err = ts.maps.Lookup(ctx, connect.NewRequest(&v1.LookupRequest{Keyspace: "rooms", Keys: []string{"a", "123456789"}}))
	wantCode(t, err, connect.CodeInvalidArgument, "keys[1]: \"123456789\"... is 9 bytes; this replica takes keys of at most 8 (--max-lookup-key-bytes, limits.max_lookup_key_bytes)")
	_, err = ts.maps.Lookup(ctx, connect.NewRequest(&v1.LookupRequest{Keyspace: "rooms", Keys: []string{"a", "12345678", "c"}}))
	if connect.CodeOf(err) != connect.CodeUnavailable { // no member yet: no map
		t.Fatalf("lookup within the limits: %v", err)
	}
}

// TestLongPollLimit: beyond limits.max_long_polls, long polls and watches
// are refused with RESOURCE_EXHAUSTED, and counted; a poll without a wait
// takes no place.
func TestLongPollLimit(t *testing.T) {
	ts := startServer(t, func(c *server.Config) {
		c.Limits.MaxLongPolls = 2
		c.Keyspaces = []server.KeyspaceConfig{{Name: "rooms", Buckets: 16}}
		c.HotKeyPools = []server.HotKeyPoolConfig{{Name: "ingest", Threshold: 100}}
	})
	ctx := ctxT(t)
	for range 2 {
		watch, err := ts.hot.WatchOverflowSet(ctx, connect.NewRequest(&v1.WatchOverflowSetRequest{Pool: "ingest"}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { watch.Close() })
		watch.ResponseHeader() // the server sends headers first; no set yet
		if err := watch.Err(); err != nil {
			t.Fatal(err)
		}
	}
	const msg = "holds 2 long polls and watches, its limit (--max-long-polls, limits.max_long_polls)"
	maps := keyshardv1connect.NewMapServiceClient(http.DefaultClient, ts.url, connect.WithInterceptors(bearerToken(memberToken)))
	watch, err := maps.WatchMap(ctx, connect.NewRequest(&v1.WatchMapRequest{Keyspace: "rooms"}))
	if err == nil {
		watch.Receive()
		err = watch.Err()
		watch.Close()
	}
	wantCode(t, err, connect.CodeResourceExhausted, msg)
	_, err = ts.maps.GetMap(ctx, connect.NewRequest(&v1.GetMapRequest{Keyspace: "rooms", Wait: durationpb.New(time.Second)}))
	wantCode(t, err, connect.CodeResourceExhausted, msg)
	if _, err := ts.hot.GetOverflowSet(ctx, connect.NewRequest(&v1.GetOverflowSetRequest{Pool: "ingest"})); err != nil {
		t.Fatalf("a poll without a wait: %v", err)
	}
	res, err := http.Get(ts.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	metrics, _ := io.ReadAll(res.Body)
	for _, want := range []string{"keyshard_api_long_polls 2\n", "keyshard_api_long_polls_refused_total 2\n"} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}
