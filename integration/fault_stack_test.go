package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/kafka"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/testsvc"
)

// The fault suite (fault_*_test.go) runs `consumer run` (and `producer
// serve`) as subprocesses on real Postgres and RabbitMQ (a vhost of its
// own) or the Kafka protocol (kfake), with an in-process llmsim behind a
// wrapper that counts provider calls per job. Every scenario ends with a
// ledger: each job it published is terminal in the state it expects
// (lost = 0), its result was written at most once (a trigger on jobs
// counts every write of a result: duplicated results = 0) and the
// provider saw it at most attempts + 1 times. The ledger's line is logged
// with the prefix "RELIABILITY |" for README's table.

// faultProviderKey is the provider key of every fault scenario; the
// security scenario greps for it everywhere.
const faultProviderKey = "sk-fault-SECRET-4c1d9e"

// faultJobRE finds a job's ID in a request body: every fault job's
// content carries "[job:<id>]".
var faultJobRE = regexp.MustCompile(`\[job:([A-Za-z0-9._:-]+)\]`)

// faultOptions describe one scenario's stack.
type faultOptions struct {
	// Broker is "rabbitmq" (default) or "kafka".
	Broker string
	// Sim configures the simulator (APIKeys and Models default to the
	// fault key and qwen-plus).
	Sim sim.Config
	// Wrap, when set, sits between the call counter and the simulator (a
	// hostile or faulty provider).
	Wrap func(http.Handler) http.Handler
	// YAML is appended to the base configuration.
	YAML string
	// ProviderKey is the provider API key (default faultProviderKey).
	ProviderKey string
	// Model is qwen-plus's YAML settings as a flow map (default "{}").
	Model string
}

// faultStack is one scenario's services, config and provider.
type faultStack struct {
	t       *testing.T
	pgURL   string
	amqpURL string
	kafka   []string
	pool    *pgxpool.Pool
	cfgPath string
	env     []string
	llm     *httptest.Server
	sim     *sim.Simulator
	key     string // the provider API key

	mu    sync.Mutex
	calls map[string]int // provider calls per job ID
}

