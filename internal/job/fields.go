package job

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
)

// Actions of a FieldRule.
const (
	// FieldAllow passes the field to the provider as is.
	FieldAllow = "allow"
	// FieldRefuse refuses a job that turns the field on: any value but
	// null or false (a job that wants the provider's default leaves the
	// field out).
	FieldRefuse = "refuse"
	// FieldCap refuses a job whose value is not a number at most Max
	// (null passes). A value above Max is refused, never lowered: the
	// caller would get fewer choices than it asked for without knowing.
	FieldCap = "cap"
)

// FieldRule is what llmq does with one request field that multiplies a
// call's cost (config limits.request_fields).
type FieldRule struct {
	Action string
	Max    float64
}

// Validate reports a rule that cannot be applied.
func (r FieldRule) Validate() error {
	switch r.Action {
	case FieldAllow, FieldRefuse:
		return nil
	case FieldCap:
		if r.Max <= 0 {
			return fmt.Errorf("cap needs a max above 0")
		}
		return nil
	}
	return fmt.Errorf("action %q is not one of allow, refuse, cap", r.Action)
}

// DefaultRequestFields are the rules that apply to a field the
// configuration does not name (docs/design.md#request-fields); a field
// that neither names passes as today.
//   - n: each choice is a full completion billed as output, so n
//     multiplies the output tokens. Capped at 4, the most Qwen (DashScope)
//     accepts; the token estimate counts it (MaxTokens).
//   - service_tier: a tier such as "priority" is billed above the
//     standard price; the account's tier is the operator's choice.
//   - store: keeps the completion at the provider, outside llmq's
//     retention, for uses billed apart.
//   - enable_search, search_options (DashScope), web_search_options
//     (OpenAI): each search is billed, and its results are injected into
//     the prompt as thousands of input tokens.
//
// logprobs and top_logprobs are not listed: they enlarge the response that
// llmq stores, not what the provider bills.
var DefaultRequestFields = map[string]FieldRule{
	"n":                  {Action: FieldCap, Max: 4},
	"service_tier":       {Action: FieldRefuse},
	"store":              {Action: FieldRefuse},
	"enable_search":      {Action: FieldRefuse},
	"search_options":     {Action: FieldRefuse},
	"web_search_options": {Action: FieldRefuse},
}

// requestFields are the rules in force: DefaultRequestFields overridden
// field by field by the configured ones.
func (l Limits) requestFields() map[string]FieldRule {
	if len(l.RequestFields) == 0 {
		return DefaultRequestFields
	}
	out := make(map[string]FieldRule, len(DefaultRequestFields)+len(l.RequestFields))
	for k, v := range DefaultRequestFields {
		out[k] = v
	}
	for k, v := range l.RequestFields {
		out[k] = v
	}
	return out
}

// checkRequestFields applies the rules to the request's top-level fields,
// in name order so the first broken rule is always the same one.
func checkRequestFields(fields map[string]json.RawMessage, rules map[string]FieldRule) error {
	names := make([]string, 0, len(rules))
	for name := range rules {
		if _, ok := fields[name]; ok {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		raw, rule := bytes.TrimSpace(fields[name]), rules[name]
		switch rule.Action {
		case FieldRefuse:
			if turnedOn(raw) {
				return invalid("request."+name, "is refused by this llmq (limits.request_fields): it multiplies the call's cost")
			}
		case FieldCap:
			if string(raw) == "null" {
				continue
			}
			if v, ok := number(raw); !ok || v > rule.Max {
				return invalid("request."+name, "must be a number at most %s (limits.request_fields)",
					strconv.FormatFloat(rule.Max, 'f', -1, 64))
			}
		}
	}
	return nil
}

// turnedOn reports whether a field's value asks for something: anything
// but null and false.
func turnedOn(raw []byte) bool {
	s := string(raw)
	return s != "" && s != "null" && s != "false"
}

// number reads a JSON number (not a string holding one).
func number(raw []byte) (float64, bool) {
	if len(raw) == 0 || (raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) {
		return 0, false
	}
	v, err := strconv.ParseFloat(string(raw), 64)
	return v, err == nil && !math.IsInf(v, 0)
}

// Choices is the number of completions the request asks for (its n): at
// least 1, whatever n says, so that n can only raise what is booked.
func (j *Job) Choices() int {
	req, err := readChatRequest(j.Request)
	if err != nil {
		return 1
	}
	return req.choices()
}

// maxChoices bounds what n can multiply, so that an allowed, uncapped n
// cannot overflow a booking.
const maxChoices = 128

func (r chatRequest) choices() int {
	v, ok := number(bytes.TrimSpace(r.Fields["n"]))
	if !ok || v < 1 {
		return 1
	}
	return int(min(math.Floor(v), maxChoices))
}
