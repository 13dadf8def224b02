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

// TestServeLimitFlags: the limit flags reach the config, whose validation
// names the key of a bad value before anything starts.
func TestServeLimitFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-long-polls", "-1"}, "limits.max_long_polls: -1"},
		{[]string{"--max-request-bytes", "-4"}, "limits.max_request_bytes: -4"},
		{[]string{"--max-report-bytes", "2147483648"}, "limits.max_report_bytes: 2147483648"},
		{[]string{"--max-lookup-keys", "-1"}, "limits.max_lookup_keys"},
		{[]string{"--max-lookup-key-bytes", "-1"}, "limits.max_lookup_key_bytes"},
	} {
		args := append([]string{"serve", "--data-dir", t.TempDir()}, tc.args...)
		_, _, err := runCLI(t, args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}
