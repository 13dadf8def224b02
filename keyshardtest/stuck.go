package keyshardtest

import (
	"bytes"
	"fmt"
	"runtime/pprof"
	"strings"
)

// goroutinesLabelled returns the stacks of the goroutines that carry the
// pprof label goroutineLabel=value, from the goroutine profile.
func goroutinesLabelled(value string) string {
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
		return fmt.Sprintf("(no goroutine profile: %v)", err)
	}
	return labelled(buf.String(), goroutineLabel, value)
}

// labelled keeps the records of a goroutine profile in its debug=1 text
// form whose labels include key=value. Each record is a count and stack
// ("3 @ 0x..."), a "# labels: {...}" line if the goroutines have labels,
// and one "#\t..." line per frame, ending with a blank line.
func labelled(profile, key, value string) string {
	want := fmt.Sprintf("%q:%q", key, value)
	var out []string
	for _, rec := range strings.Split(profile, "\n\n") {
		if header, rest, ok := strings.Cut(rec, "\n"); ok && strings.HasPrefix(header, "goroutine profile:") {
			rec = rest
		}
		for _, line := range strings.Split(rec, "\n") {
			if labels, ok := strings.CutPrefix(line, "# labels: "); ok && labelsHave(labels, want) {
				out = append(out, strings.TrimSpace(rec))
				break
			}
		}
	}
	if len(out) == 0 {
		return "(none labelled " + want + ")"
	}
	return strings.Join(out, "\n\n")
}

// labelsHave reports whether labels, as pprof prints them
// ({"k1":"v1", "k2":"v2"}), hold the pair kv.
func labelsHave(labels, kv string) bool {
	labels = strings.TrimSuffix(strings.TrimPrefix(labels, "{"), "}")
	for _, pair := range strings.Split(labels, ", ") {
		if pair == kv {
			return true
		}
	}
	return false
}
