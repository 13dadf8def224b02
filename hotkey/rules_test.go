package hotkey

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

func TestParseRules(t *testing.T) {
	text := `
# operator rules
drop token:abc
	dead-letter   token:*   # every token
skip-stateful team:7:*
overflow user:42,user:43
overflow batch:* spread
junk anonymous,null,undefined,NULL
` + "overflow crlf:1\r\n"
	rs, err := ParseRules(text)
	if err != nil {
		t.Fatal(err)
	}
	want := []Rule{
		{Action: RuleDrop, Pattern: "token:abc"},
		{Action: RuleDeadLetter, Pattern: "token:*"},
		{Action: RuleSkipStateful, Pattern: "team:7:*"},
		{Action: RuleOverflow, Pattern: "user:42"},
		{Action: RuleOverflow, Pattern: "user:43"},
		{Action: RuleOverflow, Pattern: "batch:*", Spread: true},
		{Action: RuleJunk, Pattern: "anonymous"},
		{Action: RuleJunk, Pattern: "null"},
		{Action: RuleJunk, Pattern: "undefined"},
		{Action: RuleJunk, Pattern: "NULL"},
		{Action: RuleOverflow, Pattern: "crlf:1"},
	}
	if diff := cmp.Diff(want, rs.Rules()); diff != "" {
		t.Errorf("Rules() mismatch (-want +got):\n%s", diff)
	}
	again, err := ParseRules(rs.String())
	if err != nil {
		t.Fatalf("ParseRules(String()) = %v\n%s", err, rs.String())
	}
	if diff := cmp.Diff(rs.Rules(), again.Rules()); diff != "" {
		t.Errorf("round trip mismatch (-want +got):\n%s", diff)
	}
	if empty, err := ParseRules("\n  # nothing\n\n"); err != nil || len(empty.Rules()) != 0 {
		t.Errorf("empty rules: %v, %v", empty.Rules(), err)
	}
}

func TestParseRulesErrors(t *testing.T) {
	tests := []struct {
		text string
		line int
		want string // in the message, after the rule
	}{
		{"dorp token:abc", 1, `"dorp token:abc": unknown action "dorp" (want drop, dead-letter, skip-stateful, overflow or junk)`},
		{"drop a\n\ndrop", 3, `"drop": drop needs a pattern`},
		{"drop a,,b", 1, `empty pattern`},
		{"overflow user:*:x", 1, `has '*' before its end`},
		{"overflow *user", 1, `has '*' before its end`},
		{"drop a spread", 1, `spread applies only to overflow and junk, not drop`},
		{"overflow a sprad", 1, `unknown option "sprad" (want spread)`},
		{"overflow a spread spread", 1, `option "spread" repeated`},
		{"dead-letter a\x01b", 1, `contains a space or control character`},
		{"junk " + strings.Repeat("x", MaxPatternLen+1), 1, `pattern longer than 1024 bytes`},
		{"overflow a\noverflow b,a spread", 2, `"overflow a spread": conflicts with "overflow a": spread differs`},
		{"junk Null\njunk null spread", 2, `conflicts with "junk Null"`},
		{"Drop a", 1, `unknown action "Drop"`},
	}
	for _, tt := range tests {
		_, err := ParseRules(tt.text)
		if !errors.Is(err, ErrBadRule) {
			t.Errorf("ParseRules(%q) error = %v, want ErrBadRule", tt.text, err)
			continue
		}
		var re *RuleError
		if !errors.As(err, &re) || re.Line != tt.line {
			t.Errorf("ParseRules(%q) error %v: want a *RuleError at line %d", tt.text, err, tt.line)
		}
		if !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "hotkey: bad rule at line ") {
			t.Errorf("ParseRules(%q) error\n  %q\ndoes not name the line and contain\n  %q", tt.text, err, tt.want)
		}
	}
}

