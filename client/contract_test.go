package client_test

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/job"
)

// The client's Job mirrors the wire contract; these tests hold it to the
// same documents the server is held to (api/schemas), so the three readers
// of a job message — the schema, the consumer's decoder and these types —
// cannot drift apart.

// TestJobTypeNamesEveryFieldOfTheSchema: client.Job has exactly the
// fields of the job schema, by their JSON names.
func TestJobTypeNamesEveryFieldOfTheSchema(t *testing.T) {
	var schema struct {
		Defs struct {
			Submission struct {
				Properties map[string]json.RawMessage `json:"properties"`
			} `json:"submission"`
		} `json:"$defs"`
	}
	data, err := os.ReadFile("../api/schemas/job.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &schema); err != nil {
		t.Fatal(err)
	}
	var inSchema, inType []string
	for name := range schema.Defs.Submission.Properties {
		inSchema = append(inSchema, name)
	}
	rt := reflect.TypeFor[client.Job]()
	for i := range rt.NumField() {
		name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			inType = append(inType, name)
		}
	}
	slices.Sort(inSchema)
	slices.Sort(inType)
	if !slices.Equal(inSchema, inType) {
		t.Fatalf("client.Job fields %v, job schema properties %v", inType, inSchema)
	}
}

// TestJobTypeCarriesEveryValidCase: every message the agreement table
// (api/schemas/testdata/job_cases.json) calls valid decodes into
// client.Job with no field left over, and what the client sends back out
// is the same job to the consumer's decoder; a message with a field the
// contract does not have does not fit the type.
func TestJobTypeCarriesEveryValidCase(t *testing.T) {
	var table struct {
		Cases []struct {
			Name    string          `json:"name"`
			Valid   bool            `json:"valid"`
			Field   string          `json:"field"`
			Message json.RawMessage `json:"message"`
			Raw     *string         `json:"raw"`
			Decoder *struct {
				Valid bool `json:"valid"`
			} `json:"decoder"`
		} `json:"cases"`
	}
	data, err := os.ReadFile("../api/schemas/testdata/job_cases.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &table); err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, c := range table.Cases {
		body := []byte(c.Message)
		if c.Raw != nil {
			body = []byte(*c.Raw)
		}
		var j client.Job
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		decodeErr := dec.Decode(&j)
		if !c.Valid {
			if c.Field != "" && !strings.Contains(c.Field, ".") && !strings.Contains(c.Field, "[") && decodeErr == nil && !isClientField(c.Field) {
				t.Errorf("%s: the client's type took a message with field %q, which the contract does not have", c.Name, c.Field)
			}
			continue
		}
		if decodeErr != nil {
			if c.Decoder != nil && !c.Decoder.Valid {
				continue // the decoder refuses it too: a difference the table pins
			}
			t.Errorf("%s: valid by the schema, but the client's type refuses it: %v", c.Name, decodeErr)
			continue
		}
		out, err := json.Marshal(j)
		if err != nil {
			t.Errorf("%s: encode: %v", c.Name, err)
			continue
		}
		want, err := job.ParseQueued(body, "", job.Limits{})
		if err != nil {
			continue // a case the decoder knowingly differs on (pinned in the table)
		}
		got, err := job.ParseQueued(out, "", job.Limits{})
		if err != nil {
			t.Errorf("%s: what the client sends is refused by the consumer: %v", c.Name, err)
			continue
		}
		if got.ID != want.ID || got.Tenant != want.Tenant || got.Model != want.Model || got.Priority != want.Priority ||
			got.MaxAttempts != want.MaxAttempts || !slices.Equal(got.FallbackModels, want.FallbackModels) ||
			!jsonEqual(got.Request, want.Request) || !jsonEqual(nullIfEmpty(got.Metadata), nullIfEmpty(want.Metadata)) ||
			(got.Deadline == nil) != (want.Deadline == nil) || (got.Deadline != nil && !got.Deadline.Equal(*want.Deadline)) {
			t.Errorf("%s: the client changed the job on its way through:\n got  %+v\n want %+v", c.Name, got, want)
		}
		checked++
	}
	if checked < 10 {
		t.Fatalf("only %d valid cases checked; the table has lost its cases", checked)
	}
}

// isClientField reports whether name is one of client.Job's JSON names, in
// any case: decoding into a Go struct matches keys case-insensitively, and
// the client only ever writes its own exact names (the test above).
func isClientField(name string) bool {
	rt := reflect.TypeFor[client.Job]()
	for i := range rt.NumField() {
		if n, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ","); strings.EqualFold(n, name) {
			return true
		}
	}
	return false
}

func nullIfEmpty(raw json.RawMessage) json.RawMessage {
	if len(bytes.TrimSpace(raw)) == 0 {
		return json.RawMessage("null")
	}
	return raw
}

func jsonEqual(a, b json.RawMessage) bool {
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return bytes.Equal(a, b)
	}
	return reflect.DeepEqual(va, vb)
}
