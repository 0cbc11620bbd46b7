package job

import (
	"net/url"
	"strings"
)

// ReplyPrefix begins every queue a job may name as its reply_to; the
// tenant and a dot follow (ReplyPrefix + tenant + "."). Anything else is
// refused, so llmq's broker credentials can never be aimed at its own lanes
// or at another tenant's queues.
const ReplyPrefix = "llmq.reply."

// Limits of the destination fields.
const (
	maxReplyTo       = 255 // AMQP's short string
	maxCorrelationID = 255
	maxCallbackURL   = 2048
	maxTopicLen      = 249 // Kafka's
)

var (
	replySuffixChars = newCharset("._:-") // [A-Za-z0-9._:-]+
	// Kafka's legal topic names.
	topicChars = newCharset("._-") // [A-Za-z0-9._-]{1,249}
)

// ReplyQueuePrefix is the prefix a reply_to of tenant must start with.
func ReplyQueuePrefix(tenant string) string { return ReplyPrefix + tenant + "." }

// ValidReplyTo reports whether replyTo is a queue a job of tenant may name.
func ValidReplyTo(tenant, replyTo string) bool {
	rest, ok := strings.CutPrefix(replyTo, ReplyQueuePrefix(tenant))
	return ok && len(replyTo) <= maxReplyTo && replySuffixChars.matches(rest, 0)
}

// ValidTopic reports whether t is a legal Kafka topic name (not "." or
// ".."-like: Kafka refuses names made only of dots).
func ValidTopic(t string) bool {
	return topicChars.matches(t, maxTopicLen) && strings.Trim(t, ".") != ""
}

// ValidateDestinations is validateDestinations for a job whose tenant was
// set after it was validated (a dead letter's body replayed under the
// dead letter's tenant).
func (j *Job) ValidateDestinations() error { return j.validateDestinations() }

// validateDestinations checks the syntax of where a result goes. What
// depends on configuration (the tenant's webhook hosts and result topics,
// whether a host resolves to a private address) is judged by
// internal/results when the job enters llmq.
func (j *Job) validateDestinations() error {
	if j.ReplyTo != "" && !ValidReplyTo(j.Tenant, j.ReplyTo) {
		prefix := ReplyQueuePrefix(j.Tenant)
		return invalid("reply_to", "must name a queue %q followed by up to %d characters of [A-Za-z0-9._:-]", prefix, maxReplyTo-len(prefix))
	}
	if j.CorrelationID != "" && (len(j.CorrelationID) > maxCorrelationID || !printableASCII(j.CorrelationID)) {
		return invalid("correlation_id", "must be 1..%d printable ASCII characters", maxCorrelationID)
	}
	if j.CallbackURL != "" {
		if err := checkCallbackSyntax(j.CallbackURL); err != nil {
			return err
		}
	}
	if j.ResultTopic != "" && !ValidTopic(j.ResultTopic) {
		return invalid("result_topic", "must be a Kafka topic name: 1..249 characters of [A-Za-z0-9._-]")
	}
	return nil
}

func checkCallbackSyntax(raw string) error {
	if len(raw) > maxCallbackURL {
		return invalid("callback_url", "must be at most %d bytes", maxCallbackURL)
	}
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() || u.Host == "" || u.Opaque != "" {
		return invalid("callback_url", "must be an absolute http or https URL")
	}
	if u.Scheme != "https" && u.Scheme != "http" {
		return invalid("callback_url", "must use https (or http where the operator allows it)")
	}
	if u.User != nil {
		return invalid("callback_url", "must not carry credentials")
	}
	if u.Fragment != "" {
		return invalid("callback_url", "must not have a fragment")
	}
	return nil
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
