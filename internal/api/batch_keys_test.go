package api_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
)

// A batch may not name one job twice; the same id under two tenants (an
// admin's batch) names two jobs.
func TestBatchRepeatsAreJobsNotIDs(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	b, err := json.Marshal([]json.RawMessage{
		jobBody("x", map[string]any{"tenant": "acme"}),
		jobBody("x", map[string]any{"tenant": "globex"}),
		jobBody("x", map[string]any{"tenant": "acme"}),
	})
	require.NoError(t, err)
	r := h.do(http.MethodPost, "/v1/jobs:batch", keyAdmin, b)
	require.Equal(t, http.StatusAccepted, r.Code, "%s", r.Body)
	var br api.BatchResponse
	r.json(t, &br)
	require.Len(t, br.Results, 3)
	assert.Equal(t, http.StatusAccepted, br.Results[0].HTTPStatus)
	assert.Equal(t, http.StatusAccepted, br.Results[1].HTTPStatus, "globex's x is another job: %+v", br.Results[1].Error)
	require.Equal(t, http.StatusBadRequest, br.Results[2].HTTPStatus)
	assert.Contains(t, br.Results[2].Error.Message, "repeats the id of item 0")
}
