package e2e_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/client/clienttest"
	"github.com/keyshard/keyshard/internal/tenantpool"
	"github.com/keyshard/keyshard/placement"
)

// TestTenantPoolFallbackMatchesCore: for tenants a snapshot does not
// list, the Go SDK computes the stateless subset itself (the server's
// core is not in its module). Over random pools (1-12 members of weight
// 1-3 in 1-4 zones, zone-aware or not, random min and max sizes and
// overrides of size, min and max), its Targets and Serves equal the
// core's tenantpool.Snapshot of the same state.
func TestTenantPoolFallbackMatchesCore(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	checked := 0
	for round := range 200 {
		n, zones := 1+rng.IntN(12), 1+rng.IntN(4)
		var pm []placement.Member
		var prm []*keyshardv1.Member
		for i := range n {
			w := float64(1 + rng.IntN(3))
			z := fmt.Sprintf("z%d", rng.IntN(zones))
			pm = append(pm, placement.Member{ID: fmt.Sprintf("m%02d", i), Weight: w, Zone: z})
			prm = append(prm, &keyshardv1.Member{Id: fmt.Sprintf("m%02d", i), Weight: w, Zone: z})
		}
		pol := tenantpool.Policy{CapacityPerMember: 1, MinSize: rng.IntN(5), MaxSize: rng.IntN(6), ZoneAware: rng.IntN(2) == 0,
			Overrides: map[string]tenantpool.Override{"t1": {Size: 1 + rng.IntN(4)}, "t2": {MinSize: 1 + rng.IntN(4)}, "t3": {MaxSize: 1 + rng.IntN(3)}}}
		if pol.MaxSize > 0 && pol.MaxSize < pol.MinSize {
			pol.MaxSize = pol.MinSize
		}
		if err := pol.Validate(); err != nil {
			continue
		}
		checked++
		ppol := &keyshardv1.TenantPoolPolicy{CapacityPerMember: 1, MinSize: uint32(pol.MinSize), MaxSize: uint32(pol.MaxSize), ZoneAware: pol.ZoneAware,
			Overrides: map[string]*keyshardv1.TenantOverride{}}
		for k, o := range pol.Overrides {
			ppol.Overrides[k] = &keyshardv1.TenantOverride{Size: uint32(o.Size), MinSize: uint32(o.MinSize), MaxSize: uint32(o.MaxSize)}
		}
		core := tenantpool.NewSnapshot(tenantpool.State{Version: 1, Members: pm, Policy: pol})
		fk := clienttest.NewServer(t, clienttest.Options{})
		fk.SetPoolSnapshot(&keyshardv1.PoolSnapshot{Pool: "gw", Version: 1, Members: prm, Policy: ppol, Full: true})
		c, err := client.Dial(fk.URL(), client.Clock(fk.Clock()))
		if err != nil {
			t.Fatal(err)
		}
		f, err := c.FollowPool(t.Context(), "gw")
		if err != nil {
			t.Fatal(err)
		}
		now := fk.Clock().Now()
		for i := range 100 {
			tn := fmt.Sprintf("t%d", i)
			want := core.Targets(tn, now)
			if got := f.Targets(tn); !slices.Equal(got, want) {
				t.Errorf("round %d, %d members in %d zones, policy %+v: Targets(%s) = %v; the core says %v", round, n, zones, pol, tn, got, want)
			}
			for _, m := range pm {
				if got, want := f.Serves(m.ID, tn), core.Serves(m.ID, tn); got != want {
					t.Errorf("round %d, policy %+v: Serves(%s, %s) = %v; the core says %v", round, pol, m.ID, tn, got, want)
				}
			}
		}
		f.Close()
		c.Close()
	}
	if checked < 50 {
		t.Fatalf("only %d random pools were valid; the test checks too little", checked)
	}
}
