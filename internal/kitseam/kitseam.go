// Package kitseam is the part of keyshardtest that only Keyshard's own
// code may use: any field of server.Config (limits, TLS, an external etcd,
// the replica's name and address), and the *server.Server behind a
// keyshardtest.Server. Its types are internal to Keyshard's module, so
// code elsewhere cannot name them and leaves keyshardtest.Options.Internal
// nil; keyshardtest's public options stay what an application needs.
//
//	ts := keyshardtest.NewServer(t, keyshardtest.Options{Internal: &kitseam.Options{
//		Config:  func(c *server.Config) { c.Limits.MaxLongPolls = 2 },
//		Started: func(s *server.Server) { srv = s },
//	}})
package kitseam

import "github.com/keyshard/keyshard/internal/server"

// Options reach past keyshardtest.Options.
type Options struct {
	// Config edits the replica's configuration once, when the
	// keyshardtest.Server is created, after keyshardtest.Options have
	// been applied. The kit validates the result as keyshard serve does.
	// A Restart listens again on the address the first start bound, so
	// Config's Listen matters only for the first start.
	Config func(*server.Config)
	// Started, if set, is called with the *server.Server of every start
	// (NewServer, Start, Restart) once it is ready, on the goroutine that
	// started it.
	Started func(*server.Server)
}
