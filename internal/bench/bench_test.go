package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/leakcheck"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/testsvc"
)

func TestMain(m *testing.M) { leakcheck.Main(m, leakcheck.LateCleanup()...) }

// tinyScenario is small enough to finish in a few seconds for every
// strategy: generous limits, instant-ish model, 40 jobs.
func tinyScenario() Scenario {
	return Scenario{
		Name: "tiny", Description: "CI: 40 jobs, RPM 6000, TPM 1M, a little latency",
		RPM: 6000, TPM: 1_000_000,
		Latency:    sim.LatencyConfig{TTFT: sim.Duration(5 * time.Millisecond), TPT: sim.Duration(50 * time.Microsecond)},
		Output:     sim.OutputMix{Short: 20, Long: 200, LongShare: 0.3},
		InputChars: 120, MaxTokens: 256,
		Phases:   []Phase{{At: 0, Jobs: 25}, {At: 500 * time.Millisecond, Jobs: 15}},
		Duration: 90 * time.Second, Concurrency: 8, Warmup: -1, StopWhenDone: true,
	}
}

// TestSuiteEndToEnd runs every strategy through a tiny scenario on the real
// consumer path and checks what cannot depend on timing: every job reaches
// a terminal state, none succeeds twice, the simulator saw no overrun, and
// the JSON report and the PNG chart are written and parse.
func TestSuiteEndToEnd(t *testing.T) {
	server := testsvc.PostgresEmptyURL(t) // a database to connect to; each run creates its own
	out := t.TempDir()
	var stdout bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := RunSuite(ctx, Options{Env: Env{PostgresURL: server, Seed: 7}, Scenarios: []Scenario{tinyScenario()},
		Strategies: Strategies(), Out: out, Stdout: &stdout})
	require.NoError(t, err)
	t.Log("\n" + stdout.String())

	require.Len(t, rep.Scenarios, 1)
	runs := rep.Scenarios[0].Runs
	require.Len(t, runs, len(Strategies()))
	for _, r := range runs {
		require.Equal(t, 40, r.Jobs, r.Strategy)
		require.Zero(t, r.Unfinished, "%s: every job reaches a terminal state", r.Strategy)
		require.Equal(t, 40, r.Succeeded+r.Failed+r.Dead, r.Strategy)
		require.Zero(t, r.DuplicateSuccesses, "%s: no job succeeds twice", r.Strategy)
		require.Zero(t, r.Overruns, "%s: simulator referee", r.Strategy)
		require.GreaterOrEqual(t, r.Calls, int64(r.Succeeded), r.Strategy)
	}

	b, err := os.ReadFile(filepath.Join(out, "results.json"))
	require.NoError(t, err)
	var back Report
	require.NoError(t, json.Unmarshal(b, &back))
	require.Len(t, back.Scenarios, 1)
	require.Len(t, back.Scenarios[0].Runs, len(Strategies()))
	require.Equal(t, "tiny", back.Scenarios[0].Scenario.Name)

	f, err := os.Open(filepath.Join(out, "tiny.png"))
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	require.Greater(t, img.Bounds().Dx(), 100)
	require.Contains(t, stdout.String(), "| auto")
}

func TestBasicRetryable(t *testing.T) {
	require.True(t, basicRetryable(context.DeadlineExceeded))
	require.False(t, basicRetryable(context.Canceled))
}

func TestJobIDOf(t *testing.T) {
	body := jobBody("p0-000042", tinyScenario(), 6)
	var j struct {
		Request json.RawMessage `json:"request"`
	}
	require.NoError(t, json.Unmarshal(body, &j))
	require.Equal(t, "p0-000042", jobIDOf(j.Request))
	require.Empty(t, jobIDOf([]byte(`{"messages":[]}`)))
}

func TestSelect(t *testing.T) {
	all := Scenarios()
	for _, s := range all {
		require.NoError(t, s.Validate(), s.Name)
	}
	got, err := SelectScenarios(all, "mixed,halving")
	require.NoError(t, err)
	require.Equal(t, "mixed", got[0].Name)
	require.Equal(t, "halving", got[1].Name)
	_, err = SelectScenarios(all, "nope")
	require.Error(t, err)
	st, err := ParseStrategies("auto,retry")
	require.NoError(t, err)
	require.Len(t, st, 2)
	_, err = ParseStrategies("bogus")
	require.Error(t, err)
}

// TestServerQueueIsDeployed: auto runs the suite with the wait_timeout the
// deployment configures, or the bench would not measure auto as deployed.
func TestServerQueueIsDeployed(t *testing.T) {
	cfg, err := config.Load("../../deploy/llmq.yaml", func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Provider.WaitTimeout != DeployedServerQueue {
		t.Fatalf("deploy/llmq.yaml provider.wait_timeout is %v, the bench runs auto with %v", cfg.Provider.WaitTimeout, DeployedServerQueue)
	}
	for _, sc := range Scenarios() {
		if sc.ServerQueue != DeployedServerQueue {
			t.Errorf("scenario %s: auto's server queue %v, want %v", sc.Name, sc.ServerQueue, DeployedServerQueue)
		}
	}
}

// TestRealBrokers runs auto through the tiny scenario on RabbitMQ (a vhost
// of the run's own) and Kafka (topics under a prefix of the run's own): half the jobs go raw onto the intake and half through the producer
// API, and every one of them reaches a terminal state exactly once.
func TestRealBrokers(t *testing.T) {
	server := testsvc.PostgresEmptyURL(t)
	for _, b := range []string{BrokerRabbitMQ, BrokerKafka} {
		t.Run(b, func(t *testing.T) {
			env := Env{PostgresURL: server, Seed: 7, Broker: b}
			switch b {
			case BrokerRabbitMQ:
				env.AMQPURL = testsvc.AMQPURL(t)
			case BrokerKafka:
				env.KafkaBrokers = testsvc.KafkaBrokers(t) // the run isolates itself under a prefix
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			r, err := Run(ctx, env, tinyScenario(), "auto")
			require.NoError(t, err)
			require.Equal(t, b, r.Broker)
			require.Equal(t, 40, r.Jobs)
			require.Equal(t, 20, r.ViaHTTP, "half the jobs over the producer API")
			require.Zero(t, r.Unfinished, "every job reaches a terminal state")
			require.Equal(t, 40, r.Succeeded+r.Failed+r.Dead)
			require.Zero(t, r.DuplicateSuccesses)
			require.Zero(t, r.Overruns)
		})
	}
}

func TestUnknownBroker(t *testing.T) {
	_, err := Run(context.Background(), Env{PostgresURL: "postgres://127.0.0.1:1/x", Broker: "nats"}, tinyScenario(), "auto")
	require.ErrorContains(t, err, `unknown broker "nats"`)
}
