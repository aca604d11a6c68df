package natsconn_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/internal/cli/natsconn"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
)

// pki is a CA and the certificates it signed, written as PEM files.
type pki struct {
	dir  string
	key  *ecdsa.PrivateKey
	cert *x509.Certificate
	// CA is the CA certificate's file.
	CA string
}

var serial int64

func newCA(t *testing.T, name string) *pki {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	p := &pki{dir: t.TempDir(), key: key, cert: cert}
	p.CA = p.write(t, name+"-ca.pem", "CERTIFICATE", der)
	return p
}

func (p *pki) write(t *testing.T, name, kind string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// issue signs a certificate for 127.0.0.1 usable by a server and a client,
// and returns its certificate and key files.
func (p *pki) issue(t *testing.T, name string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.cert, &key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return p.write(t, name+".pem", "CERTIFICATE", der), p.write(t, name+"-key.pem", "EC PRIVATE KEY", kder)
}

// A server that verifies client certificates refuses the handshake of a
// client without one, or with one it does not trust: Connect must fail at
// once with the TLS error, not retry it until the connect timeout.
func TestRejectedClientCertificateFailsAtOnce(t *testing.T) {
	t.Parallel()
	ca := newCA(t, "pushlb-test")
	serverCert, serverKey := ca.issue(t, "server")
	clientCert, clientKey := ca.issue(t, "client")
	foreign := newCA(t, "foreign")
	foreignCert, foreignKey := foreign.issue(t, "intruder")

	conf := filepath.Join(t.TempDir(), "tls.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, `
tls {
  cert_file: %q
  key_file: %q
  ca_file: %q
  verify: true
  timeout: 2
}
`, serverCert, serverKey, ca.CA), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := natstest.Start(t, natstest.WithConfigFile(t, conf))

	const timeout = 10 * time.Second
	for _, tc := range []struct {
		name string
		cfg  natsconn.Config
	}{
		{"no client certificate", natsconn.Config{TLSCA: ca.CA}},
		{"a certificate of another CA", natsconn.Config{TLSCA: ca.CA, TLSCert: foreignCert, TLSKey: foreignKey}},
		{"a server this client does not trust", natsconn.Config{TLSCA: foreign.CA, TLSCert: clientCert, TLSKey: clientKey}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.URL, cfg.ConnectTimeout = srv.URL(), timeout
			start := time.Now()
			nc, retries, err := connectLogged(t.Context(), cfg)
			elapsed := time.Since(start)
			if err == nil {
				nc.Close()
				t.Fatal("connected")
			}
			if errors.Is(err, natsconn.ErrUnreachable) || retries != 0 {
				t.Fatalf("failed with %v after %d retries: a TLS rejection must end the wait at once", err, retries)
			}
			t.Logf("%v: %v", elapsed, err)
		})
	}

	// The right certificate connects.
	nc, err := natsconn.Connect(t.Context(), natsconn.Config{URL: srv.URL(), TLSCA: ca.CA, TLSCert: clientCert, TLSKey: clientKey}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if !nc.TLSRequired() {
		t.Error("the connection is not TLS")
	}
	nc.Close()
}
