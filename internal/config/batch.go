package config

import (
	"fmt"
	"slices"
	"time"
)

// Batch offloads a model's tolerant work to its provider's Batch API
// (models.<m>.batch:, docs/design.md#batch-offload): jobs of its lanes whose
// deadline allows it are gathered into JSONL files, submitted as batches
// and their results stored as online results would be.
type Batch struct {
	// Enabled turns the offload on for the model.
	Enabled bool `yaml:"enabled"`
	// Lanes are the lanes whose jobs may go to a batch (default [low]).
	Lanes []string `yaml:"lanes"`
	// MaxJobs and MaxBytes bound one batch file (default 1000 jobs and
	// 50 MB; OpenAI allows 50000 requests and 200 MB).
	MaxJobs  int `yaml:"max_jobs"`
	MaxBytes int `yaml:"max_bytes"`
	// Gather is how long the oldest waiting job may wait for more before a
	// batch smaller than max_jobs is sent (default 1m).
	Gather time.Duration `yaml:"gather"`
	// CompletionWindow is the batch's completion window, sent to the
	// provider as a duration ("24h", OpenAI's only value; the default).
	CompletionWindow time.Duration `yaml:"completion_window"`
	// Margin is what a job's deadline must leave beyond the completion
	// window to go to a batch, and the time an unfinished batched job is
	// given to run online before its deadline (default 1h).
	Margin time.Duration `yaml:"margin"`
	// Discount is the fraction of the model's price a batch saves
	// (default 0.5, OpenAI's).
	Discount float64 `yaml:"discount"`
	// PollInterval is how often a submitted batch's status is read
	// (default 30s).
	PollInterval time.Duration `yaml:"poll_interval"`
	// MaxOpen bounds the model's batches submitted and not yet finished,
	// the provider's limit on files and enqueued work (default 10).
	MaxOpen int `yaml:"max_open"`
	// MaxEnqueuedTokens bounds the estimated input tokens of those batches
	// (the provider's enqueued-token limit; 0: no bound).
	MaxEnqueuedTokens int64 `yaml:"max_enqueued_tokens"`
}

func (b *Batch) withDefaults() {
	if !b.Enabled {
		return
	}
	if len(b.Lanes) == 0 {
		b.Lanes = []string{"low"}
	}
	setInt := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	setDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	setInt(&b.MaxJobs, 1000)
	setInt(&b.MaxBytes, 50<<20)
	setInt(&b.MaxOpen, 10)
	setDur(&b.Gather, time.Minute)
	setDur(&b.CompletionWindow, 24*time.Hour)
	setDur(&b.Margin, time.Hour)
	setDur(&b.PollInterval, 30*time.Second)
	if b.Discount == 0 {
		b.Discount = 0.5
	}
}

func (b Batch) validate(key string) error {
	if !b.Enabled {
		return nil
	}
	for _, l := range b.Lanes {
		if !slices.Contains([]string{"high", "normal", "low"}, l) {
			return badKey(key+".lanes", "unknown lane %q (high, normal, low)", l)
		}
	}
	switch {
	case b.MaxJobs < 1 || b.MaxJobs > 50000:
		return badKey(key+".max_jobs", "must be 1..50000, got %d", b.MaxJobs)
	case b.MaxBytes < 1<<10 || b.MaxBytes > 200<<20:
		return badKey(key+".max_bytes", "must be 1 KB..200 MB, got %d", b.MaxBytes)
	case b.Gather < 0 || b.Margin < 0 || b.PollInterval < 0 || b.CompletionWindow < 0:
		return badKey(key, "gather, margin, poll_interval and completion_window must not be negative")
	case b.Discount < 0 || b.Discount >= 1:
		return badKey(key+".discount", "must be in [0, 1), got %g", b.Discount)
	case b.MaxOpen < 1:
		return badKey(key+".max_open", "must be at least 1")
	case b.MaxEnqueuedTokens < 0:
		return badKey(key+".max_enqueued_tokens", "must not be negative")
	}
	return nil
}

// Offloads reports whether model offloads jobs of lane to batches.
func (b Batch) Offloads(lane string) bool {
	return b.Enabled && slices.Contains(b.Lanes, lane)
}

// Window is the provider's completion_window value for b.
func (b Batch) Window() string {
	d := b.CompletionWindow
	if d%time.Hour == 0 {
		return fmt.Sprintf("%dh", d/time.Hour)
	}
	return d.String()
}
