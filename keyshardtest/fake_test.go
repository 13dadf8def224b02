package keyshardtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/keyshardtest"
)

// TestFakeClient: Client dials the fake with the options given, and
// Close closes the clients it made, then the fake. (The examples show
// that the clients run on the fake's clock.)
func TestFakeClient(t *testing.T) {
	ctx := context.Background()
	f := keyshardtest.StartFake()
	f.AddKeyspace("rooms", 4, 0)
	c := f.Client(client.ReplicaTimeout(time.Second))
	got, err := c.Admin().GetKeyspace(ctx, "rooms")
	if err != nil || got.Buckets != 4 || got.LeaseTTL != 10*time.Second {
		t.Fatalf("GetKeyspace = %+v, %v; want 4 buckets and the default lease", got, err)
	}
	f.Close()
	f.Close()
	if _, err := c.Admin().Status(ctx); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Status after the fake's Close = %v, want ErrClosed: the client was closed", err)
	}
}
