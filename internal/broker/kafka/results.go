package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/llmq/llmq/internal/broker"
)

var _ broker.ResultPublisher = (*Publisher)(nil)

// resultTopics remembers the result topics of jobs (result_topic) already
// created, so each costs one CreateTopics, on its first event.
type resultTopics struct {
	mu    sync.Mutex
	known map[string]bool
}

// PublishResults writes each event to the topic llmq.results (key = job
// id, header event_id) and, when the job named one, to its result topic,
// in one batch, and returns once all in-sync replicas have them all. A
// result topic is created on its first event if it does not exist: the
// operator allowed its name (tenants.<t>.result_topics), and Kafka's
// auto-creation may be off.
func (p *Publisher) PublishResults(ctx context.Context, msgs []broker.ResultMessage) ([]int, error) {
	if p.closed.Load() {
		return nil, broker.ErrClosed
	}
	records := make([]kafkago.Message, 0, len(msgs))
	var extra []string
	for _, m := range msgs {
		rec := kafkago.Message{Topic: p.cfg.ResultsTopic(), Key: []byte(m.JobID), Value: m.Body,
			Headers: []kafkago.Header{{Key: "event_id", Value: []byte(m.EventID)}, {Key: "type", Value: []byte(m.Type)},
				{Key: "tenant", Value: []byte(m.Tenant)}}}
		records = append(records, rec)
		if m.Topic != "" {
			rec.Topic = m.Topic
			records = append(records, rec)
			extra = append(extra, m.Topic)
		}
	}
	if err := p.ensureResultTopics(ctx, extra); err != nil {
		return nil, err
	}
	if err := write(ctx, p.w, records...); err != nil {
		return nil, fmt.Errorf("kafka: publish %d results: %w", len(msgs), err)
	}
	return nil, nil
}

func (p *Publisher) ensureResultTopics(ctx context.Context, topics []string) error {
	p.results.mu.Lock()
	defer p.results.mu.Unlock()
	var missing []kafkago.TopicConfig
	for _, t := range topics {
		if !p.results.known[t] {
			missing = append(missing, p.cfg.topicConfig(t))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	client, done := newClient(p.cfg)
	defer done()
	resp, err := client.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: missing})
	if err != nil {
		return fmt.Errorf("kafka: create result topics: %w", err)
	}
	if p.results.known == nil {
		p.results.known = make(map[string]bool)
	}
	for _, t := range missing {
		if err := resp.Errors[t.Topic]; err != nil && !errors.Is(err, kafkago.TopicAlreadyExists) {
			return fmt.Errorf("kafka: create result topic %s: %w", t.Topic, err)
		}
		p.results.known[t.Topic] = true
	}
	return nil
}
