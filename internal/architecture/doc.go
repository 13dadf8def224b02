// Package architecture holds the tests that keep Keyshard's layering
// true: the pure cores (placement, hotkey, the coordinator) stay pure, and
// a module that imports the Go SDK or the Kafka adapter never pulls in the
// server's dependencies. It has no code outside its tests.
package architecture
