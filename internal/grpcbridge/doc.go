// Package grpcbridge serves gRPC calls with grpc-go's own HTTP/2 server
// and hands each one, as an http.Request, to an http.Handler that speaks
// the gRPC protocol (connect's handlers do). The handler, its
// interceptors and its middleware run unchanged; only the HTTP/2 server
// underneath differs. grpc-go's server reads and writes the frames of all
// the streams of a connection without net/http's hand-offs between
// goroutines per frame: for 10,000 members' Session streams and their
// keep-alives it takes 40 % less CPU than net/http's (`keyshard bench
// scale`, live-floor), in about the same memory. Two of grpc-go's
// defaults are changed for connections that carry little but are many
// (a fleet of members, each a process with a connection of its own): a
// read buffer of 4 KB instead of 32 KB held per connection, and fixed
// flow-control windows, so that grpc-go does not ping the client to
// estimate the bandwidth each time a message arrives.
//
// Split divides one listener's connections between the bridge and an
// http.Server: an HTTP/2 connection (with or without TLS) whose first
// request is gRPC goes to the bridge, every other connection (HTTP/1.1,
// the Connect protocol, gRPC-Web, a connection that sends no request in
// time) to the http.Server, which serves all of them as before.
package grpcbridge
