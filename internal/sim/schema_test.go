package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"
)

const triageSchema = `{"type":"object","additionalProperties":false,
	"required":["category","urgency","summary"],
	"properties":{
		"category":{"type":"string","enum":["billing","bug","account","feature_request","other"]},
		"urgency":{"type":"string","enum":["low","medium","high"]},
		"summary":{"type":"string","maxLength":200}}}`

func schemaFormat(schema string) string {
	return `,"response_format":{"type":"json_schema","json_schema":{"name":"t","strict":true,"schema":` + schema + `}}`
}

// Every schema of the supported subset gets a reply that a real JSON Schema
// validator accepts; want, when set, is the exact reply.
func TestSchemaRepliesValidate(t *testing.T) {
	for _, tc := range []struct {
		name, schema, want string
	}{
		{name: "triage", schema: triageSchema},
		{name: "integer range", schema: `{"type":"integer","minimum":3,"maximum":7}`},
		{name: "integer single value", schema: `{"type":"integer","minimum":5,"maximum":5}`, want: `5`},
		{name: "integer exclusive", schema: `{"type":"integer","exclusiveMinimum":4,"exclusiveMaximum":6}`, want: `5`},
		{name: "integer only a maximum", schema: `{"type":"integer","maximum":-1000}`},
		{name: "number unit interval", schema: `{"type":"number","minimum":0,"maximum":1}`},
		{name: "number exclusive narrow", schema: `{"type":"number","exclusiveMinimum":0.1,"exclusiveMaximum":0.1001}`},
		{name: "number only a minimum", schema: `{"type":"number","minimum":1e9}`},
		{name: "string lengths", schema: `{"type":"string","minLength":40,"maxLength":45}`},
		{name: "string short", schema: `{"type":"string","maxLength":3}`},
		{name: "formats", schema: `{"type":"object","properties":{
			"at":{"type":"string","format":"date-time"},"on":{"type":"string","format":"date"},
			"mail":{"type":"string","format":"email"},"link":{"type":"string","format":"uri"},
			"id":{"type":"string","format":"uuid"}}}`},
		{name: "boolean and null", schema: `{"type":"object","properties":{"b":{"type":"boolean"},"n":{"type":"null"}}}`},
		{name: "const", schema: `{"const":{"fixed":[1,2]}}`, want: `{"fixed":[1,2]}`},
		{name: "array bounds", schema: `{"type":"array","minItems":3,"maxItems":4,
			"items":{"type":"object","required":["tag"],"properties":{"tag":{"enum":["a","b","c"]}}}}`},
		{name: "array at most zero", schema: `{"type":"array","maxItems":0,"items":{"type":"string"}}`, want: `[]`},
		{name: "nullable type list", schema: `{"type":["null","string"],"maxLength":5}`},
		{name: "anyOf first branch", schema: `{"anyOf":[{"type":"integer","minimum":1},{"type":"null"}]}`},
		{name: "refs to defs", schema: `{"type":"object","required":["t"],"properties":{"t":{"$ref":"#/$defs/Ticket"}},
			"$defs":{"Ticket":{"type":"object","required":["prio"],"properties":{"prio":{"$ref":"#/definitions/Prio"}}}},
			"definitions":{"Prio":{"enum":[1,2,3]}}}`},
		{name: "recursion ends", schema: `{"type":"object","properties":{"name":{"type":"string"},
			"children":{"type":"array","items":{"$ref":"#"}}}}`},
		{name: "inferred object and array", schema: `{"properties":{"xs":{"items":{"type":"integer"}}}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := jsonschema.NewCompiler()
			c.AssertFormat()
			doc, err := jsonschema.UnmarshalJSON(strings.NewReader(tc.schema))
			require.NoError(t, err)
			require.NoError(t, c.AddResource("https://llmq.invalid/s.json", doc))
			sch, err := c.Compile("https://llmq.invalid/s.json")
			require.NoError(t, err)
			// Several prompts, so enum picks and ranges are exercised.
			for i := range 20 {
				body := chatBody("m", fmt.Sprintf("ticket %d", i), schemaFormat(tc.schema))
				got := ExpectedContent([]byte(body))
				v, err := jsonschema.UnmarshalJSON(strings.NewReader(got))
				require.NoError(t, err, "reply is not JSON: %s", got)
				require.NoError(t, sch.Validate(v), "reply %s", got)
				if tc.want != "" {
					require.Equal(t, tc.want, got)
				}
			}
		})
	}
}

// The reply lists properties in the schema's order, and different prompts
// get different enum members: a triage demo shows a spread of categories.
func TestSchemaReplyOrderAndSpread(t *testing.T) {
	categories := map[string]bool{}
	for i := range 30 {
		got := ExpectedContent([]byte(chatBody("m", fmt.Sprintf("ticket %d", i), schemaFormat(triageSchema))))
		require.Regexp(t, `^\{"category":"[a-z_]+","urgency":"[a-z]+","summary":"llmsim [0-9a-f]{8}"\}$`, got)
		var v struct{ Category string }
		require.NoError(t, json.Unmarshal([]byte(got), &v))
		categories[v.Category] = true
	}
	require.Len(t, categories, 5, "30 prompts should pick every one of 5 categories")
}

// Outside the subset the reply is still JSON of the right kind.
func TestSchemaFallbacks(t *testing.T) {
	body := func(format string) []byte { return []byte(chatBody("m", "Hello", format)) }
	plain := ExpectedContent(body(""))
	for _, tc := range []struct{ name, format, want string }{
		{"json_object", `,"response_format":{"type":"json_object"}`, `{"reply":"` + plain + `"}`},
		{"schema not an object", schemaFormat(`true`), `{"reply":"` + plain + `"}`},
		{"json_schema without schema", `,"response_format":{"type":"json_schema","json_schema":{"name":"x"}}`, `{"reply":"` + plain + `"}`},
		{"text", `,"response_format":{"type":"text"}`, plain},
		{"response_format of another shape", `,"response_format":"json"`, plain},
		{"unsupported keyword ignored", schemaFormat(`{"type":"string","pattern":"^[0-9]+$"}`), `"llmsim `},
		{"unresolvable ref", schemaFormat(`{"$ref":"https://example.com/s.json"}`), `"llmsim `},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ExpectedContent(body(tc.format))
			require.True(t, strings.HasPrefix(got, tc.want), "got %s, want %s…", got, tc.want)
			require.True(t, json.Valid([]byte(got)) || tc.want == plain, got)
		})
	}
}

// The simulator serves the structured reply, streamed or not.
func TestSchemaReplyServed(t *testing.T) {
	s := newSim(t, oneModel(ModelConfig{}))
	for _, stream := range []string{"", `,"stream":true`} {
		body := chatBody("m", "Refund my order", schemaFormat(triageSchema)+stream)
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)))
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		want := ExpectedContent([]byte(body))
		if stream == "" {
			var c completion
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &c))
			require.Equal(t, want, c.Choices[0].Message.Content)
			continue
		}
		var content strings.Builder
		for _, line := range strings.Split(rec.Body.String(), "\n") {
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok || data == "[DONE]" {
				continue
			}
			var c completion
			require.NoError(t, json.Unmarshal([]byte(data), &c))
			if len(c.Choices) > 0 && c.Choices[0].Delta != nil {
				content.WriteString(c.Choices[0].Delta.Content)
			}
		}
		require.Equal(t, want, content.String())
	}
}
