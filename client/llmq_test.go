package client_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/launch"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/testsvc"
)

// teardown runs what undoes a start, last first.
type teardown []func() error

func (td *teardown) add(f func() error) { *td = append(*td, f) }

func (td teardown) run() error {
	var errs []error
	for i := len(td) - 1; i >= 0; i-- {
		errs = append(errs, td[i]())
	}
	return errors.Join(errs...)
}

// cleanup hands a test's teardown to t.Cleanup.
func cleanup(t *testing.T) *teardown {
	td := &teardown{}
	t.Cleanup(func() {
		if err := td.run(); err != nil {
			t.Error(err)
		}
	})
	return td
}

func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// newDatabase creates an empty database on the server of
// LLMQ_TEST_POSTGRES_URL (llmq migrates it when it starts), dropped at
// teardown.
func newDatabase(ctx context.Context, td *teardown) (string, error) {
	server := os.Getenv(testsvc.EnvPostgresURL)
	if server == "" {
		return "", fmt.Errorf("no Postgres: set %s (e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable)", testsvc.EnvPostgresURL)
	}
	u, err := url.Parse(server)
	if err != nil {
		return "", fmt.Errorf("%s: %w", testsvc.EnvPostgresURL, err)
	}
	name := randomName("llmq_client_")
	run := func(ctx context.Context, sql string) error {
		conn, err := pgx.Connect(ctx, server)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := run(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("create database: %w", err)
	}
	td.add(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return run(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	u.Path, u.RawPath = "/"+name, ""
	return u.String(), nil
}

// newVhost creates a vhost of its own on the RabbitMQ of
// LLMQ_TEST_AMQP_URL with rabbitmqctl (llmq's names on the broker are
// fixed), deleted at teardown.
func newVhost(td *teardown) (string, error) {
	base := os.Getenv(testsvc.EnvAMQPURL)
	if base == "" {
		return "", fmt.Errorf("no RabbitMQ: set %s (e.g. amqp://guest:guest@127.0.0.1:5672/)", testsvc.EnvAMQPURL)
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("%s: %w", testsvc.EnvAMQPURL, err)
	}
	user := u.User.Username()
	if user == "" {
		user = "guest"
	}
	vhost := randomName("llmq-client-")
	ctl := func(args ...string) error {
		if out, err := exec.Command("rabbitmqctl", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := ctl("add_vhost", vhost); err != nil {
		return "", fmt.Errorf("a vhost of its own needs rabbitmqctl next to the broker: %w", err)
	}
	td.add(func() error { return ctl("delete_vhost", vhost) })
	if err := ctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*"); err != nil {
		return "", err
	}
	u.Path, u.RawPath = "/"+vhost, ""
	return u.String(), nil
}

// llmqConfig is the configuration of a test deployment; extra is YAML
// added at the top level.
func llmqConfig(pgURL, broker, amqpURL string, kafkaBrokers []string, extra string) (config.Config, error) {
	yaml := `
broker: ` + broker + `
http_addr: 127.0.0.1:0
metrics_addr: 127.0.0.1:0
api_keys: {` + apiKey + `: support}
provider: {base_url: "http://llmsim.test/v1", api_key: sk-test, timeout: 10s}
models:
  qwen-plus: {rpm: 60000, tpm: 100000000, price: {input_per_million: 0.8, output_per_million: 2}}
worker: {lease: 5s, retry_base: 50ms, retry_max: 500ms, shutdown_grace: 5s}
` + extra
	env := map[string]string{
		"LLMQ_POSTGRES_URL":  pgURL,
		"LLMQ_AMQP_URL":      amqpURL,
		"LLMQ_KAFKA_BROKERS": strings.Join(kafkaBrokers, ","),
	}
	return config.Parse([]byte(yaml), func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok && v != ""
	})
}

// startLLMQ runs llmq's producer API and, when withConsumer, a consumer
// calling an in-process llmsim, until teardown. It returns the API's URL
// once both serve.
func startLLMQ(ctx context.Context, td *teardown, cfg config.Config, withConsumer bool) (string, error) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	apiReady, consumerReady := make(chan string, 1), make(chan string, 1)
	wg.Go(func() {
		errs <- launch.Producer(ctx, cfg, launch.Options{Ready: func(a string) { apiReady <- a }})
	})
	var llmsim *sim.Simulator
	if withConsumer {
		var err error
		llmsim, err = sim.New(sim.Config{
			Latency: sim.LatencyConfig{TTFT: sim.Duration(5 * time.Millisecond)},
			Models:  map[string]sim.ModelConfig{"qwen-plus": {}},
		})
		if err != nil {
			cancel()
			return "", err
		}
		ccfg := cfg
		ccfg.Worker.ID = randomName("client-test-")
		wg.Go(func() {
			errs <- launch.Consumer(ctx, ccfg, launch.Options{
				ProviderTransport: llmsim.Transport(), Ready: func(a string) { consumerReady <- a },
			})
		})
	} else {
		consumerReady <- ""
	}
	td.add(func() error {
		cancel()
		wg.Wait()
		if llmsim != nil {
			llmsim.Close()
		}
		close(errs)
		var all []error
		for err := range errs {
			if !errors.Is(err, context.Canceled) {
				all = append(all, err)
			}
		}
		return errors.Join(all...)
	})
	var api string
	timeout := time.After(time.Minute)
	for range 2 {
		select {
		case api = <-apiReady:
		case <-consumerReady:
		case err := <-errs:
			if err == nil {
				err = errors.New("stopped before it served")
			}
			return "", err
		case <-timeout:
			return "", errors.New("not serving after a minute")
		}
	}
	return "http://" + api, nil
}
