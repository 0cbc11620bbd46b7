package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	spec "github.com/llmq/llmq/api"
	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/results"
)

// The answers of the handlers are held to api/openapi.yaml in TestMain
// (contract_test.go); these tests hold the document to the server's
// registration table, its examples to its schemas, and its schemas to the
// Go types the handlers encode.

// TestOpenAPIIsServed: GET /v1/openapi.yaml serves the embedded document
// without auth, and its relative references resolve against the URL it is
// served at (GET /v1/schemas/{name}), so tools can load it from a running
// producer.
func TestOpenAPIIsServed(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.do("GET", "/v1/openapi.yaml", "", nil)
	require.Equal(t, http.StatusOK, r.Code)
	assert.Equal(t, "application/yaml", r.Header.Get("Content-Type"))
	assert.Equal(t, string(spec.OpenAPI()), string(r.Body))
	for _, name := range []string{spec.JobSchemaFile, spec.StatusSchemaFile} {
		r := h.do("GET", "/v1/"+name, "", nil)
		require.Equal(t, http.StatusOK, r.Code, name)
		assert.Equal(t, "application/schema+json", r.Header.Get("Content-Type"))
		want, err := fs.ReadFile(spec.FS(), name)
		require.NoError(t, err)
		assert.Equal(t, string(want), string(r.Body))
	}
	r = h.do("GET", "/v1/schemas/nope.schema.json", "", nil)
	require.Equal(t, http.StatusNotFound, r.Code)
	assert.Equal(t, api.CodeNotFound, r.apiError(t).Error.Code)

	client := h.http.Client()
	loader := openapi3.NewLoader()
	loader.IsExternalRefsAllowed = true
	loader.ReadFromURIFunc = func(_ *openapi3.Loader, u *url.URL) ([]byte, error) {
		if !strings.HasPrefix(u.String(), h.http.URL+"/") {
			return nil, fmt.Errorf("%s is not on the test server", u)
		}
		resp, err := client.Get(u.String())
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("GET %s: %s", u, resp.Status)
		}
		return io.ReadAll(resp.Body)
	}
	u, err := url.Parse(h.http.URL + "/v1/openapi.yaml")
	require.NoError(t, err)
	doc, err := loader.LoadFromURI(u)
	require.NoError(t, err)
	require.NoError(t, doc.Validate(context.Background()))
	assert.NotNil(t, doc.Components.Schemas["Job"].Value.Defs["submission"], "the job schema came from /v1/schemas/job.schema.json")
}

// TestOpenAPIDescribesEveryRoute: the operations of api/openapi.yaml are
// exactly the patterns the server registers (server.go, routes), but the
// catch-all "/", which the document describes under x-llmq-unmatched.
func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	t.Parallel()
	doc, err := loadOpenAPI(spec.OpenAPI())
	require.NoError(t, err)
	h := newHarness(t)
	registered := map[string]bool{}
	for _, p := range api.RoutePatterns(h.srv) {
		registered[p] = true
		if p == catchAll {
			assert.NotEmpty(t, described(doc, p), "x-llmq-unmatched describes no response of the catch-all %q", p)
			continue
		}
		assert.NotNil(t, operation(doc, p), "server.go registers %s but api/openapi.yaml has no such operation", p)
	}
	for p, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			pattern := method + " " + p
			assert.True(t, registered[pattern], "api/openapi.yaml describes %s but server.go registers no such route", pattern)
		}
	}
}

// TestOpenAPIExamplesMatchTheirSchemas: every example of a request or
// response body validates against the schema beside it.
func TestOpenAPIExamplesMatchTheirSchemas(t *testing.T) {
	t.Parallel()
	doc, err := loadOpenAPI(spec.OpenAPI())
	require.NoError(t, err)
	n := 0
	check := func(where string, content openapi3.Content) {
		for mt, media := range content {
			if media.Example != nil {
				t.Errorf("%s %s: use named examples, which this test checks", where, mt)
			}
			for name, ex := range media.Examples {
				n++
				require.NotNil(t, media.Schema, "%s %s has examples but no schema", where, mt)
				// Round-trip through JSON: the validator wants JSON's types.
				data, err := json.Marshal(ex.Value.Value)
				require.NoError(t, err)
				var v any
				require.NoError(t, json.Unmarshal(data, &v))
				if err := media.Schema.Value.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
					t.Errorf("%s %s, example %q does not match its schema: %v", where, mt, name, err)
				}
			}
		}
	}
	for p, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			where := method + " " + p
			if op.RequestBody != nil {
				check(where+" request", op.RequestBody.Value.Content)
			}
			for status, resp := range op.Responses.Map() {
				check(where+" "+status, resp.Value.Content)
			}
		}
	}
	for name, resp := range doc.Components.Responses {
		check("components/responses/"+name, resp.Value.Content)
	}
	assert.Greater(t, n, 30, "examples checked")
}

