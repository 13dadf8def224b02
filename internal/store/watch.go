package store

import (
	"context"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keyshard/keyshard/internal/shard"
)

// Change is one key's change, decoded.
type Change struct {
	Kind Kind
	// Keyspace is the keyspace the key belongs to, or the pool for the
	// hot-key kinds (Kind.HotKey).
	Keyspace string
	ID       string // member id for per-member kinds, producer id for reports, "" otherwise
	Key      string // the etcd key
	// Value is the decoded value: a shard.Keyspace, Member, Drain, Map,
	// Grants, Releases or Quarantine, a uint64 (tokens), or a HotPool,
	// hotkey.Report or hotkey.OverflowSet. Nil when Deleted or Err != nil.
	Value       any
	Lease       shard.LeaseID // the lease the key is attached to (0 if none or deleted)
	ModRevision int64         // the revision of the change
	// Deleted is set when the key was deleted, by a delete or because its
	// lease expired or was revoked.
	Deleted bool
	// Err, if set, wraps ErrCorrupt: the key or value did not decode.
	// Snapshot.Apply records it in Snapshot.Corrupt.
	Err error
}

// Resync replaces everything a watcher knew: Snapshot is the whole state
// at Rev, and the watch continues from Rev+1.
type Resync struct {
	Snapshot *Snapshot
	Rev      int64
}

// Update is what Watch delivers: either a Resync or the Changes of one
// etcd watch response (all the changes of each revision, in order; a
// Commit's writes arrive together), or neither when only election keys
// changed. Rev is the revision the reader
// has seen everything up to once it has applied the update.
type Update struct {
	Resync  *Resync
	Changes []Change
	Rev     int64
	// Progress marks an update that only says the watch has delivered
	// everything up to Rev (etcd's progress notification, asked for with
	// RequestWatchProgress); it carries no changes.
	Progress bool
}

// Watch delivers every change under Prefix from revision fromRev on,
// except the election's keys. fromRev <= 0 starts with a Resync of the
// current state; the usual pattern is
//
//	snap, err := s.LoadAll(ctx)
//	updates := s.Watch(ctx, snap.Rev+1)
//
// When etcd can no longer deliver the history from where the watch stands
// (it was compacted: ErrCompacted), or the watch stream ends for any other
// reason (lost leader, endpoint failure), Watch re-reads the whole state at
// a revision and delivers it as a Resync before continuing after that
// revision: a reader that applies every Update in order always ends up
// with the stored state, although it may not see every intermediate value.
//
// Watch starts one goroutine, which owns the returned channel: it sends
// until ctx is done or the Store is closed, then closes the channel and
// exits. It decodes up to watchBuffer updates ahead of the reader; sends
// beyond that block until the reader receives or ctx is done, so the
// reader need not drain the channel after cancelling ctx. Read and resync
// failures are retried with backoff (and logged to Config.Logger).
func (s *Store) Watch(ctx context.Context, fromRev int64) <-chan Update {
	out := make(chan Update, watchBuffer)
	go s.watch(ctx, fromRev, out) // exits when ctx is done or the Store is closed
	return out
}

// watchBuffer is how many updates Watch decodes ahead of its reader. A
// reader that takes what is ready and acts on it as one batch (the
// leader's step) finds it decoded and waiting; through an unbuffered
// channel it found one or two updates at each step, the next still being
// decoded, and fell behind etcd by tens of seconds under a fleet's joins.
const watchBuffer = 256

func (s *Store) watch(ctx context.Context, next int64, out chan<- Update) {
	defer close(out)
	send := func(u Update) bool {
		select {
		case out <- u:
			return true
		case <-ctx.Done():
			return false
		}
	}
	resync := next <= 0
	failures := 0
	for {
		if ctx.Err() != nil || s.closed() {
			return
		}
		if failures > 0 && !sleepCtx(ctx, backoff(failures)) {
			return
		}
		if resync {
			snap, err := s.LoadAll(ctx)
			if err != nil {
				if ctx.Err() == nil && !s.closed() {
					s.log.Warn("store: watch: resync failed; retrying", "err", err)
				}
				failures++
				continue
			}
			if !send(Update{Resync: &Resync{Snapshot: snap, Rev: snap.Rev}, Rev: snap.Rev}) {
				return
			}
			next, resync = snap.Rev+1, false
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := s.client.Watch(wctx, Prefix, clientv3.WithPrefix(), clientv3.WithRev(next))
		delivered := false
		for resp := range wch {
			if err := resp.Err(); err != nil {
				if ctx.Err() == nil && !s.closed() {
					s.log.Info("store: watch: stream ended; resyncing", "from", next, "err", err)
				}
				break
			}
			if resp.IsProgressNotify() {
				if h := resp.Header.Revision; h >= next {
					next = h + 1
					if !send(Update{Rev: h, Progress: true}) {
						cancel()
						return
					}
				}
				continue
			}
			var changes []Change
			var last int64
			for _, ev := range resp.Events {
				c := watchChange(ev)
				last = ev.Kv.ModRevision
				if c.Kind == KindLeader {
					continue
				}
				changes = append(changes, c)
			}
			if last == 0 {
				continue
			}
			next = last + 1
			if len(changes) == 0 {
				// Only election keys changed; still report the revision.
				if !send(Update{Rev: last}) {
					cancel()
					return
				}
				continue
			}
			if !send(Update{Changes: changes, Rev: last}) {
				cancel()
				return
			}
			delivered = true
		}
		cancel()
		resync = true
		if delivered {
			failures = 0
		} else {
			failures++
		}
	}
}

// RequestWatchProgress asks etcd to tell every watch of this Store's
// client that is caught up how far it has delivered: each delivers an
// Update with Progress set and the store's current revision. A reader
// that must see a revision its watch has no event for (other
// applications' writes to the same etcd) asks for it this way.
func (s *Store) RequestWatchProgress(ctx context.Context) error {
	if s.closed() {
		return errClosed("request watch progress")
	}
	// The watches run under WithRequireLeader, and etcd's client groups
	// watches into streams by such metadata: the request must carry the
	// same to reach their stream.
	return s.err("request watch progress", s.client.RequestProgress(clientv3.WithRequireLeader(ctx)))
}

func watchChange(ev *clientv3.Event) Change {
	if ev.Type == mvccpb.DELETE {
		kind, ks, id, err := ParseKey(string(ev.Kv.Key))
		if err != nil {
			// A bad key went away: nothing to report but its removal.
			kind, ks, id = KindUnknown, "", ""
		}
		return Change{Kind: kind, Keyspace: ks, ID: id, Key: string(ev.Kv.Key), ModRevision: ev.Kv.ModRevision, Deleted: true}
	}
	return decodeKV(ev.Kv)
}

// backoff returns the wait before retry number failures (1, 2, ...):
// nothing for the first, then 50 ms doubling up to 2 s.
func backoff(failures int) time.Duration {
	if failures <= 1 {
		return 0
	}
	d := 50 * time.Millisecond << min(failures-2, 6)
	return min(d, 2*time.Second)
}

// sleepCtx waits d or until ctx is done; it reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
