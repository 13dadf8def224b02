package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keyshard/keyshard/internal/shard"
)

// The operator's view of a stream keyspace's positions, and its reset.

// StreamPositions is every bucket's committed position in a stream
// keyspace and its holder, as of one revision.
type StreamPositions struct {
	Keyspace shard.Keyspace
	Epoch    uint64 // of the keyspace's map; 0 before the first
	// Positions and Holders are indexed by bucket (see
	// shard.KeyspacePositions).
	Positions []uint64
	Holders   []shard.Holder
	Rev       int64
}

// ErrHeld: ResetPositions refused a bucket that a member holds, or that
// an ended session's positions may still raise. The error is a
// *HeldError.
var ErrHeld = errors.New("store: bucket held")

// HeldReason says why ResetPositions refused a bucket.
type HeldReason string

// The reasons of a *HeldError.
const (
	// HeldGranted: a member's grants hold the bucket.
	HeldGranted HeldReason = "held"
	// HeldReleasing: a member's grants hold the bucket and it released it;
	// the leader has not taken it back yet.
	HeldReleasing HeldReason = "releasing"
	// HeldUnfolded: the commit record of a member's ended session is not
	// folded into the bucket positions yet; the fold may raise the bucket.
	HeldUnfolded HeldReason = "unfolded"
)

// HeldError names the bucket ResetPositions refused and who holds it.
type HeldError struct {
	// Bucket is -1 when the refusal is about every bucket an ended
	// session held, which the store cannot tell apart (HeldUnfolded).
	Bucket  int
	Member  string
	Token   uint64        // the grant's token; 0 for HeldUnfolded
	Session shard.LeaseID // the holder's session
	Reason  HeldReason
}

func (e *HeldError) Error() string {
	switch {
	case e.Reason == HeldReleasing:
		return fmt.Sprintf("bucket %d is held by member %q at token %d, which released it; the leader has not taken it back yet", e.Bucket, e.Member, e.Token)
	case e.Reason == HeldUnfolded && e.Bucket >= 0:
		return fmt.Sprintf("bucket %d has committed positions of member %q's ended session %v, which the leader has not folded yet", e.Bucket, e.Member, e.Session)
	case e.Reason == HeldUnfolded:
		return fmt.Sprintf("member %q's ended session %v left committed positions, which the leader has not folded yet (they may cover any bucket it held)", e.Member, e.Session)
	}
	return fmt.Sprintf("bucket %d is held by member %q at token %d", e.Bucket, e.Member, e.Token)
}

// Unwrap returns ErrHeld.
func (e *HeldError) Unwrap() error { return ErrHeld }

// loadStream reads every key of stream keyspace ks at one revision, in
// one round trip. A key of it that does not decode is an error: positions
// computed without it could be wrong.
func (s *Store) loadStream(ctx context.Context, op, ks string) (*KeyspaceState, int64, error) {
	snap, rev, err := s.LoadKeyspace(ctx, ks)
	if err != nil {
		return nil, 0, err // names the keyspace
	}
	if len(snap.Corrupt) > 0 {
		k := slices.Sorted(maps.Keys(snap.Corrupt))[0]
		return nil, 0, fmt.Errorf("store: %s: %w", op, snap.Corrupt[k])
	}
	st := snap.Keyspaces[ks]
	if st == nil || !st.Config.Exists() {
		return nil, 0, fmt.Errorf("store: %s: keyspace %q: %w", op, ks, ErrNotFound)
	}
	if m := st.Config.Value.Mode; m != shard.ModeStream {
		return nil, 0, fmt.Errorf("store: %s: %w: field \"keyspace\": keyspace %q is in %s mode; positions belong to stream keyspaces", op, ErrInvalid, ks, m)
	}
	return st, rev, nil
}

