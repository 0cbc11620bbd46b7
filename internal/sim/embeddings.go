package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"unicode/utf8"
)

// DefaultEmbeddingDimensions is the length of a simulated embedding when
// the request names no dimensions: small, so bodies stay small.
const DefaultEmbeddingDimensions = 8

// maxEmbeddingDimensions bounds a request's dimensions.
const maxEmbeddingDimensions = 4096

// embeddingRequest is the part of an OpenAI embeddings body the simulator
// reads. Input is a string, an array of strings, an array of token ids or
// an array of such arrays; each element is one input of the batch.
type embeddingRequest struct {
	Model      string          `json:"model"`
	Input      json.RawMessage `json:"input"`
	Dimensions *int            `json:"dimensions"`
}

// embeddingInputs returns the token count of each input of the batch:
// ceil(runes/4) for a string (at least 1), the length of a token array.
func embeddingInputs(raw json.RawMessage) ([]int64, error) {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []int64{textTokens(one)}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || len(items) == 0 {
		return nil, errors.New("input must be a non-empty string, array of strings or array of token arrays")
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		return []int64{int64(len(ids))}, nil
	}
	out := make([]int64, 0, len(items))
	for i, it := range items {
		var s string
		var toks []int64
		switch {
		case json.Unmarshal(it, &s) == nil && s != "":
			out = append(out, textTokens(s))
		case json.Unmarshal(it, &toks) == nil && len(toks) > 0:
			out = append(out, int64(len(toks)))
		default:
			return nil, fmt.Errorf("input[%d] must be a non-empty string or token array", i)
		}
	}
	return out, nil
}

func textTokens(s string) int64 { return max(1, (int64(utf8.RuneCountInString(s))+3)/4) }

// EstimateEmbeddingTokens is the simulator's count of an embeddings
// request's input tokens (what it charges against TPM: there is no
// output), summed over the batch.
func EstimateEmbeddingTokens(requestBody []byte) (int64, error) {
	var req embeddingRequest
	if err := json.Unmarshal(requestBody, &req); err != nil {
		return 0, fmt.Errorf("request body is not a valid embeddings request: %w", err)
	}
	per, err := embeddingInputs(req.Input)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, t := range per {
		n += t
	}
	return n, nil
}

// handleEmbeddings serves /embeddings: admitted against the model's RPM,
// RPS, TPM and TPS with the batch's input tokens and no output, refused
// with the dialect's 429 codes like a chat call.
func (s *Simulator) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	var req embeddingRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_parameter_error", "request body is not a valid embeddings request: "+err.Error())
		return
	}
	per, err := embeddingInputs(req.Input)
	dims := DefaultEmbeddingDimensions
	if req.Dimensions != nil {
		dims = *req.Dimensions
	}
	if err == nil && (dims < 1 || dims > maxEmbeddingDimensions) {
		err = fmt.Errorf("dimensions must be between 1 and %d", maxEmbeddingDimensions)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_parameter_error", err.Error())
		return
	}
	md := s.modelOfKind(w, req.Model, KindEmbeddings)
	if md == nil {
		return
	}
	id := fmt.Sprintf("emb-sim%012x", s.ids.Add(1))
	w.Header().Set("x-request-id", id)
	var in int64
	for _, t := range per {
		in += t
	}
	if !s.admitUnary(w, r, md, req.Model, id, in) {
		return
	}
	defer md.done()
	writeJSON(w, http.StatusOK, embeddingReply(req.Model, body, per, dims))
}

// admitUnary admits a call of units that has no output (embeddings, audio)
// on md, then waits out the model's first-token latency. It reports
// whether the caller answers the call; when it does, the caller calls
// md.done after answering. Otherwise the call was answered here: refused,
// faulted, or cut short.
func (s *Simulator) admitUnary(w http.ResponseWriter, r *http.Request, md *model, name, id string, units int64) bool {
	f := s.faults.draw()
	a := md.admit(r.Context(), s, units, 0, f, waitTimeout(r))
	if s.writeUnadmitted(w, a, name, id) {
		return false
	}
	if s.writeFault(r.Context(), w, f) {
		md.done()
		return false
	}
	ttft, _ := md.config().Latency.timing(a.inflight)
	if !s.sleep(r.Context(), ttft) {
		writeClosing(w)
		md.done()
		return false
	}
	return true
}

type embeddingData struct {
	Object    string    `json:"object"`
	Index     int       `json:"index"`
	Embedding []float64 `json:"embedding"`
}

// embeddingReply is the OpenAI list object: one unit vector per input,
// derived from the body so a repeated request gets the same vectors.
func embeddingReply(model string, body []byte, per []int64, dims int) map[string]any {
	h := fnv.New64a()
	_, _ = h.Write(body)
	seed := h.Sum64()
	data := make([]embeddingData, len(per))
	var total int64
	for i, t := range per {
		total += t
		v := make([]float64, dims)
		var norm float64
		x := seed + uint64(i)*0x9e3779b97f4a7c15
		for d := range v {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			v[d] = float64(int64(x%2001)-1000) / 1000
			norm += v[d] * v[d]
		}
		if norm = math.Sqrt(norm); norm > 0 {
			for d := range v {
				v[d] = math.Round(v[d]/norm*1e6) / 1e6
			}
		}
		data[i] = embeddingData{Object: "embedding", Index: i, Embedding: v}
	}
	return map[string]any{"object": "list", "model": model, "data": data,
		"usage": map[string]int64{"prompt_tokens": total, "total_tokens": total}}
}
