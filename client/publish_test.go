package client_test

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/client"
)

// Jobs published concurrently through one publisher, over RabbitMQ and
// over Kafka, in every priority, all succeed and read back over HTTP.
func TestPublishers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		api  string
		open func() (client.Publisher, error)
	}{
		{"amqp", apiURL, func() (client.Publisher, error) { return client.NewAMQPPublisher(amqpURL) }},
		{"kafka", kafkaAPIURL, func() (client.Publisher, error) { return client.NewKafkaPublisher(kafkaBrokers) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			pub, err := tc.open()
			require.NoError(t, err)
			defer func() { require.NoError(t, pub.Close()) }()

			priorities := []client.Priority{client.PriorityHigh, client.PriorityNormal, client.PriorityLow, ""}
			deadline := time.Now().Add(time.Hour)
			jobs := make([]client.Job, 24)
			for i := range jobs {
				jobs[i] = client.Job{
					ID: fmt.Sprintf("pub-%s-%02d", tc.name, i), Tenant: "support", Model: "qwen-plus",
					Priority: priorities[i%len(priorities)], Request: chatRequest(fmt.Sprint("job ", i)),
					Deadline: &deadline, MaxAttempts: 3, Metadata: json.RawMessage(fmt.Sprintf(`{"n": %d}`, i)),
				}
			}
			var wg sync.WaitGroup
			errs := make([]error, len(jobs))
			for i, j := range jobs {
				wg.Go(func() { errs[i] = pub.Publish(ctx, j) })
			}
			wg.Wait()
			for i, err := range errs {
				require.NoError(t, err, "publish %s", jobs[i].ID)
			}

			c := newClient(t, tc.api)
			for _, j := range jobs {
				_, err := c.Wait(ctx, j.ID, client.WaitOptions{NotFoundGrace: 30 * time.Second})
				require.NoError(t, err)
				st, err := c.Get(ctx, j.ID)
				require.NoError(t, err)
				assert.Equal(t, client.StatusSucceeded, st.Status, "job %s", j.ID)
				assert.Equal(t, "qwen-plus", st.ModelUsed)
				assert.Equal(t, 1, st.Attempts)
			}
		})
	}
}

// A publisher refuses a job that cannot be one before it is sent, naming
// the field.
func TestPublishValidates(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	amqpPub, err := client.NewAMQPPublisher(amqpURL)
	require.NoError(t, err)
	defer amqpPub.Close()
	kafkaPub, err := client.NewKafkaPublisher([]string{"127.0.0.1:1"}) // never dialled
	require.NoError(t, err)
	defer kafkaPub.Close()

	good := client.Job{ID: "v-1", Model: "qwen-plus", Request: chatRequest("x")}
	for _, tc := range []struct {
		field  string
		change func(*client.Job)
	}{
		{"id", func(j *client.Job) { j.ID = "" }},
		{"id", func(j *client.Job) { j.ID = "has space" }},
		{"id", func(j *client.Job) { j.ID = ".." }},
		{"tenant", func(j *client.Job) { j.Tenant = "a/b" }},
		{"model", func(j *client.Job) { j.Model = "" }},
		{"priority", func(j *client.Job) { j.Priority = "urgent" }},
		{"request", func(j *client.Job) { j.Request = nil }},
		{"request", func(j *client.Job) { j.Request = json.RawMessage(`"hello"`) }},
		{"request", func(j *client.Job) { j.Request = json.RawMessage(`{"messages": [`) }},
		{"metadata", func(j *client.Job) { j.Metadata = json.RawMessage(`[1]`) }},
	} {
		j := good
		tc.change(&j)
		for _, pub := range []client.Publisher{amqpPub, kafkaPub} {
			err := pub.Publish(ctx, j)
			var v *client.ValidationError
			require.ErrorAs(t, err, &v, "%T %+v", pub, j)
			assert.Equal(t, tc.field, v.Field)
			assert.False(t, client.IsRetryable(err))
		}
	}
}

// On a vhost where llmq does not run, a publish fails as unroutable,
// whether the exchange is missing or no queue is bound to it, and is not
// worth retrying; the publisher recovers its channel after the first.
func TestAMQPPublisherWithoutLLMQ(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	vhost, err := newVhost(cleanup(t))
	require.NoError(t, err)
	pub, err := client.NewAMQPPublisher(vhost)
	require.NoError(t, err)
	defer pub.Close()
	job := client.Job{ID: "nowhere-1", Model: "qwen-plus", Request: chatRequest("x")}

	err = pub.Publish(ctx, job)
	require.ErrorIs(t, err, client.ErrUnroutable, "no exchange")
	assert.Contains(t, err.Error(), "llmq.jobs")
	assert.False(t, client.IsRetryable(err))

	conn, err := amqp.Dial(vhost)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclare(client.IntakeExchange, amqp.ExchangeDirect, true, false, false, false, nil))

	err = pub.Publish(ctx, job)
	require.ErrorIs(t, err, client.ErrUnroutable, "no queue bound")
	var pe *client.PublishError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "nowhere-1", pe.JobID)
	assert.Equal(t, "exchange llmq.jobs, routing key normal", pe.To)
}

