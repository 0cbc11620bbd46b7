package worker

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/llmq/llmq/internal/job"
)

// quickRig is a worker with a 200 ms store delay and a dispatcher of
// model "m" whose calls take 10 ms, both built without services.
func quickRig() (*Worker, *dispatcher) {
	w := &Worker{cfg: Config{StoreDelay: 200 * time.Millisecond}, holds: newHolds(4)}
	d := &dispatcher{w: w, model: "m", q: newFairQueue(6, 3, 1)}
	d.noteCall(10 * time.Millisecond)
	return w, d
}

// admitAt counts admissions of model m, one every gap from t0 until end.
func admitAt(h *holds, t0, end time.Time, gap time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.get(holdKey{tenant: "t", model: "m", lane: job.PriorityNormal})
	for at := t0; !at.After(end); at = at.Add(gap) {
		h.countAdmission(g, "m", at)
	}
}

func waitingJobs(d *dispatcher, n int) {
	for i := range n {
		d.q.Push(&task{job: job.Job{ID: strconv.Itoa(i), Tenant: "t", Model: "m", Priority: job.PriorityNormal}})
	}
}

// A saturated model's jobs are taken write-once while the jobs waiting
// ahead are admitted within half the delay at the model's rate: auto's
// concurrency binding on an instant provider, not a quota.
func TestQuickCallsWeighsTheWaitForAdmission(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	now := t0.Add(300 * time.Millisecond)

	w, d := quickRig()
	d.sat.begin(t0.Add(150 * time.Millisecond)) // a wait in progress: saturated
	assert.False(t, w.quickAt(d, now), "saturated, no rate measured: forever")

	admitAt(w.holds, t0, now, time.Millisecond) // 1,000 a second
	waitingJobs(d, 50)
	assert.True(t, w.quickAt(d, now), "50 jobs at 1,000 a second: 50 ms")
	waitingJobs(d, 100)
	assert.False(t, w.quickAt(d, now), "150 jobs at 1,000 a second: 150 ms, over half the delay")

	w2, d2 := quickRig()
	waitingJobs(d2, 1000)
	assert.True(t, w2.quickAt(d2, now), "not saturated: nothing waits for the quota")
	d2.noteCall(time.Second)
	assert.False(t, w2.quickAt(d2, now), "calls no longer quick")
	assert.True(t, w2.quickAt(nil, now), "no call yet")

	w3, d3 := quickRig()
	d3.sat.begin(t0.Add(150 * time.Millisecond))
	admitAt(w3.holds, t0, now, time.Millisecond)
	admitAt(w3.holds, t0.Add(450*time.Millisecond), t0.Add(450*time.Millisecond), time.Millisecond)
	waitingJobs(d3, 50)
	assert.False(t, w3.quickAt(d3, t0.Add(460*time.Millisecond)),
		"the model slowed to one admission in 150 ms: its average still reads ~800 a second, its last window 7")
}
