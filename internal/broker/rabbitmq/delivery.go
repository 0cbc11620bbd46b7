package rabbitmq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

type delivery struct {
	sub *subscription
	cc  *consumeChan
	m   amqp.Delivery
	msg broker.Message

	mu   sync.Mutex
	done bool
}

var (
	_ broker.Delivery   = (*delivery)(nil)
	_ broker.BatchAcker = (*delivery)(nil)
)

func (d *delivery) Message() broker.Message { return d.msg }
func (d *delivery) Lane() job.Priority      { return d.sub.lane }

// Redelivered is the AMQP redelivered flag (quorum queues also count
// deliveries in x-delivery-count).
func (d *delivery) Redelivered() bool {
	if d.m.Redelivered {
		return true
	}
	switch n := d.m.Headers["x-delivery-count"].(type) {
	case int64:
		return n > 0
	case int32:
		return n > 0
	}
	return false
}

// settle runs publish (if any), then settle, exactly once. A publish that
// fails hands the delivery back instead (basic.nack with requeue) and the
// error wraps broker.ErrHandedBack: a delivery left unsettled would hold its
// prefetch slot for good. A settle that fails because the channel is gone
// leaves the message with the broker, which delivers it again; the delivery
// is then finished too.
func (d *delivery) settle(op string, publish func() error, settle func() error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done {
		return broker.ErrSettled
	}
	var perr error
	if publish != nil {
		perr = publish()
	}
	if perr != nil {
		settle = d.requeue
	}
	err := d.cc.settleOne(d.m.DeliveryTag, settle)
	d.done = true
	d.cc.settled()
	if perr != nil {
		// A nack lost with the channel changes nothing: the broker has the
		// message back either way.
		return fmt.Errorf("rabbitmq: %s %s: %w: %w", op, d.msg.Key, broker.ErrHandedBack, perr)
	}
	return d.settleError(op, err)
}

func (d *delivery) requeue() error { return d.m.Nack(false, true) }

func (d *delivery) settleError(op string, err error) error {
	if err != nil {
		return fmt.Errorf("rabbitmq: %s %s: channel lost, the broker delivers it again: %w: %v",
			op, d.msg.Key, broker.ErrClosed, err)
	}
	return nil
}

// Ack requests the ack; the frame may go out up to AckDelay later,
// coalesced with others (see consumeChan).
func (d *delivery) Ack(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done {
		return broker.ErrSettled
	}
	err := d.cc.ack([]uint64{d.m.DeliveryTag}, broker.IsAckNow(ctx))
	d.done = true
	d.cc.settled()
	return d.settleError("ack", err)
}

// AckBatch implements broker.BatchAcker: the deliveries of each channel
// are acked together (consumeChan.ack), other deliveries by their own Ack.
func (d *delivery) AckBatch(ctx context.Context, ds []broker.Delivery) []error {
	errs := make([]error, len(ds))
	type group struct {
		idx  []int
		tags []uint64
		ds   []*delivery
	}
	groups := make(map[*consumeChan]*group)
	var order []*consumeChan
	for i, x := range ds {
		rd, ok := x.(*delivery)
		if !ok {
			errs[i] = x.Ack(ctx)
			continue
		}
		rd.mu.Lock()
		if rd.done {
			rd.mu.Unlock()
			errs[i] = broker.ErrSettled
			continue
		}
		rd.done = true // from here on, the ack below is its settlement
		rd.mu.Unlock()
		g := groups[rd.cc]
		if g == nil {
			g = &group{}
			groups[rd.cc] = g
			order = append(order, rd.cc)
		}
		g.idx, g.tags, g.ds = append(g.idx, i), append(g.tags, rd.m.DeliveryTag), append(g.ds, rd)
	}
	for _, cc := range order {
		g := groups[cc]
		err := cc.ack(g.tags, broker.IsAckNow(ctx))
		for j, d := range g.ds {
			errs[g.idx[j]] = d.settleError("ack", err)
			cc.settled()
		}
	}
	return errs
}

func (d *delivery) Nack(ctx context.Context) error {
	return d.settle("nack", nil, d.requeue)
}

// errRetryOnIntake is why Retry hands an intake delivery back.
var errRetryOnIntake = errors.New("retry is not supported on the intake")

// Retry publishes to the lanes exchange (no delay) or to the delay tier,
// then acks. On the intake it hands the delivery back.
func (d *delivery) Retry(ctx context.Context, delay time.Duration, headers map[string]string) error {
	if d.sub.owner.intake {
		return d.settle("retry", func() error { return errRetryOnIntake }, nil)
	}
	msg := d.msg
	msg.Headers = broker.MergeHeaders(d.msg.Headers, headers)
	publish := func() error {
		if delay <= 0 {
			s := d.sub.owner.s
			return d.sub.owner.pub.publish(ctx, s.names.lanes, string(d.sub.lane), true, publishing(msg, nil))
		}
		return d.sub.publishDelayed(ctx, msg, time.Now().Add(delay))
	}
	return d.settle("retry", publish, func() error { return d.m.Ack(false) })
}

// DeadLetter publishes the envelope to the dead-letter exchange, then acks.
func (d *delivery) DeadLetter(ctx context.Context, dl broker.DeadLetter) error {
	dl = dl.Filled(d.msg, d.sub.lane, d.sub.owner.intake)
	body, err := json.Marshal(dl)
	if err != nil {
		return fmt.Errorf("rabbitmq: dead-letter %s: encode envelope: %w", d.msg.Key, err)
	}
	publish := func() error {
		pub := amqp.Publishing{
			MessageId: dl.Key, DeliveryMode: amqp.Persistent, ContentType: "application/json",
			Headers: amqp.Table{headerEnvelope: "1"}, Body: body,
		}
		return d.sub.owner.pub.publish(ctx, d.sub.owner.s.names.dlx, string(dl.Lane), true, pub)
	}
	return d.settle("dead-letter", publish, func() error { return d.m.Ack(false) })
}
