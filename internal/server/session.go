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
