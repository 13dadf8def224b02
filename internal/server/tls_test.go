package server_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyshard/keyshard/client"
	"github.com/keyshard/keyshard/internal/server"
	"github.com/keyshard/keyshard/internal/store"
)

// selfSigned writes a certificate for 127.0.0.1 and its key to dir and
// returns their paths and a pool that trusts it.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "keyshard-test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "api.pem"), filepath.Join(dir, "api-key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestTLS serves the API over TLS: the SDK connects with the CA, over
// both the Connect protocol and gRPC; plain HTTP is refused.
func TestTLS(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	ts := startServer(t, func(c *server.Config) { c.TLS.CertFile, c.TLS.KeyFile = certFile, keyFile })
	url := "https://" + ts.srv.Addr()
	ctx := ctxT(t)
	for _, grpc := range []bool{false, true} {
		opts := []client.Option{client.Token(adminToken), client.TLSConfig(&tls.Config{RootCAs: pool})}
		if grpc {
			opts = append(opts, client.GRPC())
		}
		cl, err := client.Dial(url, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Admin().ListKeyspaces(ctx); err != nil {
			t.Fatalf("grpc=%v: %v", grpc, err)
		}
		cl.Close()
	}
	// Without the CA the handshake fails; plain HTTP gets no API.
	cl, _ := client.Dial(url, client.Token(adminToken))
	if _, err := cl.Admin().ListKeyspaces(ctx); err == nil {
		t.Fatal("an untrusted certificate was accepted")
	}
	cl.Close()
	res, err := http.Get("http://" + ts.srv.Addr() + "/healthz")
	if err == nil {
		res.Body.Close()
		if res.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP served the API port")
		}
	}
}

// TestExternalEtcdTLS runs a replica against an etcd that serves clients
// over TLS and requires a client certificate: the replica connects with
// the etcd.tls settings and serves as usual.
func TestExternalEtcdTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, _ := selfSigned(t, dir)
	ctx := ctxT(t)
	emb, err := store.StartEmbedded(ctx, store.EmbeddedConfig{Dir: filepath.Join(dir, "etcd"), ClientTLS: &store.ClientTLS{CertFile: certFile, KeyFile: keyFile, ClientCA: certFile}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Close) // after the replica: cleanups run last-in first-out
	if ep := emb.Endpoints()[0]; !strings.HasPrefix(ep, "https://") {
		t.Fatalf("endpoint %q is not https", ep)
	}
	ts := startServer(t, func(c *server.Config) {
		c.Etcd.Endpoints = emb.Endpoints()
		c.Etcd.TLS = server.TLSFiles{CertFile: certFile, KeyFile: keyFile, CAFile: certFile}
	})
	cl, err := client.Dial(ts.url, client.Token(adminToken))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Admin().CreateKeyspace(ctx, client.KeyspaceConfig{Name: "rooms", Buckets: 16}); err != nil {
		t.Fatal(err)
	}
	if ks, err := cl.Admin().ListKeyspaces(ctx); err != nil || len(ks) != 1 {
		t.Fatalf("keyspaces over a TLS etcd: %v %v", ks, err)
	}
}
