package ingest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os/exec"
	"regexp"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/kafka"
	"github.com/llmq/llmq/internal/broker/rabbitmq"
	"github.com/llmq/llmq/internal/ingest"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

// identityUsers: acme and globex each have a broker user; support has none.
var identityUsers = map[string]string{"u_acme": "acme", "u_globex": "globex"}

func tenantJob(id, tenant string) string {
	t := ""
	if tenant != "" {
		t = `"tenant":"` + tenant + `",`
	}
	return `{"id":"` + id + `",` + t + `"model":"qwen-plus","request":{"messages":[{"role":"user","content":"a"}],"max_tokens":16}}`
}

// The identity rule's verdicts, message by message, on the in-memory broker
// (which carries UserID and IntakeTenant as the drivers fill them).
func TestIngestBrokerIdentityDecidesTheTenant(t *testing.T) {
	t.Parallel()
	r := newRig(t, ingest.Config{BrokerUsers: identityUsers})
	ctx := context.Background()
	pub := func(msg broker.Message) {
		require.NoError(t, r.pub.PublishIntake(ctx, job.PriorityLow, msg))
	}
	// Accepted.
	pub(broker.Message{UserID: "u_acme", Body: []byte(tenantJob("a1", "acme"))})
	pub(broker.Message{UserID: "u_acme", Body: []byte(tenantJob("a2", ""))})
	pub(broker.Message{IntakeTenant: "globex", Body: []byte(tenantJob("g1", ""))})
	pub(broker.Message{Body: []byte(tenantJob("s1", "support"))})
	pub(broker.Message{UserID: "u_nobody", Body: []byte(tenantJob("s2", "support"))})
	// Refused.
	pub(broker.Message{UserID: "u_acme", Body: []byte(tenantJob("v1", "globex"))})
	pub(broker.Message{Body: []byte(tenantJob("v2", "globex"))})
	pub(broker.Message{UserID: "u_nobody", Body: []byte(tenantJob("v3", "globex"))})
	pub(broker.Message{IntakeTenant: "acme", Body: []byte(tenantJob("v4", "globex"))})
	// Malformed from a mapped user: failed under the user's tenant.
	pub(broker.Message{UserID: "u_acme", Body: []byte(`{"id":"m1","model":"qwen-plus","request":{}}`)})

	for _, k := range []job.Key{{Tenant: "acme", ID: "a1"}, {Tenant: "acme", ID: "a2"}, {Tenant: "globex", ID: "g1"},
		{Tenant: "support", ID: "s1"}, {Tenant: "support", ID: "s2"}} {
		assert.Equal(t, job.StatusQueued, r.waitRow(k.Tenant, k.ID).Status, k)
	}
	assert.Equal(t, job.StatusFailed, r.waitRow("acme", "m1").Status)

	mismatch := waitDeadLetters(t, r.store, "acme", 3)
	for _, dl := range mismatch {
		if dl.JobID == "m1" {
			continue
		}
		assert.Equal(t, store.DeadLetterMessage, dl.Kind)
		assert.Empty(t, dl.JobID, "no id is taken for a refused identity")
		assert.Contains(t, dl.Reason, `the publisher belongs to tenant "acme", the body names tenant "globex"`)
		assert.Regexp(t, `"v[14]"`, string(dl.Body))
	}
	required := waitDeadLetters(t, r.store, job.DefaultTenant, 2)
	for _, dl := range required {
		assert.Contains(t, dl.Reason, `tenant "globex" takes raw publishes only from its broker_users`)
		assert.NotContains(t, dl.Reason, "u_globex", "the reason names the rule, not the user")
	}
	for _, id := range []string{"v1", "v2", "v3", "v4"} {
		_, err := r.store.Get(ctx, job.Key{Tenant: "globex", ID: id})
		assert.ErrorIs(t, err, store.ErrNotFound, "nothing under the claimed tenant for %s", id)
	}
	dls, _, err := r.store.ListDeadLetters(ctx, "globex", "", 100)
	require.NoError(t, err)
	assert.Empty(t, dls, "no dead letter is filed under the claimed tenant")
}

