package clienttest

import (
	"context"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
)

// Stream keyspaces. The fake keeps, as keyshard serve does, a committed
// position per bucket: a held bucket's is its grant's from raised by its
// session's last Commit; the others' is the keyspace's, which a bucket's
// position folds into when it leaves its session (released, taken back,
// or its session ended). The fake hands a released bucket over at once,
// so its position folds at the Release: the final position the Release
// carries, if any and not below the committed one.

func failedPrecondition(format string, args ...any) error {
	return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(format, args...))
}

func invalidArg(format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, args...))
}

// effLocked returns the committed position of bucket b, which x holds:
// the exception of x's last commit at the grant's token, else its
// position if the grant's token is <= its max_token, else the grant's
// from; never below the grant's from.
func effLocked(x *sessionState, b uint32) uint64 {
	return effOf(x, x.commit, b)
}

func effOf(x *sessionState, c *keyshardv1.CommitRequest, b uint32) uint64 {
	tok, p := x.grants[b], x.from[b]
	if c == nil {
		return p
	}
	for _, e := range c.GetExceptions() {
		if e.GetBucket() == b && e.GetToken() == tok {
			return max(p, e.GetPosition())
		}
	}
	if tok <= c.GetMaxToken() {
		p = max(p, c.GetPosition())
	}
	return p
}

// foldLocked folds the position of bucket b, which x holds and gives up,
// into its keyspace's: final if it is above the committed one.
func (s *Server) foldLocked(x *sessionState, b uint32, final uint64) {
	k := s.keyspaces[x.keyspace]
	if k == nil || k.cfg.GetMode() != keyshardv1.KeyspaceMode_KEYSPACE_MODE_STREAM {
		return
	}
	if k.pos == nil {
		k.pos = map[uint32]uint64{}
	}
	k.pos[b] = max(k.pos[b], effLocked(x, b), final)
}

// releasePositionsLocked checks a Release's final positions against the
// buckets it releases (bucket → token) and returns them by bucket.
func (s *Server) releasePositionsLocked(x *sessionState, listed map[uint32]uint64, ps []*keyshardv1.BucketPosition) (map[uint32]uint64, error) {
	out := map[uint32]uint64{}
	for i, p := range ps {
		b := p.GetBucket()
		if tok, ok := listed[b]; !ok || tok != p.GetToken() {
			return nil, invalidArg("positions[%d]: bucket %d at token %d is not one of the buckets released", i, b, p.GetToken())
		}
		if _, dup := out[b]; dup {
			return nil, invalidArg("positions[%d]: bucket %d appears twice", i, b)
		}
		if eff := effLocked(x, b); p.GetPosition() < eff {
			return nil, failedPrecondition("positions[%d]: bucket %d: final position %d is below its committed position %d", i, b, p.GetPosition(), eff)
		}
		out[b] = p.GetPosition()
	}
	return out, nil
}

