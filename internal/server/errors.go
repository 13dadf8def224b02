package server

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	"github.com/keyshard/keyshard/internal/store"
	"github.com/keyshard/keyshard/placement"
)

// errInvalid marks bad input found by the API layer itself.
var errInvalid = errors.New("invalid argument")

// codeTable is the one place where errors become API status codes; the Go
// SDK maps the codes back to its sentinels.
var codeTable = []struct {
	err  error
	code connect.Code
}{
	{context.Canceled, connect.CodeCanceled},
	{context.DeadlineExceeded, connect.CodeDeadlineExceeded},
	{errInvalid, connect.CodeInvalidArgument},
	{ErrConfig, connect.CodeInvalidArgument},
	{placement.ErrInvalid, connect.CodeInvalidArgument},
	{store.ErrInvalidName, connect.CodeInvalidArgument},
	{store.ErrInvalid, connect.CodeInvalidArgument},
	{store.ErrNotFound, connect.CodeNotFound},
	{store.ErrLeaseNotFound, connect.CodeNotFound},
	{store.ErrExists, connect.CodeAlreadyExists},
	{store.ErrImmutable, connect.CodeFailedPrecondition},
	{store.ErrHeld, connect.CodeFailedPrecondition},
	{store.ErrConflict, connect.CodeAborted},
	{store.ErrFenced, connect.CodeAborted},
	{store.ErrTooLarge, connect.CodeResourceExhausted},
	{store.ErrUnavailable, connect.CodeUnavailable},
	{store.ErrClosed, connect.CodeUnavailable},
	{store.ErrCorrupt, connect.CodeDataLoss},
}

// apiError turns err into a connect error with the code of the table; an
// error that is already a connect error passes through.
func apiError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	for _, row := range codeTable {
		if errors.Is(err, row.err) {
			return connect.NewError(row.code, err)
		}
	}
	return connect.NewError(connect.CodeInternal, err)
}

func invalid(format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, errorf("%w: "+format, append([]any{errInvalid}, args...)...))
}

func notFound(format string, args ...any) error {
	return connect.NewError(connect.CodeNotFound, errorf(format, args...))
}

func unauthenticated(msg string) error {
	return connect.NewError(connect.CodeUnauthenticated, errors.New(msg))
}

func failedPrecondition(format string, args ...any) error {
	return connect.NewError(connect.CodeFailedPrecondition, errorf(format, args...))
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }
