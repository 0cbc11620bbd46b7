package sim

import (
	"bytes"
	"encoding/json"
)

// Structured output. A request whose response_format is
// {"type":"json_object"} gets {"reply":"llmsim reply <hex>"}; one whose
// response_format is {"type":"json_schema","json_schema":{"schema":S}} gets
// a JSON value generated from S, deterministically from the messages' hash,
// so a test can predict it (ExpectedContent) and different prompts get
// different enum members. The JSON Schema subset honoured:
//
//   - type (a string, or a list: its first non-"null" entry), and when it
//     is absent: object if properties are given, array if items are.
//   - enum and const: a member picked by the hash; const as given.
//   - object: every property in properties, in the schema's order (so
//     required is always met); no additional properties.
//   - array: items; max(minItems, 1) elements, at most maxItems and at most 256.
//   - string: minLength, maxLength; format date-time, date, email, uri and uuid.
//   - integer and number: minimum, maximum, exclusiveMinimum,
//     exclusiveMaximum (the value is strictly inside the range when it
//     has room; default ranges 0..100 and 0..1).
//   - boolean and null.
//   - anyOf and oneOf: the first branch. $ref: "#" and local JSON
//     pointers such as "#/$defs/Ticket".
//
// Anything else (pattern, multipleOf, allOf, uniqueItems, minProperties,
// if/then, remote refs) is ignored and the value is of the schema's type
// only. Recursion deeper than maxSchemaDepth ends in empty objects and
// arrays; a schema that is not an object yields the json_object reply.

// responseFormat is what the simulator reads of a request's response_format.
type responseFormat struct {
	Type       string `json:"type"`
	JSONSchema *struct {
		Schema json.RawMessage `json:"schema"`
	} `json:"json_schema"`
}

// UnmarshalJSON ignores a response_format of another shape (as a plain-text
// request), rather than refusing the request over it.
func (rf *responseFormat) UnmarshalJSON(b []byte) error {
	type plain responseFormat
	var v plain
	if json.Unmarshal(b, &v) != nil {
		v = plain{}
	}
	*rf = responseFormat(v)
	return nil
}

const (
	maxSchemaDepth = 16
	maxArrayItems  = 256
)

// structuredContent is the reply to a request with response_format rf, or
// "" when rf asks for plain text.
func structuredContent(rf *responseFormat, hash uint64) string {
	if rf == nil {
		return ""
	}
	switch rf.Type {
	case "json_schema":
		if rf.JSONSchema != nil {
			var root schema
			if json.Unmarshal(rf.JSONSchema.Schema, &root) == nil && root.object {
				g := generator{root: &root, rootRaw: rf.JSONSchema.Schema}
				g.value(&root, hash, 0)
				return g.out.String()
			}
		}
		fallthrough
	case "json_object":
		b, _ := json.Marshal(map[string]string{"reply": contentFor(hash)}) // a string map: cannot fail
		return string(b)
	}
	return ""
}

// schema is one node of a JSON Schema, decoded leniently: a keyword whose
// value has an unexpected shape is ignored rather than failing the request.
type schema struct {
	object     bool // the node was a JSON object (not true/false)
	raw        map[string]json.RawMessage
	types      []string
	enum       []json.RawMessage
	constant   json.RawMessage
	props      []namedSchema // in document order
	items      *schema
	anyOf      []*schema
	ref        string
	format     string
	minItems   *int
	maxItems   *int
	minLength  *int
	maxLength  *int
	min, max   *float64
	xmin, xmax *float64 // exclusive bounds
}

type namedSchema struct {
	name string
	s    *schema
}

func (s *schema) UnmarshalJSON(b []byte) error {
	*s = schema{}
	if json.Unmarshal(b, &s.raw) != nil || s.raw == nil {
		return nil // true, false or junk: no constraint this generator reads
	}
	s.object = true
	get := func(key string, dst any) bool {
		v, ok := s.raw[key]
		return ok && json.Unmarshal(v, dst) == nil
	}
	var one string
	if get("type", &one) {
		s.types = []string{one}
	} else {
		get("type", &s.types)
	}
	get("enum", &s.enum)
	if c, ok := s.raw["const"]; ok {
		s.constant = c
	}
	s.props = orderedProperties(s.raw["properties"])
	if get("items", &s.items) && !s.items.object {
		s.items = nil
	}
	if !get("anyOf", &s.anyOf) {
		get("oneOf", &s.anyOf)
	}
	get("$ref", &s.ref)
	get("format", &s.format)
	for key, dst := range map[string]**int{"minItems": &s.minItems, "maxItems": &s.maxItems,
		"minLength": &s.minLength, "maxLength": &s.maxLength} {
		get(key, dst)
	}
	for key, dst := range map[string]**float64{"minimum": &s.min, "maximum": &s.max,
		"exclusiveMinimum": &s.xmin, "exclusiveMaximum": &s.xmax} {
		get(key, dst) // draft 4's boolean exclusive bounds are ignored: values stay strictly inside anyway
	}
	return nil
}

// orderedProperties decodes a properties object keeping its key order, so
// the reply lists fields as the schema does.
func orderedProperties(raw json.RawMessage) []namedSchema {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	var props []namedSchema
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return props
		}
		name, _ := t.(string)
		s := new(schema)
		if err := dec.Decode(s); err != nil {
			return props
		}
		props = append(props, namedSchema{name, s})
	}
	return props
}
