// Package e2e holds end-to-end tests that run Keyshard's SDK and adapters
// against a real keyshard serve: the tests that need both sides of the
// API, so that the SDK's and the adapters' modules never depend on the
// server. It has no code outside its tests.
package e2e
