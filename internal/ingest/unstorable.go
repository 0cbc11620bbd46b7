package ingest

import (
	"context"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// insert stores jobs (of msgs[at[k]] each) in one InsertClaiming and
// returns what it stored. A job whose values Postgres refuses although
// they passed validation (store.Unstorable: a value nested deeper than the
// server's stack allows, or a rule of a later Postgres) fails the whole
// statement at every try, and with it the other jobs of the batch; on
// Kafka every later message of the partition waits behind it. Such a job
// is refused instead, as a message that fails validation is: its verdict
// gets the failure (recorded by flush under its id, with Postgres's
// reason), its room is given back, and the batch is stored without it.
// at, jobs and cl come back narrowed to the jobs stored.
func (in *Ingester) insert(msgs []message, verdicts []verdict, at []int, jobs []job.Job, cl store.Claiming) ([]int, []job.Job, store.Claiming, []store.BatchInsert, error) {
	for {
		var res []store.BatchInsert
		err := in.persist("insert", func(ctx context.Context) (err error) {
			res, err = in.store.InsertClaiming(ctx, jobs, cl)
			return err
		})
		if err == nil || !store.Unstorable(err) {
			return at, jobs, cl, res, err
		}
		var errs []error
		if perr := in.persist("find the job Postgres refuses", func(ctx context.Context) (err error) {
			errs, err = in.store.UnstorableJobs(ctx, jobs)
			return err
		}); perr != nil {
			return at, jobs, cl, nil, err
		}
		var keep []int
		for k, e := range errs {
			if e == nil {
				keep = append(keep, k)
				continue
			}
			i := at[k]
			verdicts[i].failure = unstorableFailure(msgs[i], jobs[k], e)
			if cl.Claim != nil && cl.Claim[k] {
				in.runner.Unreserve(jobs[k])
				cl.Claim[k] = false
			}
		}
		if len(keep) == len(jobs) {
			// Refused for no one job's values: a redelivery batches the
			// messages anew.
			in.log.Error("ingest: Postgres refused a batch but none of its jobs alone; handing it back", "jobs", len(jobs), "error", err)
			return at, jobs, cl, nil, err
		}
		narrowed := make([]int, len(keep))
		for n, k := range keep {
			narrowed[n] = at[k]
		}
		at = narrowed
		jobs, cl = pickJobs(jobs, cl, keep)
	}
}

// unstorableFailure is the refusal of a valid job Postgres will not store.
func unstorableFailure(m message, j job.Job, err error) *store.IntakeFailure {
	return &store.IntakeFailure{Tenant: j.Tenant, ID: j.ID, Model: j.Model, Lane: j.Priority,
		Reason: store.UnstorableReason("this job", err), Body: m.d.Message().Body, ReplyTo: j.ReplyTo, CorrelationID: j.CorrelationID}
}