func newFaultStack(t *testing.T, o faultOptions) *faultStack {
	t.Helper()
	if o.Broker == "" {
		o.Broker = "rabbitmq"
	}
	s := &faultStack{t: t, calls: map[string]int{}, pgURL: testsvc.PostgresURL(t)}
	switch o.Broker {
	case "kafka":
		s.kafka = testsvc.KafkaBrokers(t)
	default:
		s.amqpURL = testVhost(t, testsvc.AMQPURL(t))
	}
	pool, err := pgxpool.New(context.Background(), s.pgURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s.pool = pool
	s.installResultAudit()

	if o.Model == "" {
		o.Model = "{}"
	}
	if o.ProviderKey == "" {
		o.ProviderKey = faultProviderKey
	}
	s.key = o.ProviderKey
	if len(o.Sim.APIKeys) == 0 {
		o.Sim.APIKeys = []string{o.ProviderKey}
	}
	if len(o.Sim.Models) == 0 {
		o.Sim.Models = map[string]sim.ModelConfig{"qwen-plus": {}}
	}
	simulator, err := sim.New(o.Sim)
	require.NoError(t, err)
	s.sim = simulator
	var h http.Handler = simulator
	if o.Wrap != nil {
		h = o.Wrap(h)
	}
	s.llm = httptest.NewServer(s.count(h))
	t.Cleanup(func() { simulator.Close(); s.llm.CloseClientConnections(); s.llm.Close() })

	s.cfgPath = filepath.Join(t.TempDir(), "llmq.yaml")
	require.NoError(t, os.WriteFile(s.cfgPath, []byte(`
broker: `+o.Broker+`
http_addr: 127.0.0.1:0
metrics_addr: 127.0.0.1:0
provider:
  timeout: 10s
worker:
  lease: 3s
  retry_base: 50ms
  retry_max: 400ms
  shutdown_grace: 5s
  prefetch: 50
models:
  qwen-plus: `+o.Model+`
`+o.YAML), 0o600))
	s.env = append(os.Environ(),
		"LLMQ_CONFIG="+s.cfgPath,
		"LLMQ_POSTGRES_URL="+s.pgURL,
		"LLMQ_PROVIDER_BASE_URL="+s.llm.URL+"/v1",
		"LLMQ_PROVIDER_API_KEY="+o.ProviderKey,
	)
	if s.amqpURL != "" {
		s.env = append(s.env, "LLMQ_AMQP_URL="+s.amqpURL)
	} else {
		s.env = append(s.env, "LLMQ_KAFKA_BROKERS="+strings.Join(s.kafka, ","))
	}
	return s
}

// installResultAudit adds a trigger to this test's database that records
// every write of a job's result, so a result written twice is seen even
// when the second write is byte-identical.
func (s *faultStack) installResultAudit() {
	_, err := s.pool.Exec(context.Background(), `
CREATE TABLE fault_result_writes (tenant text NOT NULL, id text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION fault_audit_result() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.response IS NOT NULL AND (TG_OP = 'INSERT' OR OLD.response IS NULL
     OR NEW.response IS DISTINCT FROM OLD.response OR NEW.completed_at IS DISTINCT FROM OLD.completed_at) THEN
    INSERT INTO fault_result_writes (tenant, id) VALUES (NEW.tenant, NEW.id);
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER fault_audit_result AFTER INSERT OR UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION fault_audit_result();`)
	require.NoError(s.t, err, "install the result-write audit trigger")
}

// count wraps the provider: every chat call is counted under the job ID
// its messages carry.
func (s *faultStack) count(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/chat/completions") && r.Body != nil {
			body, err := readAllLimited(r)
			if err == nil {
				if m := faultJobRE.FindSubmatch(body); m != nil {
					s.mu.Lock()
					s.calls[string(m[1])]++
					s.mu.Unlock()
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

func (s *faultStack) callsFor(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[id]
}

func (s *faultStack) totalCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.calls {
		n += c
	}
	return n
}

// consumer starts `consumer run` with extra environment.
func (s *faultStack) consumer(id string, extraEnv ...string) *proc {
	s.t.Helper()
	env := append(append(append([]string(nil), s.env...), "LLMQ_WORKER_ID="+id), extraEnv...)
	return startProc(s.t, buildCmd(s.t, "consumer"), env, "run")
}

// faultJob is a well-formed job message whose content names its ID.
func faultJob(id string, extra string) []byte {
	return []byte(fmt.Sprintf(`{"id":%q,"model":"qwen-plus","request":{"messages":[{"role":"user","content":"[job:%s] summarise the ticket"}],"max_tokens":32}%s}`, id, id, extra))
}

// publish puts raw messages on the normal intake of the stack's broker.
func (s *faultStack) publish(bodies map[string][]byte) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub := s.publisher(ctx)
	defer pub.Close()
	for key, body := range bodies {
		require.NoError(s.t, pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{Key: key, Body: body}))
	}
}

// publisher connects llmq's publisher to the stack's broker (the caller
// closes it).
func (s *faultStack) publisher(ctx context.Context) broker.Publisher {
	s.t.Helper()
	var pub broker.Publisher
	var err error
	if s.amqpURL != "" {
		pub, err = rabbitmq.NewPublisher(ctx, rabbitmq.Config{URL: s.amqpURL})
	} else {
		pub, err = kafka.NewPublisher(ctx, kafka.Config{Brokers: s.kafka})
	}
	require.NoError(s.t, err)
	return pub
}

// countWhere returns SELECT count(*) FROM jobs WHERE <cond>.
func (s *faultStack) countWhere(cond string) int {
	s.t.Helper()
	var n int
	require.NoError(s.t, s.pool.QueryRow(context.Background(), `SELECT count(*) FROM jobs WHERE `+cond).Scan(&n))
	return n
}

// waitTerminal waits (polling Postgres, up to 3 minutes) until at least
// want jobs are terminal; it fails early if one of the live processes
// exits.
func (s *faultStack) waitTerminal(want int, live ...*proc) {
	s.t.Helper()
	s.waitFor(fmt.Sprintf("%d terminal jobs", want), func() bool {
		return s.countWhere(`status IN ('succeeded','failed','dead','cancelled')`) >= want
	}, live...)
}

// waitFor polls cond every 50 ms for up to 3 minutes.
func (s *faultStack) waitFor(what string, cond func() bool, live ...*proc) {
	s.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			var tails []string
			for _, p := range live {
				tails = append(tails, p.out.tail(20))
			}
			s.t.Fatalf("timed out waiting for %s\n%s", what, strings.Join(tails, "\n---\n"))
		}
		for _, p := range live {
			select {
			case <-p.done:
				s.t.Fatalf("%s exited while waiting for %s: %v\n%s", p.name, what, p.err, p.out.tail(30))
			default:
			}
		}
		<-tick.C
	}
}

