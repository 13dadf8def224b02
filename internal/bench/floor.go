package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/placement"
)

// FloorStages splits the floor's pairs at their two writes: Release from
// the release record's write starting (store.Release, the transaction
// the server's Release makes) to an etcd watch delivering it, Grant from
// there to the watch delivering the fenced grant write (store.Commit, as
// the leader's grant round makes it).
type FloorStages struct {
	Release StageMs `json:"release_record"`
	Grant   StageMs `json:"grant"`
}

// The floor runs the store's own code on the same etcd as the server, but
// under a namespace of its own, which the server never reads or watches.
const (
	floorNamespace = "/keyshard-bench-floor"
	floorKeyspace  = "floor"
	floorLeaseTTL  = 10 * time.Second
	// floorWait bounds one write's wait for its watch delivery.
	floorWait = 10 * time.Second
	// floorWarmup pairs run before any is measured.
	floorWarmup = 5
)

// floorRig measures etcd's floor for a handoff: one bucket moves back and
// forth between two members, each move a release record written with
// store.Release and seen on a watch, then the grant written with
// store.Commit, fenced by an election key, and seen on the watch. It
// keeps what it wrote, as the server's view would, so that each Release
// starts from a current guess (one round trip) and each Commit expects
// the revisions it read.
type floorRig struct {
	st        *store.Store
	elSess    *store.Session
	members   [2]*store.Session
	ids       [2]string
	fence     store.Fence
	updates   <-chan store.Update
	stopWatch context.CancelFunc

	holder                 int // index of the member holding the bucket
	token                  uint64
	grants                 [2]shard.Grants
	grantsRev              [2]int64
	releases               [2]shard.Releases
	releasesRev            [2]int64
	tokensRev              int64
	releaseTook, grantTook []time.Duration
}

