package client

import (
	"errors"
	"fmt"

	"connectrpc.com/connect"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
)

// Sentinel errors. Every error the package returns for a server answer
// wraps one of them (test with errors.Is) and also the *connect.Error it
// came from (so connect.CodeOf still works); its text includes the
// server's message, which says what was wrong.
var (
	// ErrInvalid: the request was malformed (InvalidArgument), for
	// example a bad keyspace or member name; or an argument or option
	// was refused before any call (then the error is an *ArgError), for
	// example a bad URL given to Dial or a negative FenceMargin.
	ErrInvalid = errors.New("keyshard: invalid argument")
	// ErrNotFound: the keyspace, member or session does not exist
	// (NotFound).
	ErrNotFound = errors.New("keyshard: not found")
	// ErrExists: the keyspace already exists, or the member id is held by
	// a live session and Replace(true) was not given (AlreadyExists).
	ErrExists = errors.New("keyshard: already exists")
	// ErrImmutable: the request would change something that cannot
	// change, such as a keyspace's bucket count, hash or mode
	// (FailedPrecondition without a WrongOwner detail).
	ErrImmutable = errors.New("keyshard: cannot change")
	// ErrUnavailable: the server could not be reached or cannot serve the
	// request now (Unavailable); retrying later is safe.
	ErrUnavailable = errors.New("keyshard: unavailable")
	// ErrUnauthenticated: the bearer token is missing or not valid
	// (Unauthenticated).
	ErrUnauthenticated = errors.New("keyshard: unauthenticated")
	// ErrPermissionDenied: the token's role may not make the call
	// (PermissionDenied).
	ErrPermissionDenied = errors.New("keyshard: permission denied")
	// ErrConflict: the request raced with a concurrent change, such as a
	// leader change or a session being replaced (Aborted); retrying is
	// safe.
	ErrConflict = errors.New("keyshard: conflict")
	// ErrSessionLost: a Worker's session ended without it leaving: the
	// Worker could not renew its lease in time and fenced itself, or the
	// server ended the session. Reported through OnEvent; the Worker
	// re-joins by itself.
	ErrSessionLost = errors.New("keyshard: session lost")
	// ErrResourceExhausted: the server refused the request because it
	// would pass one of its limits (ResourceExhausted): a body over the
	// size cap, too many keys in one Lookup, or too many long polls open
	// at once. The message names the limit and the flag that sets it.
	// The same request fails again at the same replica; split it, or, for
	// long polls, retry after a pause.
	ErrResourceExhausted = errors.New("keyshard: resource exhausted")
	// ErrNotHeld: a Worker.Commit named a bucket the session does not
	// hold at the token given (FailedPrecondition answering Commit): the
	// bucket was taken back or handed over meanwhile. Nothing of the
	// commit was applied; compute it again from the current grants.
	ErrNotHeld = errors.New("keyshard: bucket not held at that token")
	// ErrBackwards: a Worker.Commit would move a committed position, or
	// its max token, backwards (FailedPrecondition "backwards" answering
	// Commit). Nothing of it was applied.
	ErrBackwards = errors.New("keyshard: position would go backwards")
	// ErrClosed: the Client, Router or Worker was closed.
	ErrClosed = errors.New("keyshard: closed")
	// ErrWrongOwner: the key belongs to another member. The error is a
	// *WrongOwnerError that says which; use AsWrongOwner to read it.
	ErrWrongOwner = errors.New("keyshard: wrong owner")
	// ErrNotGranted: the current map makes this worker the key's owner
	// but its grant has not arrived yet (or its Acquire has not
	// returned). Hold the work and retry, or use Worker.WaitGrant.
	ErrNotGranted = errors.New("keyshard: bucket not granted yet")
)

// ArgError is an argument or option that the package refused before
// making any call: given to a constructor (Dial, NewWorker, NewRouter,
// NewHotKeys) or to a method. It wraps ErrInvalid, so
// errors.Is(err, ErrInvalid) holds; errors.As tells which argument:
//
//	var ae *client.ArgError
//	if errors.As(err, &ae) && ae.Arg == "FenceMargin" { ... }
type ArgError struct {
	// Func is the function that refused it: "NewWorker",
	// "Admin.CreateKeyspace".
	Func string
	// Arg names the argument or option as the caller writes it:
	// "keyspace name", "Member.ID", "FenceMargin",
	// "HotKeysConfig.Interval".
	Arg string
	// Reason says what is wrong with it, in words that follow Arg:
	// "is empty", "-1s is negative".
	Reason string
}

func (e *ArgError) Error() string {
	return ErrInvalid.Error() + ": " + e.Func + ": " + e.Arg + " " + e.Reason
}

// Unwrap returns ErrInvalid.
func (e *ArgError) Unwrap() error { return ErrInvalid }

// argError returns an *ArgError of function fn for argument arg, with the
// reason given by format and a.
func argError(fn, arg, format string, a ...any) error {
	return &ArgError{Func: fn, Arg: arg, Reason: fmt.Sprintf(format, a...)}
}

