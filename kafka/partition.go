package kafka

import (
	"github.com/twmb/franz-go/pkg/kgo"
)

// KeyPartition returns the partition, among n, that Kafka's Java producer's
// default partitioner chooses for a record with key (every release since
// 0.8.2: toPositive(murmur2(key)) % n). The router relies on the client's
// partitioner doing the same, so that producers in any language agree on
// which partition a key lives on; NewRouter checks it. n must be positive.
func KeyPartition(key []byte, n int32) int32 {
	return int32(murmur2(key)&0x7fffffff) % n
}

// murmur2 is Kafka's Utils.murmur2 (MurmurHash2, seed 0x9747b28c), as the
// Java client and franz-go's KafkaHasher compute it.
func murmur2(b []byte) uint32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	h := seed ^ uint32(len(b))
	for len(b) >= 4 {
		k := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
		b = b[4:]
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	switch len(b) {
	case 3:
		h ^= uint32(b[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(b[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(b[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}

// probeKeys are the keys checkPartitioner places: Kafka's murmur2 test
// vectors and a few shapes of real keys.
var probeKeys = []string{
	"21", "foobar", "a-little-bit-long-string", "a-little-bit-longer-string",
	"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", "abc",
	"user:42", "distinct-id-0b0e6c5e", "x", "tenant/7/room/1234",
}

var probeCounts = []int{1, 2, 3, 7, 12, 64, 1000}

type noBackup struct{ i, n int }

func (b *noBackup) Next() (int, int64) { b.i++; return b.i - 1, 0 }
func (b *noBackup) Rem() int           { return b.n - b.i }

// checkPartitioner reports whether p places keyed records as Kafka's Java
// client does, always (RequiresConsistency: a keyed record never moves to
// another partition while its own is unavailable). p is a fresh
// partitioner from the client's configuration; probing it sends nothing.
func checkPartitioner(p kgo.Partitioner) (err error) {
	const (
		fn    = "kafka.NewRouter"
		field = "kgo.RecordPartitioner" // the client's option
		fix   = "build the client with kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)) or leave the default"
	)
	if p == nil {
		return configError(fn, field, "is not set; %s", fix)
	}
	defer func() {
		if v := recover(); v != nil {
			err = configError(fn, field, "panicked on a keyed record (%v); %s", v, fix)
		}
	}()
	tp := p.ForTopic("keyshard-partitioner-probe")
	for _, k := range probeKeys {
		for _, n := range probeCounts {
			rec := &kgo.Record{Topic: "keyshard-partitioner-probe", Key: []byte(k), Value: []byte("v")}
			if !tp.RequiresConsistency(rec) {
				return configError(fn, field, "may move keyed records between partitions; %s", fix)
			}
			var got int
			if bp, ok := tp.(kgo.TopicBackupPartitioner); ok {
				got = bp.PartitionByBackup(rec, n, &noBackup{n: n})
			} else {
				got = tp.Partition(rec, n)
			}
			if want := int(KeyPartition(rec.Key, int32(n))); got != want {
				return configError(fn, field, "puts key %q on partition %d of %d, Kafka's Java client on %d; %s",
					k, got, n, want, fix)
			}
		}
	}
	return nil
}
