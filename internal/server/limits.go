package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"

	"connectrpc.com/connect"

	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
)

// Limits bound what one request, and the requests a replica holds open,
// may cost it. Zero fields mean the defaults; Validate fills them in.
type Limits struct {
	// MaxRequestBytes caps the request message of every method but the
	// three that carry long lists (below), before and after
	// decompression.
	MaxRequestBytes int `yaml:"max_request_bytes"`
	// MaxReportBytes caps the request message of ReportHotKeys, Lookup,
	// Release and Commit.
	MaxReportBytes int `yaml:"max_report_bytes"`
	// MaxLookupKeys caps the keys of one Lookup.
	MaxLookupKeys int `yaml:"max_lookup_keys"`
	// MaxLookupKeyBytes caps the length of each key of a Lookup.
	MaxLookupKeyBytes int `yaml:"max_lookup_key_bytes"`
	// MaxLongPolls caps the long polls (GetGrants, GetMap and
	// GetOverflowSet with a wait) and watch streams a replica holds at
	// once.
	MaxLongPolls int `yaml:"max_long_polls"`
}

// Limit describes one field of Limits: its flag of `keyshard serve`, its
// config key, its default and its range. The flags are made from
// LimitSettings, and every refusal names both the flag and the key.
type Limit struct {
	Flag    string // without the dashes
	Key     string // in the config file
	Default int
	Max     int
	Help    string
	Field   func(*Limits) *int
}

// Names is how errors name the limit: "--flag, limits.key".
func (l Limit) Names() string { return "--" + l.Flag + ", " + l.Key }

// LimitSettings are the limits, in the order `keyshard serve --help`
// lists them.
var LimitSettings = []Limit{
	limitRequestBytes, limitReportBytes, limitLookupKeys, limitLookupKeyBytes, limitLongPolls,
}

var (
	limitRequestBytes = Limit{
		Flag: "max-request-bytes", Key: "limits.max_request_bytes", Default: 4 << 20, Max: 1 << 30,
		Help:  "largest request message, in bytes (ReportHotKeys, Lookup, Release and Commit: --max-report-bytes)",
		Field: func(l *Limits) *int { return &l.MaxRequestBytes },
	}
	limitReportBytes = Limit{
		Flag: "max-report-bytes", Key: "limits.max_report_bytes", Default: 8 << 20, Max: 1 << 30,
		Help:  "largest ReportHotKeys, Lookup, Release or Commit request message, in bytes",
		Field: func(l *Limits) *int { return &l.MaxReportBytes },
	}
	limitLookupKeys = Limit{
		Flag: "max-lookup-keys", Key: "limits.max_lookup_keys", Default: 10000, Max: 1 << 24,
		Help:  "most keys in one Lookup",
		Field: func(l *Limits) *int { return &l.MaxLookupKeys },
	}
	limitLookupKeyBytes = Limit{
		Flag: "max-lookup-key-bytes", Key: "limits.max_lookup_key_bytes", Default: 1024, Max: 1 << 20,
		Help:  "longest key in a Lookup, in bytes",
		Field: func(l *Limits) *int { return &l.MaxLookupKeyBytes },
	}
	limitLongPolls = Limit{
		Flag: "max-long-polls", Key: "limits.max_long_polls", Default: 2048, Max: 1 << 20,
		Help:  "most long polls (GetGrants, GetMap, GetOverflowSet with a wait) and watch streams held at once",
		Field: func(l *Limits) *int { return &l.MaxLongPolls },
	}
)

// DefaultLimits returns the default of every limit.
func DefaultLimits() Limits {
	var l Limits
	for _, s := range LimitSettings {
		*s.Field(&l) = s.Default
	}
	return l
}

// normalize fills defaults into zero fields and checks the ranges.
func (l *Limits) normalize() error {
	for _, s := range LimitSettings {
		v := s.Field(l)
		if *v == 0 {
			*v = s.Default
		}
		if *v < 0 || *v > s.Max {
			return configErr(s.Key, "%d; want 1 to %d (0 means %d)", *v, s.Max, s.Default)
		}
	}
	return nil
}

// listProcedures carry long lists, and get MaxReportBytes.
var listProcedures = map[string]bool{
	keyshardv1connect.HotKeyServiceReportHotKeysProcedure: true,
	keyshardv1connect.MapServiceLookupProcedure:           true,
	keyshardv1connect.MemberServiceReleaseProcedure:       true,
	keyshardv1connect.MemberServiceCommitProcedure:        true,
}

// readMax returns the largest request message of procedure and the limit
// that sets it.
func (l Limits) readMax(procedure string) (int, Limit) {
	if listProcedures[procedure] {
		return l.MaxReportBytes, limitReportBytes
	}
	return l.MaxRequestBytes, limitRequestBytes
}

// envelopeBytes is the prefix of a message in gRPC and in Connect streams;
// a body may be that much larger than its one message.
const envelopeBytes = 5

