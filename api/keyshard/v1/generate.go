package keyshardv1

// Regenerate with protoc (Debian package protobuf-compiler), protoc-gen-go
// and protoc-gen-connect-go on PATH:
//
//go:generate protoc -I . --go_out=. --go_opt=paths=source_relative --connect-go_out=. --connect-go_opt=paths=source_relative keyshard.proto
