package server

import (
	"slices"
	"testing"

	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
)

// TestAdminReadCalls checks that the read-only AdminService calls come
// from the proto's idempotency levels: the NO_SIDE_EFFECTS ones, and no
// call that changes something.
func TestAdminReadCalls(t *testing.T) {
	want := []string{
		keyshardv1connect.AdminServiceStatusProcedure,
		keyshardv1connect.AdminServiceGetKeyspaceProcedure,
		keyshardv1connect.AdminServiceListKeyspacesProcedure,
		keyshardv1connect.AdminServiceListMembersProcedure,
		keyshardv1connect.AdminServiceGetPositionsProcedure,
		keyshardv1connect.AdminServiceListHotKeyPoolsProcedure,
		keyshardv1connect.AdminServiceGetKeyspaceHistoryProcedure,
		keyshardv1connect.AdminServiceGetBucketsProcedure,
		keyshardv1connect.AdminServiceGetHotKeyReportsProcedure,
	}
	var got []string
	for p := range adminReadCalls {
		got = append(got, p)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("read-only admin calls:\n got %v\nwant %v", got, want)
	}
	for _, p := range []string{
		keyshardv1connect.AdminServiceDrainMemberProcedure,
		keyshardv1connect.AdminServiceCreateKeyspaceProcedure,
		keyshardv1connect.AdminServicePutHotKeyPoolProcedure,
		keyshardv1connect.AdminServiceResetPositionsProcedure,
	} {
		if adminReadCalls[p] {
			t.Errorf("%s counted read-only", p)
		}
	}
}
