module github.com/keyshard/keyshard/client

go 1.26.0

require (
	connectrpc.com/connect v1.21.1
	github.com/google/go-cmp v0.7.0
	golang.org/x/sync v0.25.0
	google.golang.org/protobuf v1.36.12
)

require github.com/cespare/xxhash/v2 v2.3.0 // indirect

// Keyshard's own modules, from this repository (see "Modules" in the README).
require (
	github.com/keyshard/keyshard/api v0.0.0-00010101000000-000000000000
	github.com/keyshard/keyshard/clock v0.0.0-00010101000000-000000000000
	github.com/keyshard/keyshard/hotkey v0.0.0-00010101000000-000000000000
	github.com/keyshard/keyshard/placement v0.0.0-00010101000000-000000000000
)

replace (
	github.com/keyshard/keyshard/api => ../api
	github.com/keyshard/keyshard/clock => ../clock
	github.com/keyshard/keyshard/hotkey => ../hotkey
	github.com/keyshard/keyshard/placement => ../placement
)