// Commit applies a session's positions with keyshard serve's checks:
// bad input is invalid_argument naming the field; an exception for a
// bucket not held at its token is failed_precondition naming it; a
// position, max_token or any held bucket's position moving backwards is
// failed_precondition "backwards"; an ended session is not_found. A
// refused commit applies nothing.
func (m memberService) Commit(_ context.Context, r *connect.Request[keyshardv1.CommitRequest]) (*connect.Response[keyshardv1.CommitResponse], error) {
	s := m.s
	s.mu.Lock()
	defer s.mu.Unlock()
	x, err := s.liveLocked(r.Msg.GetSession())
	if err != nil {
		return nil, err
	}
	k := s.keyspaces[x.keyspace]
	if k.cfg.GetMode() != keyshardv1.KeyspaceMode_KEYSPACE_MODE_STREAM {
		return nil, invalidArg("keyspace %q is in %s mode; positions belong to stream keyspaces", k.cfg.GetName(), k.cfg.GetMode())
	}
	c := r.Msg
	for i, e := range c.GetExceptions() {
		switch {
		case e.GetBucket() >= k.cfg.GetBuckets():
			return nil, invalidArg("exceptions[%d]: bucket %d is outside the keyspace's %d buckets", i, e.GetBucket(), k.cfg.GetBuckets())
		case e.GetToken() == 0:
			return nil, invalidArg("exceptions[%d]: bucket %d has token 0; tokens start at 1", i, e.GetBucket())
		case i > 0 && c.GetExceptions()[i-1].GetBucket() >= e.GetBucket():
			return nil, invalidArg("exceptions[%d]: bucket %d follows %d; want ascending order, each bucket once", i, e.GetBucket(), c.GetExceptions()[i-1].GetBucket())
		}
	}
	if c.GetMaxToken() > s.lastToken {
		return nil, invalidArg("max_token: %d is above the last token issued, %d", c.GetMaxToken(), s.lastToken)
	}
	for i, e := range c.GetExceptions() {
		if tok, ok := x.grants[e.GetBucket()]; !ok || tok != e.GetToken() {
			return nil, failedPrecondition("exceptions[%d]: bucket %d is not held at token %d", i, e.GetBucket(), e.GetToken())
		}
	}
	if prev := x.commit; prev != nil {
		if c.GetPosition() < prev.GetPosition() {
			return nil, failedPrecondition("backwards: position %d is lower than the %d committed before", c.GetPosition(), prev.GetPosition())
		}
		if c.GetMaxToken() < prev.GetMaxToken() {
			return nil, failedPrecondition("backwards: max_token %d is lower than the %d committed before", c.GetMaxToken(), prev.GetMaxToken())
		}
	}
	for b := range x.grants {
		if was, now := effOf(x, x.commit, b), effOf(x, c, b); now < was {
			return nil, failedPrecondition("backwards: bucket %d would go back from position %d to %d", b, was, now)
		}
	}
	x.commit = proto.Clone(c).(*keyshardv1.CommitRequest)
	rev := ReleaseRevisionBase + x.rev
	s.notifyLocked()
	return connect.NewResponse(&keyshardv1.CommitResponse{Revision: rev}), nil
}

// SetBucketPosition sets the committed position of bucket in keyspace,
// as an import or a reset does: the next grant of the bucket starts there
// (its from). It changes nothing for a session that holds the bucket now.
func (s *Server) SetBucketPosition(keyspace string, bucket int, pos uint64) {
	if s.tb != nil {
		s.tb.Helper()
	}
	err := func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		k, err := s.keyspaceLocked(keyspace)
		if err != nil {
			return err
		}
		if err := s.checkBucketLocked(keyspace, bucket); err != nil {
			return err
		}
		if k.pos == nil {
			k.pos = map[uint32]uint64{}
		}
		k.pos[uint32(bucket)] = pos
		s.notifyLocked()
		return nil
	}()
	if err != nil {
		s.fatalf("SetBucketPosition: %v", err)
	}
}

// BucketPosition returns the committed position of bucket in keyspace
// that no session holds: where its next grant starts (0 if none was
// committed, set or folded).
func (s *Server) BucketPosition(keyspace string, bucket int) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k := s.keyspaces[keyspace]; k != nil {
		return k.pos[uint32(bucket)]
	}
	return 0
}

// GrantFrom is Grant with the grant's from given: the position the worker
// is told to read the bucket from, whatever the keyspace's position of
// the bucket.
func (s *Server) GrantFrom(session string, bucket int, from uint64) uint64 {
	if s.tb != nil {
		s.tb.Helper()
	}
	var tok uint64
	s.withSession("GrantFrom", session, func(x *sessionState) error {
		if x.gone {
			return fmt.Errorf("session %q has ended", session)
		}
		if err := s.checkBucketLocked(x.keyspace, bucket); err != nil {
			return err
		}
		tok = s.grantFromLocked(x, uint32(bucket), from)
		s.notifyLocked()
		return nil
	})
	return tok
}

// LastCommit returns the last Commit the fake applied for session (a
// copy), or nil if none was.
func (s *Server) LastCommit(session string) *keyshardv1.CommitRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	if x := s.sessions[session]; x != nil && x.commit != nil {
		return proto.Clone(x.commit).(*keyshardv1.CommitRequest)
	}
	return nil
}

// Positions returns the committed position of every bucket session holds,
// as keyshard serve computes it: its grant's from, raised by the
// session's last Commit.
func (s *Server) Positions(session string) map[int]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int]uint64{}
	if x := s.sessions[session]; x != nil {
		for b := range x.grants {
			out[int(b)] = effLocked(x, b)
		}
	}
	return out
}
