package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net/http"
	"strconv"
	"time"
)

// Batches: created validating-free (in_progress at once), completed or
// expired when read after their time (advance), their files written then.

type createBatchRequest struct {
	InputFileID      string            `json:"input_file_id"`
	Endpoint         string            `json:"endpoint"`
	CompletionWindow string            `json:"completion_window"`
	Metadata         map[string]string `json:"metadata"`
}

func (s *Simulator) handleCreateBatch(w http.ResponseWriter, r *http.Request) {
	var req createBatchRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_parameter_error", "body: "+err.Error())
		return
	}
	window, err := time.ParseDuration(req.CompletionWindow)
	if err != nil || window <= 0 {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_parameter_error",
			fmt.Sprintf("completion_window %q is not a duration such as 24h", req.CompletionWindow))
		return
	}
	if req.Endpoint == "" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_parameter_error", "endpoint is required")
		return
	}
	b := s.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	in, ok := b.files[req.InputFileID]
	if !ok || in.Purpose != "batch" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_parameter_error",
			"input_file_id does not name a file uploaded with purpose batch")
		return
	}
	now := s.clock.Now()
	sb := &simBatch{ID: fmt.Sprintf("batch_sim%012x", s.ids.Add(1)), Object: "batch", Endpoint: req.Endpoint,
		InputFileID: in.ID, CompletionWindow: req.CompletionWindow, Status: "in_progress",
		CreatedAt: now.Unix(), ExpiresAt: now.Add(window).Unix(), Metadata: req.Metadata, created: now, window: window}
	sb.RequestCounts.Total = bytes.Count(bytes.TrimRight(in.content, "\n"), []byte("\n")) + 1
	b.batches[sb.ID] = sb
	b.order = append(b.order, sb.ID)
	b.stats.Batches++
	writeJSON(w, http.StatusOK, sb)
}

func (s *Simulator) handleGetBatch(w http.ResponseWriter, r *http.Request) {
	s.withBatch(w, r, func(*simBatch) {})
}

// withBatch finds the batch the path names, brings it up to date, calls
// f on it and answers with it; under the batch API's lock.
func (s *Simulator) withBatch(w http.ResponseWriter, r *http.Request, f func(*simBatch)) {
	b := s.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	sb, ok := b.batches[r.PathValue("id")]
	if !ok {
		writeError(w, http.StatusNotFound, "invalid_request_error", "not_found", "No such Batch object: "+r.PathValue("id"))
		return
	}
	s.advance(sb)
	f(sb)
	writeJSON(w, http.StatusOK, sb)
}

