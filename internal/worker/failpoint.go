package worker

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
)

// Failpoints are TEST-ONLY hooks that let the fault suite (integration/
// fault_*_test.go) kill a consumer at an exact point of a job's life,
// which a signal sent from outside cannot hit deterministically. They are
// off unless cmd/consumer finds LLMQ_FAILPOINT in its environment; the
// worker then calls Deps.Failpoint with the name of each point it passes.
// Production deployments never set the variable, and with Deps.Failpoint
// nil each point costs one nil check.
const (
	// FailpointAfterProviderCall is passed when a provider call has
	// succeeded and before its result is handed to the batched store write.
	FailpointAfterProviderCall = "after_provider_call"
	// FailpointAfterResultWrite is passed when a batch of results is
	// durable in Postgres and before any of its deliveries is acked.
	FailpointAfterResultWrite = "after_result_write"
)

// ParseFailpoint reads a failpoint spec, "name" or "name:n", and returns a
// Deps.Failpoint that calls fire the n-th time (default 1st) the named
// point is passed; every other point and every other pass do nothing.
// fire is normally a self-inflicted SIGKILL. An empty spec returns nil.
// The worker's points are known; other components of the process name
// theirs in more (the result relay's).
func ParseFailpoint(spec string, fire func(name string), more ...string) (func(name string), error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, nil
	}
	name, nth, hasN := strings.Cut(spec, ":")
	known := append([]string{FailpointAfterProviderCall, FailpointAfterResultWrite}, more...)
	if !slices.Contains(known, name) {
		return nil, fmt.Errorf("failpoint %q: unknown point (want one of %s)", name, strings.Join(known, ", "))
	}
	n := int64(1)
	if hasN {
		v, err := strconv.ParseInt(nth, 10, 64)
		if err != nil || v < 1 {
			return nil, fmt.Errorf("failpoint %q: want name:n with n ≥ 1", spec)
		}
		n = v
	}
	var passes atomic.Int64
	return func(point string) {
		if point == name && passes.Add(1) == n {
			fire(point)
		}
	}, nil
}

// failpoint passes the named test-only point (see ParseFailpoint).
func (w *Worker) failpoint(name string) {
	if w.fail != nil {
		w.fail(name)
	}
}
