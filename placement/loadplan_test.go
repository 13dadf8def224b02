package placement_test

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/keyshard/keyshard/placement"
)

func TestBalanceLoadProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := genBalanceInput(t)
		load := make([]float64, in.Cur.Buckets())
		for b := range load {
			load[b] = rapid.SampledFrom([]float64{0, 1, 1, 2, 5, 50}).Draw(t, "load")
		}
		opts := placement.LoadOptions{
			Tolerance: rapid.SampledFrom([]float64{0.05, 0.1, 0.5}).Draw(t, "tolerance"),
			MaxMoves:  rapid.IntRange(-1, 20).Draw(t, "budget"),
		}
		p, err := placement.BalanceLoad(in.Cur, in.Members, load, opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Assignment.Validate(); err != nil {
			t.Fatal(err)
		}
		live := map[string]float64{}
		var total, weights float64
		for _, m := range in.Members {
			live[m.ID] = m.Weight
			weights += m.Weight
		}
		for _, l := range load {
			total += l
		}
		// Moves replay to the result and loads add up.
		got := map[string]float64{}
		for b := range load {
			o := p.Assignment.Owner(b)
			if weights > 0 {
				if w, ok := live[o]; !ok || w == 0 {
					t.Fatalf("bucket %d owned by %q, which cannot own", b, o)
				}
			}
			got[o] += load[b]
		}
		for id, l := range p.MemberLoad {
			if math.Abs(got[id]-l) > 1e-6 {
				t.Fatalf("MemberLoad[%s] = %v, sum of its buckets %v", id, l, got[id])
			}
		}
		loadMoves := 0
		for _, mv := range p.Moves {
			if mv.Reason == placement.ReasonLoad {
				loadMoves++
				if mv.Why == "" || mv.Load == 0 {
					t.Fatalf("load move without evidence: %+v", mv)
				}
			}
		}
		if budget := opts.MaxMoves; budget == 0 && loadMoves > 64 || budget > 0 && loadMoves > budget {
			t.Fatalf("%d load moves over budget %d", loadMoves, opts.MaxMoves)
		}
		if weights == 0 {
			if p.Stopped != placement.StopNoMembers {
				t.Fatalf("stopped %q, want %q", p.Stopped, placement.StopNoMembers)
			}
			return
		}
		// Without orphans, load moves never make the worst member worse.
		orphans := false
		for b := range load {
			if w, ok := live[in.Cur.Owner(b)]; !ok || w == 0 {
				orphans = true
			}
		}
		if !orphans && p.After > p.Before+1e-9 {
			t.Fatalf("imbalance rose from %.4f to %.4f", p.Before, p.After)
		}
		if p.Stopped == placement.StopBalanced {
			for id, w := range live {
				if w == 0 {
					continue
				}
				target := total * w / weights
				if target > 0 && math.Abs(p.MemberLoad[id]/target-1) > opts.Tolerance+1e-9 {
					t.Fatalf("stopped balanced but %s at %.3f× target", id, p.MemberLoad[id]/target)
				}
			}
		}
	})
}

func TestBalanceLoadHotBuckets(t *testing.T) {
	// 64 buckets over 4 members, balanced by count, but member a holds all
	// the hot buckets.
	cur, _ := placement.Balance(placement.NewAssignment(64), []placement.Member{{ID: "a", Weight: 1}, {ID: "b", Weight: 1}, {ID: "c", Weight: 1}, {ID: "d", Weight: 1}})
	load := make([]float64, 64)
	for b := range load {
		load[b] = 1
		if cur.Assignment.Owner(b) == "a" && b%2 == 0 {
			load[b] = 10
		}
	}
	members := []placement.Member{{ID: "a", Weight: 1}, {ID: "b", Weight: 1}, {ID: "c", Weight: 1}, {ID: "d", Weight: 1}}
	p, err := placement.BalanceLoad(cur.Assignment, members, load, placement.LoadOptions{Tolerance: 0.1, MaxMoves: 100})
	if err != nil {
		t.Fatal(err)
	}
	if p.Before < 2 {
		t.Fatalf("before = %.2f, the test input should be badly skewed", p.Before)
	}
	if p.Stopped != placement.StopBalanced || p.After > 1.1 {
		t.Fatalf("stopped %q with imbalance %.3f after %d moves", p.Stopped, p.After, len(p.Moves))
	}
	if len(p.Moves) > 10 {
		t.Errorf("%d moves; one hot bucket per move should need about 6", len(p.Moves))
	}
	for _, mv := range p.Moves[:5] {
		if mv.From != "a" || mv.Load != 10 || !strings.HasPrefix(mv.Why, "load: a at ") {
			t.Errorf("move %+v: the first moves should take hot buckets from a", mv)
		}
	}
	// A budget of 2 stops early and says so.
	p2, _ := placement.BalanceLoad(cur.Assignment, members, load, placement.LoadOptions{Tolerance: 0.1, MaxMoves: 2})
	if p2.Stopped != placement.StopBudget || len(p2.Moves) != 2 || p2.After >= p2.Before {
		t.Fatalf("budget 2: stopped %q, %d moves, %.2f → %.2f", p2.Stopped, len(p2.Moves), p2.Before, p2.After)
	}
}

