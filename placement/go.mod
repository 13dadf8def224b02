module github.com/keyshard/keyshard/placement

go 1.26.0

require (
	github.com/cespare/xxhash/v2 v2.3.0
	github.com/google/go-cmp v0.7.0
	pgregory.net/rapid v1.3.0
)
