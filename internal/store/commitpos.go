package store

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keyshard/keyshard/internal/shard"
)

// checkCommit decides whether next, a commit of session lease, may replace
// prev (the member's current commit record; zero if none) given the
// member's grants g, the keyspace's bucket count and the last fencing token
// issued in it. It refuses, naming the field:
//
//   - a commit that does not validate, names another session, lists a
//     bucket outside the keyspace, or has a max_token above the last token
//     issued (it would cover buckets not yet granted): ErrInvalid;
//   - an exception for a bucket the session does not hold at that token:
//     *NotHeldError;
//   - a default or max_token lower than prev's for the same session, or any
//     held bucket's effective position (shard.Positions) moving backwards:
//     *BackwardsError.
//
// Effective positions are compared without the keyspace's bucket
// positions: a held bucket's grant starts at or above them, so a commit
// that moves no bucket back from its grant and its previous commit moves
// none back from them either.
func checkCommit(next shard.Commit, lease shard.LeaseID, g shard.Grants, prev shard.Commit, buckets int, last uint64) error {
	if e := validateCommit(next); e != nil {
		return e.invalid("commit")
	}
	if next.Session != lease {
		return ferr("session", "%v is not the committing session %v", next.Session, lease).invalid("commit")
	}
	if n := len(next.Exceptions); n > 0 && next.Exceptions[n-1].Bucket >= buckets {
		return ferr("exceptions", "bucket %d is outside the keyspace's %d buckets", next.Exceptions[n-1].Bucket, buckets).invalid("commit")
	}
	if next.MaxToken > last {
		return ferr("max_token", "%d is above the last token issued, %d", next.MaxToken, last).invalid("commit")
	}
	if g.Session != lease {
		g = shard.Grants{Session: lease} // the session holds nothing
	}
	held := make(map[int]uint64, len(g.Buckets))
	for _, bt := range g.Buckets {
		held[bt.Bucket] = bt.Token
	}
	for _, e := range next.Exceptions {
		if have := held[e.Bucket]; have != e.Token {
			return fmt.Errorf("commit: field \"exceptions\": %w", &NotHeldError{Bucket: e.Bucket, Token: e.Token, Held: have})
		}
	}
	if prev.Session == lease {
		if next.Default < prev.Default {
			return &BackwardsError{Field: "default", Bucket: -1, Committed: prev.Default, Given: next.Default}
		}
		if next.MaxToken < prev.MaxToken {
			return &BackwardsError{Field: "max_token", Bucket: -1, Committed: prev.MaxToken, Given: next.MaxToken}
		}
	}
	was, now := shard.Positions(g, prev, shard.BucketPositions{}), shard.Positions(g, next, shard.BucketPositions{})
	for i, bt := range g.Buckets {
		if now[i] < was[i] {
			field := "default"
			if _, ok := next.Exception(bt.Bucket); ok {
				field = "exceptions"
			}
			return &BackwardsError{Field: field, Bucket: bt.Bucket, Committed: was[i], Given: now[i]}
		}
	}
	return nil
}

