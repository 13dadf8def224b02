package server

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
)

// The stream-mode calls not served yet answer UNIMPLEMENTED.

func (a *adminService) GetPositions(context.Context, *connect.Request[v1.GetPositionsRequest]) (*connect.Response[v1.GetPositionsResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("get positions: stream keyspaces are not served yet"))
}

func (a *adminService) ResetPositions(context.Context, *connect.Request[v1.ResetPositionsRequest]) (*connect.Response[v1.ResetPositionsResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("reset positions: stream keyspaces are not served yet"))
}

func (a *adminService) ImportKeyspace(context.Context, *connect.Request[v1.ImportKeyspaceRequest]) (*connect.Response[v1.ImportKeyspaceResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("import keyspace: not served yet"))
}
