package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keyshard/keyshard/hotkey"
	"github.com/keyshard/keyshard/internal/shard"
)

// Write is one put or delete in a leader Commit. Build it with PutMap,
// PutGrants, PutTokens, PutQuarantine, PutOverflow or Delete; a Write that
// failed to encode carries the error to Commit.
type Write struct {
	key   string
	val   []byte
	lease shard.LeaseID
	del   bool
	err   error
	// end: a delete of the range [key, end). history: a map history
	// write (PutHistory).
	end     string
	history bool
}

// Key returns the key written.
func (w Write) Key() string { return w.key }

// Size is the bytes of w's key and value, which count against etcd's
// request size limit.
func (w Write) Size() int { return len(w.key) + len(w.end) + len(w.val) }

// Change returns the change w makes once a Commit applies it at revision
// rev, decoded as Watch delivers it, or the error wrapping ErrInvalid that
// Commit refuses w with. A store that stands in for this one (in the
// leader's tests, say) applies writes through it.
func (w Write) Change(rev int64) (Change, error) {
	if w.err != nil {
		return Change{}, fmt.Errorf("store: commit: %w", w.err)
	}
	if w.key == "" {
		return Change{}, invalidf("commit: zero Write")
	}
	ev := &clientv3.Event{Kv: &mvccpb.KeyValue{Key: []byte(w.key), Value: w.val, ModRevision: rev, Lease: int64(w.lease)}}
	if w.del {
		ev.Type = mvccpb.DELETE
	}
	return watchChange(ev), nil
}

// PutMap writes keyspace ks's map.
func PutMap(ks string, m shard.Map) Write {
	b, err := EncodeMap(m)
	return Write{key: MapKey(ks), val: b, err: nameErr(err, ks, "")}
}

// PutGrants writes member id's grants, attached to the member's lease
// g.Session: if that lease is gone, the whole Commit fails with
// ErrLeaseNotFound and writes nothing.
func PutGrants(ks, id string, g shard.Grants) Write {
	b, err := EncodeGrants(g)
	return Write{key: GrantsKey(ks, id), val: b, lease: g.Session, err: nameErr(err, ks, id)}
}

// PutQuarantine writes the quarantine of member id's revoked session,
// attached to lease: a lease of its own, granted (Store.Grant) for one
// member lease TTL and never renewed, so that etcd deletes the key when the
// quarantine is over. Write it before revoking the session.
func PutQuarantine(ks, id string, q shard.Quarantine, lease shard.LeaseID) Write {
	b, err := EncodeQuarantine(q)
	if err == nil && lease <= 0 {
		err = invalidf("quarantine of %s/%s: no lease; grant one of the member lease TTL", ks, id)
	}
	return Write{key: QuarantineKey(ks, id), val: b, lease: lease, err: nameErr(err, ks, id)}
}

// PutTokens writes the last fencing token issued in ks.
func PutTokens(ks string, last uint64) Write {
	return Write{key: TokensKey(ks), val: EncodeTokens(last), err: nameErr(nil, ks, "")}
}

// PutOverflow writes hot-key pool's overflow set. Only the leader writes
// it, with an expectation on the set it read (ExpectEntry(OverflowKey(pool),
// ...)), so that a deposed leader, or one whose view is behind, cannot
// overwrite a newer set.
func PutOverflow(pool string, set hotkey.OverflowSet) Write {
	b, err := EncodeOverflow(set)
	if err == nil {
		err = ValidateName(KindHotPool, pool)
	}
	return Write{key: OverflowKey(pool), val: b, err: err}
}

// Delete deletes key, which must be a key of the layout other than an
// election key (for example GrantsKey(ks, id) after a member left,
// DrainKey, or HotReportKey(pool, producer) for a report that aged out).
// Deleting a key that does not exist is not an error.
func Delete(key string) Write {
	kind, _, _, err := ParseKey(key)
	if err == nil && kind == KindLeader {
		err = invalidf("delete %q: election keys are not written through Commit", key)
	} else if err != nil {
		err = fmt.Errorf("%w: delete %q: %w", ErrInvalid, key, err)
	}
	return Write{key: key, del: true, err: err}
}

func nameErr(err error, ks, id string) error {
	if err != nil {
		return err
	}
	if err := ValidateName(KindKeyspace, ks); err != nil {
		return err
	}
	if id != "" {
		return ValidateName(KindMember, id)
	}
	return nil
}

// Expect is a key the leader read, with the ModRevision it read it at;
// 0 means it read the key as absent. Commit fails with ErrConflict if any
// expectation no longer holds.
type Expect struct {
	Key         string
	ModRevision int64
}

// ExpectEntry returns the expectation that the key of e is unchanged.
func ExpectEntry[T any](key string, e Entry[T]) Expect {
	return Expect{Key: key, ModRevision: e.ModRevision}
}

