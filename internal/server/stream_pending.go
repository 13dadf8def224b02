package server

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
)

// The stream-mode calls not served yet answer UNIMPLEMENTED.

func (m *memberService) Commit(context.Context, *connect.Request[v1.CommitRequest]) (*connect.Response[v1.CommitResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("commit: stream keyspaces are not served yet"))
}
