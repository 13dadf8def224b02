package faulttest

import (
	"testing"

	"github.com/keyshard/keyshard/internal/chaos"
)

// The record, its kinds and the checker are internal/chaos's.
type (
	record      = chaos.Record
	bucketToken = chaos.BucketToken
)

const (
	kindAcquire   = chaos.KindAcquire
	kindReleasing = chaos.KindReleasing
	kindRelease   = chaos.KindRelease
	kindWrite     = chaos.KindWrite
	kindJoined    = chaos.KindJoined
	kindFenced    = chaos.KindFenced
	kindRejoined  = chaos.KindRejoined
	faultStop     = chaos.FaultStop
	faultCont     = chaos.FaultCont
	faultKill     = chaos.FaultKill
	note          = chaos.Note
)

// sink is the fenced sink (chaos.Sink) of one test, closed in t.Cleanup.
type sink struct{ *chaos.Sink }

func newSink(t *testing.T) *sink {
	s, err := chaos.NewSink("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() }) // registered first: runs after every child process is gone
	return &sink{s}
}

func (s *sink) mark(kind, worker, what string) int { return s.Mark(kind, worker, what) }
func (s *sink) seq() int                           { return s.Seq() }
func (s *sink) held(worker string) map[int]uint64  { return s.Held(worker) }
func (s *sink) records() []record                  { return s.Records() }

// checkHistory returns every violation chaos.Check finds in recs.
func checkHistory(recs []record) []string {
	var out []string
	for _, v := range chaos.Check(recs) {
		out = append(out, v.Msg)
	}
	return out
}
