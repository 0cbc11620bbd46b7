package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

func submitTask(s http.Handler, body string, async bool) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/api/v1/services/aigc/text2image/image-synthesis", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if async {
		req.Header.Set("X-DashScope-Async", "enable")
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	return rec
}

type taskReply struct {
	Code   string `json:"code"`
	Output struct {
		TaskID     string `json:"task_id"`
		TaskStatus string `json:"task_status"`
		Results    []struct {
			URL string `json:"url"`
		} `json:"results"`
	} `json:"output"`
}

func decodeTask(t *testing.T, rec *httptest.ResponseRecorder) taskReply {
	t.Helper()
	var r taskReply
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &r), rec.Body.String())
	return r
}

func pollTask(s http.Handler, id string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/tasks/"+id, nil))
	return rec
}

// A task model admits submissions by RPM and by its running tasks; each
// task is PENDING, RUNNING, then SUCCEEDED after its processing time.
func TestTasksLimitSubmissionsAndRunningTasks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSim(t, Config{Models: map[string]ModelConfig{
			"wanx": {Kind: KindTask, RPM: 3, MaxRunningTasks: 2, TaskDuration: Duration(10 * time.Second)},
		}})
		body := `{"model":"wanx","input":{"prompt":"a cat"},"parameters":{"n":1}}`
		rec := submitTask(s, body, false)
		require.Equal(t, http.StatusForbidden, rec.Code, "a task needs X-DashScope-Async: enable")
		var ids []string
		for range 2 {
			rec := submitTask(s, body, true)
			require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
			r := decodeTask(t, rec)
			require.Equal(t, TaskPending, r.Output.TaskStatus)
			ids = append(ids, r.Output.TaskID)
		}
		rec = submitTask(s, body, true)
		require.Equal(t, http.StatusTooManyRequests, rec.Code)
		require.Equal(t, "Throttling", decodeTask(t, rec).Code)

		require.Equal(t, TaskPending, decodeTask(t, pollTask(s, ids[0])).Output.TaskStatus)
		time.Sleep(5 * time.Second)
		require.Equal(t, TaskRunning, decodeTask(t, pollTask(s, ids[0])).Output.TaskStatus)
		time.Sleep(5 * time.Second)
		done := decodeTask(t, pollTask(s, ids[0]))
		require.Equal(t, TaskSucceeded, done.Output.TaskStatus)
		require.Len(t, done.Output.Results, 1)

		// Both finished: a third submission fits, a fourth is over RPM
		// (a refused submission is not admitted and takes no slot).
		require.Equal(t, http.StatusOK, submitTask(s, body, true).Code)
		rec = submitTask(s, body, true)
		require.Equal(t, http.StatusTooManyRequests, rec.Code)
		require.Equal(t, "Throttling.RateQuota", decodeTask(t, rec).Code)

		require.Equal(t, http.StatusNotFound, pollTask(s, "task-nope").Code)
		st, ts := s.Stats().Models["wanx"], s.TaskStats("wanx")
		require.EqualValues(t, 3, st.Admitted)
		require.EqualValues(t, 3, ts.Submitted)
		require.EqualValues(t, 2, ts.PeakRunning)
		require.Zero(t, ts.Overruns)
		require.EqualValues(t, 1, st.RateLimited[ReasonRunningTasks])
		require.EqualValues(t, 1, st.RateLimited[ReasonRPM])
	})
}

// TaskSpread spreads processing times within TaskDuration × [1−s, 1+s];
// TaskStats integrates the running time, so its mean number of running
// tasks is exact under a fake clock, and it counts the queries.
func TestTaskSpreadAndOccupancy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := ModelConfig{Kind: KindTask, MaxRunningTasks: 4, TaskDuration: Duration(10 * time.Second), TaskSpread: 0.5}
		s := newSim(t, Config{Models: map[string]ModelConfig{"wanx": cfg}})
		var lo, hi time.Duration = time.Hour, 0
		for i := range 200 {
			d := taskDuration(cfg, fmt.Sprintf("task-sim%012x", i))
			lo, hi = min(lo, d), max(hi, d)
		}
		require.GreaterOrEqual(t, lo, 5*time.Second)
		require.Less(t, hi, 15*time.Second)
		require.Less(t, lo, 6*time.Second, "spread over the range")
		require.Greater(t, hi, 14*time.Second, "spread over the range")

		body := `{"model":"wanx","input":{"prompt":"a cat"}}`
		var ids []string
		for range 2 {
			rec := submitTask(s, body, true)
			require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
			ids = append(ids, decodeTask(t, rec).Output.TaskID)
		}
		time.Sleep(time.Minute) // both ended
		for _, id := range ids {
			require.Equal(t, TaskSucceeded, decodeTask(t, pollTask(s, id)).Output.TaskStatus)
		}
		ts := s.TaskStats("wanx")
		require.EqualValues(t, 2, ts.Polls)
		d0, d1 := taskDuration(cfg, ids[0]), taskDuration(cfg, ids[1])
		require.Equal(t, d0+d1, ts.Busy)
		require.Equal(t, max(d0, d1), ts.LastEnd.Sub(ts.FirstSubmit))
		require.InDelta(t, float64(d0+d1)/float64(max(d0, d1)), ts.MeanRunning(), 1e-9)
	})
}
