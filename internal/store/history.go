package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// HistoryPrefix is the root of the map history: one key per epoch of a
// keyspace's map, HistoryPrefix + <ks> + "/" + the epoch in 20 decimal
// digits, holding an EpochChange in JSON. It lies outside Prefix on
// purpose: neither LoadAll nor Watch reads it, so the history costs the
// leader's and the replicas' views nothing; GetKeyspaceHistory reads it
// with one bounded range.
const HistoryPrefix = "/keyshard/history/v1/"

// HistoryKeep is how many epochs of a keyspace's map history are kept:
// each write of one deletes those older than the last HistoryKeep.
const HistoryKeep = 500

// EpochChange is one new epoch of a keyspace's map, as the leader records
// it in the same transaction as the map.
type EpochChange struct {
	Epoch uint64    `json:"epoch"`
	Time  time.Time `json:"time"`
	// Reason is a coordinator.MapReason ("create", "join", ...).
	Reason  string        `json:"reason"`
	Members []string      `json:"members,omitempty"`
	Moved   int           `json:"moved"`
	Moves   []HistoryMove `json:"moves,omitempty"`
	Detail  string        `json:"detail,omitempty"`
}

// HistoryMove is a number of buckets moved from one target owner to
// another ("" none).
type HistoryMove struct {
	From    string `json:"from,omitempty"`
	To      string `json:"to,omitempty"`
	Buckets int    `json:"buckets"`
}

// HistoryKey returns the key of epoch's entry in keyspace ks's map
// history.
func HistoryKey(ks string, epoch uint64) string {
	return fmt.Sprintf("%s%s/%020d", HistoryPrefix, ks, epoch)
}

func historyPrefix(ks string) string { return HistoryPrefix + ks + "/" }

// PutHistory writes c into keyspace ks's map history and deletes the
// entries older than the last HistoryKeep epochs (up to c's): two writes,
// for the same Commit as the map.
func PutHistory(ks string, c EpochChange) []Write {
	b, err := json.Marshal(c)
	err = nameErr(err, ks, "")
	if err == nil && c.Epoch == 0 {
		err = invalidf("history of %s: epoch 0", ks)
	}
	ws := []Write{{key: HistoryKey(ks, c.Epoch), val: b, err: err, history: true}}
	if c.Epoch > HistoryKeep {
		ws = append(ws, Write{key: historyPrefix(ks), end: HistoryKey(ks, c.Epoch-HistoryKeep+1), del: true, err: err, history: true})
	}
	return ws
}

// History reports whether w writes the map history (PutHistory), which
// lies outside the layout Watch delivers: a store that stands in for this
// one applies it nowhere.
func (w Write) History() bool { return w.history }

// KeyspaceHistory returns up to limit of keyspace ks's latest map epochs,
// newest first, and the revision read. An entry that does not decode is
// skipped and reported in the error joined to the answer (ErrCorrupt).
// Errors: ErrInvalidName, ErrUnavailable.
func (s *Store) KeyspaceHistory(ctx context.Context, ks string, limit int) ([]EpochChange, int64, error) {
	if s.closed() {
		return nil, 0, errClosed("read map history")
	}
	if err := ValidateName(KindKeyspace, ks); err != nil {
		return nil, 0, err
	}
	resp, err := s.client.Get(ctx, historyPrefix(ks), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(int64(limit)))
	if err != nil {
		return nil, 0, s.err(fmt.Sprintf("read map history of %q", ks), err)
	}
	out := make([]EpochChange, 0, len(resp.Kvs))
	var bad error
	for _, kv := range resp.Kvs {
		var c EpochChange
		if err := json.Unmarshal(kv.Value, &c); err != nil {
			bad = corruptf(string(kv.Key), "", "map history entry: %v", err)
			continue
		}
		out = append(out, c)
	}
	return out, resp.Header.Revision, bad
}
