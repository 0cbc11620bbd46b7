package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestKafkaDefaultsAndEnv(t *testing.T) {
	c, err := Parse(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Kafka.Partitions != 3 || c.Kafka.ReplicationFactor != 1 || c.Kafka.MinInsyncReplicas != 0 {
		t.Fatalf("defaults: %+v", c.Kafka)
	}
	c, err = Parse(nil, envMap(map[string]string{
		"LLMQ_KAFKA_TLS_ENABLED": "true", "LLMQ_KAFKA_TLS_CA_FILE": "/ca.pem",
		"LLMQ_KAFKA_SASL_MECHANISM": "scram-sha-512", "LLMQ_KAFKA_SASL_USERNAME": "llmq",
		"LLMQ_KAFKA_SASL_PASSWORD": "pw-from-env", "LLMQ_KAFKA_REPLICATION_FACTOR": "3",
		"LLMQ_KAFKA_MIN_INSYNC_REPLICAS": "2", "LLMQ_KAFKA_PARTITIONS": "12",
	}))
	if err != nil {
		t.Fatal(err)
	}
	k := c.Kafka
	if !k.TLS.Enabled || k.TLS.CAFile != "/ca.pem" || k.SASL.Mechanism != "scram-sha-512" || k.SASL.Username != "llmq" ||
		k.SASL.Password.Reveal() != "pw-from-env" || k.ReplicationFactor != 3 || k.MinInsyncReplicas != 2 || k.Partitions != 12 {
		t.Fatalf("env not applied: %+v", k)
	}
}

func TestKafkaValidation(t *testing.T) {
	for _, tc := range []struct{ yaml, key string }{
		{"kafka:\n  replication_factor: 2\n  min_insync_replicas: 3\n", "kafka.min_insync_replicas"},
		{"kafka:\n  partitions: -1\n", "kafka.partitions"},
		{"kafka:\n  sasl:\n    mechanism: gssapi\n    username: u\n    password: p\n", "kafka.sasl.mechanism"},
		{"kafka:\n  sasl:\n    mechanism: plain\n    password: p\n", "kafka.sasl.username"},
		{"kafka:\n  sasl:\n    mechanism: plain\n    username: u\n", "kafka.sasl.password"},
		{"kafka:\n  sasl:\n    username: u\n", "kafka.sasl.mechanism"},
		{"kafka:\n  tls:\n    ca_file: /ca.pem\n", "kafka.tls.enabled"},
		{"kafka:\n  tls:\n    enabled: true\n    cert_file: /c.pem\n", "kafka.tls.cert_file"},
	} {
		_, err := Parse([]byte(tc.yaml), nil)
		if err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%q: got %v, want an error naming %s", tc.yaml, err, tc.key)
		}
	}
}

// The SASL password is read from its file and never printed.
func TestKafkaPasswordFile(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("kafka-secret-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "llmq.yaml")
	yaml := "kafka:\n  sasl:\n    mechanism: plain\n    username: llmq\n    password_file: " + pw + "\n"
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(cfgPath, envMap(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Kafka.SASL.Password.Reveal() != "kafka-secret-from-file" {
		t.Fatalf("password %q", c.Kafka.SASL.Password.Reveal())
	}
	if s := strings.Join([]string{c.Kafka.SASL.Password.String(), sprintAll(c)}, " "); strings.Contains(s, "kafka-secret-from-file") {
		t.Fatalf("password printed: %s", s)
	}
}

// Keys shorter than MinKeyLength are refused naming the tenant (or the
// admin key's position), never the key; tenant names may not hold a dot.
func TestKeyAndTenantValidation(t *testing.T) {
	for _, tc := range []struct{ yaml, want, secret string }{
		{"api_keys:\n  short-key-17chars: acme\n", `api_keys: the key of tenant "acme" is shorter than 20`, "short-key-17chars"},
		{"admin_keys: [admin-key-0123456789ab, tiny-admin]\n", "admin_keys: admin key #2 is shorter than 20", "tiny-admin"},
		{"api_keys:\n  key-acme-0123456789ab: acme.eu\n", `tenant "acme.eu"`, "key-acme-0123456789ab"},
		{"tenants:\n  acme.eu: {weight: 2}\n", "tenants.acme.eu", ""},
	} {
		_, err := Parse([]byte(tc.yaml), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.yaml, err, tc.want)
			continue
		}
		if tc.secret != "" && strings.Contains(err.Error(), tc.secret) {
			t.Errorf("%q: the error names the key: %v", tc.yaml, err)
		}
	}
	if _, err := Parse([]byte("api_keys:\n  key-acme-0123456789ab: acme\nadmin_keys: [admin-key-0123456789ab]\n"), nil); err != nil {
		t.Fatalf("20-character keys refused: %v", err)
	}
}

// sprintAll is every way a config is commonly printed.
func sprintAll(c Config) string {
	return fmt.Sprintf("%v %+v %#v", c, c, c)
}
