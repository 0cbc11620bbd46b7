package testsvc

import (
	"os"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
)

// EnvKafkaBrokers names the Kafka brokers (comma-separated host:port) the
// tests use.
const EnvKafkaBrokers = "LLMQ_TEST_KAFKA_BROKERS"

// KafkaBrokers returns the brokers from LLMQ_TEST_KAFKA_BROKERS, else starts
// franz-go's in-process kfake cluster (it speaks the real wire protocol) for
// this test and closes it in t.Cleanup. Tests isolate their topics with
// KafkaPrefix.
func KafkaBrokers(t testing.TB) []string {
	t.Helper()
	if v := os.Getenv(EnvKafkaBrokers); v != "" {
		var out []string
		for _, b := range strings.Split(v, ",") {
			if b = strings.TrimSpace(b); b != "" {
				out = append(out, b)
			}
		}
		return out
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatalf("start in-process kfake cluster (or set %s): %v", EnvKafkaBrokers, err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// KafkaInProcess reports whether KafkaBrokers starts kfake in the test
// binary (LLMQ_TEST_KAFKA_BROKERS unset): the broker then takes its CPU
// from the test's own process, under -race too.
func KafkaInProcess() bool { return os.Getenv(EnvKafkaBrokers) == "" }

// KafkaPrefix returns a topic and group prefix unique to this test.
func KafkaPrefix(t testing.TB) string { return uniquePrefix(t) }