// codeTable is the one translation between connect codes and sentinels.
// Decoding (server answer → error) uses the entries without toServer;
// WrongOwner (error → answer for a worker's own RPC server) uses all of
// them, the first match winning.
var codeTable = []struct {
	code     connect.Code
	sentinel error
	toServer bool // only used to encode an error, never to decode a code
}{
	{connect.CodeInvalidArgument, ErrInvalid, false},
	{connect.CodeNotFound, ErrNotFound, false},
	{connect.CodeAlreadyExists, ErrExists, false},
	{connect.CodeFailedPrecondition, ErrImmutable, false}, // without a WrongOwner detail
	{connect.CodeUnavailable, ErrUnavailable, false},
	{connect.CodeUnauthenticated, ErrUnauthenticated, false},
	{connect.CodePermissionDenied, ErrPermissionDenied, false},
	{connect.CodeAborted, ErrConflict, false},
	{connect.CodeResourceExhausted, ErrResourceExhausted, false},
	{connect.CodeFailedPrecondition, ErrWrongOwner, true},
	{connect.CodeUnavailable, ErrNotGranted, true},
	{connect.CodeUnavailable, ErrSessionLost, true},
	{connect.CodeUnavailable, ErrClosed, true},
}

// WrongOwnerError says that a key's bucket belongs to another member:
// retry at Address once your map has reached Epoch. Owner is "" when the
// bucket is unassigned at Epoch.
type WrongOwnerError struct {
	Bucket  int
	Owner   string
	Address string
	Epoch   uint64
}

func (e *WrongOwnerError) Error() string {
	if e.Owner == "" {
		return fmt.Sprintf("keyshard: wrong owner: bucket %d is unassigned at epoch %d", e.Bucket, e.Epoch)
	}
	return fmt.Sprintf("keyshard: wrong owner: bucket %d belongs to %q at %q (epoch %d)", e.Bucket, e.Owner, e.Address, e.Epoch)
}

// Is reports whether target is ErrWrongOwner.
func (e *WrongOwnerError) Is(target error) bool { return target == ErrWrongOwner }

// rpcError is a server answer translated to a sentinel (or to a
// *WrongOwnerError). It unwraps to both the sentinel and the
// *connect.Error.
type rpcError struct {
	kind error // a sentinel or a *WrongOwnerError
	cerr *connect.Error
}

func (e *rpcError) Error() string {
	if _, ok := e.kind.(*WrongOwnerError); ok {
		return e.kind.Error()
	}
	if msg := e.cerr.Message(); msg != "" {
		return e.kind.Error() + ": " + msg
	}
	return e.kind.Error()
}

func (e *rpcError) Unwrap() []error { return []error{e.kind, e.cerr} }

// fromConnect translates an error returned by a generated client into the
// package's errors. Errors with codes outside the table (Canceled,
// DeadlineExceeded, Internal, ...) are returned as they are, so that
// errors.Is(err, context.Canceled) and connect.CodeOf keep working.
func fromConnect(err error) error {
	if err == nil {
		return nil
	}
	var cerr *connect.Error
	if !errors.As(err, &cerr) {
		return err
	}
	if wo, ok := wrongOwnerDetail(cerr); ok {
		return &rpcError{kind: wo, cerr: cerr}
	}
	for _, row := range codeTable {
		if !row.toServer && row.code == cerr.Code() {
			return &rpcError{kind: row.sentinel, cerr: cerr}
		}
	}
	return err
}

// WrongOwner returns the answer a worker's own connect RPC server gives
// for err. For a *WrongOwnerError (as returned by Worker.Owns) that is a
// FailedPrecondition error carrying the WrongOwner proto as a detail, which
// AsWrongOwner (and every Keyshard client) decodes. Other errors get the
// code of their sentinel (ErrNotGranted becomes Unavailable, so callers
// retry) or keep their own connect code; anything else is Unknown.
//
// err must not be nil: WrongOwner(nil) returns an Internal error rather
// than a nil *connect.Error, which would be a non-nil error interface.
func WrongOwner(err error) *connect.Error {
	if err == nil {
		return connect.NewError(connect.CodeInternal, errors.New("keyshard: WrongOwner called with a nil error"))
	}
	var wo *WrongOwnerError
	if errors.As(err, &wo) {
		cerr := connect.NewError(connect.CodeFailedPrecondition, err)
		d, derr := connect.NewErrorDetail(&keyshardv1.WrongOwner{
			Bucket:  uint32(wo.Bucket),
			Owner:   wo.Owner,
			Address: wo.Address,
			Epoch:   wo.Epoch,
		})
		if derr == nil { // marshalling a small generated message cannot fail
			cerr.AddDetail(d)
		}
		return cerr
	}
	for _, row := range codeTable {
		if errors.Is(err, row.sentinel) {
			return connect.NewError(row.code, err)
		}
	}
	var cerr *connect.Error
	if errors.As(err, &cerr) {
		return connect.NewError(cerr.Code(), err)
	}
	return connect.NewError(connect.CodeUnknown, err)
}

// AsWrongOwner returns the *WrongOwnerError in err's chain, or decodes it
// from the WrongOwner detail of a *connect.Error in err's chain (as sent
// by a Keyshard server or by a worker using WrongOwner). It reports false
// if err carries neither.
func AsWrongOwner(err error) (*WrongOwnerError, bool) {
	var wo *WrongOwnerError
	if errors.As(err, &wo) {
		return wo, true
	}
	var cerr *connect.Error
	if errors.As(err, &cerr) {
		return wrongOwnerDetail(cerr)
	}
	return nil, false
}

func wrongOwnerDetail(cerr *connect.Error) (*WrongOwnerError, bool) {
	for _, d := range cerr.Details() {
		v, err := d.Value()
		if err != nil {
			continue
		}
		if m, ok := v.(*keyshardv1.WrongOwner); ok {
			return &WrongOwnerError{Bucket: int(m.GetBucket()), Owner: m.GetOwner(), Address: m.GetAddress(), Epoch: m.GetEpoch()}, true
		}
	}
	return nil, false
}
