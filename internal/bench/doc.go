// Package bench measures Keyshard against its targets for `keyshard bench`.
//
// Each suite (Placement, Hotkeys) runs real code through testing.Benchmark
// and real workloads, writes one progress line per step to the writer it is
// given, and returns a report whose JSON field names are the documented
// output of `keyshard bench <suite> --json`. Timings are medians over
// several runs, because the machines we run on are noisy; counts (moves,
// allocations, keys per member) are exact.
//
//	rep, err := bench.Placement(ctx, bench.PlacementOptions{Runs: 3}, os.Stderr)
//	json.NewEncoder(os.Stdout).Encode(rep)
package bench