// TestOpenAPISchemasNameEveryField fails when a field is added to a
// response type or to its schema on one side only: the properties of each
// schema are the JSON names of the Go type the handlers encode, and the
// required ones are those the type always writes (no omitempty).
func TestOpenAPISchemasNameEveryField(t *testing.T) {
	t.Parallel()
	doc, err := loadOpenAPI(spec.OpenAPI())
	require.NoError(t, err)
	for schema, typ := range map[string]reflect.Type{
		"SubmitResponse":         reflect.TypeFor[api.SubmitResponse](),
		"BatchResponse":          reflect.TypeFor[api.BatchResponse](),
		"BatchItem":              reflect.TypeFor[api.BatchItem](),
		"JobView":                reflect.TypeFor[api.JobView](),
		"Usage":                  reflect.TypeFor[results.Usage](),
		"JobError":               reflect.TypeFor[results.Error](),
		"WebhookState":           reflect.TypeFor[results.WebhookState](),
		"ListResponse":           reflect.TypeFor[api.ListResponse](),
		"FeedResponse":           reflect.TypeFor[api.FeedResponse](),
		"DeadLetter":             reflect.TypeFor[api.DeadLetterView](),
		"DLQResponse":            reflect.TypeFor[api.DLQResponse](),
		"ReplayResponse":         reflect.TypeFor[api.ReplayResponse](),
		"Attempt":                reflect.TypeFor[results.Attempt](),
		"ReplayFilteredResponse": reflect.TypeFor[api.ReplayFilteredResponse](),
		"ReplayFailure":          reflect.TypeFor[api.ReplayFailure](),
		"ErrorBody":              reflect.TypeFor[api.ErrorBody](),
		"Status":                 reflect.TypeFor[api.Status](),
		"UsageResponse":          reflect.TypeFor[api.UsageResponse](),
		"UsageGroup":             reflect.TypeFor[api.UsageGroup](),
		"UsageCounts":            reflect.TypeFor[api.UsageCounts](),
	} {
		ref := doc.Components.Schemas[schema]
		require.NotNil(t, ref, "components/schemas/%s", schema)
		props, always := jsonFields(typ)
		var described []string
		for name := range ref.Value.Properties {
			described = append(described, name)
		}
		for _, s := range [][]string{props, always, described} {
			slices.Sort(s)
		}
		required := slices.Sorted(slices.Values(ref.Value.Required))
		assert.Equal(t, props, described, "%s: the JSON fields of %s and the schema's properties", schema, typ)
		assert.Equal(t, always, required, "%s: the fields %s always writes and the schema's required", schema, typ)
	}

	var codes []any
	for _, c := range []string{api.CodeUnauthorized, api.CodeForbidden, api.CodeInvalidJob, api.CodeInvalidRequest, api.CodeNotFound, api.CodeConflict,
		api.CodePayloadTooLarge, api.CodeBackpressure, api.CodeBrokerUnavailable, api.CodeStoreUnavailable, api.CodeInternal} {
		codes = append(codes, c)
	}
	assert.ElementsMatch(t, codes, doc.Components.Schemas["ErrorBody"].Value.Properties["code"].Value.Enum, "the error codes of errors.go")
	assert.ElementsMatch(t, []any{api.StateOK, api.StateThrottled, api.StateFull}, doc.Components.Schemas["Status"].Value.Properties["state"].Value.Enum)
}

// jsonFields lists the JSON members encoding/json writes for typ, and
// those it always writes (no omitempty); an untagged embedded struct's
// fields are its own, as encoding/json flattens them.
func jsonFields(typ reflect.Type) (props, always []string) {
	for i := range typ.NumField() {
		f := typ.Field(i)
		tag := f.Tag.Get("json")
		if f.Anonymous && tag == "" && f.Type.Kind() == reflect.Struct {
			p, a := jsonFields(f.Type)
			props, always = append(props, p...), append(always, a...)
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if !f.IsExported() || name == "-" { // encoding/json leaves them out
			continue
		}
		props = append(props, name)
		if !strings.Contains(opts, "omitempty") {
			always = append(always, name)
		}
	}
	return props, always
}

// TestStatusDocumentMatchesItsSchema: the status published on
// llmq.status, in each state and before the first measurement, matches
// api/schemas/status.schema.json (GET /v1/status is checked with every
// other answer in TestMain).
func TestStatusDocumentMatchesItsSchema(t *testing.T) {
	t.Parallel()
	doc, err := loadOpenAPI(spec.OpenAPI())
	require.NoError(t, err)
	schema := doc.Components.Schemas["Status"].Value
	h := newHarness(t, withLimits(1, 3))
	valid := func(what string, body []byte) {
		t.Helper()
		var v any
		require.NoError(t, json.Unmarshal(body, &v))
		assert.NoError(t, schema.VisitJSON(v, openapi3.EnableJSONSchema2020()), "%s: %s", what, body)
	}
	initial, err := json.Marshal(h.srv.Status())
	require.NoError(t, err)
	valid("before the first measurement", initial)
	h.refresh()
	for i, want := range []string{api.StateOK, api.StateThrottled, api.StateFull} {
		require.Equal(t, http.StatusAccepted, h.submit(keyAcme, fmt.Sprintf("s%d", i)).Code)
		require.Equal(t, want, h.refresh().State)
	}
	published := h.mem.Statuses()
	require.NotEmpty(t, published)
	for _, body := range published {
		valid("published on llmq.status", body)
	}
	valid("GET /v1/status", h.do("GET", "/v1/status", keyAcme, nil).Body)

	var bad map[string]any
	require.NoError(t, json.Unmarshal(published[len(published)-1], &bad))
	delete(bad["backlog"].(map[string]any), "low")
	assert.Error(t, schema.VisitJSON(bad, openapi3.EnableJSONSchema2020()), "a lane missing from the backlog")
}
