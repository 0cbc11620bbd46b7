package ingest

import (
	"context"
	"slices"

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
		var refused []error // set when some jobs are Postgres's to refuse
		err := in.persist("insert", func(ctx context.Context) (err error) {
			res, err = in.store.InsertClaiming(ctx, jobs, cl)
			if err == nil || !store.Unstorable(err) {
				return err
			}
			errs, perr := in.store.UnstorableJobs(ctx, jobs)
			if perr != nil {
				return perr
			}
			if !slices.ContainsFunc(errs, func(e error) bool { return e != nil }) {
				// Refused for no one job's values: tried again as an
				// outage is, with a backoff.
				in.log.Error("ingest: Postgres refused a batch but none of its jobs alone", "jobs", len(jobs), "error", err)
				return err
			}
			refused = errs
			return finalError{err}
		})
		if refused == nil {
			return at, jobs, cl, res, err
		}
		var keep []int
		for k, e := range refused {
			if e == nil {
				keep = append(keep, k)
				continue
			}
			i := at[k]
			f := store.RefusedJob(jobs[k], msgs[i].d.Message().Body, e)
			verdicts[i].failure = &f
			if cl.Claim != nil && cl.Claim[k] {
				in.runner.Unreserve(jobs[k])
				cl.Claim[k] = false
			}
		}
		narrowed := make([]int, len(keep))
		for n, k := range keep {
			narrowed[n] = at[k]
		}
		at = narrowed
		jobs, cl = pickJobs(jobs, cl, keep)
	}
}
