package server

import (
	"context"
	"crypto/subtle"
	"errors"
	"net/http"
	"strings"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/descriptorpb"

	v1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
)

// role is what a bearer token allows.
type role int

const (
	roleNone role = iota
	roleMember
	roleAdmin
)

// authenticator checks bearer tokens against the roles each service needs:
// admin for AdminService except its read-only calls (adminReadCalls),
// which take either token, member for MemberService, either for MapService
// and HotKeyService (routers and producers may run with either token).
// Its gate runs once the request headers are in, before any byte of the
// body is read: a caller without a valid token costs no more than its
// headers.
type authenticator struct {
	open    bool // no tokens configured on loopback, or auth disabled
	admin   [][]byte
	member  [][]byte
	refused *prometheus.CounterVec
}

func newAuthenticator(c AuthConfig, open bool, reg prometheus.Registerer) *authenticator {
	a := &authenticator{
		open: open,
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyshard_api_auth_refused_total",
			Help: "API requests refused for a missing, unknown or insufficient bearer token.",
		}, []string{"procedure", "reason"}),
	}
	for _, t := range c.AdminTokens {
		a.admin = append(a.admin, []byte(t))
	}
	for _, t := range c.MemberTokens {
		a.member = append(a.member, []byte(t))
	}
	reg.MustRegister(a.refused)
	return a
}

func (a *authenticator) roleOf(token string) role {
	tok := []byte(token)
	match := func(set [][]byte) bool {
		found := 0
		for _, s := range set {
			found |= subtle.ConstantTimeCompare(tok, s)
		}
		return found == 1
	}
	switch {
	case match(a.admin):
		return roleAdmin
	case match(a.member):
		return roleMember
	}
	return roleNone
}

// check returns nil if header carries a token allowed to call procedure:
// any known token, except that AdminService's calls that change something
// need an admin token and MemberService a member token.
func (a *authenticator) check(procedure string, header http.Header) error {
	if a.open {
		return nil
	}
	auth := header.Get("Authorization")
	token, ok := bearerToken(auth)
	if !ok {
		a.refused.WithLabelValues(procedure, "missing").Inc()
		return connect.NewError(connect.CodeUnauthenticated, errors.New(`missing bearer token: send "Authorization: Bearer <token>" with an admin or member token`))
	}
	r := a.roleOf(token)
	if r == roleNone {
		a.refused.WithLabelValues(procedure, "unknown").Inc()
		return connect.NewError(connect.CodeUnauthenticated, errors.New("unknown bearer token"))
	}
	switch {
	case strings.HasPrefix(procedure, "/"+keyshardv1connect.AdminServiceName+"/") && r != roleAdmin && !adminReadCalls[procedure]:
		a.refused.WithLabelValues(procedure, "role").Inc()
		return connect.NewError(connect.CodePermissionDenied, errors.New("this call needs an admin token; the token given is a member token"))
	case strings.HasPrefix(procedure, "/"+keyshardv1connect.MemberServiceName+"/") && r != roleMember:
		a.refused.WithLabelValues(procedure, "role").Inc()
		return connect.NewError(connect.CodePermissionDenied, errors.New("this call needs a member token; the token given is an admin token"))
	case poolAdminCalls[procedure] && r != roleAdmin:
		a.refused.WithLabelValues(procedure, "role").Inc()
		return connect.NewError(connect.CodePermissionDenied, errors.New("this call needs an admin token; the token given is a member token"))
	case poolMemberCalls[procedure] && r != roleMember:
		a.refused.WithLabelValues(procedure, "role").Inc()
		return connect.NewError(connect.CodePermissionDenied, errors.New("this call needs a member token; the token given is an admin token"))
	}
	return nil
}

// adminReadCalls are AdminService's read-only procedures: those the proto
// marks idempotency_level = NO_SIDE_EFFECTS. A member token may call them
// (a dashboard or a worker's tooling reads status with the token it has);
// every other AdminService call needs an admin token. Read from the
// proto's descriptor, so a read-only call added to the proto follows.
var adminReadCalls = readOnlyProcedures(keyshardv1connect.AdminServiceName)

// readOnlyProcedures returns the procedures ("/<service>/<method>") of
// service whose idempotency level is NO_SIDE_EFFECTS.
func readOnlyProcedures(service string) map[string]bool {
	out := map[string]bool{}
	svcs := v1.File_keyshard_proto.Services()
	for i := range svcs.Len() {
		svc := svcs.Get(i)
		if string(svc.FullName()) != service {
			continue
		}
		methods := svc.Methods()
		for j := range methods.Len() {
			m := methods.Get(j)
			opts, _ := m.Options().(*descriptorpb.MethodOptions)
			if opts.GetIdempotencyLevel() == descriptorpb.MethodOptions_NO_SIDE_EFFECTS {
				out["/"+service+"/"+string(m.Name())] = true
			}
		}
	}
	return out
}

// TenantPoolService mixes roles: changing a pool needs admin, a member's
// session needs member, reports and reads take either.
var (
	poolAdminCalls = map[string]bool{
		keyshardv1connect.TenantPoolServicePutTenantPoolProcedure:    true,
		keyshardv1connect.TenantPoolServiceDeleteTenantPoolProcedure: true,
	}
	poolMemberCalls = map[string]bool{
		keyshardv1connect.TenantPoolServiceJoinPoolProcedure:      true,
		keyshardv1connect.TenantPoolServicePoolKeepAliveProcedure: true,
		keyshardv1connect.TenantPoolServiceLeavePoolProcedure:     true,
		keyshardv1connect.TenantPoolServiceMarkReadyProcedure:     true,
	}
)

// gate is a connect.RequestGateFunc: it refuses the call before its
// message is read.
func (a *authenticator) gate(ctx context.Context, spec connect.Spec, _ connect.Peer, header http.Header) (context.Context, error) {
	return ctx, a.check(spec.Procedure, header)
}

// bearerToken returns the token of an Authorization header value. The
// scheme is case-insensitive and may be followed by several spaces, as RFC
// 7235 has it.
func bearerToken(auth string) (string, bool) {
	scheme, token, ok := strings.Cut(auth, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimLeft(token, " ")
	return token, token != ""
}
