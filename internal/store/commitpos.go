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

// CommitState is what CommitPositions checks a commit against: the
// keyspace's bucket count, the member's grants, release record and commit
// record, each with the ModRevision it was read at (0: absent), and the
// last token issued in the keyspace. A caller with a cache passes its copy
// as a guess (CommitPositionsWith), saving the read: the write compares
// the grants', the release record's and the commit record's revisions,
// and a refusal is checked again on a fresh read (the guess may be
// behind), so a guess never lets a wrong commit in nor keeps a right one
// out.
type CommitState struct {
	Buckets     int
	Grants      shard.Grants
	GrantsRev   int64
	Releases    shard.Releases
	ReleasesRev int64
	Commit      shard.Commit
	CommitRev   int64
	LastToken   uint64
}

// Stored returns the commit record CommitPositions writes for c, a commit
// that st accepts (Check): shard.PinReleased of c under st's grants,
// release record and commit record. Each bucket the member released
// without a final position, and that its grants still hold at the token
// it released it at, keeps the position st's commit record gives it.
func (st CommitState) Stored(c shard.Commit) shard.Commit {
	return shard.PinReleased(st.Grants, st.Releases, st.Commit, c)
}

// Check reports whether c, a commit of session lease, may replace the
// commit record of st, with CommitPositions' errors (without the
// operation's prefix): ErrConflict if the record is an earlier session's,
// not folded yet, else checkCommit's.
func (st CommitState) Check(c shard.Commit, lease shard.LeaseID) error {
	if st.CommitRev != 0 && st.Commit.Session != lease {
		return fmt.Errorf("%w: the positions of the member's earlier session %v are not folded yet; retry once the leader has", ErrConflict, st.Commit.Session)
	}
	return checkCommit(c, lease, st.Grants, st.Commit, st.Buckets, st.LastToken)
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
// A bucket the member has released without a final position, and that
// its grants still hold at the token it released it at (the leader has
// not handed it over yet), keeps the position the commit record gave it
// at the release: the leader folds the record's position for it when it
// hands it over, and the member handles nothing of it after the release.
// So the record written is CommitState.Stored of c, which pins each such
// bucket that c would move with an exception at its earlier position. The
// member's release record is read in the same transaction, and the write
// compares its revision too: a release landing between the read and the
// write makes the commit check and pin again. Only those buckets are
// pinned, and only until they are handed over; a release that gives a
// final position needs no pin (the leader folds that position).
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
	rev, _, err := s.CommitPositionsWith(ctx, ks, id, lease, c, nil)
	return rev, err
}

