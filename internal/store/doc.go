// Package store is Keyshard's persistence: the etcd schema, its codecs,
// the transactions that read and write it, leases, the watch that feeds the
// coordinator, the leader election, and an etcd server embedded in the
// process. It is the only package that imports etcd; everything above it
// works on the records of internal/shard (a keyspace's configuration,
// members, maps, grants...), which this package encodes, and on the typed
// values declared here (hot-key pools, snapshots, changes).
//
// A lease is not a lock. etcd leases, and the election built on them, cannot
// guarantee mutual exclusion across process pauses and network partitions.
// What they do give is used here: keys that vanish with their owner's
// session, and a leader fence that makes a deposed leader's writes fail.
// Work on a bucket is safe only if the resource checks the bucket's fencing
// token.
//
// # Key layout
//
// Every key is under Prefix, "/keyshard/v1/". Keyspace names, member ids,
// hot-key pool names and producer ids are 1-128 characters of
// [A-Za-z0-9._:@-] (ValidateName), so a key splits unambiguously
// (ParseKey). The values of the keyspace kinds are internal/shard's
// records; the hot-key ones are declared here.
//
//	key                   value (codec)                         written by            lease
//	keyspaces/<ks>        Keyspace, JSON                        admin (API)           none
//	members/<ks>/<id>     Member, JSON                          Join, Activate        member's session
//	drain/<ks>/<id>       Drain, JSON (+"leave")                admin drain / Leave   member's session
//	map/<ks>              Map: JSON, owners base64 uint16 LE    leader Commit         none
//	grants/<ks>/<id>      Grants {"session","buckets":[[b,t]]}  leader Commit         member's session
//	                        +"from":[[b,p]] (stream keyspaces)
//	releases/<ks>/<id>    Releases {"buckets":[[b,t]]}          the member            member's session
//	                        +"positions":[[b,p]] (stream keyspaces)
//	tokens/<ks>           last fencing token, decimal           leader Commit         none
//	quarantine/<ks>/<id>  Quarantine {"session","buckets":[b]}  leader Commit         its own, one TTL
//	positions/<ks>/<id>   Commit {"session","max_token",        the member            none; the leader
//	                        "default","exceptions":[[b,t,p]]}                         folds and deletes it
//	bucketpos/<ks>/<c>    BucketPositions                       leader Commit,        none
//	                                                            admin ResetPositions
//	                        {"runs":[[first,count,p]]}
//	held/<ks>/<id>        Held {"session","held":               leader Commit, with   none; the leader
//	                        [[token,first,gap,...]]}            grants/<ks>/<id>      deletes it with the fold
//	reserved/<ks>         Reservation {"members":[id],"until"}  ImportKeyspace,       none
//	                                                            leader Commit
//	hotpools/<pool>       HotPool, JSON                         admin (API), config   none
//	hotreports/<pool>/<p> hotkey.Report, JSON                   the producer (API)    none; leader deletes stale ones
//	overflow/<pool>       hotkey.OverflowSet, JSON              leader Commit         none
//	leader/<lease hex>    the campaigner's id                   Election              replica's session
//	tpools/<pool>         TenantPool, JSON                      admin (API), config   none
//	tpmembers/<pool>/<id> TenantMember, JSON                    the member (API)      member's session
//	tpstate/<pool>/meta   TenantMeta, JSON                      leader Commit         none
//	tpstate/<pool>/t/<c>  TenantChunk, JSON {"v":<version>,     leader Commit         none
//	                        "t":{<tenant>:...}}: the tenants
//	                        whose xxh64 mod 256 is c
//	replicas/<replica>    the replica's advertised API URL      the replica           replica's session
//
// The tenant-pool kinds (Kind.TenantPool) belong to a tenant pool: a
// Snapshot keeps them in TenantPools (and replicas/ in Replicas). A
// leader's round rewrites the meta only if it changed and only the chunks
// of the tenants that changed (StateWrites): the chunks in Commits under
// a byte budget (DefaultTenantTxnBytes), each chunk recording the round's
// version, then the meta (and the deletes of emptied chunks) in a last
// Commit. A chunk whose version is above the meta's is not published yet
// (TenantPoolState.Ahead, State); a chunk above MaxTenantChunkBytes is
// refused with ErrTooLarge.
//
// The hot-key kinds (Kind.HotKey) belong to a pool, not a keyspace: a
// Snapshot keeps them in Pools, and Change.Keyspace holds the pool's name.
// Their JSON forms:
//
//	hotpools/<pool>        {"name","threshold","low_threshold","cooldown_ms","report_threshold","report_max_age_ms","max_keys"}
//	hotreports/<pool>/<p>  {"producer":"p","at":"<RFC 3339 nano>","keys":[{"key":"k","rate":12.5},...]}
//	overflow/<pool>        {"version":3,"entries":[{"key":"k","rate":1200,"since":"<RFC 3339>","below_since":"<RFC 3339>"},...]}
//
// Stream keyspaces keep a committed position per bucket (the position of
// the next event to read; 0 is the start of the stream). "from" (grants)
// and "positions" (releases) list only buckets at a position > 0 and are
// omitted when there are none, so an exclusive keyspace's records are the
// bytes they were before positions existed. A member's commit record is
// one small value whatever the number of buckets it holds: "default" is
// the position of every bucket held at a grant token <= "max_token" that
// "exceptions" (sorted by bucket, each with the token it is held at) do
// not list; it has no lease, so a crash loses no committed position. The
// buckets no holder covers are at their bucketpos position, run-length
// encoded in chunks of PositionChunk buckets (runs sorted, neither
// overlapping nor adjacent at one position, each at a position > 0; a
// bucket outside every run is at 0); <c> is the chunk's index in decimal.
// shard.Positions gives a held bucket's effective position from the three.
//
// held/<ks>/<id> is the leader's copy of grants/<ks>/<id>'s buckets and
// tokens (not "from"), without a lease, so that the commit record of a
// session whose grants vanished with its lease can still be folded for
// exactly the buckets "default" covered: one group per grant token,
// tokens ascending, each the first bucket then the gaps to the next
// (each >= 1); "held":[] for a session that holds nothing but has a
// commit record to fold. The leader writes it in the transaction that
// writes the grants and deletes it in the one that folds the session's
// commit record (or, for a session that never committed, once it ended
// or holds nothing).
//
// Keys are 1-512 bytes, rates finite and >= 0, keys sorted and distinct; a
// report has at most MaxReportKeys keys and a set at most MaxOverflowKeys;
// "below_since" is omitted while the key is above the low threshold.
//
// Decoders are strict: unknown, repeated or wrongly-cased fields, trailing
// data, out-of-range or unsorted buckets, and values that disagree with
// their key are rejected with a *CorruptError (wrapping ErrCorrupt) that
// names the key and the field. Encoders validate too, returning ErrInvalid.
//
// # Writes
//
// Members write through Join (ErrExists if the id is held by another live
// session, unless replace is asked: then the record names the old session
// in "replaces" and the leader revokes it; a new session's record is
// "pending" until Activate, on its first keep-alive), Activate, Release
// (checked against the grants in etcd, merged without lost updates),
// CommitPositions (a stream keyspace's positions: one value per member,
// checked against its grants, its previous commit and its session in the
// transaction that writes it; ErrNotHeld, ErrBackwards or ErrInvalid refuse
// it whole) and DeleteMember; the API writes keyspaces and drain requests,
// a stream keyspace's bucket positions (ResetPositions, only of buckets
// nobody holds, compared against everything it read), hot-key pools
// (PutHotPool, CreateHotPool) and producers' reports (PutHotReport, only
// into an existing pool). The leader writes only through Commit: one etcd
// transaction guarded by CreateRevision(Fence.LeaderKey) == Fence.LeaderRev
// (else ErrFenced) and by ModRevision compares on what it read (else
// ErrConflict). A grants put
// carries the member's lease, so a grant to a dead session fails
// (ErrLeaseNotFound) and writes nothing. The leader writes a pool's
// overflow set (PutOverflow), a keyspace's bucket positions
// (PutBucketPositions), the copies of grants (PutHeld) and deletes stale
// reports, folded commit records and copies (Delete) through Commit too,
// each with an expectation on what it read.
//
// # Usage
//
//	emb, err := store.StartEmbedded(ctx, store.EmbeddedConfig{Dir: dataDir})
//	if err != nil { return err }
//	defer emb.Close()
//	st, err := store.Open(ctx, store.Config{Endpoints: emb.Endpoints()})
//	if err != nil { return err }
//	defer st.Close()
//
//	sess, err := st.NewSession(ctx, 10*time.Second)   // a replica's session
//	el := st.NewElection(sess)
//	fence, err := el.Campaign(ctx, "replica-1")          // blocks until leader
//
//	snap, err := st.LoadAll(ctx)
//	for u := range st.Watch(ctx, snap.Rev+1) {
//		if u.Resync != nil { snap = u.Resync.Snapshot; continue }
//		for _, c := range u.Changes { snap.Apply(c) }
//		// ... decide, then:
//		st0 := snap.Keyspaces["rooms"]
//		_, err := st.Commit(ctx, fence,
//			[]store.Write{store.PutMap("rooms", newMap)},
//			[]store.Expect{store.ExpectEntry(store.MapKey("rooms"), st0.Map)})
//		if errors.Is(err, store.ErrFenced) { /* no longer leader */ }
//		if errors.Is(err, store.ErrConflict) { /* wait for the watch, decide again */ }
//	}
//
// # Lifecycle
//
// StartEmbedded starts etcd's own goroutines; Embedded.Close stops them and
// returns once the data directory is released (idempotent). The caller that
// started an Embedded or a Cluster closes it, after closing the Stores that
// use it.
//
// Open returns a Store that owns one clientv3 client; Store.Close closes it.
// Close sessions (revoking their leases) before closing the Store if their
// keys should vanish at once; otherwise they expire after their TTL.
//
// Goroutines: NewSession's keep-alive is run by clientv3 until
// Session.Close, Orphan, lease loss or Store.Close. Watch and Observe each
// start one goroutine that owns the returned channel and exits, closing the
// channel, when the caller's ctx is done or the Store is closed; the caller
// need not drain it. Campaign starts a helper goroutine that exits before
// Campaign returns. Nothing else here starts goroutines; every other method
// blocks only for its own round trips, bounded by ctx.
//
// # etcd behaviour this package relies on or works around
//
//   - A put attached to a lease that has expired or been revoked fails the
//     whole transaction with "lease not found" (ErrLeaseNotFound here); etcd
//     checks the lease only for the branch the transaction takes.
//   - Leases have second granularity and a minimum TTL of 1.5 election
//     timeouts (with etcd's defaults a 1 s request is granted as 2 s);
//     expiry is checked about every 500 ms.
//   - --max-txn-ops (etcd default 128) limits the operations of each level of
//     a transaction. Commit nests the expectations and writes one level
//     down, so it accepts up to Config.MaxTxnOps-1 of each. The embedded
//     server allows DefaultMaxTxnOps (1024) and DefaultMaxRequestBytes (8 MiB);
//     an external etcd must be started with --max-txn-ops=1024 and
//     --max-request-bytes=8388608, or large rounds fail with ErrTooLarge
//     naming the flag.
//   - A watch from a compacted revision fails with ErrCompacted, and a watch
//     can end on leader loss; Watch then re-reads everything at one
//     revision and delivers a Resync before continuing.
//   - In etcd 3.7, WithKeysOnly ranges come from the in-memory index and
//     report Lease 0: reads that need a key's lease fetch the value.
package store
