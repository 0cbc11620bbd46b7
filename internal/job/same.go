package job

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"time"
)

// Same reports whether a and b are one submission of a job, field by
// field as a producer gives them, comparing JSON as values (key order,
// spacing and number spelling do not matter). A second message of a job
// that is Same as the stored one is a duplicate; one that is not reuses
// the job's id for another job (a conflict).
func Same(a, b Job) bool {
	return a.Model == b.Model && KindOf(a.Kind) == KindOf(b.Kind) &&
		slices.Equal(a.FallbackModels, b.FallbackModels) &&
		a.Priority == b.Priority &&
		a.MaxAttempts == b.MaxAttempts &&
		sameDeadline(a.Deadline, b.Deadline) &&
		sameJSON(a.Request, b.Request) &&
		sameJSON(nullIfEmpty(a.Metadata), nullIfEmpty(b.Metadata)) &&
		a.ReplyTo == b.ReplyTo && a.CorrelationID == b.CorrelationID &&
		a.CallbackURL == b.CallbackURL && a.ResultTopic == b.ResultTopic
}

func sameDeadline(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	// Postgres keeps microseconds.
	return a.Truncate(time.Microsecond).Equal(b.Truncate(time.Microsecond))
}

func nullIfEmpty(raw json.RawMessage) json.RawMessage {
	if len(bytes.TrimSpace(raw)) == 0 {
		return json.RawMessage("null")
	}
	return raw
}

func sameJSON(a, b json.RawMessage) bool {
	if bytes.Equal(a, b) {
		return true
	}
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}
