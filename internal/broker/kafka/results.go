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
// auto-creation may be off. An event larger than a batch may be, or one
// the broker refuses for its size, goes without its response
// (ResultMessage.Slim) when it has one. An event that still does not fit,
// whose result topic cannot be made, or that the broker refuses on its own
// otherwise (kafkago.WriteErrors) is left out and reported in a
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
	limit := int64(p.w.BatchBytes)
	if limit <= 0 {
		limit = 1 << 20 // kafka-go's default
	}
	b := resultBatch{msgs: msgs, refused: refused, limit: limit}
	for i, m := range msgs {
		if err := topicErrs[m.Topic]; m.Topic != "" && err != nil {
			refused[i] = err
			continue
		}
		rec := kafkago.Message{Topic: p.cfg.ResultsTopic(), Key: []byte(m.JobID), Value: m.Body,
			Headers: []kafkago.Header{{Key: "event_id", Value: []byte(m.EventID)}, {Key: "type", Value: []byte(m.Type)},
				{Key: "tenant", Value: []byte(m.Tenant)}}}
		slim := false
		if size := recordSize(rec); size > limit {
			if slim = b.slim(i, &rec); !slim {
				if _, failed := refused[i]; !failed {
					refused[i] = fmt.Errorf("kafka: result event of job %s is %d bytes, over the writer's batch limit of %d", m.JobID, size, limit)
				}
				continue
			}
		}
		b.add(i, rec, slim)
		if m.Topic != "" {
			rec.Topic = m.Topic
			b.add(i, rec, slim)
		}
	}
	tooBig, err := b.write(ctx, p.w)
	if err != nil {
		return nil, err
	}
	if err := b.writeAlone(ctx, p.w, tooBig); err != nil {
		return nil, err
	}
	if len(refused) > 0 {
		return nil, &broker.ResultsRefused{Refused: refused}
	}
	return nil, nil
}

// resultBatch is one PublishResults call's records, the message each
// comes from, and what was refused.
type resultBatch struct {
	msgs    []broker.ResultMessage
	refused map[int]error
	limit   int64
	records []kafkago.Message
	owner   []int          // the message of each record
	isSlim  []bool         // the record carries its message's slim copy
	slims   map[int][]byte // each message's slim copy, once made
}

func (b *resultBatch) add(i int, rec kafkago.Message, slim bool) {
	b.records, b.owner, b.isSlim = append(b.records, rec), append(b.owner, i), append(b.isSlim, slim)
}

// slim makes rec carry the slim copy of message i (ResultMessage.Slim) and
// reports whether it fits the writer's limit; refused[i] says why not
// when Slim failed.
func (b *resultBatch) slim(i int, rec *kafkago.Message) bool {
	m := b.msgs[i]
	if m.Slim == nil {
		return false
	}
	body, ok := b.slims[i]
	if !ok {
		var err error
		if body, err = m.Slim(); err != nil {
			b.refused[i] = fmt.Errorf("kafka: result event of job %s: %w", m.JobID, err)
			return false
		}
		if b.slims == nil {
			b.slims = map[int][]byte{}
		}
		b.slims[i] = body
	}
	rec.Value = body
	return recordSize(*rec) <= b.limit
}

// write writes the records in one call. A record the broker refuses on
// its own is refused, except one refused for its size, which write returns
// (as an index of records) to be tried alone: the broker refuses a whole
// batch for one record over its max.message.bytes. A failure of the call
// as a whole is err.
func (b *resultBatch) write(ctx context.Context, w *kafkago.Writer) (tooBig []int, err error) {
	err = write(ctx, w, b.records...)
	var perRecord kafkago.WriteErrors
	switch {
	case errors.As(err, &perRecord) && len(perRecord) == len(b.records) && refusedOnly(perRecord):
		for r, rerr := range perRecord {
			switch {
			case rerr == nil:
			case tooLarge(rerr):
				tooBig = append(tooBig, r)
			default:
				b.refuse(b.owner[r], rerr)
			}
		}
		return tooBig, nil
	case err != nil:
		return nil, fmt.Errorf("kafka: publish %d results: %w", len(b.msgs), err)
	}
	return nil, nil
}

// writeAlone writes each of the records the broker refused for their size
// on its own, as it is and then, if the broker refuses it alone, as its
// slim copy. The records are few: those of a batch that held an event of
// megabytes.
func (b *resultBatch) writeAlone(ctx context.Context, w *kafkago.Writer, records []int) error {
	for _, r := range records {
		i, rec, slim := b.owner[r], b.records[r], b.isSlim[r]
		for {
			err := write(ctx, w, rec)
			var perRecord kafkago.WriteErrors
			switch {
			case err == nil:
			case !errors.As(err, &perRecord) || len(perRecord) != 1 || !refusedOnly(perRecord):
				return fmt.Errorf("kafka: publish result of job %s: %w", b.msgs[i].JobID, err)
			case tooLarge(perRecord[0]) && !slim && b.slim(i, &rec):
				slim = true
				continue
			default:
				b.refuse(i, perRecord[0])
			}
			break
		}
	}
	return nil
}

// refuse records the first refusal of message i.
func (b *resultBatch) refuse(i int, err error) {
	if _, failed := b.refused[i]; !failed {
		b.refused[i] = fmt.Errorf("kafka: publish result of job %s: %w", b.msgs[i].JobID, err)
	}
}

// tooLarge reports a record the broker refused for its size.
func tooLarge(err error) bool {
	var ke kafkago.Error
	return errors.As(err, &ke) && (ke == kafkago.MessageSizeTooLarge || ke == kafkago.RecordListTooLarge)
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
