package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/provider"
	"github.com/llmq/llmq/internal/ratecontrol"
)

// TaskRunner is what the worker needs of a provider for task jobs
// (DashScope's asynchronous image and video tasks; provider.Router has it).
type TaskRunner interface {
	SubmitTask(ctx context.Context, model, endpoint string, request []byte) (string, error)
	PollTask(ctx context.Context, model, id string) (string, *provider.Response, error)
}

// TaskStore is what the worker needs of the store for task jobs: the task
// id kept in the job's row (store.Store has it).
type TaskStore interface {
	SetTaskID(ctx context.Context, key job.Key, owner, taskID string) (bool, error)
}

var _ TaskRunner = (*provider.Router)(nil)

// runTask is the call of a task job (docs/design.md#kinds): submit the
// task, record its id in the job's row, then poll until it ends. A job
// whose row already holds a task id (a consumer that ran it died or shut
// down while it polled) is polled, never submitted again: the task is paid
// for. The whole call holds the job's admission permit, so the model's
// concurrency limit is a limit of running tasks; the answer's Latency is
// the whole call, the time the permit was held, which is what the governor
// learns from.
func (w *Worker) runTask(ctx context.Context, t *task) (*provider.Response, error) {
	start := time.Now()
	resp, err := w.runTaskCall(ctx, t)
	if resp != nil {
		resp.Latency = time.Since(start)
	}
	return resp, err
}

func (w *Worker) runTaskCall(ctx context.Context, t *task) (*provider.Response, error) {
	tr, ok := w.prov.(TaskRunner)
	ts, okStore := w.store.(TaskStore)
	if !ok || !okStore {
		return nil, unsupportedKind(job.KindTask)
	}
	id := t.rec.TaskID
	if id == "" {
		endpoint := config.DefaultTaskEndpoint
		if m, ok := w.cfg.Models[t.model]; ok {
			endpoint = m.TaskEndpointOf()
		}
		var err error
		if id, err = tr.SubmitTask(ctx, t.model, endpoint, t.job.Request); err != nil {
			return nil, err
		}
		submitted := time.Now()
		t.rec.TaskID = id
		// Durable before the first poll. When the store cannot take it the
		// task is polled anyway: it is paid for, and only a crash before
		// the result is stored would submit it again.
		if held, err := ts.SetTaskID(w.bg, t.key, w.cfg.Owner, id); err != nil || !held {
			w.log.Warn("task id not recorded; polling it anyway", "job_id", t.key.ID, "task_id", id, "error", err, "held", held)
		}
		return w.pollTask(ctx, tr, t.model, id, submitted, w.taskTimes.schedule(t.model, w.cfg.TaskPollInterval))
	}
	// A resumed task's submission is long past: poll at once, then every
	// interval.
	w.log.Info("resuming a submitted task", "job_id", t.key.ID, "task_id", id)
	return w.pollTask(ctx, tr, t.model, id, time.Now(), pollSchedule{every: w.cfg.TaskPollInterval})
}

// pollTask polls task id, submitted at submitted, on sched
// (task_schedule.go) until it ends, and learns the model's processing time
// from a task that succeeded. A poll that fails for a reason worth
// retrying (a 5xx, a timeout, a 429) is retried at the next one; ctx
// ending (shutdown, deadline, cancel) ends the call and leaves the task id
// in the row for whoever runs the job next.
func (w *Worker) pollTask(ctx context.Context, tr TaskRunner, model, id string, submitted time.Time, sched pollSchedule) (*provider.Response, error) {
	timer := time.NewTimer(sched.first - time.Since(submitted))
	defer timer.Stop()
	var prev time.Duration
	for {
		select {
		case <-timer.C:
		case <-ctx.Done():
			return nil, &provider.Error{Class: ratecontrol.ClassifyError(ctx.Err())}
		}
		status, resp, err := tr.PollTask(ctx, model, id)
		switch {
		case err != nil:
			var perr *provider.Error
			if errors.As(err, &perr) && !perr.Class.Kind.Retryable() && !perr.Class.Kind.RateLimited() {
				return nil, err
			}
		case status == provider.TaskSucceeded:
			w.taskTimes.observe(model, taskProcessingTime(resp.Body))
			return resp, nil
		case status != provider.TaskPending && status != provider.TaskRunning:
			// FAILED, CANCELED, UNKNOWN: the task is over without a result;
			// running the job again would pay for another.
			return nil, &provider.Error{Class: ratecontrol.Classification{Kind: ratecontrol.KindClient,
				Message: fmt.Sprintf("task %s ended %s", id, status)}}
		}
		prev = sched.next(time.Since(submitted), prev)
		timer.Reset(prev)
	}
}