// Commit applies writes in one etcd transaction, only if f's leader key
// still exists with the same CreateRevision and every expectation holds.
// It returns the revision of the commit, or:
//
//   - ErrFenced if the leader key changed or is gone (nothing was written);
//   - ErrConflict if an expectation failed (nothing was written), naming
//     the first key that moved;
//   - ErrLeaseNotFound if a put is attached to a lease that no longer
//     exists, e.g. grants for a member whose session expired (nothing was
//     written; etcd does not say which lease);
//   - ErrTooLarge if there are more writes or expectations than the
//     server's --max-txn-ops allows (Config.MaxTxnOps - 1), or the request
//     is larger than its --max-request-bytes;
//   - ErrInvalid for a Write that failed to encode, a key written twice or
//     a malformed fence;
//   - ErrUnavailable if etcd did not answer. The commit may or may not
//     have been applied; re-read before retrying.
func (s *Store) Commit(ctx context.Context, f Fence, writes []Write, expects []Expect) (int64, error) {
	if s.closed() {
		return 0, errClosed("commit")
	}
	if !strings.HasPrefix(f.LeaderKey, ElectionPrefix+"/") || f.LeaderRev <= 0 {
		return 0, invalidf("commit: fence %+v is not an election key and revision", f)
	}
	// The transaction nests one level (fence outside, expectations
	// inside); etcd's --max-txn-ops limits each level, minus one for the
	// outer operation.
	if n := max(len(writes), len(expects)); n > s.maxOps-1 {
		return 0, fmt.Errorf("store: commit: %w: %d writes and %d expectations; this store sends at most %d per transaction (Config.MaxTxnOps - 1): raise etcd's --max-txn-ops and Config.MaxTxnOps, or split the round", ErrTooLarge, len(writes), len(expects), s.maxOps-1)
	}
	ops := make([]clientv3.Op, 0, len(writes))
	keys := make(map[string]bool, len(writes))
	var leases []shard.LeaseID
	for _, w := range writes {
		if w.err != nil {
			return 0, fmt.Errorf("store: commit: %w", w.err)
		}
		if w.key == "" {
			return 0, invalidf("commit: zero Write; build writes with PutMap, PutGrants, PutTokens, PutQuarantine, PutOverflow or Delete")
		}
		if keys[w.key] {
			return 0, invalidf("commit: key %q is written twice", w.key)
		}
		keys[w.key] = true
		switch {
		case w.del && w.end != "":
			ops = append(ops, clientv3.OpDelete(w.key, clientv3.WithRange(w.end)))
		case w.del:
			ops = append(ops, clientv3.OpDelete(w.key))
		case w.lease != 0:
			ops = append(ops, clientv3.OpPut(w.key, string(w.val), clientv3.WithLease(clientv3.LeaseID(w.lease))))
			leases = append(leases, w.lease)
		default:
			ops = append(ops, clientv3.OpPut(w.key, string(w.val)))
		}
	}
	cmps := make([]clientv3.Cmp, len(expects))
	gets := make([]clientv3.Op, len(expects))
	for i, e := range expects {
		if !strings.HasPrefix(e.Key, Prefix) || e.ModRevision < 0 {
			return 0, invalidf("commit: expectation %+v is not a key of the layout and a revision", e)
		}
		cmps[i] = clientv3.Compare(clientv3.ModRevision(e.Key), "=", e.ModRevision)
		gets[i] = clientv3.OpGet(e.Key, clientv3.WithKeysOnly())
	}
	inner := clientv3.OpTxn(cmps, ops, gets)
	resp, err := s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(f.LeaderKey), "=", f.LeaderRev)).
		Then(inner).
		Else(clientv3.OpGet(f.LeaderKey, clientv3.WithKeysOnly())).
		Commit()
	if err != nil {
		err = s.err("commit", err)
		if errors.Is(err, ErrLeaseNotFound) {
			slices.Sort(leases)
			return 0, fmt.Errorf("%w: a put is attached to a lease that has expired or was revoked (one of %v)", err, slices.Compact(leases))
		}
		return 0, err
	}
	if !resp.Succeeded {
		now := "is gone"
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			now = fmt.Sprintf("was created again at revision %d", kvs[0].CreateRevision)
		}
		return 0, fmt.Errorf("store: commit: %w: leader key %q created at revision %d %s", ErrFenced, f.LeaderKey, f.LeaderRev, now)
	}
	in := resp.Responses[0].GetResponseTxn()
	if !in.Succeeded {
		for i, r := range in.Responses {
			var now int64
			if kvs := r.GetResponseRange().Kvs; len(kvs) > 0 {
				now = kvs[0].ModRevision
			}
			if now != expects[i].ModRevision {
				return 0, fmt.Errorf("store: commit: %w: %q was read at revision %d and is now at %d", ErrConflict, expects[i].Key, expects[i].ModRevision, now)
			}
		}
		return 0, fmt.Errorf("store: commit: %w", ErrConflict)
	}
	return resp.Header.Revision, nil
}
