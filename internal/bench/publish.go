package bench

import (
	"encoding/json"
	"strings"
	"sync"
	"time"
)

// publishLog remembers when each job was published.
type publishLog struct {
	mu sync.Mutex
	at map[string]time.Time
}

func newPublishLog() *publishLog { return &publishLog{at: map[string]time.Time{}} }

func (p *publishLog) add(id string, t time.Time) {
	p.mu.Lock()
	p.at[id] = t
	p.mu.Unlock()
}

func (p *publishLog) snapshot() map[string]time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]time.Time, len(p.at))
	for k, v := range p.at {
		out[k] = v
	}
	return out
}

// jobBody is one job message: a unique prompt of about InputChars
// characters (so the simulator's output draw differs per job).
func jobBody(id string, sc Scenario, maxAttempts int) []byte {
	var b strings.Builder
	b.WriteString(jobMarker + id + "] Summarise this support ticket: ")
	filler := "the customer reports that the export job stalls at ninety percent and retries do not help. "
	for b.Len() < sc.InputChars {
		b.WriteString(filler)
	}
	content := b.String()
	if len(content) > max(sc.InputChars, len(jobMarker)+len(id)+2) {
		content = content[:max(sc.InputChars, len(jobMarker)+len(id)+2)]
	}
	j := map[string]any{"id": id, "model": Model, "max_attempts": maxAttempts,
		"request": map[string]any{"messages": []map[string]string{{"role": "user", "content": content}}, "max_tokens": sc.MaxTokens}}
	body, _ := json.Marshal(j)
	return body
}
