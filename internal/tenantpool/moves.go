package tenantpool

import (
	"cmp"
	"slices"

	"github.com/keyshard/keyshard/placement"
)

// MinMoves is a lower bound on the placements any plan with st's sizes
// must move, starting from st, so that no member of members (all of
// weight 1) carries more than (1+tol) × its fair share (the total of
// rates over the number of members). A member above that must shed the
// excess; moving one of its placements sheds that tenant's rate/size, so
// the fewest moves shed its largest pieces first. The bound ignores where
// the pieces go, so it is at most the true minimum. Tests and benchmarks
// compare a pool's growth with it.
func MinMoves(st State, members []placement.Member, rates map[string]float64, tol float64) int {
	if len(members) == 0 {
		return 0
	}
	pieces := map[string][]float64{}
	total := 0.0
	for id, ts := range st.Tenants {
		total += rates[id]
		for _, m := range ts.Members {
			pieces[m.ID] = append(pieces[m.ID], rates[id]/float64(len(ts.Members)))
		}
	}
	limit := (1 + tol) * total / float64(len(members))
	n := 0
	for _, ps := range pieces {
		load := 0.0
		for _, p := range ps {
			load += p
		}
		slices.SortFunc(ps, func(a, b float64) int { return cmp.Compare(b, a) })
		for _, p := range ps {
			if load <= limit {
				break
			}
			load -= p
			n++
		}
	}
	return n
}
