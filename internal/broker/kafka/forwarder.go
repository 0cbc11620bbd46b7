package kafka

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// forwarder moves delayed retries from the retry topic to their lane topic
// when due. It holds each waiting message on a timer (no goroutine, no
// blocked partition), at most MaxPendingRetries at once, and commits the
// retry topic only up to the lowest message not yet forwarded: a forwarder
// that stops loses nothing, the next one re-reads what was pending.
type forwarder struct {
	owner *Subscriber
	gc    *groupConsumer
	slots chan struct{}

	mu      sync.Mutex
	timers  map[*time.Timer]struct{}
	stopped bool
	wg      sync.WaitGroup
	// life ends when the forwarder stops; it bounds forwards in progress.
	life   context.Context
	cancel context.CancelFunc
}

func newForwarder(s *Subscriber) *forwarder {
	life, cancel := context.WithCancel(context.Background())
	return &forwarder{
		life: life, cancel: cancel,
		owner:  s,
		gc:     newGroupConsumer(s.cfg, s.cfg.retryTopic(), s.cfg.retryGroup()),
		slots:  make(chan struct{}, s.cfg.MaxPendingRetries),
		timers: make(map[*time.Timer]struct{}),
	}
}

func (f *forwarder) run(ctx context.Context) {
	log := f.owner.cfg.Logger
	for attempt := 0; ; {
		select {
		case f.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		m, tr, err := f.gc.fetch(ctx)
		if err != nil {
			<-f.slots
			if ctx.Err() != nil {
				return
			}
			attempt++
			log.Warn("kafka retry fetch failed", "attempt", attempt, "error", err)
			if !sleep(ctx, time.Duration(min(attempt, 20))*100*time.Millisecond) {
				return
			}
			continue
		}
		attempt = 0
		f.schedule(m, tr)
	}
}

func (f *forwarder) schedule(m kafkago.Message, tr *offsetTracker) {
	msg, internal := messageOf(m)
	ms, _ := strconv.ParseInt(internal[broker.HeaderDueAt], 10, 64)
	wait := time.Until(time.UnixMilli(ms))
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		<-f.slots
		return
	}
	f.wg.Add(1)
	var tm *time.Timer
	tm = time.AfterFunc(max(wait, 0), func() {
		defer f.wg.Done()
		f.mu.Lock()
		delete(f.timers, tm)
		f.mu.Unlock()
		if f.forward(m, msg, job.Priority(internal[headerLane])) {
			f.gc.finish(tr, m.Partition, m.Offset)
		}
		<-f.slots
	})
	f.timers[tm] = struct{}{}
}

// forward publishes a due retry to its lane (or, with no valid lane, to
// the dead-letter topic: never dropped silently). It retries until it
// succeeds or the forwarder stops.
func (f *forwarder) forward(m kafkago.Message, msg broker.Message, lane job.Priority) bool {
	cfg := f.owner.cfg
	rec := record(cfg.laneTopic(lane), msg, nil)
	if !lane.Valid() {
		body, _ := json.Marshal(broker.DeadLetter{Body: msg.Body, Key: msg.Key,
			Reason: "retry_without_lane", LastFailedAt: time.Now().UTC()})
		rec = kafkago.Message{Topic: cfg.deadTopic(), Key: m.Key, Value: body}
	}
	ctx := f.life
	for attempt := 1; ; attempt++ {
		err := f.owner.write(ctx, rec)
		if err == nil {
			return true
		}
		cfg.Logger.Warn("kafka retry forward failed", "job_id", msg.Key, "lane", lane, "attempt", attempt, "error", err)
		if !sleep(ctx, time.Duration(min(attempt, 20))*100*time.Millisecond) {
			return false
		}
	}
}

// stop cancels waiting timers (their messages stay uncommitted) and waits
// for forwards in progress.
func (f *forwarder) stop() {
	f.mu.Lock()
	f.stopped = true
	f.cancel()
	for tm := range f.timers {
		if tm.Stop() {
			f.wg.Done()
		}
	}
	clear(f.timers)
	f.mu.Unlock()
	f.wg.Wait()
}
