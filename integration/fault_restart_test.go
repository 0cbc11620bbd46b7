package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/testsvc"
)

// envAllowRestart must be "1" for TestFaultServiceRestarts to run.
const envAllowRestart = "LLMQ_TEST_ALLOW_RESTART"

// TestFaultServiceRestarts RESTARTS THE MACHINE'S SHARED RabbitMQ AND
// Postgres. It runs only with LLMQ_TEST_ALLOW_RESTART=1 (.ci/run sets it),
// keeps both scenarios in this one function, one after the other, holds
// each outage for a couple of seconds and always restores the service in
// t.Cleanup. Its promises:
//
//   - rabbitmq: stopping RabbitMQ (stop_app) mid-run and starting it again
//     loses nothing: `producer serve` and `consumer run` reconnect by
//     themselves, submissions accepted after the restart are processed,
//     every job ends succeeded with one result write.
//   - postgres: restarting Postgres mid-run makes the consumer pause and
//     resume; since nothing is acked before its result is durable, every
//     job still ends succeeded with exactly one result write.
func TestFaultServiceRestarts(t *testing.T) {
	if os.Getenv(envAllowRestart) != "1" {
		t.Skipf("restarts the shared RabbitMQ and Postgres: set %s=1 to run", envAllowRestart)
	}
	t.Run("rabbitmq", faultRestartRabbitMQ)
	t.Run("postgres", faultRestartPostgres)
}

func faultRestartRabbitMQ(t *testing.T) {
	const n = 200
	ctl, err := exec.LookPath("rabbitmqctl")
	require.NoError(t, err, "restarting RabbitMQ needs rabbitmqctl")
	s := newFaultStack(t, faultOptions{
		Sim:   sim.Config{Latency: sim.LatencyConfig{TTFT: sim.Duration(30 * time.Millisecond)}},
		Model: "{max_concurrency: 4}",
	})
	producer, base := s.producer()
	consumer := s.consumer("restart-rmq")
	want := map[string]string{}
	submit := func(from, to int) {
		for i := from; i < to; i++ {
			id := fmt.Sprintf("rmq-%04d", i)
			want[id] = "succeeded"
			// A submission during reconnection may be refused (5xx/429):
			// the client retries, and the ID keeps it idempotent.
			s.waitFor("submission of "+id, func() bool {
				code, _ := apiCall(t, base, "POST", "/v1/jobs", "key-acme-sec-0123456789", faultJob(id, ""))
				return code == http.StatusAccepted || code == http.StatusOK
			}, producer)
		}
	}
	submit(0, n/2)
	s.waitFor("a quarter of the jobs", func() bool { return s.countWhere(`status = 'succeeded'`) >= n/4 }, consumer, producer)

	rabbit := func(args ...string) {
		out, err := exec.Command(ctl, args...).CombinedOutput()
		require.NoError(t, err, "rabbitmqctl %s: %s", strings.Join(args, " "), out)
	}
	t.Cleanup(func() { _ = exec.Command(ctl, "start_app").Run() })
	rabbit("stop_app")
	outage := time.Now()
	<-time.After(2 * time.Second) // the outage itself, not a wait for something
	startCtx, cancelStart := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancelStart()
	restartedDLX, err := testsvc.StartRabbitMQApp(startCtx)
	require.NoError(t, err)
	if restartedDLX {
		t.Log("RabbitMQ came back without its dead-letter supervisor; started it (see testsvc.StartRabbitMQApp)")
	}
	t.Logf("RabbitMQ was down for %s", time.Since(outage).Round(time.Millisecond))

	submit(n/2, n) // the producer must have reconnected
	s.waitTerminal(n, consumer, producer)
	s.stopAll(consumer, producer)
	l := s.settle("RabbitMQ stop_app/start_app mid-run", want, "producer and consumer reconnected; all succeeded")
	require.Zero(t, l.Lost)
	require.Zero(t, l.DuplicateResults)
}

func faultRestartPostgres(t *testing.T) {
	const n = 200
	pgctl, err := exec.LookPath("pg_ctlcluster")
	require.NoError(t, err, "restarting Postgres needs pg_ctlcluster")
	version, cluster := "15", "main"
	s := newFaultStack(t, faultOptions{
		Sim:   sim.Config{Latency: sim.LatencyConfig{TTFT: sim.Duration(30 * time.Millisecond)}},
		Model: "{max_concurrency: 4}",
	})
	bodies := map[string][]byte{}
	want := map[string]string{}
	for i := range n {
		id := fmt.Sprintf("pg-%04d", i)
		bodies[id] = faultJob(id, "")
		want[id] = "succeeded"
	}
	s.publish(bodies)
	consumer := s.consumer("restart-pg")
	s.waitFor("a quarter of the jobs", func() bool { return s.countWhere(`status = 'succeeded'`) >= n/4 }, consumer)

	pg := func(action string) error {
		out, err := exec.Command(pgctl, "--skip-systemctl-redirect", version, cluster, action).CombinedOutput()
		if err != nil {
			return fmt.Errorf("pg_ctlcluster %s: %w: %s", action, err, out)
		}
		return nil
	}
	t.Cleanup(func() { _ = pg("start") }) // "already running" is fine
	require.NoError(t, pg("stop"))
	outage := time.Now()
	<-time.After(2 * time.Second) // the outage itself, not a wait for something
	require.NoError(t, pg("start"))
	s.waitFor("Postgres to answer again", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return s.pool.Ping(ctx) == nil
	}, consumer)
	t.Logf("Postgres was down for %s", time.Since(outage).Round(time.Millisecond))

	s.waitTerminal(n, consumer)
	s.stopAll(consumer)
	l := s.settle("Postgres stop/start mid-run", want, "consumer paused and resumed; all succeeded")
	require.Zero(t, l.Lost)
	require.Zero(t, l.DuplicateResults)
}