// The same rule against a real RabbitMQ: user_id is set by a second broker
// user and validated by RabbitMQ, then read by the intake subscriber.
func TestIngestRabbitMQUserIDDecidesTheTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := rabbitmq.Config{URL: testsvc.AMQPURL(t), Prefix: testsvc.AMQPPrefix(t),
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rabbitmq.DeleteTopology(cctx, cfg); err != nil {
			t.Errorf("delete topology: %v", err)
		}
	})
	// The producer's permissions of deploy/rabbitmq/definitions.json:
	// write on the intake exchange, nothing else.
	producerURL, acmeUser := brokerUser(t, cfg.URL, "^$", "^"+regexp.QuoteMeta(cfg.Prefix+broker.JobsExchange)+"$", "^$")
	intake, err := rabbitmq.NewIntakeSubscriber(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = intake.Close() })
	lanes, err := rabbitmq.NewPublisher(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lanes.Close() })
	st := store.New(testsvc.Postgres(t))
	runIngester(t, ingest.Config{BrokerUsers: map[string]string{acmeUser: "acme", "u_globex_elsewhere": "globex"}},
		st, intake, lanes)

	conn, err := amqp.Dial(producerURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	publish := func(userID, body string) {
		t.Helper()
		conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, cfg.Prefix+broker.JobsExchange, string(job.PriorityNormal),
			true, false, amqp.Publishing{UserId: userID, DeliveryMode: amqp.Persistent, Body: []byte(body)})
		require.NoError(t, err)
		ok, err := conf.WaitContext(ctx)
		require.NoError(t, err)
		require.True(t, ok, "broker confirmed")
	}
	publish(acmeUser, tenantJob("squat", "globex"))
	publish(acmeUser, tenantJob("own", "acme"))
	publish(acmeUser, tenantJob("plain", ""))

	rig := &rig{t: t, store: st}
	assert.Equal(t, job.StatusQueued, rig.waitRow("acme", "own").Status)
	assert.Equal(t, job.StatusQueued, rig.waitRow("acme", "plain").Status, "a body without tenant is the user's tenant's")
	dls := waitDeadLetters(t, st, "acme", 1)
	assert.Contains(t, dls[0].Reason, "broker identity:")
	assert.Contains(t, string(dls[0].Body), `"squat"`)
	_, err = st.Get(ctx, job.Key{Tenant: "globex", ID: "squat"})
	assert.ErrorIs(t, err, store.ErrNotFound, "the refused publish left no row under globex")
	_, err = st.Get(ctx, job.Key{Tenant: job.DefaultTenant, ID: "plain"})
	assert.ErrorIs(t, err, store.ErrNotFound)

	// The publish-only user reads nothing: consuming the intake is refused.
	rch, err := conn.Channel()
	require.NoError(t, err)
	_, err = rch.Consume(cfg.Prefix+broker.JobsTopicPrefix+string(job.PriorityNormal), "", false, false, false, false, nil)
	var amqpErr *amqp.Error
	require.ErrorAs(t, err, &amqpErr, "a publish-only user cannot consume")
	assert.Equal(t, amqp.AccessRefused, amqpErr.Code)

	// RabbitMQ itself refuses a user_id that is not the connection's user:
	// the channel is closed with PRECONDITION_FAILED.
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	_, _ = ch.PublishWithDeferredConfirmWithContext(ctx, cfg.Prefix+broker.JobsExchange, string(job.PriorityNormal),
		true, false, amqp.Publishing{UserId: "u_globex_elsewhere", Body: []byte(tenantJob("forged", "globex"))})
	select {
	case e := <-closed:
		require.NotNil(t, e)
		assert.Equal(t, amqp.PreconditionFailed, e.Code)
	case <-time.After(30 * time.Second):
		t.Fatal("RabbitMQ accepted a forged user_id")
	}
}

