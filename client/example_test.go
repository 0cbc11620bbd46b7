package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/llmq/llmq/client"
)

// Submit a job over HTTP and wait for its result. (apiURL and apiKey name
// an llmq deployment; the tests start one.)
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.New(apiURL, client.WithAPIKey(apiKey))
	if err != nil {
		log.Fatal(err)
	}
	sub, err := c.Submit(ctx, client.Job{
		ID:       "ticket-4711-summary",
		Model:    "qwen-plus",
		Request:  json.RawMessage(`{"messages": [{"role": "user", "content": "Summarise ticket 4711"}], "max_tokens": 64}`),
		Metadata: json.RawMessage(`{"ticket": 4711}`),
	})
	if err != nil {
		log.Fatal(err)
	}
	st, err := c.Wait(ctx, sub.ID, client.WaitOptions{})
	if err != nil {
		log.Fatal(err)
	}
	var completion struct {
		Choices []struct {
			Message struct{ Content string }
		}
	}
	if err := json.Unmarshal(st.Response, &completion); err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.ID, st.Status, st.ModelUsed, len(completion.Choices[0].Message.Content) > 0)
	// Output: ticket-4711-summary succeeded qwen-plus true
}

// Publish a job to RabbitMQ, then follow it over HTTP: the API knows it
// once llmq's ingester has stored it, so Wait takes a 404 for "not yet"
// for a while.
func ExampleAMQPPublisher() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub, err := client.NewAMQPPublisher(amqpURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	job := client.Job{
		ID:       "moderation-88121",
		Tenant:   "support", // on a queue the job names its tenant (default: "default")
		Model:    "qwen-plus",
		Priority: client.PriorityHigh,
		Request:  json.RawMessage(`{"messages": [{"role": "user", "content": "Is this comment abusive? …"}], "max_tokens": 16}`),
	}
	if err := pub.Publish(ctx, job); err != nil {
		log.Fatal(err) // client.IsRetryable(err) says whether publishing it again may work
	}

	c, err := client.New(apiURL, client.WithAPIKey(apiKey))
	if err != nil {
		log.Fatal(err)
	}
	st, err := c.Wait(ctx, job.ID, client.WaitOptions{NotFoundGrace: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.ID, st.Status)
	// Output: moderation-88121 succeeded
}

// Publish a job to Kafka: topic llmq.jobs.<priority>, keyed by job ID.
func ExampleKafkaPublisher() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub, err := client.NewKafkaPublisher(kafkaBrokers)
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	job := client.Job{
		ID:       "invoice-2026-0042-extract",
		Tenant:   "support",
		Model:    "qwen-plus",
		Priority: client.PriorityLow,
		Request:  json.RawMessage(`{"messages": [{"role": "user", "content": "Extract the total of invoice 2026-0042"}]}`),
	}
	if err := pub.Publish(ctx, job); err != nil {
		log.Fatal(err)
	}

	c, err := client.New(kafkaAPIURL, client.WithAPIKey(apiKey))
	if err != nil {
		log.Fatal(err)
	}
	st, err := c.Wait(ctx, job.ID, client.WaitOptions{NotFoundGrace: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.ID, st.Status)
	// Output: invoice-2026-0042-extract succeeded
}

// A refused submission says why, and whether trying again could help.
func ExampleIsRetryable() {
	ctx := context.Background()
	c, err := client.New(apiURL, client.WithAPIKey(apiKey))
	if err != nil {
		log.Fatal(err)
	}
	_, err = c.Submit(ctx, client.Job{Model: "qwen-plus", Request: json.RawMessage(`{"messages": []}`)})
	var apiErr *client.APIError
	if errors.As(err, &apiErr) {
		fmt.Println(apiErr.StatusCode, apiErr.Field, client.IsRetryable(err))
	}
	// Output: 400 request.messages false
}