// stopAll SIGTERMs the processes and requires a clean exit.
func (s *faultStack) stopAll(ps ...*proc) {
	s.t.Helper()
	for _, p := range ps {
		select {
		case <-p.done:
			continue
		default:
		}
		require.NoError(s.t, p.cmd.Process.Signal(os.Interrupt))
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			s.t.Fatalf("%s did not stop on SIGINT\n%s", p.name, p.out.tail(20))
		}
		require.NoError(s.t, p.err, p.out.tail(20))
	}
}

// ledger is the end-of-scenario account of every published job.
type ledger struct {
	Jobs, Lost, DuplicateResults int
	ByStatus                     map[string]int
	Calls                        int
}

// settle checks every job of want (ID → expected final status) and logs
// the scenario's RELIABILITY line. A job is lost when it has no row or is
// not in its expected terminal status.
func (s *faultStack) settle(scenario string, want map[string]string, outcome string) ledger {
	s.t.Helper()
	ctx := context.Background()
	l := ledger{Jobs: len(want), ByStatus: map[string]int{}, Calls: s.totalCalls()}
	rows, err := s.pool.Query(ctx, `SELECT j.id, j.status, j.attempts,
		(SELECT count(*) FROM fault_result_writes w WHERE w.tenant = j.tenant AND w.id = j.id)
		FROM jobs j`)
	require.NoError(s.t, err)
	defer rows.Close()
	got := map[string]string{}
	for rows.Next() {
		var id, status string
		var attempts, writes int
		require.NoError(s.t, rows.Scan(&id, &status, &attempts, &writes))
		got[id] = status
		l.ByStatus[status]++
		if writes > 1 {
			l.DuplicateResults++
			s.t.Errorf("job %s: result written %d times", id, writes)
		}
		if status == "succeeded" && writes != 1 {
			s.t.Errorf("job %s succeeded with %d result writes", id, writes)
		}
		if c := s.callsFor(id); c > attempts+1 {
			s.t.Errorf("job %s: %d provider calls for %d attempts (at most attempts + 1)", id, c, attempts)
		}
	}
	require.NoError(s.t, rows.Err())
	for id, status := range want {
		if got[id] != status {
			l.Lost++
			s.t.Errorf("job %s: status %q, want %q", id, got[id], status)
		}
	}
	s.t.Logf("RELIABILITY | %s | %d | %d | %d | %s (statuses %v, %d provider calls)",
		scenario, l.Jobs, l.Lost, l.DuplicateResults, outcome, l.ByStatus, l.Calls)
	return l
}

// readAllLimited reads a request body (at most 1 MiB) and puts it back.
func readAllLimited(r *http.Request) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	r.Body = io.NopCloser(bytes.NewReader(data))
	return data, err
}

// jsonString quotes s as a JSON string.
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// faultAPIKeys are the producer API keys of the fault scenarios.
const faultAPIKeys = "LLMQ_API_KEYS=key-acme-sec-0123456789:acme,key-globex-sec-0123456789:globex"

// producer starts `producer serve` on the stack and returns it with its
// base URL.
func (s *faultStack) producer() (*proc, string) {
	s.t.Helper()
	p := startProc(s.t, buildCmd(s.t, "producer"), append(append([]string(nil), s.env...), faultAPIKeys), "serve")
	return p, "http://" + p.waitFor(s.t, regexp.MustCompile(`"msg":"serving producer API","addr":"([^"]+)"`))
}

// apiCall sends one request to the producer API with a bearer key ("" for
// none) and returns the status and body.
func apiCall(t *testing.T, base, method, path, apiKey string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, bytes.NewReader(body))
	require.NoError(t, err)
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, data
}
