package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
)

// resetBeforeGrants is the leader's store, which runs reset once, just
// before the first grant round that writes grants of member id: as if an
// admin's ResetPositions landed between the leader's read and its write.
type resetBeforeGrants struct {
	*store.Store
	ks, id string
	reset  func() error

	mu        sync.Mutex
	done      bool
	resetErr  error
	commitErr error
}

func (r *resetBeforeGrants) Commit(ctx context.Context, f store.Fence, writes []store.Write, expects []store.Expect) (int64, error) {
	r.mu.Lock()
	first := false
	if !r.done {
		for _, w := range writes {
			if w.Key() == store.GrantsKey(r.ks, r.id) {
				first, r.done = true, true
			}
		}
	}
	if first {
		r.resetErr = r.reset()
	}
	r.mu.Unlock()
	rev, err := r.Store.Commit(ctx, f, writes, expects)
	if first {
		r.mu.Lock()
		r.commitErr = err
		r.mu.Unlock()
	}
	return rev, err
}

// TestResetBetweenLeaderReadAndGrant: a reset that lands after the leader
// planned a grant round from the bucket positions, before its write, makes
// that write conflict; the round planned again grants from the reset
// position.
func TestResetBetweenLeaderReadAndGrant(t *testing.T) {
	s, st, ctx := streamOnEtcd(t)
	hook := &resetBeforeGrants{Store: st, ks: "ev", id: "a", reset: func() error {
		_, err := st.ResetPositions(ctx, "ev", []int{0, 1, 2, 3}, 500)
		return err
	}}
	defer leadOnEtcd(ctx, t, s, st, hook, "leader")()

	streamJoin(ctx, t, st, "a", 10*time.Second)
	k := waitKeyspace(ctx, t, st, "ev", "a's grants", func(k *store.KeyspaceState) bool { return len(k.Grants["a"].Value.Buckets) == 4 })
	hook.mu.Lock()
	defer hook.mu.Unlock()
	if hook.resetErr != nil {
		t.Fatalf("reset: %v", hook.resetErr)
	}
	if !errors.Is(hook.commitErr, store.ErrConflict) {
		t.Errorf("the grant round planned before the reset: %v, want ErrConflict", hook.commitErr)
	}
	for _, bt := range k.Grants["a"].Value.Buckets {
		if bt.Position != 500 {
			t.Errorf("bucket %d granted from %d; want the reset position 500", bt.Bucket, bt.Position)
		}
	}
}

func TestPositionsSummary(t *testing.T) {
	pos := []uint64{5, 5, 0, 0, 9, 5, 2}
	holders := make([]shard.Holder, len(pos))
	holders[3] = shard.Holder{Member: "a", Token: 4}
	r := positionsSummary(pos, holders, 3)
	if r.Min != 0 || r.Max != 9 || r.Spread != 9 {
		t.Errorf("min %d max %d spread %d", r.Min, r.Max, r.Spread)
	}
	var runs [][3]uint64
	for _, x := range r.Runs {
		runs = append(runs, [3]uint64{uint64(x.First), uint64(x.Count), x.Position})
	}
	if want := [][3]uint64{{0, 2, 5}, {2, 2, 0}, {4, 1, 9}, {5, 1, 5}, {6, 1, 2}}; !slices.Equal(runs, want) {
		t.Errorf("runs %v, want %v", runs, want)
	}
	var behind []string
	for _, b := range r.Behind {
		behind = append(behind, fmt.Sprintf("%d@%d:%s/%d", b.Bucket, b.Position, b.Member, b.Token))
	}
	if want := []string{"2@0:/0", "3@0:a/4", "6@2:/0"}; !slices.Equal(behind, want) {
		t.Errorf("behind %v, want %v", behind, want)
	}
	if r := positionsSummary(pos, holders, 100); len(r.Behind) != len(pos) {
		t.Errorf("behind 100 of %d buckets: %d listed", len(pos), len(r.Behind))
	}
}
