package coordinator_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/keyshard/keyshard/internal/coordinator"
	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/placement"
)

// settledMachine returns a machine that has mapped and granted a keyspace
// of buckets over members, every write echoed back.
func settledMachine(b *testing.B, buckets, members int) (*coordinator.Machine, time.Time) {
	b.Helper()
	m := coordinator.New()
	now := time.Unix(100, 0)
	ks := shard.Keyspace{Name: "k", Buckets: buckets, Hash: placement.HashXXH64, LeaseTTL: 10 * time.Second, DrainTimeout: 30 * time.Second}
	evs := []coordinator.Event{coordinator.Reset{}, coordinator.KeyspacePut{Keyspace: ks}}
	for i := range members {
		evs = append(evs, coordinator.MemberPut{Keyspace: "k", Member: shard.Member{ID: fmt.Sprintf("m%04d", i), Weight: 1, Session: shard.LeaseID(i + 1)}})
	}
	var rev coordinator.Rev
	acts := m.StepAll(evs, now)
	for range 10 {
		if len(acts) == 0 {
			return m, now
		}
		acts = m.StepAll(echoWrites(acts, &rev), now)
	}
	b.Fatal("the machine did not settle")
	return nil, now
}

// echoWrites returns the events the store's watch would bring back for
// the map and grant writes among acts, each at its own revision.
func echoWrites(acts []coordinator.Action, rev *coordinator.Rev) []coordinator.Event {
	var echo []coordinator.Event
	for _, a := range acts {
		*rev++
		switch a := a.(type) {
		case coordinator.WriteMap:
			echo = append(echo, coordinator.MapPut{Keyspace: a.Keyspace, Map: a.Map, Rev: *rev})
		case coordinator.WriteGrants:
			for id, g := range a.Grants {
				echo = append(echo, coordinator.GrantsPut{Keyspace: a.Keyspace, ID: id, Grants: g, Rev: *rev})
			}
			echo = append(echo, coordinator.TokensPut{Keyspace: a.Keyspace, Token: a.Token, Rev: *rev})
		}
	}
	return echo
}

// BenchmarkStepSettled: one step of a settled keyspace on an event that
// changes nothing (a member's empty releases), the floor of every step
// the leader takes in a storm of releases.
func BenchmarkStepSettled(b *testing.B) {
	for _, size := range []struct{ buckets, members int }{{4096, 100}, {65536, 1000}} {
		b.Run(fmt.Sprintf("buckets=%d/members=%d", size.buckets, size.members), func(b *testing.B) {
			m, now := settledMachine(b, size.buckets, size.members)
			ev := coordinator.ReleasesPut{Keyspace: "k", ID: "m0000"}
			b.ReportAllocs()
			for b.Loop() {
				if acts := m.Step(ev, now); len(acts) != 0 {
					b.Fatalf("a settled keyspace planned %v", acts)
				}
			}
		})
	}
}