func TestBalanceLoadNoProgress(t *testing.T) {
	// One bucket carries everything: no move can help.
	cur, _ := placement.Balance(placement.NewAssignment(4), []placement.Member{{ID: "a", Weight: 1}, {ID: "b", Weight: 1}})
	load := []float64{100, 0, 0, 0}
	p, err := placement.BalanceLoad(cur.Assignment, []placement.Member{{ID: "a", Weight: 1}, {ID: "b", Weight: 1}}, load, placement.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Stopped != placement.StopNoProgress || len(p.Moves) != 0 {
		t.Fatalf("stopped %q after %d moves", p.Stopped, len(p.Moves))
	}
}

func TestBalanceLoadOrphans(t *testing.T) {
	cur, _ := placement.Balance(placement.NewAssignment(8), []placement.Member{{ID: "a", Weight: 1}, {ID: "b", Weight: 1}})
	load := []float64{1, 1, 1, 1, 1, 1, 1, 1}
	p, err := placement.BalanceLoad(cur.Assignment, []placement.Member{{ID: "a", Weight: 1}, {ID: "c", Weight: 1}}, load, placement.LoadOptions{MaxMoves: -1})
	if err != nil {
		t.Fatal(err)
	}
	orphans := 0
	for _, mv := range p.Moves {
		if mv.Reason == placement.ReasonOrphaned {
			orphans++
			if mv.From != "b" || mv.To != "c" {
				t.Errorf("orphan move %+v: want b → c", mv)
			}
		}
	}
	if orphans != 4 || p.After != 1 {
		t.Fatalf("%d orphan moves, imbalance after %.2f", orphans, p.After)
	}
}

func TestBalanceLoadErrors(t *testing.T) {
	cur := placement.NewAssignment(2)
	for _, tc := range []struct {
		load []float64
		opts placement.LoadOptions
		want string
	}{
		{[]float64{1}, placement.LoadOptions{}, "load has 1 values for 2 buckets"},
		{[]float64{1, -1}, placement.LoadOptions{}, "load of bucket 1 is -1"},
		{[]float64{1, math.NaN()}, placement.LoadOptions{}, "load of bucket 1 is NaN"},
		{[]float64{1, 1}, placement.LoadOptions{Tolerance: -0.5}, "tolerance -0.5"},
	} {
		_, err := placement.BalanceLoad(cur, nil, tc.load, tc.opts)
		if !errors.Is(err, placement.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err = %v, want ErrInvalid mentioning %q", err, tc.want)
		}
	}
}

func FuzzBalanceLoad(f *testing.F) {
	f.Add(uint64(1), uint8(3), uint8(2), uint16(63), 0.1, 8)
	f.Add(uint64(9), uint8(12), uint8(0), uint16(1), 0.0, -1)
	f.Fuzz(func(t *testing.T, seed uint64, nodes, old uint8, buckets uint16, tol float64, budget int) {
		in := genFuzzInput(seed, nodes, old, buckets)
		load := make([]float64, in.Cur.Buckets())
		for b := range load {
			load[b] = float64((uint64(b)*seed)%17) * 1.5
		}
		if budget > 1000 || budget < -1 {
			budget = 1000
		}
		p, err := placement.BalanceLoad(in.Cur, in.Members, load, placement.LoadOptions{Tolerance: tol, MaxMoves: budget})
		if err != nil {
			if !errors.Is(err, placement.ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		if err := p.Assignment.Validate(); err != nil {
			t.Fatal(fmt.Errorf("invalid result: %w", err))
		}
	})
}
