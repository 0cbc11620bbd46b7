# The test command README gives; .ci/run runs exactly this.
.PHONY: test
test:
	go test -race -count=1 -timeout 30m ./...
