package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

type deliveryState int

const (
	pending deliveryState = iota
	settled
	returned
)

type delivery struct {
	sub         *subscription
	m           kafkago.Message
	tr          *offsetTracker
	msg         broker.Message
	redelivered bool

	mu    sync.Mutex
	state deliveryState
}

var _ broker.Delivery = (*delivery)(nil)

func (d *delivery) Message() broker.Message { return d.msg }
func (d *delivery) Lane() job.Priority      { return d.sub.lane }

// Redelivered is exact after a Nack (the re-published message carries a
// header) and false for a message re-read after a crash or rebalance.
func (d *delivery) Redelivered() bool { return d.redelivered }

// settle settles d exactly once, after writing rec (if any). A write that
// fails hands the delivery back: it is settled, keeps its prefetch slot and
// its offset, and the subscriber keeps retrying the write in the background
// (republish); the error wraps broker.ErrHandedBack.
func (d *delivery) settle(ctx context.Context, op string, rec *kafkago.Message) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch d.state {
	case settled:
		return broker.ErrSettled
	case returned:
		return fmt.Errorf("kafka: %s %s: subscriber closed, the message is read again: %w", op, d.msg.Key, broker.ErrClosed)
	}
	d.state = settled
	if rec != nil {
		if err := d.sub.owner.write(ctx, *rec); err != nil {
			d.sub.owner.republish(d, op, *rec)
			return fmt.Errorf("kafka: %s %s: %w: %w", op, d.msg.Key, broker.ErrHandedBack, err)
		}
	}
	d.done()
	return nil
}

// done frees the prefetch slot and lets the offset be committed.
func (d *delivery) done() {
	sub := d.sub
	sub.mu.Lock()
	delete(sub.outstanding, d)
	sub.mu.Unlock()
	sub.gc.finish(d.tr, d.m.Partition, d.m.Offset)
	<-sub.slots
}

func (d *delivery) handBack() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state != pending {
		return
	}
	d.state = returned
	sub := d.sub
	sub.mu.Lock()
	delete(sub.outstanding, d)
	sub.mu.Unlock()
	<-sub.slots
}

func (d *delivery) Ack(ctx context.Context) error { return d.settle(ctx, "ack", nil) }

// Nack re-publishes the message to its own topic, then marks it done.
func (d *delivery) Nack(ctx context.Context) error {
	rec := d.redelivery()
	return d.settle(ctx, "nack", &rec)
}

// redelivery is the message again, flagged redelivered, for its own topic.
func (d *delivery) redelivery() kafkago.Message {
	return record(d.sub.topic, d.msg, map[string]string{broker.HeaderRedelivered: "1"})
}

// errRetryOnIntake is why Retry hands an intake delivery back.
var errRetryOnIntake = errors.New("retry is not supported on the intake")

// Retry writes the message to its lane (no delay) or to the retry topic,
// then marks it done. On the intake it hands the delivery back as Nack
// does.
func (d *delivery) Retry(ctx context.Context, delay time.Duration, headers map[string]string) error {
	if d.sub.owner.intake {
		rec := d.redelivery()
		if err := d.settle(ctx, "retry", &rec); err != nil && !errors.Is(err, broker.ErrHandedBack) {
			return err
		}
		return fmt.Errorf("kafka: retry %s: %w: %w", d.msg.Key, broker.ErrHandedBack, errRetryOnIntake)
	}
	msg := d.msg
	msg.Headers = broker.MergeHeaders(d.msg.Headers, headers)
	cfg := d.sub.owner.cfg
	rec := record(cfg.laneTopic(d.sub.lane), msg, nil)
	if delay > 0 {
		due := time.Now().Add(delay)
		rec = record(cfg.retryTopic(), msg, map[string]string{
			broker.HeaderDueAt: strconv.FormatInt(due.UnixMilli(), 10),
			headerLane:         string(d.sub.lane),
		})
	}
	return d.settle(ctx, "retry", &rec)
}

// DeadLetter writes the envelope to the dead-letter topic, then marks the
// message done.
func (d *delivery) DeadLetter(ctx context.Context, dl broker.DeadLetter) error {
	dl = dl.Filled(d.msg, d.sub.lane, d.sub.owner.intake)
	body, err := json.Marshal(dl)
	if err != nil {
		return fmt.Errorf("kafka: dead-letter %s: encode envelope: %w", d.msg.Key, err)
	}
	rec := kafkago.Message{Topic: d.sub.owner.cfg.deadTopic(), Key: []byte(dl.Key), Value: body}
	return d.settle(ctx, "dead-letter", &rec)
}
