module github.com/keyshard/keyshard/kafka

go 1.26.0

require (
	github.com/prometheus/client_golang v1.25.0
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kadm v1.20.0
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
	github.com/twmb/franz-go/pkg/kmsg v1.15.1
)

require (
	connectrpc.com/connect v1.21.1 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
	golang.org/x/sys v0.49.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

// Keyshard's own modules, from this repository (see "Modules" in the README).
require (
	github.com/keyshard/keyshard/api v0.0.0-00010101000000-000000000000
	github.com/keyshard/keyshard/client v0.0.0-00010101000000-000000000000
	github.com/keyshard/keyshard/clock v0.0.0-00010101000000-000000000000
	github.com/keyshard/keyshard/hotkey v0.0.0-00010101000000-000000000000
	github.com/keyshard/keyshard/placement v0.0.0-00010101000000-000000000000
)

replace (
	github.com/keyshard/keyshard/api => ../api
	github.com/keyshard/keyshard/client => ../client
	github.com/keyshard/keyshard/clock => ../clock
	github.com/keyshard/keyshard/hotkey => ../hotkey
	github.com/keyshard/keyshard/placement => ../placement
)
