// Package api holds llmq's contract as documents that any language can
// read:
//
//   - openapi.yaml, the OpenAPI 3.1 description of the producer's HTTP API
//     (producer serve, internal/api): every route, status code, error shape,
//     the bearer auth, with examples. The API serves it at GET
//     /v1/openapi.yaml.
//   - schemas/job.schema.json, the JSON Schema (draft 2020-12) of the job
//     message on RabbitMQ, Kafka and POST /v1/jobs
//     (docs/design.md#job-message), schemas/status.schema.json, the
//     back-pressure document of GET /v1/status and llmq.status, and
//     schemas/result-event.schema.json, the event every path carries when
//     a job finishes (llmq.results, reply_to, webhooks). The API
//     serves them at GET /v1/schemas/{name}, where openapi.yaml's relative
//     references find them.
//
// Tests hold the documents to the code: internal/api's tests check the
// OpenAPI document against the routes the server registers and the
// status codes and bodies its handlers answer, and this package's tests
// check the job schema against the consumer's strict decoder on the table
// schemas/testdata/job_cases.json, which other readers of the message (a
// client's types) can be checked against too.
package api

import (
	"embed"
	"io/fs"
)

// Paths of the documents in FS.
const (
	OpenAPIFile      = "openapi.yaml"
	JobSchemaFile    = "schemas/job.schema.json"
	StatusSchemaFile = "schemas/status.schema.json"
	// ResultEventSchemaFile is the result event on every path
	// (docs/design.md#results).
	ResultEventSchemaFile = "schemas/result-event.schema.json"
)

//go:embed openapi.yaml schemas/*.schema.json
var files embed.FS

// FS returns the documents, read-only: OpenAPIFile, JobSchemaFile and
// StatusSchemaFile.
func FS() fs.FS { return files }

// OpenAPI returns a copy of openapi.yaml.
func OpenAPI() []byte {
	data, err := files.ReadFile(OpenAPIFile)
	if err != nil {
		panic("api: openapi.yaml is not embedded: " + err.Error()) // go:embed guarantees it
	}
	return data
}
