// Package keyshardtest is Keyshard's public test kit, named like httptest:
// helpers that Keyshard's own tests use and that applications can use to
// test their code against Keyshard.
//
// CheckPureCore asserts that a package is a pure core (no network, no
// storage clients, no clock reads, no goroutines), the rule that keeps
// placement, hotkey and the coordinator deterministic.
//
// FakeClock drives timers by hand (BlockUntilContext and MustBlockUntil
// wait, bounded, until the code under test sleeps on it), and Metric
// reads one series from a running keyshard serve's /metrics.
package keyshardtest
