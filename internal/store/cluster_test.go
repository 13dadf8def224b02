package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// retry calls op until it succeeds, fails with something other than
// ErrUnavailable, or ctx ends: what a caller does while etcd elects a new
// leader.
func retry(ctx context.Context, op func() error) error {
	for {
		err := op()
		if err == nil || !errors.Is(err, ErrUnavailable) || ctx.Err() != nil {
			return err
		}
	}
}

func TestClusterSurvivesMemberStop(t *testing.T) {
	ctx := ctxFor(t, 45*time.Second)
	c, err := StartEmbeddedCluster(ctx, t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	s := openStore(t, c.Endpoints())
	createKeyspace(t, s, "cluster")
	snap, err := s.LoadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	updates := s.Watch(ctx, snap.Rev+1)

	// Stop the member that leads the etcd cluster: the hardest case.
	stopped := -1
	for i := range c.Len() {
		if c.Member(i).IsLeader() {
			stopped = i
		}
	}
	if stopped < 0 {
		t.Fatal("no etcd leader among the members")
	}
	c.Stop(stopped)
	c.Stop(stopped) // idempotent

	se, err := s.NewSession(ctx, 10*time.Second)
	for err != nil && errors.Is(err, ErrUnavailable) && ctx.Err() == nil {
		se, err = s.NewSession(ctx, 10*time.Second)
	}
	if err != nil {
		t.Fatalf("session with one member down: %v", err)
	}
	defer se.Close()
	for i := range 5 {
		id := fmt.Sprintf("w%d", i)
		if err := retry(ctx, func() error {
			_, _, err := s.Join(ctx, "cluster", member(id), se.LeaseID(), false)
			return err
		}); err != nil {
			t.Fatalf("join %s with one member down: %v", id, err)
		}
	}
	waitFor(t, ctx, updates, &snap, "5 members through the watch", func(s *Snapshot) bool {
		return len(s.Keyspaces["cluster"].Members) == 5
	})

	// The stopped member catches up after a restart and serves reads alone.
	if err := c.Restart(ctx, stopped); err != nil {
		t.Fatal(err)
	}
	only := openStore(t, c.Member(stopped).Endpoints())
	var got *Snapshot
	if err := retry(ctx, func() error {
		var err error
		got, _, err = only.LoadKeyspace(ctx, "cluster")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if n := len(got.Keyspaces["cluster"].Members); n != 5 {
		t.Fatalf("restarted member sees %d members, want 5", n)
	}
}
