package worker

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

func tk(lane job.Priority, tenant, id string) *task {
	return &task{job: job.Job{ID: id, Tenant: tenant, Priority: lane}}
}

func TestFairQueueWeights(t *testing.T) {
	q := newFairQueue(6, 3, 1)
	for i := range 100 {
		for _, l := range job.Priorities {
			q.Push(tk(l, "t", fmt.Sprint(l, i)))
		}
	}
	counts := map[job.Priority]int{}
	for range 100 {
		counts[q.Pop().job.Priority]++
	}
	require.Equal(t, map[job.Priority]int{job.PriorityHigh: 60, job.PriorityNormal: 30, job.PriorityLow: 10}, counts)
	// Starvation guard: low progresses in every window of 10 picks.
	q = newFairQueue(6, 3, 1)
	for i := range 1000 {
		q.Push(tk(job.PriorityHigh, "t", fmt.Sprint("h", i)))
	}
	q.Push(tk(job.PriorityLow, "t", "low"))
	for i := range 10 {
		if q.Pop().job.ID == "low" {
			return
		}
		_ = i
	}
	t.Fatal("low lane not picked within 10 picks")
}

func TestFairQueueTenants(t *testing.T) {
	q := newFairQueue(6, 3, 1)
	for i := range 100 {
		q.Push(tk(job.PriorityNormal, "flood", fmt.Sprint("f", i)))
	}
	q.Push(tk(job.PriorityNormal, "small", "s1"))
	q.Push(tk(job.PriorityNormal, "small", "s2"))
	var order []string
	for range 5 {
		order = append(order, q.Pop().job.ID)
	}
	require.Equal(t, []string{"f0", "s1", "f1", "s2", "f2"}, order)
	require.Equal(t, 97, q.Len())
	require.Len(t, q.Drain(), 97)
	require.Nil(t, q.Pop())
}

func TestChooseModel(t *testing.T) {
	w := &Worker{cfg: Config{FallbackAfter429: 2, Models: map[string]config.Model{
		"primary":  {Fallback: []string{"plain", "capable"}},
		"plain":    {},
		"capable":  {Capabilities: []string{"tools", "json_schema"}},
		"nofallbk": {},
	}}}
	rl := func(model string) store.AttemptError {
		return store.AttemptError{Model: model, Kind: "rate_limit_requests"}
	}
	srv := func(model string) store.AttemptError { return store.AttemptError{Model: model, Kind: "server"} }
	plain := job.Job{Model: "primary", Request: []byte(`{"messages":[]}`)}
	tools := job.Job{Model: "primary", Request: []byte(`{"messages":[],"tools":[{"type":"function"}]}`)}
	cases := []struct {
		name string
		j    job.Job
		errs []store.AttemptError
		want string
	}{
		{"no errors", plain, nil, "primary"},
		{"one 429", plain, []store.AttemptError{rl("primary")}, "primary"},
		{"two 429s fall back", plain, []store.AttemptError{rl("primary"), rl("primary")}, "plain"},
		{"5xx never falls back", plain, []store.AttemptError{srv("primary"), srv("primary"), srv("primary")}, "primary"},
		{"next in chain", plain, []store.AttemptError{rl("primary"), rl("primary"), rl("plain"), rl("plain")}, "capable"},
		{"fallback lacking capability skipped", tools, []store.AttemptError{rl("primary"), rl("primary")}, "capable"},
		{"all limited: fewest 429s", tools, []store.AttemptError{rl("primary"), rl("primary"), rl("capable"), rl("capable"), rl("capable")}, "primary"},
		{"job's own fallback_models win", job.Job{Model: "primary", FallbackModels: []string{"nofallbk"}, Request: []byte(`{}`)},
			[]store.AttemptError{rl("primary"), rl("primary")}, "nofallbk"},
		{"unknown fallback skipped", job.Job{Model: "primary", FallbackModels: []string{"ghost"}, Request: []byte(`{}`)},
			[]store.AttemptError{rl("primary"), rl("primary")}, "primary"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, w.chooseModel(&c.j, c.errs))
		})
	}
}
