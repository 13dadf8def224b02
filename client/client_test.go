package client

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/keyshard/keyshard/client/clienttest"
)

func TestDialBadInput(t *testing.T) {
	tests := []struct {
		name string
		url  string
		opts []Option
		arg  string // the *ArgError's Arg
		text string // in its Reason
	}{
		{"empty", "", nil, "server URL", "is empty"},
		{"no scheme", "127.0.0.1:7400", nil, "server URL", "must start with http:// or https://"},
		{"host only", "localhost", nil, "server URL", "must start with http:// or https://"},
		{"other scheme", "grpc://127.0.0.1:7400", nil, "server URL", "must start with http:// or https://"},
		{"no host", "http://", nil, "server URL", "has no host"},
		{"no hostname", "http://:7400", nil, "server URL", "has no host"},
		{"user info", "http://admin:secret@127.0.0.1:7400", nil, "server URL", "pass credentials with Token"},
		{"query", "http://127.0.0.1:7400/?x=1", nil, "server URL", "must not have a query"},
		{"bad escape", "http://127.0.0.1:7400/%zz", nil, "server URL", "invalid URL escape"},
		{"tls over http", "http://127.0.0.1:7400", []Option{TLSConfig(&tls.Config{})}, "TLSConfig", "use an https:// URL"},
		{"tls and client", "https://h", []Option{TLSConfig(&tls.Config{}), HTTPClient(http.DefaultClient)}, "TLSConfig", "and HTTPClient are both given"},
		{"token newline", "http://h", []Option{Token("a\nb")}, "Token", "line break"},
		{"negative replica timeout", "http://h", []Option{ReplicaTimeout(-time.Second)}, "ReplicaTimeout", "-1s is negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Dial(tc.url, tc.opts...)
			if err == nil {
				c.Close()
				t.Fatalf("Dial(%q) succeeded; want an error", tc.url)
			}
			checkArgError(t, "Dial("+tc.url+")", err, "Dial", tc.arg, tc.text)
		})
	}
}

func TestDialOptionsLastWins(t *testing.T) {
	c, err := Dial("https://keyshard.internal:7400/base/", Token("a"), Token("b"), TLSConfig(&tls.Config{ServerName: "x"}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.URL() != "https://keyshard.internal:7400/base" {
		t.Errorf("URL() = %q", c.URL())
	}
	if c.authz != "Bearer b" {
		t.Errorf("authorization = %q, want the last token", c.authz)
	}
}

func TestToken(t *testing.T) {
	f := fake{clienttest.NewServer(t, clienttest.Options{Token: "s3cret"})}
	f.AddKeyspace("rooms", 16, 10*time.Second)
	ctx := context.Background()

	_, err := f.dial(t).Admin().Status(ctx)
	if !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("without a token: err = %v, want ErrUnauthenticated", err)
	}
	c := f.dial(t, Token("s3cret"))
	if _, err := c.Admin().Status(ctx); err != nil {
		t.Errorf("with the token: %v", err)
	}
	// Streams carry the token too.
	r := newRouter(t, c)
	f.MapWatches().Next(t)
	f.SetMap("rooms", members("a"), func(int) string { return "a" })
	if err := r.WaitEpoch(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if n := f.CallCount("/keyshard.v1.MapService/WatchMap"); n != 1 {
		t.Errorf("WatchMap calls = %d, want 1 (the stream was accepted)", n)
	}
}

func TestGRPC(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, 10*time.Second)
	ctx := context.Background()
	c := f.dial(t, GRPC())
	st, err := c.Admin().Status(ctx)
	if err != nil {
		t.Fatalf("Status over gRPC: %v", err)
	}
	if st.Leader != "clienttest" {
		t.Errorf("Leader = %q", st.Leader)
	}
	if _, err := c.Admin().GetKeyspace(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetKeyspace(nope) over gRPC: %v, want ErrNotFound", err)
	}
	r := newRouter(t, c)
	f.MapWatches().Next(t)
	f.SetMap("rooms", members("a"), func(int) string { return "a" })
	if err := r.WaitEpoch(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if m, ok := r.OwnerString("k"); !ok || m != "a" {
		t.Errorf("Owner = %q, %v", m, ok)
	}
}

func TestClientClose(t *testing.T) {
	f := newFake(t)
	f.AddKeyspace("rooms", 16, 10*time.Second)
	ctx := context.Background()
	c := f.dial(t)
	r := newRouter(t, c)
	f.MapWatches().Next(t)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c.Close() // idempotent
	// The Router's goroutine exits with the Client.
	if err := r.WaitEpoch(ctx, 1); !errors.Is(err, ErrClosed) {
		t.Errorf("WaitEpoch after Client.Close = %v, want ErrClosed", err)
	}
	r.Close()
	if _, err := c.Admin().Status(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Status after Close = %v, want ErrClosed", err)
	}
	r2, err := NewRouter(c, "rooms")
	if err != nil {
		t.Fatalf("NewRouter after Close = %v; it does no IO", err)
	}
	if err := r2.Start(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Router.Start after Close = %v, want ErrClosed", err)
	}
}
