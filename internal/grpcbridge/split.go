package grpcbridge

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// SplitOptions bound how long Split waits to see what a connection is.
type SplitOptions struct {
	// PrefaceTimeout bounds the wait for a connection's first bytes
	// (0: 10 s). A connection that sends nothing goes to the http.Server.
	PrefaceTimeout time.Duration
	// RequestTimeout bounds the wait for an HTTP/2 connection's first
	// request (0: 1 minute). A connection that opens none goes to the
	// http.Server.
	RequestTimeout time.Duration
	// OnRoute, when set, learns where each connection went.
	OnRoute func(toGRPC bool)
	// TLSConfig, when set, makes every connection TLS: Split does the
	// handshake (within PrefaceTimeout) and sees the first request inside
	// it. Its NextProtos should offer "h2" and "http/1.1". A connection
	// that negotiated HTTP/1.1 goes to httpLn as the *tls.Conn itself; an
	// HTTP/2 connection that is not gRPC goes wrapped, so the http.Server
	// serves it as HTTP/2 with prior knowledge (its Protocols must allow
	// unencrypted HTTP/2) and its requests' TLS field is nil. A plain
	// HTTP request gets net/http's answer: 400, "Client sent an HTTP
	// request to an HTTPS server".
	TLSConfig *tls.Config
	// OnTLSError, when set, learns of every failed TLS handshake.
	OnTLSError func(remote net.Addr, err error)
}

// Split divides the connections ln accepts: an HTTP/2 connection (with
// prior knowledge, as gRPC clients open them without TLS, or negotiated
// by TLS when SplitOptions.TLSConfig is set) whose first request has a
// gRPC content type goes to grpcLn, for a Server; every
// other connection goes to httpLn, for an http.Server that serves all of
// them (HTTP/1.1, the Connect protocol, gRPC-Web, gRPC on a connection
// whose first request was not gRPC). Every request on a connection goes
// where its first went: a connection that opened with gRPC is answered
// HTTP 415 for a request of another protocol, so a client speaking both
// keeps them on separate connections.
//
// To see the first request, Split answers the client's HTTP/2 preface
// with its own SETTINGS frame (gRPC clients wait for one before their
// first request), and hides the client's acknowledgement of it from the
// http.Server, which did not send it.
//
// Closing either listener closes ln; both then return net.ErrClosed.
func Split(ln net.Listener, o SplitOptions) (grpcLn, httpLn net.Listener) {
	if o.PrefaceTimeout <= 0 {
		o.PrefaceTimeout = 10 * time.Second
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = time.Minute
	}
	sp := &splitter{ln: ln, o: o, done: make(chan struct{})}
	sp.grpc = &subListener{sp: sp, conns: make(chan net.Conn)}
	sp.http = &subListener{sp: sp, conns: make(chan net.Conn)}
	go sp.accept() // exits when ln closes
	return sp.grpc, sp.http
}

type splitter struct {
	ln         net.Listener
	o          SplitOptions
	grpc, http *subListener
	done       chan struct{} // closed once ln is closed
	closeOnce  sync.Once
}

// accept hands every connection ln accepts to route. A failed Accept
// other than a closed listener (out of file descriptors, say) is retried
// after a pause growing from 5 ms to 1 s, as net/http's server does.
func (sp *splitter) accept() {
	var pause time.Duration
	for {
		c, err := sp.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				sp.close()
				return
			}
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			select {
			case <-time.After(pause):
				continue
			case <-sp.done:
				return
			}
		}
		pause = 0
		go sp.route(c) // exits once c is handed on, or closed
	}
}

func (sp *splitter) close() {
	sp.closeOnce.Do(func() {
		close(sp.done)
		sp.ln.Close()
	})
}

// route sees what c is and hands it to its listener.
func (sp *splitter) route(c net.Conn) {
	if sp.o.TLSConfig != nil {
		tc, ok := sp.handshake(c)
		if !ok {
			return
		}
		if tc.ConnectionState().NegotiatedProtocol != http2.NextProtoTLS {
			sp.hand(sp.http, tc, false)
			return
		}
		c = tc
	}
	toGRPC, seen, settingsSent := sp.sniff(c)
	var rc net.Conn = &replayConn{Conn: c, buf: seen}
	to := sp.http
	switch {
	case toGRPC:
		to = sp.grpc
	case settingsSent:
		rc = &replayConn{Conn: c, r: &ackFilter{r: &replayConn{Conn: c, buf: seen}, preface: len(http2.ClientPreface)}}
	}
	sp.hand(to, rc, toGRPC)
}

// hand gives c to listener to.
func (sp *splitter) hand(to *subListener, c net.Conn, toGRPC bool) {
	if sp.o.OnRoute != nil {
		sp.o.OnRoute(toGRPC)
	}
	select {
	case to.conns <- c:
	case <-sp.done:
		c.Close()
	}
}