// watchIntake binds a fresh queue of the vhost to the intake's normal
// routing key, as llmq's intake queue would be, declaring the exchange
// when llmq has not, and returns a channel and the queue's name.
func watchIntake(t *testing.T, vhostURL string) (*amqp.Channel, string) {
	t.Helper()
	conn, err := amqp.Dial(vhostURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclare(client.IntakeExchange, amqp.ExchangeDirect, true, false, false, false, nil))
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(q.Name, string(client.PriorityNormal), client.IntakeExchange, false, nil))
	return ch, q.Name
}

// An AMQP publisher whose connection the broker closes fails the publishes
// of that moment retryably and reconnects on the next.
func TestAMQPPublisherReconnects(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	vhostURL, err := newVhost(cleanup(t))
	require.NoError(t, err)
	ch, q := watchIntake(t, vhostURL)

	pub, err := client.NewAMQPPublisher(vhostURL)
	require.NoError(t, err)
	defer pub.Close()
	job := client.Job{ID: "reconnect-1", Model: "qwen-plus", Request: chatRequest("x")}
	require.NoError(t, pub.Publish(ctx, job))

	vhost := vhostURL[strings.LastIndex(vhostURL, "/")+1:]
	out, err := exec.Command("rabbitmqctl", "close_all_connections", "--vhost", vhost, "test").CombinedOutput()
	require.NoError(t, err, "%s", out)

	ch, q = watchIntake(t, vhostURL) // the test's own connection was closed too
	// The publish that meets the closed connection fails retryably; the
	// next one reconnects.
	for attempt := 1; ; attempt++ {
		err := pub.Publish(ctx, job)
		if err == nil {
			break
		}
		t.Logf("attempt %d: %v", attempt, err)
		require.True(t, client.IsRetryable(err), "%v", err)
		require.Less(t, attempt, 3, "still failing: %v", err)
	}
	msg, ok, err := ch.Get(q, true)
	require.NoError(t, err)
	require.True(t, ok, "the job reached the queue after the reconnect")
	assert.Equal(t, "reconnect-1", msg.MessageId)
	assert.Equal(t, amqp.Persistent, msg.DeliveryMode)
	assert.JSONEq(t, `{"id":"reconnect-1","model":"qwen-plus","request":`+string(chatRequest("x"))+`}`, string(msg.Body))
}

// A job's reply_to and correlation_id travel in the body and in the AMQP
// properties of the same names.
func TestAMQPPublisherSetsReplyProperties(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	vhostURL, err := newVhost(cleanup(t))
	require.NoError(t, err)
	ch, q := watchIntake(t, vhostURL)

	pub, err := client.NewAMQPPublisher(vhostURL)
	require.NoError(t, err)
	defer pub.Close()
	reply := client.ReplyQueue("support", "triage-1")
	job := client.Job{ID: "reply-1", Tenant: "support", Model: "qwen-plus", Request: chatRequest("x"),
		ReplyTo: reply, CorrelationID: "ticket-4711"}
	require.NoError(t, pub.Publish(ctx, job))
	msg, ok, err := ch.Get(q, true)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, reply, msg.ReplyTo)
	assert.Equal(t, "ticket-4711", msg.CorrelationId)
	u, err := amqp.ParseURI(vhostURL)
	require.NoError(t, err)
	assert.Equal(t, u.Username, msg.UserId, "user_id is the connection's user, for llmq's broker identity")
	var body client.Job
	require.NoError(t, json.Unmarshal(msg.Body, &body))
	assert.Equal(t, reply, body.ReplyTo)
	assert.Equal(t, "ticket-4711", body.CorrelationID)
}

// A publisher on the caller's channel publishes and leaves the channel open
// when closed; a closed publisher refuses to publish.
func TestAMQPPublisherOnChannel(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	conn, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)

	pub, err := client.NewAMQPPublisherOnChannel(ch)
	require.NoError(t, err)
	job := client.Job{ID: "on-channel-1", Tenant: "support", Model: "qwen-plus", Request: chatRequest("x")}
	require.NoError(t, pub.Publish(ctx, job))
	require.NoError(t, pub.Close())
	assert.False(t, ch.IsClosed())
	err = pub.Publish(ctx, job)
	require.ErrorIs(t, err, client.ErrClosed)
	assert.False(t, client.IsRetryable(err))

	st, err := newClient(t, apiURL).Wait(ctx, job.ID, client.WaitOptions{NotFoundGrace: 30 * time.Second})
	require.NoError(t, err)
	assert.Equal(t, client.StatusSucceeded, st.Status)

	pub, err = client.NewAMQPPublisherOnChannel(ch)
	require.NoError(t, err)
	require.NoError(t, ch.Close())
	require.ErrorIs(t, pub.Publish(ctx, job), client.ErrClosed)
}

func TestKafkaPublisherClosed(t *testing.T) {
	t.Parallel()
	pub, err := client.NewKafkaPublisher(kafkaBrokers)
	require.NoError(t, err)
	require.NoError(t, pub.Close())
	err = pub.Publish(testContext(t), client.Job{ID: "closed-1", Model: "qwen-plus", Request: chatRequest("x")})
	require.ErrorIs(t, err, client.ErrClosed)
	assert.False(t, client.IsRetryable(err))

	_, err = client.NewKafkaPublisher(nil)
	require.Error(t, err)
}
