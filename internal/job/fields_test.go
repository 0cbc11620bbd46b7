package job

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func fieldsJob(extra string) string {
	return `{"id":"f","model":"qwen-plus","request":{"messages":[{"role":"user","content":"hi"}],"max_tokens":100` + extra + `}}`
}

func TestRequestFieldRules(t *testing.T) {
	cases := []struct {
		name  string
		rules map[string]FieldRule
		extra string
		field string // "" = accepted
	}{
		{"no field", nil, ``, ""},
		{"n within the default cap", nil, `,"n":4`, ""},
		{"n over the default cap", nil, `,"n":5`, "request.n"},
		{"n a string", nil, `,"n":"3"`, "request.n"},
		{"n null", nil, `,"n":null`, ""},
		{"n allowed by config", map[string]FieldRule{"n": {Action: FieldAllow}}, `,"n":64`, ""},
		{"n capped higher by config", map[string]FieldRule{"n": {Action: FieldCap, Max: 8}}, `,"n":8`, ""},
		{"n refused by config", map[string]FieldRule{"n": {Action: FieldRefuse}}, `,"n":1`, "request.n"},
		{"config keeps the other defaults", map[string]FieldRule{"n": {Action: FieldAllow}}, `,"store":true`, "request.store"},
		{"store false", nil, `,"store":false`, ""},
		{"service_tier", nil, `,"service_tier":"priority"`, "request.service_tier"},
		{"service_tier allowed", map[string]FieldRule{"service_tier": {Action: FieldAllow}}, `,"service_tier":"priority"`, ""},
		{"enable_search", nil, `,"enable_search":true`, "request.enable_search"},
		{"search_options", nil, `,"search_options":{"forced_search":true}`, "request.search_options"},
		{"unlisted field passes", nil, `,"top_logprobs":20,"logprobs":true`, ""},
		{"unlisted field refused by config", map[string]FieldRule{"top_logprobs": {Action: FieldCap, Max: 5}}, `,"top_logprobs":6`, "request.top_logprobs"},
		{"first broken rule in name order", nil, `,"store":true,"enable_search":true`, "request.enable_search"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(fieldsJob(c.extra)), time.Now(), Limits{RequestFields: c.rules})
			if c.field == "" {
				require.NoError(t, err)
				return
			}
			var v *ValidationError
			require.ErrorAs(t, err, &v)
			assert.Equal(t, c.field, v.Field)
			assert.Contains(t, v.Error(), "limits.request_fields")
		})
	}
}

func TestMaxTokensCountsEveryChoice(t *testing.T) {
	cases := []struct {
		request     string
		choices     int
		outputLimit int
	}{
		{`{"messages":[{}],"max_tokens":100}`, 1, 100},
		{`{"messages":[{}],"max_tokens":100,"n":3}`, 3, 300},
		{`{"messages":[{}],"max_completion_tokens":50,"n":2.7}`, 2, 100},
		{`{"messages":[{}],"max_tokens":100,"n":0}`, 1, 100},
		{`{"messages":[{}],"max_tokens":100,"n":-4}`, 1, 100},
		{`{"messages":[{}],"max_tokens":100,"n":"9"}`, 1, 100},
		{`{"messages":[{}],"max_tokens":100,"n":1e9}`, maxChoices, 100 * maxChoices},
		{`{"messages":[{}],"n":4}`, 4, 0},
	}
	for _, c := range cases {
		j := Job{Request: json.RawMessage(c.request)}
		assert.Equal(t, c.choices, j.Choices(), c.request)
		assert.Equal(t, c.outputLimit, j.MaxTokens(), c.request)
	}
}

func TestFieldRuleValidate(t *testing.T) {
	assert.NoError(t, FieldRule{Action: FieldAllow}.Validate())
	assert.NoError(t, FieldRule{Action: FieldRefuse}.Validate())
	assert.NoError(t, FieldRule{Action: FieldCap, Max: 2}.Validate())
	assert.Error(t, FieldRule{Action: FieldCap}.Validate())
	assert.Error(t, FieldRule{Action: "drop"}.Validate())
	assert.Error(t, FieldRule{}.Validate())
}
