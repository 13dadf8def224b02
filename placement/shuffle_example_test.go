package placement_test

import (
	"fmt"

	"github.com/keyshard/keyshard/placement"
)

// The leader computes sticky shards from the previous plan, the live members
// and each tenant's size (from its load), and publishes Subsets.
func ExampleShards() {
	members := []placement.Member{
		{ID: "gw-a1", Weight: 1, Zone: "a"}, {ID: "gw-a2", Weight: 1, Zone: "a"},
		{ID: "gw-b1", Weight: 1, Zone: "b"}, {ID: "gw-b2", Weight: 1, Zone: "b"},
		{ID: "gw-c1", Weight: 1, Zone: "c"}, {ID: "gw-c2", Weight: 1, Zone: "c"},
	}
	tenants := []placement.Tenant{
		{ID: "acme", Size: 3, Load: 300},
		{ID: "globex", Size: 2, Load: 80},
		{ID: "initech", Size: 1, Load: 10},
	}
	plan, err := placement.Shards(nil, members, tenants, placement.ShardOptions{})
	if err != nil {
		panic(err)
	}
	for _, t := range tenants {
		fmt.Println(t.ID, plan.Subsets[t.ID])
	}

	// gw-b1 leaves: only the tenants it served change, by one member each.
	plan, err = placement.Shards(plan.Subsets, append(members[:2:2], members[3:]...), tenants, placement.ShardOptions{})
	if err != nil {
		panic(err)
	}
	for _, c := range plan.Changes {
		fmt.Printf("%s: +%v -%v (%s)\n", c.Tenant, c.Added, c.Removed, c.Reason)
	}

	// acme's load grows and so does its size: it gains exactly one member.
	tenants[0] = placement.Tenant{ID: "acme", Size: 4, Load: 400}
	plan, err = placement.Shards(plan.Subsets, append(members[:2:2], members[3:]...), tenants, placement.ShardOptions{})
	if err != nil {
		panic(err)
	}
	for _, c := range plan.Changes {
		fmt.Printf("%s: +%v -%v (%s)\n", c.Tenant, c.Added, c.Removed, c.Reason)
	}
	// Output:
	// acme [gw-a1 gw-b2 gw-c2]
	// globex [gw-b1 gw-c1]
	// initech [gw-a2]
	// globex: +[gw-a2] -[gw-b1] (member gw-b1 left)
	// acme: +[gw-c1] -[] (size 3->4)
}

// A client that knows only the member list computes a tenant's subset on its
// own; every client and server computes the same one.
func ExampleSubset() {
	members := []placement.Member{
		{ID: "gw-a1", Weight: 1, Zone: "a"}, {ID: "gw-a2", Weight: 1, Zone: "a"},
		{ID: "gw-b1", Weight: 1, Zone: "b"}, {ID: "gw-b2", Weight: 1, Zone: "b"},
		{ID: "gw-c1", Weight: 1, Zone: "c"}, {ID: "gw-c2", Weight: 0, Zone: "c"}, // draining
	}
	for size := 1; size <= 4; size++ {
		s, err := placement.Subset("acme", members, size)
		if err != nil {
			panic(err)
		}
		fmt.Println(size, s)
	}
	// Output:
	// 1 [gw-b1]
	// 2 [gw-a2 gw-b1]
	// 3 [gw-a2 gw-b1 gw-c1]
	// 4 [gw-a2 gw-b1 gw-b2 gw-c1]
}

// Overlap tells whether tenants share members more often than random
// subsets would: here four tenants of two members each in a pool of four.
func ExampleOverlap() {
	subsets := map[string][]string{
		"acme":     {"gw1", "gw2"},
		"globex":   {"gw3", "gw4"},
		"initech":  {"gw1", "gw3"},
		"umbrella": {"gw2", "gw4"},
	}
	fmt.Print(placement.Overlap(subsets, 4, 0))
	// Output:
	// overlap of 4 tenants over 4 members, 6 pairs
	// mean shared: observed 0.6667, random 1.0000
	// above random p99: observed 0.0000%, random 0.0000%
	// smaller inside larger: observed 0.0000%, random 16.6667%
	// max shared: 1
	// shared  observed  random
	//      0         2  1.0
	//      1         4  4.0
	//      2         0  1.0
}
