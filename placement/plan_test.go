package placement_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"pgregory.net/rapid"

	"github.com/keyshard/keyshard/placement"
)

// balanceInput is one generated case: a current assignment (which may name
// members that have left) and the live members.
type balanceInput struct {
	Cur     placement.Assignment
	Members []placement.Member
}

func genBalanceInput(t *rapid.T) balanceInput {
	buckets := rapid.IntRange(1, 300).Draw(t, "buckets")
	old := rapid.IntRange(0, 8).Draw(t, "old")
	cur := placement.NewAssignment(buckets)
	for i := range old {
		cur.Members = append(cur.Members, fmt.Sprintf("m%d", i))
	}
	if old > 0 {
		for b := range cur.Owners {
			cur.Owners[b] = int32(rapid.IntRange(-1, old-1).Draw(t, "owner"))
		}
	}
	var members []placement.Member
	for i := range 10 {
		if !rapid.Bool().Draw(t, "live") {
			continue
		}
		w := rapid.SampledFrom([]float64{0, 1, 1, 1, 2, 3, 0.5, 1.7}).Draw(t, "weight")
		members = append(members, placement.Member{ID: fmt.Sprintf("m%d", i), Weight: w, Zone: fmt.Sprintf("z%d", i%3)})
	}
	return balanceInput{cur, members}
}

// refMinMoves is the reference: it tries every way of handing out the
// remainder ⌈share⌉ slots and returns the fewest buckets that must move.
func refMinMoves(in balanceInput) (int, bool) {
	buckets := in.Cur.Buckets()
	counts := in.Cur.Counts()
	var total float64
	for _, m := range in.Members {
		total += m.Weight
	}
	if total == 0 {
		return 0, false
	}
	floors := make([]int, len(in.Members))
	var eligible []int
	sum := 0
	for i, m := range in.Members {
		share := float64(buckets) * m.Weight / total
		floors[i] = int(math.Floor(share + 1e-9))
		if share-float64(floors[i]) > 1e-9 {
			eligible = append(eligible, i)
		}
		sum += floors[i]
	}
	extra := buckets - sum
	best := -1
	var try func(from, left int, plus []bool)
	try = func(from, left int, plus []bool) {
		if left == 0 {
			kept := 0
			for i, m := range in.Members {
				t := floors[i]
				if plus[i] {
					t++
				}
				kept += min(counts[m.ID], t)
			}
			best = max(best, kept)
			return
		}
		for j := from; j < len(eligible); j++ {
			plus[eligible[j]] = true
			try(j+1, left-1, plus)
			plus[eligible[j]] = false
		}
	}
	try(0, extra, make([]bool, len(in.Members)))
	return buckets - best, true
}

