package rabbitmq_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// An amqps:// URL with cacertfile, certfile and keyfile (amqp091's URI
// parameters) makes the driver speak TLS with a client certificate through
// its ordinary dial: no llmq setting is involved. The broker here has no
// TLS listener, so a proxy that requires and verifies client certificates
// terminates TLS in front of it.
func TestAMQPSWithClientCertificate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pki := newTestPKI(t, dir)
	cfg := testConfig(t)
	plain, err := url.Parse(cfg.URL)
	require.NoError(t, err)
	proxy := startTLSProxy(t, pki.server, pki.pool, plain.Host)

	amqps := *plain
	amqps.Scheme, amqps.Host = "amqps", proxy.addr
	amqps.RawQuery = url.Values{"cacertfile": {pki.caFile}, "certfile": {pki.certFile}, "keyfile": {pki.keyFile},
		"server_name_indication": {"localhost"}}.Encode()
	cfg.URL = amqps.String()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := newPublisher(t, cfg)
	require.NoError(t, p.Publish(ctx, job.PriorityNormal, broker.Message{Key: "tls-1", Body: []byte("over tls")}))
	ch, err := newSubscriber(t, cfg).Subscribe(ctx, job.PriorityNormal, 1)
	require.NoError(t, err)
	select {
	case d := <-ch:
		assert.Equal(t, "tls-1", d.Message().Key)
		require.NoError(t, d.Ack(ctx))
	case <-ctx.Done():
		t.Fatal("no delivery over TLS")
	}
	assert.Contains(t, proxy.clients(), "llmq-client", "the proxy verified the client certificate")

	// Without the client certificate the handshake is refused.
	noCert := amqps
	noCert.RawQuery = url.Values{"cacertfile": {pki.caFile}, "server_name_indication": {"localhost"}}.Encode()
	bad := cfg
	bad.URL = noCert.String()
	if pub, err := newPublisherErr(bad); err == nil {
		_ = pub.Close()
		t.Fatal("connected without a client certificate")
	}
}

type testPKI struct {
	server                    tls.Certificate
	pool                      *x509.CertPool
	caFile, certFile, keyFile string
}

// newTestPKI makes a CA, a server certificate for localhost and a client
// certificate "llmq-client", writing the CA and the client's to dir.
func newTestPKI(t *testing.T, dir string) testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "llmq test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			DNSNames: []string{"localhost"}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		require.NoError(t, err)
		return der, key
	}
	serverDER, serverKey := issue(2, "localhost", x509.ExtKeyUsageServerAuth)
	clientDER, clientKey := issue(3, "llmq-client", x509.ExtKeyUsageClientAuth)
	keyDER, err := x509.MarshalPKCS8PrivateKey(clientKey)
	require.NoError(t, err)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
		return p
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return testPKI{
		server: tls.Certificate{Certificate: [][]byte{serverDER}, PrivateKey: serverKey},
		pool:   pool,
		caFile: write("ca.pem", "CERTIFICATE", caDER), certFile: write("client.pem", "CERTIFICATE", clientDER),
		keyFile: write("client-key.pem", "PRIVATE KEY", keyDER),
	}
}

// tlsProxy terminates mutual TLS and forwards to a plain backend.
type tlsProxy struct {
	addr string
	mu   sync.Mutex
	cns  []string // verified client certificates' common names
}

func (p *tlsProxy) clients() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.cns...)
}

func startTLSProxy(t *testing.T, cert tls.Certificate, clientCAs *x509.CertPool, backend string) *tlsProxy {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clientCAs, MinVersion: tls.VersionTLS12})
	require.NoError(t, err)
	p := &tlsProxy{addr: ln.Addr().String()}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	track := func(c net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		conns = append(conns, c)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			track(c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				tc := c.(*tls.Conn)
				if err := tc.Handshake(); err != nil {
					return
				}
				p.mu.Lock()
				p.cns = append(p.cns, tc.ConnectionState().PeerCertificates[0].Subject.CommonName)
				p.mu.Unlock()
				b, err := net.Dial("tcp", backend)
				if err != nil {
					return
				}
				track(b)
				defer b.Close()
				done := make(chan struct{})
				go func() { _, _ = io.Copy(b, tc); _ = b.Close(); close(done) }()
				_, _ = io.Copy(tc, b)
				_ = tc.Close()
				<-done
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return p
}
