package keyshardtest

import (
	"time"

	"github.com/keyshard/keyshard/clock/clocktest"
)

// FakeClock is clocktest.Fake, re-exported so that a test of a handler
// needs one import for the server, the fake and the clock.
type FakeClock = clocktest.Fake

// NewFakeClock returns a FakeClock at start.
func NewFakeClock(start time.Time) *FakeClock { return clocktest.NewFake(start) }
