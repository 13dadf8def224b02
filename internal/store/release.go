package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keyshard/keyshard/internal/shard"
)

// ErrNotHeld is returned by Release for a bucket the session does not hold
// at the given token.
var ErrNotHeld = errors.New("store: bucket not held at that token")

// NotHeldError names the bucket Release refused and what the session holds.
type NotHeldError struct {
	Bucket int
	Token  uint64 // the token given
	Held   uint64 // the token the session holds it at; 0 if not held
}

func (e *NotHeldError) Error() string {
	if e.Held == 0 {
		return fmt.Sprintf("bucket %d is not held by this session (already released, or never granted)", e.Bucket)
	}
	return fmt.Sprintf("bucket %d is held at token %d, not %d", e.Bucket, e.Held, e.Token)
}

// Unwrap makes errors.Is(err, ErrNotHeld) true.
func (e *NotHeldError) Unwrap() error { return ErrNotHeld }

// ReleaseState is what Release needs to know of a member: its grants, its
// release record and its commit record (stream positions), each with the
// ModRevision it was read at (0: absent). A caller with a cache may pass
// its copy as a first guess; Release checks it in the same transaction
// that writes, and reads etcd only if it was stale. The commit record is
// read and compared only by a release that gives positions.
type ReleaseState struct {
	Grants      shard.Grants
	GrantsRev   int64
	Releases    shard.Releases
	ReleasesRev int64
	Commit      shard.Commit
	CommitRev   int64
}

// maxReleaseRetries bounds Release's compare-and-write loop. A failed
// attempt means another write to the member's grants or releases won, so
// n concurrent Release calls of one member can fail up to n times each
// (once more for a stale guess): the bound is set well above the calls a
// member makes at once.
const maxReleaseRetries = 64

// Release records that member id, in session lease, released buckets at
// the tokens given, each with its final position in a stream keyspace (0:
// none given). Releasing a bucket again at the same token keeps the
// higher of the two positions, so a retry without positions loses none.
// It merges them with the member's earlier releases that
// are still held and writes the record only if the member's grants and
// releases are still at the revisions the merge was computed from, with
// the member record still on lease; otherwise it takes the current values
// from the failed transaction and tries again. So concurrent releases of
// one member, through any replica, never overwrite each other, and a
// release is checked against the grants as etcd has them. guess, if not
// nil, saves the first read.
//
// A release that gives positions also reads the member's commit record
// and writes only if it is unchanged: a position below the bucket's
// committed one (shard.Positions of the grant and the record) is refused
// with a *BackwardsError (field "positions"), and nothing is released,
// however a concurrent Commit lands.
//
// Errors: *NotHeldError (wrapping ErrNotHeld), *BackwardsError (wrapping
// ErrBackwards), ErrNotFound (no such member), ErrFenced (the id is held
// by another session), ErrConflict (still contended after retries),
// ErrUnavailable.
func (s *Store) Release(ctx context.Context, ks, id string, lease shard.LeaseID, buckets []shard.BucketToken, guess *ReleaseState) (int64, error) {
	if s.closed() {
		return 0, errClosed("release")
	}
	if err := checkNames(ks, id); err != nil {
		return 0, err
	}
	op := fmt.Sprintf("release buckets of %s/%s", ks, id)
	mk, gk, rk, pk := MemberKey(ks, id), GrantsKey(ks, id), ReleasesKey(ks, id), PositionsKey(ks, id)
	reads := []clientv3.Op{clientv3.OpGet(mk), clientv3.OpGet(gk), clientv3.OpGet(rk)}
	positioned := slices.ContainsFunc(buckets, func(bt shard.BucketToken) bool { return bt.Position > 0 })
	if positioned {
		reads = append(reads, clientv3.OpGet(pk))
	}
	// fresh parses the three reads into a state, checking the member.
	fresh := func(resp *clientv3.TxnResponse) (ReleaseState, error) {
		var st ReleaseState
		mkv := resp.Responses[0].GetResponseRange().Kvs
		if len(mkv) == 0 {
			return st, fmt.Errorf("store: %s: member %q: %w", op, id, ErrNotFound)
		}
		if shard.LeaseID(mkv[0].Lease) != lease {
			return st, fmt.Errorf("store: %s: %w: member id %q is now held by session %v, not %v", op, ErrFenced, id, shard.LeaseID(mkv[0].Lease), lease)
		}
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) == 1 {
			g, err := DecodeGrants(gk, kvs[0].Value)
			if err != nil {
				return st, err
			}
			st.Grants, st.GrantsRev = g, kvs[0].ModRevision
		}
		if kvs := resp.Responses[2].GetResponseRange().Kvs; len(kvs) == 1 {
			r, err := DecodeReleases(rk, kvs[0].Value)
			if err != nil {
				return st, err
			}
			st.Releases, st.ReleasesRev = r, kvs[0].ModRevision
		}
		if positioned {
			if kvs := resp.Responses[3].GetResponseRange().Kvs; len(kvs) == 1 {
				c, err := DecodeCommit(pk, kvs[0].Value)
				if err != nil {
					return st, err
				}
				st.Commit, st.CommitRev = c, kvs[0].ModRevision
			}
		}
		return st, nil
	}
	read := func() (ReleaseState, error) {
		resp, err := s.client.Txn(ctx).Then(reads...).Commit()
		if err != nil {
			return ReleaseState{}, s.err(op, err)
		}
		return fresh(resp)
	}
	var st ReleaseState
	guessed := guess != nil
	if guessed {
		st = *guess
	} else {
		var err error
		if st, err = read(); err != nil {
			return 0, err
		}
	}
	for range maxReleaseRetries {
		held := map[int]uint64{}
		if st.Grants.Session == lease {
			for _, bt := range st.Grants.Buckets {
				held[bt.Bucket] = bt.Token
			}
		}
		merged := map[int]shard.BucketToken{}
		for _, bt := range st.Releases.Buckets {
			if held[bt.Bucket] == bt.Token {
				merged[bt.Bucket] = bt
			}
		}
		var refused error
		for _, bt := range buckets {
			if have, ok := held[bt.Bucket]; !ok || have != bt.Token {
				refused = &NotHeldError{Bucket: bt.Bucket, Token: bt.Token, Held: have}
				break
			}
			if was, ok := merged[bt.Bucket]; ok {
				bt.Position = max(bt.Position, was.Position)
			}
			merged[bt.Bucket] = bt
		}
		if refused == nil && positioned {
			refused = backwardsRelease(st, buckets)
		}
		if refused != nil {
			if !guessed {
				return 0, refused
			}
			// The guess may be behind etcd: check before refusing.
			var err error
			if st, err = read(); err != nil {
				return 0, err
			}
			guessed = false
			continue
		}
		out := shard.Releases{}
		for _, bt := range merged {
			out.Buckets = append(out.Buckets, bt)
		}
		sort.Slice(out.Buckets, func(i, j int) bool { return out.Buckets[i].Bucket < out.Buckets[j].Bucket })
		val, err := EncodeReleases(out)
		if err != nil {
			return 0, err
		}
		var also []clientv3.Cmp
		if positioned {
			also = append(also, clientv3.Compare(clientv3.ModRevision(pk), "=", st.CommitRev))
		}
		put, err := s.putIfMember(ctx, op, lease, mk, gk, st.GrantsRev, rk, st.ReleasesRev,
			clientv3.OpPut(rk, string(val), clientv3.WithLease(clientv3.LeaseID(lease))), reads, also...)
		if err != nil {
			return 0, err
		}
		if put.Succeeded {
			return put.Header.Revision, nil
		}
		// The member, its grants or its releases changed meanwhile: the
		// failed transaction read them; go again from there.
		if st, err = fresh(put); err != nil {
			return 0, err
		}
		guessed = false
	}
	return 0, fmt.Errorf("store: %s: %w: still contended after %d attempts", op, ErrConflict, maxReleaseRetries)
}

