package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// Task states of DashScope's asynchronous tasks.
const (
	TaskPending   = "PENDING"
	TaskRunning   = "RUNNING"
	TaskSucceeded = "SUCCEEDED"
	TaskFailed    = "FAILED"
)

// defaultTaskDuration is a task's processing time when the model sets none.
const defaultTaskDuration = 2 * time.Second

// taskPending is the share of a task's time it reports PENDING.
const taskPending = 0.2

// simTask is one submitted task: its state follows from the clock.
type simTask struct {
	id, model       string
	submitted, ends time.Time
}

// tasks are a simulator's asynchronous tasks (DashScope's native API:
// image and video generation). A task model's RPM and RPS limit
// submissions; MaxRunningTasks limits the tasks not yet finished, counted
// when one is submitted. Tasks are kept for the simulator's life.
type tasks struct {
	mu   sync.Mutex
	byID map[string]*simTask
	// running and peak count a model's unfinished tasks (see unfinished);
	// overruns counts submissions admitted above MaxRunningTasks (the
	// referee: 0 unless the simulator is wrong); polls counts a model's
	// task queries.
	peak, overruns, polls map[string]int64
}

func (t *tasks) unfinished(model string, now time.Time) int64 {
	var n int64
	for _, x := range t.byID {
		if x.model == model && now.Before(x.ends) {
			n++
		}
	}
	return n
}

// dashScopeTaskError answers in DashScope's native error format, which its
// native API uses whatever the simulator's dialect.
func dashScopeTaskError(w http.ResponseWriter, status int, code, msg, requestID string) {
	writeJSON(w, status, dashScopeError{Code: code, Message: msg, RequestID: requestID})
}

// handleTaskSubmit serves POST /api/v1/services/aigc/{path...}: with
// X-DashScope-Async: enable it creates a task of the body's model and
// answers its id (PENDING); a submission over the model's RPM or RPS is a
// 429 Throttling.RateQuota, one while MaxRunningTasks tasks are unfinished
// a 429 Throttling ("too many running tasks").
func (s *Simulator) handleTaskSubmit(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	id := fmt.Sprintf("task-sim%012x", s.ids.Add(1))
	w.Header().Set("x-request-id", id)
	if r.Header.Get("X-DashScope-Async") != "enable" {
		dashScopeTaskError(w, http.StatusForbidden, "AccessDenied", "current user api does not support synchronous calls", id)
		return
	}
	var req struct {
		Model string          `json:"model"`
		Input json.RawMessage `json:"input"`
	}
	if err := json.Unmarshal(body, &req); err != nil || len(req.Input) == 0 {
		dashScopeTaskError(w, http.StatusBadRequest, "InvalidParameter", "body must be a JSON object with model and input", id)
		return
	}
	md := s.model(req.Model)
	if md == nil || md.config().Kind != KindTask {
		dashScopeTaskError(w, http.StatusBadRequest, "InvalidParameter", fmt.Sprintf("Model not exist or is not a task model: %s", req.Model), id)
		return
	}
	cfg := md.config()
	s.tasks.mu.Lock()
	defer s.tasks.mu.Unlock()
	now := s.clock.Now()
	running := s.tasks.unfinished(req.Model, now)
	if cfg.MaxRunningTasks > 0 && running >= cfg.MaxRunningTasks {
		md.rejectUnadmitted(now.UnixNano(), ReasonRunningTasks)
		dashScopeTaskError(w, http.StatusTooManyRequests, "Throttling",
			fmt.Sprintf("Too many running tasks for model %s: limit %d, please try again later.", req.Model, cfg.MaxRunningTasks), id)
		return
	}
	a := md.admit(r.Context(), s, 0, 0, faultNone, 0)
	if !a.admitted() {
		setRateHeaders(w.Header(), a.headers)
		dashScopeTaskError(w, http.StatusTooManyRequests, dashScopeCode(a.refused.reason), limitMessage(req.Model, a.refused), id)
		return
	}
	md.done() // a submission ends at once; the task runs on
	d := taskDuration(cfg, id)
	s.tasks.byID[id] = &simTask{id: id, model: req.Model, submitted: now, ends: now.Add(d)}
	running++
	s.tasks.peak[req.Model] = max(s.tasks.peak[req.Model], running)
	if cfg.MaxRunningTasks > 0 && running > cfg.MaxRunningTasks {
		s.tasks.overruns[req.Model]++
	}
	writeJSON(w, http.StatusOK, map[string]any{"request_id": id,
		"output": map[string]any{"task_id": id, "task_status": TaskPending}})
}

