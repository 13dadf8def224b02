package store

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keyshard/keyshard/internal/shard"
)

// An import (a static mapping taken over as a keyspace's first map) leaves
// a reservation at reserved/<ks>: the imported instances the leader still
// waits for, and until when. JSON: {"members":["a","b"],"until":"<RFC 3339
// nano>"}; members are valid member ids, distinct, at least one (a
// reservation that awaits nobody is deleted, not stored empty).

type reservationJSON struct {
	Members []string `json:"members"`
	Until   string   `json:"until"`
}

var reservationFields = []string{"members", "until"}

// validateReservation checks r as EncodeReservation does.
func validateReservation(r shard.Reservation) *fieldError {
	if len(r.Members) == 0 {
		return ferr("members", "empty; delete the reservation instead")
	}
	if len(r.Members) > MaxMapMembers {
		return ferr("members", "%d members; at most %d", len(r.Members), MaxMapMembers)
	}
	seen := make(map[string]bool, len(r.Members))
	for i, id := range r.Members {
		if e := checkName(fmt.Sprintf("members[%d]", i), KindMember, id); e != nil {
			return e
		}
		if seen[id] {
			return ferr(fmt.Sprintf("members[%d]", i), "%q is listed twice", id)
		}
		seen[id] = true
	}
	return checkTime("until", r.Until)
}

// EncodeReservation returns the stored form of r, stored at reserved/<ks>.
// It returns an error wrapping ErrInvalid, naming the field, if r awaits
// nobody, names an invalid or repeated member id, or has no Until.
func EncodeReservation(r shard.Reservation) ([]byte, error) {
	if e := validateReservation(r); e != nil {
		return nil, e.invalid("reservation")
	}
	return marshal(reservationJSON{Members: r.Members, Until: formatTime(r.Until)})
}

// DecodeReservation decodes the value stored at key. Errors wrap
// ErrCorrupt.
func DecodeReservation(key string, data []byte) (shard.Reservation, error) {
	var w reservationJSON
	if err := decodeStrict(key, data, reservationFields, &w); err != nil {
		return shard.Reservation{}, err
	}
	until, err := parseTime(key, "until", w.Until)
	if err != nil {
		return shard.Reservation{}, err
	}
	r := shard.Reservation{Members: w.Members, Until: until}
	if e := validateReservation(r); e != nil {
		return shard.Reservation{}, e.corrupt(key)
	}
	return r, nil
}

// PutReservation writes keyspace ks's reservation; with no members left
// it deletes it. Only the leader writes it after the import, in a fenced
// Commit with an expectation on the reservation it read
// (ExpectEntry(ReservedKey(ks), ...)).
func PutReservation(ks string, r shard.Reservation) Write {
	if len(r.Members) == 0 {
		w := Delete(ReservedKey(ks))
		w.err = nameErr(w.err, ks, "")
		return w
	}
	b, err := EncodeReservation(r)
	return Write{key: ReservedKey(ks), val: b, err: nameErr(err, ks, "")}
}

// Import is a keyspace created with its first map: the import of a static
// mapping (see placement.SynapseAssignment).
type Import struct {
	Keyspace shard.Keyspace
	// Map is the first map (its Hash is the keyspace's, its epoch >= 1).
	Map shard.Map
	// Positions are the bucket positions of a stream keyspace (empty
	// otherwise).
	Positions shard.BucketPositions
	// Reserved awaits the imported instances; no members: none.
	Reserved shard.Reservation
	// History is the first map's entry in the map history; nil: none.
	History *EpochChange
}

// ImportKeyspace creates keyspace imp.Keyspace with its first map, its
// bucket positions and its reservation, all in one transaction, only if
// the keyspace does not exist. It returns the revision of the write.
// Errors: ErrExists, ErrInvalid (a value that does not encode, a map that
// does not fit the keyspace, positions in an exclusive keyspace),
// ErrInvalidName, ErrTooLarge, ErrUnavailable.
func (s *Store) ImportKeyspace(ctx context.Context, imp Import) (int64, error) {
	if s.closed() {
		return 0, errClosed("import keyspace")
	}
	k := imp.Keyspace
	if err := ValidateName(KindKeyspace, k.Name); err != nil {
		return 0, err
	}
	op := fmt.Sprintf("import keyspace %q", k.Name)
	switch {
	case imp.Map.Assignment.Buckets() != k.Buckets:
		return 0, invalidf("%s: the map has %d buckets, the keyspace %d", op, imp.Map.Assignment.Buckets(), k.Buckets)
	case imp.Map.Hash != k.Hash:
		return 0, invalidf("%s: the map hashes with %q, the keyspace with %q", op, imp.Map.Hash, k.Hash)
	case len(imp.Positions.Runs) > 0 && k.Mode != shard.ModeStream:
		return 0, invalidf("%s: bucket positions in a %s keyspace", op, k.Mode)
	}
	if n := len(imp.Positions.Runs); n > 0 && imp.Positions.Runs[n-1].First+imp.Positions.Runs[n-1].Count > k.Buckets {
		return 0, invalidf("%s: bucket positions reach past the keyspace's %d buckets", op, k.Buckets)
	}
	writes := []Write{PutMap(k.Name, imp.Map)}
	writes = append(writes, PutBucketPositions(k.Name, shard.BucketPositions{}, imp.Positions)...)
	if len(imp.Reserved.Members) > 0 {
		writes = append(writes, PutReservation(k.Name, imp.Reserved))
	}
	if imp.History != nil {
		writes = append(writes, PutHistory(k.Name, *imp.History)[0]) // a new keyspace has nothing to trim
	}
	val, err := EncodeKeyspace(k)
	if err != nil {
		return 0, err
	}
	ops := []clientv3.Op{clientv3.OpPut(KeyspaceKey(k.Name), string(val))}
	if n := len(writes) + 1; n > s.maxOps {
		return 0, fmt.Errorf("store: %s: %w: %d writes; this store sends at most %d per transaction", op, ErrTooLarge, n, s.maxOps)
	}
	for _, w := range writes {
		if w.err != nil {
			return 0, fmt.Errorf("store: %s: %w", op, w.err)
		}
		ops = append(ops, clientv3.OpPut(w.key, string(w.val)))
	}
	resp, err := s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(KeyspaceKey(k.Name)), "=", 0)).
		Then(ops...).
		Commit()
	if err != nil {
		return 0, s.err(op, err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("store: %s: %w", op, ErrExists)
	}
	return resp.Header.Revision, nil
}
