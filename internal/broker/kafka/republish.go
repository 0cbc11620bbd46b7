package kafka

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

// Backoff of a background re-publish (republish).
const (
	republishMin = 100 * time.Millisecond
	republishMax = 5 * time.Second
)

// republish keeps writing rec, the publish a settlement of d failed to
// make, with backoff until it succeeds, and only then marks d done (its
// offset may be committed, its prefetch slot is free). Settling d without
// it would commit past a message whose retry, dead letter or redelivery
// exists nowhere; leaving d unsettled would freeze the commit point and the
// slot for good. If the subscriber closes first the offset stays
// uncommitted and the message is read again.
func (s *Subscriber) republish(d *delivery, op string, rec kafkago.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		log := s.cfg.Logger.With("op", op, "job_id", d.msg.Key, "topic", rec.Topic)
		wait := republishMin
		for attempt := 2; ; attempt++ {
			if !sleep(s.life, wait/2+rand.N(wait/2+1)) {
				log.Warn("kafka subscriber closed before a handed-back message was re-published; it will be read again")
				return
			}
			err := s.write(s.life, rec)
			if err == nil {
				log.Info("kafka handed-back message re-published", "attempt", attempt)
				d.done()
				return
			}
			log.Warn("kafka re-publish of a handed-back message failed", "attempt", attempt, "error", err)
			wait = min(wait*2, republishMax)
		}
	}()
}

// write writes rec with the subscriber's writer, unless a test made writes
// to its topic fail (failWrites).
func (s *Subscriber) write(ctx context.Context, rec kafkago.Message) error {
	if err := writeFault(rec.Topic); err != nil {
		return err
	}
	return write(ctx, s.w, rec)
}

// writeFaults are the topics whose writes by a Subscriber fail, and with
// what: a test hook (export_test.go) standing in for a broker that refuses
// them. faulty spares the lock while none is set.
var (
	writeFaultsMu sync.Mutex
	writeFaults   = map[string]error{}
	faulty        atomic.Bool
)

func writeFault(topic string) error {
	if !faulty.Load() {
		return nil
	}
	writeFaultsMu.Lock()
	defer writeFaultsMu.Unlock()
	return writeFaults[topic]
}

// failWrites makes Subscribers' writes to topic fail with err; nil makes
// them work again.
func failWrites(topic string, err error) {
	writeFaultsMu.Lock()
	defer writeFaultsMu.Unlock()
	if err == nil {
		delete(writeFaults, topic)
	} else {
		writeFaults[topic] = err
	}
	faulty.Store(len(writeFaults) > 0)
}