// heldPositions is the input of shard.KeyspacePositions from st: releases
// count only if they are on the lease of the member's grants.
func heldPositions(st *KeyspaceState) shard.HeldPositions {
	in := shard.HeldPositions{
		Buckets:  st.Config.Value.Buckets,
		Grants:   map[string]shard.Grants{},
		Commits:  map[string]shard.Commit{},
		Releases: map[string]shard.Releases{},
		Copies:   map[string]shard.Held{},
		Base:     st.Positions(),
	}
	for id, h := range st.Held {
		in.Copies[id] = h.Value
	}
	for id, g := range st.Grants {
		in.Grants[id] = g.Value
		if r, ok := st.Releases[id]; ok && r.Lease == g.Value.Session {
			in.Releases[id] = r.Value
		}
	}
	for id, c := range st.Commits {
		in.Commits[id] = c.Value
	}
	return in
}

// Positions reads stream keyspace ks's committed positions in one etcd
// read: every bucket's position and holder (see shard.KeyspacePositions)
// and the map's epoch, at one revision.
// Errors: ErrNotFound (no such keyspace), ErrInvalid (not a stream
// keyspace), ErrInvalidName, ErrCorrupt, ErrUnavailable.
func (s *Store) Positions(ctx context.Context, ks string) (StreamPositions, error) {
	if s.closed() {
		return StreamPositions{}, errClosed("read positions")
	}
	st, rev, err := s.loadStream(ctx, fmt.Sprintf("read positions of %s", ks), ks)
	if err != nil {
		return StreamPositions{}, err
	}
	pos, holders := shard.KeyspacePositions(heldPositions(st))
	return StreamPositions{Keyspace: st.Config.Value, Epoch: st.Map.Value.Epoch, Positions: pos, Holders: holders, Rev: rev}, nil
}

// checkReset returns the first reason not to reset buckets of st, or nil:
// a bucket a member's grants hold (any session's), and the commit record
// of an ended session that the leader has not folded yet. A record's
// session has ended when neither the member record nor the member's
// grants are on it any more; the store cannot tell which buckets the
// record's Default covered (the grants vanished with the session), so any
// such record refuses every bucket.
func checkReset(st *KeyspaceState, buckets []int) error {
	in := heldPositions(st)
	_, holders := shard.KeyspacePositions(in)
	for _, b := range buckets {
		h := holders[b]
		if h.Member == "" {
			continue
		}
		e := &HeldError{Bucket: b, Member: h.Member, Token: h.Token, Session: in.Grants[h.Member].Session, Reason: HeldGranted}
		for _, r := range in.Releases[h.Member].Buckets {
			if r.Bucket == b && r.Token == h.Token {
				e.Reason = HeldReleasing
			}
		}
		return e
	}
	for _, id := range slices.Sorted(maps.Keys(st.Commits)) {
		c := st.Commits[id].Value
		if m, ok := st.Members[id]; ok && m.Lease == c.Session {
			continue // the session is live
		}
		if g, ok := st.Grants[id]; ok && g.Value.Session == c.Session {
			continue // a replaced session still holding grants: they are checked above
		}
		e := &HeldError{Bucket: -1, Member: id, Session: c.Session, Reason: HeldUnfolded}
		for _, b := range buckets {
			if _, ok := c.Exception(b); ok {
				e.Bucket = b
				break
			}
		}
		return e
	}
	return nil
}

// maxResetRetries bounds ResetPositions' read-check-write loop: a failed
// attempt means the leader or a member wrote to the keyspace meanwhile.
const maxResetRetries = 16

