package store

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/keyshard/keyshard/internal/shard"
)

// TestReleaseRacesKeepEveryHeldPair: concurrent Release calls of one
// session, each from the same stale guess (as replicas whose views are
// behind pass them), racing a leader that hands released buckets over,
// never drop a (bucket, token) pair from the release record while the
// grants still hold the bucket at that token.
func TestReleaseRacesKeepEveryHeldPair(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 60*time.Second)
	const ks, buckets = "relrace", 24
	createKeyspace(t, s, ks)
	a := newSession(t, s, 10*time.Second)
	if _, _, err := s.Join(ctx, ks, member("w1"), a.LeaseID(), false); err != nil {
		t.Fatal(err)
	}
	_, fence := campaign(t, s, "leader-"+ks)
	g := shard.Grants{Session: a.LeaseID()}
	for b := range buckets {
		g.Buckets = append(g.Buckets, shard.BucketToken{Bucket: b, Token: 7})
	}
	grantsRev, err := s.Commit(ctx, fence, []Write{PutGrants(ks, "w1", g)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	guess := &ReleaseState{Grants: g, GrantsRev: grantsRev}

	var wg, releases sync.WaitGroup
	errs := make(chan error, buckets+1)
	for b := range buckets {
		releases.Go(func() {
			if _, err := s.Release(ctx, ks, "w1", a.LeaseID(), []shard.BucketToken{{Bucket: b, Token: 7}}, guess); err != nil {
				errs <- fmt.Errorf("release %d: %w", b, err)
			}
		})
	}
	done := make(chan struct{})
	go func() { releases.Wait(); close(done) }()
	// The leader: hand over whatever the record lists, expecting the
	// grants it read, until every bucket is gone, or nothing is left to
	// hand over once every Release has returned.
	wg.Go(func() {
		lastRel := int64(-1)
		for ctx.Err() == nil {
			snap, _, err := s.LoadKeyspace(ctx, ks)
			if err != nil {
				errs <- err
				return
			}
			st := snap.Keyspaces[ks]
			cur := st.Grants["w1"]
			if len(cur.Value.Buckets) == 0 {
				return
			}
			rel := map[shard.BucketToken]bool{}
			for _, bt := range st.Releases["w1"].Value.Buckets {
				rel[shard.BucketToken{Bucket: bt.Bucket, Token: bt.Token}] = true
			}
			next := shard.Grants{Session: a.LeaseID()}
			for _, bt := range cur.Value.Buckets {
				if !rel[bt] {
					next.Buckets = append(next.Buckets, bt)
				}
			}
			if len(next.Buckets) == len(cur.Value.Buckets) {
				select {
				case <-done:
					// Read once more after the last Release returned.
					if st.Releases["w1"].ModRevision == lastRel {
						return
					}
					lastRel = st.Releases["w1"].ModRevision
				default:
					time.Sleep(time.Millisecond)
				}
				continue
			}
			_, err = s.Commit(ctx, fence, []Write{PutGrants(ks, "w1", next)}, []Expect{ExpectEntry(GrantsKey(ks, "w1"), cur)})
			if err != nil && !errors.Is(err, ErrConflict) {
				errs <- err
				return
			}
		}
	})
	wg.Wait()
	releases.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	snap, _, err := s.LoadKeyspace(ctx, ks)
	if err != nil {
		t.Fatal(err)
	}
	if left := snap.Keyspaces[ks].Grants["w1"].Value.Buckets; len(left) != 0 {
		t.Fatalf("buckets %v still held: their releases were lost", left)
	}
}