// CommitPositions replaces member id's committed positions in stream
// keyspace ks with c, for session lease, in one etcd transaction that
// writes one small value (positions/<ks>/<id>, without a lease) however
// many buckets the member holds. It applies only if the member record is
// still on lease and the member's grants and commit record are at the
// revisions c was checked against (checkCommit's rules); otherwise it
// takes the current values from the failed transaction and checks again.
// A refused commit applies nothing. It returns the revision of the write.
//
// A commit record of an earlier session of the same id is the leader's to
// fold into the keyspace's bucket positions before the new session can be
// granted anything; until it has, CommitPositions refuses with
// ErrConflict.
//
// Errors: ErrInvalid (bad input or a keyspace that is not a stream one,
// naming the field), *NotHeldError (wrapping ErrNotHeld), *BackwardsError
// (wrapping ErrBackwards), ErrNotFound (no such keyspace or member),
// ErrFenced (the id is held by another session), ErrConflict (still
// contended after retries, or an earlier session's record not folded yet),
// ErrCorrupt, ErrInvalidName, ErrUnavailable.
func (s *Store) CommitPositions(ctx context.Context, ks, id string, lease shard.LeaseID, c shard.Commit) (int64, error) {
	if s.closed() {
		return 0, errClosed("commit positions")
	}
	if err := checkNames(ks, id); err != nil {
		return 0, err
	}
	op := fmt.Sprintf("commit positions of %s/%s", ks, id)
	if lease <= 0 {
		return 0, invalidf("%s: session %d is not a lease id", op, int64(lease))
	}
	if e := validateCommit(c); e != nil {
		return 0, fmt.Errorf("store: %s: %w", op, e.invalid("commit"))
	}
	kk, mk, gk, pk, tk := KeyspaceKey(ks), MemberKey(ks, id), GrantsKey(ks, id), PositionsKey(ks, id), TokensKey(ks)
	reads := []clientv3.Op{clientv3.OpGet(kk), clientv3.OpGet(mk), clientv3.OpGet(gk), clientv3.OpGet(pk), clientv3.OpGet(tk)}
	resp, err := s.client.Txn(ctx).Then(reads...).Commit()
	if err != nil {
		return 0, s.err(op, err)
	}
	val, err := EncodeCommit(c)
	if err != nil {
		return 0, err
	}
	for range maxReleaseRetries {
		// resp holds the five reads, from the first read or from the
		// Else branch of a failed write.
		kv := func(i int) []byte {
			if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) == 1 {
				return kvs[0].Value
			}
			return nil
		}
		rev := func(i int) int64 {
			if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) == 1 {
				return kvs[0].ModRevision
			}
			return 0
		}
		if rev(0) == 0 {
			return 0, fmt.Errorf("store: %s: keyspace %q: %w", op, ks, ErrNotFound)
		}
		cfg, err := DecodeKeyspace(kk, kv(0))
		if err != nil {
			return 0, err
		}
		if cfg.Mode != shard.ModeStream {
			return 0, fmt.Errorf("store: %s: %w: keyspace %q is in %s mode; positions belong to stream keyspaces", op, ErrInvalid, ks, cfg.Mode)
		}
		mkv := resp.Responses[1].GetResponseRange().Kvs
		if len(mkv) == 0 {
			return 0, fmt.Errorf("store: %s: member %q: %w", op, id, ErrNotFound)
		}
		if shard.LeaseID(mkv[0].Lease) != lease {
			return 0, fmt.Errorf("store: %s: %w: member id %q is now held by session %v, not %v", op, ErrFenced, id, shard.LeaseID(mkv[0].Lease), lease)
		}
		var g shard.Grants
		if rev(2) != 0 {
			if g, err = DecodeGrants(gk, kv(2)); err != nil {
				return 0, err
			}
		}
		var prev shard.Commit
		if rev(3) != 0 {
			if prev, err = DecodeCommit(pk, kv(3)); err != nil {
				return 0, err
			}
			if prev.Session != lease {
				return 0, fmt.Errorf("store: %s: %w: the positions of member %q's earlier session %v are not folded yet; retry once the leader has", op, ErrConflict, id, prev.Session)
			}
		}
		var last uint64
		if rev(4) != 0 {
			if last, err = DecodeTokens(tk, kv(4)); err != nil {
				return 0, err
			}
		}
		if err := checkCommit(c, lease, g, prev, cfg.Buckets, last); err != nil {
			return 0, fmt.Errorf("store: %s: %w", op, err)
		}
		put, err := s.putIfMember(ctx, op, lease, mk, gk, rev(2), pk, rev(3), clientv3.OpPut(pk, string(val)), reads)
		if err != nil {
			return 0, err
		}
		if put.Succeeded {
			return put.Header.Revision, nil
		}
		// The member, its grants or its commit record changed meanwhile:
		// the failed transaction read them; check again from there.
		resp = put
	}
	return 0, fmt.Errorf("store: %s: %w: still contended after %d attempts", op, ErrConflict, maxReleaseRetries)
}
