package server

import (
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keyshard/keyshard/internal/shard"
	"github.com/keyshard/keyshard/internal/store"
)

// TestViewKeyspaceChanged: a keyspace's channel closes at an update that
// changes one of its keys, or at a resync, and not at an update of
// another keyspace; a closed channel is replaced by a new one.
func TestViewKeyspaceChanged(t *testing.T) {
	v := newView(slog.New(slog.DiscardHandler), newMetrics(prometheus.NewRegistry()))
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	releases := func(ks string, rev int64) store.Update {
		w := store.PutGrants(ks, "m1", shard.Grants{Session: 1})
		c, err := w.Change(rev)
		if err != nil {
			t.Fatal(err)
		}
		return store.Update{Changes: []store.Change{c}, Rev: rev}
	}
	a, b := v.keyspaceChanged("a"), v.keyspaceChanged("b")
	if a2 := v.keyspaceChanged("a"); a2 != a {
		t.Error("two channels for keyspace a before any change")
	}
	v.apply(releases("a", 2))
	if !closed(a) || closed(b) {
		t.Fatalf("after a change of keyspace a: a closed %v (want true), b closed %v (want false)", closed(a), closed(b))
	}
	a = v.keyspaceChanged("a")
	if closed(a) {
		t.Fatal("keyspace a's new channel is closed already")
	}
	v.apply(store.Update{Rev: 3}) // election keys only
	if closed(a) || closed(b) {
		t.Fatal("an update of no keyspace closed a keyspace's channel")
	}
	v.apply(store.Update{Resync: &store.Resync{Snapshot: store.NewSnapshot(4), Rev: 4}, Rev: 4})
	if !closed(a) || !closed(b) {
		t.Fatalf("after a resync: a closed %v, b closed %v; want both", closed(a), closed(b))
	}
}