func TestCompileRulesErrors(t *testing.T) {
	tests := []struct {
		rules []Rule
		index int
		want  string
	}{
		{[]Rule{{Action: RuleDrop, Pattern: "a"}, {Action: 0, Pattern: "b"}}, 1, "unknown action 0"},
		{[]Rule{{Action: 9, Pattern: "b"}}, 0, "unknown action 9"},
		{[]Rule{{Action: RuleDrop, Pattern: ""}}, 0, "empty pattern"},
		{[]Rule{{Action: RuleDrop, Pattern: "a b"}}, 0, "space or control"},
		{[]Rule{{Action: RuleDrop, Pattern: "a#b"}}, 0, `contains '#'`},
		{[]Rule{{Action: RuleDrop, Pattern: "a,b"}}, 0, `contains ','`},
		{[]Rule{{Action: RuleSkipStateful, Pattern: "a", Spread: true}}, 0, "spread applies only"},
		{[]Rule{{Action: RuleOverflow, Pattern: "a*"}, {Action: RuleOverflow, Pattern: "a*", Spread: true}}, 1, "conflicts"},
	}
	for _, tt := range tests {
		_, err := CompileRules(tt.rules)
		var re *RuleError
		if !errors.Is(err, ErrBadRule) || !errors.As(err, &re) || re.Index != tt.index || re.Line != 0 {
			t.Errorf("CompileRules(%v) = %v, want a *RuleError at index %d", tt.rules, err, tt.index)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "rules[") {
			t.Errorf("CompileRules(%v) error %q does not contain %q", tt.rules, err, tt.want)
		}
	}
	// Bytes beyond ASCII are allowed.
	if _, err := CompileRules([]Rule{{Action: RuleOverflow, Pattern: "ü\xff*"}}); err != nil {
		t.Error(err)
	}
}

func TestRulesLookup(t *testing.T) {
	rs, err := ParseRules(`
drop         token:abc
dead-letter  token:*
skip-stateful token:abc,token:skip
overflow     token:hot,user:*
overflow     user:4* spread
overflow     user:42
junk         anonymous,NULL
junk         guest* spread
`)
	if err != nil {
		t.Fatal(err)
	}
	type res struct {
		A      Action
		Spread bool
		OK     bool
	}
	tests := []struct {
		key  string
		want res
	}{
		{"token:abc", res{RuleDrop, false, true}},        // drop beats dead-letter and skip
		{"token:abcd", res{RuleDeadLetter, false, true}}, // exact rule does not match longer keys
		{"token:", res{RuleDeadLetter, false, true}},     // a prefix matches itself
		{"token:skip", res{RuleDeadLetter, false, true}}, // dead-letter beats skip-stateful
		{"token:hot", res{RuleDeadLetter, false, true}},  // and overflow
		{"token", res{}}, // shorter than the prefix
		{"user:1", res{RuleOverflow, false, true}},  // user:*
		{"user:4", res{RuleOverflow, true, true}},   // user:4* is more specific and spreads
		{"user:43", res{RuleOverflow, true, true}},  // user:4*
		{"user:42", res{RuleOverflow, false, true}}, // exact beats prefix for spread
		{"user:420", res{RuleOverflow, true, true}}, // not the exact rule
		{"anonymous", res{RuleJunk, false, true}},   // junk
		{"AnonyMous", res{RuleJunk, false, true}},   // ASCII case folded
		{"null", res{RuleJunk, false, true}},        // junk NULL folds too
		{"nul", res{}},                              //
		{"anonymous2", res{}},                       // exact junk id only
		{"GUEST-7", res{RuleJunk, true, true}},      // junk prefix, spread
		{"other", res{}},                            //
		{"", res{}},                                 //
		{"\xff\x00", res{}},                         //
	}
	for _, tt := range tests {
		a, sp, ok := rs.Lookup([]byte(tt.key))
		if got := (res{a, sp, ok}); got != tt.want {
			t.Errorf("Lookup(%q) = %+v, want %+v", tt.key, got, tt.want)
		}
	}
	var nilRules *Rules
	if _, _, ok := nilRules.Lookup([]byte("x")); ok || nilRules.String() != "" || nilRules.Rules() != nil {
		t.Error("nil *Rules should match nothing")
	}
	if a := testing.AllocsPerRun(100, func() { rs.Lookup([]byte("user:42")) }); a != 0 {
		t.Errorf("Lookup allocates %v times", a)
	}
}