// fataler is what checks need from *testing.T and *rapid.T alike.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// checkBalance asserts every guarantee of Balance for one input.
func checkBalance(t fataler, in balanceInput, p placement.Plan) {
	t.Helper()
	if err := p.Assignment.Validate(); err != nil {
		t.Fatalf("invalid result: %v", err)
	}
	buckets := in.Cur.Buckets()
	if p.Assignment.Buckets() != buckets {
		t.Fatalf("result has %d buckets, want %d", p.Assignment.Buckets(), buckets)
	}
	live := map[string]placement.Member{}
	var total float64
	for _, m := range in.Members {
		live[m.ID] = m
		total += m.Weight
	}
	before, after := in.Cur.Counts(), p.Assignment.Counts()

	// Moves are exactly the buckets whose owner changed.
	var diff []placement.Move
	for b := range buckets {
		if f, to := in.Cur.Owner(b), p.Assignment.Owner(b); f != to {
			diff = append(diff, placement.Move{Bucket: b, From: f, To: to})
		}
	}
	strip := func(ms []placement.Move) []placement.Move {
		out := slices.Clone(ms)
		for i := range out {
			out[i].Reason = ""
		}
		return out
	}
	if d := cmp.Diff(diff, strip(p.Moves), cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("Moves do not match the changed buckets (-changed +moves):\n%s", d)
	}

	if total == 0 {
		// Nobody can take buckets: live members keep theirs, the rest are
		// unassigned.
		for b := range buckets {
			o := in.Cur.Owner(b)
			if _, ok := live[o]; !ok {
				o = ""
			}
			if got := p.Assignment.Owner(b); got != o {
				t.Fatalf("bucket %d: owner %q, want %q", b, got, o)
			}
		}
		return
	}

	// Every member has ⌊share⌋ or ⌈share⌉, and nothing is unassigned.
	sum := 0
	for id, m := range live {
		share := float64(buckets) * m.Weight / total
		c := after[id]
		if float64(c) < math.Floor(share+1e-9)-1e-9 || float64(c) > math.Ceil(share-1e-9)+1e-9 {
			t.Fatalf("member %s (weight %v) has %d buckets, share %.3f", id, m.Weight, c, share)
		}
		if p.Targets[id] != c {
			t.Fatalf("member %s: Targets %d, holds %d", id, p.Targets[id], c)
		}
		sum += c
	}
	if sum != buckets {
		t.Fatalf("members hold %d of %d buckets", sum, buckets)
	}

	// No bucket moves between two members that are both within target, and
	// no member both gives and receives.
	gives, takes := map[string]bool{}, map[string]bool{}
	for _, mv := range p.Moves {
		if mv.From != "" {
			if _, ok := live[mv.From]; ok && live[mv.From].Weight > 0 && before[mv.From] <= after[mv.From] {
				t.Fatalf("bucket %d moved from %s, which was within target (%d → %d)", mv.Bucket, mv.From, before[mv.From], after[mv.From])
			}
			gives[mv.From] = true
		}
		takes[mv.To] = true
	}
	for id := range gives {
		if takes[id] {
			t.Fatalf("member %s both gives and takes buckets", id)
		}
	}

	// Exactly the minimum number of moves, which MinMoves also reports.
	if want, ok := refMinMoves(in); ok {
		if len(p.Moves) != want {
			t.Fatalf("moved %d buckets, minimum is %d", len(p.Moves), want)
		}
		if got, err := placement.MinMoves(in.Cur, in.Members); err != nil || got != want {
			t.Fatalf("MinMoves = %d, %v; minimum is %d", got, err, want)
		}
	}
}

func TestBalanceProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := genBalanceInput(t)
		p, err := placement.Balance(in.Cur, in.Members)
		if err != nil {
			t.Fatal(err)
		}
		checkBalance(t, in, p)

		// Balancing a balanced assignment moves nothing.
		again, err := placement.Balance(p.Assignment, in.Members)
		if err != nil {
			t.Fatal(err)
		}
		if len(again.Moves) != 0 {
			t.Fatalf("second Balance moved %d buckets", len(again.Moves))
		}
	})
}

// TestBalanceDeterministic permutes the member list and the input's member
// index space; the owner of every bucket must not change.
func TestBalanceDeterministic(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := genBalanceInput(t)
		p1, err := placement.Balance(in.Cur, in.Members)
		if err != nil {
			t.Fatal(err)
		}
		perm := rapid.Permutation(in.Members).Draw(t, "members")
		cur := in.Cur.Clone()
		if n := len(cur.Members); n > 1 {
			order := rapid.Permutation(cur.Members).Draw(t, "cur")
			index := map[string]int32{}
			for i, id := range order {
				index[id] = int32(i)
			}
			for b, o := range cur.Owners {
				if o >= 0 {
					cur.Owners[b] = index[in.Cur.Members[o]]
				}
			}
			cur.Members = order
		}
		p2, err := placement.Balance(cur, perm)
		if err != nil {
			t.Fatal(err)
		}
		for b := range in.Cur.Owners {
			if p1.Assignment.Owner(b) != p2.Assignment.Owner(b) {
				t.Fatalf("bucket %d: %q vs %q after permuting the input", b, p1.Assignment.Owner(b), p2.Assignment.Owner(b))
			}
		}
		if d := cmp.Diff(p1.Moves, p2.Moves); d != "" {
			t.Fatalf("moves differ:\n%s", d)
		}
	})
}

// TestBalanceSequence drives a keyspace through random joins, leaves and
// weight changes, checking every step.
func TestBalanceSequence(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		buckets := rapid.IntRange(1, 512).Draw(t, "buckets")
		cur := placement.NewAssignment(buckets)
		live := map[string]float64{}
		for step := range 12 {
			switch op := rapid.IntRange(0, 3).Draw(t, "op"); {
			case op <= 1 || len(live) == 0:
				for range rapid.IntRange(1, 3).Draw(t, "joins") {
					live[fmt.Sprintf("w%d", rapid.IntRange(0, 30).Draw(t, "id"))] = 1
				}
			case op == 2:
				for id := range live {
					if rapid.Bool().Draw(t, "leave") {
						delete(live, id)
					}
				}
			default:
				for id := range live {
					live[id] = rapid.SampledFrom([]float64{0, 1, 2}).Draw(t, "weight")
				}
			}
			var members []placement.Member
			for id, w := range live {
				members = append(members, placement.Member{ID: id, Weight: w})
			}
			in := balanceInput{cur, members}
			p, err := placement.Balance(cur, members)
			if err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			checkBalance(t, in, p)
			cur = p.Assignment
		}
	})
}

