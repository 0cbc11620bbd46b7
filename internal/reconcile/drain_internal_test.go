package reconcile

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/broker"
)

// failingReader is a dead-letter reader whose drains fail as one whose
// record fails does (the store is down), and that reports whether it was
// told to stop.
type failingReader struct {
	drains  atomic.Int32
	stopped atomic.Bool
}

func (f *failingReader) DrainDeadLetters(context.Context, int, func([]broker.DeadLetter) error) error {
	f.drains.Add(1)
	return errors.New("store down")
}

func (f *failingReader) ReadDeadLetters(ctx context.Context, max int) ([]broker.DeadLetter, error) {
	return broker.ReadDeadLetters(ctx, max, f.DrainDeadLetters)
}

func (f *failingReader) StopDraining() { f.stopped.Store(true) }

// The lead is a Postgres lease, so a store outage fails the record and
// loses the lead together: the drain loop then ends while it waits to
// retry, between two drains. It still tells a reader in a consumer group
// to leave it (Kafka's would keep its share of the partitions).
func TestDrainLoopStopsItsReaderWhenTheLeadEndsBetweenDrains(t *testing.T) {
	reader := &failingReader{}
	r := &Reconciler{cfg: Config{Interval: time.Hour}, deps: Deps{DeadLetters: reader}, log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		r.drainDeadLetters(ctx)
		close(done)
	}()
	for reader.drains.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if reader.stopped.Load() {
		t.Fatal("stopped while leading")
	}
	cancel() // the lead ends during the hour's wait
	<-done
	if !reader.stopped.Load() {
		t.Fatal("the reader was not told to stop draining")
	}
}
