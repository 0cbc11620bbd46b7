package results

import (
	"encoding/json"
	"testing"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// A batched job's document names its batch; no other status's does (a
// result event's data never carries it).
func TestDocumentNamesTheBatchOfABatchedJob(t *testing.T) {
	id := int64(7)
	rec := store.Record{Job: job.Job{ID: "j", Tenant: "t"}, Status: job.StatusBatched, BatchID: &id}
	b, err := json.Marshal(DocumentOf(rec))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	_ = json.Unmarshal(b, &doc)
	if doc["batch_id"] != float64(7) || doc["status"] != "batched" {
		t.Fatalf("batched document: %s", b)
	}
	rec.Status = job.StatusSucceeded
	if d := DocumentOf(rec); d.BatchID != nil {
		t.Fatalf("a succeeded job's document names a batch: %+v", d)
	}
}
