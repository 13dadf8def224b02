package store

import (
	"context"
	"crypto/rand"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// SecretKey holds the cluster's random secret, from which the serve
// replicas derive the session tokens they hand to members. It is created
// once, by whichever replica starts first.
const SecretKey = "/keyshard/secret" // outside Prefix: the watch never sees it

// ClusterSecret returns the cluster's 32-byte secret, creating it if it
// does not exist yet. Every replica gets the same bytes.
// Errors: ErrUnavailable, ErrCorrupt (a stored secret of the wrong size).
func (s *Store) ClusterSecret(ctx context.Context) ([]byte, error) {
	if s.closed() {
		return nil, errClosed("cluster secret")
	}
	fresh := make([]byte, 32)
	if _, err := rand.Read(fresh); err != nil {
		return nil, fmt.Errorf("store: cluster secret: %w", err)
	}
	resp, err := s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(SecretKey), "=", 0)).
		Then(clientv3.OpPut(SecretKey, string(fresh))).
		Else(clientv3.OpGet(SecretKey)).
		Commit()
	if err != nil {
		return nil, s.err("cluster secret", err)
	}
	if resp.Succeeded {
		return fresh, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) != 1 || len(kvs[0].Value) != 32 {
		return nil, &CorruptError{Key: SecretKey, Field: "value", Reason: "want 32 bytes"}
	}
	return kvs[0].Value, nil
}
