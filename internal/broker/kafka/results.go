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
// auto-creation may be off. An event the writer refuses as larger than a
// batch may be, whose result topic cannot be made, or that the broker
// refuses on its own (kafkago.WriteErrors) is left out and reported in a
// *broker.ResultsRefused; the others are written.
func (p *Publisher) PublishResults(ctx context.Context, msgs []broker.ResultMessage) ([]int, error) {
	if p.closed.Load() {
		return nil, broker.ErrClosed
	}
	refused := map[int]error{}
	var extra []string
	for _, m := range msgs {
		if m.Topic != "" {
			extra = append(extra, m.Topic)
		}
	}
	topicErrs, err := p.ensureResultTopics(ctx, extra)
	if err != nil {
		return nil, err
	}
	records := make([]kafkago.Message, 0, len(msgs))
	var owner []int // the message of each record
	limit := int64(p.w.BatchBytes)
	if limit <= 0 {
		limit = 1 << 20 // kafka-go's default
	}
	for i, m := range msgs {
		if err := topicErrs[m.Topic]; m.Topic != "" && err != nil {
			refused[i] = err
			continue
		}
		rec := kafkago.Message{Topic: p.cfg.ResultsTopic(), Key: []byte(m.JobID), Value: m.Body,
			Headers: []kafkago.Header{{Key: "event_id", Value: []byte(m.EventID)}, {Key: "type", Value: []byte(m.Type)},
				{Key: "tenant", Value: []byte(m.Tenant)}}}
		if size := recordSize(rec); size > limit {
			refused[i] = fmt.Errorf("kafka: result event of job %s is %d bytes, over the writer's batch limit of %d", m.JobID, size, limit)
			continue
		}
		records, owner = append(records, rec), append(owner, i)
		if m.Topic != "" {
			rec.Topic = m.Topic
			records, owner = append(records, rec), append(owner, i)
		}
	}
	err = write(ctx, p.w, records...)
	var perRecord kafkago.WriteErrors
	switch {
	case errors.As(err, &perRecord) && len(perRecord) == len(records) && refusedOnly(perRecord):
		for r, rerr := range perRecord {
			if rerr != nil {
				refused[owner[r]] = fmt.Errorf("kafka: publish result of job %s: %w", msgs[owner[r]].JobID, rerr)
			}
		}
	case err != nil:
		return nil, fmt.Errorf("kafka: publish %d results: %w", len(msgs), err)
	}
	if len(refused) > 0 {
		return nil, &broker.ResultsRefused{Refused: refused}
	}
	return nil, nil
}

// refusedOnly reports whether every record that failed was refused for
// itself (too large, a topic it may not write or that cannot be), not
// for the broker's state (a leader away, too few in-sync replicas), which
// kafka-go also reports per record once its tries run out: that is a
// failed call, tried again as a whole.
func refusedOnly(errs kafkago.WriteErrors) bool {
	for _, err := range errs {
		if err == nil {
			continue
		}
		var ke kafkago.Error
		if !errors.As(err, &ke) {
			return false
		}
		switch ke {
		case kafkago.MessageSizeTooLarge, kafkago.RecordListTooLarge, kafkago.InvalidTopic,
			kafkago.TopicAuthorizationFailed, kafkago.PolicyViolation, kafkago.InvalidRecord:
		default:
			return false
		}
	}
	return true
}

// recordSize is at least the size kafka-go weighs a record at against
// BatchBytes: its key, value and headers, and 1 KB for the framing it adds
// (a few dozen bytes), so a record this lets through is never refused.
func recordSize(m kafkago.Message) int64 {
	n := int64(1024 + len(m.Key) + len(m.Value))
	for _, h := range m.Headers {
		n += int64(len(h.Key) + len(h.Value))
	}
	return n
}

// ensureResultTopics creates the topics not yet known, and returns the
// error of each it could not create; err is a failure to ask at all.
func (p *Publisher) ensureResultTopics(ctx context.Context, topics []string) (map[string]error, error) {
	p.results.mu.Lock()
	defer p.results.mu.Unlock()
	var missing []kafkago.TopicConfig
	seen := map[string]bool{}
	for _, t := range topics {
		if !p.results.known[t] && !seen[t] {
			seen[t] = true
			missing = append(missing, p.cfg.topicConfig(t))
		}
	}
	if len(missing) == 0 {
		return nil, nil
	}
	client, done := newClient(p.cfg)
	defer done()
	resp, err := client.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: missing})
	if err != nil {
		return nil, fmt.Errorf("kafka: create result topics: %w", err)
	}
	if p.results.known == nil {
		p.results.known = make(map[string]bool)
	}
	var failed map[string]error
	for _, t := range missing {
		if err := resp.Errors[t.Topic]; err != nil && !errors.Is(err, kafkago.TopicAlreadyExists) {
			if failed == nil {
				failed = map[string]error{}
			}
			failed[t.Topic] = fmt.Errorf("kafka: create result topic %s: %w", t.Topic, err)
			continue
		}
		p.results.known[t.Topic] = true
	}
	return failed, nil
}