// handleTaskGet serves GET /api/v1/tasks/{id}: the task's state by the
// clock (PENDING, RUNNING, then SUCCEEDED with one result URL). Queries are
// not limited.
func (s *Simulator) handleTaskGet(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(r) {
		writeUnauthorized(w)
		return
	}
	id := r.PathValue("id")
	s.tasks.mu.Lock()
	t := s.tasks.byID[id]
	if t != nil {
		s.tasks.polls[t.model]++
	}
	s.tasks.mu.Unlock()
	if t == nil {
		dashScopeTaskError(w, http.StatusNotFound, "InvalidParameter", "task not found: "+id, id)
		return
	}
	now := s.clock.Now()
	out := map[string]any{"task_id": id, "submit_time": t.submitted.UTC().Format(time.RFC3339Nano)}
	switch {
	case now.Before(t.submitted.Add(time.Duration(taskPending * float64(t.ends.Sub(t.submitted))))):
		out["task_status"] = TaskPending
	case now.Before(t.ends):
		out["task_status"] = TaskRunning
	default:
		out["task_status"] = TaskSucceeded
		out["end_time"] = t.ends.UTC().Format(time.RFC3339Nano)
		out["results"] = []map[string]string{{"url": "https://llmsim.invalid/results/" + id + "/0.png"}}
	}
	body := map[string]any{"request_id": id, "output": out}
	if out["task_status"] == TaskSucceeded {
		body["usage"] = map[string]int{"image_count": 1}
	}
	writeJSON(w, http.StatusOK, body)
}

// taskDuration is the processing time of task id of a model with cfg:
// TaskDuration (default 2s), spread by TaskSpread with a draw from the id.
func taskDuration(cfg ModelConfig, id string) time.Duration {
	d := cfg.TaskDuration.D()
	if d <= 0 {
		d = defaultTaskDuration
	}
	if cfg.TaskSpread > 0 {
		u := float64(mix(0, id)>>11) / (1 << 53) // uniform in [0, 1)
		d = time.Duration(float64(d) * (1 + cfg.TaskSpread*(2*u-1)))
	}
	return d
}

// TaskStats is a task model's accounting of tasks: submissions are its
// requests (ModelStats.Admitted).
type TaskStats struct {
	Submitted   int64 `json:"submitted"`
	PeakRunning int64 `json:"peak_running"`
	// Overruns counts submissions admitted while MaxRunningTasks tasks
	// were unfinished: the referee, 0 unless the simulator is wrong.
	Overruns int64 `json:"overruns"`
	// Polls counts the queries of the model's tasks.
	Polls int64 `json:"polls"`
	// Busy is the running time of every submitted task (submission to
	// end, as far as the clock has got), FirstSubmit the first task's
	// submission and LastEnd the latest end of one: Busy over
	// LastEnd−FirstSubmit is the mean number of running tasks.
	Busy        time.Duration `json:"busy"`
	FirstSubmit time.Time     `json:"first_submit"`
	LastEnd     time.Time     `json:"last_end"`
}

// MeanRunning is the mean number of unfinished tasks from the first
// submission to the last end (0 before any task).
func (st TaskStats) MeanRunning() float64 {
	span := st.LastEnd.Sub(st.FirstSubmit)
	if span <= 0 {
		return 0
	}
	return st.Busy.Seconds() / span.Seconds()
}

// TaskStats returns a task model's task accounting.
func (s *Simulator) TaskStats(model string) TaskStats {
	s.tasks.mu.Lock()
	defer s.tasks.mu.Unlock()
	now := s.clock.Now()
	st := TaskStats{PeakRunning: s.tasks.peak[model], Overruns: s.tasks.overruns[model], Polls: s.tasks.polls[model]}
	for _, t := range s.tasks.byID {
		if t.model != model {
			continue
		}
		st.Submitted++
		end := t.ends
		if now.Before(end) {
			end = now
		}
		st.Busy += end.Sub(t.submitted)
		if st.FirstSubmit.IsZero() || t.submitted.Before(st.FirstSubmit) {
			st.FirstSubmit = t.submitted
		}
		if end.After(st.LastEnd) {
			st.LastEnd = end
		}
	}
	return st
}

// rejectUnadmitted counts a request refused before admission (a task
// model's running-task limit).
func (m *model) rejectUnadmitted(ns int64, r Reason) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.c.requests++
	m.c.reject(ns, r)
}
