package coordinator

import (
	"fmt"
	"maps"
	"slices"
)

// CheckIndex reports where a keyspace's bucket index, as kept in step,
// differs from one built afresh from the keyspace's records.
func CheckIndex(m *Machine) error {
	for _, name := range slices.Sorted(maps.Keys(m.keyspaces)) {
		k := m.keyspaces[name]
		if !k.idx.valid || len(k.idx.holder) != k.cfg.Buckets {
			continue // rebuilt on next use
		}
		x := k.index() // brings in the changes noted since the step
		fresh := *k
		fresh.idx = bucketIndex{}
		f := fresh.index()
		for b := range x.holder {
			if x.holder[b] != f.holder[b] || x.token[b] != f.token[b] || x.released[b] != f.released[b] {
				return fmt.Errorf("keyspace %s bucket %d: index says %q token %d released %v; the records say %q token %d released %v",
					name, b, x.holder[b], x.token[b], x.released[b], f.holder[b], f.token[b], f.released[b])
			}
		}
		for w := range x.unsettled {
			if x.unsettled[w] != f.unsettled[w] {
				return fmt.Errorf("keyspace %s buckets %d to %d: unsettled bits %b; the records say %b", name, w*64, w*64+63, x.unsettled[w], f.unsettled[w])
			}
		}
	}
	return nil
}
