package client

import (
	"testing"
	"time"

	"github.com/keyshard/keyshard/client/clienttest"
)

// fake is package clienttest's fake keyshard serve, with the SDK's dial.
type fake struct{ *clienttest.Server }

func newFake(t *testing.T) fake { return fake{clienttest.NewServer(t, clienttest.Options{})} }

// dial returns a Client of the fake on its clock; the test's cleanup
// closes it.
func (f fake) dial(t *testing.T, opts ...Option) *Client {
	t.Helper()
	c, err := Dial(f.URL(), append([]Option{Clock(f.Clock())}, opts...)...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// members names map members ids, at <id>.internal:9000.
func members(ids ...string) []clienttest.Member {
	out := make([]clienttest.Member, len(ids))
	for i, id := range ids {
		out[i] = clienttest.Member{ID: id, Address: id + ".internal:9000"}
	}
	return out
}

// recv returns the next value of ch, failing the test if none comes
// within a generous wall-clock guard (the guard never paces the test).
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}
