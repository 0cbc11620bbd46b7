// Package offload drives batch offload (docs/design.md#batch-offload): the
// jobs the worker moved to status batched are gathered into JSONL files,
// uploaded to their provider's Files API, submitted as batches, polled,
// and their output and error files read; each line's result is stored in
// its job row as an online result is (store.CompleteBatched: the same
// result events, webhooks and usage), and each failed, expired or
// unanswered line is sent back online (store.SendOnline) to run under the
// usual rules. Batched jobs whose deadline comes within the margin are sent
// online too, whatever their batch is doing.
//
// Every step is recorded in the batch's row before the next is taken, and
// every step that costs something at the provider is looked up before it
// is repeated: an upload by the file name the row chose, a batch by the
// metadata naming that file. So a coordinator killed at any point resumes
// the same batch and never uploads or submits it twice.
//
// One coordinator is active among the consumer replicas: the one holding
// the advisory lock store.OffloadLockID (as the reconciler does).
package offload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/ratecontrol"
	"github.com/llmq/llmq/internal/store"
)

// Failpoints (TEST-ONLY, see worker.ParseFailpoint): the coordinator passes
// them where a kill -9 would cost the most if the steps were not durable.
const (
	// FailpointUpload: the upload was answered, its file id not recorded.
	FailpointUpload = "offload_upload"
	// FailpointSubmit: the batch was created, its id not recorded.
	FailpointSubmit = "offload_submit"
	// FailpointDownload: part of the output file's results are stored.
	FailpointDownload = "offload_download"
)

// Failpoints lists the coordinator's points.
var Failpoints = []string{FailpointUpload, FailpointSubmit, FailpointDownload}

// Store is what the coordinator needs from internal/store.
type Store interface {
	TryLead(ctx context.Context, id int64) (*store.Lease, error)
	WaitingBatched(ctx context.Context, model string, limit int) (int, time.Time, error)
	FormBatch(ctx context.Context, model string, shape store.BatchShape) (store.BatchRow, bool, error)
	BatchMembers(ctx context.Context, batch int64) ([]store.BatchMember, error)
	OpenBatches(ctx context.Context) ([]store.BatchRow, error)
	AdvanceBatch(ctx context.Context, id int64, from, to store.BatchState, set store.BatchRow) error
	CompleteBatched(ctx context.Context, batch int64, items []store.BatchedResult) ([]bool, error)
	SendOnline(ctx context.Context, items []store.Unbatch) ([]store.Unbatched, error)
	NearDeadline(ctx context.Context, model string, by time.Time, limit int) ([]job.Key, error)
	WaitingKeys(ctx context.Context, model string, limit int) ([]job.Key, error)
	MarkUnenqueued(ctx context.Context, key job.Key) error
}

var _ Store = (*store.Store)(nil)

// API is what the coordinator needs from a provider (Client).
type API interface {
	Upload(ctx context.Context, name string, content []byte) (File, error)
	FindFile(ctx context.Context, name string) (File, bool, error)
	CreateBatch(ctx context.Context, fileID, endpoint, window, ref string) (Batch, error)
	FindBatch(ctx context.Context, ref string) (Batch, bool, error)
	GetBatch(ctx context.Context, id string) (Batch, error)
	CancelBatch(ctx context.Context, id string) (Batch, error)
	Content(ctx context.Context, fileID string) ([]byte, error)
}

// Model is one configured model; only those with Batch.Enabled get new
// batches, the others' open batches are finished and their waiting jobs
// sent online (a model whose batch: was turned off strands nothing).
type Model struct {
	// Upstream is the model's name at its provider (config.Route).
	Upstream string
	Batch    config.Batch
	API      API
}

// Params build a Coordinator.
type Params struct {
	Store Store
	// Models are the configured models by name (FromConfig).
	Models map[string]Model
	// Lanes publishes the wake-ups of jobs sent back online.
	Lanes broker.Publisher
	// Interval between passes and between tries to lead (default 1s).
	Interval time.Duration
	// Stored, when set, hears that results were stored (wakes the result
	// relay); it must not block.
	Stored func()
	// Failpoint is the TEST-ONLY hook (nil in production).
	Failpoint func(name string)
	Logger    *slog.Logger
}

