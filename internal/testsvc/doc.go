// Package testsvc hands tests the real services they need (docs/design.md#tests):
// Postgres from LLMQ_TEST_POSTGRES_URL, RabbitMQ from LLMQ_TEST_AMQP_URL and
// Kafka from LLMQ_TEST_KAFKA_BROKERS; where a variable is unset it starts the
// service with testcontainers-go when a Docker engine answers (Kafka falls
// back to franz-go's in-process kfake). Each test gets its own isolated
// database, vhost or topic names so tests run in parallel. A test that finds
// no service fails and names the variable to set; it never passes silently.
package testsvc
