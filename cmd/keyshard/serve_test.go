package main

import (
	"strings"
	"testing"
)

// TestServeElectionTTLFlag: a bad --election-ttl is refused before
// anything starts, naming the field and the flag.
func TestServeElectionTTLFlag(t *testing.T) {
	for _, tc := range []struct{ ttl, want string }{
		{"1s", "election_ttl: 1s; want whole seconds from 2s to 1m0s (flag --election-ttl"},
		{"90s", "election_ttl: 1m30s; want whole seconds from 2s to 1m0s (flag --election-ttl"},
		{"2500ms", "election_ttl: 2.5s; want whole seconds"},
	} {
		t.Run(tc.ttl, func(t *testing.T) {
			_, _, err := runCLI(t, "serve", "--data-dir", t.TempDir(), "--election-ttl", tc.ttl)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
