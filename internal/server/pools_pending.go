package server

import "github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"

// tenantPoolService serves TenantPoolService: tenant pools, their members'
// sessions, load reports and snapshots. Calls not implemented yet answer
// UNIMPLEMENTED.
type tenantPoolService struct {
	keyshardv1connect.UnimplementedTenantPoolServiceHandler
	s *Server
}