func TestBalanceEdgeCases(t *testing.T) {
	eq := func(ids ...string) []placement.Member {
		var ms []placement.Member
		for _, id := range ids {
			ms = append(ms, placement.Member{ID: id, Weight: 1})
		}
		return ms
	}
	for _, tc := range []struct {
		name    string
		buckets int
		first   []placement.Member
		then    []placement.Member
		counts  map[string]int
		moves   int
	}{
		{"one member", 16, nil, eq("a"), map[string]int{"a": 16}, 16},
		{"one bucket many members", 1, eq("a"), eq("a", "b", "c"), map[string]int{"a": 1}, 0},
		{"as many members as buckets", 4, eq("a"), eq("a", "b", "c", "d"), map[string]int{"a": 1, "b": 1, "c": 1, "d": 1}, 3},
		{"more members than buckets keeps holders", 2, eq("a", "b"), eq("a", "b", "c"), map[string]int{"a": 1, "b": 1}, 0},
		{"join takes from each", 12, eq("a", "b", "c"), eq("a", "b", "c", "d"), map[string]int{"a": 3, "b": 3, "c": 3, "d": 3}, 3},
		{"leave spreads", 12, eq("a", "b", "c", "d"), eq("a", "b", "c"), map[string]int{"a": 4, "b": 4, "c": 4}, 3},
		{"all gone", 8, eq("a", "b"), nil, map[string]int{}, 8},
		{"draining member", 8, eq("a", "b"), []placement.Member{{ID: "a", Weight: 1}, {ID: "b", Weight: 0}}, map[string]int{"a": 8}, 4},
		{"only draining members keep", 8, eq("a", "b"), []placement.Member{{ID: "a"}, {ID: "b"}}, map[string]int{"a": 4, "b": 4}, 0},
		{"weights 1:3", 8, eq("a", "b"), []placement.Member{{ID: "a", Weight: 1}, {ID: "b", Weight: 3}}, map[string]int{"a": 2, "b": 6}, 2},
		{"swap two members", 10, eq("a", "b"), eq("c", "d"), map[string]int{"c": 5, "d": 5}, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := placement.NewAssignment(tc.buckets)
			if tc.first != nil {
				p, err := placement.Balance(cur, tc.first)
				if err != nil {
					t.Fatal(err)
				}
				cur = p.Assignment
			}
			p, err := placement.Balance(cur, tc.then)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.counts, p.Assignment.Counts()); d != "" {
				t.Errorf("counts (-want +got):\n%s", d)
			}
			if len(p.Moves) != tc.moves {
				t.Errorf("%d moves, want %d: %v", len(p.Moves), tc.moves, p.Moves)
			}
		})
	}
}

func TestBalanceReasons(t *testing.T) {
	p, _ := placement.Balance(placement.NewAssignment(6), []placement.Member{{ID: "a", Weight: 1}, {ID: "b", Weight: 1}, {ID: "c", Weight: 1}})
	p2, _ := placement.Balance(p.Assignment, []placement.Member{{ID: "a", Weight: 1}, {ID: "b", Weight: 0}, {ID: "d", Weight: 1}, {ID: "e", Weight: 1}})
	got := map[placement.MoveReason]int{}
	for _, m := range p2.Moves {
		got[m.Reason]++
	}
	want := map[placement.MoveReason]int{placement.ReasonDraining: 2, placement.ReasonOrphaned: 2}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("reasons (-want +got):\n%s", d)
	}
	p3, _ := placement.Balance(p2.Assignment, []placement.Member{{ID: "a", Weight: 1}, {ID: "d", Weight: 1}, {ID: "e", Weight: 1}, {ID: "f", Weight: 1}, {ID: "g", Weight: 1}, {ID: "h", Weight: 1}})
	for _, m := range p3.Moves {
		if m.Reason != placement.ReasonOverTarget {
			t.Errorf("move %+v: want reason over-target", m)
		}
	}
	p4, _ := placement.Balance(p3.Assignment, nil)
	for _, m := range p4.Moves {
		if m.Reason != placement.ReasonNoMember || m.To != "" {
			t.Errorf("move %+v: want reason no-member to nobody", m)
		}
	}
}

