package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

// A group commit whose insert committed and whose read of an existing key
// then failed (here the re-submission's pin waits on a row lock past the
// store's timeout) is stored again job by job; the job the first insert
// created then reads as existing. It used to be answered as stored and
// get no message, left to the lost-message sweep, which waits for an idle
// lane; it is published again now.
func TestAJobCreatedByAFailedGroupCommitIsPublished(t *testing.T) {
	t.Parallel()
	pool := testsvc.Postgres(t)
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	st := store.New(pool).WithTimeout(700 * time.Millisecond)
	srv, err := api.New(api.Config{
		Store: st, Publisher: mem.Publisher(), Inspector: mem.Inspector(),
		APIKeys: testKeys, AdminKeys: []config.Secret{config.Secret(keyAdmin)},
		Backpressure:   config.Backpressure{SoftLimit: 1000, HardLimit: 2000, StatusInterval: time.Second},
		CommitFlushers: 1,
	})
	require.NoError(t, err)
	h := &harness{t: t, srv: srv, http: newTestServer(t, srv), store: st, pool: pool, pub: mem.Publisher(), insp: mem.Inspector(), mem: mem}
	ctx := context.Background()

	require.Equal(t, http.StatusAccepted, h.submit(keyAcme, "old").Code)
	require.EqualValues(t, 1, h.depth(job.PriorityNormal))
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM jobs WHERE tenant = 'acme' AND id = 'old' FOR UPDATE`)
	require.NoError(t, err)

	var wg sync.WaitGroup
	wg.Go(func() { h.submit(keyAcme, "old") }) // takes the one flusher first
	time.Sleep(150 * time.Millisecond)
	var batch response
	wg.Go(func() {
		b, _ := json.Marshal([]json.RawMessage{jobBody("fresh", nil), jobBody("old", nil)})
		batch = h.do(http.MethodPost, "/v1/jobs:batch", keyAcme, b)
	})
	wg.Wait() // every pin of old timed out while its row was held
	require.NoError(t, tx.Rollback(ctx))

	var br api.BatchResponse
	batch.json(t, &br)
	require.Len(t, br.Results, 2)
	assert.Less(t, br.Results[0].HTTPStatus, 300, "fresh accepted: %s", batch.Body)
	rec, err := h.store.Get(ctx, job.Key{Tenant: "acme", ID: "fresh"})
	require.NoError(t, err)
	assert.Equal(t, job.StatusQueued, rec.Status)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := mem.Subscriber()
	defer sub.Close()
	ch, err := sub.Subscribe(sctx, job.PriorityNormal, 100)
	require.NoError(t, err)
	var fresh int
	for {
		select {
		case d := <-ch:
			if key, err := job.ReadKey(d.Message().Body); err == nil && key.ID == "fresh" {
				fresh++
			}
			require.NoError(t, d.Ack(ctx))
			continue
		case <-time.After(time.Second):
		}
		break
	}
	assert.Positive(t, fresh, "fresh has a message on its lane")
}
