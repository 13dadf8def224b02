package hotkey_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/keyshard/keyshard/hotkey"
)

func ExampleDetector() {
	d, err := hotkey.NewDetector(hotkey.DetectorConfig{
		Threshold:    100,         // hot at 100 msg/s
		HalfLife:     time.Second, // rates average over about 1.4 s
		MaxTotalRate: 50_000,      // sized so that recall holds up to 50k msg/s in total
	})
	if err != nil {
		panic(err)
	}
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	var now time.Time
	for i := 0; i < 5000; i++ { // 5 s at 1000 msg/s
		now = start.Add(time.Duration(i) * time.Millisecond)
		if i%5 == 0 {
			d.Observe([]byte("user:42"), now) // 200 msg/s
		} else {
			d.Observe(fmt.Appendf(nil, "user:%d", 1000+i), now) // a fresh key each time
		}
	}
	for _, h := range d.AppendHot(nil, now) {
		fmt.Printf("%s ≈ %.0f msg/s (at least %.0f)\n", h.Key, h.Rate, h.Lower())
	}
	fmt.Println("slots:", d.Capacity(), "memory fixed:", d.MemoryBytes() < 1<<20)
	// Output:
	// user:42 ≈ 194 msg/s (at least 194)
	// slots: 5000 memory fixed: true
}

func ExampleParseRules() {
	rules, err := hotkey.ParseRules(`
# operator rules, highest priority first
drop        token:abusive
dead-letter token:revoked:*
overflow    user:42
junk        anonymous,null,undefined
`)
	if err != nil {
		panic(err)
	}
	for _, key := range []string{"token:abusive", "token:revoked:7", "user:42", "NULL", "user:7"} {
		a, _, ok := rules.Lookup([]byte(key))
		fmt.Println(key, a, ok)
	}

	_, err = hotkey.ParseRules("drop token:a\noverflow user:*:x")
	fmt.Println(errors.Is(err, hotkey.ErrBadRule))
	fmt.Println(err)
	// Output:
	// token:abusive drop true
	// token:revoked:7 dead-letter true
	// user:42 overflow true
	// NULL junk true
	// user:7 Action(0) false
	// true
	// hotkey: bad rule at line 2 "overflow user:*:x": pattern "user:*:x" has '*' before its end (only a final '*' is allowed)
}

func ExamplePolicy_Decide() {
	rules, _ := hotkey.ParseRules("drop token:abusive\njunk anonymous")
	p, err := hotkey.NewPolicy(hotkey.PolicyConfig{
		Detector:     hotkey.DetectorConfig{Threshold: 100, HalfLife: time.Second, MaxTotalRate: 10_000},
		LowThreshold: 50,
		Cooldown:     10 * time.Second,
		Rules:        rules,
	})
	if err != nil {
		panic(err)
	}
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	fmt.Println(p.Decide([]byte("token:abusive"), start))
	fmt.Println(p.Decide([]byte("Anonymous"), start))
	d := p.Decide(nil, start)
	fmt.Println(d, d.Err())

	// user:1 sends 1000 msg/s: it goes to overflow, keyed, and stays there.
	var last hotkey.Decision
	var now time.Time
	for i := 0; i < 1000; i++ {
		now = start.Add(time.Duration(i) * time.Millisecond)
		if d := p.Decide([]byte("user:1"), now); d != last {
			fmt.Println(i, d)
			last = d
		}
	}
	// It goes quiet; the overflow consumers report its backlog processed.
	p.MarkDrained([]byte("user:1"), now)
	fmt.Println(p.Decide([]byte("user:1"), now.Add(5*time.Second)))  // still cooling down
	p.MarkDrained([]byte("user:1"), now.Add(5*time.Second))          // that one too
	fmt.Println(p.Decide([]byte("user:1"), now.Add(20*time.Second))) // cooled and drained
	c := p.Counters()
	fmt.Println("entered", c.Entered, "released", c.Released, "overflow/detected", c.Count(hotkey.Overflow, hotkey.Detected))
	// Output:
	// drop/drop_rule
	// overflow/junk_key
	// rejected/missing_key hotkey: message has no key
	// 0 main/not_hot
	// 136 overflow/detected
	// overflow/sticky
	// main/released
	// entered 2 released 1 overflow/detected 864
}
