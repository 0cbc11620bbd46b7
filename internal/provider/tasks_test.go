package provider

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/ratecontrol"
)

func TestNativeBase(t *testing.T) {
	require.Equal(t, "https://dashscope.aliyuncs.com/api/v1", nativeBase("https://dashscope.aliyuncs.com/compatible-mode/v1", ""))
	require.Equal(t, "http://sim/api/v1", nativeBase("http://sim/v1", ""))
	require.Equal(t, "https://x/api/v1", nativeBase("https://y/v1", "https://x/api/v1/"))
}

func TestSubmitAndPollTask(t *testing.T) {
	var submitPath, submitBody, async, pollPath string
	status := "RUNNING"
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost {
			b, _ := io.ReadAll(r.Body)
			submitPath, submitBody, async = r.URL.Path, string(b), r.Header.Get("X-DashScope-Async")
			fmt.Fprint(w, `{"request_id":"r1","output":{"task_id":"t-42","task_status":"PENDING"}}`)
			return
		}
		pollPath = r.URL.Path
		fmt.Fprintf(w, `{"request_id":"r2","output":{"task_id":"t-42","task_status":%q}}`, status)
	}, nil)
	id, err := c.SubmitTask(context.Background(), "wanx2.1-t2i-turbo", "/text2image/image-synthesis", []byte(`{"input":{"prompt":"a cat"}}`))
	require.NoError(t, err)
	require.Equal(t, "t-42", id)
	require.Equal(t, "/api/v1/services/aigc/text2image/image-synthesis", submitPath)
	require.Equal(t, "enable", async)
	require.Equal(t, `{"model":"wanx2.1-t2i-turbo","input":{"prompt":"a cat"}}`, submitBody)
	st, resp, err := c.PollTask(context.Background(), "wanx2.1-t2i-turbo", id)
	require.NoError(t, err)
	require.Equal(t, TaskRunning, st)
	require.Equal(t, "/api/v1/tasks/t-42", pollPath)
	require.Contains(t, string(resp.Body), `"task_id":"t-42"`)
}

func TestSubmitTaskRateLimited(t *testing.T) {
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, `{"code":"Throttling","message":"Too many running tasks","request_id":"r"}`)
	}, nil)
	_, err := c.SubmitTask(context.Background(), "wanx", "text2image/image-synthesis", []byte(`{"input":{}}`))
	var pe *Error
	require.ErrorAs(t, err, &pe)
	require.True(t, pe.Class.Kind.RateLimited(), "%v", pe.Class)
	require.NotEqual(t, ratecontrol.KindClient, pe.Class.Kind)
}
