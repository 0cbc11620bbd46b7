package batch_test

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/batch"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a flush that records its batches and can be held.
type recorder struct {
	mu      sync.Mutex
	batches [][]int
	hold    chan struct{} // a flush returns when this is closed
	started chan int      // each flush sends its batch's size
}

func newRecorder() *recorder {
	return &recorder{hold: make(chan struct{}), started: make(chan int, 100)}
}

func (r *recorder) flush(b []int) {
	r.mu.Lock()
	r.batches = append(r.batches, b)
	r.mu.Unlock()
	r.started <- len(b)
	<-r.hold
}

func (r *recorder) all() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int
	for _, b := range r.batches {
		out = append(out, b...)
	}
	return out
}

func waitStarted(t *testing.T, r *recorder) int {
	t.Helper()
	select {
	case n := <-r.started:
		return n
	case <-time.After(10 * time.Second):
		t.Fatal("no flush started")
		return 0
	}
}

// Items that arrive together go in one flush, at most max at a time, and
// every item is flushed once, in order, by Close.
func TestBatchesUpToMax(t *testing.T) {
	r := newRecorder()
	close(r.hold)
	b := batch.New(4, time.Hour, 1, r.flush)
	for i := range 10 {
		b.Add(i)
	}
	b.Close()
	assert.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, r.all())
	for _, bt := range r.batches {
		assert.LessOrEqual(t, len(bt), 4)
	}
}

// With a slot free, a batch is flushed when its wait ends, whatever comes
// after.
func TestBatchFlushedAfterItsWaitWhileASlotIsFree(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder()
		close(r.hold)
		b := batch.New(100, time.Millisecond, 2, r.flush)
		b.Add(0)
		b.Add(1)
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		b.Add(2)
		b.Close()
		assert.Equal(t, [][]int{{0, 1}, {2}}, r.batches)
	})
}
