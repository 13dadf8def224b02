package placement_test

import (
	"fmt"
	"time"

	"github.com/keyshard/keyshard/placement"
)

func ExampleBalance() {
	members := []placement.Member{{ID: "w1", Weight: 1}, {ID: "w2", Weight: 1}, {ID: "w3", Weight: 1}}
	first, _ := placement.Balance(placement.NewAssignment(4096), members)
	fmt.Println("first map:", len(first.Moves), "buckets placed")

	// A fourth writer joins: it takes a quarter of the buckets, evenly from
	// the other three, and nothing else moves.
	members = append(members, placement.Member{ID: "w4", Weight: 1})
	next, _ := placement.Balance(first.Assignment, members)
	fmt.Println("join moved:", len(next.Moves))
	fmt.Println("counts:", next.Assignment.Counts())
	// Output:
	// first map: 4096 buckets placed
	// join moved: 1024
	// counts: map[w1:1024 w2:1024 w3:1024 w4:1024]
}

func ExampleBalance_drain() {
	members := []placement.Member{{ID: "a", Weight: 1}, {ID: "b", Weight: 1}, {ID: "c", Weight: 1}}
	p, _ := placement.Balance(placement.NewAssignment(12), members)
	members[1].Weight = 0 // b drains: its buckets go to a and c
	p, _ = placement.Balance(p.Assignment, members)
	for _, m := range p.Moves {
		fmt.Printf("bucket %d: %s -> %s (%s)\n", m.Bucket, m.From, m.To, m.Reason)
	}
	// Output:
	// bucket 4: b -> a (draining)
	// bucket 5: b -> a (draining)
	// bucket 6: b -> c (draining)
	// bucket 7: b -> c (draining)
}

func ExampleNewTable() {
	p, _ := placement.Balance(placement.NewAssignment(4096), []placement.Member{{ID: "writer-1", Weight: 1}, {ID: "writer-2", Weight: 1}})
	table, _ := placement.NewTable(placement.HashXXH64, p.Assignment)
	owner, _ := table.OwnerString("!room:example.org")
	fmt.Println(table.Hasher().BucketString("!room:example.org"), owner)
	// Output: 1399 writer-1
}

func ExampleSynapseAssignment() {
	// Import today's static mapping: three event persisters, 3072 buckets.
	instances := []string{"persister1", "persister2", "persister3"}
	first, _ := placement.SynapseAssignment(3072, instances)
	table, _ := placement.NewTable(placement.HashSynapse, first)
	owner, _ := table.OwnerString("!room:example.org")
	fmt.Println(owner) // the instance Synapse picks today

	// Adding a fourth moves only a quarter of the buckets.
	members := []placement.Member{{ID: "persister1", Weight: 1}, {ID: "persister2", Weight: 1}, {ID: "persister3", Weight: 1}, {ID: "persister4", Weight: 1}}
	p, _ := placement.Balance(first, members)
	fmt.Println(len(p.Moves))
	// Output:
	// persister1
	// 768
}

func ExampleBalanceLoad() {
	members := []placement.Member{{ID: "a", Weight: 1}, {ID: "b", Weight: 1}}
	p, _ := placement.Balance(placement.NewAssignment(8), members)
	load := []float64{9, 9, 1, 1, 1, 1, 1, 1} // a holds the two hot buckets
	lp, _ := placement.BalanceLoad(p.Assignment, members, load, placement.LoadOptions{Tolerance: 0.1})
	for _, m := range lp.Moves {
		fmt.Println(m.Why)
	}
	fmt.Printf("imbalance %.2f -> %.2f (%s)\n", lp.Before, lp.After, lp.Stopped)
	// Output:
	// load: a at 1.67× target → b at 0.33× target
	// imbalance 1.67 -> 1.08 (balanced)
}

func ExampleNextSize() {
	policy := placement.SizePolicy{CapacityPerMember: 10, Min: 2, Max: 24, Zones: 3, ShrinkCooldown: 5 * time.Minute, MaxShrinkStep: 3}
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	var st placement.SizeState
	for _, obs := range []struct {
		after time.Duration
		qps   float64
	}{{0, 5}, {time.Minute, 95}, {2 * time.Minute, 20}, {8 * time.Minute, 20}} {
		st, _ = placement.NextSize(st, obs.qps, 0, now.Add(obs.after), policy)
		fmt.Printf("t+%v %3.0f qps -> %d members (wants %d)\n", obs.after, obs.qps, st.Size, st.Wanted)
	}
	// Output:
	// t+0s   5 qps -> 3 members (wants 3)
	// t+1m0s  95 qps -> 12 members (wants 12)
	// t+2m0s  20 qps -> 12 members (wants 3)
	// t+8m0s  20 qps -> 9 members (wants 3)
}
