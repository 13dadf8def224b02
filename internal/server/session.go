package server

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/keyshard/keyshard/internal/shard"
)

// sessions mints and checks the session tokens handed to members. A token
// is "<keyspace>/<member>/<lease hex>/<mac>", where mac is an HMAC of the
// rest under the cluster secret, so one member cannot forge another's
// session, and every replica can check a token without a lookup.
type sessions struct{ secret []byte }

// session is a parsed, verified session token.
type session struct {
	keyspace, member string
	lease            shard.LeaseID
}

func (s sessions) mac(ks, id string, lease shard.LeaseID) string {
	h := hmac.New(sha256.New, s.secret)
	fmt.Fprintf(h, "%s/%s/%s", ks, id, lease)
	return hex.EncodeToString(h.Sum(nil)[:16])
}

func (s sessions) token(ks, id string, lease shard.LeaseID) string {
	return fmt.Sprintf("%s/%s/%s/%s", ks, id, lease, s.mac(ks, id, lease))
}

// parse verifies a token. Names cannot contain "/", so the split is exact.
func (s sessions) parse(tok string) (session, error) {
	parts := strings.Split(tok, "/")
	if tok == "" {
		return session{}, invalid("session: empty; pass the session that Join returned")
	}
	if len(parts) != 4 {
		return session{}, invalid("session %q is malformed; pass the session that Join returned", tok)
	}
	lease, err := strconv.ParseInt(parts[2], 16, 64)
	if err != nil || lease <= 0 {
		return session{}, invalid("session %q is malformed; pass the session that Join returned", tok)
	}
	want := s.mac(parts[0], parts[1], shard.LeaseID(lease))
	if !hmac.Equal([]byte(want), []byte(parts[3])) {
		return session{}, unauthenticated("session token does not verify: it was not issued by this cluster")
	}
	return session{keyspace: parts[0], member: parts[1], lease: shard.LeaseID(lease)}, nil
}

// poolSession is a parsed, verified tenant-pool session token.
type poolSession struct {
	pool, member string
	lease        shard.LeaseID
}

// Tenant-pool session tokens are "tp/<pool>/<member>/<lease hex>/<mac>":
// five parts where a keyspace token has four, and a MAC over another
// domain, so neither kind of token is accepted for the other.
func (s sessions) poolMAC(pool, id string, lease shard.LeaseID) string {
	h := hmac.New(sha256.New, s.secret)
	fmt.Fprintf(h, "tenantpool\x00%s/%s/%s", pool, id, lease)
	return hex.EncodeToString(h.Sum(nil)[:16])
}

func (s sessions) poolToken(pool, id string, lease shard.LeaseID) string {
	return fmt.Sprintf("tp/%s/%s/%s/%s", pool, id, lease, s.poolMAC(pool, id, lease))
}

// parsePool verifies a tenant-pool session token.
func (s sessions) parsePool(tok string) (poolSession, error) {
	if tok == "" {
		return poolSession{}, invalid("session: empty; pass the session that JoinPool returned")
	}
	parts := strings.Split(tok, "/")
	if len(parts) != 5 || parts[0] != "tp" {
		return poolSession{}, invalid("session %q is not a tenant-pool session; pass the session that JoinPool returned", tok)
	}
	lease, err := strconv.ParseInt(parts[3], 16, 64)
	if err != nil || lease <= 0 {
		return poolSession{}, invalid("session %q is malformed; pass the session that JoinPool returned", tok)
	}
	want := s.poolMAC(parts[1], parts[2], shard.LeaseID(lease))
	if !hmac.Equal([]byte(want), []byte(parts[4])) {
		return poolSession{}, unauthenticated("session token does not verify: it was not issued by this cluster")
	}
	return poolSession{pool: parts[1], member: parts[2], lease: shard.LeaseID(lease)}, nil
}
