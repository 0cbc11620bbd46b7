package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// The direct intake (docs/design.md#direct-intake): the ingester of the
// same process, reading a job off the intake while this worker has room
// for it (Reserve), stores the job already claimed by this worker
// (store.InsertClaiming) and hands it over here. The job then needs no
// lane message and no claim: one publish, one delivery and one UPDATE
// fewer per job. A job is taken only while its tenant group holds less
// than its bound (Reserve); the others take the lanes or parking, so the
// tenants' fair share works as before. The unparker hands parked jobs
// over the same way (unpark.go).
//
// A job taken directly has no broker message: its task carries a
// directDelivery, whose settlements stand in for the broker's (see there).
// If the process dies, its rows are running with no message under a lease
// that expires; the reconciler then publishes one for each
// (store.TakeOrphaned).

// Reserve takes room for j: a MaxInFlight slot, held until the job is
// settled. It refuses while the worker is not running and for a model it
// does not serve. With parking on, it takes a job only while the job's
// tenant group holds less than its fill (holds.directFill: a hold, eight
// while the model is not saturated, max_in_flight for an uncapped tenant
// until the model is measured) and has no parked jobs
// (holds.admitDirect), so the others take the lanes or parking, where the
// tenants' turns are decided; with parking off, only while the model is
// not saturated. Every true must be followed by Adopt (the job was stored
// claimed) or Unreserve (it was not).
func (w *Worker) Reserve(j job.Job) bool {
	if !w.takesDirect(j) {
		return false
	}
	saturated := w.saturated(j.Model)
	if saturated && !w.holdsDirect(j) || w.takeRoom(1) == 0 {
		return false
	}
	// After takeRoom has let go of w.mu: the unparker holds the holds' lock
	// while it asks saturated, which takes w.mu.
	if w.holdsDirect(j) && !w.holds.admitDirect(holdOf(j), saturated, !w.limits.capped(j.Tenant)) {
		w.giveBackRoom()
		return false
	}
	return true
}

// Overflows reports whether j, which Reserve had no room for, is to be
// stored parked instead of published on its lane: its group has parked
// jobs or holds jobs here. Reserve turned it down because the group holds
// its bound here or every slot of max_in_flight is taken (in a flood the
// slots run out first: calls and completions hold part of them); either
// way its lane message would come back to this replica's prefetch only to
// wait behind the group's jobs or be parked then, and meanwhile sit in the
// lane ahead of other tenants' jobs. Parked, it costs the unparker's one
// UPDATE when room frees, against a publish, a delivery and a claim;
// another replica with room finds the group within discoverEvery. The
// question is not whether the group is at its bound: between Reserve and
// this call the dispatcher may have admitted some of it. A group with
// nothing here is published: its job waits behind nobody's.
func (w *Worker) Overflows(j job.Job) bool {
	if !w.takesDirect(j) || !w.holdsDirect(j) {
		return false
	}
	return w.holds.occupied(holdOf(j))
}

// Parked records that the intake stored j parked: the unparker brings its
// group's jobs back as room frees.
func (w *Worker) Parked(j job.Job) {
	if w.holdsDirect(j) {
		w.holds.markParked(holdOf(j))
		w.holds.wake()
	}
}

// takesDirect: the direct intake is on and serves j's model (any model
// when none is configured).
func (w *Worker) takesDirect(j job.Job) bool {
	if w.direct == nil {
		return false
	}
	_, ok := w.cfg.Models[j.Model]
	return ok || len(w.cfg.Models) == 0
}

// giveBackRoom undoes Reserve's slot and counts.
func (w *Worker) giveBackRoom() {
	w.adopting.Done()
	<-w.slots
	w.tasks.Done()
}

// Unreserve gives back the room Reserve took for j, which was not stored
// claimed (it existed already, or was parked, or the insert failed).
func (w *Worker) Unreserve(j job.Job) {
	if w.holdsDirect(j) {
		w.holds.release(holdOf(j))
	}
	w.giveBackRoom()
}

// Adopt runs a job that was stored claimed under Claiming's owner and
// lease, in the room Reserve took for it.
func (w *Worker) Adopt(rec store.Record) { w.adopt(rec, "direct") }

// adopt runs rec, stored or unparked claimed by this worker, in room taken
// for it; how counts it in the jobs metric.
func (w *Worker) adopt(rec store.Record, how string) { w.adoptWith(rec, how, nil) }

// adoptWith is adopt for a job whose row is written already (row nil) or
// not yet (writeonce.go).
func (w *Worker) adoptWith(rec store.Record, how string, row *unwritten) {
	defer w.adopting.Done()
	now := time.Now()
	t := &task{lane: rec.Priority, key: rec.Key(), received: now, hold: holdOf(rec.Job), row: row}
	t.d = &directDelivery{w: w, lane: rec.Priority, msg: broker.WakeUp(t.key, rec.Model), row: row}
	t.attempt, t.rec, t.job, t.claimedAt = rec.Attempts, rec, rec.Job, now
	t.holding = w.holdsDirect(rec.Job)
	w.startTrace(t, now, now)
	w.metrics.received.WithLabelValues(string(t.lane)).Inc()
	w.metrics.jobs.WithLabelValues(how).Inc()
	w.mu.Lock()
	stopping := w.stopping
	if !stopping {
		w.inflight[t.key] = t
	}
	w.mu.Unlock()
	if stopping {
		w.handBack(t)
		return
	}
	w.route(t)
}

