package demo

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// TestHotkeys runs the hot-key demo briefly against kfake and checks its
// record: nothing lost, drops counted, the lanes never on one key at once,
// per-key order kept, and the hot key on one overflow partition.
func TestHotkeys(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 10s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Second)
	defer cancel()
	var out bytes.Buffer
	rep, err := RunHotkeys(ctx, HotkeysOptions{Duration: 8 * time.Second, Rate: 300, Out: &out})
	t.Logf("commentary:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("report: %+v", rep)
	if rep.Lost != 0 || rep.Failed != 0 {
		t.Errorf("lost %d, failed %d (produced %d, consumed %d, dropped %d)", rep.Lost, rep.Failed, rep.Produced, rep.Consumed, rep.DroppedCounted)
	}
	if rep.LaneOverlaps != 0 {
		t.Errorf("lane overlaps: %d", rep.LaneOverlaps)
	}
	if rep.OrderViolations != 0 {
		t.Errorf("order violations: %d", rep.OrderViolations)
	}
	if rep.HotKeyOverflowPartitions != 1 {
		t.Errorf("hot key on %d overflow partitions %v, want 1", rep.HotKeyOverflowPartitions, rep.HotKeyPartitionIDs)
	}
	if rep.DroppedCounted == 0 {
		t.Error("no drop was counted")
	}
	if rep.Produced == 0 || rep.ConsumedOverflow == 0 {
		t.Errorf("produced %d, consumed on overflow %d", rep.Produced, rep.ConsumedOverflow)
	}
}

func TestHotkeysTooShort(t *testing.T) {
	if _, err := RunHotkeys(context.Background(), HotkeysOptions{Duration: time.Second}); err == nil {
		t.Error("a 1s run was accepted")
	}
}
