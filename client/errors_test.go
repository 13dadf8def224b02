package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
)

var allSentinels = []error{ErrInvalid, ErrNotFound, ErrExists, ErrImmutable, ErrUnavailable, ErrUnauthenticated,
	ErrPermissionDenied, ErrConflict, ErrResourceExhausted, ErrSessionLost, ErrClosed, ErrWrongOwner, ErrNotGranted}

// TestErrorTable sends every code the server uses through a real connect
// round trip and checks the sentinel, the server's message and the code.
func TestErrorTable(t *testing.T) {
	f := newFake(t)
	c := f.dial(t)
	tests := []struct {
		code connect.Code
		want error // nil: no sentinel
	}{
		{connect.CodeInvalidArgument, ErrInvalid},
		{connect.CodeNotFound, ErrNotFound},
		{connect.CodeAlreadyExists, ErrExists},
		{connect.CodeFailedPrecondition, ErrImmutable},
		{connect.CodeUnavailable, ErrUnavailable},
		{connect.CodeUnauthenticated, ErrUnauthenticated},
		{connect.CodePermissionDenied, ErrPermissionDenied},
		{connect.CodeAborted, ErrConflict},
		{connect.CodeInternal, nil},
		{connect.CodeResourceExhausted, ErrResourceExhausted},
	}
	for _, tc := range tests {
		t.Run(tc.code.String(), func(t *testing.T) {
			f.FailNext(keyshardv1connect.AdminServiceStatusProcedure, 1, connect.NewError(tc.code, errors.New("the server's message")))
			_, err := c.Admin().Status(context.Background())
			if err == nil {
				t.Fatal("Status succeeded; want an error")
			}
			for _, s := range allSentinels {
				if got := errors.Is(err, s); got != (s == tc.want) {
					t.Errorf("errors.Is(%v, %v) = %v, want %v", err, s, got, !got)
				}
			}
			if !strings.Contains(err.Error(), "the server's message") {
				t.Errorf("error %q does not carry the server's message", err)
			}
			if got := connect.CodeOf(err); got != tc.code {
				t.Errorf("connect.CodeOf = %v, want %v", got, tc.code)
			}
			if _, ok := AsWrongOwner(err); ok {
				t.Errorf("AsWrongOwner(%v) = true, want false", err)
			}
		})
	}
}

// wrongOwnerService is a worker's own RPC server, stood in for by an
// AdminService whose Status answers with client.WrongOwner.
type wrongOwnerService struct {
	keyshardv1connect.UnimplementedAdminServiceHandler
	err error
}

func (s wrongOwnerService) Status(context.Context, *connect.Request[keyshardv1.StatusRequest]) (*connect.Response[keyshardv1.StatusResponse], error) {
	return nil, WrongOwner(s.err)
}

