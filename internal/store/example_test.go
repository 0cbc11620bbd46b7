package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// The consumer's path for one message. The job row was stored before the
// message was published (by the API, or by the ingester for a message sent
// to the intake), so the message is only a wake-up: read its key, claim the
// stored row, and run the claimed Record's job, never the message's copy.
// Then store the result, schedule a retry, or give up. (Not run: it needs a
// database in LLMQ_POSTGRES_URL.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("LLMQ_POSTGRES_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := store.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	s := store.New(pool)

	msg := []byte(`{"id": "ticket-4711-summary", "model": "qwen-plus",
		"request": {"messages": [{"role": "user", "content": "Summarise ticket 4711"}]}}`)
	key, err := job.ReadKey(msg)
	if err != nil {
		log.Fatal(err) // a real consumer dead-letters it (kind message): s.RecordDeadLetter
	}
	claims, err := s.ClaimBatch(ctx, []job.Key{key}, "consumer-1", 2*time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	c := claims[0]
	switch c.Outcome {
	case store.Claimed:
		// … call the provider with c.Record.Job for attempt c.Attempt …
		ok, err := s.Complete(ctx, c.AttemptOf("consumer-1"), store.Result{
			ModelUsed: "qwen-plus", Response: json.RawMessage(`{"choices": []}`), PromptTokens: 12, CompletionTokens: 40,
		})
		fmt.Println(ok, err)
	case store.Busy, store.NotDue:
		fmt.Println("redeliver in", c.RetryIn)
	case store.Exhausted:
		fmt.Println("dead-letter it")
	case store.NotFound:
		fmt.Println("no such job was ever stored: dead-letter the message")
	default: // AlreadyFinished, Cancelled: a duplicate delivery; ack it
	}
}
