// Package streamcheck checks the record of a run of stream workers against
// stream mode's guarantees. `keyshard demo --mode stream` and the
// randomized stream tests record what their workers did through a
// Recorder — grants with their from position, every record handled,
// acknowledged commits, releases with their final position, crashes —
// and Check compares it with the stream that was produced:
//
//   - every event below the end position was handled at least once, by a
//     holder of its key's bucket, at or after the holder's from;
//   - within each holder's tenure, each key's events were handled in
//     stream order, none twice;
//   - an event handled again by a later holder follows a crash, never a
//     graceful release, and lies at or after the crashed holder's last
//     acknowledged commit for that bucket;
//   - a bucket's next holder starts at or after the previous holder's last
//     acknowledged commit (positions never go backwards), and exactly at
//     the final position handed over by a graceful release.
//
// The package is pure: no IO, no clock, no goroutines.
//
//	rec := streamcheck.NewRecorder()
//	rec.Acquire("w1", 7, 12, 0)       // bucket 7, token 12, from 0
//	rec.Handle("w1", 7, 12, 40, "k")  // event at position 40, key "k"
//	rec.Commit("w1", 12, 41, nil)     // acknowledged: max token 12, position 41
//	rec.Release("w1", 7, 12, 41)      // graceful, final position 41
//	rep := streamcheck.Check(events, rec, 100)
package streamcheck
