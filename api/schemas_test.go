package api_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/api"
	"github.com/llmq/llmq/internal/job"
)

// jobCasesFile is the agreement table of the job message, shared with every
// other reader of the message that wants to be held to it.
const jobCasesFile = "schemas/testdata/job_cases.json"

// jobCase is one row of jobCasesFile (its "description" says what each
// member means).
type jobCase struct {
	Name    string          `json:"name"`
	Valid   bool            `json:"valid"`
	Field   string          `json:"field"`
	Message json.RawMessage `json:"message"`
	Raw     *string         `json:"raw"`
	Decoder *struct {
		Valid bool   `json:"valid"`
		Field string `json:"field"`
		Why   string `json:"why"`
	} `json:"decoder"`
}

// body is the case's message as it travels.
func (c jobCase) body() []byte {
	if c.Raw != nil {
		return []byte(*c.Raw)
	}
	return c.Message
}

func loadJobCases(t *testing.T) []jobCase {
	t.Helper()
	data, err := os.ReadFile(jobCasesFile)
	require.NoError(t, err)
	var table struct {
		Description string    `json:"description"`
		Cases       []jobCase `json:"cases"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&table), "decode %s", jobCasesFile)
	return table.Cases
}

// compileSchema compiles one of the package's schemas as served (from
// api.FS), asserting formats: draft 2020-12 treats "format" as an
// annotation unless the validator is told otherwise, and the deadline's
// calendar rules (no February 30) live only in format "date-time".
func compileSchema(t *testing.T, name string) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	files, err := fs.Glob(api.FS(), "schemas/*.schema.json")
	require.NoError(t, err)
	for _, f := range files {
		data, err := fs.ReadFile(api.FS(), f)
		require.NoError(t, err)
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
		require.NoError(t, err, f)
		require.NoError(t, c.AddResource(schemaURL(f), doc))
	}
	sch, err := c.Compile(schemaURL(name))
	require.NoError(t, err, name)
	return sch
}

func schemaURL(name string) string { return "https://llmq.invalid/" + name }

// validate reports whether the schema accepts body. A body that is not one
// JSON value (empty, malformed, trailing data) is refused: a JSON Schema
// judges a JSON document, and that is none.
func validate(sch *jsonschema.Schema, body []byte) error {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("not one JSON value: %w", err)
	}
	return sch.Validate(doc)
}

// TestJobSchemaAgreesWithTheDecoder holds api/schemas/job.schema.json and
// the consumer's strict decoder (job.ParseQueued with the default limits:
// Decode, Normalize and every rule of Validate but the one that a deadline
// lie in the future) to the same verdict on every case of the table, and
// to the same field for a refused message. A rule added on one side only
// fails the cases that exercise it; a case on which they knowingly differ
// records the decoder's verdict and why, and fails once they agree.
func TestJobSchemaAgreesWithTheDecoder(t *testing.T) {
	sch := compileSchema(t, api.JobSchemaFile)
	cases := loadJobCases(t)
	require.GreaterOrEqual(t, len(cases), 25)
	seen := map[string]bool{}
	for _, c := range cases {
		require.False(t, seen[c.Name], "case %q repeats", c.Name)
		seen[c.Name] = true
		t.Run(c.Name, func(t *testing.T) {
			body := c.body()
			schemaErr := validate(sch, body)
			if c.Valid {
				assert.NoError(t, schemaErr, "the schema refuses a message the table calls valid:\n%s", body)
			} else {
				assert.Error(t, schemaErr, "the schema accepts a message the table calls invalid:\n%s", body)
				if schemaErr != nil && !schemaNames(body, schemaErr, c.Field) {
					t.Errorf("the schema refuses it, but not at %q:\n%v", c.Field, schemaErr)
				}
			}

			wantValid, wantField := c.Valid, c.Field
			if c.Decoder != nil {
				require.True(t, c.Decoder.Valid != c.Valid || c.Decoder.Field != c.Field, "a decoder entry records a disagreement")
				require.NotEmpty(t, c.Decoder.Why)
				wantValid, wantField = c.Decoder.Valid, c.Decoder.Field
			}
			_, err := job.ParseQueued(body, "", job.Limits{})
			if wantValid {
				assert.NoError(t, err, "the decoder refuses it:\n%s", body)
				return
			}
			var v *job.ValidationError
			if assert.ErrorAs(t, err, &v, "the decoder accepts it:\n%s", body) {
				assert.Equal(t, wantField, v.Field, "the decoder's error names another field: %v", err)
			}
		})
	}
}

// schemaNames reports whether the schema's error is about field (the
// decoder's name for it, such as "request.messages[0]"): an error at the
// field itself, or at its parent naming it as missing or unknown. It is
// not asked when field is "" or its parent is not in the message (a null
// document has no "id" to point at).
func schemaNames(body []byte, err error, field string) bool {
	if field == "" || !fieldParentExists(body, field) {
		return true
	}
	verr, ok := err.(*jsonschema.ValidationError)
	if !ok {
		return false
	}
	toks := strings.Split(pointerOf(field), "/")[1:]
	parent, last := toks[:len(toks)-1], toks[len(toks)-1]
	var about func(e *jsonschema.ValidationError) bool
	about = func(e *jsonschema.ValidationError) bool {
		switch k := e.ErrorKind.(type) {
		case *kind.Required:
			if slices.Equal(e.InstanceLocation, parent) && slices.Contains(k.Missing, last) {
				return true
			}
		case *kind.AdditionalProperties:
			if slices.Equal(e.InstanceLocation, parent) && slices.Contains(k.Properties, last) {
				return true
			}
		default:
			if slices.Equal(e.InstanceLocation, toks) {
				return true
			}
		}
		return slices.ContainsFunc(e.Causes, about)
	}
	return about(verr)
}

// pointerOf turns a decoder field ("fallback_models[1]") into a JSON
// pointer ("/fallback_models/1").
func pointerOf(field string) string {
	r := strings.NewReplacer(".", "/", "[", "/", "]", "")
	return "/" + r.Replace(field)
}

func fieldParentExists(body []byte, field string) bool {
	var v any
	if json.Unmarshal(body, &v) != nil {
		return false
	}
	toks := strings.Split(pointerOf(field), "/")[1:]
	for _, tok := range toks[:len(toks)-1] {
		switch x := v.(type) {
		case map[string]any:
			v = x[tok]
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i >= len(x) {
				return false
			}
			v = x[i]
		default:
			return false
		}
	}
	switch v.(type) {
	case map[string]any, []any:
		return true
	}
	return false
}

// TestJobSchemaCannotSay pins the rules of the decoder that a JSON Schema
// cannot express, so they are excluded from the agreement table on
// purpose: a schema judges the parsed JSON value, not the bytes that
// carry it. Should the schema ever refuse these, this test says so.
func TestJobSchemaCannotSay(t *testing.T) {
	sch := compileSchema(t, api.JobSchemaFile)
	minimal := func(metadata string) []byte {
		return []byte(`{"id":"t-1","model":"qwen-plus","request":{"messages":[{}]},"metadata":{"pad":"` + metadata + `"}}`)
	}
	for _, tc := range []struct {
		name, why string
		body      []byte
	}{
		{"payload over 1 MiB", "the size limit (limits.max_payload_bytes) applies to the encoded message", minimal(strings.Repeat("x", 1<<20))},
		{"invalid UTF-8", "JSON parsers replace invalid UTF-8 with U+FFFD before a schema sees the value", minimal("\xff\xfe")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.NoError(t, validate(sch, tc.body), "the schema now refuses it (%s): move the case into %s", tc.why, jobCasesFile)
			_, err := job.ParseQueued(tc.body, "", job.Limits{})
			assert.True(t, job.IsValidation(err), "the decoder accepts it: %v", err)
		})
	}
}

// TestJobSchemaNamesEveryField fails when a field or a limit is added or
// changed on one side only: the properties of the schema are the JSON
// names of job.Job, and its bounds are the package's constants.
func TestJobSchemaNamesEveryField(t *testing.T) {
	var doc struct {
		Required []string `json:"required"`
		Defs     struct {
			Submission struct {
				Required   []string                   `json:"required"`
				Properties map[string]json.RawMessage `json:"properties"`
			} `json:"submission"`
			OutputTokens struct {
				Maximum int `json:"maximum"`
			} `json:"output_tokens"`
		} `json:"$defs"`
	}
	data, err := fs.ReadFile(api.FS(), api.JobSchemaFile)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &doc))
	sub := doc.Defs.Submission

	goFields := jsonNames(reflect.TypeFor[job.Job]())
	var schemaFields []string
	for name := range sub.Properties {
		schemaFields = append(schemaFields, name)
	}
	slices.Sort(schemaFields)
	assert.Equal(t, goFields, schemaFields, "job.Job's JSON fields and job.schema.json's properties")
	assert.ElementsMatch(t, []string{"id"}, doc.Required, "a queued message needs an id")
	assert.ElementsMatch(t, []string{"model", "request"}, sub.Required)

	var prop struct {
		Enum    []any `json:"enum"`
		Maximum int   `json:"maximum"`
	}
	require.NoError(t, json.Unmarshal(sub.Properties["max_attempts"], &prop))
	assert.Equal(t, job.MaxAttemptsLimit, prop.Maximum, "max_attempts")
	assert.Equal(t, job.Limits{}.WithDefaults().MaxOutputTokens, doc.Defs.OutputTokens.Maximum, "the default output cap")
	require.NoError(t, json.Unmarshal(sub.Properties["priority"], &prop))
	var lanes []any
	for _, p := range job.Priorities {
		lanes = append(lanes, string(p))
	}
	assert.Equal(t, append(lanes, "", nil), prop.Enum, "priority: the lanes, or empty for the default")
}
