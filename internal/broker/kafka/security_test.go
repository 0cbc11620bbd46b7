package kafka_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/kafka"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/testsvc"
)

// newCluster starts a kfake cluster with opts for this test.
func newCluster(t testing.TB, opts ...kfake.Opt) []string {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// roundTrip publishes one message to a lane and receives it back.
func roundTrip(t *testing.T, cfg kafka.Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := newPublisher(t, cfg)
	require.NoError(t, p.Publish(ctx, job.PriorityHigh, broker.Message{Key: "j1", Body: []byte("hello")}))
	ch, err := newSubscriber(t, cfg).Subscribe(ctx, job.PriorityHigh, 1)
	require.NoError(t, err)
	d := receive(t, ctx, ch)
	assert.Equal(t, "j1", d.Message().Key)
	assert.Equal(t, "hello", string(d.Message().Body))
	require.NoError(t, d.Ack(ctx))
	depth, err := newInspector(t, cfg).Depth(ctx, job.PriorityHigh)
	require.NoError(t, err)
	assert.Zero(t, depth, "the inspector connects with the same credentials")
}

// A cluster that requires SASL serves llmq's clients with the right
// credentials (PLAIN and both SCRAMs) and refuses a wrong password with an
// error that does not contain it.
func TestSASL(t *testing.T) {
	t.Parallel()
	const pass = "s3cret-password-of-llmq"
	brokers := newCluster(t, kfake.EnableSASL(),
		kfake.Superuser("PLAIN", "llmq-plain", pass),
		kfake.Superuser("SCRAM-SHA-256", "llmq-256", pass),
		kfake.Superuser("SCRAM-SHA-512", "llmq-512", pass))
	for _, tc := range []struct{ mechanism, user string }{
		{"plain", "llmq-plain"}, {"scram-sha-256", "llmq-256"}, {"SCRAM-SHA-512", "llmq-512"},
	} {
		t.Run(tc.mechanism, func(t *testing.T) {
			m, err := kafka.SASL(tc.mechanism, tc.user, pass)
			require.NoError(t, err)
			roundTrip(t, kafka.Config{Brokers: brokers, Prefix: testsvc.KafkaPrefix(t), SASL: m})
		})
		t.Run(tc.mechanism+"/wrong password", func(t *testing.T) {
			const wrong = "not-the-password-123"
			m, err := kafka.SASL(tc.mechanism, tc.user, wrong)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			p, err := kafka.NewPublisher(ctx, kafka.Config{Brokers: brokers, Prefix: testsvc.KafkaPrefix(t), SASL: m})
			if err == nil {
				_ = p.Close()
				t.Fatal("publisher started with a wrong password")
			}
			t.Logf("wrong password: %v", err)
			assert.Contains(t, err.Error(), "check kafka.tls and kafka.sasl")
			assert.NotContains(t, err.Error(), wrong)
			assert.NotContains(t, err.Error(), pass)
		})
	}
	t.Run("no credentials", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		p, err := kafka.NewPublisher(ctx, kafka.Config{Brokers: brokers, Prefix: testsvc.KafkaPrefix(t)})
		if err == nil {
			_ = p.Close()
			t.Fatal("publisher started without credentials on a SASL cluster")
		}
	})
	_, err := kafka.SASL("gssapi", "u", pass)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), pass)
}

// A TLS cluster with a CA made here serves llmq's clients that trust the
// CA (through TLSConfig's ca_file) and refuses those that do not.
func TestTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	serverCert, caFile := selfSignedCA(t, dir)
	brokers := newCluster(t, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{serverCert}, MinVersion: tls.VersionTLS12}))

	tc, err := kafka.TLSConfig(caFile, "", "", false)
	require.NoError(t, err)
	roundTrip(t, kafka.Config{Brokers: brokers, Prefix: testsvc.KafkaPrefix(t), TLS: tc})

	t.Run("untrusted", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		system, err := kafka.TLSConfig("", "", "", false)
		require.NoError(t, err)
		p, err := kafka.NewPublisher(ctx, kafka.Config{Brokers: brokers, Prefix: testsvc.KafkaPrefix(t), TLS: system})
		if err == nil {
			_ = p.Close()
			t.Fatal("publisher trusted a certificate no CA it knows signed")
		}
	})
	t.Run("bad files", func(t *testing.T) {
		_, err := kafka.TLSConfig(filepath.Join(dir, "missing.pem"), "", "", false)
		assert.Error(t, err)
		_, err = kafka.TLSConfig(caFile, caFile, "", false)
		assert.ErrorContains(t, err, "go together")
	})
}

// selfSignedCA writes a CA certificate to dir and returns a server
// certificate it signed for 127.0.0.1 and localhost, and the CA's file.
func selfSignedCA(t testing.TB, dir string) (tls.Certificate, string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "llmq test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	caFile := filepath.Join(dir, "ca.pem")
	require.NoError(t, os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600))

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kfake"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, caFile
}