// handleListBatches lists batches newest first, up to limit (default 20),
// after the batch named by after.
func (s *Simulator) handleListBatches(w http.ResponseWriter, r *http.Request) {
	limit := 20
	if v, err := strconv.Atoi(r.URL.Query().Get("limit")); err == nil && v > 0 && v <= 100 {
		limit = v
	}
	b := s.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	after := r.URL.Query().Get("after")
	out := []*simBatch{}
	i := len(b.order) - 1
	for ; after != "" && i >= 0; i-- {
		if b.order[i] == after {
			i--
			break
		}
	}
	for ; i >= 0 && len(out) < limit; i-- {
		sb := b.batches[b.order[i]]
		s.advance(sb)
		out = append(out, sb)
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": out, "has_more": i >= 0})
}

func (s *Simulator) handleCancelBatch(w http.ResponseWriter, r *http.Request) {
	s.withBatch(w, r, func(sb *simBatch) {
		if sb.Status == "in_progress" {
			sb.Status = "cancelled"
			s.batch.stats.Cancelled++
		}
	})
}

// advance moves an in-progress batch to expired or completed once its time
// has come; b.mu is held.
func (s *Simulator) advance(sb *simBatch) {
	if sb.Status != "in_progress" {
		return
	}
	b := s.batch
	elapsed := s.clock.Now().Sub(sb.created)
	delay := b.cfg.Delay.D()
	expires := b.cfg.Expire || delay > sb.window
	switch {
	case expires && elapsed >= sb.window:
		s.finish(sb, "expired")
		b.stats.Expired++
	case !expires && elapsed >= delay:
		s.finish(sb, "completed")
		b.stats.Completed++
	}
}

// batchOutLine is one line of an output or error file.
type batchOutLine struct {
	ID       string           `json:"id"`
	CustomID string           `json:"custom_id"`
	Response *batchResponse   `json:"response"`
	Error    *openAIErrorBody `json:"error"`
}

type batchResponse struct {
	StatusCode int    `json:"status_code"`
	RequestID  string `json:"request_id"`
	Body       any    `json:"body"`
}

// finish writes the batch's output and error files: every line of an
// expired batch is a batch_expired error; a completed batch answers each
// line as the chat endpoint would (tokens and content), FailFraction of
// them with a 500. b.mu is held.
func (s *Simulator) finish(sb *simBatch, status string) {
	b := s.batch
	in := b.files[sb.InputFileID]
	var out, errs bytes.Buffer
	for _, raw := range bytes.Split(bytes.TrimRight(in.content, "\n"), []byte("\n")) {
		var l batchLine
		_ = json.Unmarshal(raw, &l) // checked at upload
		line := batchOutLine{ID: fmt.Sprintf("batch_req_sim%012x", s.ids.Add(1)), CustomID: l.CustomID}
		dst := &errs
		switch {
		case status == "expired":
			line.Error = &openAIErrorBody{Code: "batch_expired", Message: "This request could not be executed before the completion window expired."}
		case failDrawn(l.CustomID, b.cfg.FailFraction):
			line.Response = &batchResponse{StatusCode: 500, RequestID: line.ID, Body: openAIError{Error: openAIErrorBody{
				Type: "server_error", Code: "internal_error", Message: "The server had an error while processing your request (injected)."}}}
		default:
			line.Response = s.batchAnswer(l, line.ID)
			if line.Response.StatusCode == http.StatusOK {
				dst = &out
			}
		}
		if dst == &out {
			sb.RequestCounts.Completed++
		} else {
			sb.RequestCounts.Failed++
		}
		enc, _ := json.Marshal(line)
		dst.Write(append(enc, '\n'))
	}
	sb.Status = status
	for _, f := range []struct {
		buf *bytes.Buffer
		id  **string
		sfx string
	}{{&out, &sb.OutputFileID, "output"}, {&errs, &sb.ErrorFileID, "errors"}} {
		if f.buf.Len() == 0 {
			continue
		}
		id := fmt.Sprintf("file-sim%012x", s.ids.Add(1))
		b.files[id] = &simFile{ID: id, Object: "file", Bytes: f.buf.Len(), CreatedAt: s.clock.Now().Unix(),
			Filename: sb.ID + "_" + f.sfx + ".jsonl", Purpose: "batch_output", content: f.buf.Bytes()}
		*f.id = &id
	}
}

// batchAnswer is the chat endpoint's answer to one line, without rate
// limits (a batch does not count against the online quota).
func (s *Simulator) batchAnswer(l batchLine, id string) *batchResponse {
	p, err := parseRequest(l.Body)
	if err != nil {
		return &batchResponse{StatusCode: 400, RequestID: id, Body: openAIError{Error: openAIErrorBody{
			Type: "invalid_request_error", Code: "invalid_parameter_error", Message: err.Error()}}}
	}
	md := s.model(p.Model)
	if md == nil || md.config().Kind != KindChat {
		return &batchResponse{StatusCode: 404, RequestID: id, Body: openAIError{Error: openAIErrorBody{
			Type: "invalid_request_error", Code: "model_not_found", Message: fmt.Sprintf("The model `%s` does not exist.", p.Model)}}}
	}
	out, capped := p.outputTokens(*md.config().Output)
	r := reply{id: "chatcmpl-" + id, model: p.Model, created: s.clock.Now().Unix(), content: p.content(),
		in: p.inputTokens, out: out, capped: capped}
	return &batchResponse{StatusCode: 200, RequestID: id, Body: r.completion()}
}

// failDrawn picks a line to fail by its custom_id, so the same file fails
// the same lines.
func failDrawn(customID string, fraction float64) bool {
	if fraction <= 0 {
		return false
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(customID))
	return float64(h.Sum32()%10000) < fraction*10000
}
