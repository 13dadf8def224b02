// Package clienttest is a fake keyshard serve for testing code built on
// the Go SDK (package client), named like net/http/httptest: a real HTTP
// server on loopback that speaks keyshard.v1, whose state the test
// scripts and whose faults it switches on and off, on a fake clock.
//
// It is for what the real server (keyshardtest.NewServer, which runs
// keyshard serve with an embedded etcd) cannot be made to do on cue:
// keep-alives that hang or fail at the moment the test chooses, a session
// that ends, releases held back, a replica that pauses, a control plane
// cut off from etcd. It starts in a millisecond, needs no etcd and no
// disk, and everything that waits (long polls, delays) waits on the fake
// clock, so a test advances time instead of sleeping. It plans nothing:
// the test says who owns what (Assign, or SetMap and Grant).
//
//	f := clienttest.NewServer(t, clienttest.Options{})
//	f.AddKeyspace("rooms", 64, 9*time.Second)
//	c, err := client.Dial(f.URL(), client.Clock(f.Clock()))
//	...
//	w, err := client.NewWorker(c, "rooms", client.Member{ID: "w1"}, handler)
//	go w.Run(ctx)
//	f.WaitSession(t, "rooms", "w1")    // the worker joined
//	f.AssignAll("rooms", "w1")         // it owns every bucket
//	f.SetKeepAlives(clienttest.KeepAliveHang)
//	f.Clock().MustBlockUntil(t, 2)     // its keep-alive and fence timers are set
//	f.Clock().Advance(9 * time.Second) // past TTL − margin: it fences itself
//
// keyshardtest.NewFake is the same fake with a Client method that dials
// it, for tests that import the kit and not this package.
//
// # Lifecycle
//
// NewServer returns the fake serving, with no keyspace, and registers
// Close with t.Cleanup; Start does the same for code that is not a test,
// which closes it. Close ends every call the fake holds and waits for its
// handlers. AddReplica adds more URLs in front of the same state.
//
// # Scripting
//
// Keyspaces: AddKeyspace (or PutKeyspace for any field). Maps: SetMap
// publishes the next epoch as routers see it; Assign publishes it naming
// the joined members and moves the grants to match (a bucket another
// session holds is asked back and granted once released); AssignAll
// gives one member everything. Sessions are created by the workers'
// Joins (Session and WaitSession find a member's); Grant, AskRelease,
// Revoke and EndSession script single changes, and Grants, Live and
// LeaseExpiry read the fake's side. Hot keys: AddHotKeyPool,
// SetOverflow, PutOverflowSet. Tenant pools: PutTenantPool, and
// SetPoolSnapshot publishes a pool's next snapshot whole (the fake
// streams followers the tenants that changed); PoolLoad reads what the
// load reports counted (a replayed seq is not counted again),
// PoolSessions and ReadyTenants the members' side; EndPoolSession,
// LoseReportAnswers, SetPoolsUnavailable and HoldPools are its faults. The admin API works on the same state:
// CreateKeyspace, ListMembers and Status answer from it, DrainMember and
// Leave ask for a member's buckets (they stay asked back until released,
// whatever the last Assign named them, and the member is granted nothing
// more).
//
// # Stream keyspaces
//
// In a stream keyspace (PutKeyspace with KEYSPACE_MODE_STREAM) grants
// carry the bucket's position as from (SetBucketPosition, or GrantFrom
// for one grant). Commit is served with keyshard serve's checks (not held
// and backwards are failed_precondition, backwards saying so); LastCommit,
// Positions and BucketPosition read the result. A Release's final
// positions are checked and folded into the keyspace's positions at once:
// the fake hands a released bucket over at the Release itself.
//
// # Faults
//
// SetKeepAlives makes keep-alives fail, hang, or answer not_found (the
// session is gone); DelayKeepAlives and DelayJoins answer after fake
// time; HoldKeepAlives, HoldReleases and HoldHotKeys return a Gate that
// the test opens one call at a time or all at once (left shut, it plays a
// server that never answers); HangJoins; StallLeaves.
// SetUnavailable cuts the whole control plane off (every call fails with
// code unavailable and open streams end) until it is set back;
// SetHotKeysUnavailable does that to the hot-key service alone;
// EndStreams ends the streams open now, as a proxy that cuts them does.
// The keep-alive faults answer a keep-alive whether it comes as a
// KeepAlive call, on a Session stream or, one session at a time, on a
// Sessions stream (a failure there is answered on the stream). Fail and
// FailNext make the calls of any procedure fail with any error (a
// stream unimplemented, a refused admin call). A Replica can Pause (hold
// new calls) or Refuse (answer unavailable).
//
// # Observations
//
// Joins, KeepAlives, Releases, Commits, Leaves, GrantPolls, MapPolls, MapWatches,
// SessionStreams, SessionsStreams, SessionsMessages, Reports, SetPolls
// and SetWatches record the requests received, in order, for the test to
// take with Next (or Wait); nothing is dropped. CallCount counts any
// procedure's calls; StreamKeepAlives counts the keep-alives of Session
// streams and the renewals of Sessions streams (one per session a
// keep-alive lists), which KeepAlives records with the KeepAlive calls. Delays says when a delayed
// answer's timer is set, and WaitFor waits for a condition on the fake's
// state. Together with the fake clock's BlockUntilContext and
// MustBlockUntil they replace every sleep: a test waits for what it
// expects, then advances the clock.
//
// Keyshard's own SDK tests use this package; it depends on nothing but
// the API, connect, protobuf and the clock, so that package client's
// tests can import it.
package clienttest
