package worker

import (
	"encoding/json"
	"slices"
	"sync"
	"time"
)

// A task job holds its model's concurrency slot until a poll sees its task
// end, so every moment between the task's end at the provider and that
// poll is a running-task slot nobody uses. Polling every TaskPollInterval
// wastes half an interval per task on average, and polls all through the
// task. taskTimes learns a task model's processing times from the
// provider's own timestamps (end_time − submit_time of finished tasks) and
// polls a new task first when the fastest recent ones ended, then finely
// across the range recent tasks ended in, then backing off to
// TaskPollInterval: fewer polls while the task surely runs, and a slot
// freed within a fraction of the range after the task ends.
const (
	// taskSamples is how many recent processing times a model keeps.
	taskSamples = 32
	// taskMinSamples are needed before polls are scheduled from them.
	taskMinSamples = 3
	// taskRangePolls is how many polls the range recent tasks ended in
	// (their 10th to 90th percentile) is split into.
	taskRangePolls = 8
	// taskFineFloor: the finest interval is TaskPollInterval/taskFineFloor,
	// so a task is never polled more than that many times as often as
	// configured.
	taskFineFloor = 4
)

// taskTimes are the recent processing times of each task model.
type taskTimes struct {
	mu sync.Mutex
	by map[string][]time.Duration // model → ring of the last taskSamples
	at map[string]int             // model → next ring slot
}

// observe records a finished task's processing time on model.
func (tt *taskTimes) observe(model string, d time.Duration) {
	if d <= 0 {
		return
	}
	tt.mu.Lock()
	defer tt.mu.Unlock()
	if tt.by == nil {
		tt.by, tt.at = map[string][]time.Duration{}, map[string]int{}
	}
	ring := tt.by[model]
	if len(ring) < taskSamples {
		tt.by[model] = append(ring, d)
		return
	}
	ring[tt.at[model]] = d
	tt.at[model] = (tt.at[model] + 1) % taskSamples
}

// schedule is how to poll a task of model submitted just now, with every
// as the configured interval.
func (tt *taskTimes) schedule(model string, every time.Duration) pollSchedule {
	tt.mu.Lock()
	ds := slices.Clone(tt.by[model])
	tt.mu.Unlock()
	if len(ds) < taskMinSamples {
		return pollSchedule{every: every}
	}
	slices.Sort(ds)
	lo, hi := ds[(len(ds)-1)/10], ds[len(ds)-1-(len(ds)-1)/10]
	fine := min(every, max(every/taskFineFloor, (hi-lo)/taskRangePolls))
	return pollSchedule{first: lo, fine: fine, until: hi, every: every}
}

// pollSchedule says when to poll one task: the first poll first after the
// submission (0: at once), every fine until until after the submission,
// then at intervals doubling from fine up to every. The zero-knowledge
// schedule (first = until = 0, fine = 0) polls at once and then every.
type pollSchedule struct {
	first, fine, until, every time.Duration
}

// next is the wait before the poll after one made elapsed after the
// submission, the previous wait having been prev (0 after the first).
func (s pollSchedule) next(elapsed, prev time.Duration) time.Duration {
	if s.fine <= 0 {
		return s.every
	}
	if elapsed < s.until {
		return s.fine
	}
	return min(s.every, max(s.fine, 2*prev))
}

// taskProcessingTime reads the processing time of a finished task from a
// DashScope task query's answer: output.end_time − output.submit_time
// (both in the provider's clock and zone); 0 when either is missing.
func taskProcessingTime(body []byte) time.Duration {
	var v struct {
		Output struct {
			SubmitTime string `json:"submit_time"`
			EndTime    string `json:"end_time"`
		} `json:"output"`
	}
	if json.Unmarshal(body, &v) != nil {
		return 0
	}
	sub, ok1 := parseTaskTime(v.Output.SubmitTime)
	end, ok2 := parseTaskTime(v.Output.EndTime)
	if !ok1 || !ok2 || end.Before(sub) {
		return 0
	}
	return end.Sub(sub)
}

// taskTimeLayouts are the timestamp formats of task answers: DashScope's
// ("2024-03-20 12:34:56.789", the zone left out) and RFC 3339 (llmsim).
var taskTimeLayouts = []string{"2006-01-02 15:04:05.999999999", time.RFC3339Nano}

func parseTaskTime(s string) (time.Time, bool) {
	for _, l := range taskTimeLayouts {
		if t, err := time.Parse(l, s); err == nil {
			return t, true
		}
	}
	return time.Time{}, false
}
