// Command ticket-triage is a support backend that has llmq triage its
// tickets: it publishes each ticket as a job to RabbitMQ with a reply_to
// queue of its own, asks for a JSON answer {category, urgency, summary}
// fitting a JSON Schema, and prints each answer as its result event comes
// back on that queue. It exits once every ticket is answered, or non-zero
// after -timeout or when a job did not succeed.
//
// Against `llmq up` with RabbitMQ (see README.md beside this file):
//
//	go run ./examples/ticket-triage
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/client"
)

// triageSchema is the answer's shape; the model must reply with JSON that fits it.
const triageSchema = `{
	"type": "object",
	"additionalProperties": false,
	"required": ["category", "urgency", "summary"],
	"properties": {
		"category": {"type": "string", "enum": ["billing", "bug", "account", "feature_request", "other"]},
		"urgency": {"type": "string", "enum": ["low", "medium", "high"]},
		"summary": {"type": "string", "maxLength": 200}
	}
}`

const systemPrompt = "You triage customer support tickets. Answer with the ticket's category, " +
	"its urgency and a one-sentence summary for the agent who picks it up."

var tickets = []string{
	"I was charged twice for my March invoice. Please refund one of the payments.",
	"The export button crashes the app on Android 14 every time I tap it.",
	"How do I change the e-mail address on my account? I no longer use the old one.",
	"It would be great if reports could be scheduled to arrive every Monday.",
	"Our whole team is locked out since this morning; production is down for us!",
	"Thanks for the quick help last week, everything works now.",
}

// answer is what the model returns, as triageSchema describes it.
type answer struct {
	Category string `json:"category"`
	Urgency  string `json:"urgency"`
	Summary  string `json:"summary"`
}

// event is the part of a result event (version 1) this backend reads.
type event struct {
	Type    string `json:"type"`
	Version int    `json:"version"`
	EventID string `json:"event_id"`
	Data    struct {
		client.JobStatus
		CorrelationID string `json:"correlation_id"`
	} `json:"data"`
}

func main() {
	url := flag.String("amqp", env("LLMQ_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL (env LLMQ_AMQP_URL)")
	tenant := flag.String("tenant", env("LLMQ_TENANT", "default"), "tenant the tickets belong to (env LLMQ_TENANT)")
	model := flag.String("model", "qwen-plus", "model to ask (it needs the json_schema capability)")
	count := flag.Int("n", len(tickets), "how many tickets to send (the samples repeat)")
	timeout := flag.Duration("timeout", time.Minute, "give up when the answers take longer")
	flag.Parse()
	log.SetFlags(0)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	if err := run(ctx, *url, *tenant, *model, *count); err != nil {
		log.Fatalf("ticket-triage: %v", err)
	}
}

func run(ctx context.Context, url, tenant, model string, count int) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}

	// The reply queue exists before the first job is sent, so no answer is
	// lost; it lives as long as this process. Its name must begin
	// llmq.reply.<tenant>. for llmq to deliver to it.
	run := strings.ToLower(rand.Text()[:6])
	replyTo := client.ReplyQueue(tenant, "triage-"+run)
	if _, err := ch.QueueDeclare(replyTo, false, true, true, false, nil); err != nil {
		return fmt.Errorf("declare reply queue: %w", err)
	}
	replies, err := ch.Consume(replyTo, "", true, true, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume reply queue: %w", err)
	}

	pub, err := client.NewAMQPPublisher(url)
	if err != nil {
		return err
	}
	defer pub.Close()
	pending := map[string]string{} // correlation id -> ticket text
	for i := range count {
		text := tickets[i%len(tickets)]
		corr := fmt.Sprintf("ticket-%d", 1001+i)
		req, err := triageRequest(text)
		if err != nil {
			return err
		}
		// The job ID is unique per run: llmq processes an ID once.
		err = pub.Publish(ctx, client.Job{
			ID: "triage-" + run + "-" + fmt.Sprint(i+1), Tenant: tenant, Model: model, Request: req,
			ReplyTo: replyTo, CorrelationID: corr,
		})
		if err != nil {
			return err
		}
		pending[corr] = text
	}
	fmt.Printf("sent %d tickets; answers arrive on %s\n", count, replyTo)

	seen := map[string]bool{} // event ids: a result may be delivered twice
	failed := 0
	for len(pending) > 0 {
		var d amqp.Delivery
		var ok bool
		select {
		case d, ok = <-replies:
			if !ok {
				return fmt.Errorf("the connection to RabbitMQ closed with %d answers missing", len(pending))
			}
		case <-ctx.Done():
			return fmt.Errorf("%d of %d answers missing: %w", len(pending), count, context.Cause(ctx))
		}
		var ev event
		if err := json.Unmarshal(d.Body, &ev); err != nil || ev.Version != 1 {
			log.Printf("skipping a message that is not a version 1 result event: %.200s", d.Body)
			continue
		}
		if _, ok := pending[d.CorrelationId]; !ok || seen[ev.EventID] {
			continue
		}
		seen[ev.EventID] = true
		delete(pending, d.CorrelationId)
		if ev.Data.Status != client.StatusSucceeded {
			failed++
			fmt.Printf("%s %s: %s\n", d.CorrelationId, ev.Data.Status, describe(ev.Data.Error))
			continue
		}
		a, err := parseAnswer(ev.Data.Response)
		if err != nil {
			failed++
			fmt.Printf("%s unusable answer: %v\n", d.CorrelationId, err)
			continue
		}
		fmt.Printf("%s job=%s category=%s urgency=%s summary=%q\n", d.CorrelationId, ev.Data.ID, a.Category, a.Urgency, a.Summary)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d tickets were not triaged", failed, count)
	}
	fmt.Printf("all %d tickets triaged\n", count)
	return nil
}

// triageRequest is the OpenAI chat-completions body for one ticket.
func triageRequest(ticket string) (json.RawMessage, error) {
	return json.Marshal(map[string]any{
		"messages": []map[string]string{
			{"role": "system", "content": systemPrompt},
			{"role": "user", "content": ticket},
		},
		"max_tokens": 200,
		"response_format": map[string]any{
			"type":        "json_schema",
			"json_schema": map[string]any{"name": "triage", "strict": true, "schema": json.RawMessage(triageSchema)},
		},
	})
}

// parseAnswer reads the model's JSON answer out of a chat completion.
func parseAnswer(response json.RawMessage) (answer, error) {
	var completion struct {
		Choices []struct {
			Message struct{ Content string }
		}
	}
	var a answer
	if err := json.Unmarshal(response, &completion); err != nil || len(completion.Choices) == 0 {
		return a, fmt.Errorf("not a chat completion: %.200s", response)
	}
	content := completion.Choices[0].Message.Content
	if err := json.Unmarshal([]byte(content), &a); err != nil {
		return a, fmt.Errorf("not the JSON asked for: %.200s", content)
	}
	return a, nil
}

func describe(e *client.JobError) string {
	if e == nil {
		return "no error recorded"
	}
	return e.Kind + ": " + e.Message
}

func env(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}
