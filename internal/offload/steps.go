package offload

import (
	"context"
	"errors"
	"time"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// The steps of one batch, each taken from the state its row records:
// formed → uploaded → submitted → finished → done.

// drive takes b through as many steps as it can now.
func (c *Coordinator) drive(ctx context.Context, b store.BatchRow, m Model) error {
	for {
		var err error
		switch b.State {
		case store.BatchFormed:
			b, err = c.upload(ctx, b, m)
		case store.BatchUploaded:
			b, err = c.submit(ctx, b, m)
		case store.BatchSubmitted:
			b, err = c.poll(ctx, b, m)
		case store.BatchFinished:
			b, err = c.collect(ctx, b, m)
		default:
			delete(c.lastPoll, b.ID)
			return nil
		}
		if errors.Is(err, errWaiting) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// advance records b's next state and what the step learnt.
func (c *Coordinator) advance(ctx context.Context, b store.BatchRow, to store.BatchState, set store.BatchRow) (store.BatchRow, error) {
	if err := c.p.Store.AdvanceBatch(ctx, b.ID, b.State, to, set); err != nil {
		return b, err
	}
	b.State = to
	for dst, src := range map[*string]string{&b.InputFileID: set.InputFileID, &b.ProviderBatchID: set.ProviderBatchID,
		&b.ProviderStatus: set.ProviderStatus, &b.OutputFileID: set.OutputFileID, &b.ErrorFileID: set.ErrorFileID} {
		if src != "" {
			*dst = src
		}
	}
	if to == store.BatchSubmitted {
		now := time.Now()
		b.SubmittedAt = &now
	}
	return b, nil
}

// upload sends the batch's file, unless a file of its name is there
// already (an upload whose answer a killed coordinator never recorded).
func (c *Coordinator) upload(ctx context.Context, b store.BatchRow, m Model) (store.BatchRow, error) {
	members, err := c.p.Store.BatchMembers(ctx, b.ID)
	if err != nil {
		return b, err
	}
	if len(members) == 0 {
		// Every member was cancelled or sent online before the upload.
		return c.advance(ctx, b, store.BatchDone, store.BatchRow{ProviderStatus: "empty"})
	}
	f, found, err := m.API.FindFile(ctx, b.FileName)
	if err != nil {
		return b, wrap(b, "look the upload up", err)
	}
	if !found {
		content, err := inputFile(members, m.Upstream)
		if err != nil {
			return b, wrap(b, "write the file", err)
		}
		f, err = m.API.Upload(ctx, b.FileName, content)
		if refused(err) {
			c.log.Warn("provider refused a batch file; its jobs go online", "batch", b.ID, "error", err)
			return c.advance(ctx, b, store.BatchFinished, store.BatchRow{ProviderStatus: "upload_refused"})
		}
		if err != nil {
			return b, wrap(b, "upload", err)
		}
		c.failpoint(FailpointUpload)
	}
	c.log.Info("batch uploaded", "batch", b.ID, "file_id", f.ID, "jobs", len(members), "again", found)
	return c.advance(ctx, b, store.BatchUploaded, store.BatchRow{InputFileID: f.ID})
}

// submit creates the provider batch, unless one naming this batch's file
// exists already (a create whose answer was never recorded).
func (c *Coordinator) submit(ctx context.Context, b store.BatchRow, m Model) (store.BatchRow, error) {
	pb, found, err := m.API.FindBatch(ctx, b.FileName)
	if err != nil {
		return b, wrap(b, "look the batch up", err)
	}
	if !found {
		pb, err = m.API.CreateBatch(ctx, b.InputFileID, chatEndpoint, m.Batch.Window(), b.FileName)
		if refused(err) {
			c.log.Warn("provider refused a batch; its jobs go online", "batch", b.ID, "error", err)
			return c.advance(ctx, b, store.BatchFinished, store.BatchRow{ProviderStatus: "create_refused"})
		}
		if err != nil {
			return b, wrap(b, "create", err)
		}
		c.failpoint(FailpointSubmit)
	}
	c.log.Info("batch submitted", "batch", b.ID, "provider_batch_id", pb.ID, "again", found)
	return c.advance(ctx, b, store.BatchSubmitted, store.BatchRow{ProviderBatchID: pb.ID})
}

// poll reads the provider batch every poll interval; a batch still running
// well past its window is cancelled (its members near their deadline are
// online already: rescueNearDeadline).
func (c *Coordinator) poll(ctx context.Context, b store.BatchRow, m Model) (store.BatchRow, error) {
	if last, ok := c.lastPoll[b.ID]; ok && time.Since(last) < m.Batch.PollInterval {
		return b, errWaiting
	}
	c.lastPoll[b.ID] = time.Now()
	pb, err := m.API.GetBatch(ctx, b.ProviderBatchID)
	if err != nil {
		return b, wrap(b, "poll", err)
	}
	if !pb.Final() {
		if b.SubmittedAt != nil && time.Since(*b.SubmittedAt) > b.Window+m.Batch.Margin/2 && pb.Status != "cancelling" {
			c.log.Warn("batch overdue: cancelling it", "batch", b.ID, "provider_batch_id", pb.ID, "status", pb.Status)
			if _, err := m.API.CancelBatch(ctx, pb.ID); err != nil {
				return b, wrap(b, "cancel", err)
			}
		}
		return b, errWaiting
	}
	set := store.BatchRow{ProviderStatus: pb.Status}
	if pb.OutputFileID != nil {
		set.OutputFileID = *pb.OutputFileID
	}
	if pb.ErrorFileID != nil {
		set.ErrorFileID = *pb.ErrorFileID
	}
	c.log.Info("batch finished", "batch", b.ID, "status", pb.Status,
		"completed", pb.RequestCounts.Completed, "failed", pb.RequestCounts.Failed)
	return c.advance(ctx, b, store.BatchFinished, set)
}

// collect stores the output file's results, sends the error file's lines
// online, then every member nobody answered for. Each part is guarded by
// the job still being batched, so a collect cut short is simply repeated.
func (c *Coordinator) collect(ctx context.Context, b store.BatchRow, m Model) (store.BatchRow, error) {
	for _, id := range []string{b.OutputFileID, b.ErrorFileID} {
		if id == "" {
			continue
		}
		if err := c.settleFile(ctx, b, m, id); err != nil {
			return b, err
		}
	}
	members, err := c.p.Store.BatchMembers(ctx, b.ID)
	if err != nil {
		return b, err
	}
	keys := make([]job.Key, len(members))
	for i, mb := range members {
		keys[i] = mb.Key
	}
	c.sendOnline(ctx, unbatchAll(keys, b.Model, "batch_"+b.ProviderStatus, "the batch ended "+b.ProviderStatus+" without an answer for this job"))
	return c.advance(ctx, b, store.BatchDone, store.BatchRow{})
}

// settleFile downloads one output or error file and settles its lines:
// results stored, failures sent online.
func (c *Coordinator) settleFile(ctx context.Context, b store.BatchRow, m Model, fileID string) error {
	data, err := m.API.Content(ctx, fileID)
	if err != nil {
		return wrap(b, "download "+fileID, err)
	}
	outs, bad := parseAnswers(data, b.Model)
	if bad > 0 {
		c.log.Warn("batch file has lines that name no job; their jobs go online at the end", "batch", b.ID, "file_id", fileID, "lines", bad)
	}
	var results []store.BatchedResult
	var failed []store.Unbatch
	for _, o := range outs {
		if o.ok {
			results = append(results, store.BatchedResult{Key: o.key, Result: o.result})
		} else {
			failed = append(failed, store.Unbatch{Key: o.key, Error: o.err, GiveBack: o.giveBack})
		}
	}
	stored := 0
	for start := 0; start < len(results); start += chunk {
		ok, err := c.p.Store.CompleteBatched(ctx, b.ID, results[start:min(start+chunk, len(results))])
		if err != nil {
			return wrap(b, "store results", err)
		}
		for _, v := range ok {
			if v {
				stored++
			}
		}
		if c.p.Stored != nil {
			c.p.Stored()
		}
		c.failpoint(FailpointDownload)
	}
	c.sendOnline(ctx, failed)
	c.log.Info("batch file settled", "batch", b.ID, "file_id", fileID, "results", len(results), "stored", stored, "failed", len(failed))
	return nil
}
