// Package dashboard serves Keyshard's live web dashboard: a page at /ui/
// of `keyshard serve`'s API port that shows the replicas, keyspaces (a
// grid of every bucket coloured by owner, the members, the epoch history),
// hot-key pools and tenant pools, and lets an admin drain a member.
//
// The page is plain JavaScript, HTML and CSS under assets/, embedded into
// the binary with go:embed: no build step, no external network. It calls
// the same HTTP/JSON API (the Connect protocol) as every client, with the
// bearer token the operator types into it; the page itself needs no token.
// Handler serves the assets with a strict Content-Security-Policy.
package dashboard
