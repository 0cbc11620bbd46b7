package ingest

import (
	"sync"

	"github.com/llmq/llmq/internal/job"
)

// keyLocks lets one batch at a time decide on a job key: from the runner's
// reservation through the write-once probe to the insert and the adoption.
// Batches are flushed side by side (Config.Flushers), and two messages of
// one job (a producer's retried publish) read into two of them would
// otherwise both be judged before either is recorded: both probes find no
// row and the job runs twice, or one is inserted claimed while the other's
// probe is under way. With the lock the later batch finds the earlier's
// job running or written, and judges its message a duplicate.
type keyLocks struct {
	mu   sync.Mutex
	free *sync.Cond // signalled when keys are released
	held map[job.Key]struct{}
}

func newKeyLocks() *keyLocks {
	l := &keyLocks{held: map[job.Key]struct{}{}}
	l.free = sync.NewCond(&l.mu)
	return l
}

// lock takes the keys of jobs, waiting while another batch holds any of
// them. It takes them all at once, never some while waiting for others,
// so two batches cannot wait on each other. The caller must unlock.
func (l *keyLocks) lock(jobs []job.Job) []job.Key {
	keys := make([]job.Key, len(jobs))
	for i, j := range jobs {
		keys[i] = j.Key()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.anyHeld(keys) {
		l.free.Wait()
	}
	for _, k := range keys {
		l.held[k] = struct{}{}
	}
	return keys
}

func (l *keyLocks) anyHeld(keys []job.Key) bool {
	for _, k := range keys {
		if _, ok := l.held[k]; ok {
			return true
		}
	}
	return false
}

// unlock releases the keys lock returned (a key listed twice is released
// once).
func (l *keyLocks) unlock(keys []job.Key) {
	if len(keys) == 0 {
		return
	}
	l.mu.Lock()
	for _, k := range keys {
		delete(l.held, k)
	}
	l.mu.Unlock()
	l.free.Broadcast()
}