func TestBalanceErrors(t *testing.T) {
	ok := placement.NewAssignment(4)
	for _, tc := range []struct {
		name    string
		cur     placement.Assignment
		members []placement.Member
		want    string
	}{
		{"no buckets", placement.Assignment{}, nil, "bucket count 0 is out of range"},
		{"owner index", placement.Assignment{Members: []string{"a"}, Owners: []int32{0, 3}}, nil, "bucket 1 has owner index 3"},
		{"duplicate assignment member", placement.Assignment{Members: []string{"a", "a"}, Owners: []int32{0}}, nil, `"a" appears twice`},
		{"empty member ID", ok, []placement.Member{{ID: "", Weight: 1}}, "empty ID"},
		{"duplicate member", ok, []placement.Member{{ID: "x", Weight: 1}, {ID: "x", Weight: 2}}, `member ID "x" appears twice`},
		{"negative weight", ok, []placement.Member{{ID: "x", Weight: -1}}, `member "x" has weight -1`},
		{"NaN weight", ok, []placement.Member{{ID: "x", Weight: math.NaN()}}, `member "x" has weight NaN`},
		{"Inf weight", ok, []placement.Member{{ID: "x", Weight: math.Inf(1)}}, `member "x" has weight +Inf`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := placement.Balance(tc.cur, tc.members)
			if !errors.Is(err, placement.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
}

// genFuzzInput builds an input from fuzz bytes so the fuzzer explores
// assignments and member sets, including malformed ones.
func genFuzzInput(seed uint64, nodes, old uint8, buckets uint16) balanceInput {
	r := rand.New(rand.NewPCG(seed, 1))
	cur := placement.NewAssignment(int(buckets%2048) + 1)
	for i := range int(old % 12) {
		cur.Members = append(cur.Members, fmt.Sprintf("m%d", i))
	}
	for b := range cur.Owners {
		cur.Owners[b] = int32(r.IntN(len(cur.Members)+1)) - 1
	}
	var ms []placement.Member
	for i := range int(nodes % 40) {
		ms = append(ms, placement.Member{ID: fmt.Sprintf("m%d", r.IntN(int(nodes%40)+3)+i*0), Weight: float64(r.IntN(4))})
	}
	return balanceInput{cur, ms}
}

func FuzzBalance(f *testing.F) {
	f.Add(uint64(1), uint8(3), uint8(0), uint16(1023))
	f.Add(uint64(2), uint8(10), uint8(5), uint16(4095))
	f.Add(uint64(3), uint8(0), uint8(4), uint16(7))
	f.Add(uint64(4), uint8(39), uint8(11), uint16(0))
	f.Fuzz(func(t *testing.T, seed uint64, nodes, old uint8, buckets uint16) {
		in := genFuzzInput(seed, nodes, old, buckets)
		p, err := placement.Balance(in.Cur, in.Members)
		if err != nil {
			if !errors.Is(err, placement.ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		if len(in.Members) <= 8 {
			checkBalance(t, in, p)
		}
	})
}

// A share a rounding error below a whole number gets that number:
// 276 × 3 / 7.2 is 114.99999999999999 in float64, and the member of
// weight 3 must get 115 (found by TestBalanceProperties).
func TestBalanceShareRounding(t *testing.T) {
	ms := []placement.Member{{ID: "a", Weight: 0.5}, {ID: "b", Weight: 1}, {ID: "c", Weight: 1}, {ID: "d", Weight: 3}, {ID: "e", Weight: 1.7}}
	// Everyone but d holds more than its share, so the remainder goes to
	// them first: d gets only what its floor says.
	cur := placement.NewAssignment(276)
	cur.Members = []string{"a", "b", "c", "e"}
	for b := range cur.Owners {
		cur.Owners[b] = int32(b % 4)
	}
	p, err := placement.Balance(cur, ms)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Assignment.Counts()["d"]; got != 115 {
		t.Errorf("member of weight 3 of 7.2 over 276 buckets has %d; want 115", got)
	}
}
