package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/testsvc"
)

// EnvAllowRestart allows tests to stop and start the machine's RabbitMQ.
const EnvAllowRestart = "LLMQ_TEST_ALLOW_RESTART"

// TestBrokerRestart stops and starts the broker's app while publishing and
// consuming: both resume by themselves and no message is lost.
func TestBrokerServiceRestart(t *testing.T) {
	if os.Getenv(EnvAllowRestart) != "1" {
		t.Skipf("stops the machine's RabbitMQ: set %s=1 to run", EnvAllowRestart)
	}
	cfg := testConfig(t)
	cfg.PublishTimeout = 90 * time.Second
	cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	pub := newPublisher(t, cfg)
	sub := newSubscriber(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	const total, before = 1500, 300
	var (
		mu       sync.Mutex
		received = map[string]int{}
		doubleAk error
		allIn    = make(chan struct{})
		midway   = make(chan struct{})
	)
	subCtx, stopSub := context.WithCancel(ctx)
	deliveries, err := sub.Subscribe(subCtx, job.PriorityNormal, 20)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // consumer: owned by this test, stopped by stopSub
		defer wg.Done()
		for d := range deliveries {
			err := d.Ack(ctx)
			mu.Lock()
			if errors.Is(err, broker.ErrSettled) {
				doubleAk = err
			}
			if err == nil { // an ack lost with its channel: the message comes back
				received[d.Message().Key]++
				switch len(received) {
				case before:
					close(midway)
				case total:
					close(allIn)
				}
			}
			mu.Unlock()
		}
	}()
	pubErr := make(chan error, 1)
	wg.Add(1)
	go func() { // publisher: 4 concurrent streams across the outage
		defer wg.Done()
		var pwg sync.WaitGroup
		for w := 0; w < 4; w++ {
			pwg.Add(1)
			go func() {
				defer pwg.Done()
				for i := w; i < total; i += 4 {
					m := broker.Message{Key: fmt.Sprintf("r-%05d", i), Body: []byte(fmt.Sprintf(`{"n":%d}`, i))}
					if err := pub.Publish(ctx, job.PriorityNormal, m); err != nil {
						select {
						case pubErr <- err:
						default:
						}
						return
					}
				}
			}()
		}
		pwg.Wait()
	}()

	select {
	case <-midway:
	case err := <-pubErr:
		t.Fatalf("publish before restart: %v", err)
	case <-ctx.Done():
		t.Fatal("no progress before restart")
	}
	// Always bring the broker back, even if the test fails.
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
		defer ccancel()
		if _, err := testsvc.StartRabbitMQApp(cctx); err != nil {
			t.Errorf("restart RabbitMQ in cleanup: %v", err)
		}
	})
	outage := time.Now()
	if err := testsvc.RabbitMQCtl(ctx, "stop_app"); err != nil {
		t.Fatal(err)
	}
	restartedDLX, err := testsvc.StartRabbitMQApp(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if restartedDLX {
		t.Log("RabbitMQ came back without its dead-letter supervisor; started it (see testsvc.StartRabbitMQApp)")
	}
	t.Logf("broker stopped and started in %v", time.Since(outage).Round(time.Millisecond))
	select {
	case <-allIn:
	case err := <-pubErr:
		t.Fatalf("publish across restart: %v", err)
	case <-ctx.Done():
		mu.Lock()
		n := len(received)
		mu.Unlock()
		t.Fatalf("only %d of %d messages received after restart", n, total)
	}
	t.Logf("all messages in %v after the stop", time.Since(outage).Round(time.Millisecond))
	stopSub()
	wg.Wait()
	select {
	case err := <-pubErr:
		t.Fatalf("publish: %v", err)
	default:
	}
	if doubleAk != nil {
		t.Fatalf("a delivery was settled twice: %v", doubleAk)
	}
	dups := 0
	for _, n := range received {
		dups += n - 1
	}
	t.Logf("%d messages, all received; %d duplicates (at least once across the restart)", total, dups)
	// The inspector works on the restarted broker too.
	if _, err := newInspector(t, cfg).Depth(ctx, job.PriorityNormal); err != nil {
		t.Fatalf("depth after restart: %v", err)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// TestDeadLetterSupervisorServiceRestart: a broker whose quorum queues'
// dead-letter supervisor is down (as a bad start leaves RabbitMQ 3.10) is
// given it back by testsvc.StartRabbitMQApp, whether rabbit_sup still holds
// the supervisor's child spec or not, and queues with at-least-once
// dead-lettering work again.
func TestDeadLetterSupervisorServiceRestart(t *testing.T) {
	if os.Getenv(EnvAllowRestart) != "1" {
		t.Skipf("stops the machine's RabbitMQ: set %s=1 to run", EnvAllowRestart)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
		defer ccancel()
		if _, err := testsvc.StartRabbitMQApp(cctx); err != nil {
			t.Errorf("restore RabbitMQ in cleanup: %v", err)
		}
	})
	for _, stop := range []string{
		`supervisor:terminate_child(rabbit_sup, rabbit_fifo_dlx_sup).`,
		`supervisor:terminate_child(rabbit_sup, rabbit_fifo_dlx_sup), supervisor:delete_child(rabbit_sup, rabbit_fifo_dlx_sup).`,
	} {
		require.NoError(t, testsvc.RabbitMQCtl(ctx, "eval", stop))
		restarted, err := testsvc.StartRabbitMQApp(ctx)
		require.NoError(t, err)
		assert.True(t, restarted, "after %s", stop)
		restarted, err = testsvc.StartRabbitMQApp(ctx)
		require.NoError(t, err)
		assert.False(t, restarted, "a running supervisor is left alone")

		// llmq's topology declares at-least-once dead-lettering queues,
		// which need the supervisor as they elect a leader.
		cfg := testConfig(t)
		pub, err := rabbitmq.NewPublisher(ctx, cfg)
		require.NoError(t, err, "after %s", stop)
		require.NoError(t, pub.Publish(ctx, job.PriorityNormal, broker.Message{Key: "dlx-ok", Body: []byte(`{}`)}), "after %s", stop)
		require.NoError(t, pub.Close())
	}
}