// startFloor opens a namespaced store on endpoints, joins two members,
// wins an election there and grants the bucket to the first member.
func startFloor(ctx context.Context, endpoints []string, log *slog.Logger) (_ *floorRig, err error) {
	f := &floorRig{ids: [2]string{"floor-a", "floor-b"}}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	if f.st, err = store.Open(ctx, store.Config{Endpoints: endpoints, Logger: log, Namespace: floorNamespace}); err != nil {
		return nil, fmt.Errorf("floor: open a store under %q: %w", floorNamespace, err)
	}
	k := shard.Keyspace{Name: floorKeyspace, Buckets: 1, Hash: placement.HashXXH64, Mode: shard.ModeExclusive, LeaseTTL: floorLeaseTTL}
	if _, err := f.st.CreateKeyspace(ctx, k); err != nil && !errors.Is(err, store.ErrExists) {
		return nil, fmt.Errorf("floor: create keyspace %q: %w", floorKeyspace, err)
	}
	if f.elSess, err = f.st.NewSession(ctx, floorLeaseTTL); err != nil {
		return nil, fmt.Errorf("floor: election session: %w", err)
	}
	if f.fence, err = f.st.NewElection(f.elSess).Campaign(ctx, "floor"); err != nil {
		return nil, fmt.Errorf("floor: campaign: %w", err)
	}
	for i, id := range f.ids {
		if f.members[i], err = f.st.NewSession(ctx, floorLeaseTTL); err != nil {
			return nil, fmt.Errorf("floor: session of %s: %w", id, err)
		}
		m := shard.Member{ID: id, Address: "bench/" + id, Weight: 1, JoinedAt: time.Now()}
		if _, _, err := f.st.Join(ctx, floorKeyspace, m, f.members[i].LeaseID(), false); err != nil {
			return nil, fmt.Errorf("floor: join %s: %w", id, err)
		}
	}
	f.token = 1
	f.grants[0] = shard.Grants{Session: f.members[0].LeaseID(), Buckets: []shard.BucketToken{{Bucket: 0, Token: 1}}}
	f.grants[1] = shard.Grants{Session: f.members[1].LeaseID()}
	rev, err := f.st.Commit(ctx, f.fence,
		[]store.Write{store.PutGrants(floorKeyspace, f.ids[0], f.grants[0]), store.PutGrants(floorKeyspace, f.ids[1], f.grants[1]), store.PutTokens(floorKeyspace, 1)},
		[]store.Expect{{Key: store.GrantsKey(floorKeyspace, f.ids[0])}, {Key: store.GrantsKey(floorKeyspace, f.ids[1])}, {Key: store.TokensKey(floorKeyspace)}})
	if err != nil {
		return nil, fmt.Errorf("floor: first grant: %w", err)
	}
	f.grantsRev, f.tokensRev = [2]int64{rev, rev}, rev
	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	f.stopWatch = stop
	// Watch's goroutine owns the channel and exits when stopWatch is
	// called; its sends give up then, so nothing needs draining.
	f.updates = f.st.Watch(wctx, rev+1)
	for range floorWarmup {
		if err := f.pair(ctx, false); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// run measures n pairs.
func (f *floorRig) run(ctx context.Context, n int) error {
	for range n {
		if err := f.pair(ctx, true); err != nil {
			return err
		}
	}
	return nil
}

// pair moves the bucket to the other member: the holder's release record,
// seen on the watch, then the leader's grant, seen on the watch.
func (f *floorRig) pair(ctx context.Context, measure bool) error {
	h, o := f.holder, 1-f.holder
	t0 := time.Now()
	rel := []shard.BucketToken{{Bucket: 0, Token: f.token}}
	guess := &store.ReleaseState{Grants: f.grants[h], GrantsRev: f.grantsRev[h], Releases: f.releases[h], ReleasesRev: f.releasesRev[h]}
	rev1, err := f.st.Release(ctx, floorKeyspace, f.ids[h], f.members[h].LeaseID(), rel, guess)
	if err != nil {
		return fmt.Errorf("floor: release of bucket 0 at token %d by %s: %w", f.token, f.ids[h], err)
	}
	if err := f.seen(ctx, store.ReleasesKey(floorKeyspace, f.ids[h]), rev1); err != nil {
		return err
	}
	t1 := time.Now()
	f.releases[h], f.releasesRev[h] = shard.Releases{Buckets: rel}, rev1

	next := f.token + 1
	gh := shard.Grants{Session: f.members[h].LeaseID()}
	gOther := shard.Grants{Session: f.members[o].LeaseID(), Buckets: []shard.BucketToken{{Bucket: 0, Token: next}}}
	rev2, err := f.st.Commit(ctx, f.fence,
		[]store.Write{store.PutGrants(floorKeyspace, f.ids[h], gh), store.PutGrants(floorKeyspace, f.ids[o], gOther), store.PutTokens(floorKeyspace, next)},
		[]store.Expect{
			{Key: store.GrantsKey(floorKeyspace, f.ids[h]), ModRevision: f.grantsRev[h]},
			{Key: store.GrantsKey(floorKeyspace, f.ids[o]), ModRevision: f.grantsRev[o]},
			{Key: store.TokensKey(floorKeyspace), ModRevision: f.tokensRev},
		})
	if err != nil {
		return fmt.Errorf("floor: grant of bucket 0 at token %d to %s: %w", next, f.ids[o], err)
	}
	if err := f.seen(ctx, store.GrantsKey(floorKeyspace, f.ids[o]), rev2); err != nil {
		return err
	}
	t2 := time.Now()
	f.grants[h], f.grants[o] = gh, gOther
	f.grantsRev, f.tokensRev = [2]int64{rev2, rev2}, rev2
	f.token, f.holder = next, o
	if measure {
		f.releaseTook = append(f.releaseTook, t1.Sub(t0))
		f.grantTook = append(f.grantTook, t2.Sub(t1))
	}
	return nil
}

// seen waits until the watch delivers key at revision rev or later.
func (f *floorRig) seen(ctx context.Context, key string, rev int64) error {
	timer := time.NewTimer(floorWait)
	defer timer.Stop()
	for {
		select {
		case u, ok := <-f.updates:
			if !ok {
				return fmt.Errorf("floor: the watch ended before it delivered %s at revision %d", key, rev)
			}
			if u.Resync != nil && u.Resync.Rev >= rev {
				return nil
			}
			for _, c := range u.Changes {
				if c.Key == key && c.ModRevision >= rev {
					return nil
				}
			}
		case <-timer.C:
			return fmt.Errorf("floor: the watch did not deliver %s at revision %d within %v", key, rev, floorWait)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// pairs returns the measured pairs: the whole pair, and each write.
func (f *floorRig) pairs() (total, release, grant []time.Duration) {
	for i := range f.releaseTook {
		total = append(total, f.releaseTook[i]+f.grantTook[i])
	}
	return total, f.releaseTook, f.grantTook
}

// close ends the watch, the sessions (their keys go with their leases)
// and the store. It is safe on a partly started rig.
func (f *floorRig) close() {
	if f.stopWatch != nil {
		f.stopWatch()
	}
	for _, s := range append([]*store.Session{f.elSess}, f.members[:]...) {
		if s != nil {
			s.Close()
		}
	}
	if f.st != nil {
		f.st.Close()
	}
}
