package keyshardtest

import (
	"fmt"
	"sync"
	"testing"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/client/clienttest"
)

// Fake is a fake keyshard serve (package clienttest's Server, whose
// methods it has) with a Client method: for testing a handler, a router
// or a producer against faults the real server cannot be made to show on
// cue (keep-alives that hang, a session that ends, releases held back, a
// control plane cut off), with no etcd, in a millisecond, on a fake
// clock. NewServer runs the real server instead.
type Fake struct {
	*clienttest.Server
	tb testing.TB // nil for StartFake

	mu      sync.Mutex
	clients []*client.Client
}

// The ways a Fake answers keep-alives (Fake.SetKeepAlives), re-exported
// from clienttest so that a test needs one import.
type KeepAliveFault = clienttest.KeepAliveFault

const (
	KeepAliveServe    = clienttest.KeepAliveServe
	KeepAliveFail     = clienttest.KeepAliveFail
	KeepAliveHang     = clienttest.KeepAliveHang
	KeepAliveNotFound = clienttest.KeepAliveNotFound
)

// FakeMember is a member as Fake.SetMap names it.
type FakeMember = clienttest.Member

// NewFake starts a fake keyshard serve for the test and returns it
// serving, with no keyspace, on a new fake clock. It and the clients from
// Client are closed when the test ends.
func NewFake(tb testing.TB) *Fake {
	tb.Helper()
	f := &Fake{Server: clienttest.NewServer(tb, clienttest.Options{}), tb: tb}
	tb.Cleanup(f.Close) // before the Server's own cleanup, registered first
	return f
}

// StartFake is NewFake for code that is not a test (an example, a
// demo): Close it when done.
func StartFake() *Fake {
	return &Fake{Server: clienttest.Start(clienttest.Options{})}
}

// Client dials the fake with opts, on the fake's clock (a client.Clock
// in opts replaces it), so that the workers, routers and producers made
// with it time out, back off and renew as the test advances the clock.
// Close, or the end of the test, closes it. A dial error fails the test
// (opts are refused); without a test, it panics.
func (f *Fake) Client(opts ...client.Option) *client.Client {
	if f.tb != nil {
		f.tb.Helper()
	}
	c, err := client.Dial(f.URL(), append([]client.Option{client.Clock(f.Clock())}, opts...)...)
	if err != nil {
		if f.tb == nil {
			panic(fmt.Sprintf("keyshardtest: dial the fake: %v", err))
		}
		f.tb.Fatalf("keyshardtest: dial the fake: %v", err)
	}
	f.mu.Lock()
	f.clients = append(f.clients, c)
	f.mu.Unlock()
	return c
}

// Close closes the clients from Client, then the fake (Server.Close).
// It is idempotent.
func (f *Fake) Close() {
	f.mu.Lock()
	clients := f.clients
	f.clients = nil
	f.mu.Unlock()
	for _, c := range clients {
		c.Close()
	}
	f.Server.Close()
}
