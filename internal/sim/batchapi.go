package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// The simulated Batch API: POST/GET /v1/files (multipart upload of a JSONL
// file, listing by purpose, metadata, content) and POST/GET /v1/batches
// (create, get, list, cancel), as OpenAI serves them. A batch is processed
// lazily: whoever reads it after BatchConfig.Delay finds it completed, its
// output and error files written then. Uploads and batch creations are
// counted (BatchStats) so tests can show nothing was uploaded or paid twice.

// BatchConfig shapes how the simulator processes batches.
type BatchConfig struct {
	// Delay is how long a batch takes from creation to completed (default 0:
	// done when first read).
	Delay Duration `yaml:"delay" json:"delay"`
	// FailFraction of the lines (chosen by a hash of their custom_id) end
	// in the error file with a 500 instead of a completion.
	FailFraction float64 `yaml:"fail_fraction" json:"fail_fraction"`
	// Expire makes every batch expire at the end of its completion window
	// with nothing completed; a batch whose Delay exceeds its window
	// expires the same way.
	Expire bool `yaml:"expire" json:"expire"`
}

func (b BatchConfig) validate() error {
	if b.Delay < 0 {
		return fmt.Errorf("batch.delay: must not be negative")
	}
	if b.FailFraction < 0 || b.FailFraction > 1 {
		return fmt.Errorf("batch.fail_fraction: must be between 0 and 1")
	}
	return nil
}

// BatchStats counts what the Batch API was asked to do.
type BatchStats struct {
	// Uploads is every file uploaded; Batches every batch created.
	Uploads, Batches int
	// Completed, Expired and Cancelled count batches that reached that status.
	Completed, Expired, Cancelled int
}

// simFile is one stored file.
type simFile struct {
	ID        string `json:"id"`
	Object    string `json:"object"`
	Bytes     int    `json:"bytes"`
	CreatedAt int64  `json:"created_at"`
	Filename  string `json:"filename"`
	Purpose   string `json:"purpose"`
	content   []byte
}

// simBatch is one batch, as GET /v1/batches/{id} returns it.
type simBatch struct {
	ID               string            `json:"id"`
	Object           string            `json:"object"`
	Endpoint         string            `json:"endpoint"`
	InputFileID      string            `json:"input_file_id"`
	CompletionWindow string            `json:"completion_window"`
	Status           string            `json:"status"`
	OutputFileID     *string           `json:"output_file_id"`
	ErrorFileID      *string           `json:"error_file_id"`
	CreatedAt        int64             `json:"created_at"`
	ExpiresAt        int64             `json:"expires_at"`
	Metadata         map[string]string `json:"metadata,omitempty"`
	RequestCounts    struct {
		Total     int `json:"total"`
		Completed int `json:"completed"`
		Failed    int `json:"failed"`
	} `json:"request_counts"`
	created time.Time
	window  time.Duration
}

// batchAPI holds the files and batches.
type batchAPI struct {
	mu      sync.Mutex
	cfg     BatchConfig
	files   map[string]*simFile
	batches map[string]*simBatch
	order   []string // batch ids, oldest first
	stats   BatchStats
}

func newBatchAPI(cfg BatchConfig) *batchAPI {
	return &batchAPI{cfg: cfg, files: map[string]*simFile{}, batches: map[string]*simBatch{}}
}

// SetBatch changes how batches created from now on, and batches still in
// progress, are processed.
func (s *Simulator) SetBatch(cfg BatchConfig) error {
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("set batch: %w", err)
	}
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	s.batch.cfg = cfg
	return nil
}

// BatchStats returns the Batch API's counts so far.
func (s *Simulator) BatchStats() BatchStats {
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	return s.batch.stats
}

func (s *Simulator) batchRoutes(mux *http.ServeMux) {
	for _, prefix := range []string{"/v1", "/compatible-mode/v1"} {
		mux.HandleFunc("POST "+prefix+"/files", s.authed(s.handleUpload))
		mux.HandleFunc("GET "+prefix+"/files", s.authed(s.handleListFiles))
		mux.HandleFunc("GET "+prefix+"/files/{id}", s.authed(s.handleGetFile))
		mux.HandleFunc("GET "+prefix+"/files/{id}/content", s.authed(s.handleFileContent))
		mux.HandleFunc("POST "+prefix+"/batches", s.authed(s.handleCreateBatch))
		mux.HandleFunc("GET "+prefix+"/batches", s.authed(s.handleListBatches))
		mux.HandleFunc("GET "+prefix+"/batches/{id}", s.authed(s.handleGetBatch))
		mux.HandleFunc("POST "+prefix+"/batches/{id}/cancel", s.authed(s.handleCancelBatch))
	}
}

