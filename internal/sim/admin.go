package sim

import (
	"encoding/json"
	"net/http"
)

// handlePutModel is PUT /admin/models/{model}: the body is a ModelConfig in
// JSON (same keys as YAML, durations as "10s"); it replaces the model's
// settings (or adds the model) and answers with the settings in force.
func (s *Simulator) handlePutModel(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("model")
	var m ModelConfig
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_parameter_error", "model config: "+err.Error())
		return
	}
	if err := s.SetModel(name, m); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_parameter_error", err.Error())
		return
	}
	cfg, _ := s.Model(name)
	writeJSON(w, http.StatusOK, cfg)
}

// handleGetModels is GET /admin/models: every model's settings in force.
func (s *Simulator) handleGetModels(w http.ResponseWriter, _ *http.Request) {
	s.mu.RLock()
	names := make([]string, 0, len(s.models))
	for n := range s.models {
		names = append(names, n)
	}
	s.mu.RUnlock()
	out := make(map[string]ModelConfig, len(names))
	for _, n := range names {
		if cfg, ok := s.Model(n); ok {
			out[n] = cfg
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"models": out})
}

// handleStats is GET /admin/stats: Stats as JSON; ?series=0 leaves out the
// per-second series.
func (s *Simulator) handleStats(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.stats(r.URL.Query().Get("series") != "0"))
}
