package kafka

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

// groupConsumer is a consumer-group reader whose offsets are committed
// only up to the lowest unfinished offset of each partition, by its own
// commit loop, coalescing commits under load.
type groupConsumer struct {
	r   *kafkago.Reader
	log *slog.Logger

	mu       sync.Mutex
	trackers map[int]*offsetTracker
	toCommit map[int]int64 // partition → next offset to read
	topic    string

	wake     chan struct{}
	stop     chan struct{}
	loopDone chan struct{}
}

func newGroupConsumer(cfg Config, topic, group string) *groupConsumer {
	r := kafkago.NewReader(kafkago.ReaderConfig{
		Brokers:           cfg.Brokers,
		Dialer:            newDialer(cfg),
		GroupID:           group,
		Topic:             topic,
		MinBytes:          1,
		MaxBytes:          10 << 20,
		MaxWait:           250 * time.Millisecond,
		StartOffset:       kafkago.FirstOffset,
		CommitInterval:    0, // our commit loop commits synchronously
		SessionTimeout:    cfg.SessionTimeout,
		RebalanceTimeout:  cfg.SessionTimeout,
		HeartbeatInterval: time.Second,
		JoinGroupBackoff:  250 * time.Millisecond,
		ReadBackoffMin:    10 * time.Millisecond,
		ReadBackoffMax:    250 * time.Millisecond,
	})
	g := &groupConsumer{
		r: r, log: cfg.Logger, topic: topic,
		trackers: make(map[int]*offsetTracker), toCommit: make(map[int]int64),
		wake: make(chan struct{}, 1), stop: make(chan struct{}), loopDone: make(chan struct{}),
	}
	go g.commitLoop()
	return g
}

// fetch returns the next message and the tracker that follows it.
func (g *groupConsumer) fetch(ctx context.Context) (kafkago.Message, *offsetTracker, error) {
	m, err := g.r.FetchMessage(ctx)
	if err != nil {
		return m, nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	tr := g.trackers[m.Partition]
	if tr == nil || !tr.fetched(m.Offset) {
		// New or rewound partition (a rebalance): earlier in-flight
		// messages of the old tracker no longer commit anything.
		tr = newOffsetTracker()
		tr.fetched(m.Offset)
		g.trackers[m.Partition] = tr
		delete(g.toCommit, m.Partition)
	}
	return m, tr, nil
}

// finish marks a message done and schedules a commit if the partition's
// lowest unfinished offset moved.
func (g *groupConsumer) finish(tr *offsetTracker, partition int, offset int64) {
	next, advanced := tr.finish(offset)
	if !advanced {
		return
	}
	g.mu.Lock()
	if g.trackers[partition] == tr {
		g.toCommit[partition] = next
	}
	g.mu.Unlock()
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

func (g *groupConsumer) commitLoop() {
	defer close(g.loopDone)
	for {
		select {
		case <-g.wake:
			g.commit()
		case <-g.stop:
			g.commit()
			return
		}
	}
}

func (g *groupConsumer) commit() {
	g.mu.Lock()
	if len(g.toCommit) == 0 {
		g.mu.Unlock()
		return
	}
	msgs := make([]kafkago.Message, 0, len(g.toCommit))
	for p, next := range g.toCommit {
		// CommitMessages commits Offset+1.
		msgs = append(msgs, kafkago.Message{Topic: g.topic, Partition: p, Offset: next - 1})
	}
	clear(g.toCommit)
	g.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.r.CommitMessages(ctx, msgs...); err != nil && !errors.Is(err, io.ErrClosedPipe) {
		// Not fatal: the messages are re-read and redelivered (at least once).
		g.log.Warn("kafka commit failed", "topic", g.topic, "error", err)
	}
}

// close makes a final commit and closes the reader (leaving the group).
func (g *groupConsumer) close() error {
	close(g.stop)
	<-g.loopDone
	return g.r.Close()
}
