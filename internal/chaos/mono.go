package chaos

import "golang.org/x/sys/unix"

// MonoNow returns the machine's monotonic clock (CLOCK_MONOTONIC) in
// nanoseconds. Unlike the monotonic reading of time.Now, it is the same
// clock in every process of the machine, whatever their language, so
// that the records of two workers can be compared directly: a handoff
// from the old owner's release to the new owner's acquire, say, without
// the time their reports took to reach the sink.
func MonoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0 // no such clock: the record has no Mono
	}
	return ts.Nano()
}