// Claiming is the owner and lease under which the ingester stores the jobs
// it hands to Adopt.
func (w *Worker) Claiming() (owner string, lease time.Duration) {
	return w.cfg.Owner, w.cfg.Lease
}

// holdsDirect: parking is on and j has a group to hold it in. It reads
// what New set, not Run's parker: the ingester may ask before Run starts.
func (w *Worker) holdsDirect(j job.Job) bool { return w.parking != nil && j.Model != "" }

func holdOf(j job.Job) holdKey {
	return holdKey{tenant: j.Tenant, model: j.Model, lane: j.Priority}
}

// directDelivery is the stand-in delivery of a job taken directly from the
// intake. Its job's row is already its record, so an ack has nothing to
// settle; handing it back, or retrying it, publishes its wake-up on its lane
// (for a retry, at once: the claim that receives it finds the job not due
// and delays the message on the broker, see claimBatch). When that publish
// fails, the job is marked as having no message and the reconciler
// publishes one.
type directDelivery struct {
	w    *Worker
	lane job.Priority
	msg  broker.Message
	// row is set for a job taken write-once: one whose row was never
	// written has its intake message handed back instead of a wake-up.
	row *unwritten

	mu   sync.Mutex
	done bool
}

var _ broker.Delivery = (*directDelivery)(nil)

func (d *directDelivery) Message() broker.Message { return d.msg }
func (d *directDelivery) Lane() job.Priority      { return d.lane }
func (d *directDelivery) Redelivered() bool       { return false }

func (d *directDelivery) settle() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done {
		return broker.ErrSettled
	}
	d.done = true
	return nil
}

func (d *directDelivery) Ack(context.Context) error { return d.settle() }

func (d *directDelivery) Nack(ctx context.Context) error {
	if err := d.settle(); err != nil {
		return err
	}
	if d.row != nil && d.row.settledState() == rowDropped {
		return nil
	}
	return d.publish(ctx)
}

func (d *directDelivery) Retry(ctx context.Context, _ time.Duration, _ map[string]string) error {
	if err := d.settle(); err != nil {
		return err
	}
	if err := d.publish(ctx); err != nil {
		return fmt.Errorf("%w: %w", broker.ErrHandedBack, err)
	}
	return nil
}

func (d *directDelivery) DeadLetter(context.Context, broker.DeadLetter) error {
	return errors.New("worker: a job taken directly from the intake has no message to dead-letter")
}

func (d *directDelivery) publish(ctx context.Context) error {
	err := d.w.direct.Publish(ctx, d.lane, d.msg)
	if err == nil {
		return nil
	}
	note, _ := broker.ReadLaneNote(d.msg.Body)
	if merr := d.w.store.MarkUnenqueued(ctx, note.Key); merr != nil {
		d.w.log.Error("mark job without message", "job_id", note.Key.ID, "error", merr)
	}
	return fmt.Errorf("publish wake-up of a direct job: %w", err)
}

// admitDirect decides whether a job the ingester reads off the intake may
// be taken directly: only while its group holds fewer than directFill
// allows. A lane delivery's count is bounded by the prefetch; a direct
// one's only by max_in_flight, so without this bound a flood taken
// directly while the model was not yet saturated would hold far more than
// a hold and park everything after it. The bound while unsaturated,
// unsaturatedHolds holds, is the one the unparker fills a group to
// (wanted): a tenant alone on a model that admits everything has nothing
// to share, and every job it takes directly saves a lane publish, a
// delivery and a claim. If the model then saturates, excess returns what
// waits beyond a hold to parking. wide: the tenant has no cap or budget
// (directFill).
func (h *holds) admitDirect(k holdKey, saturated, wide bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.get(k)
	if g.parked || g.held >= h.directFill(g, k.model, saturated, wide, h.clock()) {
		// A group with parked jobs: the insert parks the job behind them
		// anyway, and a reservation would only keep the unparker waiting.
		h.forget(k, g)
		return false
	}
	g.held++
	return true
}

// directFill is how many jobs of g the direct intake holds: fill, or all
// of max_in_flight for a tenant with no cap or budget (wide) while g's
// model is not saturated and not yet measured. A fresh replica has no rate
// to size a hold by, and a backlog waiting at its start outruns eight
// holds within one insert round trip; the job after them would be parked,
// and every later job of the group behind it, each written twice. The
// model is measured by the first admission a rateWindow or more after its
// first, so the wide fill lasts about that long, once per model and
// process. If the model saturates meanwhile (its calls block, the
// governor binds), excess returns what waits beyond a hold to parking. A
// capped tenant is not given it: the dispatcher passes over a tenant at
// its cap or budget without the model reading saturated, so excess would
// leave its jobs alone and they could hold every slot of the replica.
// Caller holds mu.
func (h *holds) directFill(g *group, model string, saturated, wide bool, now time.Time) int {
	n := h.fill(g, model, saturated, now)
	if wide && !saturated && h.most > 0 && !h.measured(g, model) {
		n = max(n, h.most)
	}
	return n
}

// measured reports whether g or its model has an admission rate. Caller
// holds mu.
func (h *holds) measured(g *group, model string) bool {
	if g != nil && g.rate.measured {
		return true
	}
	mr := h.models[model]
	return mr != nil && mr.measured
}

// occupied reports whether k has parked jobs or jobs held here.
func (h *holds) occupied(k holdKey) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.groups[k]
	return g != nil && (g.parked || g.held > 0)
}
