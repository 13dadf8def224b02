package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
)

// TestLoadReporterFlush: Flush sends the counts at once, without waiting
// for the interval, and returns once the control plane took them; a
// report whose answer was lost is retried after a backoff with the same
// seq (a replay, counted once); when ctx ends first the counts stay
// pending for the next attempt; a refused report is dropped and said so;
// a failure retrying cannot fix returns at once; after Close, ErrClosed.
func TestLoadReporterFlush(t *testing.T) {
	fk := newFake(t)
	fk.PutTenantPool("gw", nil, 0)
	c := fk.dial(t)
	// The interval never passes: only Flush sends.
	events := make(chan PoolEvent, 16)
	r, err := c.NewLoadReporter("gw", "r1", ReportInterval(time.Hour), OnPoolEvent(func(e PoolEvent) { events <- e }))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	r.Add("a", 3)
	r.Add("b", 1)
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := fk.PoolLoad("gw"); got["a"] != 3 || got["b"] != 1 {
		t.Fatalf("counted %v after Flush; want a=3 b=1", got)
	}
	if st := r.Stats(); st.Reports != 1 || st.Seq != 1 || st.Pending != 0 {
		t.Fatalf("stats %+v; want one report, seq 1, nothing pending", st)
	}
	fk.LoadReports().Next(t)
	if err := r.Flush(ctx); err != nil || fk.LoadReports().Len() != 0 {
		t.Fatalf("Flush with nothing counted: %v, %d reports sent; want nil and no call", err, fk.LoadReports().Len())
	}

	// The answer is lost: Flush waits a backoff and sends seq 2 again,
	// with the same period: the 1.5s since the previous Flush.
	fk.Clock().Advance(1500 * time.Millisecond)
	r.Add("a", 5)
	fk.LoseReportAnswers(1)
	done := make(chan error, 1)
	go func() { done <- r.Flush(ctx) }()
	if rep := fk.LoadReports().Next(t); rep.GetSeq() != 2 || rep.GetPeriod().AsDuration() != 1500*time.Millisecond {
		t.Fatalf("seq %d, period %v; want 2, 1.5s", rep.GetSeq(), rep.GetPeriod().AsDuration())
	}
	if e := reported(t, events, 2); !errors.Is(e.Err, ErrUnavailable) {
		t.Fatalf("report 2: %v; want ErrUnavailable (the answer lost)", e.Err)
	}
	fk.Clock().MustBlockUntil(t, 2) // the interval and Flush's backoff
	select {
	case err := <-done:
		t.Fatalf("Flush returned %v before the lost report was answered", err)
	default:
	}
	fk.Clock().Advance(backoffCap)
	if rep := fk.LoadReports().Next(t); rep.GetSeq() != 2 || rep.GetPeriod().AsDuration() != 1500*time.Millisecond {
		t.Fatalf("retry with seq %d, period %v; want 2, 1.5s", rep.GetSeq(), rep.GetPeriod().AsDuration())
	}
	if err := recv(t, done, "Flush"); err != nil {
		t.Fatal(err)
	}
	if got := fk.PoolLoad("gw"); got["a"] != 8 {
		t.Fatalf("counted a=%d; want 8 (the replay counted once)", got["a"])
	}
	if st := r.Stats(); st.Replayed != 1 || st.Failures != 1 || st.Pending != 0 {
		t.Fatalf("stats %+v; want 1 replayed, 1 failure, nothing pending", st)
	}

	// Unreachable until ctx ends: the counts stay pending, and the next
	// Flush sends them with the same seq.
	fk.SetUnavailable(true)
	r.Add("c", 7)
	cctx, cancel := context.WithCancel(ctx)
	go func() { done <- r.Flush(cctx) }()
	if e := reported(t, events, 3); !errors.Is(e.Err, ErrUnavailable) {
		t.Fatalf("report 3: %v; want ErrUnavailable", e.Err)
	}
	fk.Clock().MustBlockUntil(t, 2) // the interval and Flush's backoff
	cancel()
	if err := recv(t, done, "Flush"); !errors.Is(err, context.Canceled) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Flush with the control plane down: %v; want context.Canceled with the last failure, ErrUnavailable", err)
	}
	if st := r.Stats(); st.Pending != 1 || st.DroppedCounts != 0 || st.Seq != 3 {
		t.Fatalf("stats %+v; want report 3 pending, nothing dropped", st)
	}
	fk.SetUnavailable(false)
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := fk.PoolLoad("gw"); got["c"] != 7 {
		t.Fatalf("counted c=%d; want 7", got["c"])
	}
	if st := r.Stats(); st.Seq != 3 || st.Pending != 0 {
		t.Fatalf("stats %+v; want seq 3 sent, nothing pending", st)
	}

	// Refused: dropped, and Flush says so.
	r.Add("d", 4)
	fk.FailNext(keyshardv1connect.TenantPoolServiceReportLoadProcedure, 1, connect.NewError(connect.CodeInvalidArgument, errors.New("counts[0]: bad")))
	if err := r.Flush(ctx); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Flush of a refused report: %v; want ErrInvalid", err)
	}
	if st := r.Stats(); st.DroppedCounts != 4 || st.Pending != 0 {
		t.Fatalf("stats %+v; want 4 counts dropped", st)
	}

	// Not found: no use retrying; returned at once, the report kept.
	r.Add("e", 2)
	fk.FailNext(keyshardv1connect.TenantPoolServiceReportLoadProcedure, 1, connect.NewError(connect.CodeNotFound, errors.New("no pool gw")))
	if err := r.Flush(ctx); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Flush to a missing pool: %v; want ErrNotFound", err)
	}
	if st := r.Stats(); st.Pending != 1 {
		t.Fatalf("stats %+v; want the report pending", st)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if got := fk.PoolLoad("gw"); got["e"] != 2 {
		t.Fatalf("counted e=%d after Close; want 2", got["e"])
	}
	if err := r.Flush(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Flush after Close: %v; want ErrClosed", err)
	}
}