// brokerUser creates a RabbitMQ user with a random name and password and
// the given permissions on the vhost of baseURL with rabbitmqctl, deleted
// when the test ends, and returns its URL and name.
func brokerUser(t *testing.T, baseURL, configure, write, read string) (userURL, name string) {
	t.Helper()
	ctl, err := exec.LookPath("rabbitmqctl")
	if err != nil {
		t.Fatalf("this test creates a broker user with rabbitmqctl on the broker of %s: %v", testsvc.EnvAMQPURL, err)
	}
	run := func(args ...string) {
		t.Helper()
		out, err := exec.Command(ctl, args...).CombinedOutput()
		require.NoError(t, err, "rabbitmqctl %s: %s", args[0], out)
	}
	uri, err := amqp.ParseURI(baseURL)
	require.NoError(t, err)
	var b [8]byte
	_, _ = rand.Read(b[:])
	name, password := "u_acme_"+hex.EncodeToString(b[:4]), hex.EncodeToString(b[4:])
	run("add_user", name, password)
	t.Cleanup(func() {
		out, err := exec.Command(ctl, "delete_user", name).CombinedOutput()
		if err != nil {
			t.Errorf("rabbitmqctl delete_user %s: %v: %s", name, err, out)
		}
	})
	run("set_permissions", "-p", uri.Vhost, name, configure, write, read)
	u, err := url.Parse(baseURL)
	require.NoError(t, err)
	u.User = url.UserPassword(name, password)
	return u.String(), name
}

// waitDeadLetters waits until the tenant has at least n dead letters and
// returns them.
func waitDeadLetters(t *testing.T, st *store.Store, tenant string, n int) []store.DeadLetterRow {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		dls, _, err := st.ListDeadLetters(context.Background(), tenant, "", 100)
		require.NoError(t, err)
		if len(dls) >= n {
			return dls
		}
		if time.Now().After(deadline) {
			t.Fatalf("tenant %s: %d of %d dead letters within 30s", tenant, len(dls), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Kafka: a tenant with broker users has intake topics of its own, and the
// shared intake cannot claim it (against kfake).
func TestIngestKafkaTenantTopicDecidesTheTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := kafka.Config{Brokers: testsvc.KafkaBrokers(t), Prefix: testsvc.KafkaPrefix(t), TenantTopics: []string{"globex"}}
	intake, err := kafka.NewIntakeSubscriber(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = intake.Close() })
	pub, err := kafka.NewPublisher(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	st := store.New(testsvc.Postgres(t))
	runIngester(t, ingest.Config{BrokerUsers: map[string]string{"User:globex-producer": "globex"}}, st, intake, pub)

	require.NoError(t, pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{Key: "squat", Body: []byte(tenantJob("squat", "globex"))}))
	require.NoError(t, pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{Key: "own", IntakeTenant: "globex",
		Body: []byte(tenantJob("own", ""))}))
	require.NoError(t, pub.PublishIntake(ctx, job.PriorityNormal, broker.Message{Key: "other", Body: []byte(tenantJob("other", "support"))}))

	rig := &rig{t: t, store: st}
	assert.Equal(t, job.StatusQueued, rig.waitRow("globex", "own").Status, "the topic's tenant")
	assert.Equal(t, job.StatusQueued, rig.waitRow("support", "other").Status, "a tenant without broker users is as before")
	dls := waitDeadLetters(t, st, job.DefaultTenant, 1)
	assert.Contains(t, dls[0].Reason, `tenant "globex" takes raw publishes only from`)
	_, err = st.Get(ctx, job.Key{Tenant: "globex", ID: "squat"})
	assert.ErrorIs(t, err, store.ErrNotFound, "the shared intake left no row under globex")
}
