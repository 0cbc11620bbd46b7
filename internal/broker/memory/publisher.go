package memory

import (
	"context"
	"fmt"
	"sync"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// Publisher publishes to a Broker.
type Publisher struct {
	b      *Broker
	mu     sync.Mutex
	closed bool
}

var _ broker.Publisher = (*Publisher)(nil)

// Publish appends msg to the lane.
func (p *Publisher) Publish(ctx context.Context, lane job.Priority, msg broker.Message) error {
	return p.publish(ctx, false, lane, msg)
}

// VouchesIntakeTenant: msg.IntakeTenant reaches the ingester as given.
func (p *Publisher) VouchesIntakeTenant() bool { return true }

// PublishIntake appends msg to the priority's intake list.
func (p *Publisher) PublishIntake(ctx context.Context, lane job.Priority, msg broker.Message) error {
	return p.publish(ctx, true, lane, msg)
}

func (p *Publisher) publish(ctx context.Context, intake bool, lane job.Priority, msg broker.Message) error {
	if p.isClosed() {
		return broker.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: publish %s: %w", msg.Key, err)
	}
	return p.b.push(intake, lane, entry{msg: msg}, false)
}

// PublishStatus records body; Broker.Statuses returns it.
func (p *Publisher) PublishStatus(ctx context.Context, body []byte) error {
	if p.isClosed() {
		return broker.ErrClosed
	}
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	p.b.statuses = append(p.b.statuses, append([]byte(nil), body...))
	return nil
}

// Close makes later publishes return broker.ErrClosed.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}

func (p *Publisher) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// Inspector reports lane depth.
type Inspector struct{ b *Broker }

var _ broker.Inspector = (*Inspector)(nil)

// Depth is the number of ready messages on the priority's intake and lane
// lists (not in flight, not waiting for a delayed retry).
func (i *Inspector) Depth(ctx context.Context, lane job.Priority) (int64, error) {
	i.b.mu.Lock()
	defer i.b.mu.Unlock()
	q, ok := i.b.lanes[lane]
	if !ok {
		return 0, fmt.Errorf("memory: unknown lane %q", lane)
	}
	return int64(len(q.ready) + len(i.b.intake[lane].ready)), nil
}

// Close does nothing.
func (i *Inspector) Close() error { return nil }
