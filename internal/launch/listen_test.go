package launch

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
)

func TestConsumerBindsItsMetricsPortBeforeItDialsAnything(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	// Postgres and the broker point at a port nothing answers on: a consumer
	// that dialed them first would fail (or retry) there, not on its port.
	cfg, err := config.Parse([]byte(`
postgres_url: "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=5"
amqp_url: "amqp://guest:guest@127.0.0.1:1/"
metrics_addr: "`+taken.Addr().String()+`"
provider: {base_url: "http://127.0.0.1:1/v1"}
models:
  qwen-plus: {}
`), nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = Consumer(ctx, cfg, Options{})
	require.ErrorContains(t, err, "listen on "+taken.Addr().String())
}
