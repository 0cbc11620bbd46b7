package api_test

import (
	"encoding/json"
	"io/fs"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/api"
	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/results"
	"github.com/llmq/llmq/internal/store"
)

func jsonNames(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name == "-" {
			continue // not part of the JSON (job.Job's trace context)
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// The result event schema names exactly the fields the relay writes.
func TestResultEventSchemaNamesEveryField(t *testing.T) {
	var doc struct {
		Properties map[string]json.RawMessage `json:"properties"`
		Defs       struct {
			Job struct {
				Properties map[string]json.RawMessage `json:"properties"`
			} `json:"job"`
		} `json:"$defs"`
	}
	data, err := fs.ReadFile(api.FS(), api.ResultEventSchemaFile)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &doc))
	keys := func(m map[string]json.RawMessage) []string {
		var out []string
		for k := range m {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	assert.Equal(t, jsonNames(reflect.TypeFor[results.Event]()), keys(doc.Properties))
	assert.Equal(t, jsonNames(reflect.TypeFor[results.Document]()), keys(doc.Defs.Job.Properties))
	assert.Equal(t, jsonNames(reflect.TypeFor[results.Document]()), jsonNames(reflect.TypeFor[client.JobStatus]()),
		"the client's JobStatus reads every field of the document")
}

// Events the relay encodes, for each terminal status, are valid under the
// schema, and the public client reads them back.
func TestResultEventsAreValid(t *testing.T) {
	sch := compileSchema(t, api.ResultEventSchemaFile)
	at := time.Date(2026, 12, 1, 9, 0, 2, 0, time.UTC)
	started := at.Add(-time.Second)
	base := store.Record{Job: job.Job{ID: "ticket-1", Tenant: "support", Model: "qwen-plus", Priority: job.PriorityNormal,
		Metadata: json.RawMessage(`{"ticket":4711}`), CorrelationID: "c-1"}, CreatedAt: at.Add(-2 * time.Second), CompletedAt: &at}
	succeeded := base
	succeeded.Status, succeeded.Attempts, succeeded.ModelUsed, succeeded.StartedAt = job.StatusSucceeded, 1, "qwen-plus", &started
	succeeded.Response, succeeded.PromptTokens, succeeded.CompletionTokens = json.RawMessage(`{"choices":[]}`), 3, 2
	failed := base
	failed.Status, failed.Attempts, failed.StartedAt = job.StatusFailed, 1, &started
	failed.Errors = []store.AttemptError{{Attempt: 1, Model: "qwen-plus", Kind: "client", Code: "400", Message: "bad", At: at}}
	cancelled := base
	cancelled.Status, cancelled.Metadata, cancelled.CorrelationID = job.StatusCancelled, nil, ""
	dead := failed
	dead.Status = job.StatusDead
	for _, rec := range []store.Record{succeeded, failed, cancelled, dead} {
		body, err := results.EncodeEvent(store.ResultEvent{EventID: "5b0e6a8e-1c55-4d1b-9b7e-0f3d3c1f8a11", OccurredAt: at, Job: rec})
		require.NoError(t, err)
		require.NoError(t, validate(sch, body), "%s: %s", rec.Status, body)
		ev, err := client.ParseResultEvent(body)
		require.NoError(t, err)
		assert.Equal(t, "job."+string(rec.Status), ev.Type)
		assert.Equal(t, client.Status(rec.Status), ev.Data.Status)
	}
	// The copy a broker takes when the whole event is too large for it.
	e := store.ResultEvent{EventID: "5b0e6a8e-1c55-4d1b-9b7e-0f3d3c1f8a11", OccurredAt: at, Job: succeeded}
	full, err := results.EncodeEvent(e)
	require.NoError(t, err)
	slim, err := results.SlimEvent(e)
	require.NoError(t, err)
	require.NoError(t, validate(sch, slim), "slim: %s", slim)
	ev, err := client.ParseResultEvent(slim)
	require.NoError(t, err)
	assert.True(t, ev.Data.ResponseOmitted)
	assert.JSONEq(t, `null`, string(ev.Data.Response))
	assert.Equal(t, "ticket-1", ev.Data.ID)
	evFull, err := client.ParseResultEvent(full)
	require.NoError(t, err)
	assert.False(t, evFull.Data.ResponseOmitted, "a whole event says nothing of it")
	assert.NotContains(t, string(full), "response_omitted")
	assert.Equal(t, evFull.EventID, ev.EventID, "one event, one id")

	_, err = client.ParseResultEvent([]byte(`{"type":"job.succeeded","version":2,"event_id":"x","data":{"id":"a"}}`))
	assert.ErrorContains(t, err, "version 2")
}
