package launch_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/launch"
	"github.com/llmq/llmq/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// kafka.sasl reaches the publisher and the inspector launch builds; a
// wrong password fails start without being printed.
func TestKafkaSettingsReachClients(t *testing.T) {
	const pass = "launch-password-0123"
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.Superuser("PLAIN", "llmq", pass))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	parse := func(password string) config.Config {
		cfg, err := config.Parse([]byte("broker: kafka\nkafka_brokers: ["+strings.Join(c.ListenAddrs(), ",")+
			"]\nkafka:\n  sasl: {mechanism: plain, username: llmq, password: "+password+"}\n"), nil)
		require.NoError(t, err)
		return cfg
	}

	pub, insp, err := launch.Publisher(ctx, parse(pass), log)
	require.NoError(t, err)
	_, err = insp.Depth(ctx, "normal")
	assert.NoError(t, err)
	require.NoError(t, pub.Close())
	if cl, ok := insp.(io.Closer); ok {
		require.NoError(t, cl.Close())
	}

	_, _, err = launch.Publisher(ctx, parse("wrong-password-0123"), log)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "wrong-password-0123")

	cfg := parse(pass)
	cfg.Kafka.TLS = config.KafkaTLS{Enabled: true, CAFile: "/nonexistent/ca.pem"}
	_, _, err = launch.Publisher(ctx, cfg, log)
	assert.ErrorContains(t, err, "kafka.tls")
}
