package worker

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Until a model has taskMinSamples processing times, a task is polled at
// once and then every interval, as configured.
func TestTaskScheduleWithoutHistoryPollsEveryInterval(t *testing.T) {
	var tt taskTimes
	tt.observe("wanx", 3*time.Second)
	tt.observe("wanx", 0) // no timestamps: nothing learned
	s := tt.schedule("wanx", time.Second)
	require.Equal(t, pollSchedule{every: time.Second}, s)
	require.Zero(t, s.first)
	for _, elapsed := range []time.Duration{0, time.Second, 5 * time.Second} {
		require.Equal(t, time.Second, s.next(elapsed, time.Second))
	}
}

// With history, the first poll waits for the fastest recent tasks (10th
// percentile), the range recent tasks ended in (to the 90th) is split into
// taskRangePolls, and past it the waits double back to the interval.
func TestTaskScheduleFromHistory(t *testing.T) {
	var tt taskTimes
	for i := range 11 { // 2.0 s … 6.0 s
		tt.observe("wanx", 2*time.Second+time.Duration(i)*400*time.Millisecond)
	}
	tt.observe("other", time.Minute)
	s := tt.schedule("wanx", time.Second)
	require.Equal(t, 2400*time.Millisecond, s.first)
	require.Equal(t, 5600*time.Millisecond, s.until)
	require.Equal(t, 400*time.Millisecond, s.fine, "3.2 s range / 8 polls")
	require.Equal(t, 400*time.Millisecond, s.next(3*time.Second, 400*time.Millisecond))
	require.Equal(t, 800*time.Millisecond, s.next(6*time.Second, 400*time.Millisecond))
	require.Equal(t, time.Second, s.next(7*time.Second, 800*time.Millisecond))
	require.Equal(t, time.Second, s.next(9*time.Second, time.Second))
}

// A narrow range polls at the finest interval, interval/taskFineFloor.
func TestTaskScheduleNarrowRange(t *testing.T) {
	var tt taskTimes
	for i := range 11 { // 2.0 s … 4.0 s
		tt.observe("wanx", 2*time.Second+time.Duration(i)*200*time.Millisecond)
	}
	s := tt.schedule("wanx", time.Second)
	require.Equal(t, 2200*time.Millisecond, s.first)
	require.Equal(t, 3800*time.Millisecond, s.until)
	require.Equal(t, 250*time.Millisecond, s.fine, "1.6 s / 8 is below the floor")
	require.Equal(t, 250*time.Millisecond, s.next(3*time.Second, 250*time.Millisecond))
	require.Equal(t, 500*time.Millisecond, s.next(4*time.Second, 250*time.Millisecond))
}

// The fine interval stays within [interval/taskFineFloor, interval]: equal
// processing times do not poll faster than that, widely spread ones no
// slower than configured.
func TestTaskScheduleFineIntervalBounds(t *testing.T) {
	var same, wide taskTimes
	for i := range 5 {
		same.observe("m", 3*time.Second)
		wide.observe("m", time.Duration(1+i*30)*time.Second)
	}
	s := same.schedule("m", time.Second)
	require.Equal(t, 3*time.Second, s.first)
	require.Equal(t, time.Second/taskFineFloor, s.fine)
	require.Equal(t, time.Second/taskFineFloor, s.next(3*time.Second, 0), "just past the range: fine")
	require.Equal(t, time.Second, wide.schedule("m", time.Second).fine)
}

// The ring keeps the last taskSamples times: the schedule follows a model
// whose tasks got faster.
func TestTaskScheduleForgetsOldTimes(t *testing.T) {
	var tt taskTimes
	for range taskSamples {
		tt.observe("m", 10*time.Second)
	}
	for range taskSamples {
		tt.observe("m", 2*time.Second)
	}
	s := tt.schedule("m", time.Second)
	require.Equal(t, 2*time.Second, s.first)
	require.Equal(t, 2*time.Second, s.until)
}

// Polls per task with the schedule, against every-interval polling, for
// tasks of 2–4 s and of 50–70 s: none before the fastest recent tasks
// ended, at most one per fine interval across the range, then backing off;
// for long tasks far fewer than every-interval polling.
func TestTaskSchedulePollCount(t *testing.T) {
	count := func(s pollSchedule, d time.Duration) (polls int, seen time.Duration) {
		at, prev := s.first, time.Duration(0)
		for polls = 1; at < d; polls++ {
			prev = s.next(at, prev)
			at += prev
		}
		return polls, at
	}
	for _, c := range []struct{ lo, hi time.Duration }{{2 * time.Second, 4 * time.Second}, {50 * time.Second, 70 * time.Second}} {
		var tt taskTimes
		for i := range 11 {
			tt.observe("m", c.lo+time.Duration(i)*(c.hi-c.lo)/10)
		}
		s := tt.schedule("m", time.Second)
		for d := c.lo; d <= c.hi; d += (c.hi - c.lo) / 20 {
			polls, seen := count(s, d)
			fixed, _ := count(pollSchedule{every: time.Second}, d)
			// first poll, the range's polls, the back-off (fine, 2·fine, … up
			// to the interval: at most 3 with taskFineFloor 4) and the tail
			bound := 1 + int((s.until-s.first)/s.fine) + 1 + 3 + int(max(0, d-s.until)/s.every)
			require.LessOrEqual(t, polls, bound, fmt.Sprintf("task of %v", d))
			if c.lo > 10*time.Second {
				require.Less(t, polls, fixed/2, fmt.Sprintf("task of %v", d))
			}
			switch {
			case d < s.first: // faster than the 10th percentile: seen at the first poll
				require.Equal(t, s.first, seen)
			case d <= s.until:
				require.LessOrEqual(t, seen-d, s.fine, fmt.Sprintf("task of %v seen %v after its end", d, seen-d))
			default:
				require.LessOrEqual(t, seen-d, time.Second, fmt.Sprintf("task of %v seen %v after its end", d, seen-d))
			}
		}
	}
}

// The processing time comes from the answer's timestamps, in DashScope's
// format or RFC 3339; none without both.
func TestTaskProcessingTime(t *testing.T) {
	body := func(sub, end string) []byte {
		return fmt.Appendf(nil, `{"output":{"task_status":"SUCCEEDED","submit_time":%q,"end_time":%q}}`, sub, end)
	}
	require.Equal(t, 2500*time.Millisecond, taskProcessingTime(body("2025-03-20 12:34:56.500", "2025-03-20 12:34:59.000")))
	require.Equal(t, 3*time.Second, taskProcessingTime(body("2025-03-20T12:34:56Z", "2025-03-20T12:34:59Z")))
	require.Zero(t, taskProcessingTime(body("2025-03-20 12:34:56.500", "")))
	require.Zero(t, taskProcessingTime(body("2025-03-20 12:34:59", "2025-03-20 12:34:56")))
	require.Zero(t, taskProcessingTime([]byte(`not json`)))
}
