package ingest

import (
	"cmp"
	"context"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// outcome of one message within a batch.
type outcome int

const (
	pending  outcome = iota
	recorded         // durable: ack the intake message
	handBack         // not recorded: the intake delivers it again
	handedOn         // run before its row is written: the runner settles it
)

// flush records a batch and settles its intake messages: jobs in one
// InsertBatch, refusals and conflicts as dead letters, forwards to the
// lanes; then one AckAll for everything recorded.
func (in *Ingester) flush(msgs []message) {
	start := time.Now()
	defer func() { in.metrics.flush.Observe(time.Since(start).Seconds()) }()
	verdicts := make([]verdict, len(msgs))
	outcomes := make([]outcome, len(msgs))
	var valid []int
	for i, m := range msgs {
		verdicts[i] = in.judge(m.lane, m.d.Message())
		if verdicts[i].failure == nil {
			valid = append(valid, i)
		}
	}
	spans := in.traceIntake(msgs, verdicts)

	var forward []int
	if len(valid) > 0 {
		jobs := make([]job.Job, len(valid))
		for k, i := range valid {
			jobs[k] = verdicts[i].job
		}
		var held []job.Key
		if in.runner != nil {
			held = in.keys.lock(jobs)
		}
		cl := in.reserve(jobs)
		once := in.handOn(msgs, valid, jobs, cl)
		var rest []int // the jobs stored now, as indexes of jobs
		for k := range jobs {
			if once[k] {
				in.metrics.messages.WithLabelValues("created").Inc()
				outcomes[valid[k]] = handedOn
			} else {
				rest = append(rest, k)
			}
		}
		jobs, cl = pickJobs(jobs, cl, rest)
		if in.runner != nil {
			for _, j := range jobs {
				in.runner.WriteFirst(j)
			}
		}
		at := make([]int, len(rest)) // the message of each of jobs
		for k, vk := range rest {
			at[k] = valid[vk]
		}
		var res []store.BatchInsert
		var err error
		at, jobs, cl, res, err = in.insert(msgs, verdicts, at, jobs, cl)
		in.adopt(jobs, cl, res, err)
		in.keys.unlock(held)
		for k, i := range at {
			switch {
			case err != nil:
				outcomes[i] = handBack
			case res[k].Claimed:
				// Running in this process already: no lane message.
				in.metrics.messages.WithLabelValues("created").Inc()
				outcomes[i] = recorded
			case res[k].Parked:
				// Behind its tenant's parked jobs, or over what this process
				// takes of its group: a consumer runs it when its turn comes.
				in.metrics.messages.WithLabelValues("created").Inc()
				if in.runner != nil {
					in.runner.Parked(jobs[k])
				}
				outcomes[i] = recorded
			case res[k].Created:
				in.metrics.messages.WithLabelValues("created").Inc()
				forward = append(forward, i)
			case job.Same(verdicts[i].job, res[k].Record.Job):
				in.metrics.messages.WithLabelValues("duplicate").Inc()
				if res[k].Record.Status == job.StatusQueued {
					forward = append(forward, i)
				} else {
					outcomes[i] = recorded
				}
			default:
				outcomes[i] = in.conflict(msgs[i], verdicts[i].job)
			}
		}
	}
	for i, v := range verdicts {
		if v.failure != nil {
			outcomes[i] = in.refused(*v.failure)
		}
	}
	in.forward(msgs, verdicts, forward, outcomes)
	in.settle(msgs, outcomes)
	endTraces(spans, outcomes)
}

// reserve asks the runner for room for each job; those it has room for are
// stored claimed (the direct intake), those whose group overflows it are
// stored parked: their lane message would only come back to wait behind
// the group's held jobs, and the unparker claims them as room frees.
func (in *Ingester) reserve(jobs []job.Job) store.Claiming {
	if in.runner == nil {
		return store.Claiming{}
	}
	cl := store.Claiming{Claim: make([]bool, len(jobs)), Park: make([]bool, len(jobs))}
	cl.Owner, cl.Lease = in.runner.Claiming()
	seen := make(map[job.Key]bool, len(jobs))
	for k, j := range jobs {
		if key := j.Key(); !seen[key] {
			seen[key] = true
			cl.Claim[k] = in.runner.Reserve(j)
			cl.Park[k] = !cl.Claim[k] && in.runner.Overflows(j)
		}
	}
	return cl
}

// handOn gives the runner the jobs it reserved room for that may run
// before their rows are written (Runner.WritesOnce) and that no row, no
// tombstone and no parked job of their group stands in the way of
// (store.Absent), with their intake messages, which it settles; once[k]
// is set for each. A key twice in the batch is stored as before: its
// second message is a duplicate to be judged against the first's row.
// When the probe fails, every job is stored as before.
func (in *Ingester) handOn(msgs []message, valid []int, jobs []job.Job, cl store.Claiming) (once []bool) {
	once = make([]bool, len(jobs))
	if in.runner == nil || cl.Claim == nil {
		return once
	}
	count := make(map[job.Key]int, len(jobs))
	for _, j := range jobs {
		count[j.Key()]++
	}
	var cand []int
	var probe []job.Job
	for k, j := range jobs {
		if cl.Claim[k] && count[j.Key()] == 1 && in.runner.WritesOnce(j) {
			cand, probe = append(cand, k), append(probe, j)
		}
	}
	if len(cand) == 0 {
		return once
	}
	absent, err := in.store.Absent(in.bg, probe)
	if err != nil {
		in.log.Debug("ingest: probe for write-once; storing the jobs now", "error", err)
		return once
	}
	owner, lease := in.runner.Claiming()
	now := time.Now()
	for c, k := range cand {
		if absent[c] {
			once[k] = true
			in.handedOn.Add(1)
			d := &handedOnDelivery{Delivery: msgs[valid[k]].d, settled: in.handedOn.Done}
			in.runner.AdoptUnwritten(store.UnwrittenClaim(jobs[k], owner, lease, now), now, d)
		}
	}
	return once
}

// handedOnDelivery is an intake message handed on with its job: Run keeps
// the intake subscription open until the runner has settled it.
type handedOnDelivery struct {
	broker.Delivery
	once    sync.Once
	settled func()
}

func (d *handedOnDelivery) Ack(ctx context.Context) error {
	defer d.once.Do(d.settled)
	return d.Delivery.Ack(ctx)
}

func (d *handedOnDelivery) Nack(ctx context.Context) error {
	defer d.once.Do(d.settled)
	return d.Delivery.Nack(ctx)
}

// pickJobs is jobs and cl narrowed to the indexes of keep.
func pickJobs(jobs []job.Job, cl store.Claiming, keep []int) ([]job.Job, store.Claiming) {
	if len(keep) == len(jobs) {
		return jobs, cl
	}
	out := store.Claiming{Owner: cl.Owner, Lease: cl.Lease}
	picked := make([]job.Job, len(keep))
	pick := func(flags []bool) []bool {
		if flags == nil {
			return nil
		}
		p := make([]bool, len(keep))
		for n, k := range keep {
			p[n] = flags[k]
		}
		return p
	}
	for n, k := range keep {
		picked[n] = jobs[k]
	}
	out.Claim, out.Park = pick(cl.Claim), pick(cl.Park)
	return picked, out
}

// adopt hands the jobs stored claimed to the runner and gives back the
// room reserved for the others.
func (in *Ingester) adopt(jobs []job.Job, cl store.Claiming, res []store.BatchInsert, err error) {
	for k, reserved := range cl.Claim {
		switch {
		case !reserved:
		case err == nil && res[k].Claimed:
			in.runner.Adopt(res[k].Record)
		default:
			in.runner.Unreserve(jobs[k])
		}
	}
}

// conflict records a message that reuses a stored job's id with another job.
func (in *Ingester) conflict(m message, j job.Job) outcome {
	in.metrics.messages.WithLabelValues("conflict").Inc()
	dl := store.DeadLetterRow{Kind: store.DeadLetterMessage, Tenant: j.Tenant, JobID: j.ID, Lane: string(m.lane),
		Reason: store.ReasonConflict, Body: m.d.Message().Body}
	err := in.persist("record conflict", func(ctx context.Context) error {
		_, err := in.store.RecordDeadLetter(ctx, dl)
		return err
	})
	if err != nil {
		return handBack
	}
	in.log.Warn("intake message conflicts with the stored job; dead-lettered, the job is untouched",
		"tenant", j.Tenant, "job_id", j.ID)
	return recorded
}

// refused records a message the ingester will not run.
func (in *Ingester) refused(f store.IntakeFailure) outcome {
	var got store.IntakeOutcome
	err := in.persist("record refusal", func(ctx context.Context) (err error) {
		got, err = in.store.RecordIntakeFailure(ctx, f)
		if store.Unstorable(err) {
			// A value the failed job's row would hold is one Postgres
			// will not store: the message is kept as a dead letter alone.
			got = store.IntakeMessageOnly
			_, err = in.store.RecordDeadLetter(ctx, store.DeadLetterRow{Kind: store.DeadLetterMessage,
				Tenant: cmp.Or(f.Tenant, job.DefaultTenant), Lane: string(cmp.Or(f.Lane, job.PriorityNormal)),
				Reason: f.Reason + "; " + store.UnstorableReason("its failed job", err), Body: f.Body})
		}
		return err
	})
	if err != nil {
		return handBack
	}
	switch got {
	case store.IntakeJobFailed:
		in.metrics.messages.WithLabelValues("failed").Inc()
	case store.IntakeConflict:
		in.metrics.messages.WithLabelValues("conflict").Inc()
	case store.IntakeDuplicate:
		in.metrics.messages.WithLabelValues("duplicate").Inc()
	default:
		in.metrics.messages.WithLabelValues("malformed").Inc()
	}
	in.log.Warn("intake message refused", "tenant", f.Tenant, "job_id", f.ID, "lane", string(f.Lane), "reason", f.Reason)
	return recorded
}

// forward publishes the stored jobs of idx to their lanes, concurrently
// (the broker pipelines the confirms). A publish that fails is retried
// until shutdown; then the job is marked as having no message, for the
// reconciler, or, if even that fails, its intake message is handed back.
func (in *Ingester) forward(msgs []message, verdicts []verdict, idx []int, outcomes []outcome) {
	var wg sync.WaitGroup
	for _, i := range idx {
		j := verdicts[i].job
		msg := broker.WakeUp(j.Key(), j.Model)
		wg.Go(func() {
			err := in.persist("forward", func(ctx context.Context) error {
				return in.lanes.Publish(ctx, j.Priority, msg)
			})
			if err == nil {
				outcomes[i] = recorded
				return
			}
			if in.store.MarkUnenqueued(in.bg, j.Key()) == nil {
				outcomes[i] = recorded
				return
			}
			outcomes[i] = handBack
		})
	}
	wg.Wait()
}

// settle acks every recorded message in one AckAll and hands the rest back.
func (in *Ingester) settle(msgs []message, outcomes []outcome) {
	var acks []broker.Delivery
	for i, m := range msgs {
		if outcomes[i] == handedOn {
			continue
		}
		if outcomes[i] == recorded {
			acks = append(acks, m.d)
			continue
		}
		in.metrics.messages.WithLabelValues("handed_back").Inc()
		if err := m.d.Nack(in.bg); err != nil {
			in.log.Warn("ingest: hand back intake message", "key", m.d.Message().Key, "error", err)
		}
	}
	for k, err := range broker.AckAll(in.bg, acks) {
		if err != nil {
			in.log.Warn("ingest: ack intake message", "key", acks[k].Message().Key, "error", err)
		}
	}
}
