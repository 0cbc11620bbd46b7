package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/testsvc"
)

// Quota of the shared model in TestQuotaReplicas: TPM binds (≈ 220 tokens a
// job at this output mix → ≈ 680 jobs/min, below the RPM).
const (
	quotaModel = "qwen-plus"
	quotaRPM   = 1200
	quotaTPM   = 150_000
	quotaTTL   = 3 * time.Second
)

// TestQuotaReplicas runs three `consumer run` processes sharing one model's
// quota through Postgres (quota.shared) under a full RabbitMQ backlog,
// against one llmsim, and checks what docs/design.md#shared-quota asks of distributed rate
// limiting: together they stay inside RPM and TPM (no sliding-window
// overrun, ~no 429) and use nearly all of the binding limit; a replica
// killed with SIGKILL is absorbed by the others within 10 s; restarted, the
// shares rebalance.
func TestQuotaReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("about two and a half minutes of real time: not in -short")
	}
	bin := buildCmd(t, "consumer")
	pgURL := testsvc.PostgresURL(t)
	amqpURL := testVhost(t, testsvc.AMQPURL(t))

	simulator, simURL := serveSim(t, sim.Config{
		APIKeys: []string{"sk-quota-test"},
		Latency: sim.LatencyConfig{TTFT: sim.Duration(30 * time.Millisecond), TPT: sim.Duration(200 * time.Microsecond)},
		Output:  sim.OutputMix{Short: 30, Long: 600, LongShare: 0.3},
		Models:  map[string]sim.ModelConfig{quotaModel: {RPM: quotaRPM, TPM: quotaTPM}},
	})

	// A full backlog: more jobs than the quota lets through in the run.
	const jobs = 3000
	publishJobs(t, amqpURL, jobs)

	cfgPath := filepath.Join(t.TempDir(), "llmq.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(fmt.Sprintf(`
postgres_url: %q
broker: rabbitmq
amqp_url: %q
metrics_addr: 127.0.0.1:0
strategy: auto
provider:
  base_url: %q
  api_key: sk-quota-test
  timeout: 30s
models:
  %s:
    rpm: %d
    tpm: %d
    max_concurrency: 30
    warmup: 5s
worker:
  shutdown_grace: 5s
quota:
  shared: true
  lease_ttl: %s
  fallback_share: 0.25
`, pgURL, amqpURL, simURL+"/v1", quotaModel, quotaRPM, quotaTPM, quotaTTL)), 0o600))

	replicas := map[string]*consumerProc{}
	start := func(id string) {
		p := startConsumer(t, bin, cfgPath, id)
		replicas[id] = p
	}
	t0 := time.Now()
	for _, id := range []string{"r1", "r2", "r3"} {
		start(id)
	}
	defer func() {
		for _, p := range replicas {
			p.stop(t)
		}
		if t.Failed() {
			for id, p := range replicas {
				t.Logf("--- %s stderr (tail) ---\n%s", id, p.tail(40))
			}
		}
	}()

	pgConn, err := pgx.Connect(context.Background(), pgURL)
	require.NoError(t, err)
	defer pgConn.Close(context.Background())

	// Phase 1: three replicas. Warm-up (5 s) and the first rounds, then a
	// steady window of a whole minute (over less, replicas catching up on
	// their warm-up can show more than the limit inside every sliding minute).
	waitPhase(t, replicas, 15*time.Second)
	steady1 := window{from: time.Now()}
	waitPhase(t, replicas, 62*time.Second)
	steady1.to = time.Now()
	members := liveShares(t, pgConn)
	t.Logf("shares with 3 replicas: %v", members)
	require.Len(t, members, 3)

	// Phase 2: SIGKILL r3; r1 and r2 absorb its share.
	killed := time.Now()
	replicas["r3"].kill(t)
	delete(replicas, "r3")
	absorbedDB := waitShares(t, pgConn, replicas, []string{"r1", "r2"}, 20*time.Second)
	t.Logf("quota_members: r3's share absorbed %.1fs after the SIGKILL (lease_ttl %v, interval 1s)",
		absorbedDB.Sub(killed).Seconds(), quotaTTL)
	waitPhase(t, replicas, 20*time.Second)

	// Phase 3: r3 back; the shares rebalance to thirds.
	restarted := time.Now()
	start("r3")
	rebalanced := waitShares(t, pgConn, replicas, []string{"r1", "r2", "r3"}, 20*time.Second)
	t.Logf("quota_members: rebalanced to thirds %.1fs after r3 restarted", rebalanced.Sub(restarted).Seconds())
	waitPhase(t, replicas, 10*time.Second)
	steady3 := window{from: time.Now()}
	waitPhase(t, replicas, 20*time.Second)
	steady3.to = time.Now()

	st := simulator.Stats().Models[quotaModel]
	limit := float64(quotaTPM) / 60 // tokens per second: the binding limit
	g1 := steady1.goodput(st.Series, limit)
	g3 := steady3.goodput(st.Series, limit)
	absorb := absorbTime(st.Series, killed, limit)
	share429 := float64(st.RateLimitedTotal) / float64(max(st.Requests, 1))
	t.Logf("llmsim: %d requests, %d admitted, %d tokens, 429s %v (share %.2f%%), overruns %v",
		st.Requests, st.Admitted, st.Tokens, st.RateLimited, 100*share429, st.Overruns)
	t.Logf("goodput of the binding limit (TPM %d): 3 replicas %.1f%% over %.0fs, after restart %.1f%% over %.0fs",
		quotaTPM, 100*g1, steady1.to.Sub(steady1.from).Seconds(), 100*g3, steady3.to.Sub(steady3.from).Seconds())
	t.Logf("admitted tokens/s back to ≥ 90%% of the limit %.0fs after the SIGKILL (run %.0fs in all)",
		absorb.Seconds(), time.Since(t0).Seconds())
	t.Logf("admitted tokens per second around the kill: %v", seriesAround(st.Series, killed, -3, 12))

	for reason, n := range st.Overruns {
		require.Zero(t, n, "sliding-window overruns of %s", reason)
	}
	require.Less(t, share429, 0.01, "429 share")
	require.LessOrEqual(t, absorb, 10*time.Second, "the survivors absorb the killed replica's share")
	// The target is 95% of the binding limit. Measured with the window-log
	// auto: see the README's "Sharing a quota" (phase 1's whole minute, and
	// the 20 s after the restart, when the newcomer starts cold: warm-up, a
	// young calibration's wider reserve). These floors catch what the quota
	// itself can break (a replica starved by a wrong demand estimate, a
	// newcomer stranded on a wait booked while paused, a shrunk share that
	// stops a replica while its minute drains): those gave 6-53%.
	if g1 < 0.95 || g3 < 0.95 {
		t.Logf("goodput below the 95%% target: %.1f%% and %.1f%%", 100*g1, 100*g3)
	}
	require.GreaterOrEqual(t, g1, 0.65, "goodput with 3 replicas")
	require.GreaterOrEqual(t, g3, 0.60, "goodput after the restart")
}

// window is a steady part of the run.
type window struct{ from, to time.Time }

// goodput is the admitted tokens per second over the whole seconds inside
// w, as a fraction of limit.
func (w window) goodput(series []sim.Second, limit float64) float64 {
	from, to := w.from.Unix()+1, w.to.Unix()-1 // whole seconds only
	var tokens int64
	for _, s := range series {
		if s.Unix >= from && s.Unix < to {
			tokens += s.Tokens
		}
	}
	secs := float64(to - from)
	if secs <= 0 {
		return 0
	}
	return float64(tokens) / secs / limit
}

// absorbTime is how long after the kill the admitted tokens, averaged over
// 3 s, first reach 90% of the limit again (after having dipped below it).
func absorbTime(series []sim.Second, killed time.Time, limit float64) time.Duration {
	perSec := map[int64]int64{}
	for _, s := range series {
		perSec[s.Unix] = s.Tokens
	}
	k := killed.Unix()
	for s := k + 1; s < k+60; s++ {
		avg := float64(perSec[s]+perSec[s+1]+perSec[s+2]) / 3
		if avg >= 0.9*limit {
			return time.Unix(s, 0).Sub(killed)
		}
	}
	return time.Minute
}

func seriesAround(series []sim.Second, at time.Time, from, to int64) []int64 {
	perSec := map[int64]int64{}
	for _, s := range series {
		perSec[s.Unix] = s.Tokens
	}
	var out []int64
	for s := at.Unix() + from; s <= at.Unix()+to; s++ {
		out = append(out, perSec[s])
	}
	return out
}

// waitPhase lets the replicas run for d, failing at once if one exits.
func waitPhase(t *testing.T, replicas map[string]*consumerProc, d time.Duration) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-timer.C:
			return
		case <-tick.C:
			checkAlive(t, replicas)
		}
	}
}

// checkAlive fails the test if a consumer has exited.
func checkAlive(t *testing.T, replicas map[string]*consumerProc) {
	t.Helper()
	for id, p := range replicas {
		select {
		case <-p.done:
			t.Fatalf("consumer %s exited early: %v\n%s", id, p.err, p.tail(40))
		default:
		}
	}
}

// liveShares reads the live quota_members rows of the model.
func liveShares(t *testing.T, conn *pgx.Conn) map[string]float64 {
	t.Helper()
	rows, err := conn.Query(context.Background(),
		`SELECT replica_id, share_tokens FROM quota_members WHERE model = $1 AND expires_at > now()`, quotaModel)
	require.NoError(t, err)
	out := map[string]float64{}
	var id string
	var s float64
	_, err = pgx.ForEachRow(rows, []any{&id, &s}, func() error { out[id] = s; return nil })
	require.NoError(t, err)
	return out
}

// waitShares polls quota_members (every 100 ms, up to d) until exactly ids
// are live with equal shares that sum to ~1, and returns when.
func waitShares(t *testing.T, conn *pgx.Conn, replicas map[string]*consumerProc, ids []string, d time.Duration) time.Time {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	want := 1 / float64(len(ids))
	for {
		m := liveShares(t, conn)
		ok := len(m) == len(ids)
		for _, id := range ids {
			if s, found := m[id]; !found || s < want-0.01 || s > want+1e-6 {
				ok = false
			}
		}
		if ok {
			return time.Now()
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("shares did not settle to %v among %v within %v: %v", want, ids, d, m)
		}
		checkAlive(t, replicas)
	}
}

// consumerProc is one `consumer run` subprocess that the test kills and
// restarts.
type consumerProc struct {
	*proc
	once sync.Once
}

func startConsumer(t *testing.T, bin, cfgPath, id string) *consumerProc {
	t.Helper()
	env := append(os.Environ(), "LLMQ_CONFIG="+cfgPath, "LLMQ_WORKER_ID="+id)
	return &consumerProc{proc: startProc(t, bin, env, "run", "--config", cfgPath)}
}

func (p *consumerProc) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Kill()) // SIGKILL
	<-p.done
}

// stop ends the process gracefully (SIGTERM), or kills it after 20 s.
func (p *consumerProc) stop(t *testing.T) {
	p.once.Do(func() {
		select {
		case <-p.done:
			return
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		timer := time.NewTimer(20 * time.Second)
		defer timer.Stop()
		select {
		case <-p.done:
		case <-timer.C:
			t.Logf("consumer did not stop on SIGTERM within 20s: killing it")
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
}

func (p *consumerProc) tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.out.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// publishJobs puts n jobs for the shared model on the normal lane.
func publishJobs(t *testing.T, amqpURL string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pub, err := rabbitmq.NewPublisher(ctx, rabbitmq.Config{URL: amqpURL})
	require.NoError(t, err)
	defer pub.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				id := fmt.Sprintf("quota-%05d", i)
				body := fmt.Sprintf(`{"id":%q,"model":%q,"request":{"messages":[{"role":"user","content":"Summarise ticket %d: the printer on floor %d is out of toner again."}],"max_tokens":600}}`,
					id, quotaModel, i, i%9)
				if err := pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{Key: id, Body: []byte(body)}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}
