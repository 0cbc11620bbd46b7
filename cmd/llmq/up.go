package main

import (
	"context"
	_ "embed"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/launch"
	"github.com/llmq/llmq/internal/localpg"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/telemetry"
)

//go:embed up.yaml
var upDefaults []byte

// runUp starts the whole pipeline in one process and blocks until ctx ends.
func runUp(ctx context.Context, args []string, env func(string) (string, bool), stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("llmq up", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "YAML config file (default $LLMQ_CONFIG, else built-in defaults)")
	dataDir := fs.String("data", filepath.Join(os.TempDir(), "llmq-up"), "directory for a throwaway Postgres when none answers")
	consumers := fs.Int("consumers", 2, "consumer workers to run")
	verbose := fs.Bool("v", false, "log every component's JSON lines to stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *path == "" {
		*path, _ = env("LLMQ_CONFIG")
	}
	cfg, err := loadUpConfig(*path, env)
	if err != nil {
		return err
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()

	// Postgres: configured, else local, else a throwaway server.
	pg, err := localpg.Find(ctx, cfg.PostgresURL, *dataDir, logWriter(stderr, *verbose))
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() { _ = pg.Stop() })
	cfg.PostgresURL = pg.URL

	// Broker: the configured one when LLMQ_BROKER names it, else in-process Kafka.
	brokerNote := cfg.Broker
	if _, set := env("LLMQ_BROKER"); !set && !fileSetsBroker(*path) {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
		if err != nil {
			return fmt.Errorf("start in-process Kafka: %w", err)
		}
		cleanups = append(cleanups, cluster.Close)
		cfg.Broker, cfg.KafkaBrokers = "kafka", cluster.ListenAddrs()
		brokerNote = "in-process Kafka (kfake) at " + strings.Join(cfg.KafkaBrokers, ",")
	}

	// Provider: a real one when both URL and key are given, else llmsim.
	providerNote := cfg.Provider.BaseURL
	if cfg.Provider.BaseURL == "" || cfg.Provider.APIKey == "" {
		simURL, stopSim, err := startSim(cfg)
		if err != nil {
			return err
		}
		cleanups = append(cleanups, stopSim)
		cfg.Provider.BaseURL = simURL
		providerNote = "llmsim at " + simURL
	}

	// One trace provider for the processes of `llmq up`, named llmq
	// unless OTEL_SERVICE_NAME says otherwise.
	tp, stopTracing, err := telemetry.FromEnv(ctx, "llmq", env)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, stopTracing)
	var wg sync.WaitGroup
	errs := make(chan error, *consumers+1)
	apiReady := make(chan string, 1)
	wg.Go(func() {
		errs <- launch.Producer(ctx, cfg, launch.Options{Logger: log.With("component", "producer"), TracerProvider: tp, Ready: func(a string) { apiReady <- a }})
	})
	metricsAddrs := make(chan string, *consumers)
	for i := 1; i <= *consumers; i++ {
		c := cfg
		// Unique per process: two `llmq up` on one Postgres must not share a
		// replica's quota lease or job claims.
		c.Worker.ID = fmt.Sprintf("up-%d-consumer-%d", os.Getpid(), i)
		c.MetricsAddr = nthAddr(cfg.MetricsAddr, i-1)
		wg.Go(func() {
			errs <- launch.Consumer(ctx, c, launch.Options{Logger: log.With("component", c.Worker.ID), TracerProvider: tp, Ready: func(a string) { metricsAddrs <- a }})
		})
	}

	var apiAddr string
	select {
	case apiAddr = <-apiReady:
	case err := <-errs:
		cancel()
		wg.Wait()
		return err
	case <-ctx.Done():
		wg.Wait()
		return nil
	}
	var metrics []string
	for range *consumers {
		select {
		case a := <-metricsAddrs:
			metrics = append(metrics, "http://"+a+"/metrics")
		case err := <-errs:
			cancel()
			wg.Wait()
			return err
		}
	}
	printBanner(stdout, apiAddr, pg, brokerNote, providerNote, metrics, len(cfg.APIKeys) > 0)

	var firstErr error
	select {
	case <-ctx.Done():
	case firstErr = <-errs:
		cancel()
	}
	wg.Wait()
	fmt.Fprintln(stdout, "llmq up: stopped")
	return firstErr
}

// loadUpConfig layers: built-in defaults, then the file (if any), then the
// environment.
func loadUpConfig(path string, env func(string) (string, bool)) (config.Config, error) {
	if path != "" {
		return config.Load(path, env)
	}
	return config.Parse(upDefaults, env)
}

func fileSetsBroker(path string) bool {
	if path == "" {
		return false
	}
	data, err := os.ReadFile(path)
	return err == nil && strings.Contains(string(data), "broker:")
}

// startSim serves llmsim on loopback with the configured models' limits.
func startSim(cfg config.Config) (string, func(), error) {
	sc := sim.DefaultConfig()
	for name, m := range cfg.Models {
		mc := sc.Models[name]
		mc.RPM, mc.TPM, mc.RPS, mc.TPS = int64(m.RPM), int64(m.TPM), int64(m.RPS), int64(m.TPS)
		sc.Models[name] = mc
	}
	s, err := sim.New(sc)
	if err != nil {
		return "", nil, fmt.Errorf("llmsim: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	hs := &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go hs.Serve(ln)
	stop := func() {
		s.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
	}
	return "http://" + ln.Addr().String() + "/compatible-mode/v1", stop, nil
}

// nthAddr returns addr with its port moved up by n (port 0 stays 0).
func nthAddr(addr string, n int) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || n == 0 {
		return addr
	}
	p, err := strconv.Atoi(port)
	if err != nil || p == 0 {
		return addr
	}
	return net.JoinHostPort(host, strconv.Itoa(p+n))
}

func logWriter(stderr io.Writer, verbose bool) io.Writer {
	if verbose {
		return stderr
	}
	return io.Discard
}

func printBanner(w io.Writer, apiAddr string, pg *localpg.Server, broker, provider string, metrics []string, auth bool) {
	base := "http://" + apiAddr
	authHeader := ""
	if auth {
		authHeader = ` -H "Authorization: Bearer $LLMQ_KEY"`
	}
	fmt.Fprintf(w, `llmq up: the pipeline is running
  API        %s
  console    %s/ui/
  status     %s/v1/status
  postgres   %s (%s)
  broker     %s
  provider   %s
  consumers  %s

Submit a job and poll it:
  curl -s -X POST %s/v1/jobs%s -H 'Content-Type: application/json' \
    -d '{"id":"hello-1","model":"qwen-plus","request":{"messages":[{"role":"user","content":"Hello"}],"max_tokens":64}}'
  curl -s %s/v1/jobs/hello-1%s

Ctrl-C stops everything.
`, base, base, base, redactURL(pg.URL), pg.Source, broker, provider, strings.Join(metrics, " "), base, authHeader, base, authHeader)
}

// redactURL hides a password in a connection URL.
func redactURL(u string) string {
	at := strings.LastIndex(u, "@")
	scheme := strings.Index(u, "://")
	if at < 0 || scheme < 0 {
		return u
	}
	creds := u[scheme+3 : at]
	if i := strings.Index(creds, ":"); i >= 0 {
		return u[:scheme+3] + creds[:i] + ":***" + u[at:]
	}
	return u
}
