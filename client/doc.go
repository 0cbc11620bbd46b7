// Package client is the Go client of llmq, the queue that runs LLM jobs
// under a provider's rate limits: submit jobs over HTTP or publish them to
// RabbitMQ or Kafka, then read their results.
//
// Over HTTP, a Client submits, reads, waits for and cancels jobs, and lists
// and replays dead letters:
//
//	c, err := client.New("http://llmq:8080", client.WithAPIKey(key))
//	sub, err := c.Submit(ctx, client.Job{
//		Model:   "qwen-plus",
//		Request: json.RawMessage(`{"messages":[{"role":"user","content":"Summarise ticket 4711"}]}`),
//	})
//	st, err := c.Wait(ctx, sub.ID, client.WaitOptions{})
//	if st.Status == client.StatusSucceeded {
//		use(st.Response) // the provider's chat-completions response
//	}
//
// Straight to the broker, a Publisher puts the job on llmq's intake, the
// exchange llmq.jobs (routing key = priority) or the topics
// llmq.jobs.<priority> (key = job ID); the job then needs an ID and,
// unless it belongs to tenant "default", its Tenant:
//
//	pub, err := client.NewAMQPPublisher("amqp://user:pass@rabbitmq:5672/")
//	// or: pub, err := client.NewKafkaPublisher([]string{"kafka:9092"})
//	err = pub.Publish(ctx, client.Job{ID: "ticket-4711-summary", Tenant: "support", Model: "qwen-plus", Request: req})
//
// # Idempotency
//
// A job is identified by its tenant and ID, and an ID is processed once:
// submitting or publishing the same job again returns or keeps the job
// already held. Submit gives a job without an ID a random one (NewID)
// before its first attempt, so retrying a submission — after a timeout, a
// 503 or back-pressure — never runs a job twice.
//
// # Errors
//
// Errors say whether to retry: IsRetryable(err) is true for 5xx,
// back-pressure and lost connections, false for 4xx and invalid jobs. A 429
// is a *BackpressureError with the server's Retry-After; other API errors
// are an *APIError naming the offending field of a 400; publishers return a
// *ValidationError before publishing an invalid job and a *PublishError
// when the broker did not take it. Submit does not wait out back-pressure
// unless the client has WithSubmitRetry.
//
// The job message, the HTTP API and the names on the brokers are llmq's
// contract (docs/design.md#contract); this package's types mirror it.
package client
