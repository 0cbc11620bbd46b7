package api

import (
	"io/fs"
	"net/http"

	spec "github.com/llmq/llmq/api"
)

// handleOpenAPI serves api/openapi.yaml, the description of this API.
func handleOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(spec.OpenAPI())
}

// handleSchema serves api/schemas/{name}: openapi.yaml refers to the
// schemas by relative paths, which resolve here against
// /v1/openapi.yaml.
func handleSchema(w http.ResponseWriter, r *http.Request) {
	data, err := fs.ReadFile(spec.FS(), "schemas/"+r.PathValue("name"))
	if err != nil {
		writeError(w, apiError(http.StatusNotFound, CodeNotFound, "no such schema"))
		return
	}
	w.Header().Set("Content-Type", "application/schema+json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(data)
}
