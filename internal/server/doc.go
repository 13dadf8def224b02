// Package server is one `keyshard serve` replica.
//
// A replica serves the four services of api/keyshard/v1 (gRPC, gRPC-Web
// and HTTP/JSON on one port, through connect), /healthz, /readyz and
// /metrics. It keeps an in-memory view of the store current with one watch
// and answers every read (maps, grants, members, lookups, overflow sets,
// long polls) from it. It campaigns for leadership; while elected it runs
// the coordinator's state machine, turning every observed change into
// events and every action into a store transaction fenced by its election
// key, and, every second, sums each hot-key pool's producer reports into
// the pool's overflow set (hotkey.Aggregate), written by a fenced
// transaction too.
//
//	cfg := server.DefaultConfig()      // loopback, embedded etcd in ./keyshard-data
//	_ = cfg.LoadFile("keyshard.yaml")  // optional; then cfg.FromEnv(os.LookupEnv)
//	srv, err := server.New(cfg, server.Options{})
//	if err != nil { return err }       // errors.Is(err, server.ErrConfig), naming the field
//	return srv.Run(ctx)                // blocks until ctx ends and everything stopped
//
// # Lifecycle
//
// New starts nothing. Run starts the embedded etcd (unless endpoints are
// configured), opens the store, creates the configured keyspaces and
// hot-key pools, and runs four goroutines it waits for: the view's watch,
// the campaign, the HTTP server and its shutdown. While elected, the
// campaign's term runs two more, which exit before the term ends: the
// coordinator and the hot-key aggregation. When ctx ends the API stops
// accepting, in-flight calls get up to 10 s, the leader's term ends (its
// session is closed, so another replica takes over at once), and the
// embedded etcd stops last.
//
// Errors become API codes in one table (errors.go); members' sessions are
// tokens signed with the cluster secret (session.go), so one member cannot
// act for another.
package server
