package hotkey

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrBadRule is wrapped by every *RuleError. Branch on it with errors.Is.
var ErrBadRule = errors.New("hotkey: bad rule")

// MaxPatternLen bounds the length of a rule pattern.
const MaxPatternLen = 1024

// Action is what a rule does to the keys it matches. Actions are listed in
// priority order: when rules of several actions match a key, the first wins.
type Action uint8

const (
	// RuleDrop drops the message (counted, never sent).
	RuleDrop Action = iota + 1
	// RuleDeadLetter sends the message to the dead-letter destination.
	RuleDeadLetter
	// RuleSkipStateful keeps the message on main but marks it for processing
	// without per-key state (no row locks, no person updates).
	RuleSkipStateful
	// RuleOverflow forces the key to overflow.
	RuleOverflow
	// RuleJunk lists a known junk id ("anonymous", "null", ...), matched
	// without regard to ASCII case and forced to overflow.
	RuleJunk
)

var actionNames = [...]string{
	RuleDrop:         "drop",
	RuleDeadLetter:   "dead-letter",
	RuleSkipStateful: "skip-stateful",
	RuleOverflow:     "overflow",
	RuleJunk:         "junk",
}

func (a Action) String() string {
	if a >= RuleDrop && a <= RuleJunk {
		return actionNames[a]
	}
	return fmt.Sprintf("Action(%d)", uint8(a))
}

func (a Action) bit() uint8 { return 1 << (a - 1) }

const (
	bitDrop     = 1 << (RuleDrop - 1)
	bitDead     = 1 << (RuleDeadLetter - 1)
	bitSkip     = 1 << (RuleSkipStateful - 1)
	bitOverflow = 1 << (RuleOverflow - 1)
	bitJunk     = 1 << (RuleJunk - 1)
)

// Rule is one operator rule.
type Rule struct {
	Action Action
	// Pattern is an exact key, or a prefix followed by one '*' that matches
	// every key starting with the prefix (the prefix itself included; "*"
	// alone matches every key). It must be non-empty, at most MaxPatternLen
	// bytes, and contain no ASCII space or control character, ',' or '#',
	// and no '*' but a final one.
	Pattern string
	// Spread sends the key's messages to a random overflow partition instead
	// of the key's own. Only for RuleOverflow and RuleJunk, and only for
	// stateless processing: it gives up per-key ordering and locality.
	Spread bool
}

// String returns the rule in the text syntax of ParseRules.
func (r Rule) String() string {
	if r.Spread {
		return r.Action.String() + " " + r.Pattern + " spread"
	}
	return r.Action.String() + " " + r.Pattern
}

// RuleError describes a rule that was rejected.
type RuleError struct {
	// Line is the 1-based line of the rule in ParseRules' text, or 0 for
	// CompileRules.
	Line int
	// Index is the 0-based index of the rule in CompileRules' argument, or
	// -1 for ParseRules.
	Index int
	// Rule is the offending rule as written.
	Rule string
	// Reason says what is wrong.
	Reason string
}

func (e *RuleError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("hotkey: bad rule at line %d %q: %s", e.Line, e.Rule, e.Reason)
	}
	return fmt.Sprintf("hotkey: bad rule rules[%d] %q: %s", e.Index, e.Rule, e.Reason)
}

// Unwrap returns ErrBadRule.
func (e *RuleError) Unwrap() error { return ErrBadRule }

// Rules is a compiled, immutable rule set, safe for concurrent use.
// A nil *Rules matches nothing.
type Rules struct {
	list []Rule
	main trie // drop, dead-letter, skip-stateful, overflow; exact bytes
	junk trie // junk; ASCII case folded
}

