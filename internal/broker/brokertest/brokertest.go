// Package brokertest is the conformance suite every broker driver passes
// (memory, rabbitmq, kafka). A driver's test calls Run with a factory that
// hands each case its own isolated names (a per-test prefix), and a Features
// struct where a driver legitimately differs.
package brokertest

import (
	"testing"
	"time"

	"github.com/llmq/llmq/internal/broker"
)

// Features lists where drivers legitimately differ.
type Features struct {
	// ExactRedelivered: Redelivered is true on every message handed back
	// (Nack, Close). Kafka only approximates it.
	ExactRedelivered bool
	// CompetingConsumers: two subscriptions on one lane share its messages
	// one by one (RabbitMQ, memory). Kafka assigns whole partitions instead.
	CompetingConsumers bool
	// DuplicatesOnReturn: when a subscriber stops, messages it already acked
	// may come back too (Kafka commits only up to the lowest unfinished
	// offset of a partition).
	DuplicatesOnReturn bool
	// HandBackRepublishes: a delivery handed back after a failed Retry or
	// DeadLetter publish is not returned to its queue; the driver retries
	// that publish in the background until it succeeds, holding the
	// delivery's prefetch slot meanwhile (Kafka). Without it the message is
	// redelivered at once and its slot is free (RabbitMQ, memory).
	HandBackRepublishes bool
}

// Driver is one isolated instance of a driver under test. Each function
// returns a new client; the factory registers its Close in t.Cleanup (Close
// must be safe to call twice).
type Driver struct {
	NewPublisher func(t *testing.T) broker.Publisher
	// NewSubscriber consumes the internal lanes (the workers' subscriber).
	NewSubscriber func(t *testing.T) broker.Subscriber
	// NewIntakeSubscriber consumes the public intake (the ingester's).
	NewIntakeSubscriber func(t *testing.T) broker.Subscriber
	NewInspector        func(t *testing.T) broker.Inspector
	// DeadLetters reads the driver's dead-letter queue.
	DeadLetters func(t *testing.T) broker.DeadLetterReader
	// BreakRetryPublishes makes the broker refuse the publishes of delayed
	// retries (as a memory alarm or an operator's max-length policy would)
	// until restore is called; it returns once they do fail, and restore
	// returns once they work again. The driver also restores in t.Cleanup;
	// restore may be called twice. Cases that need it skip where it is nil.
	BreakRetryPublishes func(t *testing.T) (restore func())
	// BreakDeadLetterPublishes does the same for DeadLetter's publishes.
	BreakDeadLetterPublishes func(t *testing.T) (restore func())
	Features                 Features
}

// Wait bounds every wait for something that should happen (not a timing
// assertion: a correct driver is far faster).
var Wait = 60 * time.Second

// Run runs every conformance case as a subtest, each with a fresh Driver.
func Run(t *testing.T, newDriver func(t *testing.T) Driver) {
	cases := []struct {
		name string
		fn   func(t *testing.T, d Driver)
	}{
		{"PublishConsumeAck", testPublishConsumeAck},
		{"LanesAreSeparate", testLanesAreSeparate},
		{"NackRedelivers", testNackRedelivers},
		{"AckAllOutOfOrder", testAckAllOutOfOrder},
		{"AcksBeforeCloseStick", testAcksBeforeCloseStick},
		{"RetryWaitsForDelay", testRetryWaitsForDelay},
		{"DeadLetterKeepsBody", testDeadLetterKeepsBody},
		{"DrainKeepsDeadLettersOnError", testDrainKeepsDeadLettersOnError},
		{"Depth", testDepth},
		{"CancelDrainsThenCloseReturns", testCancelDrainsThenCloseReturns},
		{"TenThousandNoLossNoDuplicate", testTenThousand},
		{"PrefetchRespected", testPrefetch},
		{"ClosedClients", testClosedClients},
		{"IntakeToLane", testIntakeToLane},
		{"PublishGoesToLane", testPublishGoesToLane},
		{"IntakeSettlements", testIntakeSettlements},
		{"FailedRetryPublishHandsBack", testFailedRetryPublishHandsBack},
		{"FailedDeadLetterPublishHandsBack", testFailedDeadLetterPublishHandsBack},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.fn(t, newDriver(t))
		})
	}
}