// ResetPositions sets the bucket positions of buckets of stream keyspace
// ks to position, also backwards, in one etcd transaction that writes the
// bucketpos chunks it changes. It refuses, applying nothing, if any of
// the buckets is held by any member's grants or an ended session's
// positions are not folded yet (*HeldError, wrapping ErrHeld): a holder
// would commit over the reset, or the leader's fold would raise it again.
//
// The transaction applies only if nothing it read changed: the keyspace's
// record, every bucketpos chunk (compared one by one, so a deleted chunk
// counts), and no member record, grants, release or commit record of the
// keyspace written since the read (compared by prefix; those keys being
// deleted only makes buckets less held). Otherwise it reads and checks
// again. The leader's grant round expects the chunks it read a grant's
// position from, so a reset that lands between the leader's read and its
// write makes the round conflict, and the round planned again grants the
// reset position.
//
// It returns the revision of the write (of the read, if the buckets were
// at position already). Errors: ErrInvalid (no buckets, a bucket outside
// the keyspace or listed twice, naming the field; a keyspace that is not a
// stream one), *HeldError, ErrNotFound, ErrConflict (still contended
// after retries), ErrInvalidName, ErrCorrupt, ErrUnavailable.
func (s *Store) ResetPositions(ctx context.Context, ks string, buckets []int, position uint64) (int64, error) {
	if s.closed() {
		return 0, errClosed("reset positions")
	}
	op := fmt.Sprintf("reset positions of %s", ks)
	if len(buckets) == 0 {
		return 0, fmt.Errorf("store: %s: %w", op, ferr("buckets", "empty; name at least one bucket").invalid("reset"))
	}
	for range maxResetRetries {
		st, rev, err := s.loadStream(ctx, op, ks)
		if err != nil {
			return 0, err
		}
		n := st.Config.Value.Buckets
		seen := make(map[int]bool, len(buckets))
		for i, b := range buckets {
			if b < 0 || b >= n {
				return 0, fmt.Errorf("store: %s: %w", op, ferr("buckets", "entry %d: bucket %d is outside the keyspace's [0, %d)", i, b, n).invalid("reset"))
			}
			if seen[b] {
				return 0, fmt.Errorf("store: %s: %w", op, ferr("buckets", "entry %d: bucket %d is listed twice", i, b).invalid("reset"))
			}
			seen[b] = true
		}
		rev, done, err := s.tryReset(ctx, op, st, rev, buckets, position)
		if err != nil || done {
			return rev, err
		}
	}
	return 0, fmt.Errorf("store: %s: %w: still contended after %d attempts", op, ErrConflict, maxResetRetries)
}

// tryReset checks buckets against st, read at rev, and writes the reset
// if nothing it read has changed since; done is false if something has.
func (s *Store) tryReset(ctx context.Context, op string, st *KeyspaceState, rev int64, buckets []int, position uint64) (int64, bool, error) {
	if err := checkReset(st, buckets); err != nil {
		return 0, false, fmt.Errorf("store: %s: %w", op, err)
	}
	ks, n := st.Name, st.Config.Value.Buckets
	was := st.Positions()
	dense := was.Dense(n)
	for _, b := range buckets {
		dense[b] = position
	}
	var ops []clientv3.Op
	for _, w := range PutBucketPositions(ks, was, shard.NewBucketPositions(dense)) {
		switch {
		case w.err != nil:
			return 0, false, fmt.Errorf("store: %s: %w", op, w.err)
		case w.del:
			ops = append(ops, clientv3.OpDelete(w.key))
		default:
			ops = append(ops, clientv3.OpPut(w.key, string(w.val)))
		}
	}
	if len(ops) == 0 {
		return rev, true, nil // already there
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(KeyspaceKey(ks)), "=", st.Config.ModRevision)}
	for c := 0; c*PositionChunk < n; c++ {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(BucketPosKey(ks, c)), "=", st.BucketPos[c].ModRevision))
	}
	for _, k := range []Kind{KindMember, KindGrants, KindReleases, KindPositions} {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(kindPrefix(k, ks)), "<", rev+1).WithPrefix())
	}
	resp, err := s.client.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return 0, false, s.err(op, err)
	}
	return resp.Header.Revision, resp.Succeeded, nil
}

// BucketPositions returns each bucket's committed position in stream
// keyspace st and its holder (as GetPositions reads them), from the state
// as read: a replica's view answers without a round trip.
func (st *KeyspaceState) BucketPositions() ([]uint64, []shard.Holder) {
	return shard.KeyspacePositions(heldPositions(st))
}
