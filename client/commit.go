package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"connectrpc.com/connect"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/placement"
)

// BucketPosition is one bucket's stream position, with the token its
// holder holds it at: Position is the position of the next event to read
// for the bucket.
type BucketPosition struct {
	Bucket   int
	Token    uint64
	Position uint64
}

// Commit is a Worker's stream positions, the whole of them: each Commit
// replaces the session's previous one, in one small write at the server
// however many buckets the worker holds.
//
// Position covers every bucket the session holds at a token <= MaxToken
// that Exceptions do not list. Pass the highest token among the grants
// the positions were computed from (see Worker.Granted): a bucket granted
// after that has a higher token and is not covered until a later commit.
// Every bucket held at a token <= MaxToken that has not reached Position
// (granted but not started, catching up, ahead) must be listed in
// Exceptions with its own position, at the token it is held at.
type Commit struct {
	// Session, if set, is the session the positions were computed for
	// (as Worker.Granted returned it): Commit refuses to send them to
	// another one. "" means the worker's current session.
	Session    string
	MaxToken   uint64
	Position   uint64
	Exceptions []BucketPosition
}

// FinalPositioner may be implemented by the Handler of a worker in a
// stream keyspace. After Release returned for a bucket the server asked
// back (a handoff, or the worker leaving), the Worker calls FinalPosition
// for it; if ok, the Release call it sends carries position as the
// bucket's final position, so the next holder starts there and a graceful
// move reprocesses nothing. position must be the position after the last
// event the handler processed for the bucket (the next event it did not
// process). It is called from the Worker's goroutines, without the
// Worker's lock; it must return at once and must not call the Worker.
//
// ok false means the handler processed none of the bucket's events (its
// Acquire failed, say): the Worker then hands the bucket over at its
// grant's From, as it does for a grant that ended before Acquire was
// called. A stream keyspace's release thus always carries a final
// position.
//
// Until the server has handed the bucket over, the Worker's later Commits
// list it as an exception at that position, so a commit's Position never
// covers a bucket the worker stopped processing.
type FinalPositioner interface {
	FinalPosition(bucket int) (position uint64, ok bool)
}

// Granted returns the worker's current session and every grant of it the
// worker knows and has not released, sorted by bucket: granted, whether
// Acquire has returned or not (Grant.From is where such a bucket
// starts), including those being handed off, not those the server took
// back. It returns "" and nil between sessions and once the session is
// fenced.
//
// Every grant the server holds for the session at a token <= the highest
// token returned is among them or was released: the server's grants
// answers are consistent, and tokens strictly increase. So a Commit whose
// MaxToken is that token, with an exception for each of these grants
// that has not reached its Position, covers nothing it should not.
func (w *Worker) Granted() (session string, grants []Grant) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.cur
	if s == nil || s.fenced {
		return "", nil
	}
	for _, gs := range w.grants {
		if gs.s == s && !(gs.ending && gs.how == endFence) {
			grants = append(grants, gs.g)
		}
	}
	slices.SortFunc(grants, func(a, b Grant) int { return a.Bucket - b.Bucket })
	return s.id, grants
}

// Hasher returns the keyspace's hasher (bucket count and hash), known
// once the worker has joined; the zero Hasher before.
func (w *Worker) Hasher() placement.Hasher {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hasher
}

