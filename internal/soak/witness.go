package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// jobIDPattern finds the soak's job id in a provider request: the
// submitter writes it into the prompt, which llmq passes to the provider
// as it is (docs/design.md#job-message), so llmsim needs no header of
// llmq's to count calls per job.
var jobIDPattern = regexp.MustCompile(`soak-[ha]-[0-9]+`)

// CountCalls wraps llmsim's handler: every chat call is booked on the
// ledger under the job id in its body, with the status llmsim answered.
func CountCalls(next http.Handler, l *Ledger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "read body", http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		id := string(jobIDPattern.Find(body))
		at := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		if id != "" {
			l.Call(id, sw.status, at)
		}
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// resultsQueue is the soak's own durable queue on llmq.results, bound to
// every routing key, so that events published while the soak reconnects
// wait for it instead of being unroutable.
const resultsQueue = "soak.results"

// resultEvent is the part of a result event the soak reads
// (api/schemas/result-event.schema.json).
type resultEvent struct {
	Type    string `json:"type"`
	EventID string `json:"event_id"`
	Data    struct {
		ID string `json:"id"`
	} `json:"data"`
}

// ListenResults books every result event on the ledger until ctx ends,
// reconnecting after a broker restart. ready is closed once the queue is
// bound for the first time.
func ListenResults(ctx context.Context, url string, l *Ledger, log *slog.Logger, ready chan<- struct{}) {
	first := true
	for ctx.Err() == nil {
		err := listenOnce(ctx, url, l, func() {
			if first {
				first = false
				close(ready)
			}
		})
		if ctx.Err() != nil {
			return
		}
		log.Warn("result listener reconnecting", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func listenOnce(ctx context.Context, url string, l *Ledger, bound func()) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	// The same declaration as llmq's topology, so either may come first.
	if err := ch.ExchangeDeclare("llmq.results", amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare llmq.results: %w", err)
	}
	if _, err := ch.QueueDeclare(resultsQueue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		return fmt.Errorf("declare %s: %w", resultsQueue, err)
	}
	if err := ch.QueueBind(resultsQueue, "#", "llmq.results", false, nil); err != nil {
		return fmt.Errorf("bind %s: %w", resultsQueue, err)
	}
	if err := ch.Qos(500, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.Consume(resultsQueue, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	bound()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	for {
		select {
		case <-ctx.Done():
			return nil
		case e := <-closed:
			return fmt.Errorf("connection closed: %v", e)
		case d, ok := <-deliveries:
			if !ok {
				return fmt.Errorf("deliveries closed")
			}
			var ev resultEvent
			if err := json.Unmarshal(d.Body, &ev); err == nil && ev.Data.ID != "" && ev.EventID != "" {
				l.Event(ev.Data.ID, ev.EventID, ev.Type)
			}
			_ = d.Ack(false)
		}
	}
}
