package store

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestEmbeddedRestartKeepsData(t *testing.T) {
	dir := t.TempDir()
	e := runEmbedded(t, EmbeddedConfig{Dir: dir})
	s := openStore(t, e.Endpoints())
	ctx := ctxFor(t, 30*time.Second)
	k := testKeyspace("restart")
	rev, err := s.CreateKeyspace(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	e.Close()
	e.Close() // idempotent

	e2 := runEmbedded(t, EmbeddedConfig{Dir: dir})
	s2 := openStore(t, e2.Endpoints())
	got, modRev, err := s2.GetKeyspace(ctx, k.Name)
	if err != nil {
		t.Fatalf("after restart: %v", err)
	}
	if got != k || modRev != rev {
		t.Fatalf("after restart got %+v at %d, want %+v at %d", got, modRev, k, rev)
	}
}

// TestEmbeddedElectionTimeout: the election timeout reaches etcd's
// configuration, heartbeats at a tenth of it; one below 100ms is refused.
func TestEmbeddedElectionTimeout(t *testing.T) {
	base := EmbeddedConfig{Dir: t.TempDir(), ClientURL: "http://127.0.0.1:0", PeerURL: "http://127.0.0.1:0"}
	cfg := base
	cfg.ElectionTimeout = 500 * time.Millisecond
	ec, err := embedConfig(cfg, new(atomic.Bool))
	if err != nil {
		t.Fatal(err)
	}
	if ec.ElectionMs != 500 || ec.TickMs != 50 {
		t.Fatalf("election %d ms, heartbeat %d ms; want 500 and 50", ec.ElectionMs, ec.TickMs)
	}
	def, err := embedConfig(base, new(atomic.Bool))
	if err != nil || def.ElectionMs != 1000 || def.TickMs != 100 {
		t.Fatalf("default: election %d ms, heartbeat %d ms, %v; want etcd's 1000 and 100", def.ElectionMs, def.TickMs, err)
	}
	cfg.ElectionTimeout = 50 * time.Millisecond
	if _, err := embedConfig(cfg, new(atomic.Bool)); err == nil || !strings.Contains(err.Error(), "election timeout 50ms") {
		t.Fatalf("50ms: %v; want an error naming it", err)
	}
}
