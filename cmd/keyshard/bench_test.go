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
		{[]string{"bench", "clients", "--runs", "0"}, "--runs is 0"},
		{[]string{"bench", "clients", "--cycles", "-1"}, "--cycles is -1"},
		{[]string{"bench", "clients", "--langs", "go,ruby"}, `--langs: unknown language "ruby"`},
		{[]string{"bench", "clients", "--langs", ","}, "--langs: no language"},
		{[]string{"bench", "clients", "--langs", "python", "--repo", "/nonexistent"}, "python workers"}, // the script is missing (or python3 is),
	} {
		_, _, err := runCLI(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestBenchStreamJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd and times commits")
	}
	out, progress, err := runCLI(t, "bench", "stream", "--json", "--runs", "1")
	if err != nil {
		t.Fatal(err)
	}
	var rep map[string]float64
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	for _, field := range []string{"commit_bytes_uniform_4096", "commit_bytes_16_exceptions", "commits_per_s", "commit_api_p50_ms", "commit_api_p99_ms", "commit_writes_per_call",
		"commits_per_s_store_sequential", "commit_store_p50_ms", "commit_store_p99_ms", "catchup_filter_events_per_s", "catchup_filter_sha256_events_per_s"} {
		if rep[field] <= 0 {
			t.Errorf("%s = %v, want a measured value", field, rep[field])
		}
	}
	// Counts, not timings: the record's size and one write per commit.
	if rep["commit_bytes_uniform_4096"] > 1024 {
		t.Errorf("a uniform commit of 4,096 buckets takes %v bytes, want at most 1,024", rep["commit_bytes_uniform_4096"])
	}
	if rep["commit_store_writes_per_call"] != 1 {
		t.Errorf("%v etcd writes per commit at the store, want 1", rep["commit_store_writes_per_call"])
	}
	if rep["commit_writes_per_call"] > 1 {
		t.Errorf("%v etcd writes per Commit call, want at most 1", rep["commit_writes_per_call"])
	}
	if rep["move_events"] <= 0 || rep["graceful_move_duplicates"] != 0 || rep["crash_duplicates"] > rep["crash_duplicates_bound"] {
		t.Errorf("moves under load: %v events, %v duplicates after graceful moves (want 0), %v after a crash (bound %v)",
			rep["move_events"], rep["graceful_move_duplicates"], rep["crash_duplicates"], rep["crash_duplicates_bound"])
	}
	if rep["move_events"] <= 0 || rep["graceful_move_duplicates"] != 0 || rep["crash_duplicates"] > rep["crash_duplicates_bound"] {
		t.Errorf("moves under load: %v events, %v duplicates after graceful moves (want 0), %v after a crash (bound %v)",
			rep["move_events"], rep["graceful_move_duplicates"], rep["crash_duplicates"], rep["crash_duplicates_bound"])
	}
	if strings.Count(progress, "\n") < 4 {
		t.Errorf("expected progress lines, got:\n%s", progress)
	}
}

func TestBenchTenantsJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd and reports load for a few seconds")
	}
	out, progress, err := runCLI(t, "bench", "tenants", "--json", "--quick", "--runs", "1", "--benchtime", "100000x")
	if err != nil {
		t.Fatalf("%v\n%s", err, progress)
	}
	var rep map[string]float64
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	for _, field := range []string{"tenants", "reporters", "reporters_per_tenant", "aggregate_100k_tenants_100_reporters_cpu", "aggregate_core_cpu", "measure_s",
		"targets_ns", "serves_ns", "growth_tenants", "growth_moved", "growth_minimum", "growth_rounds", "leave_holders", "leave_changed", "leave_changed_by_one",
		"bytes_written_per_tenant_change", "writes_per_tenant_change", "tenants_rewritten", "plan_tenants", "plan_steady_ms", "plan_leave_ms"} {
		if v, ok := rep[field]; !ok || v <= 0 {
			t.Errorf("%s = %v, want a measured value", field, v)
		}
	}
	for _, field := range []string{"etcd_bytes_per_s", "targets_allocs", "growth_size_changes", "leave_size_changes"} {
		if _, ok := rep[field]; !ok {
			t.Errorf("no %s", field)
		}
	}
	// Counts, not timings.
	if rep["targets_allocs"] != 0 {
		t.Errorf("Targets allocates %v times", rep["targets_allocs"])
	}
	if rep["growth_size_changes"] != 0 || rep["leave_size_changes"] != 0 {
		t.Errorf("sizes changed: %v on growth, %v on a leave", rep["growth_size_changes"], rep["leave_size_changes"])
	}
	if rep["growth_moved"] < rep["growth_minimum"] {
		t.Errorf("moved %v placements, below the minimum %v: the count or the bound is wrong", rep["growth_moved"], rep["growth_minimum"])
	}
	if rep["leave_changed"] != rep["leave_holders"] || rep["leave_changed_by_one"] != rep["leave_holders"] {
		t.Errorf("a leave changed %v subsets, %v by one member; %v held the leaver", rep["leave_changed"], rep["leave_changed_by_one"], rep["leave_holders"])
	}
	if rep["tenants_rewritten"] != 1 {
		t.Errorf("one tenant's change rewrote %v tenants", rep["tenants_rewritten"])
	}
	if rep["aggregate_100k_tenants_100_reporters_cpu"] > 4 {
		t.Errorf("%v cores on a quick run", rep["aggregate_100k_tenants_100_reporters_cpu"])
	}
	if strings.Count(progress, "\n") < 5 {
		t.Errorf("expected progress lines, got:\n%s", progress)
	}
}
