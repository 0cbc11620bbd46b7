# The test command README gives; .ci/run runs exactly this.
#
# Phase 1 runs every package in parallel against the shared services.
# Phase 2 runs, one package at a time, the tests that stop and start the
# machine's RabbitMQ or Postgres (named Test*ServiceRestart*), so an outage
# never lands in the middle of another package's test. Those tests run only
# where LLMQ_TEST_ALLOW_RESTART=1 (.ci/run sets it); elsewhere they say so and skip.
GO ?= go
RESTART_TESTS = ServiceRestart

.PHONY: test test-parallel test-restart
test: test-parallel test-restart

test-parallel:
	LLMQ_TEST_ALLOW_RESTART= $(GO) test -race -count=1 -timeout 30m ./...

test-restart:
	$(GO) test -race -count=1 -timeout 20m -p 1 -run '$(RESTART_TESTS)' ./internal/broker/rabbitmq/ ./integration/
