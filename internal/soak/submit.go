package soak

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// jobBody is the job message (docs/design.md#job-message) the soak sends
// both ways; the id is in the prompt too, for llmsim's count (CountCalls).
func jobBody(id, model string) []byte {
	return fmt.Appendf(nil, `{"id":%q,"model":%q,"request":{"messages":[{"role":"user","content":"%s: summarise the ticket: the printer on floor 3 is out of toner again."}],"max_tokens":300}}`,
		id, model, id)
}

// jobID is the i-th job's id; even jobs go over HTTP, odd ones raw onto
// RabbitMQ.
func jobID(i int) (id, via string) {
	if i%2 == 0 {
		return fmt.Sprintf("soak-h-%07d", i), "http"
	}
	return fmt.Sprintf("soak-a-%07d", i), "amqp"
}

// giveUp bounds how long one submission is tried again through an outage
// (a restart of RabbitMQ or Postgres): the id is the idempotency key, so
// trying again is safe.
const giveUp = 3 * time.Minute

// httpSubmitter posts jobs to `producer serve`.
type httpSubmitter struct {
	base   string
	client *http.Client
}

// submit returns nil once the API answered 2xx (202 accepted, or the
// existing job of a re-submitted id).
func (s httpSubmitter) submit(ctx context.Context, body []byte) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.base+"/v1/jobs", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST /v1/jobs: %s", resp.Status)
	}
	return nil
}

// amqpSubmitter publishes raw job messages to the exchange llmq.jobs
// with publisher confirms, one at a time, reconnecting after a failure.
type amqpSubmitter struct {
	url  string
	mu   sync.Mutex
	conn *amqp.Connection
	ch   *amqp.Channel
}

func (s *amqpSubmitter) channel() (*amqp.Channel, error) {
	if s.ch != nil && !s.ch.IsClosed() {
		return s.ch, nil
	}
	s.close()
	conn, err := amqp.Dial(s.url)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	s.conn, s.ch = conn, ch
	return ch, nil
}

// submit returns nil once the broker confirmed the message.
func (s *amqpSubmitter) submit(ctx context.Context, id string, body []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, err := s.channel()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "llmq.jobs", "normal", false, false, amqp.Publishing{
		ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: id, Body: body,
	})
	if err != nil {
		s.close()
		return err
	}
	ok, err := conf.WaitContext(ctx)
	if err != nil || !ok {
		s.close()
		return errors.Join(errors.New("not confirmed"), err)
	}
	return nil
}

func (s *amqpSubmitter) close() {
	if s.conn != nil {
		s.conn.Close()
	}
	s.conn, s.ch = nil, nil
}

// submitUntil tries send until it succeeds, ctx ends or giveUp passes.
func submitUntil(ctx context.Context, send func(context.Context) error) (attempts int, err error) {
	deadline := time.Now().Add(giveUp)
	wait := 200 * time.Millisecond
	for {
		attempts++
		if err = send(ctx); err == nil {
			return attempts, nil
		}
		if time.Now().After(deadline) {
			return attempts, err
		}
		select {
		case <-ctx.Done():
			return attempts, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(wait*2, 5*time.Second)
	}
}