// maxUpload bounds an uploaded file (OpenAI's limit for batch input is 200 MB).
const maxUpload = 200 << 20

func (s *Simulator) handleUpload(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxUpload)
	if err := r.ParseMultipartForm(32 << 20); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_file", "want a multipart form with file and purpose: "+err.Error())
		return
	}
	purpose := r.FormValue("purpose")
	f, hdr, err := r.FormFile("file")
	if err != nil || purpose == "" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_file", "the form needs a file and a purpose")
		return
	}
	defer f.Close()
	content, err := io.ReadAll(f)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_file", "read file: "+err.Error())
		return
	}
	if purpose == "batch" {
		if err := checkBatchInput(content); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_file", err.Error())
			return
		}
	}
	writeJSON(w, http.StatusOK, s.batch.addFile(s, hdr.Filename, purpose, content, true))
}

// addFile stores a file; upload says it came from a client (counted).
func (b *batchAPI) addFile(s *Simulator, name, purpose string, content []byte, upload bool) simFile {
	b.mu.Lock()
	defer b.mu.Unlock()
	f := &simFile{ID: fmt.Sprintf("file-sim%012x", s.ids.Add(1)), Object: "file", Bytes: len(content),
		CreatedAt: s.clock.Now().Unix(), Filename: name, Purpose: purpose, content: content}
	b.files[f.ID] = f
	if upload {
		b.stats.Uploads++
	}
	return *f
}

// batchLine is one line of a batch input file.
type batchLine struct {
	CustomID string          `json:"custom_id"`
	Method   string          `json:"method"`
	URL      string          `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// checkBatchInput refuses a batch file whose lines are not requests with
// distinct custom_ids, as the real API does at upload.
func checkBatchInput(content []byte) error {
	seen := map[string]bool{}
	for i, line := range bytes.Split(bytes.TrimRight(content, "\n"), []byte("\n")) {
		var l batchLine
		if err := json.Unmarshal(line, &l); err != nil {
			return fmt.Errorf("line %d: not a JSON object: %v", i+1, err)
		}
		if l.CustomID == "" || l.Method != http.MethodPost || l.URL == "" || len(l.Body) == 0 {
			return fmt.Errorf("line %d: needs custom_id, method POST, url and body", i+1)
		}
		if seen[l.CustomID] {
			return fmt.Errorf("line %d: custom_id %q is not unique", i+1, l.CustomID)
		}
		seen[l.CustomID] = true
	}
	return nil
}

func (s *Simulator) handleListFiles(w http.ResponseWriter, r *http.Request) {
	purpose := r.URL.Query().Get("purpose")
	s.batch.mu.Lock()
	out := []simFile{}
	for _, f := range s.batch.files {
		if purpose == "" || f.Purpose == purpose {
			out = append(out, *f)
		}
	}
	s.batch.mu.Unlock()
	slices.SortFunc(out, func(a, b simFile) int { return strings.Compare(a.ID, b.ID) })
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": out})
}

func (s *Simulator) file(w http.ResponseWriter, r *http.Request) (simFile, bool) {
	s.batch.mu.Lock()
	f, ok := s.batch.files[r.PathValue("id")]
	s.batch.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, "invalid_request_error", "not_found", "No such File object: "+r.PathValue("id"))
		return simFile{}, false
	}
	return *f, true
}

func (s *Simulator) handleGetFile(w http.ResponseWriter, r *http.Request) {
	if f, ok := s.file(w, r); ok {
		writeJSON(w, http.StatusOK, f)
	}
}

func (s *Simulator) handleFileContent(w http.ResponseWriter, r *http.Request) {
	if f, ok := s.file(w, r); ok {
		w.Header().Set("Content-Type", "application/jsonl")
		_, _ = w.Write(f.content)
	}
}
