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
				b.refuseFirst(i, fmt.Errorf("kafka: result event of job %s is %d bytes, over the writer's batch limit of %d", m.JobID, size, limit))
				continue
			}
		}
		b.add(i, rec, slim)
		if m.Topic != "" {
			rec.Topic = m.Topic
			b.add(i, rec, slim)
		}
	}
	tooBig, err := b.write(ctx, p.w, b.all())
	if err != nil {
		return nil, err
	}
	if len(tooBig) > 0 {
		// A broker refuses a whole batch for its size (a topic whose
		// max.message.bytes is below the writer's batch refuses any batch
		// larger than it, whatever its records): the records go again in
		// halves, through a writer no other call shares a batch with.
		select {
		case p.split.turn <- struct{}{}:
			err := b.split(ctx, p.split.w, tooBig)
			<-p.split.turn
			if err != nil {
				return nil, err
			}
		case <-ctx.Done():
			b.outOfTime(ctx, tooBig)
		}
	}
	for i := range b.slimWritten {
		if _, failed := refused[i]; !failed && msgs[i].SlimPublished != nil {
			msgs[i].SlimPublished()
		}
	}
	if len(refused) > 0 {
		return nil, &broker.ResultsRefused{Refused: refused}
	}
	return nil, nil
}

// splitWriter is the writer of the records a broker refused for their
// size, one call at a time: through the shared writer, a call's halves
// would share batches with other calls' records and be refused with them.
type splitWriter struct {
	turn chan struct{} // held by the call using w
	w    *kafkago.Writer
}

// newSplitWriter is a writer as w is, on w's transport.
func newSplitWriter(w *kafkago.Writer) splitWriter {
	return splitWriter{turn: make(chan struct{}, 1), w: &kafkago.Writer{Addr: w.Addr, Balancer: w.Balancer,
		BatchTimeout: w.BatchTimeout, BatchSize: w.BatchSize, BatchBytes: w.BatchBytes, RequiredAcks: w.RequiredAcks,
		MaxAttempts: w.MaxAttempts, WriteBackoffMin: w.WriteBackoffMin, WriteBackoffMax: w.WriteBackoffMax,
		ReadTimeout: w.ReadTimeout, WriteTimeout: w.WriteTimeout, Compression: w.Compression,
		AllowAutoTopicCreation: w.AllowAutoTopicCreation, Transport: w.Transport}}
}

// resultBatch is one PublishResults call's records, the message each
// comes from, and what was refused.
type resultBatch struct {
	msgs        []broker.ResultMessage
	refused     map[int]error
	limit       int64
	records     []kafkago.Message
	owner       []int          // the message of each record
	isSlim      []bool         // the record carries its message's slim copy
	slims       map[int][]byte // each message's slim copy once asked for (nil: Slim failed)
	slimWritten map[int]bool   // messages a slim copy of which was written
}

func (b *resultBatch) add(i int, rec kafkago.Message, slim bool) {
	b.records, b.owner, b.isSlim = append(b.records, rec), append(b.owner, i), append(b.isSlim, slim)
}

// all is every record, as indexes of records.
func (b *resultBatch) all() []int {
	rs := make([]int, len(b.records))
	for r := range rs {
		rs[r] = r
	}
	return rs
}

// slim makes rec carry the slim copy of message i (ResultMessage.Slim) and
// reports whether it fits the writer's limit; refused[i] says why not
// when Slim failed.
func (b *resultBatch) slim(i int, rec *kafkago.Message) bool {
	m := b.msgs[i]
	if m.Slim == nil {
		return false
	}
	body, asked := b.slims[i]
	if !asked {
		var err error
		if body, err = m.Slim(); err != nil {
			body = nil
			b.refuseFirst(i, fmt.Errorf("kafka: result event of job %s: %w", m.JobID, err))
		}
		if b.slims == nil {
			b.slims = map[int][]byte{}
		}
		b.slims[i] = body
	}
	if body == nil {
		return false
	}
	rec.Value = body
	return recordSize(*rec) <= b.limit
}

// write writes the records rs in one call. A record the broker refuses on
// its own is refused, but one refused for its size, which write returns
// to be tried again. A failure of the call as a whole is err.
func (b *resultBatch) write(ctx context.Context, w *kafkago.Writer, rs []int) (tooBig []int, err error) {
	recs := make([]kafkago.Message, len(rs))
	for k, r := range rs {
		recs[k] = b.records[r]
	}
	err = write(ctx, w, recs...)
	var perRecord kafkago.WriteErrors
	switch {
	case errors.As(err, &perRecord) && len(perRecord) == len(recs) && refusedOnly(perRecord):
		for k, rerr := range perRecord {
			switch {
			case rerr == nil:
				b.written(rs[k])
			case tooLarge(rerr):
				tooBig = append(tooBig, rs[k])
			default:
				b.refuse(b.owner[rs[k]], rerr)
			}
		}
		return tooBig, nil
	case err != nil:
		return nil, fmt.Errorf("kafka: publish %d results: %w", len(recs), err)
	}
	for _, r := range rs {
		b.written(r)
	}
	return nil, nil
}

func (b *resultBatch) written(r int) {
	if b.isSlim[r] {
		if b.slimWritten == nil {
			b.slimWritten = map[int]bool{}
		}
		b.slimWritten[b.owner[r]] = true
	}
}

// split writes the records rs the broker refused for their size: all
// together again, then in halves, down to one record, which goes as its
// slim copy if it has one. A record refused alone even so is refused.
// Every record left when ctx ends is out of time (outOfTime): not a
// failed call, which the relay would repeat whole, writing again what
// this one wrote.
func (b *resultBatch) split(ctx context.Context, w *kafkago.Writer, rs []int) error {
	for len(rs) > 0 {
		if ctx.Err() != nil {
			b.outOfTime(ctx, rs)
			return nil
		}
		tooBig, err := b.write(ctx, w, rs)
		switch {
		case err != nil && ctx.Err() != nil:
			continue // refused above, on the next turn
		case err != nil:
			return err
		case len(tooBig) == 1:
			r := tooBig[0]
			if i := b.owner[r]; b.isSlim[r] || !b.slim(i, &b.records[r]) {
				b.refuse(i, kafkago.MessageSizeTooLarge)
				return nil
			}
			b.isSlim[r] = true
		case len(tooBig) == len(rs):
			half := len(rs) / 2
			if err := b.split(ctx, w, rs[:half]); err != nil {
				return err
			}
			tooBig = rs[half:]
		}
		rs = tooBig
	}
	return nil
}

// outOfTime marks the messages of records rs broker.ErrOutOfTime: the
// relay tries them again without counting a refusal.
func (b *resultBatch) outOfTime(ctx context.Context, rs []int) {
	for _, r := range rs {
		b.refuse(b.owner[r], fmt.Errorf("%w (%w)", broker.ErrOutOfTime, ctx.Err()))
	}
}

// refuse records a refusal of message i by the broker, unless one came
// first.
func (b *resultBatch) refuse(i int, err error) {
	b.refuseFirst(i, fmt.Errorf("kafka: publish result of job %s: %w", b.msgs[i].JobID, err))
}

// refuseFirst records err as message i's refusal unless it has one.
func (b *resultBatch) refuseFirst(i int, err error) {
	if _, failed := b.refused[i]; !failed {
		b.refused[i] = err
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
