package offload

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/config"
)

// Client speaks the OpenAI Files and Batches API of one provider: upload
// a JSONL file, find an upload by its name, create a batch, find a batch
// by its metadata, read a batch, cancel it, download a file. Its errors
// never contain the key.
type Client struct {
	base    string // …/v1
	key     config.Secret
	headers map[string]config.Secret
	http    *http.Client
}

// NewClient returns a client of the provider p.
func NewClient(p config.Provider) *Client {
	return &Client{base: strings.TrimRight(p.BaseURL, "/"), key: p.APIKey, headers: p.Headers,
		http: &http.Client{Timeout: 10 * time.Minute}}
}

// File is an uploaded file.
type File struct {
	ID       string `json:"id"`
	Filename string `json:"filename"`
	Purpose  string `json:"purpose"`
}

// Batch is a provider batch.
type Batch struct {
	ID            string            `json:"id"`
	Status        string            `json:"status"`
	InputFileID   string            `json:"input_file_id"`
	OutputFileID  *string           `json:"output_file_id"`
	ErrorFileID   *string           `json:"error_file_id"`
	Metadata      map[string]string `json:"metadata"`
	RequestCounts struct {
		Total, Completed, Failed int
	} `json:"request_counts"`
}

// Final reports whether the batch will change no more.
func (b Batch) Final() bool {
	switch b.Status {
	case "completed", "failed", "expired", "cancelled":
		return true
	}
	return false
}

// metadataKey names the llmq batch a provider batch was created for: the
// key a coordinator that lost the create's answer looks it up by.
const metadataKey = "llmq_batch"

func (c *Client) do(ctx context.Context, method, path, contentType string, body io.Reader, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	for k, v := range c.headers {
		req.Header.Set(k, string(v))
	}
	req.Header.Set("Authorization", "Bearer "+string(c.key))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		// url.Error names the URL, never the header with the key.
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %w", method, path, &StatusError{Code: resp.StatusCode, Body: truncate(string(data), 300)})
	}
	if raw, ok := out.(*[]byte); ok {
		*raw = data
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// StatusError is an answer other than 2xx.
type StatusError struct {
	Code int
	Body string
}

func (e *StatusError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Code, e.Body) }

// refused reports whether err is the provider refusing the request for
// good (a 4xx other than 408 and 429): repeating it cannot help.
func refused(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Code/100 == 4 && se.Code != 408 && se.Code != 429
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Upload sends content as a batch input file named name.
func (c *Client) Upload(ctx context.Context, name string, content []byte) (File, error) {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	if err := mw.WriteField("purpose", "batch"); err != nil {
		return File{}, err
	}
	fw, err := mw.CreateFormFile("file", name)
	if err != nil {
		return File{}, err
	}
	if _, err := fw.Write(content); err != nil {
		return File{}, err
	}
	if err := mw.Close(); err != nil {
		return File{}, err
	}
	var f File
	return f, c.do(ctx, http.MethodPost, "/files", mw.FormDataContentType(), &body, &f)
}

// FindFile returns the batch input file named name, if one was uploaded.
func (c *Client) FindFile(ctx context.Context, name string) (File, bool, error) {
	var list struct {
		Data []File `json:"data"`
	}
	if err := c.do(ctx, http.MethodGet, "/files?purpose=batch&limit=10000&order=desc", "", nil, &list); err != nil {
		return File{}, false, err
	}
	for _, f := range list.Data {
		if f.Filename == name {
			return f, true, nil
		}
	}
	return File{}, false, nil
}

// CreateBatch submits the uploaded file fileID, tagged with ref.
func (c *Client) CreateBatch(ctx context.Context, fileID, endpoint, window, ref string) (Batch, error) {
	body, _ := json.Marshal(map[string]any{"input_file_id": fileID, "endpoint": endpoint,
		"completion_window": window, "metadata": map[string]string{metadataKey: ref}})
	var b Batch
	return b, c.do(ctx, http.MethodPost, "/batches", "application/json", bytes.NewReader(body), &b)
}

// findPages bounds how far back FindBatch looks (100 batches a page).
const findPages = 10

// FindBatch returns the batch tagged with ref, if one was created.
func (c *Client) FindBatch(ctx context.Context, ref string) (Batch, bool, error) {
	after := ""
	for range findPages {
		var page struct {
			Data    []Batch `json:"data"`
			HasMore bool    `json:"has_more"`
		}
		path := "/batches?limit=100"
		if after != "" {
			path += "&after=" + url.QueryEscape(after)
		}
		if err := c.do(ctx, http.MethodGet, path, "", nil, &page); err != nil {
			return Batch{}, false, err
		}
		for _, b := range page.Data {
			if b.Metadata[metadataKey] == ref {
				return b, true, nil
			}
		}
		if !page.HasMore || len(page.Data) == 0 {
			break
		}
		after = page.Data[len(page.Data)-1].ID
	}
	return Batch{}, false, nil
}

// GetBatch reads a batch.
func (c *Client) GetBatch(ctx context.Context, id string) (Batch, error) {
	var b Batch
	return b, c.do(ctx, http.MethodGet, "/batches/"+url.PathEscape(id), "", nil, &b)
}

// CancelBatch asks the provider to stop a batch.
func (c *Client) CancelBatch(ctx context.Context, id string) (Batch, error) {
	var b Batch
	return b, c.do(ctx, http.MethodPost, "/batches/"+url.PathEscape(id)+"/cancel", "", nil, &b)
}

// Content downloads a file.
func (c *Client) Content(ctx context.Context, fileID string) ([]byte, error) {
	var data []byte
	return data, c.do(ctx, http.MethodGet, "/files/"+url.PathEscape(fileID)+"/content", "", nil, &data)
}
