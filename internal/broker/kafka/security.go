package kafka

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// TLSConfig builds the client TLS configuration from PEM files: caFile
// (empty: the system roots) verifies the brokers, certFile and keyFile
// (both or neither) are the client certificate for mutual TLS. Errors name
// the file, never its content.
func TLSConfig(caFile, certFile, keyFile string, insecureSkipVerify bool) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: insecureSkipVerify} //nolint:gosec // the operator's explicit choice
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("kafka tls: read ca file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kafka tls: ca file %s holds no PEM certificate", caFile)
		}
		c.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("kafka tls: cert file and key file go together")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("kafka tls: load client certificate %s: %w", certFile, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// SASLMechanisms are the mechanism names SASL accepts.
var SASLMechanisms = []string{"plain", "scram-sha-256", "scram-sha-512"}

// SASL returns the mechanism named (case-insensitive: plain, scram-sha-256,
// scram-sha-512) for username and password.
func SASL(mechanism, username, password string) (sasl.Mechanism, error) {
	switch strings.ToLower(mechanism) {
	case "plain":
		return plain.Mechanism{Username: username, Password: password}, nil
	case "scram-sha-256":
		return scramMechanism(scram.SHA256, username, password)
	case "scram-sha-512":
		return scramMechanism(scram.SHA512, username, password)
	default:
		return nil, fmt.Errorf("kafka sasl: unknown mechanism %q (want one of %s)", mechanism, strings.Join(SASLMechanisms, ", "))
	}
}

func scramMechanism(algo scram.Algorithm, username, password string) (sasl.Mechanism, error) {
	m, err := scram.Mechanism(algo, username, password)
	if err != nil {
		// scram's errors concern the username's or password's encoding;
		// say which mechanism failed, not what was given.
		return nil, fmt.Errorf("kafka sasl: %s: credentials cannot be prepared", algo.Name())
	}
	return m, nil
}

// newTransport is the transport of a writer or client: its own, so Close
// can drop its connections, with the configured TLS and SASL.
func newTransport(cfg Config) *kafkago.Transport {
	return &kafkago.Transport{TLS: cfg.TLS, SASL: cfg.SASL}
}

// newDialer is the dialer of a reader, with the configured TLS and SASL.
func newDialer(cfg Config) *kafkago.Dialer {
	return &kafkago.Dialer{Timeout: 10 * time.Second, DualStack: true, TLS: cfg.TLS, SASLMechanism: cfg.SASL}
}