// tooLarge refuses a body of size bytes (-1: not known, only that it
// passed the limit).
func tooLarge(procedure string, size int64, most int, lim Limit) error {
	if size < 0 {
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("request body of %s is over %d bytes, the most this replica takes (%s)", procedure, most, lim.Names()))
	}
	return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("request body of %s is %d bytes; this replica takes at most %d (%s)", procedure, size, most, lim.Names()))
}

// sizeGate refuses, before reading it, a body whose Content-Length is over
// the method's limit. A body without one is cut at the limit as it is read
// (limitBodies).
func (s *Server) sizeGate(ctx context.Context, spec connect.Spec, _ connect.Peer, header http.Header) (context.Context, error) {
	most, lim := s.cfg.Limits.readMax(spec.Procedure)
	if n, err := strconv.ParseInt(header.Get("Content-Length"), 10, 64); err == nil && n > int64(most)+envelopeBytes {
		return ctx, tooLarge(spec.Procedure, n, most, lim)
	}
	return ctx, nil
}

// limitBodies makes every request body fail once it passes the limit of
// its method, with RESOURCE_EXHAUSTED naming the limit; the connection is
// then closed rather than the rest read. connect's own read limit
// (WithReadMaxBytes) still applies to the message after decompression.
//
// Session and Sessions streams are exempt: their body is a message per
// keep-alive for as long as the sessions live, and connect's limit bounds
// each message.
// Over HTTP/1.1, where no bidi stream can be served, it answers
// UNIMPLEMENTED (connect's own answer, HTTP 505, reaches clients as
// UNKNOWN), so that a member knows to use WatchGrants and KeepAlive.
func (s *Server) limitBodies(next http.Handler) http.Handler {
	errs := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == keyshardv1connect.MemberServiceSessionProcedure || r.URL.Path == keyshardv1connect.MemberServiceSessionsProcedure {
			if r.ProtoMajor < 2 && errs.IsSupported(r) {
				w.Header().Set("Connection", "close") // not waiting for the rest of a body that may never end
				_ = errs.Write(w, r, connect.NewError(connect.CodeUnimplemented, errors.New("Session and Sessions streams need HTTP/2 (gRPC, or Connect over HTTP/2); over HTTP/1.1 use WatchGrants or GetGrants, and KeepAlive")))
				return
			}
			// The handler cuts a wait for the member's next message short
			// through the response's read deadline (see Session).
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), responseWriterKey{}, w)))
			return
		}
		most, lim := s.cfg.Limits.readMax(r.URL.Path)
		r.Body = &limitedBody{
			ReadCloser: http.MaxBytesReader(w, r.Body, int64(most)+envelopeBytes),
			procedure:  r.URL.Path, most: most, lim: lim,
		}
		next.ServeHTTP(w, r)
	})
}

type limitedBody struct {
	io.ReadCloser
	procedure string
	most      int
	lim       Limit
}

func (b *limitedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		err = tooLarge(b.procedure, -1, b.most, b.lim)
	}
	return n, err
}

// longPolls counts the long polls and watch streams a replica holds, and
// refuses more than its limit.
type longPolls struct {
	most int64
	n    atomic.Int64
	m    *metrics
}

// hold takes a place for one long poll or stream; the caller calls release
// when it ends. Over the limit it returns RESOURCE_EXHAUSTED.
func (p *longPolls) hold() (release func(), err error) {
	if p.n.Add(1) > p.most {
		p.n.Add(-1)
		p.m.longPollsRefused.Inc()
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("this replica already holds %d long polls and watches, its limit (%s); retry after a backoff, ask another replica, or poll without a wait", p.most, limitLongPolls.Names()))
	}
	p.m.longPolls.Inc()
	return func() {
		p.n.Add(-1)
		p.m.longPolls.Dec()
	}, nil
}

// holdIf is hold for a long poll that may not wait (wait 0): such a call
// answers at once and takes no place.
func (p *longPolls) holdIf(wait bool) (release func(), err error) {
	if !wait {
		return func() {}, nil
	}
	return p.hold()
}

// checkLookup refuses a Lookup of more keys than MaxLookupKeys
// (RESOURCE_EXHAUSTED), or with a key longer than MaxLookupKeyBytes
// (INVALID_ARGUMENT, naming the key).
func (l Limits) checkLookup(keys []string) error {
	if len(keys) > l.MaxLookupKeys {
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("keys: %d keys in one Lookup; this replica takes at most %d (%s): split the keys over several calls", len(keys), l.MaxLookupKeys, limitLookupKeys.Names()))
	}
	for i, k := range keys {
		if len(k) > l.MaxLookupKeyBytes {
			return invalid("keys[%d]: %.40q... is %d bytes; this replica takes keys of at most %d (%s)", i, k, len(k), l.MaxLookupKeyBytes, limitLookupKeyBytes.Names())
		}
	}
	return nil
}
