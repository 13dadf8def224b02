// Package client is Keyshard's Go SDK: workers that own buckets of keys,
// routers that find a key's owner in nanoseconds, producers' part in
// cluster-wide hot-key detection, and the admin API.
//
// # Connecting
//
// Dial returns a Client for one server URL, or for several replicas'
// URLs separated by commas. It does no IO; the four services of
// keyshard.v1 are called over the Connect protocol (HTTP/1.1 or HTTP/2),
// or gRPC with the GRPC option.
//
//	c, err := client.Dial("http://ks-1:7400,http://ks-2:7400", client.Token(os.Getenv("KEYSHARD_TOKEN")))
//	if err != nil { ... }       // errors.Is(err, client.ErrInvalid): a bad URL
//	defer c.Close()
//
// With several replicas, a call moves on to the next replica when one
// answers Unavailable, fails in transport, or does not answer within
// ReplicaTimeout; streams follow. Over HTTP/2 a Worker's grants and
// keep-alives ride one Session stream (see Worker); a process that runs
// many Workers on one Client can have them share one stream per replica
// instead, with their keep-alives batched (SharedSessionStreams). Give
// workers every replica's URL (at least two): a session is valid through
// any replica, and a worker whose only replica is paused or cut off from
// etcd cannot renew its lease.
//
// # Workers
//
// A Worker joins a keyspace as a member and calls a Handler as buckets are
// granted to it (Acquire) and taken back (Release):
//
//	type rooms struct{ db *sql.DB }
//
//	func (r *rooms) Acquire(ctx context.Context, g client.Grant) error {
//		// Load state for bucket g.Bucket; keep g.Token for writes. ctx is
//		// cancelled when the grant ends.
//		return nil
//	}
//
//	func (r *rooms) Release(ctx context.Context, bucket int) error {
//		// Finish in-flight work of the bucket, then return.
//		return nil
//	}
//
//	w, err := client.NewWorker(c, "rooms", client.Member{ID: "writer-1", Address: "10.0.0.7:8080"}, &rooms{db})
//	if err != nil { ... }              // an *ArgError: a bad argument or option; nothing was sent
//	go func() { errc <- w.Run(ctx) }() // joins, keeps the session alive, re-joins after a loss
//	...
//	err := w.Close(shutdownCtx) // leave: hand every bucket over, then stop
//
// A request for a key that reaches the wrong worker is answered with the
// owner's name, so the caller can retry there:
//
//	g, err := w.Owns(roomID)
//	if err != nil {
//		return nil, client.WrongOwner(err) // FailedPrecondition + WrongOwner detail
//	}
//	// serve the request using g.Token
//
// # Lifecycle
//
// Worker, Router and HotKeys have one shape. Their constructors (NewWorker,
// NewRouter, NewHotKeys) check every argument and option, do no IO and
// start no goroutine; a bad one is an *ArgError. Run(ctx) does the work:
// it blocks until ctx ends (returning ctx.Err()), Close (returning nil) or
// the Client's Close (returning ErrClosed), retries what may pass, and
// returns early only with an error that retrying cannot fix. Run may be
// called once. A Router also has Start, for callers that want it running
// in the background once it has the map. Close stops the type and waits
// until every goroutine it started has exited; it is idempotent, and may
// be called without Run, which then returns ErrClosed. Worker.Close takes
// a ctx because it drains first: it hands every bucket over before it
// stops.
//
// # Threading contract
//
// Handler.Acquire and Handler.Release are never called concurrently for
// the same bucket; calls for different buckets run concurrently. For one
// bucket they alternate, each starting after the previous returned, across
// handoffs, self-fences and re-joins. Run owns every goroutine of a Worker
// and returns only after all exited; Close is idempotent and blocks until
// then. OnEvent callbacks are serialized and must not block. Router,
// Worker and Client methods are safe for concurrent use.
//
// # Fencing tokens: a lease is not a lock
//
// A worker stops acting on its buckets before its lease can expire at the
// server: it records when each keep-alive was sent and, once the newest
// acknowledged send plus the lease TTL minus a margin (the fence
// deadline) has passed, cancels every grant's context and calls Release
// (it "self-fences"). Every validity check compares the clock with that
// deadline, so a process resumed after a pause past it is told at once,
// before any of its timers has run: Grant.Valid reports false, Owns
// refuses, and the grant context's Err cancels it. Check right before
// acting:
//
//	if !g.Valid() { return errStale } // or ctx.Err() != nil for the grant's ctx
//	// g.Deadline() is the latest a write begun now may end
//
// That keeps well-behaved processes apart, but it cannot stop a process
// that was paused between checking its grant and writing. Only the
// resource can: every grant carries a fencing token that
// strictly increases per bucket, and storage must refuse a write that
// carries a smaller token than one it has already seen. In Postgres, keep
// the token next to the data and make every write conditional on it:
//
//	UPDATE rooms SET state = $state, fence = $token
//	 WHERE id = $room AND fence <= $token
//
// and treat "0 rows updated" as "I am no longer the owner": stop working
// on the bucket. Checkpoints (stream positions, Kafka offsets) need the
// same guard, or a stale owner's commit can overwrite its successor's.
//
// # Stream keyspaces
//
// In a stream keyspace each bucket also has a committed position in one
// shared, ordered stream. A grant carries it (Grant.From: read the
// bucket's events from there). Worker.Commit records the worker's
// positions in one small write however many buckets it holds: a default
// Position for every bucket held at a token <= MaxToken, plus Exceptions
// for buckets that are behind or ahead; Worker.Granted gives the grants
// to compute it from (those whose Acquire has not returned included, at
// their From). A Handler that also implements FinalPositioner hands each
// released bucket's final position over with its Release, so a graceful
// move reprocesses nothing; until the server has handed the bucket over,
// Commit lists it at that position by itself. Commit's refusals are
// ErrNotHeld (an exception for a bucket not held at its token) and
// ErrBackwards; a session that ended is ErrSessionLost. Package
// client/stream builds a whole stream worker on this (stream.NewWorker):
// the user writes a Reader and a record handler.
//
// # Routers
//
// A Router keeps a keyspace's map current in the background (WatchMap,
// falling back to GetMap long polls) and answers lookups from memory.
// Start runs it on a goroutine of its own and returns once it has the map;
// ctx bounds only that wait:
//
//	r, err := client.NewRouter(c, "rooms") // checks the name; no IO
//	if err != nil { ... }
//	defer r.Close()
//	if err := r.Start(ctx); err != nil { ... } // errors.Is(err, client.ErrNotFound): no such keyspace
//	member, ok := r.OwnerString(roomID)        // ok is false while the bucket is unassigned
//	addr := r.Address(member)
//
// Or run it in your own goroutine (an errgroup, say) with Run, which
// blocks until ctx ends or Close, and wait for the map with WaitReady.
//
// On a *WrongOwnerError from a worker (AsWrongOwner), wait for the map
// named in it with WaitEpoch and retry.
//
// # Hot keys
//
// A producer that detects hot keys locally (hotkey.Policy) takes part in
// cluster-wide detection with a HotKeys: every Interval it reports its
// keys at or above the pool's report threshold, and it follows the pool's
// cluster-wide overflow set, which the control plane's leader computes
// from every producer's reports (hotkey.Aggregate):
//
//	hk, err := client.NewHotKeys(c, client.HotKeysConfig{
//		Pool: "events", Producer: hostname + "/ingest",
//		Report: func(now time.Time, minRate float64) []hotkey.KeyRate {
//			mu.Lock(); defer mu.Unlock() // the lock the policy decides under
//			... policy.Detector().AppendAbove(nil, minRate, now) ...
//		},
//		OnSet: func(s hotkey.OverflowSet) {
//			mu.Lock(); defer mu.Unlock()
//			policy.SetClusterKeys(s.Keys())
//		},
//	})
//	if err != nil { ... }  // an *ArgError naming the field
//	defer hk.Close()       // stops Run and waits for its goroutines
//	go hk.Run(ctx)         // until ctx ends or Close
//
// It fails open: an unreachable control plane or an unknown pool never
// clears the set in force; HotKeys logs what to do, retries with backoff
// and counts failures (Stats). Package kafka's Router does all of this
// itself when given kafka.Config.ClusterHotKeys.
//
// # Tenant pools
//
// A tenant pool serves each tenant from a subset of its members, sized by
// the control plane's leader from the tenant's own load. Three parts:
//
//	f, err := c.FollowPool(ctx, "index-gateways") // a client: where to read a tenant
//	targets := f.Targets(tenant)                  // sorted members; no allocation
//
//	m, err := c.JoinPool(ctx, "index-gateways", client.Member{ID: id, Address: addr, Zone: zone})
//	for _, t := range m.Tenants() { prefetch(t) } // a server: what to load
//	_, err = m.MarkReady(ctx, loaded...)          // read me before the warm-up ends
//	// at shutdown: drain (read targets until the lookback ends), then end the session
//	lctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
//	err = m.Leave(lctx) // ctx's error if it had to end early: reads may miss
//	cancel()
//
//	r, err := c.NewLoadReporter("index-gateways", hostname)
//	r.Add(tenant, 1) // per request, where requests enter; cheap from any goroutine
//	defer r.Close()  // sends what is left
//
// A PoolFollower answers from its local copy of the pool's snapshot: a
// tenant the snapshot does not list gets placement.Subset at the pool's
// initial size, as the control plane computes it. While it cannot reach
// the control plane it keeps answering from the last snapshot and says
// so (Stale, a PoolStale event, a warning), and recovers by itself. A
// LoadReporter retries a failed report with the same seq and counts, so
// the leader never counts a report twice, and counts what it drops.
//
// A PoolMember's Leave is graceful: the member leaves every subset at the
// leader's next round but stays a read target of its tenants for the
// pool's lookback, its session kept alive, and Leave returns once no
// tenant lists it any more (PoolDraining events show the progress). A
// process that stops without Leave (Close, a crash) is dropped from every
// subset and read target when its session expires.
//
// # Admin
//
// Client.Admin creates and inspects keyspaces, drains members, manages
// hot-key pools and reports status; its methods are thin wrappers over
// AdminService taking and returning Go types.
//
// # Errors
//
// Errors from the server are translated, in one table, to sentinels
// (ErrInvalid, ErrNotFound, ErrExists, ErrImmutable, ErrUnavailable,
// ErrUnauthenticated, ErrPermissionDenied, ErrConflict,
// ErrResourceExhausted) that keep the
// server's message; test them with errors.Is. A FailedPrecondition answer
// with a WrongOwner detail becomes a *WrongOwnerError; one answering
// Worker.Commit is ErrBackwards or ErrNotHeld.
//
// Arguments and options the package refuses before any call (at Dial, at
// NewWorker, NewRouter and NewHotKeys, or given to an Admin method) are
// an *ArgError, which wraps ErrInvalid and names the function and the
// argument:
//
//	keyshard: invalid argument: NewHotKeys: HotKeysConfig.Pool is empty
package client
