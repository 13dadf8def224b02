package client

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
)

// finalHandler acquires at once, reports each Acquire, and gives a final
// position per bucket.
type finalHandler struct {
	acquired chan Grant
	mu       sync.Mutex
	final    map[int]uint64
}

func (h *finalHandler) Acquire(_ context.Context, g Grant) error { h.acquired <- g; return nil }
func (h *finalHandler) Release(context.Context, int) error       { return nil }
func (h *finalHandler) FinalPosition(b int) (uint64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p, ok := h.final[b]
	return p, ok
}

func streamFake(t *testing.T) fake {
	f := newFake(t)
	f.PutKeyspace(&keyshardv1.Keyspace{Name: "events", Buckets: 8, LeaseTtl: durationpb.New(testTTL), Mode: keyshardv1.KeyspaceMode_KEYSPACE_MODE_STREAM})
	return f
}

// TestWorkerCommit: grants carry their from; Commit sends the positions
// and maps the server's refusals; a handoff's Release carries the
// handler's final position, and a later Commit lists it until the server
// says the bucket was handed over.
func TestWorkerCommit(t *testing.T) {
	f := streamFake(t)
	c := f.dial(t)
	h := &finalHandler{acquired: make(chan Grant, 16), final: map[int]uint64{0: 77}}
	released, recorded, committed := make(chan Event, 16), make(chan Event, 16), make(chan Event, 64)
	w, err := NewWorker(c, "events", Member{ID: "w1"}, h, OnEvent(func(ev Event) {
		switch ev.Kind {
		case EventReleased:
			released <- ev
		case EventReleaseRecorded:
			recorded <- ev
		case EventCommitted:
			committed <- ev
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(t.Context(), Commit{}); !errors.Is(err, ErrSessionLost) {
		t.Errorf("Commit before Run = %v, want ErrSessionLost", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- w.Run(t.Context()) }() // exits on Close
	sid := f.WaitSession(t, "events", "w1")
	tok0 := f.GrantFrom(sid, 0, 20)
	if g := recv(t, h.acquired, "Acquire"); g.Bucket != 0 || g.Token != tok0 || g.From != 20 {
		t.Errorf("Acquire(%+v), want bucket 0 at token %d from 20", plain(g), tok0)
	}
	if s, gs := w.Granted(); s != sid || len(gs) != 1 || gs[0].From != 20 {
		t.Errorf("Granted = %q, %+v; want %q and bucket 0 from 20", s, gs, sid)
	}
	ctx := t.Context()
	if err := w.Commit(ctx, Commit{Session: sid, MaxToken: tok0, Position: 50}); err != nil {
		t.Fatalf("Commit = %v", err)
	}
	if got := f.Positions(sid)[0]; got != 50 {
		t.Errorf("bucket 0 at %d after the commit, want 50", got)
	}
	if ev := recv(t, committed, "EventCommitted"); ev.Commit == nil || ev.Commit.Position != 50 || ev.Commit.MaxToken != tok0 || ev.Commit.Session != sid {
		t.Errorf("EventCommitted with %+v, want position 50, max token %d, session %s", ev.Commit, tok0, sid)
	}
	for _, tc := range []struct {
		name string
		c    Commit
		want error
	}{
		{"backwards", Commit{MaxToken: tok0, Position: 40}, ErrBackwards},
		{"max token backwards", Commit{MaxToken: 0, Position: 60}, ErrBackwards},
		{"not held", Commit{MaxToken: tok0, Position: 60, Exceptions: []BucketPosition{{Bucket: 3, Token: tok0, Position: 1}}}, ErrNotHeld},
		{"token 0", Commit{MaxToken: tok0, Position: 60, Exceptions: []BucketPosition{{Bucket: 0, Position: 1}}}, ErrInvalid},
		{"twice", Commit{Exceptions: []BucketPosition{{Bucket: 0, Token: 1}, {Bucket: 0, Token: 1}}}, ErrInvalid},
		{"max token not issued", Commit{MaxToken: tok0 + 100, Position: 60}, ErrInvalid},
		{"other session", Commit{Session: "s99", MaxToken: tok0, Position: 60}, ErrSessionLost},
	} {
		if err := w.Commit(ctx, tc.c); !errors.Is(err, tc.want) {
			t.Errorf("%s: Commit = %v, want %v", tc.name, err, tc.want)
		}
	}
	if got := f.Positions(sid)[0]; got != 50 {
		t.Errorf("bucket 0 at %d after refused commits, want 50", got)
	}

	// A handoff: the Release carries the final position.
	for f.Releases().Len() > 0 {
		f.Releases().Next(t)
	}
	f.AskRelease(sid, 0)
	rel := f.Releases().Next(t)
	if ps := rel.GetPositions(); len(ps) != 1 || ps[0].GetBucket() != 0 || ps[0].GetToken() != tok0 || ps[0].GetPosition() != 77 {
		t.Errorf("Release positions = %v, want bucket 0 at token %d: 77", ps, tok0)
	}
	if ev := recv(t, released, "EventReleased"); ev.Grant.Bucket != 0 || ev.Final == nil || *ev.Final != 77 {
		t.Errorf("EventReleased for bucket %d with Final %v, want bucket 0 and 77", ev.Grant.Bucket, ev.Final)
	}
	if ev := recv(t, recorded, "EventReleaseRecorded"); ev.Grant.Bucket != 0 || ev.Grant.Token != tok0 || ev.Final == nil || *ev.Final != 77 {
		t.Errorf("EventReleaseRecorded for bucket %d at %d with Final %v, want bucket 0 at %d and 77", ev.Grant.Bucket, ev.Grant.Token, ev.Final, tok0)
	}
	f.WaitFor(t, "the release", func() bool { return len(f.Grants(sid)) == 0 })

	// A bucket whose handler has no final position (it handled none of
	// it) is handed over at its grant's from, never without a position:
	// a later commit's default would move it.
	tok2 := f.GrantFrom(sid, 2, 33)
	recv(t, h.acquired, "Acquire")
	f.AskRelease(sid, 2)
	rel = f.Releases().Next(t)
	if ps := rel.GetPositions(); len(ps) != 1 || ps[0].GetBucket() != 2 || ps[0].GetToken() != tok2 || ps[0].GetPosition() != 33 {
		t.Errorf("Release positions = %v, want bucket 2 at token %d: 33, its from", ps, tok2)
	}
	if ev := recv(t, released, "EventReleased"); ev.Grant.Bucket != 2 || ev.Final == nil || *ev.Final != 33 {
		t.Errorf("EventReleased for bucket %d with Final %v, want bucket 2 and 33", ev.Grant.Bucket, ev.Final)
	}
	f.WaitFor(t, "the release", func() bool { return len(f.Grants(sid)) == 0 })
	if got := f.BucketPosition("events", 0); got != 77 {
		t.Errorf("bucket 0's position after the release = %d, want 77", got)
	}
	// The next commit lists bucket 0 at 77; the fake handed it over at
	// once, so the Worker finds that out and commits without it.
	tok1 := f.GrantFrom(sid, 1, 60)
	recv(t, h.acquired, "Acquire")
	if err := w.Commit(ctx, Commit{MaxToken: tok1, Position: 60}); err != nil {
		t.Fatalf("Commit after the handoff = %v", err)
	}
	for {
		r := f.Commits().Next(t)
		if len(r.GetExceptions()) == 0 && r.GetPosition() == 60 {
			break // the retry
		}
	}
	if lc := f.LastCommit(sid); lc.GetPosition() != 60 || len(lc.GetExceptions()) != 0 {
		t.Errorf("last commit = %v, want position 60 and no exception", lc)
	}

	// The server ends the session: the commit fails with ErrSessionLost.
	f.EndSession(sid)
	if err := w.Commit(ctx, Commit{MaxToken: tok1, Position: 70}); !errors.Is(err, ErrSessionLost) {
		t.Errorf("Commit after the session ended = %v, want ErrSessionLost", err)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	w.Close(cctx)
	if err := <-errc; err != nil {
		t.Errorf("Run = %v", err)
	}
}

// TestCommitErrorMapping: FAILED_PRECONDITION answering Commit is
// ErrBackwards when the server says "backwards", else ErrNotHeld.
func TestCommitErrorMapping(t *testing.T) {
	f := streamFake(t)
	f.PutKeyspace(&keyshardv1.Keyspace{Name: "plain", Buckets: 8, LeaseTtl: durationpb.New(testTTL)})
	c := f.dial(t)
	h := &finalHandler{acquired: make(chan Grant, 16)}
	w, err := NewWorker(c, "plain", Member{ID: "w1"}, h)
	if err != nil {
		t.Fatal(err)
	}
	go w.Run(t.Context()) // exits when the test's context ends
	f.WaitSession(t, "plain", "w1")
	f.KeepAlives().Next(t) // sent once the worker is on its session
	if err := w.Commit(t.Context(), Commit{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Commit in an exclusive keyspace = %v, want ErrInvalid", err)
	}
}
