package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/broker/memory"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/testsvc"
)

// A job that passes validation but that Postgres will not store (here
// metadata nested deeper than the server's stack allows) is the job's
// fault, answered as an invalid job; the jobs batched with it are stored.
func TestAJobPostgresRefusesPastValidationIsInvalid(t *testing.T) {
	t.Parallel()
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	h := newHarnessOn(t, testsvc.PostgresSmallStack(t), mem.Publisher(), mem.Inspector())
	h.mem = mem
	deep := `{"id":"deep","model":"m","request":{"messages":[{"role":"user","content":"x"}]},"metadata":{"k":` +
		testsvc.DeepJSON(testsvc.SmallStackDepth) + `}}`
	batch := "[" + strings.Join([]string{string(jobBody("ok-1", nil)), deep, string(jobBody("ok-2", nil))}, ",") + "]"
	r := h.do("POST", "/v1/jobs:batch", keyAcme, []byte(batch))
	require.Equal(t, http.StatusAccepted, r.Code, "%s", r.Body)
	var resp api.BatchResponse
	r.json(t, &resp)
	require.Len(t, resp.Results, 3)
	assert.Equal(t, http.StatusAccepted, resp.Results[0].HTTPStatus)
	require.Equal(t, http.StatusBadRequest, resp.Results[1].HTTPStatus, "%+v", resp.Results[1].Error)
	assert.Equal(t, api.CodeInvalidJob, resp.Results[1].Error.Code)
	assert.Contains(t, resp.Results[1].Error.Message, "stack depth limit exceeded")
	assert.Equal(t, http.StatusAccepted, resp.Results[2].HTTPStatus)
	assert.EqualValues(t, 2, h.depth(job.PriorityNormal), "only stored jobs stay published")

	r = h.do("POST", "/v1/jobs", keyAcme, []byte(deep))
	require.Equal(t, http.StatusBadRequest, r.Code, "%s", r.Body)
}
