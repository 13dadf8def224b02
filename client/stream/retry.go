package stream

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// ErrTransient marks an error of Reader.Read that reading again may fix:
// a broker in a leader election, a connection that broke, a request that
// timed out, a database failing over. A Consumer (and so a Worker) that
// gets a Read error wrapping it backs off and reads again, with no limit
// on the number of tries; any other Read error stops Run. A Reader says
// an error is transient by wrapping it with Transient, or with
// fmt.Errorf("...: %w: %w", ErrTransient, err); test with errors.Is.
//
// Only a Read error counts: an error of the handle function stops Run
// whatever it wraps, because the record it failed on has been taken from
// the stream.
var ErrTransient = errors.New("stream: transient read error")

// Transient returns err marked as transient: errors.Is(result,
// ErrTransient) holds, errors.Is and errors.As still find what err
// wraps, and its message is err's. Transient(nil) is nil.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &transientError{err}
}

type transientError struct{ err error }

func (e *transientError) Error() string   { return e.err.Error() }
func (e *transientError) Unwrap() []error { return []error{ErrTransient, e.err} }

// Defaults of Retry.
const (
	DefaultRetryDelay    = 100 * time.Millisecond
	DefaultMaxRetryDelay = 10 * time.Second
)

// Retry is how a Consumer waits before reading again after a transient
// Read error (ErrTransient): capped exponential backoff. The n-th failure
// in a row waits a time drawn uniformly in [d/2, d), d = min(Max,
// Delay·2ⁿ⁻¹), so that workers reading one stream do not all come back at
// once. A streak of failures never ends Run: once it reaches the cap the
// Consumer reads again every Max/2 to Max for as long as the failures
// last, counting each (ConsumerStats) and logging each at warn level.
// The zero value takes the defaults.
type Retry struct {
	// Delay is the longest wait after a first failure; 0 means
	// DefaultRetryDelay.
	Delay time.Duration
	// Max caps the wait; 0 means DefaultMaxRetryDelay, or Delay if that
	// is longer.
	Max time.Duration
}

// withDefaults returns r with its defaults, or the *client.ArgError bad
// makes for a bad field, named with prefix.
func (r Retry) withDefaults(bad func(arg, reason string) error, prefix string) (Retry, error) {
	switch {
	case r.Delay < 0:
		return r, bad(prefix+"Delay", fmt.Sprintf("%v is negative", r.Delay))
	case r.Max < 0:
		return r, bad(prefix+"Max", fmt.Sprintf("%v is negative", r.Max))
	case r.Max > 0 && r.Delay > r.Max:
		return r, bad(prefix+"Max", fmt.Sprintf("%v is shorter than Delay (%v)", r.Max, r.Delay))
	}
	if r.Delay == 0 {
		r.Delay = DefaultRetryDelay
		if r.Max > 0 {
			r.Delay = min(r.Delay, r.Max)
		}
	}
	if r.Max == 0 {
		r.Max = max(DefaultMaxRetryDelay, r.Delay)
	}
	return r, nil
}

// wait returns how long to wait after the n-th failure in a row (n >= 1).
func (r Retry) wait(n int) time.Duration {
	d := r.Delay
	for i := 1; i < n && d < r.Max; i++ {
		d *= 2
	}
	d = min(d, r.Max)
	if d < 2 {
		return d
	}
	return d/2 + rand.N(d/2)
}

// ConsumerStats are a Consumer's counters of transient Read errors.
type ConsumerStats struct {
	// ReadRetries counts the Reads that failed with a transient error and
	// were tried again, since the Consumer was made.
	ReadRetries uint64
	// Streak is how many Reads in a row have failed with a transient
	// error; 0 once a Read succeeds. A streak that keeps growing is a
	// stream the worker cannot read, and handles nothing of.
	Streak int
	// FailingSince is when the current streak began (zero without one).
	FailingSince time.Time
	// LastError is the last transient Read error, kept after the streak
	// ends (nil if there was none).
	LastError error
}
