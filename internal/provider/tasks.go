package provider

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/llmq/llmq/internal/ratecontrol"
)

// Task states of DashScope's asynchronous tasks.
const (
	TaskPending   = "PENDING"
	TaskRunning   = "RUNNING"
	TaskSucceeded = "SUCCEEDED"
	TaskFailed    = "FAILED"
)

// nativeBase is DashScope's native API base: native when set, else base
// with its OpenAI-compatible suffix replaced by /api/v1.
func nativeBase(base, native string) string {
	if native != "" {
		return strings.TrimRight(native, "/")
	}
	for _, suffix := range []string{"/compatible-mode/v1", "/v1"} {
		if root, ok := strings.CutSuffix(base, suffix); ok {
			return root + "/api/v1"
		}
	}
	return base + "/api/v1"
}

// asyncHeader asks DashScope to run a submission as a task.
var asyncHeader = http.Header{"X-Dashscope-Async": {"enable"}}

// SubmitTask submits request (DashScope's native body: input, parameters)
// for model as an asynchronous task to the native API's
// /services/aigc/<endpoint> (text2image/image-synthesis,
// video-generation/video-synthesis, …) and returns the task's id, or an
// *Error. The task is paid for once submitted: keep the id.
func (c *Client) SubmitTask(ctx context.Context, model, endpoint string, request []byte) (string, error) {
	modelJSON, _ := json.Marshal(model)
	body, err := SetTopLevel(request, "model", modelJSON)
	if err != nil {
		return "", c.fail(ratecontrol.Classification{Kind: ratecontrol.KindClient, Message: err.Error()}, nil, 0)
	}
	var parsed struct {
		Output struct {
			TaskID string `json:"task_id"`
		} `json:"output"`
	}
	_, err = c.send(ctx, http.MethodPost, c.nativeURL+"/services/aigc/"+strings.Trim(endpoint, "/"), model, body, asyncHeader, false,
		c.readTaskReply(&parsed, func() bool { return parsed.Output.TaskID != "" }, "task submission answered no task_id"))
	return parsed.Output.TaskID, err
}

// PollTask reads task id's state (TaskPending, TaskRunning,
// TaskSucceeded, TaskFailed, or another the provider names) and returns it
// with the provider's body, which holds the results once it succeeded.
func (c *Client) PollTask(ctx context.Context, model, id string) (string, *Response, error) {
	var parsed struct {
		Output struct {
			TaskStatus string `json:"task_status"`
		} `json:"output"`
	}
	resp, err := c.send(ctx, http.MethodGet, c.nativeURL+"/tasks/"+url.PathEscape(id), model, nil, nil, false,
		c.readTaskReply(&parsed, func() bool { return parsed.Output.TaskStatus != "" }, "task query answered no task_status"))
	return parsed.Output.TaskStatus, resp, err
}

// readTaskReply reads a native API answer into v, keeps it as the body,
// and fails the call as the provider's (malformed) when it is not JSON or
// ok says a field is missing.
func (c *Client) readTaskReply(v any, ok func() bool, missing string) func(io.Reader, *Response) error {
	return func(r io.Reader, out *Response) error {
		data, err := c.readCapped(r)
		if err != nil {
			return err
		}
		if json.Unmarshal(data, v) != nil || !ok() {
			return c.fail(ratecontrol.Classification{Kind: ratecontrol.KindServer, Status: http.StatusOK, Message: missing}, nil, 0)
		}
		out.Body = data
		return nil
	}
}