// Coordinator is described in the package doc.
type Coordinator struct {
	p        Params
	log      *slog.Logger
	models   []string
	lastPoll map[int64]time.Time
}

// FromConfig returns the models of c with their providers' clients.
func FromConfig(c config.Config) map[string]Model {
	set := c.ProviderSet()
	clients := map[string]*Client{}
	out := map[string]Model{}
	for name, m := range c.Models {
		r := c.Route(name)
		if clients[r.Provider] == nil {
			clients[r.Provider] = NewClient(set[r.Provider])
		}
		out[name] = Model{Upstream: r.Upstream, Batch: m.Batch, API: clients[r.Provider]}
	}
	return out
}

// New builds a coordinator.
func New(p Params) (*Coordinator, error) {
	if p.Store == nil || p.Lanes == nil {
		return nil, errors.New("offload: Store and Lanes are required")
	}
	if p.Interval <= 0 {
		p.Interval = time.Second
	}
	c := &Coordinator{p: p, log: p.Logger, lastPoll: map[int64]time.Time{}}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	for name := range p.Models {
		c.models = append(c.models, name)
	}
	sort.Strings(c.models)
	return c, nil
}

// Run tries to lead every Interval and, while it leads, makes a pass
// every Interval. It returns nil when ctx ends; when no model batches and
// no batch or batched job is left from before, it returns at once.
func (c *Coordinator) Run(ctx context.Context) error {
	if !c.needed(ctx) {
		return nil
	}
	store.LeadEvery(ctx, c.p.Store.TryLead, store.OffloadLockID, c.p.Interval,
		func(err error) { c.log.Warn("offload: try to lead", "error", err) }, c.lead)
	return nil
}

// needed reports whether a model batches or something batched is left.
func (c *Coordinator) needed(ctx context.Context) bool {
	for _, m := range c.p.Models {
		if m.Batch.Enabled {
			return true
		}
	}
	open, err := c.p.Store.OpenBatches(ctx)
	if err != nil || len(open) > 0 {
		return true
	}
	for _, name := range c.models {
		if keys, err := c.p.Store.WaitingKeys(ctx, name, 1); err != nil || len(keys) > 0 {
			return true
		}
	}
	return false
}