// ParseRules compiles rules written one per line:
//
//	# comment; blank lines are ignored
//	drop         token:abc             # exact key
//	dead-letter  token:*               # every key starting with "token:"
//	skip-stateful team:7:*
//	overflow     user:42,user:43       # several patterns, comma-separated
//	overflow     batch:* spread        # random overflow partition (stateless only)
//	junk         anonymous,null,undefined
//
// The first word is the action (drop, dead-letter, skip-stateful, overflow,
// junk), then a comma-separated list of patterns (see Rule.Pattern), then
// optionally "spread" (overflow and junk only). Words are separated by ASCII
// spaces or tabs; '#' starts a comment. Errors are *RuleError values naming
// the line and wrapping ErrBadRule.
func ParseRules(text string) (*Rules, error) {
	var list []Rule
	lines := make([]int, 0, 8)
	for n, line := range strings.Split(text, "\n") {
		lineNo := n + 1
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		fields := splitFields(line)
		if len(fields) == 0 {
			continue
		}
		bad := func(format string, args ...any) error {
			return &RuleError{Line: lineNo, Index: -1, Rule: strings.Join(fields, " "), Reason: fmt.Sprintf(format, args...)}
		}
		act, ok := parseAction(fields[0])
		if !ok {
			return nil, bad("unknown action %q (want drop, dead-letter, skip-stateful, overflow or junk)", fields[0])
		}
		if len(fields) < 2 {
			return nil, bad("%s needs a pattern", act)
		}
		spread := false
		for _, opt := range fields[2:] {
			switch opt {
			case "spread":
				if spread {
					return nil, bad("option %q repeated", opt)
				}
				spread = true
			default:
				return nil, bad("unknown option %q (want spread)", opt)
			}
		}
		for _, p := range strings.Split(fields[1], ",") {
			r := Rule{Action: act, Pattern: p, Spread: spread}
			if reason := r.check(); reason != "" {
				return nil, bad("%s", reason)
			}
			list = append(list, r)
			lines = append(lines, lineNo)
		}
	}
	rs, idx, reason := compile(list)
	if reason != "" {
		return nil, &RuleError{Line: lines[idx], Index: -1, Rule: list[idx].String(), Reason: reason}
	}
	return rs, nil
}

// CompileRules compiles rules given as values. Errors are *RuleError values
// naming the index of the rule and wrapping ErrBadRule.
func CompileRules(rules []Rule) (*Rules, error) {
	for i, r := range rules {
		if reason := r.check(); reason != "" {
			return nil, &RuleError{Index: i, Rule: r.String(), Reason: reason}
		}
	}
	rs, idx, reason := compile(slices.Clone(rules))
	if reason != "" {
		return nil, &RuleError{Index: idx, Rule: rules[idx].String(), Reason: reason}
	}
	return rs, nil
}

// Rules returns a copy of the rules, in the order given.
func (rs *Rules) Rules() []Rule {
	if rs == nil {
		return nil
	}
	return slices.Clone(rs.list)
}

