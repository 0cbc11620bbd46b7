package broker

import "time"

// DefaultRetryTiers are the fixed delays of the retry holding queues/topics.
// A delay is served by the largest tier not above it, then re-tiered on
// arrival while time remains, so a retry never arrives early.
var DefaultRetryTiers = []time.Duration{
	200 * time.Millisecond, time.Second, 5 * time.Second,
	30 * time.Second, 2 * time.Minute, 10 * time.Minute,
}

// PickTier returns the largest tier not above remaining, or the smallest
// tier when remaining is below all of them (arriving late, never early).
// tiers must be sorted ascending and non-empty.
func PickTier(tiers []time.Duration, remaining time.Duration) time.Duration {
	best := tiers[0]
	for _, t := range tiers {
		if t <= remaining {
			best = t
		}
	}
	return best
}

// Header names every driver uses on the wire.
const (
	// HeaderDueAt holds the earliest delivery time of a delayed retry in
	// Unix milliseconds.
	HeaderDueAt = "x-llmq-due-at"
	// HeaderRedelivered marks a message re-published by Nack on brokers
	// without a native redelivery flag (Kafka).
	HeaderRedelivered = "x-llmq-redelivered"
)

// MergeHeaders returns a copy of base with extra merged over it.
func MergeHeaders(base, extra map[string]string) map[string]string {
	out := make(map[string]string, len(base)+len(extra))
	for k, v := range base {
		out[k] = v
	}
	for k, v := range extra {
		out[k] = v
	}
	return out
}