func (c *Coordinator) lead(ctx context.Context, lease *store.Lease, tick *time.Ticker) {
	c.log.Info("batch coordinator active", "models", len(c.models))
	for {
		if err := lease.Check(ctx); err != nil {
			if ctx.Err() == nil {
				c.log.Warn("batch coordinator lease lost", "error", err)
			}
			return
		}
		c.Pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Pass sends online the batched jobs whose deadline is near, moves every
// open batch as far as it can go, and forms the batches that are due. It
// must run in one goroutine at a time (the leader's).
func (c *Coordinator) Pass(ctx context.Context) {
	for _, name := range c.models {
		c.rescueNearDeadline(ctx, name, c.p.Models[name])
	}
	open, err := c.p.Store.OpenBatches(ctx)
	if err != nil {
		c.log.Warn("offload: read open batches", "error", err)
		return
	}
	openBy := map[string][]store.BatchRow{}
	for _, b := range open {
		m, ok := c.p.Models[b.Model]
		if !ok {
			continue // a model no longer configured: its batches wait for it
		}
		if err := c.drive(ctx, b, m); err != nil && ctx.Err() == nil {
			c.log.Warn("offload: batch step failed; retried next pass", "batch", b.ID, "state", string(b.State), "error", err)
		}
		openBy[b.Model] = append(openBy[b.Model], b)
	}
	for _, name := range c.models {
		if m := c.p.Models[name]; m.Batch.Enabled {
			c.form(ctx, name, m, openBy[name])
		} else {
			c.strand(ctx, name)
		}
	}
}

// strand sends online the waiting batched jobs of a model that no longer
// batches.
func (c *Coordinator) strand(ctx context.Context, name string) {
	keys, err := c.p.Store.WaitingKeys(ctx, name, chunk)
	if err != nil {
		c.log.Warn("offload: waiting jobs of a model that no longer batches", "model", name, "error", err)
		return
	}
	c.sendOnline(ctx, unbatchAll(keys, name, "batch_disabled", "the model no longer batches: sent online"))
}

// rescueNearDeadline sends online the batched jobs of model whose deadline
// is within the margin, so they run before it.
func (c *Coordinator) rescueNearDeadline(ctx context.Context, name string, m Model) {
	keys, err := c.p.Store.NearDeadline(ctx, name, time.Now().Add(m.Batch.Margin), 1000)
	if err != nil {
		c.log.Warn("offload: batched jobs near their deadline", "model", name, "error", err)
		return
	}
	if len(keys) == 0 {
		return
	}
	c.sendOnline(ctx, unbatchAll(keys, name, "deadline_near", "deadline near: sent online before its batch finished"))
}

// unbatchAll sends keys online with one error, their attempts given back.
func unbatchAll(keys []job.Key, model, code, msg string) []store.Unbatch {
	items := make([]store.Unbatch, len(keys))
	for i, k := range keys {
		items[i] = store.Unbatch{Key: k, GiveBack: true, Error: store.AttemptError{Model: model, Code: code, Message: msg}}
	}
	return items
}

// form gathers model's waiting jobs into new batches while a full one is
// waiting, or the oldest has waited Gather, within the provider's bounds
// on open batches and enqueued tokens.
func (c *Coordinator) form(ctx context.Context, name string, m Model, open []store.BatchRow) {
	b := m.Batch
	var tokens int64
	for _, o := range open {
		tokens += o.Tokens
	}
	for len(open) < b.MaxOpen && (b.MaxEnqueuedTokens <= 0 || tokens < b.MaxEnqueuedTokens) {
		n, oldest, err := c.p.Store.WaitingBatched(ctx, name, b.MaxJobs)
		if err != nil {
			c.log.Warn("offload: count waiting jobs", "model", name, "error", err)
			return
		}
		if n == 0 || (n < b.MaxJobs && time.Since(oldest) < b.Gather) {
			return
		}
		row, ok, err := c.p.Store.FormBatch(ctx, name, store.BatchShape{MaxJobs: b.MaxJobs, MaxBytes: b.MaxBytes,
			Window: b.CompletionWindow,
			LineBytes: func(bm store.BatchMember) int {
				return len(bm.Request) + len(bm.Key.Tenant) + len(bm.Key.ID) + lineOverhead
			},
			Tokens: func(bm store.BatchMember) int64 { return int64(ratecontrol.EstimateTokens(bm.Request)) }})
		if err != nil {
			c.log.Warn("offload: form a batch", "model", name, "error", err)
			return
		}
		if !ok {
			return
		}
		c.log.Info("batch formed", "batch", row.ID, "model", name, "jobs", row.Jobs, "bytes", row.Bytes)
		if err := c.drive(ctx, row, m); err != nil && ctx.Err() == nil {
			c.log.Warn("offload: batch step failed; retried next pass", "batch", row.ID, "error", err)
		}
		open = append(open, row)
		tokens += row.Tokens
	}
}

// sendOnline moves items back online and publishes their wake-ups; a
// failed publish leaves the job to the reconciler.
func (c *Coordinator) sendOnline(ctx context.Context, items []store.Unbatch) {
	for start := 0; start < len(items); start += chunk {
		part := items[start:min(start+chunk, len(items))]
		back, err := c.p.Store.SendOnline(ctx, part)
		if err != nil {
			c.log.Warn("offload: send jobs online", "jobs", len(part), "error", err)
			continue
		}
		for _, u := range back {
			if err := c.p.Lanes.Publish(ctx, u.Lane, broker.WakeUp(u.Key, u.Model)); err != nil {
				c.log.Warn("offload: publish a job sent online", "job_id", u.Key.ID, "error", err)
				if err := c.p.Store.MarkUnenqueued(ctx, u.Key); err != nil {
					c.log.Warn("offload: mark job without message", "job_id", u.Key.ID, "error", err)
				}
			}
		}
		if len(back) > 0 {
			c.log.Info("batched jobs sent online", "jobs", len(back), "reason", part[0].Error.Code)
		}
	}
}

// chunk bounds the jobs of one store statement.
const chunk = 500

func (c *Coordinator) failpoint(name string) {
	if c.p.Failpoint != nil {
		c.p.Failpoint(name)
	}
}

// errWaiting is a step that has nothing to do yet.
var errWaiting = errors.New("waiting")

func wrap(b store.BatchRow, step string, err error) error {
	return fmt.Errorf("batch %d: %s: %w", b.ID, step, err)
}
