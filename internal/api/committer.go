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
// while up to `flushers` transactions are in flight, and each flush stores
// everything queued (up to maxBatch) in one transaction
// (store.InsertTxBatch), publishes the created jobs concurrently (the
// broker pipelines their confirms) and commits once. Under light load a
// batch is one job, so latency does not grow; under heavy load one WAL
// flush serves many jobs. Flush goroutines start on demand and end when the
// queue is empty; wait blocks until they have.
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
	body []byte
	done chan struct{}
	// Set by the flush before done closes.
	res store.BatchInsert
	err error // the whole transaction failed
}

// submit queues one prepared job and waits for the flush that stores it.
// The flush runs on its own deadline: a client that goes away does not
// abort the jobs of others.
func (c *committer) submit(j job.Job, body []byte) (store.BatchInsert, error) {
	p := &pendingJob{job: j, body: body, done: make(chan struct{})}
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
	// Twice the publish timeout: the inserts, the publishes and the commit.
	ctx, cancel := context.WithTimeout(context.Background(), 2*c.timeout)
	defer cancel()
	jobs := make([]job.Job, len(batch))
	for i, p := range batch {
		jobs[i] = p.job
	}
	res, err := c.store.InsertTxBatch(ctx, jobs, func(ctx context.Context, created []int) []error {
		errs := make([]error, len(created))
		pctx, cancel := context.WithTimeout(ctx, c.timeout)
		defer cancel()
		var wg sync.WaitGroup
		for n, i := range created {
			p := batch[i]
			wg.Go(func() {
				errs[n] = c.pub.Publish(pctx, p.job.Priority, broker.Message{
					Key:     p.job.ID,
					Body:    p.body,
					Headers: map[string]string{"tenant": p.job.Tenant},
				})
			})
		}
		wg.Wait()
		return errs
	})
	if err != nil && len(batch) > 1 {
		// One job must not sink the others (a row Postgres refuses fails
		// the whole transaction): retry each on its own. A job published
		// before the failure may be published again; the consumer
		// processes each (tenant, id) once.
		for _, p := range batch {
			c.flush([]*pendingJob{p})
		}
		return
	}
	for i, p := range batch {
		if err != nil {
			p.err = err
		} else {
			p.res = res[i]
		}
		close(p.done)
	}
}

// wait blocks until no flush is running.
func (c *committer) wait() { c.wg.Wait() }
