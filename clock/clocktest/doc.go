// Package clocktest provides Fake, a clock.Clock that moves only when a
// test advances it, so that timeouts, keep-alives and fencing deadlines
// are tested without sleeping.
//
// BlockUntilContext and MustBlockUntil wait, bounded, until the code under
// test sleeps on the clock, the explicit synchronisation that replaces a
// sleep in a test. Keyshard's SDK tests and the public test kit
// (keyshardtest) use it; it has no dependency outside the standard library
// and package clock.
package clocktest
