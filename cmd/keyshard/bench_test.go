package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func runCLI(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	root := newRoot()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), errOut.String(), err
}

func TestBenchPlacementJSON(t *testing.T) {
	out, progress, err := runCLI(t, "bench", "placement", "--json", "--buckets", "64,1024", "--members", "3,10", "--keys", "20000", "--skip-shards", "--runs", "1", "--benchtime", "200x")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Cases []map[string]any `json:"cases"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(rep.Cases) != 4 {
		t.Fatalf("%d cases, want 4", len(rep.Cases))
	}
	for _, c := range rep.Cases {
		for _, field := range []string{"buckets", "members", "lookup_ns", "lookup_allocs", "max_over_mean", "add", "remove", "rebalance_us"} {
			if _, ok := c[field]; !ok {
				t.Errorf("case %v has no %q", c, field)
			}
		}
		for _, mv := range []string{"add", "remove"} {
			m := c[mv].(map[string]any)
			if m["moved"] != m["optimal"] {
				t.Errorf("%s: moved %v, optimal %v", mv, m["moved"], m["optimal"])
			}
		}
		if c["lookup_allocs"].(float64) != 0 {
			t.Errorf("lookup allocates: %v", c)
		}
	}
	if strings.Count(progress, "\n") < 4 {
		t.Errorf("expected a progress line per case, got:\n%s", progress)
	}
}

func TestBenchFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "placement", "--buckets", "70000"}, "--buckets 70000 is out of range"},
		{[]string{"bench", "placement", "--members", "1"}, "--members 1: want at least 2"},
		{[]string{"bench", "placement", "--runs", "0"}, "--runs is 0"},
		{[]string{"bench", "control", "--runs", "0"}, "--runs is 0"},
		{[]string{"bench", "placement", "--benchtime", "soon"}, `--benchtime "soon"`},
		{[]string{"bench", "placement", "extra"}, "unknown command"},
	} {
		_, _, err := runCLI(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want %q", tc.args, err, tc.want)
		}
	}
}
