package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/provider"
	"github.com/llmq/llmq/internal/quota"
	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/sim"
	"github.com/llmq/llmq/internal/testsvc"
)

// govReplica is one replica in the test process: a real auto Governor
// driven by a quota.Coordinator on real Postgres, sending a never-ending
// backlog to llmsim through the provider client.
type govReplica struct {
	id     string
	gov    *ratecontrol.Governor
	coord  *quota.Coordinator
	cancel context.CancelFunc
	wg     sync.WaitGroup // the coordinator, the send loop and its calls
}

func startGovReplica(t *testing.T, url, id string, m config.Model, q config.Quota, client *provider.Client, next func() []byte) *govReplica {
	t.Helper()
	pool := pgPoolFor(t, url)
	r := &govReplica{id: id}
	r.gov = ratecontrol.NewGovernor(ratecontrol.StrategyAuto, quota.Limits(m, quota.Share{Requests: 1, Tokens: 1}))
	r.coord = quota.New(pool, id, map[string]config.Model{quotaModel: m},
		func(string) quota.Governor { return r.gov }, q,
		quota.WithBacklog(func(string) int { return 1 })) // a never-ending backlog
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		_ = r.coord.Run(ctx)
	}()
	select {
	case <-r.coord.Ready():
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no share within 30s", id)
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			body := next()
			p, err := r.gov.Acquire(ctx, ratecontrol.Request{InputTokens: ratecontrol.EstimateTokens(body), MaxTokens: 600})
			if err != nil {
				return
			}
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				resp, err := client.Chat(ctx, quotaModel, body)
				if err == nil {
					p.Settle(ratecontrol.Result{Class: ratecontrol.Classification{Kind: ratecontrol.KindOK, Status: 200},
						PromptTokens: resp.PromptTokens, CompletionTokens: resp.CompletionTokens,
						Latency: resp.Latency, Headers: resp.Headers})
					return
				}
				if ctx.Err() != nil {
					p.Cancel()
					return
				}
				var perr *provider.Error
				res := ratecontrol.Result{Class: ratecontrol.ClassifyError(err)}
				if errors.As(err, &perr) {
					res = ratecontrol.Result{Class: perr.Class, Latency: perr.Latency, Headers: perr.Headers}
				}
				p.Settle(res)
				if res.Class.Kind.RateLimited() {
					r.coord.Report429(quotaModel, res.Class)
				}
			}()
		}
	}()
	return r
}

// kill stops the replica as SIGKILL would: no hand-back.
func (r *govReplica) kill() {
	r.cancel()
	r.wg.Wait()
}

// stop stops it gracefully: Close hands the lease back.
func (r *govReplica) stop(t *testing.T) {
	r.cancel()
	r.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, r.coord.Close(ctx))
}

// TestQuotaGovernorsInProcess is TestQuotaReplicas without the broker and
// the subprocesses: three real auto governors sharing one quota through
// quota.Coordinator on Postgres against llmsim. It isolates what the
// quota and the governors achieve together.
func TestQuotaGovernorsInProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("about a minute of real time: not in -short")
	}
	url := testsvc.PostgresURL(t)
	simulator, err := sim.New(sim.Config{
		APIKeys: []string{"sk-quota-test"},
		Latency: sim.LatencyConfig{TTFT: sim.Duration(30 * time.Millisecond), TPT: sim.Duration(200 * time.Microsecond)},
		Output:  sim.OutputMix{Short: 30, Long: 600, LongShare: 0.3},
		Models:  map[string]sim.ModelConfig{quotaModel: {RPM: quotaRPM, TPM: quotaTPM}},
	}.WithDefaults())
	require.NoError(t, err)
	srv := httptest.NewServer(simulator)
	defer srv.Close()
	defer simulator.Close()
	client, err := provider.New(provider.Config{BaseURL: srv.URL + "/v1", APIKey: "sk-quota-test", Timeout: 30 * time.Second})
	require.NoError(t, err)
	defer client.Close()

	var n atomic.Int64
	next := func() []byte {
		i := n.Add(1)
		return []byte(fmt.Sprintf(`{"messages":[{"role":"user","content":"Summarise ticket %d: the printer on floor %d is out of toner again."}],"max_tokens":600}`, i, i%9))
	}
	m := config.Model{RPM: quotaRPM, TPM: quotaTPM, MaxConcurrency: 30, Warmup: 5 * time.Second}
	q := config.Quota{Shared: true, LeaseTTL: quotaTTL, FallbackShare: 0.25}

	rs := map[string]*govReplica{}
	for _, id := range []string{"r1", "r2", "r3"} {
		rs[id] = startGovReplica(t, url, id, m, q, client, next)
	}
	defer func() {
		for _, r := range rs {
			r.stop(t)
		}
	}()
	phase := func(d time.Duration) {
		timer := time.NewTimer(d)
		defer timer.Stop()
		<-timer.C // a measurement window, not a wait for an event
	}
	phase(12 * time.Second) // warm-up and the first rounds
	w1 := window{from: time.Now()}
	phase(20 * time.Second)
	w1.to = time.Now()

	killed := time.Now()
	rs["r3"].kill()
	delete(rs, "r3")
	phase(15 * time.Second)
	w2 := window{from: time.Now()}
	phase(10 * time.Second)
	w2.to = time.Now()

	st := simulator.Stats().Models[quotaModel]
	limit := float64(quotaTPM) / 60
	share429 := float64(st.RateLimitedTotal) / float64(max(st.Requests, 1))
	absorb := absorbTime(st.Series, killed, limit)
	t.Logf("llmsim: %d requests, %d admitted, 429s %v (share %.2f%%), overruns %v",
		st.Requests, st.Admitted, st.RateLimited, 100*share429, st.Overruns)
	t.Logf("goodput of TPM %d: 3 replicas %.1f%%, 2 replicas after the kill %.1f%%; absorbed after %.0fs",
		quotaTPM, 100*w1.goodput(st.Series, limit), 100*w2.goodput(st.Series, limit), absorb.Seconds())
	t.Logf("admitted tokens per second around the kill: %v", seriesAround(st.Series, killed, -3, 12))
	for reason, n := range st.Overruns {
		require.Zero(t, n, "overruns of %s", reason)
	}
	require.Less(t, share429, 0.01)
	require.LessOrEqual(t, absorb, 10*time.Second)
	// See TestQuotaReplicas on the 95% target: governor-bound at a share.
	require.GreaterOrEqual(t, w1.goodput(st.Series, limit), 0.5)
	require.GreaterOrEqual(t, w2.goodput(st.Series, limit), 0.5)
}

// pgPoolFor opens a pool of its own (one per replica, as in separate
// processes), closed at the end of the test.
func pgPoolFor(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}
