package api

import (
	"context"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// committer group-commits submissions: concurrent submissions queue up
// while up to `flushers` flushes are in flight, and each flush stores
// everything queued (up to maxBatch) with one INSERT (store.InsertBatch, one
// commit), then publishes the created jobs concurrently (the broker
// pipelines their confirms). Under light load a batch is one job, so
// latency does not grow; under heavy load one WAL flush serves many jobs.
// Flush goroutines start on demand and end when the queue is empty; wait
// blocks until they have.
//
// What a 202 means: the job is stored and its message confirmed by the
// broker. A job whose publish fails is taken back (store.Unsubmit) and
// refused; if it cannot be taken back (claimed meanwhile, or Postgres
// gone) it is durable and will run (the reconciler publishes a job that
// has no message), so it is accepted. Publishing after the commit means a
// message never names a job that is not stored.
type committer struct {
	store    Store
	pub      broker.Publisher
	timeout  time.Duration
	flushers int
	maxBatch int

	mu      sync.Mutex
	queue   []*pendingJob
	running int
	wg      sync.WaitGroup
}

// pendingJob is one submission waiting for its flush.
type pendingJob struct {
	job  job.Job
	done chan struct{}
	// Set by the flush before done closes.
	res commitResult
	err error // the store failed: nothing is known to be stored
}

// commitResult is the outcome of one submission.
type commitResult struct {
	store.BatchInsert
	// Err is the publish error of a job that was taken back: not stored.
	Err error
}

// submit queues one prepared job and waits for the flush that stores it.
// The flush runs on its own deadline: a client that goes away does not
// abort the jobs of others.
func (c *committer) submit(j job.Job) (commitResult, error) {
	p := &pendingJob{job: j, done: make(chan struct{})}
	c.mu.Lock()
	c.queue = append(c.queue, p)
	if c.running < c.flushers {
		c.running++
		c.wg.Add(1)
		go c.flushLoop()
	}
	c.mu.Unlock()
	<-p.done
	return p.res, p.err
}

func (c *committer) flushLoop() {
	defer c.wg.Done()
	for {
		c.mu.Lock()
		if len(c.queue) == 0 {
			c.running--
			c.mu.Unlock()
			return
		}
		n := min(len(c.queue), c.maxBatch)
		batch := make([]*pendingJob, n)
		copy(batch, c.queue)
		c.queue = c.queue[n:]
		if len(c.queue) == 0 {
			c.queue = nil // let the backing array go
		}
		c.mu.Unlock()
		c.flush(batch)
	}
}

func (c *committer) flush(batch []*pendingJob) {
	// Twice the publish timeout: the insert, the publishes, a take-back.
	ctx, cancel := context.WithTimeout(context.Background(), 2*c.timeout)
	defer cancel()
	jobs := make([]job.Job, len(batch))
	for i, p := range batch {
		jobs[i] = p.job
	}
	res, err := c.store.InsertBatch(ctx, jobs)
	if err != nil && len(batch) > 1 {
		// One job must not sink the others (a row Postgres refuses fails
		// the whole statement): store each on its own.
		for _, p := range batch {
			c.flushAgain(p)
		}
		return
	}
	c.settle(ctx, batch, res, err)
}

// flushAgain stores p on its own after its batch failed. The batch's
// insert may have committed before a later read of it failed, so p's job
// may now read as existing although no message was published for it: a
// queued job that believes it has one is published again, as the intake
// forwards a queued duplicate again (a second wake-up of a job is
// harmless; a missing one leaves it to the lost-message sweep, which
// waits for an idle lane).
func (c *committer) flushAgain(p *pendingJob) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*c.timeout)
	defer cancel()
	res, err := c.store.InsertBatch(ctx, []job.Job{p.job})
	if err == nil && !res[0].Created && res[0].Record.Status == job.StatusQueued && res[0].Record.EnqueuedAt != nil {
		pctx, pcancel := context.WithTimeout(ctx, c.timeout)
		perr := c.pub.Publish(pctx, p.job.Priority, broker.WakeUp(p.job.Key(), p.job.Model))
		pcancel()
		if perr != nil {
			// The reconciler publishes a job marked as having none.
			_ = c.store.MarkUnenqueued(context.WithoutCancel(ctx), p.job.Key())
		}
	}
	c.settle(ctx, []*pendingJob{p}, res, err)
}

// settle publishes the jobs of batch that res says were created, takes
// back those whose publish failed, and answers each submission.
func (c *committer) settle(ctx context.Context, batch []*pendingJob, res []store.BatchInsert, err error) {
	if err != nil {
		for _, p := range batch {
			p.err = err
			close(p.done)
		}
		return
	}
	errs := c.publish(ctx, batch, res)
	c.takeBack(ctx, batch, errs)
	for i, p := range batch {
		p.res = commitResult{BatchInsert: res[i], Err: errs[i]}
		close(p.done)
	}
}

// publish sends the created jobs' messages and returns one error per job
// of batch (nil for a job it did not publish).
func (c *committer) publish(ctx context.Context, batch []*pendingJob, res []store.BatchInsert) []error {
	errs := make([]error, len(batch))
	pctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var wg sync.WaitGroup
	for i, p := range batch {
		if !res[i].Created || res[i].Parked {
			continue
		}
		wg.Go(func() {
			errs[i] = c.pub.Publish(pctx, p.job.Priority, broker.WakeUp(p.job.Key(), p.job.Model))
		})
	}
	wg.Wait()
	return errs
}

// takeBack deletes the created jobs whose publish failed (errs is non-nil
// only for created jobs), and gives their error to the repeats of their
// key in batch, which were answered with the same record. A job it cannot
// delete (claimed through another message, or answered as stored to a
// re-submission) stays stored: its error is cleared (it will run) and it
// is marked as having no message, which the reconciler publishes when the
// job still needs one.
func (c *committer) takeBack(ctx context.Context, batch []*pendingJob, errs []error) {
	var keys []job.Key
	index := map[job.Key]int{}
	for i, err := range errs {
		if err != nil {
			keys = append(keys, batch[i].job.Key())
			index[batch[i].job.Key()] = i
		}
	}
	if len(keys) == 0 {
		return
	}
	bg := context.WithoutCancel(ctx)
	kept, err := c.store.Unsubmit(bg, keys)
	if err != nil {
		kept = keys
	}
	for _, k := range kept {
		// Stored, and maybe no message: the reconciler publishes those it
		// finds marked, and its lost-message sweep the others once their
		// lane is idle.
		_ = c.store.MarkUnenqueued(bg, k)
		errs[index[k]] = nil // created, and it stays: accepted
	}
	for i, p := range batch {
		if j, ok := index[p.job.Key()]; ok && j != i {
			errs[i] = errs[j] // a repeat answers as its created job does
		}
	}
}

// wait blocks until no flush is running.
func (c *committer) wait() { c.wg.Wait() }
