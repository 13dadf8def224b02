// Package keyshardv1 is Keyshard's language-neutral contract: the protobuf
// definition in keyshard.proto and the Go code generated from it, served by
// `keyshard serve` as gRPC and as plain HTTP/JSON (the Connect protocol) on
// one port. Package keyshardv1connect has the generated clients and
// handlers.
//
// The key → bucket functions that clients in other languages must
// reproduce are specified in the placement package; hash_vectors.json here
// holds test vectors, and reference/bucket.py is a plain-Python
// implementation that checks itself against them.
package keyshardv1
