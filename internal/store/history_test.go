package store

import (
	"fmt"
	"testing"
	"time"
)

// TestHistoryKeepsTheLast500 writes 510 epochs of history through leader
// commits and reads back the newest first, the oldest trimmed away in the
// same transactions; the keyspace's deletion takes its history too.
func TestHistoryKeepsTheLast500(t *testing.T) {
	s := sharedStore(t)
	ctx := ctxFor(t, 60*time.Second)
	_, f := campaign(t, s, "history-leader")
	if _, err := s.CreateKeyspace(ctx, testKeyspace("hist")); err != nil {
		t.Fatal(err)
	}
	const n = HistoryKeep + 10
	for e := uint64(1); e <= n; e++ {
		c := EpochChange{Epoch: e, Time: time.Unix(int64(e), 0).UTC(), Reason: "join", Members: []string{"m"}, Moved: 1,
			Moves: []HistoryMove{{To: "m", Buckets: 1}}, Detail: fmt.Sprintf("epoch %d", e)}
		ws := PutHistory("hist", c)
		if want := 1 + btoi(e > HistoryKeep); len(ws) != want {
			t.Fatalf("epoch %d: %d writes, want %d", e, len(ws), want)
		}
		if _, err := s.Commit(ctx, f, ws, nil); err != nil {
			t.Fatalf("epoch %d: %v", e, err)
		}
	}
	all, _, err := s.KeyspaceHistory(ctx, "hist", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != HistoryKeep || all[0].Epoch != n || all[len(all)-1].Epoch != n-HistoryKeep+1 {
		t.Fatalf("history: %d entries, %d to %d; want %d, %d to %d", len(all), all[0].Epoch, all[len(all)-1].Epoch, HistoryKeep, n, n-HistoryKeep+1)
	}
	if c := all[0]; c.Reason != "join" || c.Detail != fmt.Sprintf("epoch %d", n) || len(c.Moves) != 1 || !c.Time.Equal(time.Unix(n, 0)) {
		t.Fatalf("newest entry: %+v", c)
	}
	few, _, err := s.KeyspaceHistory(ctx, "hist", 3)
	if err != nil || len(few) != 3 || few[2].Epoch != n-2 {
		t.Fatalf("limit 3: %+v %v", few, err)
	}
	if _, err := s.DeleteKeyspace(ctx, "hist"); err != nil {
		t.Fatal(err)
	}
	if gone, _, err := s.KeyspaceHistory(ctx, "hist", 10); err != nil || len(gone) != 0 {
		t.Fatalf("after delete: %+v %v", gone, err)
	}
	if _, _, err := s.KeyspaceHistory(ctx, "bad name", 10); err == nil {
		t.Fatal("bad keyspace name accepted")
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
