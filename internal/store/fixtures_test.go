package store

import (
	"time"

	"github.com/keyshard/keyshard/placement"
)

func testKeyspace(name string) Keyspace {
	return Keyspace{Name: name, Buckets: 64, Hash: placement.HashXXH64, Mode: ModeExclusive, LeaseTTL: 5 * time.Second, DrainTimeout: 30 * time.Second}
}