// CommitPositionsWith is CommitPositions starting from guess, if not nil,
// instead of a read: a current guess makes the commit one etcd round trip.
// The guess must be of stream keyspace ks (its mode is not read again).
// It also returns the state the commit was checked against, as read or
// guessed and confirmed by the write (on success), or as read fresh (on a
// refusal by checkCommit's rules); the zero state otherwise. The caller
// may check other commits against it (CommitState.Check) and, on
// success, use it with Commit set to the record written (its Stored of
// c, not c) and CommitRev to the revision as its next guess.
func (s *Store) CommitPositionsWith(ctx context.Context, ks, id string, lease shard.LeaseID, c shard.Commit, guess *CommitState) (int64, CommitState, error) {
	if s.closed() {
		return 0, CommitState{}, errClosed("commit positions")
	}
	if err := checkNames(ks, id); err != nil {
		return 0, CommitState{}, err
	}
	op := fmt.Sprintf("commit positions of %s/%s", ks, id)
	if lease <= 0 {
		return 0, CommitState{}, invalidf("%s: session %d is not a lease id", op, int64(lease))
	}
	if e := validateCommit(c); e != nil {
		return 0, CommitState{}, fmt.Errorf("store: %s: %w", op, e.invalid("commit"))
	}
	kk, mk, gk, pk, tk, rk := KeyspaceKey(ks), MemberKey(ks, id), GrantsKey(ks, id), PositionsKey(ks, id), TokensKey(ks), ReleasesKey(ks, id)
	reads := []clientv3.Op{clientv3.OpGet(kk), clientv3.OpGet(mk), clientv3.OpGet(gk), clientv3.OpGet(pk), clientv3.OpGet(tk), clientv3.OpGet(rk)}
	// fresh parses the six reads, from a read or from the Else branch of
	// a failed write, checking the keyspace and the member.
	fresh := func(resp *clientv3.TxnResponse) (CommitState, error) {
		var st CommitState
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
			return st, fmt.Errorf("store: %s: keyspace %q: %w", op, ks, ErrNotFound)
		}
		cfg, err := DecodeKeyspace(kk, kv(0))
		if err != nil {
			return st, err
		}
		if cfg.Mode != shard.ModeStream {
			return st, fmt.Errorf("store: %s: %w: keyspace %q is in %s mode; positions belong to stream keyspaces", op, ErrInvalid, ks, cfg.Mode)
		}
		st.Buckets = cfg.Buckets
		mkv := resp.Responses[1].GetResponseRange().Kvs
		if len(mkv) == 0 {
			return st, fmt.Errorf("store: %s: member %q: %w", op, id, ErrNotFound)
		}
		if shard.LeaseID(mkv[0].Lease) != lease {
			return st, fmt.Errorf("store: %s: %w: member id %q is now held by session %v, not %v", op, ErrFenced, id, shard.LeaseID(mkv[0].Lease), lease)
		}
		if st.GrantsRev = rev(2); st.GrantsRev != 0 {
			if st.Grants, err = DecodeGrants(gk, kv(2)); err != nil {
				return st, err
			}
		}
		if st.CommitRev = rev(3); st.CommitRev != 0 {
			if st.Commit, err = DecodeCommit(pk, kv(3)); err != nil {
				return st, err
			}
		}
		if rev(4) != 0 {
			if st.LastToken, err = DecodeTokens(tk, kv(4)); err != nil {
				return st, err
			}
		}
		if st.ReleasesRev = rev(5); st.ReleasesRev != 0 {
			if st.Releases, err = DecodeReleases(rk, kv(5)); err != nil {
				return st, err
			}
		}
		return st, nil
	}
	read := func() (CommitState, error) {
		resp, err := s.client.Txn(ctx).Then(reads...).Commit()
		if err != nil {
			return CommitState{}, s.err(op, err)
		}
		return fresh(resp)
	}
	var (
		st  CommitState
		err error
	)
	guessed := guess != nil
	if guessed {
		st = *guess
	} else if st, err = read(); err != nil {
		return 0, CommitState{}, err
	}
	for range maxReleaseRetries {
		if err := st.Check(c, lease); err != nil {
			if guessed {
				// The guess may be behind etcd: check before refusing.
				if st, err = read(); err != nil {
					return 0, CommitState{}, err
				}
				guessed = false
				continue
			}
			return 0, st, fmt.Errorf("store: %s: %w", op, err)
		}
		val, err := EncodeCommit(st.Stored(c))
		if err != nil {
			return 0, CommitState{}, err
		}
		put, err := s.putIfMember(ctx, op, lease, mk, gk, st.GrantsRev, pk, st.CommitRev, clientv3.OpPut(pk, string(val)), reads,
			clientv3.Compare(clientv3.ModRevision(rk), "=", st.ReleasesRev))
		if err != nil {
			return 0, CommitState{}, err
		}
		if put.Succeeded {
			return put.Header.Revision, st, nil
		}
		// The member, its grants, its releases or its commit record
		// changed meanwhile: the failed transaction read them; check
		// again from there.
		if st, err = fresh(put); err != nil {
			return 0, CommitState{}, err
		}
		guessed = false
	}
	return 0, CommitState{}, fmt.Errorf("store: %s: %w: still contended after %d attempts", op, ErrConflict, maxReleaseRetries)
}
