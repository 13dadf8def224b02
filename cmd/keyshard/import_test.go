package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keyshard/keyshard/keyshardtest"
)

// TestKeyspaceImport: keyshard keyspace import against a real server:
// the output names the keyspace, the buckets and position of each
// instance and what to do next; bad flags are refused naming the flag,
// locally or from the server's answer.
func TestKeyspaceImport(t *testing.T) {
	url := keyshardtest.NewServer(t, keyshardtest.Options{}).URL()
	run := func(args ...string) (string, error) {
		out, _, err := runCLI(t, append(append([]string{"keyspace", "import"}, args...), "--server", url)...)
		return out, err
	}
	out, err := run("federation", "--mode", "stream", "--instance", "sender1=120394", "--instance", "sender2=120211", "--instance", "sender3=120377")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"imported keyspace federation: 4095 buckets, hash synapse-sha256, mode stream",
		"(4095 buckets: the multiple of 3 instances nearest 4096)",
		"map epoch 1 reproduces sha256(key) mod 3",
		"1         sender2    1365     120211",
		"Next: start each instance as a member of federation with the member id above.",
		"for at most 10m0s",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	positions := filepath.Join(t.TempDir(), "positions.txt")
	if err := os.WriteFile(positions, []byte("# sender positions\nsender1 10\nsender2=20\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = run("fromfile", "--mode", "stream", "--positions-file", positions, "--buckets", "64", "--wait-for-instances", "1h")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "0         sender1    32       10") || !strings.Contains(out, "1         sender2    32       20") || !strings.Contains(out, "for at most 1h0m0s") {
		t.Errorf("import from a positions file:\n%s", out)
	}
	out, err = run("persisters", "--instances", "p1,p2")
	if err != nil || !strings.Contains(out, "mode exclusive") || strings.Contains(out, "POSITION") {
		t.Fatalf("exclusive import: %v\n%s", err, out)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"federation", "--instances", "a"}, `keyspace "federation" already exists`},
		{[]string{"x"}, "--instance: name the instances"},
		{[]string{"x", "--instances", "a,b,a"}, `--instances a,b,a: "a" is named twice`},
		{[]string{"x", "--instances", "a,b/c"}, "--instances a,b/c: member id \"b/c\" has '/'"},
		{[]string{"x", "--instance", "a=1"}, "--instance a=1: positions are for --mode stream"},
		{[]string{"x", "--mode", "stream", "--instance", "a=1", "--instance", "b"}, "--instance b: b has no position"},
		{[]string{"x", "--mode", "stream", "--instance", "a=x"}, `--instance a=x: position "x" is not a whole number`},
		{[]string{"x", "--instances", "a,b,c", "--buckets", "4096"}, "--buckets 4096: bucket count 4096 is not a multiple of the 3 instances, so the Synapse mapping cannot be kept; use 4095 or 4098 buckets"},
		{[]string{"x", "--instances", "a", "--wait-for-instances", "25h"}, "--wait-for-instances 25h0m0s"},
		{[]string{"x", "--instances", "a", "--mode", "batch"}, `--mode "batch"`},
		{[]string{"x", "--instances", "a", "--instance", "b"}, "--instance and --instances: use one of them"},
		{[]string{"x", "--instances", "a", "--lease-ttl", "1s"}, "--lease-ttl: "},
		{[]string{"x", "--mode", "stream", "--instance", "a=1", "--positions-file", positions}, `"sender1" is not one of the instances`},
	} {
		if _, err := run(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v; want an error containing %q", tc.args, err, tc.want)
		}
	}
}
