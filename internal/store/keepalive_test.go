package store

import (
	"bytes"
	"net"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestClientKeepAliveWithinEtcdPolicy: the etcd client never pings more
// than etcd permits, so etcd never closes its connections with a GOAWAY
// "too_many_pings" (logged by gRPC as an error). The client used to ping
// idle connections (PermitWithoutStream), which a real etcd, probed
// below, refuses at the third ping.
func TestClientKeepAliveWithinEtcdPolicy(t *testing.T) {
	cc := clientConfig(Config{Endpoints: []string{"http://127.0.0.1:2379"}}, nil)

	// With a call open: at most one ping per GRPCKeepAliveMinTime, that
	// of the embedded etcd and etcd's default for an external one.
	ec, err := embedConfig(EmbeddedConfig{ClientURL: "http://127.0.0.1:2379", PeerURL: "http://127.0.0.1:2380"}, new(atomic.Bool))
	if err != nil {
		t.Fatal(err)
	}
	for name, min := range map[string]time.Duration{
		"embedded etcd's GRPCKeepAliveMinTime":     ec.GRPCKeepAliveMinTime,
		"etcd's default --grpc-keepalive-min-time": embed.DefaultGRPCKeepAliveMinTime,
	} {
		if cc.DialKeepAliveTime < min {
			t.Errorf("the client pings every %v, more often than %s %v allows", cc.DialKeepAliveTime, name, min)
		}
	}

	// Without a call open: none.
	e := runEmbedded(t, EmbeddedConfig{UnsafeNoFsync: true})
	if !pingsWithoutStreamRefused(t, e.Endpoints()[0]) {
		t.Fatal("etcd took pings on a connection without a call open; the probe is broken")
	}
	if cc.PermitWithoutStream {
		t.Error("the client pings connections without a call open (PermitWithoutStream), which etcd answers with GOAWAY too_many_pings")
	}
}

// pingsWithoutStreamRefused makes one call to the etcd at endpoint over a
// raw HTTP/2 connection, then, with no call open, pings as gRPC's
// keep-alive with PermitWithoutStream does on an idle connection (etcd
// counts every such ping less than two hours after the last one, so their
// spacing does not matter), and reports whether etcd answered with a
// GOAWAY "too_many_pings".
func pingsWithoutStreamRefused(t *testing.T, endpoint string) bool {
	t.Helper()
	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Minute)) // only a guard against a hang
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(fr.WriteSettings())

	// A unary call, Maintenance.Status with an empty request, so that
	// etcd hands the connection to its gRPC server; it ends with the
	// answer's trailers.
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", u.Host},
		{":path", "/etcdserverpb.Maintenance/Status"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		must(enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}))
	}
	must(fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true}))
	must(fr.WriteData(1, true, []byte{0, 0, 0, 0, 0})) // uncompressed, 0 bytes

	const pings = 5 // etcd (gRPC) allows two strikes
	sentPings := false
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return false // closed without a GOAWAY
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				must(fr.WriteSettingsAck())
			}
		case *http2.HeadersFrame:
			if f.StreamID == 1 && f.StreamEnded() && !sentPings { // the call's trailers: no call open
				sentPings = true
				for i := range pings + 1 { // the last one marks the end
					must(fr.WritePing(false, [8]byte{byte(i)}))
				}
			}
		case *http2.PingFrame:
			if f.IsAck() && f.Data[0] == pings {
				return false // every ping answered, no GOAWAY before
			}
		case *http2.GoAwayFrame:
			return f.ErrCode == http2.ErrCodeEnhanceYourCalm && string(f.DebugData()) == "too_many_pings"
		}
	}
}
