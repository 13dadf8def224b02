package coordinator_test

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/keyshard/keyshard/internal/coordinator"
	"github.com/keyshard/keyshard/internal/shard"
)

// TestScripts runs the protocol scripts in testdata. Refresh the expected
// output with -rewrite and review the diff.
func TestScripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		w := newWorld()
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			out := runCommand(t, w, d)
			if len(w.violation) > 0 {
				out += "VIOLATION: " + strings.Join(w.violation, "; ") + "\n"
				w.violation = nil
			}
			return out
		})
	})
}

func arg(t *testing.T, d *datadriven.TestData, key, def string) string {
	for _, a := range d.CmdArgs {
		if a.Key == key {
			if len(a.Vals) == 0 {
				return "true"
			}
			return a.Vals[0]
		}
	}
	if def == "" {
		t.Fatalf("%s: missing argument %s", d.Pos, key)
	}
	return def
}

func runCommand(t *testing.T, w *world, d *datadriven.TestData) string {
	ks := arg(t, d, "ks", "rooms")
	// each runs f for every id of the comma-separated id argument.
	each := func(f func(id string) []coordinator.Action) string {
		var out strings.Builder
		for _, id := range strings.Split(arg(t, d, "id", ""), ",") {
			out.WriteString(formatActions(f(id)))
		}
		return out.String()
	}
	switch d.Cmd {
	case "keyspace":
		buckets, _ := strconv.Atoi(arg(t, d, "buckets", "12"))
		ttl, _ := time.ParseDuration(arg(t, d, "ttl", "10s"))
		drain, _ := time.ParseDuration(arg(t, d, "drain", "30s"))
		return formatActions(w.createKeyspace(shard.Keyspace{Name: ks, Buckets: buckets, Hash: "xxh64", Mode: shard.ModeExclusive, LeaseTTL: ttl, DrainTimeout: drain}))
	case "import":
		buckets, _ := strconv.Atoi(arg(t, d, "buckets", "12"))
		wait, _ := time.ParseDuration(arg(t, d, "wait", "10m"))
		return importCommand(w, ks, buckets, shard.Mode(arg(t, d, "mode", "exclusive")), arg(t, d, "instances", ""), strings.TrimPrefix(arg(t, d, "positions", "-"), "-"), wait)
	case "leader", "failover":
		// A replica becomes leader and loads the store.
		w.failover()
		return formatActions(w.pending)
	case "lose-leadership":
		// The leader's term ends; no leader runs until the next failover.
		w.stepDown()
		return formatActions(nil)
	case "join":
		weight, _ := strconv.ParseFloat(arg(t, d, "weight", "1"), 64)
		pending := arg(t, d, "pending", "false") == "true"
		fenced := arg(t, d, "fenced", "false") == "true"
		return each(func(id string) []coordinator.Action { return w.joinAs(ks, id, weight, pending, fenced) })
	case "keepalive":
		return each(func(id string) []coordinator.Action { return w.keepAlive(ks, id) })
	case "release-bucket":
		b, _ := strconv.Atoi(arg(t, d, "bucket", ""))
		return formatActions(w.releaseBucket(ks, arg(t, d, "id", ""), b))
	case "crash":
		id := arg(t, d, "id", "")
		return formatActions(w.expire(ks, id, w.members[ks][id].Session))
	case "release":
		return each(func(id string) []coordinator.Action { return w.release(ks, id) })
	case "drain":
		id := arg(t, d, "id", "")
		leave := arg(t, d, "leave", "false") == "true"
		return formatActions(w.drain(ks, id, shard.Drain{Leave: leave}))
	case "tick":
		dt, _ := time.ParseDuration(arg(t, d, "advance", "1s"))
		w.now = w.now.Add(dt)
		return formatActions(w.step(coordinator.Tick{}))
	case "quarantine-expire":
		// etcd expires the quarantine's lease: the clock moves on to then.
		id := arg(t, d, "id", "")
		if until := w.quarUntil[ks][id]; w.now.Before(until) {
			w.now = until
		}
		return formatActions(w.expireQuarantines(ks))
	case "quarantine-due":
		// etcd expires the quarantines whose lease has run out by now.
		return formatActions(w.expireQuarantines(ks))
	case "apply":
		return formatActions(w.apply())
	case "settle":
		w.settle()
		return w.state(ks)
	case "state":
		return w.state(ks)
	case "reports":
		out := strings.Join(w.reports, "\n") + "\n"
		w.reports = nil
		return out
	}
	t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	return ""
}

func (w *world) state(ks string) string {
	var sb strings.Builder
	m := w.maps[ks]
	fmt.Fprintf(&sb, "epoch %d: %s\n", m.Epoch, formatCounts(m.Assignment))
	ids := make([]string, 0, len(w.grants[ks]))
	for id := range w.grants[ks] {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		fmt.Fprintf(&sb, "grants %s: %s\n", id, formatBuckets(w.grants[ks][id].Buckets))
	}
	for id, q := range w.quar[ks] {
		fmt.Fprintf(&sb, "quarantine %s: %v\n", id, q)
	}
	if w.keyspaces[ks].Mode == shard.ModeStream {
		for _, id := range ids {
			fmt.Fprintf(&sb, "from %s: %s\n", id, formatFrom(w.grants[ks][id].Buckets))
		}
	}
	if r, ok := w.res[ks]; ok {
		fmt.Fprintf(&sb, "reserved: %v until %s\n", r.Members, r.Until.Format(time.TimeOnly))
	}
	fmt.Fprintf(&sb, "converged: %v\n", w.converged(ks))
	return sb.String()
}

// TestMinLeaseTTL: the shortest lease TTL of the known keyspaces, 0 while
// there are none; a deleted keyspace no longer counts, nor does one that
// was only mentioned by a member's record.
func TestMinLeaseTTL(t *testing.T) {
	m := coordinator.New()
	now := time.Unix(0, 0)
	if got := m.MinLeaseTTL(); got != 0 {
		t.Fatalf("no keyspaces: %v, want 0", got)
	}
	m.StepAll([]coordinator.Event{
		coordinator.KeyspacePut{Keyspace: shard.Keyspace{Name: "slow", Buckets: 4, LeaseTTL: 30 * time.Second}},
		coordinator.KeyspacePut{Keyspace: shard.Keyspace{Name: "fast", Buckets: 4, LeaseTTL: 3 * time.Second}},
		coordinator.MemberPut{Keyspace: "unknown", Member: shard.Member{ID: "a", Session: 1}},
	}, now)
	for _, tc := range []struct {
		ev   coordinator.Event
		want time.Duration
	}{
		{nil, 3 * time.Second},
		{coordinator.KeyspacePut{Keyspace: shard.Keyspace{Name: "fast", Buckets: 4, LeaseTTL: 6 * time.Second}}, 6 * time.Second},
		{coordinator.KeyspaceDeleted{Name: "fast"}, 30 * time.Second},
		{coordinator.KeyspaceDeleted{Name: "slow"}, 0},
	} {
		if tc.ev != nil {
			m.Step(tc.ev, now)
		}
		if got := m.MinLeaseTTL(); got != tc.want {
			t.Errorf("after %#v: MinLeaseTTL() = %v, want %v", tc.ev, got, tc.want)
		}
	}
}
