// Package keyshardtest is Keyshard's public test kit, named like httptest:
// a real keyshard serve, or a fake one, to test a handler, a router or a
// producer against, and the helpers that Keyshard's own tests use.
//
// NewServer runs the real server in process, with its etcd embedded in
// t.TempDir(), on loopback, and returns once it serves:
//
//	ts := keyshardtest.NewServer(t, keyshardtest.Options{
//		Keyspaces: []client.KeyspaceConfig{{Name: "rooms", Buckets: 64}},
//	})
//	w, err := client.NewWorker(ts.Client(), "rooms", client.Member{ID: "w1"}, handler)
//	go w.Run(ctx)
//	m, err := ts.WaitEpoch(ctx, "rooms", 1) // the map once a member has joined
//
// # Lifecycle
//
// A Server is ready when NewServer returns. Stop stops it as keyshard
// serve shuts down, Restart stops it and starts it again on the same data
// directory and address (clients and workers reconnect by themselves),
// and Close, registered with t.Cleanup, closes the clients from Client and
// stops it for good. A stop that does not finish within 30 s fails the
// test and lists the server's goroutines that are still running. Start is
// the same server for code that is not a test (a benchmark, a demo), and
// NewReplicas starts several replicas on one etcd.
//
// The waits follow the server instead of sleeping: WaitEpoch long-polls
// the map, WaitLeading returns when the leader's hot-key aggregation and
// tenant-pool rounds have started, and WaitHotKeyRound and
// WaitTenantPoolRound when one has finished a round, which makes a
// FakeClock (Options.Clock) drive hot keys, tenant pools, leases and
// drain timeouts step by step.
//
// # The fake server
//
// NewFake runs a fake keyshard serve instead (package clienttest, which
// it re-exports with a Client method): no etcd, ready in a millisecond,
// on a fake clock, its state scripted by the test and its faults switched
// on cue, which the real server cannot do. Use it to test what a handler
// does when keep-alives hang or fail, the session ends, releases are held
// back or the control plane is unreachable; use NewServer to test against
// the real protocol (the leader's plans, leases that expire in etcd,
// restarts).
//
//	f := keyshardtest.NewFake(t)
//	f.AddKeyspace("rooms", 64, 9*time.Second)
//	w, err := client.NewWorker(f.Client(), "rooms", client.Member{ID: "w1"}, handler)
//	go w.Run(ctx)
//	f.WaitSession(t, "rooms", "w1")
//	f.AssignAll("rooms", "w1")
//	f.SetKeepAlives(keyshardtest.KeepAliveHang)
//	f.Clock().MustBlockUntil(t, 2)     // the worker's keep-alive and fence timers
//	f.Clock().Advance(9 * time.Second) // past TTL − margin: the handler's buckets are released
//
// FakeClock drives timers by hand (BlockUntilContext and MustBlockUntil
// wait, bounded, until the code under test sleeps on it); Metric reads one
// series from a running server's /metrics; CheckPureCore asserts that a
// package is a pure core (no network, no storage clients, no clock reads,
// no goroutines), the rule that keeps placement, hotkey and the
// coordinator deterministic.
package keyshardtest
