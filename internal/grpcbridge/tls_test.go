package grpcbridge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	keyshardv1 "github.com/keyshard/keyshard/api/keyshard/v1"
	"github.com/keyshard/keyshard/api/keyshard/v1/keyshardv1connect"
)

// testCert is net/http/httptest's certificate (for 127.0.0.1) and a
// pool that trusts it.
func testCert(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	srv.StartTLS()
	defer srv.Close()
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	return srv.TLS.Certificates[0], pool
}

// TestTLS: with SplitOptions.TLSConfig, Split does the handshake and
// routes inside it: gRPC over HTTP/2 to the bridge; the Connect protocol
// over HTTP/2, and HTTP/1.1, to the http.Server; a plain HTTP request
// gets net/http's 400.
func TestTLS(t *testing.T) {
	cert, pool := testCert(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	svc := &testService{recvErrs: make(chan error, 1)}
	mux := http.NewServeMux()
	mux.Handle(keyshardv1connect.NewMemberServiceHandler(svc))
	var toGRPC, toHTTP, tlsErrs atomic.Int64
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
	grpcLn, httpLn := Split(ln, SplitOptions{TLSConfig: cfg, OnTLSError: func(net.Addr, error) { tlsErrs.Add(1) }, OnRoute: func(g bool) {
		if g {
			toGRPC.Add(1)
		} else {
			toHTTP.Add(1)
		}
	}})
	b := New(mux, Options{})
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetHTTP2(true)
	p.SetUnencryptedHTTP2(true) // HTTP/2 connections come decrypted
	hs := &http.Server{Handler: mux, Protocols: p, TLSConfig: cfg}
	bdone, hdone := make(chan error, 1), make(chan error, 1)
	go func() { bdone <- b.Serve(grpcLn) }()  // exits when the listener closes
	go func() { hdone <- hs.Serve(httpLn) }() // exits when the listener closes
	defer func() {
		hs.Close()
		b.Stop()
		<-bdone
		<-hdone
	}()
	url := "https://" + ln.Addr().String()
	client := func(h2 bool) *http.Client {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, Protocols: new(http.Protocols)}
		tr.Protocols.SetHTTP1(!h2)
		tr.Protocols.SetHTTP2(h2)
		return &http.Client{Transport: tr}
	}
	for _, tc := range []struct {
		name string
		hc   *http.Client
		opts []connect.ClientOption
		want string
	}{
		{"gRPC", client(true), []connect.ClientOption{connect.WithGRPC()}, "bridge"},
		{"Connect over HTTP/2", client(true), nil, "http"},
		{"Connect over HTTP/1.1", client(false), nil, "http"},
	} {
		c := keyshardv1connect.NewMemberServiceClient(tc.hc, url, tc.opts...)
		res, err := c.Join(context.Background(), connect.NewRequest(&keyshardv1.JoinRequest{Keyspace: "ks", Member: &keyshardv1.Member{Id: "m"}}))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := res.Msg.GetSession(); got != tc.want+":m" {
			t.Errorf("%s: served by %q; want %s", tc.name, got, tc.want)
		}
		if tc.want == "bridge" {
			st := c.Session(context.Background())
			if err := st.Send(&keyshardv1.SessionRequest{Session: "s", KeepAlive: 7}); err != nil {
				t.Fatal(err)
			}
			if res, err := st.Receive(); err != nil || res.GetKeepAlive().GetKeepAlive() != 7 {
				t.Fatalf("%s: Session answer %v, %v; want keep-alive 7", tc.name, res, err)
			}
			st.CloseRequest()
			if _, err := st.Receive(); !errors.Is(err, io.EOF) {
				t.Fatalf("%s: stream end %v; want EOF", tc.name, err)
			}
			st.CloseResponse()
		}
	}
	if toGRPC.Load() != 1 || toHTTP.Load() != 2 {
		t.Errorf("routed %d connections to the bridge, %d to http; want 1 and 2", toGRPC.Load(), toHTTP.Load())
	}
	res, err := http.Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "HTTP request to an HTTPS server") {
		t.Fatalf("plain HTTP to the TLS port: %d %q; want 400 saying so", res.StatusCode, body)
	}
	// The body ends when Split closes the connection, after it reported
	// the failed handshake.
	if tlsErrs.Load() != 1 {
		t.Errorf("%d failed handshakes reported; want 1", tlsErrs.Load())
	}
}
