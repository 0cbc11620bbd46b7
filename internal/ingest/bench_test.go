package ingest_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/ingest"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

// BenchmarkIngest measures the intake on each real broker, with raw
// publishers (the broker's own client, as a backend would publish):
//
//   - rate: b.N messages wait on the intake, the ingester starts, and the
//     clock runs until every job has its row (jobs/s, the ingest rate);
//   - burst: with the ingester running, b.N messages are published as fast
//     as the broker confirms them; last_visible_s is the time from the
//     burst's first publish until its last job has a row (target: b.N /
//     ingest rate + 1 s);
//   - paced: a raw publisher sends at 80% of the ingest rate for 10 s; each
//     job's publish-to-visible latency is its row's created_at (the insert
//     that makes it visible) minus the moment it was published
//     (p50/p99/max in ms; target p99 ≤ 1 s).
//
// Run with -benchtime 50000x. Postgres and the broker share this machine's
// cores with the benchmark.
func BenchmarkIngest(b *testing.B) {
	for _, name := range []string{"rabbitmq", "kafka"} {
		open := map[string]func(testing.TB) realBroker{"rabbitmq": rabbitBroker, "kafka": kafkaBroker}[name]
		b.Run(name, func(b *testing.B) {
			n := b.N

			// rate
			st := store.New(testsvc.Postgres(b))
			br := open(b)
			ids, bodies := rawJobs("rate", n)
			br.raw.publish(b, job.PriorityNormal, ids, bodies)
			b.ResetTimer()
			start := time.Now()
			runIngester(b, ingest.Config{}, st, br.intake, br.lanes)
			done := waitRows(b, st, int64(n), 10*time.Minute)
			b.StopTimer()
			rate := float64(n) / done.Sub(start).Seconds()
			b.ReportMetric(rate, "jobs/s")

			// burst
			st2 := store.New(testsvc.Postgres(b))
			br2 := open(b)
			runIngester(b, ingest.Config{}, st2, br2.intake, br2.lanes)
			ids, bodies = rawJobs("burst", n)
			start = time.Now()
			br2.raw.publish(b, job.PriorityNormal, ids, bodies)
			published := time.Since(start)
			waitVisible(b, st2, job.Key{Tenant: "support", ID: ids[n-1]}, 10*time.Minute)
			last := time.Since(start)
			waitRows(b, st2, int64(n), 10*time.Minute)
			b.ReportMetric(last.Seconds(), "last_visible_s")
			b.ReportMetric(float64(n)/rate+1, "target_s")
			b.Logf("%s burst of %d: published in %.2fs, last job visible after %.2fs (target %.2fs)",
				name, n, published.Seconds(), last.Seconds(), float64(n)/rate+1)

			// paced
			st3 := store.New(testsvc.Postgres(b))
			br3 := open(b)
			runIngester(b, ingest.Config{}, st3, br3.intake, br3.lanes)
			pace := 0.8 * rate
			const chunk = 50
			total := int(pace * 10)
			ids, bodies = rawJobs("paced", total)
			sent := make(map[string]time.Time, total)
			start = time.Now()
			for lo := 0; lo < total; lo += chunk {
				due := start.Add(time.Duration(float64(lo) / pace * float64(time.Second)))
				time.Sleep(time.Until(due))
				hi := min(lo+chunk, total)
				at := time.Now()
				br3.raw.publish(b, job.PriorityNormal, ids[lo:hi], bodies[lo:hi])
				for _, id := range ids[lo:hi] {
					sent[id] = at
				}
			}
			waitRows(b, st3, int64(total), 5*time.Minute)
			lat := latencies(b, st3, sent)
			q := func(p float64) float64 { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
			b.ReportMetric(q(0.50), "p50_ms")
			b.ReportMetric(q(0.99), "p99_ms")
			b.ReportMetric(lat[len(lat)-1], "max_ms")
			b.Logf("%s paced at %.0f jobs/s (80%% of %.0f) for 10 s, %d jobs: publish-to-visible p50 %.0f ms, p90 %.0f ms, p99 %.0f ms, max %.0f ms",
				name, pace, rate, total, q(0.5), q(0.9), q(0.99), lat[len(lat)-1])
		})
	}
}

// latencies returns each job's publish-to-visible time in ms, sorted.
func latencies(b *testing.B, st *store.Store, sent map[string]time.Time) []float64 {
	b.Helper()
	out := make([]float64, 0, len(sent))
	var cursor string
	for {
		recs, next, err := st.List(context.Background(), store.ListFilter{Tenant: "support", Cursor: cursor, Limit: 1000})
		require.NoError(b, err)
		for _, rec := range recs {
			at, ok := sent[rec.ID]
			if !ok {
				b.Fatalf("job %s was not sent", rec.ID)
			}
			out = append(out, float64(rec.CreatedAt.Sub(at).Microseconds())/1000)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	require.Len(b, out, len(sent), fmt.Sprintf("%d jobs listed", len(out)))
	slices.Sort(out)
	return out
}
