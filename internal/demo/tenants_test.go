package demo

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestTenants runs the tenant-pool demo at its shortest pace and checks
// its record: clients and servers agreed at every version, every read
// went to a member serving its tenant, no steady tenant's size followed
// the pool, and the stepped tenant grew and came back.
func TestTenants(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 40s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, logs syncBuf
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rep, err := RunTenants(ctx, TenantsOptions{Duration: 36 * time.Second, Out: &out, Logger: logger}) // a 4 s window: timings a busy machine keeps
	t.Logf("commentary:\n%s", out.String())
	if err != nil || t.Failed() {
		t.Logf("warnings and errors of the server and the SDK:\n%s", logs.String())
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("report: %+v", rep)
	if rep.Versions == 0 || rep.Disagreements != 0 {
		t.Errorf("%d versions checked, %d disagreements", rep.Versions, rep.Disagreements)
	}
	if rep.Reads == 0 || rep.ReadsToNonServingMembers != 0 || rep.ReadsWithoutTargets != 0 {
		t.Errorf("%d reads, %d to non-serving members, %d without targets: %v", rep.Reads, rep.ReadsToNonServingMembers, rep.ReadsWithoutTargets, rep.NonServingReads)
	}
	if rep.MaxSizeChangeFromPoolGrowth != 0 || rep.SteadySizeChanges != 0 {
		t.Errorf("steady sizes moved: max change from the pool's growth %d, %d steady size changes", rep.MaxSizeChangeFromPoolGrowth, rep.SteadySizeChanges)
	}
	if rep.SteppedPeakSize <= rep.SteppedBaseSize || !rep.SteppedBack {
		t.Errorf("%s: %d → %d, back %v: %+v", rep.SteppedTenant, rep.SteppedBaseSize, rep.SteppedPeakSize, rep.SteppedBack, rep.SteppedSizes)
	}
	if rep.MembersPeak != 20 || rep.MembersEnd != 10 {
		t.Errorf("pool %d → %d → %d members, want 10 → 20 → 10", rep.MembersStart, rep.MembersPeak, rep.MembersEnd)
	}
	if !rep.OK {
		t.Error("the report is not OK")
	}
	if strings.Count(out.String(), "\n") < 10 {
		t.Errorf("too little commentary:\n%s", out.String())
	}
}

func TestTenantsTooShort(t *testing.T) {
	if _, err := RunTenants(context.Background(), TenantsOptions{Duration: 5 * time.Second}); err == nil {
		t.Error("a 5s run was accepted")
	}
}

// syncBuf is a bytes.Buffer safe for the demo's goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
