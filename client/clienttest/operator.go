package clienttest

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
)

// The operator calls of stream mode (positions, import) answer
// UNIMPLEMENTED: the fake plans nothing, so there is no placement to import
// into and no fold to read positions from. Test code that calls them
// against keyshardtest.Start, the real server.

func (a adminService) GetPositions(context.Context, *connect.Request[keyshardv1.GetPositionsRequest]) (*connect.Response[keyshardv1.GetPositionsResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("get positions: not in the fake; test this against keyshardtest.Start"))
}

func (a adminService) ResetPositions(context.Context, *connect.Request[keyshardv1.ResetPositionsRequest]) (*connect.Response[keyshardv1.ResetPositionsResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("reset positions: not in the fake; test this against keyshardtest.Start"))
}

func (a adminService) ImportKeyspace(context.Context, *connect.Request[keyshardv1.ImportKeyspaceRequest]) (*connect.Response[keyshardv1.ImportKeyspaceResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("import keyspace: not in the fake; test this against keyshardtest.Start"))
}

// The dashboard's reads (map history, buckets, hot-key reports) answer
// UNIMPLEMENTED too: the fake keeps no history, grants or reports to read.

func (a adminService) GetKeyspaceHistory(context.Context, *connect.Request[keyshardv1.GetKeyspaceHistoryRequest]) (*connect.Response[keyshardv1.GetKeyspaceHistoryResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("get keyspace history: not in the fake; test this against keyshardtest.Start"))
}

func (a adminService) GetBuckets(context.Context, *connect.Request[keyshardv1.GetBucketsRequest]) (*connect.Response[keyshardv1.GetBucketsResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("get buckets: not in the fake; test this against keyshardtest.Start"))
}

func (a adminService) GetHotKeyReports(context.Context, *connect.Request[keyshardv1.GetHotKeyReportsRequest]) (*connect.Response[keyshardv1.GetHotKeyReportsResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("get hot-key reports: not in the fake; test this against keyshardtest.Start"))
}
