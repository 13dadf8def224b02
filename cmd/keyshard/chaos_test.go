package main

import (
	"strings"
	"testing"
)

// TestChaosBadFlags shows that `keyshard chaos` refuses bad flags before
// it starts anything, with a message naming what is wrong.
func TestChaosBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"chaos", "--faults", "worker-kill,meteor"}, `unknown fault kind "meteor"; the kinds are worker-kill`},
		{[]string{"chaos", "--ttl", "100ms"}, "TTL 100ms: want at least 1s"},
		{[]string{"chaos", "--workers", "1"}, "1 workers: want at least 2"},
		{[]string{"chaos", "--buckets", "2"}, "2 buckets for 4 workers"},
		{[]string{"chaos", "--seed", "-4"}, "--seed -4: want a non-negative number"},
		{[]string{"chaos", "worker", "--id", "w1"}, "--server, --sink, --keyspace and --id are required"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, _, err := runCLI(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
