package store

import (
	"context"
	"errors"
	"fmt"
	"sort"

	clientv3 "go.etcd.io/etcd/client/v3"
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

// Release records that member id, in session lease, released buckets at
// the tokens given. It reads the member's grants and earlier releases from
// etcd and writes the merged release record (still-held earlier releases
// plus the new ones) only if none of them changed meanwhile, retrying
// otherwise: concurrent releases of one member, through any replica, never
// overwrite each other, and a release is checked against the grants as
// they are, not as a replica's cache had them.
// Errors: *NotHeldError (wrapping ErrNotHeld), ErrNotFound (no such
// member), ErrFenced (the id is held by another session), ErrConflict
// (still contended after retries), ErrUnavailable.
func (s *Store) Release(ctx context.Context, ks, id string, lease LeaseID, buckets []BucketToken) (int64, error) {
	if s.closed() {
		return 0, errClosed("release")
	}
	if err := checkNames(ks, id); err != nil {
		return 0, err
	}
	op := fmt.Sprintf("release buckets of %s/%s", ks, id)
	mk, gk, rk := MemberKey(ks, id), GrantsKey(ks, id), ReleasesKey(ks, id)
	for range maxRetries {
		resp, err := s.client.Txn(ctx).Then(clientv3.OpGet(mk), clientv3.OpGet(gk), clientv3.OpGet(rk)).Commit()
		if err != nil {
			return 0, s.err(op, err)
		}
		mkv := resp.Responses[0].GetResponseRange().Kvs
		if len(mkv) == 0 {
			return 0, fmt.Errorf("store: %s: member %q: %w", op, id, ErrNotFound)
		}
		if LeaseID(mkv[0].Lease) != lease {
			return 0, fmt.Errorf("store: %s: %w: member id %q is now held by session %v, not %v", op, ErrFenced, id, LeaseID(mkv[0].Lease), lease)
		}
		held := map[int]uint64{}
		var gRev, rRev int64
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) == 1 {
			gRev = kvs[0].ModRevision
			g, err := DecodeGrants(gk, kvs[0].Value)
			if err != nil {
				return 0, err
			}
			if g.Session == lease {
				for _, bt := range g.Buckets {
					held[bt.Bucket] = bt.Token
				}
			}
		}
		merged := map[int]uint64{}
		if kvs := resp.Responses[2].GetResponseRange().Kvs; len(kvs) == 1 {
			rRev = kvs[0].ModRevision
			r, err := DecodeReleases(rk, kvs[0].Value)
			if err != nil {
				return 0, err
			}
			for _, bt := range r.Buckets {
				if held[bt.Bucket] == bt.Token {
					merged[bt.Bucket] = bt.Token
				}
			}
		}
		for _, bt := range buckets {
			if have, ok := held[bt.Bucket]; !ok || have != bt.Token {
				return 0, &NotHeldError{Bucket: bt.Bucket, Token: bt.Token, Held: have}
			}
			merged[bt.Bucket] = bt.Token
		}
		out := Releases{}
		for b, t := range merged {
			out.Buckets = append(out.Buckets, BucketToken{Bucket: b, Token: t})
		}
		sort.Slice(out.Buckets, func(i, j int) bool { return out.Buckets[i].Bucket < out.Buckets[j].Bucket })
		val, err := EncodeReleases(out)
		if err != nil {
			return 0, err
		}
		put, err := s.client.Txn(ctx).
			If(clientv3.Compare(clientv3.LeaseValue(mk), "=", clientv3.LeaseID(lease)),
				clientv3.Compare(clientv3.ModRevision(gk), "=", gRev),
				clientv3.Compare(clientv3.ModRevision(rk), "=", rRev)).
			Then(clientv3.OpPut(rk, string(val), clientv3.WithLease(clientv3.LeaseID(lease)))).
			Commit()
		if err != nil {
			return 0, s.err(op, err)
		}
		if put.Succeeded {
			return put.Header.Revision, nil
		}
		// Grants, releases or the member changed meanwhile: read again.
	}
	return 0, fmt.Errorf("store: %s: %w: still contended after %d attempts", op, ErrConflict, maxRetries)
}
