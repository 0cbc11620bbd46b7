package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

func batchInput(n int) []byte {
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, `{"custom_id":"c%d","method":"POST","url":"/v1/chat/completions","body":%s}`+"\n", i, chatBody("m", fmt.Sprintf("line %d", i), ""))
	}
	return b.Bytes()
}

func upload(t *testing.T, s http.Handler, name string, content []byte) simFile {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	require.NoError(t, mw.WriteField("purpose", "batch"))
	fw, err := mw.CreateFormFile("file", name)
	require.NoError(t, err)
	_, _ = fw.Write(content)
	require.NoError(t, mw.Close())
	req := httptest.NewRequest(http.MethodPost, "/v1/files", &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var f simFile
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &f))
	return f
}

func call(s http.Handler, method, path, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	return rec
}

func getBatch(t *testing.T, s http.Handler, id string) simBatch {
	t.Helper()
	rec := call(s, http.MethodGet, "/v1/batches/"+id, "")
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var b simBatch
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &b))
	return b
}

func lines(t *testing.T, s http.Handler, id *string) []batchOutLine {
	t.Helper()
	if id == nil {
		return nil
	}
	rec := call(s, http.MethodGet, "/v1/files/"+*id+"/content", "")
	require.Equal(t, http.StatusOK, rec.Code)
	var out []batchOutLine
	for _, l := range bytes.Split(bytes.TrimSpace(rec.Body.Bytes()), []byte("\n")) {
		var o batchOutLine
		require.NoError(t, json.Unmarshal(l, &o))
		out = append(out, o)
	}
	return out
}

func TestBatchCompletesAfterDelayWithPartialFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := oneModel(ModelConfig{RPM: 1}) // the online limit does not apply to batches
		cfg.Batch = BatchConfig{Delay: Duration(10 * time.Second), FailFraction: 0.3}
		s := newSim(t, cfg)
		f := upload(t, s, "llmq-batch-1.jsonl", batchInput(100))
		rec := call(s, http.MethodPost, "/v1/batches", `{"input_file_id":"`+f.ID+`","endpoint":"/v1/chat/completions","completion_window":"1h","metadata":{"llmq_batch":"1"}}`)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		var b simBatch
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &b))
		require.Equal(t, "in_progress", getBatch(t, s, b.ID).Status)

		time.Sleep(10 * time.Second)
		b = getBatch(t, s, b.ID)
		require.Equal(t, "completed", b.Status)
		ok, failed := lines(t, s, b.OutputFileID), lines(t, s, b.ErrorFileID)
		require.Len(t, ok, b.RequestCounts.Completed)
		require.Len(t, failed, b.RequestCounts.Failed)
		require.Equal(t, 100, len(ok)+len(failed))
		require.InDelta(t, 30, len(failed), 15, "about fail_fraction of the lines fail")
		require.Equal(t, 200, ok[0].Response.StatusCode)
		require.Equal(t, 500, failed[0].Response.StatusCode)
		require.Equal(t, BatchStats{Uploads: 1, Batches: 1, Completed: 1}, s.BatchStats())

		// The same input fails the same lines.
		f2 := upload(t, s, "again.jsonl", batchInput(100))
		rec = call(s, http.MethodPost, "/v1/batches", `{"input_file_id":"`+f2.ID+`","endpoint":"/v1/chat/completions","completion_window":"1h"}`)
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &b))
		time.Sleep(10 * time.Second)
		require.Len(t, lines(t, s, getBatch(t, s, b.ID).ErrorFileID), len(failed))
	})
}

func TestBatchExpiresAtItsWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := oneModel(ModelConfig{})
		cfg.Batch = BatchConfig{Delay: Duration(time.Hour)}
		s := newSim(t, cfg)
		f := upload(t, s, "x.jsonl", batchInput(5))
		rec := call(s, http.MethodPost, "/v1/batches", `{"input_file_id":"`+f.ID+`","endpoint":"/v1/chat/completions","completion_window":"2s"}`)
		var b simBatch
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &b))
		time.Sleep(time.Second)
		require.Equal(t, "in_progress", getBatch(t, s, b.ID).Status)
		time.Sleep(time.Second)
		b = getBatch(t, s, b.ID)
		require.Equal(t, "expired", b.Status)
		require.Nil(t, b.OutputFileID)
		errs := lines(t, s, b.ErrorFileID)
		require.Len(t, errs, 5)
		require.Equal(t, "batch_expired", errs[0].Error.Code)
		require.Equal(t, 1, s.BatchStats().Expired)
	})
}

func TestBatchListsAndRefusesBadInput(t *testing.T) {
	s := newSim(t, oneModel(ModelConfig{}))
	upload(t, s, "named.jsonl", batchInput(2))
	rec := call(s, http.MethodGet, "/v1/files?purpose=batch", "")
	require.Contains(t, rec.Body.String(), `"filename":"named.jsonl"`)

	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "bad.jsonl")
	_, _ = fw.Write([]byte(`{"custom_id":"a"}` + "\n"))
	_ = mw.Close()
	req := httptest.NewRequest(http.MethodPost, "/v1/files", &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	rr := httptest.NewRecorder()
	s.ServeHTTP(rr, req)
	require.Equal(t, http.StatusBadRequest, rr.Code)
	require.Equal(t, 1, s.BatchStats().Uploads, "a refused file is not stored")

	rec = call(s, http.MethodPost, "/v1/batches", `{"input_file_id":"file-nope","endpoint":"/v1/chat/completions","completion_window":"24h"}`)
	require.Equal(t, http.StatusBadRequest, rec.Code)
	require.Zero(t, s.BatchStats().Batches)
}
