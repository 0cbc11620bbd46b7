package client

import (
	"encoding/json"
	"fmt"
	"time"
)

// ResultEventVersion is the version of the result event this package reads.
const ResultEventVersion = 1

// ResultsExchange is the RabbitMQ topic exchange of result events (routing
// key "<tenant>.<status>") and the Kafka topic of them (keyed by job id).
const ResultsExchange = "llmq.results"

// ResultEvent is what llmq sends when a job finishes, by every path: the
// llmq.results exchange or topic, a reply_to queue, a result topic and a
// webhook (api/schemas/result-event.schema.json). The same event may come
// more than once (at least once delivery): dedupe by EventID.
type ResultEvent struct {
	// Type is "job." and the status: job.succeeded, job.failed, job.dead,
	// job.cancelled.
	Type    string `json:"type"`
	Version int    `json:"version"`
	EventID string `json:"event_id"`
	// Timestamp is when the job finished.
	Timestamp time.Time `json:"timestamp"`
	// Data is the finished job, as GET /v1/jobs/{id} shows it.
	Data JobStatus `json:"data"`
}

// ParseResultEvent decodes a result event, refusing a version it does not
// know.
func ParseResultEvent(body []byte) (ResultEvent, error) {
	var ev ResultEvent
	if err := json.Unmarshal(body, &ev); err != nil {
		return ResultEvent{}, fmt.Errorf("llmq: result event: %w", err)
	}
	if ev.Version != ResultEventVersion {
		return ResultEvent{}, fmt.Errorf("llmq: result event version %d, this client reads %d", ev.Version, ResultEventVersion)
	}
	if ev.EventID == "" || ev.Data.ID == "" {
		return ResultEvent{}, fmt.Errorf("llmq: result event without event_id or job id")
	}
	return ev, nil
}
