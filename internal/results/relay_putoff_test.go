package results_test

import (
	"cmp"
	"context"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/results"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

// refusing publishes every event but those of refuse, which it reports
// refused on their own with err (broker.ErrRejected when nil), as a broker
// does a full reply queue's.
type refusing struct {
	*memory.Publisher
	refuse map[string]bool // job ids
	err    error
}

func (p refusing) PublishResults(ctx context.Context, msgs []broker.ResultMessage) ([]int, error) {
	refused := map[int]error{}
	var ok []broker.ResultMessage
	for i, m := range msgs {
		if p.refuse[m.JobID] {
			refused[i] = cmp.Or(p.err, broker.ErrRejected)
		} else {
			ok = append(ok, m)
		}
	}
	if _, err := p.Publisher.PublishResults(ctx, ok); err != nil {
		return nil, err
	}
	if len(refused) > 0 {
		return nil, &broker.ResultsRefused{Refused: refused}
	}
	return nil, nil
}

// An event the broker refuses on its own is put off with its webhooks; the
// other events of its round go out with theirs, and the next round does
// not take it before it is due.
func TestRelayPutsOffAnEventTheBrokerRefuses(t *testing.T) {
	ctx := context.Background()
	pool := testsvc.Postgres(t)
	s := store.New(pool)
	b := memory.New(memory.Config{})
	defer b.Close()
	stuck, fine := sample("stuck"), sample("fine")
	stuck.CallbackURL, fine.CallbackURL = "https://hooks.acme.example/stuck", "https://hooks.acme.example/fine"
	finished(t, s, stuck, false)
	finished(t, s, fine, false)
	relay := results.NewRelay(results.RelayParams{Store: s, Publisher: refusing{Publisher: b.Publisher(), refuse: map[string]bool{"stuck": true}},
		WebhookURLs: func(string) string { return "" }})

	n, err := relay.Round(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	msgs := b.Results()
	require.Len(t, msgs, 1)
	assert.Equal(t, "fine", msgs[0].JobID)
	var hooks []string
	rows, err := pool.Query(ctx, `SELECT job_id FROM webhook_deliveries`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		hooks = append(hooks, id)
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, []string{"fine"}, hooks, "the refused event's webhook waits for it")

	n, err = relay.Round(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "not due yet")
	pending, _, err := s.PendingResults(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 1, pending, "kept, not lost")

	// Refused again and again, its broker copies are given up: the event
	// is done, its webhook goes out.
	_, err = pool.Exec(ctx, `UPDATE result_events SET attempts = 7, next_attempt_at = now() - interval '1 second'`)
	require.NoError(t, err)
	n, err = relay.Round(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	pending, _, err = s.PendingResults(ctx)
	require.NoError(t, err)
	assert.Zero(t, pending)
	assert.Len(t, b.Results(), 1, "still only fine's event on the broker")
	var stuckHooks int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE job_id = 'stuck'`).Scan(&stuckHooks))
	assert.Equal(t, 1, stuckHooks, "its webhook is stored once it is given up")
}

// An event the broker had no time to take is tried again a second later
// and never counts as refused: one at the last refusal before the give-up
// is kept, with its webhook, until it is published.
func TestRelayTriesAnEventOutOfTimeAgainUncounted(t *testing.T) {
	ctx := context.Background()
	pool := testsvc.Postgres(t)
	s := store.New(pool)
	b := memory.New(memory.Config{})
	defer b.Close()
	slow := sample("slow")
	slow.CallbackURL = "https://hooks.acme.example/slow"
	finished(t, s, slow, false)
	_, err := pool.Exec(ctx, `UPDATE result_events SET attempts = 7`)
	require.NoError(t, err)
	p := refusing{Publisher: b.Publisher(), refuse: map[string]bool{"slow": true},
		err: fmt.Errorf("kafka: publish result of job slow: %w", broker.ErrOutOfTime)}
	relay := results.NewRelay(results.RelayParams{Store: s, Publisher: p, WebhookURLs: func(string) string { return "" }})
	n, err := relay.Round(ctx)
	require.NoError(t, err)
	assert.Zero(t, n)
	var attempts int
	var due bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT attempts, next_attempt_at > now() FROM result_events`).Scan(&attempts, &due))
	assert.Equal(t, 7, attempts, "not counted as a refusal")
	assert.True(t, due, "tried again later")
	var hooks int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries`).Scan(&hooks))
	assert.Zero(t, hooks, "its webhook waits with it")

	delete(p.refuse, "slow")
	_, err = pool.Exec(ctx, `UPDATE result_events SET next_attempt_at = now() - interval '1 second'`)
	require.NoError(t, err)
	n, err = relay.Round(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	require.Len(t, b.Results(), 1)
	assert.Equal(t, "slow", b.Results()[0].JobID)
}

// slimming publishes every event as its slim copy when it has one, as the
// Kafka driver does an event too large for a Kafka message.
type slimming struct {
	*memory.Publisher
	slimmed map[string]bool // job ids
}

func (p slimming) PublishResults(ctx context.Context, msgs []broker.ResultMessage) ([]int, error) {
	for i, m := range msgs {
		p.slimmed[m.JobID] = m.Slim != nil
		if m.Slim != nil {
			body, err := m.Slim()
			if err != nil {
				return nil, err
			}
			msgs[i].Body = body
			m.SlimPublished()
		}
	}
	return p.Publisher.PublishResults(ctx, msgs)
}

// A succeeded job's event has a slim copy, without the response, that a
// broker may take instead; the webhook keeps the whole event. A job
// without a response has none.
func TestRelayOffersAnEventWithoutItsResponse(t *testing.T) {
	ctx := context.Background()
	pool := testsvc.Postgres(t)
	s := store.New(pool)
	b := memory.New(memory.Config{})
	defer b.Close()
	done := sample("done")
	done.CallbackURL = "https://hooks.acme.example/done"
	finished(t, s, done, false)
	finished(t, s, sample("gone"), true)
	p := slimming{b.Publisher(), map[string]bool{}}
	reg := prometheus.NewRegistry()
	relay := results.NewRelay(results.RelayParams{Store: s, Publisher: p, WebhookURLs: func(string) string { return "" },
		Metrics: results.NewMetrics(reg)})
	n, err := relay.Round(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	assert.Equal(t, map[string]bool{"done": true, "gone": false}, p.slimmed)
	families, err := reg.Gather()
	require.NoError(t, err)
	counted := -1.0
	for _, mf := range families {
		if mf.GetName() == "llmq_result_events_slimmed_total" {
			counted = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	assert.EqualValues(t, 1, counted, "llmq_result_events_slimmed_total")
	for _, m := range b.Results() {
		ev, err := client.ParseResultEvent(m.Body)
		require.NoError(t, err)
		if m.JobID == "done" {
			assert.True(t, ev.Data.ResponseOmitted)
			assert.JSONEq(t, `null`, string(ev.Data.Response))
			assert.Equal(t, 3, ev.Data.Usage.PromptTokens, "the rest of the document stays")
		}
	}
	var payload string
	require.NoError(t, pool.QueryRow(ctx, `SELECT convert_from(payload, 'UTF8') FROM webhook_deliveries WHERE job_id = 'done'`).Scan(&payload))
	assert.Contains(t, payload, `"content":"ok"`, "the webhook carries the response")
}