func TestWrongOwnerRoundTrip(t *testing.T) {
	want := &WrongOwnerError{Bucket: 42, Owner: "w2", Address: "10.0.0.2:9000", Epoch: 7}
	mux := http.NewServeMux()
	mux.Handle(keyshardv1connect.NewAdminServiceHandler(wrongOwnerService{err: fmt.Errorf("serve room 12: %w", want)}))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	// A plain connect client sees FailedPrecondition with the detail.
	raw := keyshardv1connect.NewAdminServiceClient(srv.Client(), srv.URL)
	_, err := raw.Status(context.Background(), connect.NewRequest(&keyshardv1.StatusRequest{}))
	if got := connect.CodeOf(err); got != connect.CodeFailedPrecondition {
		t.Fatalf("code = %v, want FailedPrecondition", got)
	}
	got, ok := AsWrongOwner(err)
	if !ok {
		t.Fatalf("AsWrongOwner(%v) = false", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("decoded WrongOwner (-want +got):\n%s", diff)
	}

	// Through the SDK, the error is a *WrongOwnerError and ErrWrongOwner.
	c, err := Dial(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Admin().Status(context.Background())
	var wo *WrongOwnerError
	if !errors.As(err, &wo) || !errors.Is(err, ErrWrongOwner) {
		t.Fatalf("err = %v, want a *WrongOwnerError that Is ErrWrongOwner", err)
	}
	if diff := cmp.Diff(want, wo); diff != "" {
		t.Errorf("WrongOwnerError (-want +got):\n%s", diff)
	}
	if errors.Is(err, ErrImmutable) {
		t.Errorf("a WrongOwner answer must not read as ErrImmutable")
	}
	if got, ok := AsWrongOwner(err); !ok || *got != *want {
		t.Errorf("AsWrongOwner = %v, %v", got, ok)
	}
}

func TestWrongOwnerEncodesOtherErrors(t *testing.T) {
	tests := []struct {
		err  error
		want connect.Code
	}{
		{fmt.Errorf("bucket 3: %w", ErrNotGranted), connect.CodeUnavailable},
		{ErrNotFound, connect.CodeNotFound},
		{fmt.Errorf("x: %w", ErrInvalid), connect.CodeInvalidArgument},
		{ErrClosed, connect.CodeUnavailable},
		{connect.NewError(connect.CodeDeadlineExceeded, errors.New("slow")), connect.CodeDeadlineExceeded},
		{errors.New("something else"), connect.CodeUnknown},
		{nil, connect.CodeInternal},
	}
	for _, tc := range tests {
		got := WrongOwner(tc.err)
		if got == nil || got.Code() != tc.want {
			t.Errorf("WrongOwner(%v) = %v, want code %v", tc.err, got, tc.want)
		}
		if _, ok := AsWrongOwner(got); ok {
			t.Errorf("WrongOwner(%v) carries a WrongOwner detail", tc.err)
		}
	}
}

func TestWrongOwnerErrorText(t *testing.T) {
	tests := []struct {
		e    WrongOwnerError
		want string
	}{
		{WrongOwnerError{Bucket: 1, Owner: "w2", Address: "h:1", Epoch: 3}, `keyshard: wrong owner: bucket 1 belongs to "w2" at "h:1" (epoch 3)`},
		{WrongOwnerError{Bucket: 5, Epoch: 9}, `keyshard: wrong owner: bucket 5 is unassigned at epoch 9`},
	}
	for _, tc := range tests {
		if got := tc.e.Error(); got != tc.want {
			t.Errorf("Error() = %q, want %q", got, tc.want)
		}
	}
}

func TestSentinelsArePrefixed(t *testing.T) {
	for _, s := range allSentinels {
		if !strings.HasPrefix(s.Error(), "keyshard: ") {
			t.Errorf("sentinel %q lacks the keyshard: prefix", s)
		}
	}
}

// checkArgError fails the test unless err is an *ArgError of function fn
// for argument arg whose reason contains text, and wraps ErrInvalid.
func checkArgError(t *testing.T, what string, err error, fn, arg, text string) {
	t.Helper()
	var ae *ArgError
	switch {
	case !errors.As(err, &ae):
		t.Errorf("%s: %v; want an *ArgError of %s for %s", what, err, fn, arg)
	case !errors.Is(err, ErrInvalid):
		t.Errorf("%s: %v does not wrap ErrInvalid", what, err)
	case ae.Func != fn || ae.Arg != arg || !strings.Contains(ae.Reason, text):
		t.Errorf("%s: %v (Func %q, Arg %q, Reason %q); want Func %q, Arg %q, a reason mentioning %q", what, err, ae.Func, ae.Arg, ae.Reason, fn, arg, text)
	}
}

func TestArgError(t *testing.T) {
	err := fmt.Errorf("setting up: %w", &ArgError{Func: "NewWorker", Arg: "FenceMargin", Reason: "-1s is negative"})
	if got, want := err.Error(), "setting up: keyshard: invalid argument: NewWorker: FenceMargin -1s is negative"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	for _, s := range allSentinels {
		if got := errors.Is(err, s); got != (s == ErrInvalid) {
			t.Errorf("errors.Is(ArgError, %v) = %v", s, got)
		}
	}
	if got := connect.CodeOf(WrongOwner(err)); got != connect.CodeInvalidArgument {
		t.Errorf("WrongOwner(ArgError) has code %v, want InvalidArgument", got)
	}
}