// backwardsRelease refuses a release position below its bucket's
// committed one in st: shard.Positions of the grant and the member's
// commit record (the keyspace's bucket positions are at or below a held
// bucket's grant, so they do not count).
func backwardsRelease(st ReleaseState, buckets []shard.BucketToken) error {
	eff := shard.Positions(st.Grants, st.Commit, shard.BucketPositions{})
	at := make(map[int]uint64, len(eff))
	for i, bt := range st.Grants.Buckets {
		at[bt.Bucket] = eff[i]
	}
	for _, bt := range buckets {
		if bt.Position > 0 && bt.Position < at[bt.Bucket] {
			return &BackwardsError{Field: "positions", Bucket: bt.Bucket, Committed: at[bt.Bucket], Given: bt.Position}
		}
	}
	return nil
}

// putIfMember applies put, a write of key, only if member key mk is still
// on lease and the member's grants (gk) and key are at the revisions the
// write was computed from; otherwise the response holds reads, made in
// the same transaction, to compute it again from.
func (s *Store) putIfMember(ctx context.Context, op string, lease shard.LeaseID, mk, gk string, grantsRev int64, key string, keyRev int64, put clientv3.Op, reads []clientv3.Op, also ...clientv3.Cmp) (*clientv3.TxnResponse, error) {
	cmps := append([]clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(mk), "=", clientv3.LeaseID(lease)),
		clientv3.Compare(clientv3.ModRevision(gk), "=", grantsRev),
		clientv3.Compare(clientv3.ModRevision(key), "=", keyRev)}, also...)
	resp, err := s.client.Txn(ctx).
		If(cmps...).
		Then(put).
		Else(reads...).
		Commit()
	if err != nil {
		return nil, s.err(op, err)
	}
	return resp, nil
}