// String returns the rules in the text syntax of ParseRules, one per line.
// ParseRules(rs.String()) yields the same rules.
func (rs *Rules) String() string {
	if rs == nil {
		return ""
	}
	var b strings.Builder
	for _, r := range rs.list {
		b.WriteString(r.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// Lookup returns the action of the highest-priority rule matching key and,
// for overflow and junk, whether the most specific matching rule of that
// action spreads. ok is false when no rule matches.
func (rs *Rules) Lookup(key []byte) (a Action, spread bool, ok bool) {
	mask, sp := rs.match(key)
	if mask == 0 {
		return 0, false, false
	}
	for a = RuleDrop; a <= RuleJunk; a++ {
		if mask&a.bit() != 0 {
			return a, sp&a.bit() != 0, true
		}
	}
	return 0, false, false
}

// match returns the bit set of the actions matching key, and of those whose
// most specific matching rule spreads.
func (rs *Rules) match(key []byte) (mask, spread uint8) {
	if rs == nil {
		return 0, 0
	}
	mask, spread = rs.main.match(key, false)
	if len(rs.junk.nodes) > 0 {
		m, s := rs.junk.match(key, true)
		mask |= m
		spread |= s
	}
	return mask, spread
}

func parseAction(s string) (Action, bool) {
	for a := RuleDrop; a <= RuleJunk; a++ {
		if actionNames[a] == s {
			return a, true
		}
	}
	return 0, false
}

// splitFields splits s at runs of ASCII spaces and tabs (and other ASCII
// whitespace), never at other bytes, so that it inverts Rule.String.
func splitFields(s string) []string {
	var out []string
	start := -1
	for i := 0; i < len(s); i++ {
		if isSep(s[i]) {
			if start >= 0 {
				out = append(out, s[start:i])
				start = -1
			}
		} else if start < 0 {
			start = i
		}
	}
	if start >= 0 {
		out = append(out, s[start:])
	}
	return out
}

func isSep(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f' }

// check returns why r is invalid, or "".
func (r Rule) check() string {
	if r.Action < RuleDrop || r.Action > RuleJunk {
		return fmt.Sprintf("unknown action %d", uint8(r.Action))
	}
	p := r.Pattern
	switch {
	case p == "":
		return "empty pattern"
	case len(p) > MaxPatternLen:
		return fmt.Sprintf("pattern longer than %d bytes", MaxPatternLen)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c <= ' ' || c == 0x7f:
			return fmt.Sprintf("pattern %q contains a space or control character", p)
		case c == ',' || c == '#':
			return fmt.Sprintf("pattern %q contains %q", p, c)
		case c == '*' && i != len(p)-1:
			return fmt.Sprintf("pattern %q has '*' before its end (only a final '*' is allowed)", p)
		}
	}
	if r.Spread && r.Action != RuleOverflow && r.Action != RuleJunk {
		return fmt.Sprintf("spread applies only to overflow and junk, not %s", r.Action)
	}
	return ""
}

// compile builds the tries. On a conflict it returns the index of the
// offending rule and the reason.
func compile(list []Rule) (*Rules, int, string) {
	type key struct {
		a Action
		p string
	}
	seen := make(map[key]int, len(list))
	var mb, jb trieBuilder
	for i, r := range list {
		p := r.Pattern
		if r.Action == RuleJunk {
			p = foldASCII(p)
		}
		k := key{r.Action, p}
		if j, ok := seen[k]; ok {
			if list[j].Spread != r.Spread {
				return nil, i, fmt.Sprintf("conflicts with %q: spread differs for the same pattern", list[j].String())
			}
			continue
		}
		seen[k] = i
		b := &mb
		if r.Action == RuleJunk {
			b = &jb
		}
		prefix, isPrefix := strings.CutSuffix(p, "*")
		b.add(prefix, isPrefix, r.Action.bit(), r.Spread)
	}
	return &Rules{list: list, main: mb.build(), junk: jb.build()}, 0, ""
}

// foldASCII lower-cases ASCII letters byte by byte, leaving every other
// byte (valid UTF-8 or not) as it is.
func foldASCII(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c-'A' < 26 {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// trie is a byte trie flattened in breadth-first order: node i+1 is reached
// by edge i, and a node's edges are contiguous and sorted.
type trie struct {
	nodes []tnode
	edges []byte
}

type tnode struct {
	first  int32  // index of the first edge
	n      uint16 // number of edges
	prefix uint8  // actions of prefix rules ending here
	exact  uint8  // actions of exact rules ending here
	pspr   uint8  // prefix rules ending here that spread
	espr   uint8  // exact rules ending here that spread
}

// match walks key down the trie, folding ASCII case if fold is set.
func (t *trie) match(key []byte, fold bool) (mask, spread uint8) {
	if len(t.nodes) == 0 {
		return 0, 0
	}
	nd := &t.nodes[0]
	mask, spread = nd.prefix, nd.pspr
	for _, c := range key {
		if fold && c-'A' < 26 {
			c += 'a' - 'A'
		}
		lo, hi := int(nd.first), int(nd.first)+int(nd.n)
		j := -1
		if hi-lo <= 8 {
			for e := lo; e < hi; e++ {
				if t.edges[e] == c {
					j = e
					break
				}
			}
		} else {
			for lo < hi {
				m := int(uint(lo+hi) >> 1)
				if t.edges[m] < c {
					lo = m + 1
				} else {
					hi = m
				}
			}
			if lo < int(nd.first)+int(nd.n) && t.edges[lo] == c {
				j = lo
			}
		}
		if j < 0 {
			return mask, spread
		}
		nd = &t.nodes[j+1]
		mask |= nd.prefix
		spread = spread&^nd.prefix | nd.pspr
	}
	mask |= nd.exact
	spread = spread&^nd.exact | nd.espr
	return mask, spread
}

type bnode struct {
	kids                      map[byte]*bnode
	prefix, exact, pspr, espr uint8
}

type trieBuilder struct{ root *bnode }

func (b *trieBuilder) add(s string, isPrefix bool, bit uint8, spread bool) {
	if b.root == nil {
		b.root = &bnode{}
	}
	nd := b.root
	for i := 0; i < len(s); i++ {
		if nd.kids == nil {
			nd.kids = make(map[byte]*bnode)
		}
		k := nd.kids[s[i]]
		if k == nil {
			k = &bnode{}
			nd.kids[s[i]] = k
		}
		nd = k
	}
	var sp uint8
	if spread {
		sp = bit
	}
	if isPrefix {
		nd.prefix |= bit
		nd.pspr |= sp
	} else {
		nd.exact |= bit
		nd.espr |= sp
	}
}

func (b *trieBuilder) build() trie {
	if b.root == nil {
		return trie{}
	}
	var t trie
	queue := []*bnode{b.root}
	for qi := 0; qi < len(queue); qi++ {
		nd := queue[qi]
		keys := make([]byte, 0, len(nd.kids))
		for c := range nd.kids {
			keys = append(keys, c)
		}
		slices.Sort(keys)
		t.nodes = append(t.nodes, tnode{
			first: int32(len(t.edges)), n: uint16(len(keys)),
			prefix: nd.prefix, exact: nd.exact, pspr: nd.pspr, espr: nd.espr,
		})
		for _, c := range keys {
			t.edges = append(t.edges, c)
			queue = append(queue, nd.kids[c])
		}
	}
	return t
}
