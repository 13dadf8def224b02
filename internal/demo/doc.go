// Package demo is `keyshard demo`: an embedded Keyshard server, in-process
// workers that join, leave gracefully and crash on a schedule, and a router
// sending keyed events to their owners. It narrates what happens, then
// checks its own record: no two grants of one bucket overlapped, fencing
// tokens increased, every event was processed exactly by its bucket's
// holder, and every change moved the optimal number of buckets.
//
//	rep, err := demo.Run(ctx, demo.Options{Duration: 30 * time.Second, Out: os.Stderr})
//	// rep.OK, rep.HandoffP99Ms, ...
//
// Run owns every goroutine it starts and returns after they all exited.
package demo