// handshake does c's TLS handshake within PrefaceTimeout; false if it
// failed, c then closed (with net/http's answer to a plain HTTP request).
func (sp *splitter) handshake(c net.Conn) (*tls.Conn, bool) {
	tc := tls.Server(c, sp.o.TLSConfig)
	_ = c.SetDeadline(time.Now().Add(sp.o.PrefaceTimeout))
	if err := tc.Handshake(); err != nil {
		var re tls.RecordHeaderError
		if errors.As(err, &re) && re.Conn != nil && looksLikeHTTP(re.RecordHeader) {
			_, _ = io.WriteString(re.Conn, "HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
		}
		if sp.o.OnTLSError != nil {
			sp.o.OnTLSError(c.RemoteAddr(), err)
		}
		c.Close()
		return nil, false
	}
	_ = c.SetDeadline(time.Time{})
	return tc, true
}

// looksLikeHTTP: a TLS record header that is the start of an HTTP/1
// request, as net/http tells them apart.
func looksLikeHTTP(h [5]byte) bool {
	switch string(h[:]) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO":
		return true
	}
	return false
}

// sniff reads c's first bytes (seen): the HTTP/2 client preface, frames
// up to the first HEADERS, and whether that request is gRPC.
func (sp *splitter) sniff(c net.Conn) (toGRPC bool, seen []byte, settingsSent bool) {
	rec := &recorder{r: c}
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	_ = c.SetReadDeadline(time.Now().Add(sp.o.PrefaceTimeout))
	preface := []byte(http2.ClientPreface)
	for len(rec.buf) < len(preface) {
		var b [64]byte
		n, err := rec.Read(b[:len(preface)-len(rec.buf)])
		if !bytes.HasPrefix(preface, rec.buf) || (err != nil && n == 0) {
			return false, rec.buf, false
		}
	}
	// An empty SETTINGS frame: the server's preface.
	if _, err := c.Write([]byte{0, 0, 0, 0x4, 0, 0, 0, 0, 0}); err != nil {
		return false, rec.buf, true
	}
	_ = c.SetReadDeadline(time.Now().Add(sp.o.RequestTimeout))
	fr := http2.NewFramer(io.Discard, rec)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.MaxHeaderListSize = 1 << 20
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return false, rec.buf, true
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			for _, hf := range f.RegularFields() {
				if hf.Name == "content-type" {
					return isGRPC(hf.Value), rec.buf, true
				}
			}
			return false, rec.buf, true
		case *http2.SettingsFrame, *http2.WindowUpdateFrame, *http2.PriorityFrame, *http2.PingFrame:
		default:
			return false, rec.buf, true
		}
	}
}

// isGRPC: application/grpc, or application/grpc+codec or ;params, not
// gRPC-Web (application/grpc-web...).
func isGRPC(contentType string) bool {
	rest, ok := strings.CutPrefix(contentType, "application/grpc")
	return ok && (rest == "" || rest[0] == '+' || rest[0] == ';')
}

// recorder keeps every byte read through it.
type recorder struct {
	r   io.Reader
	buf []byte
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.buf = append(r.buf, p[:n]...)
	return n, err
}

// replayConn reads buf (what sniff read) before the connection, or reads
// through r when set.
type replayConn struct {
	net.Conn
	buf []byte
	r   io.Reader
}

func (c *replayConn) Read(p []byte) (int, error) {
	if c.r != nil {
		return c.r.Read(p)
	}
	if len(c.buf) > 0 {
		n := copy(p, c.buf)
		c.buf = c.buf[n:]
		if len(c.buf) == 0 {
			c.buf = nil
		}
		return n, nil
	}
	return c.Conn.Read(p)
}

// ackFilter passes an HTTP/2 client's bytes through, less its first
// SETTINGS acknowledgement: the one for Split's SETTINGS, which the
// http.Server reading them did not send.
type ackFilter struct {
	r       io.Reader
	preface int    // preface bytes still to pass
	left    int    // payload bytes of the current frame still to pass
	out     []byte // a frame header still to pass
	dropped bool   // the acknowledgement is gone: pass everything
}

func (f *ackFilter) Read(p []byte) (int, error) {
	for {
		switch {
		case len(f.out) > 0:
			n := copy(p, f.out)
			f.out = f.out[n:]
			return n, nil
		case f.dropped:
			return f.r.Read(p)
		case f.preface > 0:
			n, err := f.r.Read(p[:min(len(p), f.preface)])
			f.preface -= n
			return n, err
		case f.left > 0:
			n, err := f.r.Read(p[:min(len(p), f.left)])
			f.left -= n
			return n, err
		}
		var h [9]byte
		if _, err := io.ReadFull(f.r, h[:]); err != nil {
			return 0, err
		}
		length := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
		if http2.FrameType(h[3]) == http2.FrameSettings && http2.Flags(h[4]).Has(http2.FlagSettingsAck) && length == 0 {
			f.dropped = true
			continue
		}
		f.out, f.left = h[:], length
	}
}

// subListener is one side of Split.
type subListener struct {
	sp    *splitter
	conns chan net.Conn
}

func (l *subListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.sp.done:
		return nil, net.ErrClosed
	}
}

func (l *subListener) Close() error {
	l.sp.close()
	return nil
}

func (l *subListener) Addr() net.Addr { return l.sp.ln.Addr() }
