package store

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinel errors. Every error this package returns that callers may want to
// branch on wraps exactly one of these (ErrUnavailable may also wrap
// context.DeadlineExceeded); test with errors.Is.
var (
	// ErrExists: the key to be created is already there (CreateKeyspace), or
	// a member id is held by another live session (Join without replace).
	ErrExists = errors.New("store: already exists")
	// ErrNotFound: the keyspace or member the call names does not exist.
	ErrNotFound = errors.New("store: not found")
	// ErrConflict: a key the caller read has changed since (a Commit
	// expectation failed). Re-read and retry.
	ErrConflict = errors.New("store: conflict")
	// ErrFenced: the writer no longer holds what its write is fenced on: the
	// leader key for a leader Commit, the member's session for a member
	// write. The caller must stop acting on the old state.
	ErrFenced = errors.New("store: fenced")
	// ErrImmutable: an update tried to change a keyspace's bucket count, hash
	// mode or mode, which never change once created.
	ErrImmutable = errors.New("store: immutable field")
	// ErrCorrupt: a stored key or value does not decode or fails validation.
	// The error is a *CorruptError naming the key and the field.
	ErrCorrupt = errors.New("store: corrupt value")
	// ErrInvalidName: a keyspace name or member id is empty, too long or has
	// a character outside [A-Za-z0-9._:@-].
	ErrInvalidName = errors.New("store: invalid name")
	// ErrInvalid: a value passed to an encoder or a write does not validate
	// (a caller bug, not stored state).
	ErrInvalid = errors.New("store: invalid value")
	// ErrLeaseNotFound: the lease (session) named by the call does not exist
	// any more: it expired or was revoked. A put attached to such a lease
	// writes nothing.
	ErrLeaseNotFound = errors.New("store: lease not found")
	// ErrTooLarge: a transaction has more operations or bytes than etcd
	// accepts (etcd flags --max-txn-ops and --max-request-bytes).
	ErrTooLarge = errors.New("store: transaction too large")
	// ErrUnavailable: etcd could not answer in time: no leader, no quorum,
	// no reachable endpoint, or the context deadline passed while waiting
	// for it. Retrying later may succeed.
	ErrUnavailable = errors.New("store: etcd unavailable")
	// ErrClosed: the Store or Embedded server has been closed.
	ErrClosed = errors.New("store: closed")
)

// CorruptError reports a stored key or value that does not decode. It wraps
// ErrCorrupt.
type CorruptError struct {
	Key    string // the etcd key
	Field  string // the JSON field (or "" for the key itself or the whole value)
	Reason string
}

func (e *CorruptError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("store: corrupt value at %q: %s", e.Key, e.Reason)
	}
	return fmt.Sprintf("store: corrupt value at %q: field %q: %s", e.Key, e.Field, e.Reason)
}

// Unwrap returns ErrCorrupt.
func (e *CorruptError) Unwrap() error { return ErrCorrupt }

func corruptf(key, field, format string, args ...any) error {
	return &CorruptError{Key: key, Field: field, Reason: fmt.Sprintf(format, args...)}
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// etcdErr translates an error from clientv3 into this package's sentinels
// and prefixes op. It never inspects error text: etcd's errors are typed
// (rpctypes.EtcdError or gRPC status codes).
func etcdErr(op string, err error) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return fmt.Errorf("%s: %w", op, ErrLeaseNotFound)
	case errors.Is(err, rpctypes.ErrTooManyOps):
		return fmt.Errorf("%s: %w: etcd refused the transaction for having too many operations; start etcd with a larger --max-txn-ops (keyshard needs at least %d)", op, ErrTooLarge, DefaultMaxTxnOps)
	case errors.Is(err, rpctypes.ErrRequestTooLarge):
		return fmt.Errorf("%s: %w: etcd refused the request as too large; start etcd with a larger --max-request-bytes (keyshard's embedded etcd uses %d)", op, ErrTooLarge, DefaultMaxRequestBytes)
	case errors.Is(err, rpctypes.ErrDuplicateKey):
		return fmt.Errorf("%s: %w: a key is written twice in one transaction", op, ErrInvalid)
	case errors.Is(err, clientv3.ErrNoAvailableEndpoints):
		return fmt.Errorf("%s: %w: %w", op, ErrUnavailable, err)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%s: %w", op, err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: %w: %w", op, ErrUnavailable, err)
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		switch ee.Code() {
		case codes.Unavailable, codes.DeadlineExceeded:
			return fmt.Errorf("%s: %w: %w", op, ErrUnavailable, err)
		}
		return fmt.Errorf("%s: %w", op, err)
	}
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.Unavailable, codes.DeadlineExceeded:
			return fmt.Errorf("%s: %w: %w", op, ErrUnavailable, err)
		case codes.ResourceExhausted:
			// The client refused to send or receive a message over its
			// gRPC size limit (Config.MaxRequestBytes).
			return fmt.Errorf("%s: %w: %w", op, ErrTooLarge, err)
		case codes.Canceled:
			return fmt.Errorf("%s: %w: %w", op, context.Canceled, err)
		}
	}
	return fmt.Errorf("%s: %w", op, err)
}
