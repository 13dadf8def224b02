package store

import (
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
