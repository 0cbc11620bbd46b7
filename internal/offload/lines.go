package offload

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/provider"
	"github.com/llmq/llmq/internal/store"
)

// The batch files: one request line per member, named by a custom_id that
// spells its job key; one answer line per request in the output or the
// error file.

// chatEndpoint is the endpoint of every line (the Batch API's own name
// for it, also under DashScope's compatible mode).
const chatEndpoint = "/v1/chat/completions"

// customID spells key unambiguously: "<len(tenant)>:<tenant><id>".
func customID(k job.Key) string {
	return strconv.Itoa(len(k.Tenant)) + ":" + k.Tenant + k.ID
}

func parseCustomID(s string) (job.Key, error) {
	n, rest, ok := strings.Cut(s, ":")
	l, err := strconv.Atoi(n)
	if !ok || err != nil || l < 0 || l > len(rest) {
		return job.Key{}, fmt.Errorf("custom_id %q names no job", s)
	}
	return job.Key{Tenant: rest[:l], ID: rest[l:]}, nil
}

type requestLine struct {
	CustomID string          `json:"custom_id"`
	Method   string          `json:"method"`
	URL      string          `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// line is m's request line, calling upstream.
func line(m store.BatchMember, upstream string) ([]byte, error) {
	model, _ := json.Marshal(upstream)
	body, err := provider.SetTopLevel(m.Request, "model", model)
	if err != nil {
		return nil, fmt.Errorf("job %s: %w", m.Key.ID, err)
	}
	out, err := json.Marshal(requestLine{CustomID: customID(m.Key), Method: "POST", URL: chatEndpoint, Body: body})
	if err != nil {
		return nil, fmt.Errorf("job %s: %w", m.Key.ID, err)
	}
	return append(out, '\n'), nil
}

// lineOverhead is a line's bytes besides its request (custom_id, method,
// url, model), for sizing a batch before its file is written.
const lineOverhead = 160

// inputFile is the JSONL of members.
func inputFile(members []store.BatchMember, upstream string) ([]byte, error) {
	var buf bytes.Buffer
	for _, m := range members {
		l, err := line(m, upstream)
		if err != nil {
			return nil, err
		}
		buf.Write(l)
	}
	return buf.Bytes(), nil
}

// answer is one line of an output or error file.
type answer struct {
	CustomID string `json:"custom_id"`
	Response *struct {
		StatusCode int             `json:"status_code"`
		Body       json.RawMessage `json:"body"`
	} `json:"response"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// outcome is what one answer line means for its job.
type outcome struct {
	key job.Key
	// ok: result holds the completion; otherwise err says why not and
	// giveBack whether the request never ran (expired, cancelled).
	ok       bool
	result   store.Result
	err      store.AttemptError
	giveBack bool
}

// parseAnswers reads a JSONL output or error file. A line that names no
// job is skipped (and counted in bad); its job is sent online at the end
// with the members nobody answered for.
func parseAnswers(data []byte, model string) (out []outcome, bad int) {
	for raw := range bytes.SplitSeq(bytes.TrimSpace(data), []byte("\n")) {
		if len(bytes.TrimSpace(raw)) == 0 {
			continue
		}
		var a answer
		if err := json.Unmarshal(raw, &a); err != nil {
			bad++
			continue
		}
		key, err := parseCustomID(a.CustomID)
		if err != nil {
			bad++
			continue
		}
		out = append(out, interpret(key, a, model))
	}
	return out, bad
}

func interpret(key job.Key, a answer, model string) outcome {
	o := outcome{key: key}
	switch {
	case a.Response != nil && a.Response.StatusCode == 200:
		var usage struct {
			Usage struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(a.Response.Body, &usage); err != nil {
			o.err = store.AttemptError{Model: model, Code: "bad_output", Message: "batch output line is not a completion: " + err.Error()}
			return o
		}
		o.ok = true
		o.result = store.Result{ModelUsed: model, Response: a.Response.Body,
			PromptTokens: usage.Usage.PromptTokens, CompletionTokens: usage.Usage.CompletionTokens}
	case a.Response != nil:
		o.err = store.AttemptError{Model: model, Code: strconv.Itoa(a.Response.StatusCode),
			Message: "batch line failed: " + truncate(string(a.Response.Body), 500)}
	case a.Error != nil:
		o.err = store.AttemptError{Model: model, Code: a.Error.Code, Message: "batch line not run: " + a.Error.Message}
		o.giveBack = a.Error.Code == "batch_expired" || a.Error.Code == "batch_cancelled"
	default:
		o.err = store.AttemptError{Model: model, Code: "no_response", Message: "batch line has no response"}
		o.giveBack = true
	}
	return o
}
