package store

import (
	"time"

	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/placement"
)

func testKeyspace(name string) shard.Keyspace {
	return shard.Keyspace{Name: name, Buckets: 64, Hash: placement.HashXXH64, Mode: shard.ModeExclusive, LeaseTTL: 5 * time.Second, DrainTimeout: 30 * time.Second}
}
