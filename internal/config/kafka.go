package config

import (
	"fmt"
	"os"
	"strings"
)

// Kafka configures how llmq's Kafka clients connect and the topics llmq
// creates (docs/design.md#configuration). Every client llmq makes
// (publisher, subscribers, inspector, topic creation) uses it.
type Kafka struct {
	TLS  KafkaTLS  `yaml:"tls"`
	SASL KafkaSASL `yaml:"sasl"`
	// Partitions of the topics llmq creates (default 3); an existing topic
	// with another count is used as it is, with a warning.
	Partitions int `yaml:"partitions"`
	// ReplicationFactor of the topics llmq creates (default 1); start fails
	// when an existing topic has fewer replicas.
	ReplicationFactor int `yaml:"replication_factor"`
	// MinInsyncReplicas, when set, is the min.insync.replicas of the topics
	// llmq creates: with acks=all, the copies a publish has when it returns.
	// Unset leaves the broker's default; it may not exceed ReplicationFactor.
	MinInsyncReplicas int `yaml:"min_insync_replicas"`
}

// KafkaTLS encrypts the connections to the brokers.
type KafkaTLS struct {
	Enabled bool `yaml:"enabled"`
	// CAFile (PEM) verifies the brokers; empty means the system roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile (PEM, both or neither) are the client
	// certificate for mutual TLS.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// InsecureSkipVerify skips verifying the brokers' certificates: for a
	// test cluster only.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// KafkaSASL authenticates llmq to the brokers.
type KafkaSASL struct {
	// Mechanism is "plain", "scram-sha-256" or "scram-sha-512"; empty: no SASL.
	Mechanism string `yaml:"mechanism"`
	Username  string `yaml:"username"`
	// Password is never logged, stored or echoed.
	Password Secret `yaml:"password"`
	// PasswordFile, when set, is read for the password (a mounted secret).
	PasswordFile string `yaml:"password_file"`
}

func (k *Kafka) withDefaults() {
	if k.Partitions == 0 {
		k.Partitions = 3
	}
	if k.ReplicationFactor == 0 {
		k.ReplicationFactor = 1
	}
}

// resolveKafkaSecrets reads the SASL password from its file.
func (c *Config) resolveKafkaSecrets() error {
	if c.Kafka.SASL.PasswordFile == "" {
		return nil
	}
	data, err := os.ReadFile(c.Kafka.SASL.PasswordFile)
	if err != nil {
		// The path is not secret; the content is never in the message.
		return fmt.Errorf("kafka.sasl.password_file: %w", err)
	}
	c.Kafka.SASL.Password = Secret(strings.TrimSpace(string(data)))
	return nil
}

var saslMechanisms = map[string]bool{"plain": true, "scram-sha-256": true, "scram-sha-512": true}

// validateKafka checks the Kafka settings, naming the key.
func (c Config) validateKafka() error {
	k := c.Kafka
	switch {
	case k.Partitions < 1:
		return badKey("kafka.partitions", "must be positive")
	case k.ReplicationFactor < 1:
		return badKey("kafka.replication_factor", "must be positive")
	case k.MinInsyncReplicas < 0:
		return badKey("kafka.min_insync_replicas", "must not be negative")
	case k.MinInsyncReplicas > k.ReplicationFactor:
		return badKey("kafka.min_insync_replicas", "%d exceeds kafka.replication_factor %d: no acks=all publish could succeed",
			k.MinInsyncReplicas, k.ReplicationFactor)
	}
	t := k.TLS
	if !t.Enabled && (t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.InsecureSkipVerify) {
		return badKey("kafka.tls.enabled", "must be true when other kafka.tls settings are set")
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return badKey("kafka.tls.cert_file", "cert_file and key_file go together")
	}
	s := k.SASL
	if s.Mechanism == "" {
		if s.Username != "" || s.Password != "" || s.PasswordFile != "" {
			return badKey("kafka.sasl.mechanism", "required when a username or password is set")
		}
		return nil
	}
	if !saslMechanisms[strings.ToLower(s.Mechanism)] {
		return badKey("kafka.sasl.mechanism", "must be plain, scram-sha-256 or scram-sha-512; got %q", s.Mechanism)
	}
	if s.Username == "" {
		return badKey("kafka.sasl.username", "required with kafka.sasl.mechanism")
	}
	if s.Password == "" && s.PasswordFile == "" {
		return badKey("kafka.sasl.password", "required with kafka.sasl.mechanism (or kafka.sasl.password_file)")
	}
	return nil
}
