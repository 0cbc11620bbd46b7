package memory

import (
	"context"
	"fmt"

	"github.com/llmq/llmq/internal/broker"
)

var _ broker.ResultPublisher = (*Publisher)(nil)

// PublishResults records msgs; Broker.Results returns them. A reply queue
// counts as existing when DeclareReplyQueue named it.
func (p *Publisher) PublishResults(ctx context.Context, msgs []broker.ResultMessage) ([]int, error) {
	if p.isClosed() {
		return nil, broker.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memory: publish results: %w", err)
	}
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	if p.b.failResults != nil {
		return nil, p.b.failResults
	}
	var unroutable []int
	for i, m := range msgs {
		m.Body = append([]byte(nil), m.Body...)
		p.b.results = append(p.b.results, m)
		if m.ReplyTo != "" && !p.b.replyQueues[m.ReplyTo] {
			unroutable = append(unroutable, i)
		}
	}
	return unroutable, nil
}

// Results returns every result message published so far.
func (b *Broker) Results() []broker.ResultMessage {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]broker.ResultMessage(nil), b.results...)
}

// DeclareReplyQueue makes a reply queue exist for PublishResults.
func (b *Broker) DeclareReplyQueue(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.replyQueues[name] = true
}

// FailResults makes every PublishResults return err (nil: succeed again).
func (b *Broker) FailResults(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failResults = err
}