// TestRulesMatchesReference compares the tries with a linear scan over the
// rules, on random rules and keys over a small alphabet (so that matches are
// frequent), including rule sets wide enough for binary search in a node.
func TestRulesMatchesReference(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		alphabet := rapid.SampledFrom([]string{"ab", "abcdefghijklmnopAB"}).Draw(rt, "alphabet")
		str := func(label string, minLen int) string {
			n := rapid.IntRange(minLen, 4).Draw(rt, label+"Len")
			b := make([]byte, n)
			for i := range b {
				b[i] = alphabet[rapid.IntRange(0, len(alphabet)-1).Draw(rt, label)]
			}
			return string(b)
		}
		n := rapid.IntRange(0, 30).Draw(rt, "nrules")
		var rules []Rule
		for i := 0; i < n; i++ {
			a := Action(rapid.IntRange(int(RuleDrop), int(RuleJunk)).Draw(rt, "action"))
			p := str("pattern", 0)
			if p == "" || rapid.Bool().Draw(rt, "prefix") {
				p += "*"
			}
			spread := (a == RuleOverflow || a == RuleJunk) && rapid.Bool().Draw(rt, "spread")
			rules = append(rules, Rule{Action: a, Pattern: p, Spread: spread})
		}
		rs, err := CompileRules(rules)
		if err != nil {
			if !errors.Is(err, ErrBadRule) || !strings.Contains(err.Error(), "conflicts") {
				rt.Fatalf("unexpected error %v", err)
			}
			return
		}
		for j := 0; j < 20; j++ {
			key := str("key", 0)
			a, sp, ok := rs.Lookup([]byte(key))
			ra, rsp, rok := referenceLookup(rules, key)
			if a != ra || ok != rok || sp != rsp {
				rt.Fatalf("Lookup(%q) = %v %v %v, reference %v %v %v\nrules:\n%s", key, a, sp, ok, ra, rsp, rok, rs)
			}
		}
	})
}

// referenceLookup is the obvious implementation: the highest-priority
// matching action; for it, spread of the most specific matching rule
// (exact, else the longest prefix).
func referenceLookup(rules []Rule, key string) (Action, bool, bool) {
	best := Action(0)
	for _, r := range rules {
		if refMatch(r, key) && (best == 0 || r.Action < best) {
			best = r.Action
		}
	}
	if best == 0 {
		return 0, false, false
	}
	spec, spread := -1, false
	for _, r := range rules {
		if r.Action != best || !refMatch(r, key) {
			continue
		}
		s := len(r.Pattern) - 1 // prefix: its length
		if !strings.HasSuffix(r.Pattern, "*") {
			s = 1 << 30 // exact: most specific
		}
		if s > spec {
			spec, spread = s, r.Spread
		}
	}
	return best, spread, true
}

func refMatch(r Rule, key string) bool {
	p := r.Pattern
	if r.Action == RuleJunk {
		p, key = foldASCII(p), foldASCII(key)
	}
	if prefix, ok := strings.CutSuffix(p, "*"); ok {
		return strings.HasPrefix(key, prefix)
	}
	return key == p
}

// FuzzParseRules: ParseRules never panics; it returns a *RuleError wrapping
// ErrBadRule and naming an existing line, or rules whose String form parses
// back to the same rules.
func FuzzParseRules(f *testing.F) {
	for _, s := range []string{
		"drop token:abc\ndead-letter token:*\noverflow user:42\njunk anonymous,null,undefined",
		"overflow batch:* spread # comment",
		"skip-stateful a*,b*,c",
		"dorp x",
		"overflow a*b",
		"junk NULL\njunk null spread",
		"",
		"#\n\t\r\n drop \xff\xfe",
		"drop *",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		rs, err := ParseRules(text)
		if err != nil {
			var re *RuleError
			if !errors.Is(err, ErrBadRule) || !errors.As(err, &re) {
				t.Fatalf("error %v is not a *RuleError wrapping ErrBadRule", err)
			}
			if re.Line < 1 || re.Line > strings.Count(text, "\n")+1 || re.Reason == "" {
				t.Fatalf("error %v names line %d of a %d-line text", err, re.Line, strings.Count(text, "\n")+1)
			}
			return
		}
		again, err := ParseRules(rs.String())
		if err != nil {
			t.Fatalf("String() does not parse: %v\n%s", err, rs)
		}
		if diff := cmp.Diff(rs.Rules(), again.Rules()); diff != "" {
			t.Fatalf("round trip mismatch (-want +got):\n%s", diff)
		}
		for _, r := range rs.Rules() {
			key := strings.TrimSuffix(r.Pattern, "*")
			if _, _, ok := rs.Lookup([]byte(key)); !ok {
				t.Fatalf("rule %v does not match %q", r, key)
			}
		}
	})
}
