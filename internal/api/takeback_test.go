package api_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/job"
)

// heldPublisher holds the first publish until release, then fails it, as a
// broker whose confirm never comes does.
type heldPublisher struct {
	broker.Publisher
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (p *heldPublisher) Publish(ctx context.Context, lane job.Priority, msg broker.Message) error {
	first := false
	p.once.Do(func() { first = true })
	if first {
		close(p.entered)
		<-p.release
		return errors.New("broker: confirm timed out")
	}
	return p.Publisher.Publish(ctx, lane, msg)
}

// A re-submission answered "stored" while the first submission's publish
// was still in flight pins the job: the first one's take-back, when that
// publish fails, keeps it and accepts it too. Before, the take-back
// deleted the job the re-submission had been told was queued: GET 404,
// nothing ran and nothing said why.
func TestAResubmissionAnsweredAsStoredIsNotTakenBack(t *testing.T) {
	t.Parallel()
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	pub := &heldPublisher{Publisher: mem.Publisher(), entered: make(chan struct{}), release: make(chan struct{})}
	h := newHarnessWith(t, pub, mem.Inspector())

	first := make(chan response, 1)
	go func() { first <- h.submit(keyAcme, "dup-1") }()
	<-pub.entered // the row is committed, its publish in flight

	second := h.submit(keyAcme, "dup-1") // the client's retry, with the same id
	require.Equal(t, http.StatusOK, second.Code, "%s", second.Body)
	close(pub.release) // the first publish fails
	r1 := <-first
	assert.Equal(t, http.StatusAccepted, r1.Code, "the job stays, so its first submission is accepted too: %s", r1.Body)

	got := h.do(http.MethodGet, "/v1/jobs/dup-1", keyAcme, nil)
	require.Equal(t, http.StatusOK, got.Code, "the job answered as stored exists: %s", got.Body)
	rec, err := h.store.Get(context.Background(), job.Key{Tenant: "acme", ID: "dup-1"})
	require.NoError(t, err)
	assert.Equal(t, job.StatusQueued, rec.Status)
	assert.Nil(t, rec.EnqueuedAt, "marked as having no message, for the reconciler to publish")
}