// Commit records c as the session's stream positions (MemberService.Commit;
// stream keyspaces only). It makes one call, through any replica, and
// returns nil once the server applied it. A commit equal to the previous
// one succeeds, so it is safe to retry.
//
// The buckets the session handed off with a final position (see
// FinalPositioner) that the server may still hold are added to
// c.Exceptions at that position, unless c lists them itself. If the
// server then answers that a bucket is not held, Commit asks it, bucket by
// bucket, which of those it has handed over (by releasing them again at
// the same token and position, which changes nothing for one still held),
// drops those, and tries once more.
//
// Errors: an *ArgError for bad exceptions (a token 0, a negative or
// repeated bucket); ErrSessionLost if the worker has no live session or
// c.Session is not it (then nothing is sent), or if the server ended the
// session (then it also wraps ErrNotFound); ErrNotHeld if an exception
// names a bucket not held at its token; ErrBackwards if a position or
// MaxToken would go backwards; ErrInvalid for a keyspace that is not a
// stream one or a MaxToken above every token issued; ErrConflict,
// ErrUnavailable (retry). Nothing is applied when Commit fails.
func (w *Worker) Commit(ctx context.Context, c Commit) error {
	const fn = "Worker.Commit"
	exc := slices.Clone(c.Exceptions)
	slices.SortFunc(exc, func(a, b BucketPosition) int { return cmp.Compare(a.Bucket, b.Bucket) })
	for i, e := range exc {
		switch {
		case e.Bucket < 0:
			return argError(fn, "Commit.Exceptions", "bucket %d is negative", e.Bucket)
		case e.Token == 0:
			return argError(fn, "Commit.Exceptions", "bucket %d has token 0; tokens start at 1", e.Bucket)
		case i > 0 && exc[i-1].Bucket == e.Bucket:
			return argError(fn, "Commit.Exceptions", "bucket %d is listed twice", e.Bucket)
		}
	}
	w.mu.Lock()
	s := w.cur
	var finals []BucketPosition
	if s != nil && !s.fenced {
		for _, f := range s.finals {
			if _, listed := slices.BinarySearchFunc(exc, f.Bucket, func(e BucketPosition, b int) int { return cmp.Compare(e.Bucket, b) }); !listed {
				finals = append(finals, f)
			}
		}
	}
	w.mu.Unlock()
	switch {
	case s == nil || !s.valid():
		return fmt.Errorf("keyshard: commit: the worker has no live session: %w", ErrSessionLost)
	case c.Session != "" && c.Session != s.id:
		return fmt.Errorf("keyshard: commit: positions of session %s, but the worker is on session %s now: %w", c.Session, s.id, ErrSessionLost)
	}
	for probed := false; ; probed = true {
		req := &keyshardv1.CommitRequest{Session: s.id, MaxToken: c.MaxToken, Position: c.Position}
		all := append(slices.Clone(exc), finals...)
		slices.SortFunc(all, func(a, b BucketPosition) int { return cmp.Compare(a.Bucket, b.Bucket) })
		for _, e := range all {
			req.Exceptions = append(req.Exceptions, &keyshardv1.BucketPosition{Bucket: uint32(e.Bucket), Token: e.Token, Position: e.Position})
		}
		_, err := call(ctx, w.c, memberAPI.Commit, req)
		if err == nil {
			w.emit(Event{Kind: EventCommitted, Session: s.id, Commit: &Commit{Session: s.id, MaxToken: c.MaxToken, Position: c.Position, Exceptions: all}})
			return nil
		}
		err = commitError(err)
		if errors.Is(err, ErrNotHeld) && !probed && len(finals) > 0 {
			if kept, ok := w.probeFinals(ctx, s, finals); ok && len(kept) < len(finals) {
				finals = kept
				continue
			}
		}
		if errors.Is(err, ErrNotFound) {
			return fmt.Errorf("keyshard: commit: session %s ended: %w: %w", s.id, err, ErrSessionLost)
		}
		return fmt.Errorf("keyshard: commit: %w", err)
	}
}

// commitError refines a Commit answer's error: FailedPrecondition is
// ErrBackwards if the server's message says "backwards", ErrNotHeld
// otherwise.
func commitError(err error) error {
	var re *rpcError
	if !errors.As(err, &re) || re.cerr.Code() != connect.CodeFailedPrecondition || re.kind != ErrImmutable {
		return err
	}
	if strings.Contains(strings.ToLower(re.cerr.Message()), "backwards") {
		return &rpcError{kind: ErrBackwards, cerr: re.cerr}
	}
	return &rpcError{kind: ErrNotHeld, cerr: re.cerr}
}

// probeFinals finds out which of finals the server still holds for s, by
// releasing each again at its token and final position: a release the
// server has handed over answers not held. It returns those still held
// (and forgets the others), or false if it could not tell.
func (w *Worker) probeFinals(ctx context.Context, s *session, finals []BucketPosition) ([]BucketPosition, bool) {
	var kept []BucketPosition
	for _, f := range finals {
		req := &keyshardv1.ReleaseRequest{Session: s.id,
			Buckets:   []*keyshardv1.BucketGrant{{Bucket: uint32(f.Bucket), Token: f.Token}},
			Positions: []*keyshardv1.BucketPosition{{Bucket: uint32(f.Bucket), Token: f.Token, Position: f.Position}}}
		_, err := call(ctx, w.c, memberAPI.Release, req)
		switch {
		case err == nil:
			kept = append(kept, f)
			continue
		case errors.Is(err, ErrInvalid), errors.Is(err, ErrImmutable):
			// Handed over (not held), or its committed position is past
			// the final one already: no exception needed either way.
			w.mu.Lock()
			if cur, ok := s.finals[f.Bucket]; ok && cur.Token == f.Token {
				delete(s.finals, f.Bucket)
			}
			w.mu.Unlock()
		default:
			return nil, false
		}
	}
	return kept, true
}
